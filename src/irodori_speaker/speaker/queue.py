"""The queue policy: lanes, time-to-live, the queue bound, look-ahead and pre-emption.

    q = LineQueue(ttl={"low": 20}, max_queue=8, lookahead_lines=2)
    q.add(line); q.expired(now); q.overflow(line); q.to_synthesise(scheduled=0, ...)

Pure: no event loop, no threads, no clock of its own (callers pass `now`), no side effects
beyond its lanes. It decides; the Speaker acts (cancels, starts synthesis, plays).
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from ..errors import InputError
from .lines import UNSET, Priority
from .record import LineRecord
from .utterance import UtteranceState

__all__ = ["LineQueue", "parse_ttl"]


def parse_ttl(ttl: Any) -> dict[Priority, float | None]:
    """Seconds (every lane), a mapping lane -> seconds or None (no limit) -> per-lane TTLs."""
    out: dict[Priority, float | None] = dict.fromkeys(Priority)
    if ttl is None:
        return out
    if isinstance(ttl, (int, float)):
        items: Iterable[tuple[Any, Any]] = ((p, ttl) for p in Priority)
    elif isinstance(ttl, Mapping):
        items = ttl.items()
    else:
        raise InputError(f"ttl must be seconds or a mapping lane -> seconds, got {ttl!r}")
    for lane, seconds in items:
        if seconds is not None and not (isinstance(seconds, (int, float)) and seconds > 0):
            raise InputError(f"ttl for {lane!r} must be > 0 seconds or None, got {seconds!r}")
        out[Priority.parse(lane)] = None if seconds is None else float(seconds)
    return out


def lanes_of(priority: Any) -> list[Priority]:
    """None: every lane; one lane; or an iterable of lanes."""
    if priority is None:
        return list(Priority)
    if isinstance(priority, (str, int, Priority)):
        return [Priority.parse(priority)]
    return [Priority.parse(p) for p in priority]


class LineQueue:
    """Lines waiting to be pushed to the player, in play order (every HIGH before any NORMAL...)."""

    def __init__(
        self,
        *,
        ttl: float | Mapping[Priority | str, float | None] | None = None,
        max_queue: int | None = None,
        lookahead_lines: int = 2,
        lookahead_s: float = 30.0,
    ) -> None:
        if not isinstance(lookahead_lines, int) or lookahead_lines < 0:
            raise InputError(f"lookahead_lines must be an int >= 0, got {lookahead_lines!r}")
        if not (isinstance(lookahead_s, (int, float)) and lookahead_s >= 0 and math.isfinite(lookahead_s)):
            raise InputError(f"lookahead_s must be a finite number >= 0, got {lookahead_s!r}")
        if max_queue is not None and (not isinstance(max_queue, int) or max_queue < 1):
            raise InputError(f"max_queue must be an int >= 1 or None, got {max_queue!r}")
        self.ttl = parse_ttl(ttl)
        self.max_queue = max_queue
        self.lookahead_lines = lookahead_lines
        self.lookahead_s = float(lookahead_s)
        self.lanes: dict[Priority, deque[LineRecord]] = {p: deque() for p in Priority}

    # -- contents --------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[LineRecord]:
        """Play order."""
        for p in Priority:
            yield from self.lanes[p]

    def __len__(self) -> int:
        return sum(len(q) for q in self.lanes.values())

    def __bool__(self) -> bool:
        return any(self.lanes.values())

    def deadline(self, lane: Priority, ttl: Any, now: float) -> float | None:
        """When a line queued now must start playing (`ttl` UNSET: its lane's)."""
        seconds = self.ttl[lane] if ttl is UNSET else ttl
        return None if seconds is None else now + seconds

    def add(self, line: LineRecord) -> int:
        """Queue `line` at the end of its lane; returns how many queued lines play before it."""
        position = sum(len(self.lanes[p]) for p in Priority if p <= line.priority)
        self.lanes[line.priority].append(line)
        return position

    def remove(self, line: LineRecord) -> None:
        with contextlib.suppress(ValueError):
            self.lanes[line.priority].remove(line)

    def put_back(self, line: LineRecord) -> None:
        """In front of its lane (it was taken off to play, and every output failed)."""
        self.lanes[line.priority].appendleft(line)

    def lane(self, priority: Priority) -> list[LineRecord]:
        return list(self.lanes[priority])

    def head(self) -> LineRecord | None:
        """The line that plays next."""
        return next(iter(self), None)

    # -- decisions --------------------------------------------------------------------------------

    def expired(self, now: float) -> list[LineRecord]:
        """Lines whose time-to-live ran out before they could start playing."""
        return [u for u in self if u.deadline is not None and now > u.deadline]

    def overflow(self, newest: LineRecord) -> list[LineRecord]:
        """The lines to drop so the queue holds `max_queue`: the oldest waiting line of the lowest
        lane first; `newest` itself when every queued line is already being synthesised."""
        if self.max_queue is None:
            return []
        victims: list[LineRecord] = []
        for _ in range(len(self) - self.max_queue):
            victim = newest
            for p in reversed(Priority):
                lane = [u for u in self.lanes[p] if u.state == UtteranceState.QUEUED and u not in victims]
                if lane:
                    victim = lane[0]
                    break
            victims.append(victim)
            if victim is newest:
                break
        return victims

    def to_synthesise(
        self, *, scheduled: int, scheduled_s: float, playing: bool, sample_rate: int
    ) -> LineRecord | None:
        """The next line to synthesise, or None while the look-ahead is full.

        `scheduled` / `scheduled_s`: lines (and their seconds) given to the player that have not
        started; `playing`: the player holds any line. A line whose cache lookup is in flight is
        passed over (a hit makes its synthesis unnecessary).
        """
        ahead, ahead_s = scheduled, scheduled_s
        candidate = None
        for line in self:
            if line.state == UtteranceState.QUEUED:
                if line.lookup_pending:
                    continue
                candidate = line
                break
            ahead += 1
            ahead_s += line.received_s(sample_rate)
        if candidate is None:
            return None
        idle = not playing and ahead == 0  # nothing to hear until it is done: always go
        full = self.lookahead_lines == 0 or ahead >= self.lookahead_lines or ahead_s >= self.lookahead_s
        return None if full and not idle else candidate

    def preempts(self, current: LineRecord) -> bool:
        """Should the prefetch of `current` stop because a line of a higher lane waits?

        Only while nothing of it is scheduled to play; the stopped line stays in its place.
        """
        if current.item is not None or current.preempted or current.state != UtteranceState.SYNTHESIZING:
            return False
        for other in self:
            if other.priority >= current.priority:
                return False
            if other.state == UtteranceState.QUEUED and not other.lookup_pending:
                return True
        return False
