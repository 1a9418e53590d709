"""A queued line's public handle (`Utterance`) and the states a line goes through (`UtteranceState`).

The handle is what `Speaker.enqueue` returns: awaitable, cancellable, and a read-only view of
the line's record (`record.LineRecord`), which the Speaker's parts move along.
"""

from __future__ import annotations

import enum
from collections.abc import Generator, Sequence
from typing import Any, Protocol

import numpy as np

from ..options import SynthesisOptions, SynthesisRecord
from .lines import Priority
from .playback import Chunk

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


class LineView(Protocol):
    """What a handle sees of its line (`record.LineRecord` is the one implementation)."""

    @property
    def id(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def priority(self) -> Priority: ...
    @property
    def voice(self) -> Any: ...
    @property
    def options(self) -> SynthesisOptions | None: ...
    @property
    def deadline(self) -> float | None: ...
    @property
    def cache(self) -> bool | None: ...
    @property
    def state(self) -> UtteranceState: ...
    @property
    def error(self) -> BaseException | None: ...
    @property
    def record(self) -> SynthesisRecord | None: ...
    @property
    def timing(self) -> Any: ...
    @property
    def played_fraction(self) -> float: ...
    @property
    def heard_text(self) -> str: ...
    @property
    def timings(self) -> dict[str, float]: ...
    @property
    def chunks(self) -> Sequence[Chunk]: ...
    @property
    def rendered(self) -> bool: ...
    @property
    def sample_rate(self) -> int: ...
    async def wait_ended(self) -> None: ...
    def request_cancel(self, reason: str) -> None: ...


class Utterance:
    """A handle on one queued line. `await handle` waits until it is over.

    Awaiting returns the handle; it raises only if the line's synthesis failed
    (the exception the synthesizer raised). Cancelled, expired, skipped and
    interrupted lines end normally: look at `state`. Every attribute is read-only.
    """

    def __init__(self, line: LineView) -> None:
        self._line = line

    # -- what was asked ----------------------------------------------------------------------------

    @property
    def id(self) -> int:
        return self._line.id

    @property
    def text(self) -> str:
        return self._line.text

    @property
    def priority(self) -> Priority:
        return self._line.priority

    @property
    def voice(self) -> Any:
        return self._line.voice

    @property
    def options(self) -> SynthesisOptions | None:
        return self._line.options

    @property
    def deadline(self) -> float | None:
        """The monotonic time by which it must start playing (its time-to-live), or None."""
        return self._line.deadline

    @property
    def cache(self) -> bool | None:
        """The line's `cache` option: None (the Speaker's policy), True (store it), False (no cache)."""
        return self._line.cache

    # -- what has happened -------------------------------------------------------------------------

    @property
    def state(self) -> UtteranceState:
        return self._line.state

    @property
    def done(self) -> bool:
        """It is over (its state is terminal)."""
        return self._line.state.terminal

    @property
    def error(self) -> BaseException | None:
        """The exception its synthesis raised (state `failed`), else None."""
        return self._line.error

    @property
    def record(self) -> SynthesisRecord | None:
        """The synthesizer's record of the line, once synthesised."""
        return self._line.record

    @property
    def audio(self) -> np.ndarray | None:
        """The line's audio at the synthesizer's rate, once synthesis has finished."""
        line = self._line
        if not line.rendered:
            return None
        chunks = line.chunks
        if not chunks:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate([c.audio for c in chunks])

    @property
    def sample_rate(self) -> int:
        return self._line.sample_rate

    @property
    def timing(self) -> Any:
        """Its estimated word / mora times (`timing.estimate.LineTiming`), once synthesised; else None."""
        return self._line.timing

    @property
    def played_fraction(self) -> float:
        """How much of it was heard (1.0 played through; 0.0 never started)."""
        return self._line.played_fraction

    @property
    def heard_text(self) -> str:
        """That fraction of its normalised text, rounded to whole characters."""
        return self._line.heard_text

    @property
    def timings(self) -> dict[str, float]:
        """Monotonic times so far (a copy): enqueued, synthesis_started, first_chunk,
        synthesis_finished, playback_started, playback_finished."""
        return self._line.timings

    # -- acting on it ------------------------------------------------------------------------------

    def cancel(self) -> None:
        """Drop the line if it has not played (its synthesis stops between steps); else fade it out."""
        self._line.request_cancel("cancelled")

    def interrupt(self) -> None:
        """The same as `cancel` (the name of livekit-agents' SpeechHandle): stop this line."""
        self.cancel()

    async def wait(self) -> Utterance:
        """Until it is over; the handle, or the exception its synthesis raised."""
        await self._line.wait_ended()
        if self._line.error is not None:
            raise self._line.error
        return self

    def __await__(self) -> Generator[Any, None, Utterance]:
        return self.wait().__await__()

    def __repr__(self) -> str:
        return f"<Utterance #{self.id} {self.state.value} {self.text[:20]!r}>"
