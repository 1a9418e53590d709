"""The jitter buffer of streamed lines: how much audio to hold before a line starts to play.

When the decoder is slower than real time (RTF r > 1: r wall seconds per second of audio), a
line started at its first chunk runs dry in the middle. Started with B seconds buffered, a line
of D seconds that arrives in chunks of c seconds, each r * c after the last, plays through
without a hole when B >= D * (1 - 1/r) + c / r (the worst moment is just before its last chunk;
c / r because a chunk arrives whole, at the end of its decode). `JitterBuffer` measures r from
the arrival of the line's own chunks and of recent lines' (the larger wins, times a safety
margin for a loaded machine), estimates D from the synthesis record, and says when a line may
start: audio may start later, never stop inside.

Several Speakers (or the server's streams) share one model, whose lock serves their chunks in
turn: with k lines in synthesis each is produced about k times slower than alone. `ModelLoad`
(one per synthesizer, shared by every Speaker on it) counts the lines in synthesis and keeps the
recent lines' RTF per line of load; the buffer plans with that cost times the load now, so a
Speaker's first line, measured before the others' work arrived, is not trusted beyond it.
"""

from __future__ import annotations

import contextlib
import math
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

LATENT_HZ = 25.0


@dataclass
class LineFeed:
    """When a streamed line's audio arrived: the first chunk, the last one, the total so far."""

    started_t: float | None = None  # when its synthesis started
    first_t: float | None = None
    first_s: float = 0.0
    last_t: float = 0.0
    received_s: float = 0.0
    chunk_s: float = 0.0  # the largest chunk after the first (the stream's granularity)
    first_load: int = 1  # lines in synthesis on the model when the first chunk came
    load_sum: float = 0.0  # lines in synthesis on the model at each chunk, summed
    load_n: int = 0

    def add(self, t: float, seconds: float, load: int = 1) -> None:
        if seconds <= 0:
            return
        if self.first_t is None:
            self.first_t, self.first_s, self.first_load = t, seconds, max(1, load)
        else:
            self.chunk_s = max(self.chunk_s, seconds)
        self.last_t = t
        self.received_s += seconds
        self.load_sum += max(1, load)
        self.load_n += 1

    def mean_load(self) -> float:
        """Lines in synthesis on the model while this one streamed, on average (1 if unknown)."""
        return self.load_sum / self.load_n if self.load_n else 1.0

    def rtf(self) -> float | None:
        """Wall seconds per audio second after the first chunk (None before a second chunk)."""
        after = self.received_s - self.first_s
        if self.first_t is None or after <= 0:
            return None
        return max(0.0, self.last_t - self.first_t) / after

    def first_rtf(self) -> float | None:
        """Wall seconds per audio second up to the first chunk, sampling included: an upper
        bound of the decode's RTF (None before the first chunk or without a start time)."""
        if self.first_t is None or self.started_t is None or self.first_s <= 0:
            return None
        return max(0.0, self.first_t - self.started_t) / self.first_s


def line_seconds_estimate(record: Any, received_s: float) -> float:
    """The whole line's length, from what the synthesizer planned so far (its record, being
    filled while it streams): the latent frames sampled, scaled to every piece of a split text
    (only the first piece is sampled when the first chunks arrive), never less than what came."""
    frames = float(getattr(record, "frames", 0) or 0) if record is not None else 0.0
    pieces = int(getattr(record, "pieces", 1) or 1) if record is not None else 1
    return max(frames / LATENT_HZ * max(1, pieces), received_s)


class ModelLoad:
    """How busy one model is: the lines in synthesis on it now (every Speaker's), and the recent
    lines' production RTF per line of load (what one line alone would take). Thread-safe: the
    workers count lines from their threads, the buffers read on their loops."""

    def __init__(self, history: int = 16) -> None:
        self._lock = threading.Lock()
        self._lines = 0
        self._unit: deque[float] = deque(maxlen=history)

    @property
    def lines(self) -> int:
        return self._lines

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """One line in synthesis for the duration."""
        with self._lock:
            self._lines += 1
        try:
            yield
        finally:
            with self._lock:
                self._lines -= 1

    def finished(self, rtf: float, mean_load: float) -> None:
        with self._lock:
            self._unit.append(rtf / max(1.0, mean_load))

    def unit_rtf(self) -> float | None:
        """The slowest recent RTF per line of load (None: no line finished yet)."""
        with self._lock:
            return max(self._unit, default=None)


_LOADS: weakref.WeakKeyDictionary[Any, ModelLoad] = weakref.WeakKeyDictionary()
_LOADS_LOCK = threading.Lock()


def model_load(synthesizer: Any) -> ModelLoad:
    """The one `ModelLoad` of `synthesizer`, shared by every Speaker that uses it."""
    with _LOADS_LOCK:
        load = _LOADS.get(synthesizer)
        if load is None:
            load = _LOADS[synthesizer] = ModelLoad()
        return load


class JitterBuffer:
    """Start rule for streamed lines, from the measured production RTF.

    `fast_rtf`: below it (with the margin applied) a line starts at its first chunk, as before.
    `margin`: the measured RTF is multiplied by it; `shared_margin` instead while other lines are
    in synthesis on the model (their stages vary the speed of this line's chunks: sampling and
    decode take turns). `history`: recent lines remembered.
    `load`: the model's `ModelLoad` (`attach` sets it once the model is known; without one the
    model counts as serving this Speaker alone).
    """

    def __init__(
        self,
        *,
        margin: float = 1.25,
        shared_margin: float = 2.0,
        fast_rtf: float = 0.8,
        history: int = 5,
        load: ModelLoad | None = None,
    ) -> None:
        self.margin = margin
        self.shared_margin = shared_margin
        self.fast_rtf = fast_rtf
        self.load = load
        self._recent: deque[float] = deque(maxlen=history)

    def attach(self, load: ModelLoad) -> None:
        self.load = load

    def lines_now(self) -> int:
        """Lines in synthesis on the model now (at least 1: the one asking)."""
        return max(1, self.load.lines) if self.load is not None else 1

    def finished(self, feed: LineFeed) -> None:
        """Remember a streamed line's production RTF once it has all arrived."""
        r = feed.rtf()
        if r is not None and math.isfinite(r):
            self._recent.append(r)
            if self.load is not None:
                self.load.finished(r, feed.mean_load())

    def rtf(self, feed: LineFeed) -> float | None:
        """The RTF to plan with (None: unknown): the largest of this line's so far, recent lines'
        here, and the model's cost per line of load times the lines in synthesis on it now.

        With none of them (the first line on the model, one chunk in), the first chunk's own RTF
        serves when it is fast and the model serves this line alone: it bounds the decode's from
        above. With other lines in synthesis it does not (their sampling and decode interleave
        with the rest of this line), so the line waits for its second chunk: a later start."""
        k = self.lines_now()
        unit = self.load.unit_rtf() if self.load is not None else None
        candidates = (feed.rtf(), max(self._recent, default=None), None if unit is None else unit * k)
        known = [r for r in candidates if r is not None]
        if known:
            return max(known)
        first = feed.first_rtf()
        if first is None or k > 1 or feed.first_load > 1:
            return None
        return first if first <= self.fast_rtf else None

    def needed_s(self, feed: LineFeed, total_s: float) -> float | None:
        """Seconds of audio to hold before starting (None: not measurable yet, wait a chunk)."""
        r = self.rtf(feed)
        if r is None:
            return None
        margin = self.margin if self.lines_now() == 1 else self.shared_margin
        r *= margin
        if r <= self.fast_rtf * margin:
            return 0.0
        if r <= 1.0:
            return 0.0
        return max(0.0, total_s * (1.0 - 1.0 / r) + feed.chunk_s / r)

    def ready(self, feed: LineFeed, total_s: float) -> bool:
        if feed.first_t is None:
            return False
        need = self.needed_s(feed, total_s)
        return need is not None and feed.received_s >= need
