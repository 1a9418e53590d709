"""Where the device owner's thread spends its rounds, for `concurrency.py --owner-profile`.

Two views of one run:
- by job kind (this module's own clock, the owner thread's only): each call the owner makes (a
  batch of jobs of one key is one) is timed and labelled by what it is (the text encoders, a
  line's start, a decode window, a whole line's sampling ...); the rest of a round is the
  steppers' iteration (the step batch) and the owner's bookkeeping. The owner thread's alone,
  on any Python.
- cProfile of the rounds: the functions under them. Before Python 3.12 it sees the owner thread
  only; from 3.12 on cProfile is built on `sys.monitoring` (python/cpython#130377), whose events
  are process-wide, so the stream threads' own calls (their waits, the audio checks) are mixed
  in: read it for the owner's functions only, and take the shares from the table.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from irodori_speaker.engine.hardware.owner import DEVICE, Job


def job_kind(job: Job) -> str:
    """A job's label: the first text part of its batching key, else its function's name."""
    key = job.key
    if isinstance(key, tuple):
        words = [k for k in key if isinstance(k, str)]
        if words:
            return words[0]
    fn = job.many if job.many is not None and job.key is not None else job.fn
    return getattr(fn, "__qualname__", type(fn).__name__)


def owner_time(fn: Callable[..., Any], *args: Any) -> tuple[Any, str]:
    """`fn(*args)` with the owner's rounds timed by job kind and under cProfile; the report."""
    spent: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    jobs_s = rounds_s = 0.0
    prof = cProfile.Profile()
    plain_round, plain_do = DEVICE._round, DEVICE._do

    def do_timed(job: Job) -> None:
        nonlocal jobs_s
        t0 = time.perf_counter()
        try:
            plain_do(job)
        finally:
            dt = time.perf_counter() - t0
            kind = job_kind(job)
            spent[kind] += dt
            calls[kind] += 1
            jobs_s += dt

    def round_timed() -> None:
        nonlocal rounds_s
        t0 = time.perf_counter()
        prof.enable()
        try:
            plain_round()
        finally:
            prof.disable()
            rounds_s += time.perf_counter() - t0

    DEVICE._do = do_timed  # type: ignore[method-assign]
    DEVICE._round = round_timed  # type: ignore[method-assign]
    try:
        result = fn(*args)
    finally:
        del DEVICE._round
        del DEVICE._do
    total = rounds_s or float("nan")
    spent["(steps: the steppers' iterations, and bookkeeping)"] = rounds_s - jobs_s
    lines = [
        f"the owner's rounds: {1e3 * rounds_s:.1f} ms (its own clock, the owner thread only)",
        "",
        "| what | calls | ms | share % |",
        "|---|---|---|---|",
    ]
    for kind, s in sorted(spent.items(), key=lambda kv: -kv[1]):
        n = calls.get(kind, 0)
        lines.append(f"| {kind} | {n or '-'} | {1e3 * s:.1f} | {100 * s / total:.0f} |")
    out = io.StringIO()
    if sys.version_info >= (3, 12):
        out.write("(cProfile below: Python 3.12+, every thread's calls mixed in; see owner_time.py)\n")
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("cumulative").print_stats(30)  # the structure: steps, starts, windows
    stats.sort_stats("tottime").print_stats(25)  # the leaves: launches, copies
    return result, "\n".join(lines) + "\n\n" + out.getvalue()


ROUND_MARK = "irodori-owner-round"


def top_level(events: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """The (start, end, name) intervals of one thread not inside another (an op's own ops, and
    what it launches, are inside it): each top-level op once, its time its whole call's."""
    out: list[tuple[int, int, str]] = []
    open_until = -1
    for a, b, name in sorted(events, key=lambda e: (e[0], -e[1])):
        if a >= open_until:
            out.append((a, b, name))
            open_until = b
    return out


def ops_table(events: list[tuple[int, int, str]], lines: int, top: int = 25) -> str:
    """The owner thread's top-level ops and CUDA runtime calls, most time first: calls and us a
    line (`events`: its (start ns, end ns, name), the round marks left out)."""
    n = max(lines, 1)
    ops: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for a, b, name in top_level([e for e in events if not e[2].startswith("cuda")]):
        ops[name][0] += 1
        ops[name][1] += b - a
    runtime: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for a, b, name in events:
        if name.startswith("cuda"):
            runtime[name][0] += 1
            runtime[name][1] += b - a
    out = [
        f"top-level ops {sum(c for c, _ in ops.values()) / n:.1f} a line, "
        f"{sum(t for _, t in ops.values()) / n / 1e3:.0f} us a line; every op and call "
        f"{len(events) / n:.1f} a line",
        "",
        "| op (top level) or CUDA call | calls a line | us a line |",
        "|---|---|---|",
    ]
    for table in (ops, runtime):
        for name, (c, t) in sorted(table.items(), key=lambda kv: -kv[1][1])[:top]:
            out.append(f"| {name[:90]} | {c / n:.1f} | {t / n / 1e3:.1f} |")
    return "\n".join(out)


def owner_ops(fn: Callable[..., Any], *args: Any) -> tuple[Any, str]:
    """`fn(*args)` (a run returning `.lines`) under torch.profiler on every thread, the owner's
    rounds marked: the torch ops and CUDA runtime calls the owner thread makes a line, by name.
    What the owner's time is made of where its Python is not the bound (the thirty-second
    session: at 64 streams the GIL is held 39 % of the wall while the owner is busy 87 %)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    try:
        from torch._C._profiler import _ExperimentalConfig

        config = _ExperimentalConfig(profile_all_threads=True)
    except (ImportError, TypeError) as e:  # an older torch records the thread that starts it only
        raise SystemExit(f"--host-ops needs torch.profiler's profile_all_threads ({e})") from e
    plain_round = DEVICE._round
    native: set[int] = set()  # the owner's OS thread id: CUDA runtime calls may carry it instead

    def marked() -> None:
        native.add(threading.get_native_id())
        with record_function(ROUND_MARK):
            plain_round()

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    DEVICE._round = marked  # type: ignore[method-assign]
    try:
        with profile(activities=activities, experimental_config=config) as prof:
            result = fn(*args)
    finally:
        del DEVICE._round
    raw = [e for e in prof.profiler.kineto_results.events() if e.device_type().name == "CPU"]
    owner = {e.start_thread_id() for e in raw if e.name() == ROUND_MARK} | native
    rounds = [e for e in raw if e.name() == ROUND_MARK]
    events = [
        (e.start_ns(), e.start_ns() + e.duration_ns(), e.name())
        for e in raw
        if e.start_thread_id() in owner and e.name() != ROUND_MARK
    ]
    busy = sum(e.duration_ns() for e in rounds) / 1e6
    head = f"the owner's rounds: {len(rounds)}, {busy:.1f} ms under the profiler"
    return result, head + "\n" + ops_table(events, result.lines)
