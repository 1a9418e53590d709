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
