"""The Speaker facade: the public API over the parts listed in `irodori_speaker.speaker`.

All Speaker state lives on the event loop that opened it; every event and callback is
delivered there. See docs/speaker.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from typing import Any

from ..cancel import CancelToken
from ..errors import InputError
from ..options import SynthesisOptions, SynthesizerLike
from ..outputs import Output, OutputSpec
from ..synthesis.load_options import LoadOptions
from ..text.readings import nothing_to_say
from ..text.split import check_line_text
from ..text.tags import TagMap
from . import lifetime, settings
from .events import EventBus, EventStream, KindSpec, Metrics
from .feeder import Feeder, default_segmenter, speak_stream
from .lines import UNSET, LineOptions, Priority, Reply
from .playback import Player
from .queue import LineQueue, lanes_of
from .record import LineRecord
from .runtime import Runtime
from .utterance import Utterance, UtteranceState

__all__ = ["Speaker"]

_NOT_OPEN = "use `async with Speaker(...) as s:`"


class Speaker:
    """Japanese TTS for live streams: prefetching, gapless, interruptible, with lanes and events.

    Give it a loaded `synthesizer`, or what to load (`LoadOptions`): its fields by name
    (`Speaker(model="v4", backend="cpu")`: model=, codec=, tokenizer=, backend=, device=,
    dtype=, tiny_random=, model_dir=, voice_cache_dir=, user_dict=, and preset= for preset
    fields, e.g. `preset={"int4": True}`) or whole (`load=LoadOptions(...)`, fields by name
    replacing its own); the model loads on enter (`load_synthesizer`). `device` is the torch
    device the model runs on; where the sound goes is `output`: one output or a list, an
    `Output` (`SoundDeviceOutput`, `FileOutput`, `NullOutput`), a sound device name, a file
    path, "null", or None for the system's default device. `cache` is the phrase cache (a
    `PhraseCache` or its folder); `model_dir` is where models download. Any
    `SynthesisOptions` field by name (`Speaker(speed=1.2, volume=-6)`) sets it for every line,
    as in `options=`; a line's own value (`say(text, speed=1.0)`) wins.

    `tags` maps emotion / stage tags to what a line carrying one gets: ``{"happy": {"voice":
    "happy.wav"}, "sad": {"caption": "悲しげな声", "options": {"cfg_scale_speaker": 3}},
    "笑": {"text": "ふふっ"}}`` (`irodori_speaker.text.tags.TagMap`); tags not mapped are
    stripped (option ``tags="keep"`` reads them).

    `events_server` (`irodori_speaker.server.events_server.EventsServer`, the `serve` extra)
    serves the Speaker's event feed, `/overlay` and `/studio` from open to close (docs/overlay.md).
    """

    def __init__(
        self,
        synthesizer: SynthesizerLike | None = None,
        *,
        output: OutputSpec | Sequence[OutputSpec] = None,
        voice: Any = None,
        voices: Sequence[Any] = (),
        options: SynthesisOptions | Mapping[str, Any] | None = None,
        streaming: bool = True,
        prewarm: bool = True,
        pause_s: float = 0.3,
        lookahead_lines: int = 2,
        lookahead_s: float = 30.0,
        ttl: float | Mapping[Priority | str, float | None] | None = None,
        max_queue: int | None = None,
        stall_flush_s: float | None = 0.6,
        segmenter: Callable[[], Any] | None = None,
        lipsync_lead_s: float = 0.0,
        lipsync_hz: float = 50.0,
        schedule_ahead_s: float = 0.5,
        drain_on_exit: bool = True,
        cache: Any = None,
        cache_store: str = "marked",
        load: LoadOptions | None = None,
        tags: Any = None,
        timing: bool = True,
        events_server: Any = None,
        **fields: Any,  # LoadOptions fields (model="v4") and SynthesisOptions fields (speed=1.2)
    ) -> None:
        load, line_options = settings.loading_options(synthesizer, load, fields, own=Speaker.__init__)
        settings.check_seconds(pause_s=pause_s, lookahead_s=lookahead_s, schedule_ahead_s=schedule_ahead_s)
        self._queue = LineQueue(
            ttl=ttl, max_queue=max_queue, lookahead_lines=lookahead_lines, lookahead_s=lookahead_s
        )
        self._output_specs = settings.output_specs(output, stall_flush_s, lipsync_hz, cache_store)

        self.synthesizer = synthesizer
        self._load_options = load
        self.voice = voice
        self._voices = list(voices)
        self.options = None if options is None else SynthesisOptions.coerce(options)
        if line_options:  # Speaker(speed=1.2, seed=3): options of every line, by name
            self.options = (self.options or SynthesisOptions()).replace(**line_options)
        # tag name -> voice / caption / options / words for lines that carry the tag (text/tags.py)
        self.tags = TagMap.coerce(tags)
        self.timing = bool(timing)  # word / viseme / line_timing events (timing.estimate; needs pyopenjtalk)
        self.streaming, self.prewarm, self.pause_s = streaming, prewarm, float(pause_s)
        self.stall_flush_s = stall_flush_s
        self._segmenter_factory = segmenter or default_segmenter
        self.lipsync_lead_s, self.lipsync_hz = lipsync_lead_s, lipsync_hz
        self.schedule_ahead_s = float(schedule_ahead_s)
        self.drain_on_exit = drain_on_exit
        self.cache, own_cache = settings.phrase_cache(cache)  # a PhraseCache or None
        self.cache_store = cache_store
        self.tick_s = 0.02
        self.sample_rate = 0
        self.outputs: list[Output] = []
        # seconds each voice's prewarm took, by its name ("default": the model's own voice)
        self.prewarm_seconds: dict[str, float] = {}
        self._bus = EventBus()
        self._wake, self._idle = asyncio.Event(), asyncio.Event()
        self._idle.set()
        self._runtime = Runtime(self, self._queue, self._bus, wake=self._wake, own_cache=own_cache)
        self._tracker = self._runtime.tracker
        self._loop: asyncio.AbstractEventLoop | None = None
        self._player: Player | None = None
        self._open = self._closing = False
        self._closed = asyncio.Event()  # set when a close has finished; every aclose() awaits it
        self._feeder: Feeder | None = None
        self._open_token = CancelToken()
        self.events_server = events_server  # start(speaker) once open, stop() before closing
        self._created_at = lifetime.creation_site()  # for the unclosed-Speaker warning

    max_queue = property(lambda self: self._queue.max_queue)
    lookahead_lines = property(lambda self: self._queue.lookahead_lines)
    lookahead_s = property(lambda self: self._queue.lookahead_s)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def __aenter__(self) -> Speaker:
        await self.open()
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self.aclose(drain=self.drain_on_exit and exc_type is None)

    async def open(self) -> None:
        """Open the outputs, load the model (unless given one), prewarm, start the scheduler."""
        if self._open or self._closing:
            raise InputError("this Speaker is already open (or closed); make a new one")
        self._loop = asyncio.get_running_loop()
        voices = settings.prewarm_voices(self.voice, self._voices) if self.prewarm else []
        self.synthesizer, self.prewarm_seconds = await self._runtime.open(
            self._output_specs, self.synthesizer, self._load_options, self._open_token, voices, self._idle
        )
        self.sample_rate, self.outputs = self._tracker.sample_rate, self._runtime.outputs
        self._player = self._runtime.player
        self._open = True
        lifetime.track(self)
        if self.events_server is not None:
            try:
                await self.events_server.start(self)
            except BaseException:
                await self.aclose()
                raise

    async def aclose(self, drain: bool = False) -> None:
        """Close: play what is queued first (`drain=True`) or stop now with a short fade.

        Bounded in every state (idle, queued, synthesising, playing); a second, concurrent
        call waits for the same close to finish.
        """
        if self._closing:
            await self._closed.wait()
            return
        if not self._open:
            return
        try:
            if drain:
                await self.drain()
        finally:
            self._closing = True
            if self._feeder is not None:
                self._feeder.close()
            for line in self._tracker.open_lines():
                self._cancel(line, "closed")
            # the rest runs to the end even if the closing task is cancelled meanwhile
            await asyncio.shield(self._release())

    async def _release(self) -> None:
        try:
            if self.events_server is not None:
                await self.events_server.stop()
            await self._runtime.close()
            self._open = False
            lifetime.untrack(self)
        finally:
            self._closed.set()  # whatever happened, no concurrent aclose() waits forever

    def _abandon(self, at_exit: bool = False) -> None:
        """Release an open Speaker never closed, without its loop (lifetime.py; at exit, one whose
        loop still runs in another thread is left to it)."""
        if not self._open or self._closing:
            return
        loop = self._loop
        if at_exit and loop is not None and loop.is_running() and not loop.is_closed():
            return
        self._closing, self._open = True, False
        lifetime.untrack(self)
        lifetime.warn_unclosed(self, self._created_at)
        self._open_token.cancel("the Speaker was never closed")
        self._runtime.abandon("the Speaker was never closed")

    def __del__(self) -> None:
        if getattr(self, "_open", False) and not getattr(self, "_closing", True):
            self._abandon()

    async def drain(self) -> None:
        """Wait until every queued line has played (or ended otherwise)."""
        self._require_open()
        await self._runtime.drain(self._idle)

    # -- adding lines ------------------------------------------------------------------------------

    def enqueue(self, text: str, **line: Any) -> Utterance:
        """Queue a line and return its handle at once; synthesis starts as soon as there is room.

        Line options (`irodori_speaker.speaker.lines.LineOptions`; the same for `say`, `feed`,
        `say_stream` and `enqueue_threadsafe`):

        - `priority`: "high", "normal" (default) or "low" (a `Priority`).
        - `voice`: this line's voice (default: the Speaker's).
        - `ttl`: seconds it may wait to start playing before it is dropped (default: its lane's).
        - `interrupt=True`: stop the line now playing so this one (and its lane's order) goes next.
        - `cache`: with a phrase cache, every line is looked up first (a hit plays without model
          work); `cache=True` also stores it after rendering (cache_store="marked"), `False`
          skips the cache for this line.
        - `options`: SynthesisOptions (or a mapping) for this line (default: the Speaker's).
        - any SynthesisOptions field by name (`seed=3`, `steps=4`): overrides for this line.

        A misspelt name is a TypeError; a bad value an InputError naming it.
        """
        return self._enqueue_line(text, LineOptions.parse(line, "enqueue"))

    def _enqueue_line(self, text: str, line: LineOptions, reply: Reply | None = None) -> Utterance:
        self._require_open()
        check_line_text(text)
        lane, options = line.priority, line.synthesis_options(self.options)
        voice = self.voice if line.voice is UNSET else line.voice
        if self.tags:  # a mapped emotion tag picks the line's voice / caption / options
            from ..synthesis.voices import tagged_line  # torch: only for a Speaker with tags

            text, voice, options = tagged_line(self.tags, text, voice, options)
        if self.synthesizer is not None:  # bounds that depend on the model, before any work
            self.synthesizer.resolve_options(options)
        now = time.monotonic()
        deadline = self._queue.deadline(lane, line.ttl, now)
        if reply is not None:  # a segment of a streamed reply: the reply's one deadline
            deadline = reply.deadline(deadline)
        rec = LineRecord(
            self, self._tracker.new_id(), text, lane, voice, options, deadline, now, line.cache, reply
        )
        self._tracker.counts["queued"] += 1
        if not text.strip() or nothing_to_say(text, options):  # e.g. only "[happy]"
            self._tracker.skipped_empty(rec, now)
            return rec.handle
        if reply is not None and reply.expired:  # the reply was dropped whole: so are its late segments
            self._tracker.cancel(rec, "expired")
            return rec.handle
        self._idle.clear()
        self._runtime.admit(rec, now)
        if line.interrupt:
            self.skip()
        self._wake.set()
        return rec.handle

    def enqueue_threadsafe(self, text: str, **line: Any) -> concurrent.futures.Future[Utterance]:
        """`enqueue()` from another thread (a chat reader, a GUI): a future of the handle.

        A misspelt line option raises here, in the calling thread."""
        if self._loop is None:
            raise InputError("the Speaker is not open", hint=_NOT_OPEN)
        parsed = LineOptions.parse(line, "enqueue_threadsafe")

        async def go() -> Utterance:
            return self._enqueue_line(text, parsed)

        return asyncio.run_coroutine_threadsafe(go(), self._loop)

    async def say(self, text: str, **line: Any) -> Utterance:
        """Queue a line and return once it has been played (or ended otherwise).

        Takes the line options of `enqueue`. Cancelling the awaiting task cancels the line
        (fading it out if it is playing).
        """
        utt = self._enqueue_line(text, LineOptions.parse(line, "say"))
        try:
            return await utt
        except asyncio.CancelledError:
            utt.cancel()
            raise

    def feed(self, chunk: str | None, **line: Any) -> list[Utterance]:
        """Feed streamed text (LLM tokens); every completed segment is queued at once.

        Takes the line options of `enqueue` (given mid-turn, they apply from there on); a None
        chunk is skipped. Call `end_feed()` when the turn's text is complete. If no text
        arrives for `stall_flush_s` while a partial segment is pending, it is flushed and queued.
        """
        self._require_open()
        parsed = LineOptions.parse(line, "feed")
        if self._feeder is None:
            self._feeder = self._new_feeder(parsed)
        return self._feeder.feed(chunk, parsed if line else None)

    def end_feed(self) -> list[Utterance]:
        """Flush the text fed so far (end of the turn); the next `feed()` starts a new turn."""
        self._require_open()
        feeder, self._feeder = self._feeder, None
        return feeder.end() if feeder is not None else []

    async def say_stream(
        self, source: AsyncIterable[str | None] | Iterable[str | None], **line: Any
    ) -> list[Utterance]:
        """Speak a stream of text chunks as it arrives; returns once every segment has played.

        Takes the line options of `enqueue`, applied to every segment (`interrupt` to the
        first); None chunks are skipped. Cancelling the task cancels the segments it queued.
        If a segment's synthesis failed, its error is raised after the others have finished.
        """
        self._require_open()
        return await speak_stream(self._new_feeder(LineOptions.parse(line, "say_stream")), source)

    def _new_feeder(self, line: LineOptions) -> Feeder:
        segmenter = self._segmenter_factory()
        return Feeder(self._enqueue_line, line, segmenter=segmenter, stall_flush_s=self.stall_flush_s,
                      closing=lambda: self._closing)  # fmt: skip

    # -- control -----------------------------------------------------------------------------------

    def skip(self) -> Utterance | None:
        """Fade out the line now playing (~fade_s + output latency); the next one follows."""
        self._require_open()
        line = self._tracker.skippable()
        if line is None:
            return None
        self._cancel(line, "skipped")
        return line.handle

    def clear(
        self, priority: Priority | str | int | Iterable[Priority | str | int] | None = None
    ) -> list[Utterance]:
        """Drop every line that has not started playing (in the given lanes); their synthesis stops."""
        self._require_open()
        lanes = lanes_of(priority)
        dropped = [
            u for u in self._tracker.scheduled() if u.state != UtteranceState.PLAYING and u.priority in lanes
        ]
        dropped += [u for lane in lanes for u in self._queue.lane(lane)]
        for line in dropped:
            self._cancel(line, "cancelled")
        return [line.handle for line in dropped]

    def interrupt(self, *, clear: bool = True, priority: Any = None) -> None:
        """Stop talking now: fade out the current line and (by default) drop everything queued.

        `priority` limits the clearing to those lanes (the current line stops regardless).
        """
        self._require_open()
        if clear:
            self.clear(priority)
        self.skip()

    def pause(self) -> None:
        """Fade out and hold; prefetching goes on (within the lookahead). TTLs keep running."""
        self._require_open().pause()
        self._wake.set()

    def resume(self) -> None:
        self._require_open().resume()
        self._wake.set()

    @property
    def paused(self) -> bool:
        return self._player is not None and self._player.paused

    async def reopen_outputs(self, rescan: bool = True) -> list[Output]:
        """Reopen failed outputs (by their device name); raises AudioError if one is still gone."""
        self._require_open()
        reopened = await self._runtime.reopen_outputs(rescan)
        self._wake.set()
        return reopened

    # -- looking in --------------------------------------------------------------------------------

    def events(self, kinds: KindSpec = None, maxsize: int = 10_000) -> EventStream:
        """An async iterator of events (of `kinds`; None: all) from now until the Speaker closes."""
        return self._bus.subscribe(kinds, maxsize)

    def on(self, kinds: KindSpec, fn: Callable[[Any], Any] | None = None) -> Any:
        """Call `fn(event)` on the loop for events of `kinds`; returns an unsubscribe function.

        `fn` may be async. Its exceptions are logged, never raised into the Speaker.
        """
        return self._bus.on(kinds, fn)

    @property
    def queue(self) -> list[Utterance]:
        """Lines waiting to play, in play order (the current one excluded)."""
        return [line.handle for line in self._tracker.waiting()]

    @property
    def current(self) -> Utterance | None:
        """The line being heard now."""
        line = self._tracker.current()
        return None if line is None else line.handle

    def metrics(self) -> Metrics:
        return self._tracker.metrics()

    # -- internals ---------------------------------------------------------------------------------

    def _require_open(self) -> Player:
        """The player of an open Speaker, called on its loop; else an InputError."""
        if not self._open or self._closing or self._player is None:
            raise InputError("the Speaker is not open", hint=_NOT_OPEN)
        settings.check_loop(self._loop)
        return self._player

    def _cancel(self, line: LineRecord, reason: str) -> None:
        self._tracker.cancel(line, reason)
