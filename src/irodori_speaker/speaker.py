"""The Speaker: an asyncio runtime that turns lines of text into gapless, interruptible speech.

    async with Speaker(output="null") as s:
        await s.say("こんにちは！")

Threading model: all Speaker state lives on the event loop that opened it;
every event and callback is delivered there. Model work (load, prewarm,
synthesis) runs in one worker thread per Speaker, always inside the
process-wide model lock (backends/lock.py), and stops between sampler steps
or decode chunks when its line's CancelToken is set. Outputs consume
ready-made blocks on their own threads (see outputs.py). See docs/speaker.md.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import difflib
import enum
import inspect
import logging
import math
import os
import re
import time
import warnings
from collections import deque
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from . import lifetime
from .backends.lock import hold_model_lock
from .cancel import CancelToken, check
from .errors import BackendError, Cancelled, InputError
from .events import (
    Closed,
    Event,
    EventBus,
    EventStream,
    KindSpec,
    Metrics,
    OutputRecovered,
    Queued,
    Series,
    Skipped,
    SynthesisFailed,
    SynthesisFinished,
    SynthesisStarted,
    Underrun,
)
from .jitter import JitterBuffer, LineFeed, line_seconds_estimate
from .lines import UNSET, LineOptions, Priority, check_line_text
from .lipsync import Envelope
from .outputs import Output, OutputSpec, SoundDeviceOutput, make_output
from .playback import Chunk, Player, PlayItem, resample, total_seconds_estimate
from .timing import SpeechSpan, estimate_timing
from .types import SynthesisOptions, SynthesisRecord, SynthesizerLike, option_specs

log = logging.getLogger("irodori_speaker.speaker")

__all__ = ["LineOptions", "Priority", "Speaker", "Utterance", "UtteranceState"]


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


class Utterance:
    """A handle on one queued line. `await handle` waits until it is over.

    Awaiting returns the handle; it raises only if the line's synthesis failed
    (the exception the synthesizer raised). Cancelled, expired, skipped and
    interrupted lines end normally: look at `state`.
    """

    def __init__(
        self,
        speaker: Speaker,
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


class _Feeder:
    """Text chunks (LLM tokens) -> speakable segments -> enqueued lines, with a stall flush."""

    def __init__(self, speaker: Speaker, line: LineOptions) -> None:
        self.speaker = speaker
        self.line = line
        self.segmenter = speaker._new_segmenter()
        self.handles: list[Utterance] = []
        self._timer: asyncio.TimerHandle | None = None

    def feed(self, chunk: str | None, line: LineOptions | None = None) -> list[Utterance]:
        if line is not None:  # options given mid-turn apply from here on; none given: keep the turn's
            self.line = line
        if chunk is None:  # OpenAI-style streams send None deltas: nothing to say
            return []
        if not isinstance(chunk, str):
            raise InputError(f"feed() takes text, got {type(chunk).__name__}")
        out = self._enqueue(self.segmenter.feed(chunk))
        self._arm()
        return out

    def end(self) -> list[Utterance]:
        self._disarm()
        return self._enqueue(self.segmenter.flush())

    def close(self) -> None:
        self._disarm()

    def _enqueue(self, segments: Iterable[str]) -> list[Utterance]:
        out = []
        for seg in segments:
            if seg and seg.strip():
                out.append(self.speaker._enqueue_line(seg, self.line))
                if self.line.interrupt:  # only the turn's first segment cuts in
                    self.line = dataclasses.replace(self.line, interrupt=False)
        self.handles.extend(out)
        return out

    def _arm(self) -> None:
        self._disarm()
        if self.segmenter.pending.strip() and self.speaker.stall_flush_s is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.speaker.stall_flush_s, self._on_stall)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_stall(self) -> None:
        self._timer = None
        if self.speaker._closing:
            return
        try:
            try:  # StreamSegmenter: final=False keeps the turn's state (first-segment rule, open code)
                segments = self.segmenter.flush(final=False)
            except TypeError:
                segments = self.segmenter.flush()
            self._enqueue(segments)
        except Exception:
            log.exception("stall flush failed")


class Speaker:
    """Japanese TTS for live streams: prefetching, gapless, interruptible, with lanes and events.

    Give it a loaded `synthesizer`, or the loading options of
    `irodori_speaker.synthesizer.load_synthesizer` (model=, codec=, tokenizer=, backend=,
    device=, dtype=, tiny_random=, cache_dir=, voice_cache_dir=, user_dict=, and preset= for
    preset fields, e.g. `preset={"int4": True}`): the model loads on enter. `device` is the
    torch device the model runs on; where the sound goes is `output`: one output or a list,
    an `Output` (`SoundDeviceOutput`, `FileOutput`, `NullOutput`), a sound device name, a file
    path, "null", or None for the system's default device. Any `SynthesisOptions` field by
    name (`Speaker(speed=1.2, volume=-6)`) sets it for every line, as in `options=`; a line's
    own value (`say(text, speed=1.0)`) wins.

    `tags` maps emotion / stage tags to what a line carrying one gets: ``{"happy": {"voice":
    "happy.wav"}, "sad": {"caption": "悲しげな声", "options": {"cfg_scale_speaker": 3}},
    "笑": {"text": "ふふっ"}}`` (`irodori_speaker.text.tags.TagMap`); tags not mapped are
    stripped (option ``tags="keep"`` reads them).
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
        model: str | os.PathLike[str] | None = None,
        codec: str | os.PathLike[str] | None = None,
        tokenizer: Any = None,
        backend: str = "auto",
        device: str | None = None,
        dtype: str | None = None,
        tiny_random: bool | str = False,
        cache_dir: str | os.PathLike[str] | None = None,
        voice_cache_dir: str | os.PathLike[str] | bool | None = None,
        user_dict: Any = None,
        preset: Any = None,
        tags: Any = None,
        timing: bool = True,
        **deprecated_preset_fields: Any,  # also SynthesisOptions fields by name: speed=1.2
    ) -> None:
        load = {
            "model": model,
            "codec": codec,
            "tokenizer": tokenizer,
            "backend": None if backend == "auto" else backend,
            "device": device,
            "dtype": dtype,
            "tiny_random": tiny_random or None,
            "cache_dir": cache_dir,
            "voice_cache_dir": voice_cache_dir,
            "user_dict": user_dict,
            "preset": preset,
        }
        load = {k: v for k, v in load.items() if v is not None}
        line_options = {
            k: v for k, v in deprecated_preset_fields.items() if k in option_specs(SynthesisOptions)
        }
        deprecated_preset_fields = {
            k: v for k, v in deprecated_preset_fields.items() if k not in line_options
        }
        if deprecated_preset_fields:
            load["preset"] = _merge_deprecated_preset_fields(preset, deprecated_preset_fields)
        if synthesizer is not None and load:
            raise InputError(
                f"got a synthesizer and loading options {sorted(load)}", hint="pass one or the other"
            )
        if device is not None:
            _check_torch_device(device)
        for name, v in (
            ("pause_s", pause_s),
            ("lookahead_s", lookahead_s),
            ("schedule_ahead_s", schedule_ahead_s),
        ):
            if not (isinstance(v, (int, float)) and v >= 0 and math.isfinite(v)):
                raise InputError(f"{name} must be a finite number >= 0, got {v!r}")
        if not isinstance(lookahead_lines, int) or lookahead_lines < 0:
            raise InputError(f"lookahead_lines must be an int >= 0, got {lookahead_lines!r}")
        if max_queue is not None and (not isinstance(max_queue, int) or max_queue < 1):
            raise InputError(f"max_queue must be an int >= 1 or None, got {max_queue!r}")
        if stall_flush_s is not None and not stall_flush_s > 0:
            raise InputError(f"stall_flush_s must be > 0 or None, got {stall_flush_s!r}")
        if not lipsync_hz > 0:
            raise InputError(f"lipsync_hz must be > 0, got {lipsync_hz!r}")
        specs: list[Any] = list(output) if isinstance(output, (list, tuple)) else [output]
        if not specs:
            raise InputError("output= is an empty list", hint="use output='null' to play nowhere")
        self._output_specs = specs
        self.synthesizer = synthesizer
        self._load_options = load
        self.voice = voice
        self._voices = list(voices)
        self.options = None if options is None else SynthesisOptions.coerce(options)
        if line_options:  # Speaker(speed=1.2, seed=3): options of every line, by name
            self.options = (self.options or SynthesisOptions()).replace(**line_options)
        from .text.tags import TagMap

        # tag name -> voice / caption / options / words for lines that carry the tag (text/tags.py)
        self.tags = TagMap.coerce(tags)
        self.timing = bool(timing)  # word / viseme / line_timing events (timing.py; needs pyopenjtalk)
        self.streaming = streaming
        self.prewarm = prewarm
        self.pause_s = float(pause_s)
        self.lookahead_lines = lookahead_lines
        self.lookahead_s = float(lookahead_s)
        self._ttl = self._parse_ttl(ttl)
        self.max_queue = max_queue
        self.stall_flush_s = stall_flush_s
        self._segmenter_factory = segmenter
        self.lipsync_lead_s = lipsync_lead_s
        self.lipsync_hz = lipsync_hz
        self.schedule_ahead_s = float(schedule_ahead_s)
        self.drain_on_exit = drain_on_exit
        from .cache import STORE_POLICIES, PhraseCache

        if cache_store not in STORE_POLICIES:
            raise InputError(f"cache_store must be one of {STORE_POLICIES}, got {cache_store!r}")
        self._own_cache = cache is not None and not isinstance(cache, PhraseCache)
        self.cache: PhraseCache | None = PhraseCache(cache) if self._own_cache else cache
        self.cache_store = cache_store
        self._cache_executor: concurrent.futures.ThreadPoolExecutor | None = None
        self.tick_s = 0.02
        self.sample_rate = 0
        self.outputs: list[Output] = []
        self.prewarm_seconds: dict[int, float] = {}

        self._bus = EventBus()
        self._lanes: dict[Priority, deque[Utterance]] = {p: deque() for p in Priority}
        self._by_uid: dict[int, Utterance] = {}
        self._next_id = 1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._player: Player | None = None
        self._task: asyncio.Task[None] | None = None
        self._synth_task: asyncio.Task[None] | None = None
        self._synth_utt: Utterance | None = None  # the line _synth_task renders
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = False
        self._closing = False
        self._stop_loop = False  # ends the scheduler loop (a flag: a cancel can be swallowed, see _release)
        self._closed = asyncio.Event()  # set when a close has finished; every aclose() awaits it
        self._feeder: _Feeder | None = None
        self._open_token = CancelToken()
        self._series = {k: Series() for k in ("queue_wait", "first_chunk", "ttfa", "rtf", "gap")}
        self._jitter = JitterBuffer()
        self._counts = dict.fromkeys(("queued", "played", "interrupted", "skipped", "failed", "underruns"), 0)
        self._last_finished: Utterance | None = None
        self._created_at = lifetime.creation_site()  # for the unclosed-Speaker warning

    @staticmethod
    def _parse_ttl(ttl: Any) -> dict[Priority, float | None]:
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
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="irodori-speaker")
        if self.cache is not None:  # hits are served here, never behind the model worker
            self._cache_executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="irodori-cache"
            )
        opened: list[Output] = []
        try:
            for spec in self._output_specs:
                o = make_output(spec)
                await loop.run_in_executor(self._executor, o.open)
                opened.append(o)
            if self.synthesizer is None:
                self.synthesizer = await loop.run_in_executor(self._executor, self._load)
            self.sample_rate = int(self.synthesizer.sample_rate)
            if self.timing:  # the reading dictionary loads now, not (holding the GIL) mid-line
                await loop.run_in_executor(self._executor, estimate_timing, "あ", 1.0)
            if self.prewarm:
                for voice in self._prewarm_voices():
                    secs = await loop.run_in_executor(self._executor, self._prewarm_blocking, voice)
                    self.prewarm_seconds[id(voice)] = secs
        except BaseException:
            self._open_token.cancel("open aborted")
            for o in opened:
                with contextlib.suppress(Exception):
                    await loop.run_in_executor(self._executor, o.close)
            self._executor.shutdown(wait=False)
            self._executor = None
            if self._cache_executor is not None:
                self._cache_executor.shutdown(wait=False)
                self._cache_executor = None
            raise
        self.outputs = opened
        self._player = Player(
            opened,
            source_rate=self.sample_rate,
            pause_s=self.pause_s,
            emit=self._emit,
            on_started=self._on_play_started,
            on_finished=self._on_play_finished,
            lipsync_lead_s=self.lipsync_lead_s,
            clock=time.monotonic,
        )
        self._open = True
        lifetime.track(self)
        self._task = loop.create_task(self._run(), name="irodori-speaker")

    def _load(self) -> SynthesizerLike:
        try:
            from .synthesizer import load_synthesizer  # type: ignore[attr-defined]
        except ImportError as e:
            raise InputError(
                "no synthesizer given and irodori_speaker.synthesizer.load_synthesizer is unavailable",
                hint="pass Speaker(synthesizer=...)",
            ) from e
        with hold_model_lock(self._open_token):
            return load_synthesizer(**self._load_options)

    def _prewarm_voices(self) -> list[Any]:
        out: list[Any] = []
        for v in [self.voice, *self._voices]:
            if not any(_same(v, u) for u in out):
                out.append(v)
        return out

    def _prewarm_blocking(self, voice: Any) -> float:
        assert self.synthesizer is not None
        with hold_model_lock(self._open_token):
            return float(self.synthesizer.prewarm(voice))

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
        if drain:
            try:
                await self.drain()
            except BaseException:
                await self._shutdown()
                raise
        await self._shutdown()

    async def _shutdown(self) -> None:
        self._closing = True
        if self._feeder is not None:
            self._feeder.close()
        for utt in list(self._by_uid.values()):
            self._cancel(utt, "closed")
        # the rest runs to the end even if the closing task is cancelled meanwhile
        await asyncio.shield(self._release())

    async def _release(self) -> None:
        try:
            await self._release_resources()
        finally:
            self._closed.set()  # whatever happened, no concurrent aclose() waits forever

    async def _release_resources(self) -> None:
        player = self._player
        assert player is not None and self._loop is not None
        # let the fades be heard: bounded by the output latency, never forever
        limit = time.monotonic() + 0.2 + max((o.latency for o in self.outputs), default=0.0)
        while player.items and time.monotonic() < limit:
            self._step()
            await asyncio.sleep(self.tick_s)
        if self._task is not None:
            # Stop the loop with a flag and a wake, not only a cancel: on Python 3.10 / 3.11
            # `asyncio.wait_for` returns the inner result when a cancel lands just after the
            # inner wait completed, swallowing the cancel, and the loop then waited forever.
            self._stop_loop = True
            self._wake.set()
            done, _ = await asyncio.wait({self._task}, timeout=1.0)
            if not done:
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=1.0)
        synth_task = self._synth_task
        stuck = False
        if synth_task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(synth_task), 10.0)
            except asyncio.TimeoutError:
                stuck = True
                log.warning("synthesis did not stop within 10 s of cancellation; leaving its thread")
            except Exception:
                pass  # its failure was reported on its line
        for o in self.outputs:
            try:
                if stuck:
                    o.close()
                else:
                    await self._loop.run_in_executor(self._executor, o.close)
            except Exception:
                log.exception("closing output %s failed", o.name)
        for utt in list(self._by_uid.values()):  # whatever is left ends now
            self._finish(utt, UtteranceState.CANCELLED if utt._item is None else UtteranceState.INTERRUPTED)
        if self._executor is not None:
            self._executor.shutdown(wait=not stuck)
        if self._cache_executor is not None:
            self._cache_executor.shutdown(wait=True)
            self._cache_executor = None
        if self._own_cache and self.cache is not None:
            self.cache.close()
        self._open = False
        lifetime.untrack(self)
        self._emit(Closed(time.monotonic()))
        self._bus.close()

    def _abandon(self, at_exit: bool = False) -> None:
        """Release an open Speaker that was never closed, without its event loop (see lifetime.py).

        Warns like an unclosed file, cancels every line (the worker stops within one step or
        chunk, so the exit's join of it is immediate), closes the outputs (PortAudio streams)
        and shuts the executors down. At interpreter exit a Speaker whose loop still runs (in
        another thread) is left to it.
        """
        if not self._open or self._closing:
            return
        loop = self._loop
        if at_exit and loop is not None and loop.is_running() and not loop.is_closed():
            return
        self._closing = True
        self._open = False
        lifetime.untrack(self)
        warnings.warn(
            f"unclosed Speaker created at {self._created_at}: use `async with Speaker(...)` or "
            "`await speaker.aclose()`",
            ResourceWarning,
            stacklevel=2,
            source=self,
        )
        self._open_token.cancel("the Speaker was never closed")
        for utt in list(self._by_uid.values()):
            utt._token.cancel("the Speaker was never closed")
        for o in self.outputs:
            with contextlib.suppress(Exception):
                o.close()
        for ex in (self._executor, self._cache_executor):
            if ex is not None:
                ex.shutdown(wait=False, cancel_futures=True)
        if self._own_cache and self.cache is not None:
            with contextlib.suppress(Exception):
                self.cache.close()
        with contextlib.suppress(Exception):
            self._bus.close()

    def __del__(self) -> None:
        if getattr(self, "_open", False) and not getattr(self, "_closing", True):
            self._abandon()

    async def drain(self) -> None:
        """Wait until every queued line has played (or ended otherwise)."""
        self._require_open()
        while True:
            await self._idle.wait()
            if not self._busy():
                return
            self._idle.clear()

    # -- adding lines ------------------------------------------------------------------------------

    def enqueue(self, text: str, **line: Any) -> Utterance:
        """Queue a line and return its handle at once; synthesis starts as soon as there is room.

        Line options (`irodori_speaker.lines.LineOptions`; the same for `say`, `feed`,
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

    def _enqueue_line(self, text: str, line: LineOptions) -> Utterance:
        self._require_open()
        check_line_text(text)
        lane = line.priority
        ttl = self._ttl[lane] if line.ttl is UNSET else line.ttl
        options = line.synthesis_options(self.options)
        voice = self.voice if line.voice is UNSET else line.voice
        if self.tags:  # a mapped emotion tag picks the line's voice / caption / options
            text, voice, options = self.tags.resolve(text, voice, options)
        if self.synthesizer is not None:  # bounds that depend on the model, before any work
            self.synthesizer.resolve_options(options)
        cache = line.cache
        now = time.monotonic()
        uid = self._next_id
        self._next_id += 1
        utt = Utterance(
            self,
            uid,
            text,
            lane,
            voice,
            options,
            None if ttl is None else now + ttl,
            now,
            cache,
        )
        self._counts["queued"] += 1
        if not text.strip():
            self._emit(Skipped(now, uid, text, "empty"))
            utt.state = UtteranceState.SKIPPED
            self._counts["skipped"] += 1
            asyncio.get_running_loop().call_soon(utt._done.set)
            return utt
        position = sum(len(self._lanes[p]) for p in Priority if p <= lane) + len(self._open_player.items)
        self._lanes[lane].append(utt)
        self._by_uid[uid] = utt
        self._idle.clear()
        self._emit(Queued(now, uid, text, lane.name.lower(), position))
        if self.cache is not None and cache is not False:
            self._start_cache_lookup(utt)
        if self.max_queue is not None:
            self._enforce_max_queue(utt)
        if line.interrupt:
            self.skip()
        self._wake.set()
        return utt

    def enqueue_threadsafe(self, text: str, **line: Any) -> concurrent.futures.Future[Utterance]:
        """`enqueue()` from another thread (a chat reader, a GUI): a future of the handle.

        A misspelt line option raises here, in the calling thread."""
        if self._loop is None:
            raise InputError("the Speaker is not open", hint="use `async with Speaker(...) as s:`")
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
            self._feeder = _Feeder(self, parsed)
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
        feeder = _Feeder(self, LineOptions.parse(line, "say_stream"))
        try:
            if isinstance(source, AsyncIterable):
                async for chunk in source:
                    feeder.feed(chunk)
            else:
                for chunk in source:
                    feeder.feed(chunk)
                    await asyncio.sleep(0)
            feeder.end()
            error: BaseException | None = None
            for h in list(feeder.handles):
                await h._done.wait()
                if h.error is not None and error is None:
                    error = h.error
            if error is not None:
                raise error
            return feeder.handles
        except asyncio.CancelledError:
            for h in feeder.handles:
                h.cancel()
            raise
        finally:
            feeder.close()

    # -- control -----------------------------------------------------------------------------------

    def skip(self) -> Utterance | None:
        """Fade out the line now playing (~fade_s + output latency); the next one follows."""
        self._require_open()
        player = self._open_player
        for item in list(player.items):
            if item.outcome is None and not item.stop_requested:
                utt = self._by_uid.get(item.uid)
                if utt is not None:
                    self._cancel(utt, "skipped")
                return utt
        return None

    def clear(
        self, priority: Priority | str | int | Iterable[Priority | str | int] | None = None
    ) -> list[Utterance]:
        """Drop every line that has not started playing (in the given lanes); their synthesis stops."""
        self._require_open()
        lanes = self._lanes_of(priority)
        dropped: list[Utterance] = []
        for item in list(self._open_player.items):
            utt = self._by_uid.get(item.uid)
            if utt is not None and utt.state != UtteranceState.PLAYING and utt.priority in lanes:
                dropped.append(utt)
        for lane in lanes:
            dropped.extend(self._lanes[lane])
        for utt in dropped:
            self._cancel(utt, "cancelled")
        return dropped

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
        self._require_open()
        self._open_player.pause()
        self._wake.set()

    def resume(self) -> None:
        self._require_open()
        self._open_player.resume()
        self._wake.set()

    @property
    def paused(self) -> bool:
        return self._player is not None and self._player.paused

    async def reopen_outputs(self, rescan: bool = True) -> list[Output]:
        """Reopen failed outputs (by their device name); raises AudioError if one is still gone."""
        self._require_open()
        player = self._open_player
        assert self._loop is not None
        reopened = []
        for o in self.outputs:
            if id(o) not in player.failed:
                continue
            await self._loop.run_in_executor(self._executor, o.close)
            opener = (lambda o=o: o.open(rescan=rescan)) if isinstance(o, SoundDeviceOutput) else o.open
            await self._loop.run_in_executor(self._executor, opener)
            player.reset_output(o)
            reopened.append(o)
            self._emit(OutputRecovered(time.monotonic(), o.name))
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
        items = (
            [self._by_uid[i.uid] for i in self._player.items if i.uid in self._by_uid] if self._player else []
        )
        waiting = [u for u in items if u.state != UtteranceState.PLAYING]
        return waiting + [u for p in Priority for u in self._lanes[p]]

    @property
    def current(self) -> Utterance | None:
        """The line being heard now."""
        if self._player is None:
            return None
        for item in self._player.items:
            utt = self._by_uid.get(item.uid)
            if utt is not None and utt.state == UtteranceState.PLAYING:
                return utt
        return None

    def metrics(self) -> Metrics:
        c, s = self._counts, self._series
        return Metrics(
            lines_queued=c["queued"],
            lines_played=c["played"],
            lines_interrupted=c["interrupted"],
            lines_skipped=c["skipped"],
            lines_failed=c["failed"],
            underruns=c["underruns"],
            queue_wait=s["queue_wait"].summary(),
            first_chunk=s["first_chunk"].summary(),
            time_to_first_audio=s["ttfa"].summary(),
            rtf=s["rtf"].summary(),
            gap=s["gap"].summary(),
        )

    # -- internals: scheduling ---------------------------------------------------------------------

    @property
    def _open_player(self) -> Player:
        """The player of an open Speaker (callers have checked `_require_open`)."""
        if self._player is None:
            raise InputError("the Speaker is not open", hint="use `async with Speaker(...) as s:`")
        return self._player

    def _require_open(self) -> None:
        if not self._open or self._closing:
            raise InputError("the Speaker is not open", hint="use `async with Speaker(...) as s:`")
        self._require_loop()

    def _require_loop(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is not self._loop:
            raise InputError(
                "Speaker methods must be called on the event loop that opened it",
                hint="from another thread use speaker.enqueue_threadsafe(text)",
            )

    def _lanes_of(self, priority: Any) -> list[Priority]:
        if priority is None:
            return list(Priority)
        if isinstance(priority, (str, int, Priority)):
            return [Priority.parse(priority)]
        return [Priority.parse(p) for p in priority]

    def _new_segmenter(self) -> Any:
        if self._segmenter_factory is not None:
            return self._segmenter_factory()
        from .text.segment import StreamSegmenter

        return StreamSegmenter(min_chars=10, first_min_chars=5)

    def _emit(self, event: Event) -> None:
        if isinstance(event, Underrun):
            self._counts["underruns"] += 1
        self._bus.emit(event)

    def _busy(self) -> bool:
        return bool(
            any(self._lanes.values()) or (self._player is not None and self._player.items) or self._synth_task
        )

    def _play_order(self) -> Iterable[Utterance]:
        for p in Priority:
            yield from self._lanes[p]

    async def _run(self) -> None:
        try:
            await self._schedule()
        except asyncio.CancelledError:
            if not self._closing:  # the loop ends without aclose() (asyncio.run returning)
                self._abandon()
            raise

    async def _schedule(self) -> None:
        while not self._stop_loop:
            if self._player is not None and self._player.busy:
                timeout: float | None = self.tick_s
            elif any(self._lanes.values()):
                timeout = 0.1  # TTLs
            else:
                timeout = None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
            self._wake.clear()
            if self._stop_loop:
                return
            try:
                self._step()
            except Exception:
                log.exception("Speaker scheduler step failed")

    def _step(self) -> None:
        player = self._player
        assert player is not None
        now = time.monotonic()
        for utt in [u for u in self._play_order() if u.deadline is not None and now > u.deadline]:
            self._cancel(utt, "expired")
        for item in reversed(player.poll()):  # every output failed: lines not yet heard go back in front
            back = self._by_uid.get(item.uid)
            if back is not None and not back.state.terminal:
                utt = back
                utt._item = None
                utt.state = UtteranceState.READY if utt._synth_done else UtteranceState.SYNTHESIZING
                self._lanes[utt.priority].appendleft(utt)
        if not self._closing:
            self._push_lines(now)
            self._dispatch_synthesis()
        if not self._busy():
            self._idle.set()

    def _push_lines(self, now: float) -> None:
        player = self._player
        assert player is not None
        while player.can_push(now, self.schedule_ahead_s):
            utt = next(iter(self._play_order()), None)
            if utt is None or utt._preempted or not (utt._chunks or utt._synth_done):
                return
            if not utt._synth_done and not self._jitter.ready(
                utt._feed, line_seconds_estimate(utt._live_record, utt._feed.received_s)
            ):
                return  # streamed slower than real time: hold enough that it never stops inside
            self._lanes[utt.priority].remove(utt)
            env = Envelope(self.sample_rate, hz=self.lipsync_hz)
            item = player.start(utt.id, utt.text, env)
            item.timing = utt.timing
            utt._item = item
            for chunk in utt._chunks:
                player.add(item, chunk)
            if utt._synth_done:
                player.end(item)

    def _dispatch_synthesis(self) -> None:
        if self._synth_task is not None:
            self._preempt_prefetch()
            return
        player = self._player
        assert player is not None and self._loop is not None
        waiting = [i for i in player.items if i.started_at is None]
        ahead = len(waiting)
        ahead_s = sum(i.envelope.samples for i in waiting) / max(1, self.sample_rate)
        candidate = None
        for utt in self._play_order():
            if utt.state == UtteranceState.QUEUED:
                if utt._cache_pending:  # a cache hit may make synthesis unnecessary
                    continue
                candidate = utt
                break
            ahead += 1
            ahead_s += sum(len(c.audio) for c in utt._chunks) / max(1, self.sample_rate)
        if candidate is None:
            return
        idle = not player.items and ahead == 0  # nothing to hear until it is done: always go
        full = self.lookahead_lines == 0 or ahead >= self.lookahead_lines or ahead_s >= self.lookahead_s
        if full and not idle:
            return
        candidate.state = UtteranceState.SYNTHESIZING
        self._synth_utt = candidate
        self._synth_task = self._loop.create_task(self._synthesize(candidate))

    def _preempt_prefetch(self) -> None:
        """A line of a higher lane is waiting while a lower one is synthesised ahead (nothing of it
        scheduled to play yet): stop that synthesis; `_synthesize` puts its line back in the queue,
        in its place, and the higher line is synthesised next."""
        utt = self._synth_utt
        if utt is None or utt._item is not None or utt._preempted or utt.state != UtteranceState.SYNTHESIZING:
            return
        for other in self._play_order():
            if other.priority >= utt.priority:
                return
            if other.state == UtteranceState.QUEUED and not other._cache_pending:
                utt._preempted = True
                utt._token.cancel("pre-empted by a higher lane")
                return

    def _enforce_max_queue(self, newest: Utterance) -> None:
        assert self.max_queue is not None
        while sum(len(q) for q in self._lanes.values()) > self.max_queue:
            victim = None
            for p in reversed(Priority):  # the oldest waiting line of the lowest lane goes first
                lane = [u for u in self._lanes[p] if u.state == UtteranceState.QUEUED]
                if lane:
                    victim = lane[0]
                    break
            if victim is None:
                victim = newest
            self._cancel(victim, "overflow")
            if victim is newest:
                return

    # -- internals: synthesis (worker thread + loop callbacks) ------------------------------------

    async def _synthesize(self, utt: Utterance) -> None:
        assert self._loop is not None and self._player is not None
        rates = sorted({o.sample_rate for o in self._player.healthy} - {self.sample_rate})
        try:
            await self._loop.run_in_executor(self._executor, self._synth_blocking, self._loop, utt, rates)
        except Cancelled:
            if not utt._token.cancelled:
                self._on_synth_failed(utt, Cancelled("the synthesizer stopped on its own"))
        except Exception as e:
            self._on_synth_failed(utt, e)
        finally:
            if utt._preempted:
                self._requeue_preempted(utt)
            self._synth_task = None
            self._synth_utt = None
            with contextlib.suppress(RuntimeError):  # an abandoned Speaker's loop may be closed
                self._wake.set()

    def _requeue_preempted(self, utt: Utterance) -> None:
        """Back to QUEUED with a fresh token, in its place in its lane (it never left it); what the
        stopped run produced was dropped (`_on_chunk`), so it is rendered again in full."""
        utt._preempted = False
        if utt.state.terminal:
            return
        utt._token = CancelToken()
        utt._chunks.clear()
        utt._feed = LineFeed()
        utt._synth_done = False
        utt.state = UtteranceState.QUEUED
        for k in ("synthesis_started", "first_chunk"):
            utt.timings.pop(k, None)

    def _synth_blocking(self, loop: asyncio.AbstractEventLoop, utt: Utterance, rates: list[int]) -> None:
        synth = self.synthesizer
        assert synth is not None
        token = utt._token

        def post(fn: Callable[..., None], *args: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
                loop.call_soon_threadsafe(fn, utt, *args)

        src = self.sample_rate
        options = utt.options
        store = self._should_store(utt)
        if store:  # rendered with the cache seed (0 when unset), so the entry is found again
            from .cache import cache_options

            options = cache_options(options)
        parts: list[np.ndarray] = []
        x: np.ndarray | None = None  # a whole line's audio (streamed: None, the chunks are posted)
        span = SpeechSpan(src) if self.timing else None
        with hold_model_lock(token):
            t0 = time.monotonic()
            post(self._on_synth_started, t0)
            if self.streaming:
                import soxr

                streams = {r: soxr.ResampleStream(src, r, 1, dtype="float32") for r in rates}
                audio_stream = synth.stream(utt.text, utt.voice, options, cancel=token)
                utt._live_record = audio_stream.record  # read by the jitter buffer on the loop
                try:
                    for x in audio_stream:
                        check(token)
                        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
                        if store:
                            parts.append(x)
                        if span is not None:
                            span.add(x)
                        by_rate = {r: rs.resample_chunk(x) for r, rs in streams.items()}
                        post(self._on_chunk, Chunk(x, by_rate), time.monotonic())
                    if streams:
                        empty = np.zeros(0, dtype=np.float32)
                        tail = {r: rs.resample_chunk(empty, last=True) for r, rs in streams.items()}
                        post(self._on_chunk, Chunk(empty, tail), time.monotonic())
                finally:
                    audio_stream.close()
                record = audio_stream.record
                t1 = time.monotonic()
                x = None
            else:
                result = synth.synthesize(utt.text, utt.voice, options, cancel=token)
                t1 = time.monotonic()
                record = result.record
                x = np.ascontiguousarray(result.audio, dtype=np.float32).reshape(-1)
        if x is not None:  # resample outside the model lock
            post(self._on_chunk, Chunk(x, {r: resample(x, src, r) for r in rates}), t1)
            if span is not None:
                span.add(x)
        if span is not None and not token.cancelled:
            post(self._on_timing, _line_timing(record, span))
        cache = self.cache
        if store and cache is not None and not token.cancelled:  # a whole line only, outside the lock
            audio = x if x is not None else np.concatenate(parts) if parts else None
            if audio is not None and len(audio):
                try:
                    cache.store(synth, utt.text, utt.voice, options, audio, record)
                except Exception as e:  # a full disk must not cost the line
                    log.warning("phrase cache: could not store line #%d: %s", utt.id, e)
        # after the store: a line reported done (and so played) is in the cache, so the same
        # line asked for right after is a hit (it raced the store before; its audio is out already)
        post(self._on_synth_done, record, t0, t1)

    # -- internals: the phrase cache --------------------------------------------------------------

    def _should_store(self, utt: Utterance) -> bool:
        if self.cache is None or utt.cache is False:
            return False
        return self.cache_store == "all" or (self.cache_store == "marked" and utt.cache is True)

    def _start_cache_lookup(self, utt: Utterance) -> None:
        assert self._loop is not None and self._cache_executor is not None and self._player is not None
        rates = sorted({o.sample_rate for o in self._player.healthy} - {self.sample_rate})
        utt._cache_pending = True
        fut = self._loop.run_in_executor(self._cache_executor, self._cache_lookup, utt, rates)
        fut.add_done_callback(lambda f: self._on_cache_lookup(utt, f))

    def _cache_lookup(self, utt: Utterance, rates: list[int]) -> Any:
        """Worker (cache thread): the stored line and its audio at the output rates, or None."""
        t0 = time.monotonic()
        assert self.cache is not None  # lookups are started only with a cache
        try:
            line = self.cache.lookup(self.synthesizer, utt.text, utt.voice, utt.options)
        except Exception as e:  # a synthesizer without render_identity, an unreadable index
            log.warning("phrase cache lookup failed for line #%d: %s", utt.id, e)
            return None
        if line is None:
            return None
        x = np.ascontiguousarray(line.audio, dtype=np.float32)
        timing = None
        if self.timing:
            span = SpeechSpan(self.sample_rate)
            span.add(x)
            timing = _line_timing(line.record, span)
        chunk = Chunk(x, {r: resample(x, self.sample_rate, r) for r in rates})
        return line, chunk, t0, time.monotonic(), timing

    def _on_cache_lookup(self, utt: Utterance, fut: Any) -> None:
        utt._cache_pending = False
        self._wake.set()
        if fut.cancelled() or fut.exception() is not None or fut.result() is None:
            return
        if utt.state != UtteranceState.QUEUED:  # ended meanwhile
            return
        line, chunk, t0, t1, timing = fut.result()
        utt.state = UtteranceState.SYNTHESIZING  # the same events as a fresh line, no model work
        self._on_synth_started(utt, t0)
        self._on_chunk(utt, chunk, t1)
        self._on_timing(utt, timing)
        self._on_synth_done(utt, line.record, t0, t1)

    def _on_synth_started(self, utt: Utterance, t0: float) -> None:
        if utt.state.terminal:
            return
        utt.timings["synthesis_started"] = t0
        utt._feed.started_t = t0
        wait = t0 - utt.timings["enqueued"]
        self._series["queue_wait"].add(wait)
        self._emit(SynthesisStarted(t0, utt.id, utt.text, wait))

    def _on_chunk(self, utt: Utterance, chunk: Chunk, t: float) -> None:
        if utt.state.terminal or utt._preempted:  # a pre-empted run's audio is rendered again
            return
        if "first_chunk" not in utt.timings:
            utt.timings["first_chunk"] = t
            self._series["first_chunk"].add(t - utt.timings.get("synthesis_started", t))
        utt._chunks.append(chunk)
        utt._feed.add(t, len(chunk.audio) / max(1, self.sample_rate))
        if utt._item is not None and self._player is not None:
            self._player.add(utt._item, chunk)
        self._wake.set()

    def _on_timing(self, utt: Utterance, timing: Any) -> None:
        if utt.state.terminal or timing is None:
            return
        utt.timing = timing
        if utt._item is not None:
            utt._item.timing = timing

    def _on_synth_done(self, utt: Utterance, record: SynthesisRecord, t0: float, t1: float) -> None:
        if utt.state.terminal or utt._preempted:
            return
        utt._synth_done = True
        utt.record = record
        if self.streaming:
            self._jitter.finished(utt._feed)
        utt.timings["synthesis_finished"] = t1
        if utt.state == UtteranceState.SYNTHESIZING:
            utt.state = UtteranceState.READY
        audio_s = sum(len(c.audio) for c in utt._chunks) / max(1, self.sample_rate)
        compute = t1 - t0
        rtf = compute / audio_s if audio_s > 0 else math.inf
        if audio_s > 0:
            self._series["rtf"].add(rtf)
        first = utt.timings.get("first_chunk", t1) - t0
        self._emit(SynthesisFinished(t1, utt.id, utt.text, compute, audio_s, rtf, first, record))
        if utt._item is not None and self._player is not None:
            self._player.end(utt._item)
        self._wake.set()

    def _on_synth_failed(self, utt: Utterance, error: BaseException) -> None:
        if utt.state.terminal:
            return
        log.warning("synthesis failed for line #%d: %r", utt.id, error)
        utt.error = error
        self._emit(SynthesisFailed(time.monotonic(), utt.id, utt.text, error))
        if utt._item is not None and self._player is not None:
            self._player.stop(utt._item)  # a streaming line that broke mid-way fades out; FAILED follows
        else:
            self._remove_from_lanes(utt)
            self._finish(utt, UtteranceState.FAILED)

    # -- internals: ending lines -------------------------------------------------------------------

    def _remove_from_lanes(self, utt: Utterance) -> None:
        with contextlib.suppress(ValueError):
            self._lanes[utt.priority].remove(utt)

    def _cancel(self, utt: Utterance, reason: str) -> None:
        if utt.state.terminal:
            return
        utt._token.cancel(reason)
        utt._reason = reason
        if utt._item is not None and self._player is not None:
            self._player.stop(utt._item)  # completion arrives through _on_play_finished
            return
        self._remove_from_lanes(utt)
        state = UtteranceState.EXPIRED if reason == "expired" else UtteranceState.CANCELLED
        self._emit(Skipped(time.monotonic(), utt.id, utt.text, reason))
        self._finish(utt, state)
        self._wake.set()

    def _finish(self, utt: Utterance, state: UtteranceState) -> None:
        if utt.state.terminal:
            return
        utt.state = state
        key = {
            UtteranceState.PLAYED: "played",
            UtteranceState.INTERRUPTED: "interrupted",
            UtteranceState.FAILED: "failed",
        }.get(state, "skipped")
        self._counts[key] += 1
        self._by_uid.pop(utt.id, None)
        # after this step's event callbacks (also scheduled with call_soon): an awaiting
        # caller sees every event of the line delivered
        asyncio.get_running_loop().call_soon(utt._done.set)
        self._wake.set()

    def _heard(self, item: PlayItem) -> tuple[float, str]:
        utt = self._by_uid.get(item.uid)
        if utt is None:
            return (0.0, "")
        received = sum(len(c.audio) for c in utt._chunks)
        total = total_seconds_estimate(utt.record, received, self.sample_rate)
        fraction = min(1.0, item.played_s / total) if total and total > 0 else 0.0
        norm = utt.record.text if utt.record is not None and utt.record.text else utt.text
        return (fraction, norm[: round(fraction * len(norm))])

    def _on_play_started(self, item: PlayItem) -> None:
        utt = self._by_uid.get(item.uid)
        if utt is None or item.started_at is None:
            return
        utt.state = UtteranceState.PLAYING
        utt.timings["playback_started"] = item.started_at
        item.latency = item.started_at - utt.timings["enqueued"]
        self._series["ttfa"].add(item.latency)
        prev = self._last_finished
        if (
            prev is not None
            and "playback_finished" in prev.timings
            and utt.timings["enqueued"] < prev.timings["playback_finished"]
        ):
            self._series["gap"].add(
                max(0.0, item.started_at - prev.timings["playback_finished"] - self.pause_s)
            )

    def _on_play_finished(self, item: PlayItem) -> None:
        utt = self._by_uid.get(item.uid)
        if utt is None:
            return
        utt._item = None
        t = item.finished_at if item.finished_at is not None else time.monotonic()
        if item.outcome == "played":
            utt.played_fraction = 1.0
            utt.heard_text = utt.record.text if utt.record is not None and utt.record.text else utt.text
            utt.timings["playback_finished"] = t
            self._last_finished = utt
            self._finish(utt, UtteranceState.FAILED if utt.error is not None else UtteranceState.PLAYED)
        elif item.outcome == "interrupted":
            utt.played_fraction, utt.heard_text = self._heard(item)
            item.played_fraction, item.heard_text = utt.played_fraction, utt.heard_text
            utt.timings["playback_finished"] = t
            self._last_finished = utt
            utt._token.cancel("interrupted")
            self._finish(utt, UtteranceState.FAILED if utt.error is not None else UtteranceState.INTERRUPTED)
        else:  # dropped before a sample was heard
            utt._token.cancel(utt._reason)
            if utt.error is not None:
                self._finish(utt, UtteranceState.FAILED)
                return
            self._emit(Skipped(t, utt.id, utt.text, utt._reason))
            state = UtteranceState.EXPIRED if utt._reason == "expired" else UtteranceState.CANCELLED
            self._finish(utt, state)


def _line_timing(record: SynthesisRecord | None, span: SpeechSpan) -> Any:
    """The line's estimated word/mora timing (worker thread), None when it cannot be had."""
    if record is None or not record.text:
        return None
    try:
        return estimate_timing(record.text, span.samples / span.sample_rate, speech=span.span())
    except Exception as e:  # the timing is a nicety: it must never cost the line
        log.debug("no timing for %r: %s", record.text[:40], e)
        return None


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # arrays and the like: only identity counts
        return False


_TORCH_DEVICE = re.compile(r"(cpu|cuda|mps|xpu|meta)(:\d+)?")


def _check_torch_device(device: Any) -> None:
    """`device` looks like a torch device (whether it exists is checked when the model loads)."""
    if not (isinstance(device, str) and _TORCH_DEVICE.fullmatch(device)):
        raise BackendError(
            f"device={device!r} is not a torch device: it says where the model runs (cpu, cuda, cuda:1, mps)",
            hint=f"a sound card is chosen with output=, e.g. Speaker(output={device!r})",
        )


def _merge_deprecated_preset_fields(preset: Any, fields: dict[str, Any]) -> Any:
    """Speaker(int4=True) passed preset fields through; they now go in preset={...}."""
    import dataclasses as dc

    from .backends.presets import Preset

    known = [f.name for f in dc.fields(Preset)]
    for name in fields:
        if name not in known:
            own = [p for p in inspect.signature(Speaker.__init__).parameters if p != "self"]
            close = difflib.get_close_matches(name, [*own, *known, *option_specs(SynthesisOptions)], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"Speaker() got an unexpected keyword argument {name!r}{hint}")
    warnings.warn(
        f"Speaker({', '.join(f'{k}=...' for k in fields)}) is deprecated: pass preset fields as "
        f"preset={{{', '.join(repr(k) + ': ...' for k in fields)}}}",
        DeprecationWarning,
        stacklevel=3,
    )
    if preset is None:
        return dict(fields)
    if isinstance(preset, Mapping):
        return {**preset, **fields}
    return preset.with_overrides(**fields)
