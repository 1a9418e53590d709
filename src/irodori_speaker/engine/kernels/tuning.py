"""When kernels may stop to measure: inside a warm-up, not in the middle of a stream.

A kernel chooser that times its candidates the first time it sees a shape costs tens to hundreds
of milliseconds per new shape. During `Synthesizer.prewarm` that is what warm-up is for; on a live
stream it is a stall (2026-12-04, H200: batched lines reached new int4 M buckets mid-stream and
four streams took 10.6 s; 1.0 s after this, in the next call). Code that warms up wraps itself
in `tuning_allowed()`; elsewhere a chooser picks without measuring (the int4 one: a measured
neighbour, else a fixed pick) and measures only a layer shape it has never seen at all.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["is_tuning_allowed", "tuning_allowed"]

_depth = 0
_lock = threading.Lock()


@contextmanager
def tuning_allowed() -> Iterator[None]:
    """Within this block (process-wide: warm-up holds the model lock) choosers measure new shapes."""
    global _depth
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1


def is_tuning_allowed() -> bool:
    return _depth > 0
