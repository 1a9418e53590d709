"""One queued line: its handle (`Utterance`) and the states it goes through (`UtteranceState`).

The handle is what `Speaker.enqueue` returns; the Speaker's parts (queue, worker, tracker)
read and move its private fields, all on the event loop.
"""

from __future__ import annotations

import asyncio
import enum
from typing import Any, Protocol

import numpy as np

from ..cancel import CancelToken
from ..options import SynthesisOptions, SynthesisRecord
from .jitter import LineFeed
from .lines import Priority
from .playback import Chunk, PlayItem

__all__ = ["Utterance", "UtteranceState"]


class UtteranceState(str, enum.Enum):
    QUEUED = "queued"
    SYNTHESIZING = "synthesizing"
    READY = "ready"  # synthesised, waiting for its turn
    PLAYING = "playing"
    PLAYED = "played"
    INTERRUPTED = "interrupted"  # stopped while playing (skip/interrupt/cancel/close)
    CANCELLED = "cancelled"  # dropped before it played (cancel/clear/close/overflow)
    EXPIRED = "expired"  # its time-to-live ran out before it could start
    SKIPPED = "skipped"  # nothing to say (empty or whitespace text)
    FAILED = "failed"  # synthesis raised; `error` has the exception

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = {
    UtteranceState.PLAYED,
    UtteranceState.INTERRUPTED,
    UtteranceState.CANCELLED,
    UtteranceState.EXPIRED,
    UtteranceState.SKIPPED,
    UtteranceState.FAILED,
}


class _Owner(Protocol):
    """What a handle needs of its Speaker."""

    sample_rate: int

    def _cancel(self, utt: Utterance, reason: str) -> None: ...


class Utterance:
    """A handle on one queued line. `await handle` waits until it is over.

    Awaiting returns the handle; it raises only if the line's synthesis failed
    (the exception the synthesizer raised). Cancelled, expired, skipped and
    interrupted lines end normally: look at `state`.
    """

    def __init__(
        self,
        speaker: _Owner,
        uid: int,
        text: str,
        priority: Priority,
        voice: Any,
        options: SynthesisOptions | None,
        deadline: float | None,
        now: float,
        cache: bool | None = None,
    ) -> None:
        self._speaker = speaker
        self.id = uid
        self.text = text
        self.priority = priority
        self.voice = voice
        self.options = options
        self.deadline = deadline  # monotonic time by which it must start playing
        self.state = UtteranceState.QUEUED
        self.error: BaseException | None = None
        self.record: SynthesisRecord | None = None
        self.played_fraction = 0.0
        self.heard_text = ""
        self.timings: dict[str, float] = {"enqueued": now}
        self.timing: Any = None  # timing.LineTiming: estimated word/mora times, once synthesised
        self._token = CancelToken()
        self._chunks: list[Chunk] = []
        self._synth_done = False
        self.cache = cache  # None: looked up, stored per the Speaker's cache_store; False: neither
        self._cache_pending = False  # a phrase-cache lookup is in flight
        self._preempted = False  # its prefetch was cancelled for a higher lane; it will be requeued
        self._feed = LineFeed()  # when its streamed chunks arrived (the jitter buffer's input)
        self._live_record: SynthesisRecord | None = None  # the streaming synthesizer's record
        self._item: PlayItem | None = None
        self._reason = "cancelled"
        self._done = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.state.terminal

    @property
    def audio(self) -> np.ndarray | None:
        """The line's audio at the synthesizer's rate, once synthesis has finished."""
        if not self._synth_done:
            return None
        if not self._chunks:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate([c.audio for c in self._chunks])

    @property
    def sample_rate(self) -> int:
        return self._speaker.sample_rate

    def cancel(self) -> None:
        """Drop the line if it has not played (its synthesis stops between steps); else fade it out."""
        self._speaker._cancel(self, "cancelled")

    async def wait(self) -> Utterance:
        await self._done.wait()
        if self.error is not None:
            raise self.error
        return self

    def __await__(self) -> Any:
        return self.wait().__await__()

    def __repr__(self) -> str:
        return f"<Utterance #{self.id} {self.state.value} {self.text[:20]!r}>"

    # -- for the Speaker's parts -----------------------------------------------------------------

    def _received_s(self, sample_rate: int) -> float:
        """Seconds of audio synthesised so far."""
        return sum(len(c.audio) for c in self._chunks) / max(1, sample_rate)

    def _restart(self) -> None:
        """Back to QUEUED with a fresh token after a pre-empted prefetch (it never left its lane);
        what the stopped run produced was dropped, so it is rendered again in full."""
        self._preempted = False
        if self.state.terminal:
            return
        self._token = CancelToken()
        self._chunks.clear()
        self._feed = LineFeed()
        self._synth_done = False
        self.state = UtteranceState.QUEUED
        for k in ("synthesis_started", "first_chunk"):
            self.timings.pop(k, None)
