"""Issue 29, the first hour (second pass): what a new user meets, each as a test.

Threads for a shared PC, -v's phases, the tiny default's family, bad --model messages, the cheap
checks before the model, files vs devices, hints in the command line's words, usage errors in two
lines, one noise notice, serve's Ctrl-C, the cache commands, prewarm keys, the sample voice, the
README's Python snippet, one version. In process where the model loader can be replaced by one
that fails the test (so a check provably comes first); as subprocesses where the user's view is
the point (a fresh process's threads, stderr, exit status).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from irodori_speaker import __version__, cli
from irodori_speaker.cli import common, messages
from irodori_speaker.engine import tiny
from irodori_speaker.errors import AudioError, InputError
from irodori_speaker.outputs import FileOutput
from irodori_speaker.speaker import Speaker
from irodori_speaker.synthesis import loading
from irodori_speaker.synthesis.load_options import LoadOptions
from irodori_speaker.synthesis.voices import SAMPLE_VOICE, Voice

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "speaker"))
from speaker_fakes import FakeSynth  # noqa: E402


def pyproject() -> dict[str, Any]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def run(args, home: Path, *, env: dict | None = None, timeout: float = 300, **kw):
    base = dict(os.environ, IRODORI_CACHE=str(home / "cache"), HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "irodori_speaker.cli", *map(str, args)],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=home,
        **kw,
    )


def two_lines(argv, capsys, status: int = 1) -> tuple[str, str]:
    """`argv` prints `error: ...` and `hint: ...` and exits with `status`."""
    try:
        got = cli.main([str(a) for a in argv])
    except SystemExit as e:  # argparse
        got = e.code
    assert got == status
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("error: ") and err[1].startswith("hint: "), err
    return err[0], err[1]


# ---- threads ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_threads_default_to_half_the_cpus_and_each_way_to_choose_them_is_logged(tmp_path):
    env = {"IRODORI_THREADS": "", "OMP_NUM_THREADS": ""}
    argv = ["-v", "say", "はい", "-o", tmp_path / "a.wav", "--tiny-random", "--backend", "cpu"]
    usable = len(os.sched_getaffinity(0))
    r = run(argv, tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    want = max(1, usable // 2)
    assert f"torch CPU threads: {want} (half of the {usable} CPUs this process may use" in r.stderr
    r = run([*argv, "--threads", "3"], tmp_path, env=env)
    assert "torch CPU threads: 3 (asked for)" in r.stderr and "3 CPU threads" in r.stderr
    r = run(argv, tmp_path, env={**env, "IRODORI_THREADS": "2"})
    assert "torch CPU threads: 2 ($IRODORI_THREADS)" in r.stderr


def test_threads_reach_the_speaker_and_bad_counts_fail_before_the_model(no_model, tmp_path, capsys):
    assert Speaker(tiny_random=True, threads=2)._load_options.threads == 2
    with pytest.raises(InputError, match="threads must be a whole number"):
        Speaker(tiny_random=True, threads=0)
    line, _ = two_lines(["say", "x", "-o", tmp_path / "a.wav", "--tiny-random", "--threads", "0"], capsys)
    assert "--threads must be at least 1" in line


# ---- -v: where the first line's wall went ---------------------------------------------------------


def test_verbose_says_where_the_wall_time_went(irodori_home, tmp_path, capsys):
    assert (
        cli.main(["-v", "say", "はい", "-o", str(tmp_path / "a.wav"), "--tiny-random", "--backend", "cpu"])
        == 0
    )
    err = capsys.readouterr().err
    wall = [line for line in err.splitlines() if line.startswith("info: wall: ")]
    assert len(wall) == 1
    for part in ("torch import", "model load", "synthesis", "writing", "the rest"):
        assert re.search(rf"{part} \d+\.\d\d s", wall[0]), (part, wall[0])
    assert "info: model load:" in err and "info: synthesis:" in err


# ---- the tiny default ------------------------------------------------------------------------------


@pytest.mark.slow
def test_tiny_random_builds_the_default_models_family(tmp_path):
    argv = ["-v", "say", "はい", "-o", tmp_path / "a.wav", "--tiny-random", "--backend", "cpu"]
    r = run(argv, tmp_path, env={"IRODORI_TINY_KIND": ""})  # the product's default, not the suite's
    assert r.returncode == 0, r.stderr
    assert f"(tiny-random {tiny.DEFAULT_KIND} on cpu" in r.stderr
    assert tiny.DEFAULT_KIND == common.TINY_DEFAULT == "v4.1-mf"  # the default model's family
    assert common.TINY_KIND_ENV == tiny.KIND_ENV
    assert set(common.TINY_NO_CAPTION) == {
        k for k, c in tiny.TINY_CONFIGS.items() if not c.get("use_caption_condition")
    }


def test_tiny_random_with_a_model_is_refused(no_model, tmp_path, capsys):
    line, hint = two_lines(["say", "x", "-o", tmp_path / "a.wav", "--tiny-random", "--model", "v2"], capsys)
    assert "--tiny-random builds its own random model: --model v2 would be ignored" in line
    assert "drop --tiny-random" in hint
    line, _ = two_lines(
        ["say", "x", "-o", tmp_path / "a.wav", "--tiny-kind", "v4", "--codec", "c.pth"], capsys
    )
    assert "--tiny-kind builds its own random model: --codec c.pth" in line
    with pytest.raises(InputError, match="tiny_random builds its own random model: model="):
        Speaker(model="v2", tiny_random=True)
    with pytest.raises(InputError, match="leave out tiny_random"):
        LoadOptions(model="v2", tiny_random="v4")


# ---- bad --model -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, message",
    [
        ("voice.wav", "is not a model checkpoint"),
        ("folder", "is a folder, not a model checkpoint"),
        ("v4.1mf", "unknown model alias 'v4.1mf' (did you mean v4.1-mf?)"),
        ("v5", "unknown model alias 'v5'"),
    ],
)
def test_a_bad_model_is_named_as_such_not_as_missing_files(model, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sf.write(tmp_path / "voice.wav", [0.0] * 480, 48_000)
    (tmp_path / "folder").mkdir()
    line, hint = two_lines(["say", "x", "-o", "a.wav", "--model", model, "--backend", "cpu"], capsys)
    assert message in line and "codec" not in line and "tokenizer" not in line
    if "alias" in message:
        assert "v4.1-mf" in hint and "v4" in hint


def test_model_help_names_every_alias_and_the_true_default(capsys):
    with pytest.raises(SystemExit):
        cli.main(["say", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for alias in ("v2", "v3", "v4", "v4.1", "v4.1-mf", "lite-int4"):
        assert f" {alias}," in text or f" {alias})" in text, alias
    assert "Default: v4.1-mf" in text and "Default: v2" not in text
    assert "tokenizer/ folder" in text and "--threads N" in text


# ---- cheap checks before the model ----------------------------------------------------------------


@pytest.mark.parametrize(
    "text, message",
    [
        ("   ", "empty"),
        ("あ" * 20_001, "20001 characters is longer"),
        ("こんにちは[pause:15s]です", "longer than 10 s"),
    ],
)
def test_text_mistakes_cost_no_model_load(text, message, no_model, tmp_path, capsys):
    line, hint = two_lines(["say", text, "-o", tmp_path / "a.wav"], capsys)
    assert message in line
    assert "say_stream()" not in hint  # the command line's words


def test_a_tag_only_line_is_refused_early_unless_a_tag_map_gives_it_words(irodori_home, tmp_path, capsys):
    tags = tmp_path / "tags.json"
    tags.write_text('{"happy": {"text": "やったー"}}', encoding="utf-8")
    out = str(tmp_path / "a.wav")
    argv = ["say", "[happy]", "-o", out, "--tiny-random", "--backend", "cpu"]
    assert cli.main([*argv, "--tag-map", str(tags)]) == 0
    capsys.readouterr()
    line, hint = two_lines(argv, capsys)
    assert "nothing to say" in line and "--tags keep" in hint


def test_caption_on_a_tiny_kind_without_a_caption_branch_costs_no_model_load(no_model, tmp_path, capsys):
    line, _ = two_lines(
        ["say", "x", "-o", tmp_path / "a.wav", "--tiny-kind", "v3", "--caption", "明るい"], capsys
    )
    assert "--caption needs a VoiceDesign or v4 model" in line


# ---- files vs devices ------------------------------------------------------------------------------


def test_a_file_name_is_a_file_everywhere_and_its_folder_is_made(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    async def open_with(output):
        async with Speaker(FakeSynth(), output=output) as s:
            await s.say("はい")

    with pytest.raises(AudioError, match=r"unknown file extension '\.m4a'"):
        asyncio.run(open_with("x.m4a"))  # was looked up as a sound device's name
    out = FileOutput("nodir2/x.wav")  # like `say -o nodir/x.wav`: the folder is made
    assert out.path.parent.is_dir()
    asyncio.run(open_with("nodir3/y.flac"))
    assert sf.info("nodir3/y.flac").samplerate > 0


def test_say_makes_the_folder_and_names_the_extension(no_model, tmp_path, capsys):
    line, hint = two_lines(["say", "x", "-o", tmp_path / "out.m4a"], capsys)
    assert "unknown file extension '.m4a'" in line and ".wav" in hint


# ---- hints, usage errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "python, command_line",
    [
        ("a CUDA build of torch, or use backend='cpu'", "a CUDA build of torch, or use --backend cpu"),
        ("give more of the name, or hostapi=", "give more of the name, or --hostapi"),
        ("model=, codec=", "--model, --codec"),
        ("(--model FILE; in Python model=, codec=)", "(--model FILE; in Python model=, codec=)"),
    ],
)
def test_library_hints_read_in_the_command_lines_words(python, command_line):
    assert messages.cli_hint(python) == command_line


def test_extras_install_line_fits_where_it_runs(monkeypatch):
    monkeypatch.setattr(messages, "IN_A_CLONE", True)
    assert "pip install -e '.[serve]'" in messages.cli_hint("pip install 'irodori-speaker[serve]'")
    monkeypatch.setattr(messages, "IN_A_CLONE", False)
    hint = messages.cli_hint(
        "install PortAudio (Debian: apt-get install libportaudio2; or run scripts/setup.sh) x"
    )
    assert "setup.sh" not in hint and "libportaudio2" in hint
    assert messages.extra_hint("ja") == "install the ja extra: pip install 'irodori-speaker[ja]'"


def test_a_library_hint_reaches_the_terminal_in_cli_spelling(tmp_path, capsys):
    if loading.torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA for the error")
    _, hint = two_lines(["say", "x", "-o", tmp_path / "a.wav", "--tiny-random", "--backend", "cuda"], capsys)
    assert "--backend cpu" in hint and "backend='cpu'" not in hint


@pytest.mark.parametrize(
    "argv", [["say"], ["say", "x", "--speed"], ["nosuchcommand"], ["cache", "stats", "--bogus"]]
)
def test_usage_errors_are_two_lines_not_the_whole_usage(argv, capsys):
    line, hint = two_lines(argv, capsys, status=2)
    assert "--help" in hint and "usage:" not in line


# ---- one notice for noise --------------------------------------------------------------------------


def test_the_noise_notice_is_one_line_on_the_command_line(irodori_home, tmp_path, capsys):
    out = str(tmp_path / "a.wav")
    assert cli.main(["say", "はい", "-o", out, "--tiny-random", "--backend", "cpu"]) == 0
    err = capsys.readouterr().err
    assert err.count("noise") == 1 and "warning: tiny-random model: the output is noise" in err


@pytest.mark.slow
def test_the_noise_notice_reaches_a_python_program_once(tmp_path):
    code = "from irodori_speaker.synthesis.loading import load_synthesizer as l; l(tiny_random=True)"
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, IRODORI_CACHE=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("the output is noise") == 1


# ---- serve: Ctrl-C is 130, as its help says ---------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_serve_exits_130_on_ctrl_c_and_says_noise_once(tmp_path):
    pytest.importorskip("uvicorn")
    port = _free_port()
    env = dict(os.environ, IRODORI_CACHE=str(tmp_path), HF_HUB_OFFLINE="1")
    argv = ["serve", "--tiny-random", "--backend", "cpu", "--port", str(port), "--no-prewarm", "--no-cache"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "irodori_speaker.cli", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        # SIGINT as in a terminal's foreground: a shell's background job (CI started with `&`) ignores it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        limit = time.monotonic() + 480  # a hang guard: a loaded 2-core machine starts it in ~20 s
        while time.monotonic() < limit and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.count("the output is noise") == 1
    assert "Traceback" not in err
    assert (
        "130"
        in subprocess.run(  # and the help promises it
            [sys.executable, "-m", "irodori_speaker.cli", "serve", "--help"], capture_output=True, text=True
        ).stdout
    )


# ---- the cache commands ----------------------------------------------------------------------------


def test_cache_dir_goes_before_or_after_the_action(tmp_path, capsys):
    missing = tmp_path / "missing"
    for argv in (["cache", "stats", "--cache-dir", missing], ["cache", "--cache-dir", missing, "stats"]):
        line, hint = two_lines(argv, capsys)
        assert f"there is no phrase cache at {missing}" in line and "prebuild" in hint
    assert not missing.exists()


@pytest.mark.slow
def test_cache_clear_asks_on_a_terminal(tmp_path):
    import pty

    from irodori_speaker.cache import PhraseCache

    d = tmp_path / "pc"
    with PhraseCache(d) as c:
        c.put("0" * 64, np.full(4800, 0.1, np.float32), text="行", source="test")
    env = dict(os.environ, IRODORI_CACHE=str(tmp_path))
    for answer, wanted in (("n\n", "nothing removed"), ("y\n", "removed")):
        main, child = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "irodori_speaker.cli", "cache", "clear", "--cache-dir", str(d)],
            stdin=child,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        os.close(child)
        os.write(main, answer.encode())
        out, err = proc.communicate(timeout=120)
        os.close(main)
        assert proc.returncode == 0, err
        assert "[y/N]" in err and wanted in out + err


# ---- prewarm keys ----------------------------------------------------------------------------------


def test_prewarm_seconds_are_keyed_by_voice_name(tmp_path):
    async def body():
        voices = [Voice(name="aoi"), tmp_path / "kana.wav", Voice(name="aoi", caption="明るい声")]
        async with Speaker(FakeSynth(), output="null", voices=voices) as s:
            return dict(s.prewarm_seconds)

    got = asyncio.run(body())
    assert list(got) == ["default", "aoi", "kana", "aoi (2)"]
    assert all(v >= 0 for v in got.values())


# ---- the sample voice and the README's Python ------------------------------------------------------


def test_the_sample_voice_ships_in_the_package_with_its_licence():
    voice = Voice.sample()
    assert voice.reference == SAMPLE_VOICE and voice.name == "sample"
    info = sf.info(str(SAMPLE_VOICE))
    assert 3.0 <= info.duration <= 6.0 and info.samplerate == 48_000
    assert SAMPLE_VOICE.stat().st_size < 64_000  # compressed (Opus)
    licence = (SAMPLE_VOICE.parent / "SAMPLE_VOICE.md").read_text(encoding="utf-8")
    assert "CC0" in licence and "espeak" in licence.lower()
    assert "data/*" in pyproject()["tool"]["setuptools"]["package-data"]["irodori_speaker"]
    assert common.SAMPLE_VOICE_FILE == SAMPLE_VOICE  # `--voice sample` (the CLI knows it without torch)


@pytest.mark.slow
def test_the_readmes_python_snippet_runs_as_written_offline(tmp_path):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    snippet = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    assert "Voice.sample()" in snippet and "tiny_random=True" in snippet
    (tmp_path / "snippet.py").write_text(snippet, encoding="utf-8")
    env = dict(os.environ, IRODORI_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="1")
    r = subprocess.run(
        [sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr
    assert sf.info(str(tmp_path / "hello.wav")).duration > 0


# ---- one version -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_version_is_one_for_the_command_and_the_wheel(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out.strip() == f"irodori-speaker {__version__}"
    project = pyproject()["project"]
    assert "version" not in project and "version" in project["dynamic"]
    r = subprocess.run(  # the wheel's metadata, as `python -m build` makes it
        [
            sys.executable,
            "-c",
            "from setuptools import build_meta as b; import sys; "
            "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    meta = (tmp_path / r.stdout.strip().splitlines()[-1] / "METADATA").read_text(encoding="utf-8")
    assert f"\nVersion: {__version__}\n" in meta
    assert "Classifier: Topic :: Multimedia :: Sound/Audio :: Speech" in meta
    assert "Project-URL: " in meta and "License-Expression: MIT" in meta


# ---- the quick subset ------------------------------------------------------------------------------


def test_every_slow_listing_names_a_real_module_or_test():
    import ast

    tree = ast.parse((REPO / "tests" / "conftest.py").read_text(encoding="utf-8"))
    lists = {}
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [None])[0]
        name = getattr(target, "id", "")
        if name.startswith("SLOW") and node.value is not None:
            lists[name] = ast.literal_eval(node.value)
    assert lists["SLOW_MODULES"] and lists["SLOW_TESTS"]
    for module in lists["SLOW_MODULES"]:
        assert (REPO / module).exists(), module
    for entry in lists["SLOW_TESTS"]:
        path, _, name = entry.partition("::")
        text = (REPO / path).read_text(encoding="utf-8")
        assert not name or f"def {name}" in text, entry
