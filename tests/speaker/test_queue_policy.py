"""The queue policy on its own: no event loop, no threads, no clock (speaker/queue.py)."""

from __future__ import annotations

import numpy as np
import pytest

from irodori_speaker.audio.lipsync import Envelope
from irodori_speaker.audio.signal import SAMPLE_RATE
from irodori_speaker.errors import InputError
from irodori_speaker.speaker.lines import UNSET, Priority
from irodori_speaker.speaker.playback import Chunk, PlayItem
from irodori_speaker.speaker.queue import LineQueue, lanes_of, parse_ttl
from irodori_speaker.speaker.record import LineRecord

SR = SAMPLE_RATE


class _Owner:
    sample_rate = SR

    def _cancel(self, line: LineRecord, reason: str) -> None:  # pragma: no cover - not called here
        raise AssertionError("the policy never cancels")


_next = iter(range(1, 10_000))


def line(lane: str = "normal", *, deadline: float | None = None) -> LineRecord:
    return LineRecord(_Owner(), next(_next), "台詞", Priority.parse(lane), None, None, deadline, 0.0)


def test_play_order_is_every_high_line_then_normal_then_low_each_in_arrival_order():
    q = LineQueue()
    low, n1, high, n2 = line("low"), line(), line("high"), line()
    positions = [q.add(u) for u in (low, n1, high, n2)]
    assert list(q) == [high, n1, n2, low]
    # how many queued lines play before each one when it arrived
    assert positions == [0, 0, 0, 2]
    assert q.head() is high and len(q) == 4


def test_ttl_per_lane_and_expiry_by_the_callers_clock():
    q = LineQueue(ttl={"low": 5, "normal": None})
    assert q.deadline(Priority.LOW, UNSET, now=100.0) == 105.0
    assert q.deadline(Priority.NORMAL, UNSET, now=100.0) is None
    assert q.deadline(Priority.NORMAL, 2.0, now=100.0) == 102.0  # the line's own ttl wins
    a, b = line("low", deadline=105.0), line(deadline=None)
    q.add(a)
    q.add(b)
    assert q.expired(104.9) == []
    assert q.expired(105.1) == [a]
    assert parse_ttl(3)[Priority.HIGH] == 3.0
    with pytest.raises(InputError, match="ttl for"):
        parse_ttl({"low": -1})


def test_overflow_drops_the_oldest_waiting_line_of_the_lowest_lane_else_the_newest():
    q = LineQueue(max_queue=2)
    low_old, low_new, normal = line("low"), line("low"), line()
    for u in (low_old, low_new, normal):
        q.add(u)
    assert q.overflow(normal) == [low_old]
    # every queued line already being synthesised: the newcomer itself goes
    q2 = LineQueue(max_queue=1)
    busy, newest = line(), line()
    busy.synthesising()
    q2.add(busy)
    q2.add(newest)
    assert q2.overflow(newest) == [newest]
    assert LineQueue().overflow(newest) == []  # no bound


def test_look_ahead_waits_when_full_and_always_goes_when_nothing_would_be_heard():
    q = LineQueue(lookahead_lines=1)
    ready, waiting = line(), line()
    ready.synthesising()
    ready.chunk_arrived(Chunk(np.zeros(SR, dtype=np.float32)), 0.5, SR)  # one second synthesised
    ready.synthesised(None, 0.5)  # type: ignore[arg-type]
    q.add(ready)
    q.add(waiting)
    # one line ready ahead of it: the look-ahead (1 line) is full
    assert q.to_synthesise(scheduled=0, scheduled_s=0.0, playing=True, sample_rate=SR) is None
    q.lookahead_lines = 2
    assert q.to_synthesise(scheduled=0, scheduled_s=0.0, playing=True, sample_rate=SR) is waiting
    q.lookahead_s = 0.5  # ...unless the seconds ahead are already enough
    assert q.to_synthesise(scheduled=0, scheduled_s=0.0, playing=True, sample_rate=SR) is None
    # a line whose cache lookup is in flight is passed over (a hit needs no synthesis)
    q2 = LineQueue(lookahead_lines=0)
    pending, next_one = line(), line()
    pending.lookup_started()
    q2.add(pending)
    q2.add(next_one)
    # look-ahead 0 means none, but with nothing to hear the next line always goes
    assert q2.to_synthesise(scheduled=0, scheduled_s=0.0, playing=False, sample_rate=SR) is next_one
    assert q2.to_synthesise(scheduled=1, scheduled_s=1.0, playing=True, sample_rate=SR) is None


def test_a_waiting_higher_line_preempts_a_lower_prefetch_only_before_it_is_scheduled():
    q = LineQueue()
    low = line("low")
    low.synthesising()
    q.add(low)
    assert not q.preempts(low)  # nobody above it
    high = line("high")
    q.add(high)
    assert q.preempts(low)
    high.lookup_started()  # might be a hit: no need to stop anything yet
    assert not q.preempts(low)
    high.lookup_ended()
    low.pushed(PlayItem(low.id, low.text, Envelope(SR)))  # already given to the player
    assert not q.preempts(low)


def test_bad_bounds_are_input_errors_naming_them():
    with pytest.raises(InputError, match="lookahead_lines"):
        LineQueue(lookahead_lines=-1)
    with pytest.raises(InputError, match="max_queue"):
        LineQueue(max_queue=0)
    with pytest.raises(InputError, match="lookahead_s"):
        LineQueue(lookahead_s=float("nan"))
    assert lanes_of(None) == list(Priority) and lanes_of(["low", 0]) == [Priority.LOW, Priority.HIGH]
