"""Every shell command the README and docs/*.md show for `irodori-speaker` or an example, run.

Found automatically: the bash/sh code blocks of README.md and docs/*.md (a doc added later is
picked up), their lines that call `irodori-speaker` or `examples/*.py`. Each runs as written in
a shell, in one temporary directory per doc (so a later command sees what an earlier one
wrote, and heredocs that write input files run first), offline (HF_HUB_OFFLINE=1, an empty
Hugging Face cache, a fresh IRODORI_CACHE), with `irodori-speaker` and `python` from this
environment. Each must exit 0 and write the files it names (-o, --out, --json, --cache-dir).

A command that cannot run here carries a visible marker at the end of its line,
`# needs: <what>` (network, a sound card, CUDA, a Mac, your own voice recording, ...): the test
skips it with that reason. CONTRIBUTING.md describes the convention.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# A doc's commands run in order in one directory (a later one reads what an earlier one wrote):
# under pytest-xdist they must all run on one worker, in order (`--dist loadgroup` in pyproject).
pytestmark = pytest.mark.xdist_group("docs-commands")
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
BLOCK = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)
# `irodori-speaker` or `python examples/x.py` in a command's place (after |, ;, &&, or VAR=value)
CALLS = re.compile(
    r"(?:^|[|;&(]\s*)(?:\w+=\S*\s+)*(?:\S*/)?(?:irodori-speaker|python3?\s+examples/\S+\.py)(?:\s|$)"
)
NEEDS = re.compile(r"#.*?\bneeds:\s*(.+?)\s*$")
HEREDOC = re.compile(r"<<-?\s*'?\"?(\w+)'?\"?")
WRITES = re.compile(r"(?:^|\s)(?:-o|--output|--out|--json|--cache-dir)[ =]('[^']*'|\"[^\"]*\"|\S+)")


@dataclass(frozen=True)
class Command:
    doc: str  # path relative to the repo
    line: int  # 1-based line in the doc
    text: str  # the command as the shell runs it (comments kept: the shell ignores them)
    needs: str | None  # the marker's reason, or None
    setup: tuple[str, ...]  # heredocs of this doc before it (they write input files)

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def shell_lines(body: str, first_line: int):
    """(line number, logical line) of a block: continuations joined, a heredoc kept whole."""
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        start, text = first_line + i, lines[i]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text[:-1] + " " + lines[i].strip()
        m = HEREDOC.search(text.split("#")[0])
        if m:
            end = m.group(1)
            while i + 1 < len(lines):
                i += 1
                text += "\n" + lines[i]
                if lines[i].strip() == end:
                    break
        i += 1
        if text.strip() and not text.lstrip().startswith("#"):
            yield start, text


def documented_commands() -> list[Command]:
    found = []
    for path in doc_files():
        doc = path.relative_to(REPO).as_posix()
        content = path.read_text(encoding="utf-8")
        setup: list[str] = []
        for block in BLOCK.finditer(content):
            if block.group(1).lower() not in SHELL_LANGS:
                continue
            first = content.count("\n", 0, block.start(2)) + 1
            for line, text in shell_lines(block.group(2), first):
                head = text.split("\n", 1)[0]
                if HEREDOC.search(head.split("#")[0]) and not CALLS.search(head):
                    setup.append(text)
                    continue
                if not CALLS.search(head.split(" #")[0]):
                    continue  # set-up steps, pytest, pip...: not ours to run
                needs = NEEDS.search(head)
                found.append(Command(doc, line, text, needs.group(1) if needs else None, tuple(setup)))
    return found


COMMANDS = documented_commands()


def test_the_docs_show_commands_and_most_run_here():
    """Guards the extraction: it finds the README's run line, and most commands are not skipped."""
    ids = {c.id: c for c in COMMANDS}
    assert any(c.doc == "README.md" and "say --tiny-random" in c.text for c in ids.values())
    runnable = [c for c in COMMANDS if c.needs is None]
    assert len(runnable) >= 10, [c.id for c in COMMANDS]


def written_paths(command: str) -> list[str]:
    paths = []
    for m in WRITES.finditer(command.split(" #")[0]):
        value = shlex.split(m.group(1))[0]
        if value != "-":
            paths.append(value)
    return paths


@pytest.fixture(scope="module")
def workdirs(tmp_path_factory):
    return {}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    home = tmp_path_factory.mktemp("docs-home")
    venv_bin = Path(sys.executable).parent  # `irodori-speaker` and `python` are this environment's
    assert (venv_bin / "python").exists() and (venv_bin / "irodori-speaker").exists()
    e = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    e.update(
        PATH=f"{venv_bin}{os.pathsep}{e.get('PATH', '')}",
        HF_HUB_OFFLINE="1",
        HF_HOME=str(home / "hf"),
        IRODORI_CACHE=str(home / "irodori"),
        OMP_NUM_THREADS="1",
    )
    return e


@pytest.mark.parametrize(
    "cmd",
    [
        pytest.param(
            c, id=c.id, marks=[pytest.mark.skip(reason=f"{c.id} needs {c.needs}")] if c.needs else []
        )
        for c in COMMANDS
    ],
)
def test_documented_command_runs_as_written(cmd: Command, env, workdirs, tmp_path_factory):
    if cmd.doc not in workdirs:
        workdirs[cmd.doc] = tmp_path_factory.mktemp(Path(cmd.doc).stem)
    cwd: Path = workdirs[cmd.doc]
    # as in a clone: `.venv/bin/irodori-speaker` is this environment's, `examples/` the repo's
    (cwd / ".venv").mkdir(exist_ok=True)
    for link, target in (
        (cwd / ".venv" / "bin", Path(sys.executable).parent),
        (cwd / "examples", REPO / "examples"),
    ):
        if not link.exists():
            link.symlink_to(target)
    for text in cmd.setup:
        subprocess.run(["bash", "-c", text], cwd=cwd, env=env, check=True, timeout=30)
    r = subprocess.run(
        ["bash", "-o", "pipefail", "-c", cmd.text],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, f"{cmd.id}: {cmd.text}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    for path in written_paths(cmd.text):
        target = cwd / path
        assert target.exists(), f"{cmd.id}: says it writes {path}, which is not there"
        if target.is_file():
            assert target.stat().st_size > 0, f"{cmd.id}: {path} is empty"
