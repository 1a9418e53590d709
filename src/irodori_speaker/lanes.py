"""The lane of the line a thread works for: what the device owner orders a line's work by.

The Speaker renders each line inside `line_lane(priority)` (its `Priority` numbers: 0 high,
1 normal, 2 low); the device owner (engine/hardware/owner.py) reads `current_lane()` on the
line's thread as the line submits its jobs: a high line's first-audio work (encoders, start,
first window) goes ahead of other lines', a low line's first audio waits behind their later
windows, and the step scheduler steps high lines first. Here, below both, so the Speaker sets it
without the engine.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["HIGH_LANE", "LOW_LANE", "NORMAL_LANE", "current_lane", "line_lane"]

HIGH_LANE, NORMAL_LANE, LOW_LANE = 0, 1, 2

_line = threading.local()


@contextmanager
def line_lane(lane: int) -> Iterator[None]:
    """Within the block, this thread works for a line of `lane`."""
    before = getattr(_line, "lane", NORMAL_LANE)
    _line.lane = int(lane)
    try:
        yield
    finally:
        _line.lane = before


def current_lane() -> int:
    """The lane of the line this thread works for (`line_lane`; NORMAL_LANE outside one)."""
    return int(getattr(_line, "lane", NORMAL_LANE))
