"""The jitter buffer of streamed lines: how much audio to hold before a line starts to play.

When the decoder is slower than real time (RTF r > 1: r wall seconds per second of audio), a
line started at its first chunk runs dry in the middle. Started with B seconds buffered, a line
of D seconds that arrives in chunks of c seconds, each r * c after the last, plays through
without a hole when B >= D * (1 - 1/r) + c / r (the worst moment is just before its last chunk;
c / r because a chunk arrives whole, at the end of its decode). `JitterBuffer` measures r from
the arrival of the line's own chunks and of recent lines' (the larger wins, times a safety
margin for a loaded machine), estimates D from the synthesis record, and says when a line may
start: audio may start later, never stop inside.
"""

from __future__ import annotations

import math
from collections import deque
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

    def add(self, t: float, seconds: float) -> None:
        if seconds <= 0:
            return
        if self.first_t is None:
            self.first_t, self.first_s = t, seconds
        else:
            self.chunk_s = max(self.chunk_s, seconds)
        self.last_t = t
        self.received_s += seconds

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


class JitterBuffer:
    """Start rule for streamed lines, from the measured production RTF.

    `fast_rtf`: below it (with the margin applied) a line starts at its first chunk, as before.
    `margin`: the measured RTF is multiplied by it. `history`: recent lines remembered.
    """

    def __init__(self, *, margin: float = 1.25, fast_rtf: float = 0.8, history: int = 5) -> None:
        self.margin = margin
        self.fast_rtf = fast_rtf
        self._recent: deque[float] = deque(maxlen=history)

    def finished(self, feed: LineFeed) -> None:
        """Remember a streamed line's production RTF once it has all arrived."""
        r = feed.rtf()
        if r is not None and math.isfinite(r):
            self._recent.append(r)

    def rtf(self, feed: LineFeed) -> float | None:
        """The RTF to plan with: the larger of this line's and recent lines' (None: unknown).

        With neither (a Speaker's first line, one chunk in), the first chunk's own RTF serves
        when it is already fast: it bounds the decode's from above."""
        known = [r for r in (feed.rtf(), max(self._recent, default=None)) if r is not None]
        if known:
            return max(known)
        first = feed.first_rtf()
        return first if first is not None and first <= self.fast_rtf else None

    def needed_s(self, feed: LineFeed, total_s: float) -> float | None:
        """Seconds of audio to hold before starting (None: not measurable yet, wait a chunk)."""
        r = self.rtf(feed)
        if r is None:
            return None
        r *= self.margin
        if r <= self.fast_rtf * self.margin:
            return 0.0
        if r <= 1.0:
            return 0.0
        return max(0.0, total_s * (1.0 - 1.0 / r) + feed.chunk_s / r)

    def ready(self, feed: LineFeed, total_s: float) -> bool:
        if feed.first_t is None:
            return False
        need = self.needed_s(feed, total_s)
        return need is not None and feed.received_s >= need
