"""One line's record: what is to be said and what has happened to it, behind its `Utterance`.

The Speaker's parts (queue, worker, tracker, scheduler) hold `LineRecord`s; users hold the
record's handle (`record.handle`). Only the record changes its own fields, through methods
named for what happened (`synthesising`, `synthesised`, `playing`, `played`, `end`, ...),
and every state change goes through `_move`, which refuses one the state machine does not
allow: that is a bug in the Speaker, never a user error. All on the event loop, except
`stream_opened` (the worker thread).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from ..cancel import CancelToken
from ..options import SynthesisOptions, SynthesisRecord
from .jitter import LineFeed
from .lines import Priority, Reply
from .playback import Chunk, PlayItem
from .utterance import Utterance, UtteranceState

__all__ = ["LineRecord"]

S = UtteranceState
_ENDINGS = {S.PLAYED, S.INTERRUPTED, S.CANCELLED, S.EXPIRED, S.FAILED}
# the moves a line may make; a terminal state has none
_NEXT: dict[UtteranceState, set[UtteranceState]] = {
    # taken by the worker (or a cache hit); dropped, expired or empty before that
    S.QUEUED: {S.SYNTHESIZING, S.CANCELLED, S.EXPIRED, S.SKIPPED},
    # rendered; a stream starts playing before its end; a pre-empted prefetch goes back in line
    S.SYNTHESIZING: {S.READY, S.PLAYING, S.QUEUED} | (_ENDINGS - {S.PLAYED}),
    S.READY: {S.PLAYING} | _ENDINGS,
    S.PLAYING: _ENDINGS,
}


class Owner(Protocol):
    """What a line needs of its Speaker."""

    sample_rate: int

    def _cancel(self, line: LineRecord, reason: str) -> None: ...


class LineRecord:
    """One line from `enqueue` to its end: its facts, state, audio, timings and play item."""

    def __init__(
        self,
        owner: Owner,
        uid: int,
        text: str,
        priority: Priority,
        voice: Any,
        options: SynthesisOptions | None,
        deadline: float | None,
        now: float,
        cache: bool | None = None,
        reply: Reply | None = None,
    ) -> None:
        self.id = uid
        self.text = text
        self.priority = priority
        self.voice = voice
        self.options = options
        self._deadline = deadline  # monotonic time by which it must start playing
        self.reply = reply  # the streamed reply it is a segment of (one TTL for all of them)
        self.cache = cache  # None: looked up, stored per the Speaker's cache_store; False: neither
        self._state = S.QUEUED
        self._error: BaseException | None = None
        self._record: SynthesisRecord | None = None
        self._timing: Any = None  # timing.LineTiming: estimated word/mora times, once synthesised
        self._played_fraction = 0.0
        self._heard_text = ""
        self._timings: dict[str, float] = {"enqueued": now}
        self._token = CancelToken()
        self._chunks: list[Chunk] = []
        self._rendered = False
        self._lookup_pending = False  # a phrase-cache lookup is in flight
        self._preempted = False  # its prefetch was cancelled for a higher lane; it will be requeued
        self._feed = LineFeed()  # when its streamed chunks arrived (the jitter buffer's input)
        self._live_record: SynthesisRecord | None = None  # the streaming synthesizer's record
        self._item: PlayItem | None = None
        self._reason = "cancelled"
        self._ended = asyncio.Event()
        self._owner = owner
        self.handle = Utterance(self)

    # -- reading -----------------------------------------------------------------------------------

    @property
    def state(self) -> UtteranceState:
        return self._state

    @property
    def deadline(self) -> float | None:
        """When it must have started playing, else it expires; None once its reply is on its way."""
        if self.reply is not None and self.reply.started:
            return None
        return self._deadline

    @property
    def error(self) -> BaseException | None:
        return self._error

    @property
    def record(self) -> SynthesisRecord | None:
        return self._record

    @property
    def timing(self) -> Any:
        return self._timing

    @property
    def played_fraction(self) -> float:
        return self._played_fraction

    @property
    def heard_text(self) -> str:
        return self._heard_text

    @property
    def timings(self) -> dict[str, float]:
        """A copy: the monotonic times of what has happened so far."""
        return dict(self._timings)

    @property
    def token(self) -> CancelToken:
        """Its synthesis' cancel token (a fresh one after a pre-empted prefetch)."""
        return self._token

    @property
    def chunks(self) -> Sequence[Chunk]:
        return tuple(self._chunks)

    @property
    def rendered(self) -> bool:
        """Its synthesis has finished: every chunk is in."""
        return self._rendered

    @property
    def lookup_pending(self) -> bool:
        return self._lookup_pending

    @property
    def preempted(self) -> bool:
        return self._preempted

    @property
    def feed(self) -> LineFeed:
        return self._feed

    @property
    def live_record(self) -> SynthesisRecord | None:
        """The streaming synthesizer's record, filled in as it goes."""
        return self._live_record

    @property
    def item(self) -> PlayItem | None:
        """Its play item while the player holds it."""
        return self._item

    @property
    def reason(self) -> str:
        """Why it was stopped ("cancelled", "skipped", "expired", "overflow", "closed", ...)."""
        return self._reason

    def received_samples(self) -> int:
        return sum(len(c.audio) for c in self._chunks)

    def received_s(self, sample_rate: int) -> float:
        """Seconds of audio synthesised so far."""
        return self.received_samples() / max(1, sample_rate)

    def normalised_text(self) -> str:
        """The text as the synthesizer read it (its record's), else as given."""
        return self._record.text if self._record is not None and self._record.text else self.text

    @property
    def sample_rate(self) -> int:
        return self._owner.sample_rate

    def request_cancel(self, reason: str) -> None:
        """The handle's `cancel`: the owner drops or fades the line."""
        self._owner._cancel(self, reason)

    async def wait_ended(self) -> None:
        await self._ended.wait()

    def __repr__(self) -> str:
        return f"<LineRecord #{self.id} {self._state.value} {self.text[:20]!r}>"

    # -- the state machine -------------------------------------------------------------------------

    def _move(self, to: UtteranceState) -> None:
        if to not in _NEXT.get(self._state, frozenset()):
            raise AssertionError(f"line #{self.id}: no move from {self._state.value} to {to.value}")
        self._state = to

    # -- synthesis ---------------------------------------------------------------------------------

    def synthesising(self) -> None:
        """The worker (or a phrase-cache hit) took it."""
        self._move(S.SYNTHESIZING)

    def synthesis_started(self, t0: float) -> float:
        """Its synthesis started at `t0`; returns how long it waited in line."""
        self._timings["synthesis_started"] = t0
        self._feed.started_t = t0
        return t0 - self._timings["enqueued"]

    def stream_opened(self, record: SynthesisRecord | None) -> None:
        """Worker thread: the stream's record, read by the jitter buffer as it fills in."""
        self._live_record = record

    def chunk_arrived(self, chunk: Chunk, t: float, sample_rate: int, load: int = 1) -> float | None:
        """A chunk of its audio arrived at `t` with `load` lines in synthesis on the model; for
        the first one, its delay after the start."""
        first = "first_chunk" not in self._timings
        if first:
            self._timings["first_chunk"] = t
        self._chunks.append(chunk)
        self._feed.add(t, len(chunk.audio) / max(1, sample_rate), load)
        return t - self._timings.get("synthesis_started", t) if first else None

    def timed(self, timing: Any) -> None:
        """Its estimated word / mora timing is known (its play item gets it too); a streamed
        line's first estimate is replaced by the one from its whole audio (the words and visemes
        not yet announced follow the new one)."""
        self._timing = timing
        if self._item is not None:
            self._item.retimed(timing)

    def synthesised(self, record: SynthesisRecord, t1: float) -> None:
        """Its synthesis finished at `t1`: all its audio is in."""
        self._rendered = True
        self._record = record
        self._timings["synthesis_finished"] = t1
        if self._state == S.SYNTHESIZING:  # a stream may be playing already
            self._move(S.READY)

    def failed(self, error: BaseException) -> None:
        """Its synthesis raised `error` (FAILED follows, once it is off the player)."""
        self._error = error

    def lookup_started(self) -> None:
        self._lookup_pending = True

    def lookup_ended(self) -> None:
        self._lookup_pending = False

    def preempt(self, reason: str) -> None:
        """Stop its prefetch for a higher lane; `requeued` follows when the run has ended."""
        self._preempted = True
        self._token.cancel(reason)

    def requeued(self) -> None:
        """Back to QUEUED with a fresh token after a pre-empted prefetch (it never left its lane);
        what the stopped run produced is dropped, so it is rendered again in full."""
        self._preempted = False
        if self._state.terminal:
            return
        self._move(S.QUEUED)
        self._token = CancelToken()
        self._chunks.clear()
        self._feed = LineFeed()
        self._rendered = False
        for k in ("synthesis_started", "first_chunk"):
            self._timings.pop(k, None)

    # -- playback ----------------------------------------------------------------------------------

    def pushed(self, item: PlayItem) -> None:
        """Given to the player as `item` (its reply, if any, is on its way: none of it expires now)."""
        self._item = item
        if self.reply is not None:
            self.reply.on_its_way()
        item.timing = self._timing

    def returned(self) -> None:
        """Taken back from the player before it started (every output failed)."""
        assert self._state in (S.READY, S.SYNTHESIZING), self
        self._item = None

    def playing(self, t: float) -> None:
        """Its first sample was heard at `t`."""
        self._move(S.PLAYING)
        self._timings["playback_started"] = t

    def played(self, t: float) -> None:
        """Heard to its end at `t` (the state follows with `end`)."""
        self._item = None
        self._played_fraction = 1.0
        self._heard_text = self.normalised_text()
        self._timings["playback_finished"] = t

    def cut(self, t: float, fraction: float, heard_text: str) -> None:
        """Faded out at `t` after `fraction` of it (`heard_text`) was heard."""
        self._item = None
        self._played_fraction, self._heard_text = fraction, heard_text
        self._timings["playback_finished"] = t
        self._token.cancel("interrupted")

    def dropped(self) -> None:
        """Taken off the player before a sample was heard."""
        self._item = None
        self._token.cancel(self._reason)

    # -- ending ------------------------------------------------------------------------------------

    def stopping(self, reason: str) -> None:
        """Asked to stop (`reason`): its synthesis stops between steps; its end follows."""
        self._token.cancel(reason)
        self._reason = reason
        if reason == "expired" and self.reply is not None:
            self.reply.expire()  # the rest of the reply goes with it, never its middle alone

    def end(self, state: UtteranceState) -> None:
        """It is over, as `state`; its awaiters wake after this step's event callbacks (also
        scheduled with call_soon), so they have seen every event of the line."""
        assert state.terminal, state
        self._move(state)
        asyncio.get_running_loop().call_soon(self._ended.set)
