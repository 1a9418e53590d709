"""Who holds a process's GIL: py-spy samples (`--gil`: only the thread holding it), by part.

Used by `server_load.py --gil-profile`: under many streams the device owner needs the GIL for
every launch, so the Python work of the server's other threads (HTTP, text front-end, audio out)
is time the GPU may wait (docs/status.md, known gaps). Each sample is put in one part by the
frame nearest the leaf that a part claims (`PARTS`: a synthesis thread inside the model is
"engine", the event loop inside pydantic is "HTTP"); the table gives each part's share of the
samples and its milliseconds of GIL per request (samples / rate / requests).

    python benchmarks/server_load.py -n 100 --gil-profile /tmp/gil.txt
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

RATE = 200  # samples a second

#: (part, what a frame's file path contains): the first part one of the stack's frames matches
PARTS = (
    ("engine (the model's Python: launches, eager ops)", ("irodori_speaker/engine/",)),
    ("text front-end (readings, tokens, length)", ("irodori_speaker/text/", "pyopenjtalk")),
    (
        "audio out (resample, encode, chunks)",
        ("irodori_speaker/audio/", "irodori_speaker/outputs/", "soundfile"),
    ),
    (
        "HTTP (uvicorn, starlette, FastAPI, pydantic)",
        ("uvicorn/", "starlette/", "fastapi/", "h11/", "pydantic"),
    ),
    ("server (routes, service, guards)", ("irodori_speaker/server/",)),
    ("synthesis (queues, pieces, options)", ("irodori_speaker/",)),
)


def py_spy() -> str | None:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return exe if Path(exe).exists() else None


@contextlib.contextmanager
def recording(pid: int, out: Path) -> Iterator[None]:
    """py-spy samples `pid`'s GIL holder into `out` (raw collapsed stacks) while the block runs."""
    exe = py_spy()
    if exe is None:
        raise SystemExit("--gil-profile needs py-spy (pip install py-spy)")
    cmd = [exe, "record", "-p", str(pid), "-f", "raw", "-o", str(out), "-r", str(RATE)]
    log = out.with_suffix(out.suffix + ".log")
    with open(log, "wb") as err:
        spy = subprocess.Popen([*cmd, "--gil", "--threads"], stdout=subprocess.DEVNULL, stderr=err)
        time.sleep(1.0)  # attached before the burst starts
        try:
            yield
        finally:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
            try:
                spy.wait(60)
            except subprocess.TimeoutExpired:
                spy.kill()


def part_of(stack: str) -> str:
    """The part of the frame nearest the leaf that any part claims (the first is the thread)."""
    for frame in reversed(stack.split(";")[1:]):
        for name, marks in PARTS:
            if any(m in frame for m in marks):
                return name
    return "other (asyncio loop, threads)"


def table(raw: Path, requests: int) -> str:
    """The parts' shares of the GIL samples in `raw`, and their ms of GIL per request."""
    parts: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    text = raw.read_text(errors="replace") if raw.exists() else ""
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        parts[part_of(stack)] += int(n)
        name = stack.split(";")[0].split("): ")[-1]  # "thread (1943): irodori-synthesis-0"
        threads[re.sub(r"-\d+$", "", name)] += int(n)
    total = sum(parts.values())
    if not total:
        log = raw.with_suffix(raw.suffix + ".log")
        why = " ".join(log.read_text(errors="replace").split())[-300:] if log.exists() else ""
        return f"GIL profile: no samples (py-spy could not attach: {why or 'no output'})"
    rows = [
        f"GIL profile: {total} samples at {RATE}/s = {total / RATE:.2f} s holding the GIL, "
        f"{1e3 * total / RATE / requests:.1f} ms a request",
        "| part | share | ms a request |",
        "|---|---|---|",
    ]
    for name, n in parts.most_common():
        rows.append(f"| {name} | {n / total:.0%} | {1e3 * n / RATE / requests:.1f} |")
    rows.append("by thread: " + ", ".join(f"{t} {n / total:.0%}" for t, n in threads.most_common(4)))
    return "\n".join(rows)
