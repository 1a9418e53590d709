"""Two py-spy views of a process under many streams (py-spy samples it from outside).

- Who holds the GIL (`gil_table`, `server_load.py --gil-profile`; py-spy `--gil`: only the thread
  holding it is sampled): under many streams the device owner needs the GIL for every launch, so
  the Python work of the other threads (HTTP, text front-end, audio out) is time the GPU may wait
  (docs/status.md, known gaps). Each sample goes to the part that claims the frame nearest its
  leaf (`PARTS`: a synthesis thread inside the model is "engine", the event loop inside pydantic
  is "HTTP"); the table gives each part's share and its milliseconds of GIL per request.
- Where every thread spends its wall time (`wait_table`, `concurrency.py --wait-profile`; py-spy
  `--idle`: waiting threads sampled too): per thread group (the streams, the device owner, ...),
  the share of samples running or waiting in each of our functions; a wait in the device owner's
  queue or a host copy names who waits (the encoders, the sampler, a decode window). When the
  owner is idle while lines are in flight, this says where the lines are.

    python benchmarks/server_load.py -n 100 --gil-profile /tmp/gil.txt
    python benchmarks/concurrency.py --smoke --streams 1,16 --wait-profile 16
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
def recording(pid: int, out: Path, *, gil: bool = True) -> Iterator[None]:
    """py-spy samples `pid` into `out` (raw collapsed stacks, one line per thread's stack) while
    the block runs: `gil`, the GIL's holder only; else every thread, waiting ones too."""
    exe = py_spy()
    if exe is None:
        raise SystemExit("this profile needs py-spy (pip install py-spy)")
    # --nonblocking: the process is not paused at each sample (pausing it 200 times a second
    # halved a 16-stream run's rate on the dev CPU); a stack may then be read mid-change, rarely
    cmd = [exe, "record", "-p", str(pid), "-f", "raw", "-o", str(out), "-r", str(RATE), "--threads"]
    cmd.append("--nonblocking")
    log = out.with_suffix(out.suffix + ".log")
    with open(log, "wb") as err:
        spy = subprocess.Popen([*cmd, "--gil" if gil else "--idle"], stdout=subprocess.DEVNULL, stderr=err)
        time.sleep(1.0)  # attached before the burst starts
        try:
            yield
        finally:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
            try:
                spy.wait(60)
            except subprocess.TimeoutExpired:
                spy.kill()


def samples(raw: Path) -> Iterator[tuple[str, list[str], int]]:
    """(thread group, frames root first, count) of each stack in py-spy's raw output: the group
    is the thread's name without a trailing number ("irodori-synthesis-3" -> "irodori-synthesis",
    "stream-12" -> "stream")."""
    text = raw.read_text(errors="replace") if raw.exists() else ""
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        first, *frames = stack.split(";")
        name = first.split("): ")[-1]  # "thread (1943): irodori-synthesis-0"
        yield re.sub(r"-\d+$", "", name), frames, int(n)


def no_samples(raw: Path) -> str:
    log = raw.with_suffix(raw.suffix + ".log")
    why = " ".join(log.read_text(errors="replace").split())[-300:] if log.exists() else ""
    return f"no samples (py-spy could not attach: {why or 'no output'})"


def part_of(frames: list[str]) -> str:
    """The part of the frame nearest the leaf that any part claims."""
    for frame in reversed(frames):
        for name, marks in PARTS:
            if any(m in frame for m in marks):
                return name
    return "other (asyncio loop, threads)"


def gil_table(raw: Path, requests: int, unit: str = "request", wall_s: float | None = None) -> str:
    """The parts' shares of the GIL samples in `raw`, and their ms of GIL per request (or `unit`);
    with `wall_s`, the share of that wall some thread held the GIL (near 100 %: the GIL is the
    bound, whatever the GPU does)."""
    parts: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    for thread, frames, n in samples(raw):
        parts[part_of(frames)] += n
        threads[thread] += n
    total = sum(parts.values())
    if not total:
        return "GIL profile: " + no_samples(raw)
    held = f" ({total / RATE / wall_s:.0%} of {wall_s:.2f} s)" if wall_s else ""
    rows = [
        f"GIL profile: {total} samples at {RATE}/s = {total / RATE:.2f} s holding the GIL{held}, "
        f"{1e3 * total / RATE / requests:.1f} ms a {unit}",
        f"| part | share | ms a {unit} |",
        "|---|---|---|",
    ]
    for name, n in parts.most_common():
        rows.append(f"| {name} | {n / total:.0%} | {1e3 * n / RATE / requests:.1f} |")
    rows.append("by thread: " + ", ".join(f"{t} {n / total:.0%}" for t, n in threads.most_common(4)))
    return "\n".join(rows)


#: a leaf frame in one of these files is a thread waiting (a lock, a condition, a queue, a sleep)
_WAITING = ("threading.py", "queue.py", "selectors.py", "socket.py")
#: waits whose own frame says little: the caller named after them (the next frame of ours up)
_QUEUES = ("DeviceOwner._submit", "DeviceOwner.run", "DeviceOwner.run_batched", "HostCopy.wait")


def _name(frame: str) -> str:
    return frame.split(" (")[0]


def state_of(frames: list[str]) -> str:
    """ "waits in F" or "runs in F": F the frame of ours nearest the leaf (for a wait in the
    device owner's queue or a host copy, "F <- its caller")."""
    ours = [f for f in frames if "irodori_speaker/" in f]
    waiting = bool(frames) and any(w in frames[-1] for w in _WAITING)
    if not ours:
        return ("waits" if waiting else "runs") + " (outside our code)"
    name = _name(ours[-1])
    if name in _QUEUES:
        callers = [_name(f) for f in ours[:-1] if _name(f) not in _QUEUES]
        if callers:
            name = f"{name} <- {callers[-1]}"
    return ("waits in " if waiting else "runs in ") + name


def wait_table(raw: Path, top: int = 8) -> str:
    """Per thread group, its `top` states by share of its samples (py-spy `--idle`)."""
    groups: dict[str, Counter[str]] = {}
    for thread, frames, n in samples(raw):
        groups.setdefault(thread, Counter())[state_of(frames)] += n
    if not groups:
        return "wait profile: " + no_samples(raw)
    rows = ["| threads | samples | where (share of the group's samples) |", "|---|---|---|"]
    for thread, states in sorted(groups.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(states.values())
        where = "; ".join(f"{s} {n / total:.0%}" for s, n in states.most_common(top))
        rows.append(f"| {thread} | {total} | {where} |")
    return "\n".join(rows)
