"""Speaker events, their delivery on the event loop, and pipeline metrics.

Every event is a frozen dataclass with a `kind` string and a `time` taken from
`time.monotonic()`. Playback and lip-sync events carry the time at which the
sound card plays the sample they describe (estimated from the output's DAC
time), not the time the event was produced.

Delivery: `EventBus.subscribe()` gives an async iterator, `EventBus.on()`
registers a callback (plain or async). Both run on the Speaker's event loop; a
callback that raises is logged and never disturbs the pipeline.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ..errors import InputError
from ..options import SynthesisRecord
from .tasks import TaskScope

log = logging.getLogger("irodori_speaker.speaker")


@dataclass(frozen=True)
class Event:
    """Base of every Speaker event."""

    kind: ClassVar[str] = "event"
    time: float


@dataclass(frozen=True)
class UtteranceEvent(Event):
    """An event about one line (utterance)."""

    utterance_id: int
    text: str


@dataclass(frozen=True)
class Queued(UtteranceEvent):
    kind: ClassVar[str] = "queued"
    priority: str = "normal"
    position: int = 0  # lines ahead of it in play order when queued


@dataclass(frozen=True)
class Skipped(UtteranceEvent):
    """A line that will never play: reason is empty, cancelled, expired, overflow or closed."""

    kind: ClassVar[str] = "skipped"
    reason: str = "cancelled"


@dataclass(frozen=True)
class SynthesisStarted(UtteranceEvent):
    kind: ClassVar[str] = "synthesis_started"
    queue_wait: float = 0.0  # enqueue -> the model lock was taken for this line


@dataclass(frozen=True)
class SynthesisFinished(UtteranceEvent):
    kind: ClassVar[str] = "synthesis_finished"
    compute_s: float = 0.0  # wall time inside the model for this line
    audio_s: float = 0.0
    rtf: float = 0.0  # compute_s / audio_s
    first_chunk_s: float = 0.0  # synthesis start -> first audio chunk
    record: SynthesisRecord | None = None


@dataclass(frozen=True)
class SynthesisFailed(UtteranceEvent):
    kind: ClassVar[str] = "synthesis_failed"
    error: BaseException | None = None


@dataclass(frozen=True)
class PlaybackStarted(UtteranceEvent):
    kind: ClassVar[str] = "playback_started"
    latency: float = 0.0  # enqueue -> first sample heard


@dataclass(frozen=True)
class PlaybackFinished(UtteranceEvent):
    kind: ClassVar[str] = "playback_finished"
    duration: float = 0.0  # seconds of audio played


@dataclass(frozen=True)
class PlaybackInterrupted(UtteranceEvent):
    kind: ClassVar[str] = "playback_interrupted"
    played_fraction: float = 0.0
    heard_text: str = ""


@dataclass(frozen=True)
class Mouth(Event):
    """Lip-sync: mouth-open level in [0, 1] at `time` (when the sound card plays it)."""

    kind: ClassVar[str] = "mouth"
    level: float = 0.0
    utterance_id: int | None = None


@dataclass(frozen=True)
class LineTimingEvent(UtteranceEvent):
    """A line's estimated word and mora times (`timing.estimate.LineTiming`) on the playback clock:
    `time` and every time inside `timing` are `time.monotonic()` seconds at which the sound
    card plays them. Sent once per line when it starts being heard (captions, subtitles)."""

    kind: ClassVar[str] = "line_timing"
    timing: Any = None


@dataclass(frozen=True)
class WordEvent(UtteranceEvent):
    """A word starts being heard at `time` (estimated; `text` is the word as written, e.g.
    "VTuber", `spoken` what the model read, ブイチューバー, `reading` its kana: timing.Word)."""

    kind: ClassVar[str] = "word"
    reading: str = ""
    end: float = 0.0  # when it ends, on the same clock
    index: int = 0  # its place in the line's words
    char_start: int = 0  # its span in the spoken text (SynthesisRecord.text)
    char_end: int = 0
    spoken: str = ""


@dataclass(frozen=True)
class Viseme(Event):
    """The mouth shape from `time` on: "a", "i", "u", "e", "o" (あいうえお) or "closed",
    from the line's morae (estimated), at the time the sound card plays them (lip-sync lead
    included, as for `Mouth`)."""

    kind: ClassVar[str] = "viseme"
    viseme: str = "closed"
    utterance_id: int | None = None


@dataclass(frozen=True)
class Underrun(Event):
    """An output ran dry in the middle of a line (streaming decode slower than playback)."""

    kind: ClassVar[str] = "underrun"
    output: str = ""
    utterance_id: int | None = None


@dataclass(frozen=True)
class OutputError(Event):
    """An output failed (device unplugged, stream stopped). Call `Speaker.reopen_outputs()`."""

    kind: ClassVar[str] = "output_error"
    output: str = ""
    error: BaseException | None = None


@dataclass(frozen=True)
class OutputRecovered(Event):
    kind: ClassVar[str] = "output_recovered"
    output: str = ""


@dataclass(frozen=True)
class Closed(Event):
    """The Speaker closed; event iterators end after it."""

    kind: ClassVar[str] = "closed"


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        Queued,
        Skipped,
        SynthesisStarted,
        SynthesisFinished,
        SynthesisFailed,
        PlaybackStarted,
        PlaybackFinished,
        PlaybackInterrupted,
        Mouth,
        LineTimingEvent,
        WordEvent,
        Viseme,
        Underrun,
        OutputError,
        OutputRecovered,
        Closed,
    )
}

KindSpec = str | type[Event] | Iterable[str | type[Event]] | None


def _kinds(spec: KindSpec) -> frozenset[str] | None:
    if spec is None:
        return None
    items = [spec] if isinstance(spec, (str, type)) else list(spec)
    out = set()
    for item in items:
        kind = item.kind if isinstance(item, type) and issubclass(item, Event) else item
        if kind not in EVENT_TYPES:
            raise InputError(f"unknown event kind {item!r}", hint=f"one of {sorted(EVENT_TYPES)}")
        out.add(kind)
    return frozenset(out)


class _Subscription:
    def __init__(self, kinds: frozenset[str] | None, maxsize: int) -> None:
        self.kinds = kinds
        self.queue: deque[Event | None] = deque()
        self.maxsize = maxsize
        self.dropped = 0
        self.ready = asyncio.Event()

    def put(self, event: Event | None) -> None:
        if event is not None and len(self.queue) >= self.maxsize:
            self.queue.popleft()  # a slow reader loses the oldest events, never blocks the pipeline
            self.dropped += 1
        self.queue.append(event)
        self.ready.set()


class EventBus:
    """Fan-out of Speaker events to async iterators and callbacks, on the event loop."""

    def __init__(self) -> None:
        # Weak: a stream the reader dropped (`async for ev in s.events(): break`) unsubscribes
        # itself when it is garbage-collected, instead of queueing events forever.
        self._subs: weakref.WeakSet[_Subscription] = weakref.WeakSet()
        self._callbacks: list[tuple[frozenset[str] | None, Callable[[Any], Any]]] = []
        # Async callbacks run as tasks of the bus's own scope, cancelled and awaited on `aclose`.
        self.scope = TaskScope("irodori-speaker:events")
        self._closed = False

    def emit(self, event: Event) -> None:
        """Deliver `event`: queued for iterators now, callbacks on the next loop iteration."""
        if self._closed:
            return
        for sub in list(self._subs):
            if sub.kinds is None or event.kind in sub.kinds:
                sub.put(event)
        if self._callbacks:
            loop = asyncio.get_running_loop()
            for kinds, fn in self._callbacks:
                if kinds is None or event.kind in kinds:
                    loop.call_soon(self._call, fn, event)

    def _call(self, fn: Callable[[Any], Any], event: Event) -> None:
        try:
            result = fn(event)
            if inspect.isawaitable(result) and not self.scope.closed:
                self.scope.spawn(_awaited(result), f"on {event.kind}")
        except Exception:
            log.exception("event callback %r raised on %s", fn, event.kind)

    def on(self, kinds: KindSpec, fn: Callable[[Any], Any] | None = None) -> Any:
        """Call `fn(event)` for events of `kinds` (None: all). Returns an unsubscribe function.

        Usable as a decorator: `@bus.on("playback_started")`.
        """
        ks = _kinds(kinds)

        def register(f: Callable[[Any], Any]) -> Callable[[], None]:
            entry = (ks, f)
            self._callbacks.append(entry)

            def off() -> None:
                with contextlib.suppress(ValueError):
                    self._callbacks.remove(entry)

            return off

        if fn is None:

            def deco(f: Callable[[Any], Any]) -> Callable[[Any], Any]:
                register(f)
                return f

            return deco
        return register(fn)

    def subscribe(self, kinds: KindSpec = None, maxsize: int = 10_000) -> EventStream:
        """Events of `kinds` (None: all) from this call on, until the Speaker closes."""
        sub = _Subscription(_kinds(kinds), maxsize)
        if self._closed:
            sub.put(None)
        else:
            self._subs.add(sub)
        return EventStream(self, sub)

    @property
    def subscribers(self) -> int:
        """How many event streams are registered now."""
        return len(self._subs)

    def _unsubscribe(self, sub: _Subscription) -> None:
        self._subs.discard(sub)

    def close(self) -> None:
        """End every iterator (after the events already queued for it)."""
        self._closed = True
        for sub in list(self._subs):
            sub.put(None)
        self._subs.clear()
        self._callbacks.clear()

    async def aclose(self, grace_s: float = 1.0) -> None:
        """`close()`; the async callbacks still running (the `closed` event's among them) get
        `grace_s` to finish, then are cancelled and awaited."""
        self.close()
        await asyncio.sleep(0)  # callbacks scheduled by the last emits start now
        await self.scope.drain(grace_s)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


class EventStream:
    """An async iterator of events; registered when created, so nothing emitted after is missed.

    It unsubscribes when it ends, on `close()` / `aclose()`, when used as `async with`, and
    when the reader drops it (garbage collection).
    """

    def __init__(self, bus: EventBus, sub: _Subscription) -> None:
        self._bus = bus
        self._sub = sub

    @property
    def dropped(self) -> int:
        """Events lost because this reader fell more than `maxsize` behind."""
        return self._sub.dropped

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        sub = self._sub
        while not sub.queue:
            sub.ready.clear()
            await sub.ready.wait()
        event = sub.queue[0]
        if event is None:  # end marker stays, so every later call also ends
            self._bus._unsubscribe(sub)
            raise StopAsyncIteration
        sub.queue.popleft()
        return event

    def close(self) -> None:
        """Stop receiving events."""
        self._bus._unsubscribe(self._sub)
        self._sub.put(None)

    async def aclose(self) -> None:
        """`close()`, awaitable like an async generator's."""
        self.close()

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Summary:
    """Distribution of one metric (seconds unless said otherwise)."""

    count: int = 0
    mean: float = float("nan")
    p50: float = float("nan")
    p95: float = float("nan")
    max: float = float("nan")


class Series:
    """The last `maxlen` values of one metric."""

    def __init__(self, maxlen: int = 1000) -> None:
        self.values: deque[float] = deque(maxlen=maxlen)

    def add(self, value: float) -> None:
        self.values.append(float(value))

    def summary(self) -> Summary:
        if not self.values:
            return Summary()
        a = np.asarray(self.values, dtype=np.float64)
        p50, p95 = np.percentile(a, [50, 95])
        return Summary(len(a), float(a.mean()), float(p50), float(p95), float(a.max()))


@dataclass(frozen=True)
class Metrics:
    """A snapshot of `Speaker.metrics()`.

    queue_wait: enqueue -> synthesis start (the model lock taken).
    first_chunk: synthesis start -> first audio chunk out of the model.
    time_to_first_audio: enqueue -> first sample heard (what a viewer waits).
    rtf: synthesis wall time / audio seconds, per line.
    gap: silence beyond the configured pause between two back-to-back lines.
    """

    lines_queued: int = 0
    lines_played: int = 0
    lines_interrupted: int = 0
    lines_skipped: int = 0
    lines_failed: int = 0
    underruns: int = 0
    queue_wait: Summary = field(default_factory=Summary)
    first_chunk: Summary = field(default_factory=Summary)
    time_to_first_audio: Summary = field(default_factory=Summary)
    rtf: Summary = field(default_factory=Summary)
    gap: Summary = field(default_factory=Summary)
