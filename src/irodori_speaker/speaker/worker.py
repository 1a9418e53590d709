"""The line worker: synthesise one line (or serve it from the phrase cache) and report it.

Model work runs on one thread per Speaker; the synthesizer takes the process-wide model
lock itself, around each stage and decode chunk (engine/hardware/lock.py), so a line of another
Speaker, the server or prebuild can run between two chunks of this one, and a cancel is
seen within one. Phrase-cache lookups run on a second thread, so a hit never waits behind
the model. Every result goes to `LineReports` on the event loop: started, chunk, timing,
done or failed, then ended.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..audio.signal import StreamResampler, resample
from ..cache import CachedRender
from ..cancel import check
from ..errors import Cancelled
from ..lanes import line_lane
from ..options import SynthesisRecord, SynthesizerLike
from ..timing.estimate import SpeechSpan, estimate_timing
from .jitter import LATENT_HZ, ModelLoad, model_load
from .playback import Chunk
from .tasks import TaskScope
from .utterance import UtteranceState

if TYPE_CHECKING:
    from ..cache import CachedRender
    from .record import LineRecord

log = logging.getLogger("irodori_speaker.speaker")

__all__ = ["LineReports", "LineWorker"]


class LineReports(Protocol):
    """Where the worker reports a line (all on the event loop); `LineTracker` is the one."""

    def synth_started(self, line: LineRecord, t0: float) -> None: ...
    def chunk(self, line: LineRecord, chunk: Chunk, t: float) -> None: ...
    def timing(self, line: LineRecord, timing: Any) -> None: ...
    def synth_done(self, line: LineRecord, record: SynthesisRecord, t0: float, t1: float) -> None: ...
    def synth_failed(self, line: LineRecord, error: BaseException) -> None: ...
    def synth_ended(self, line: LineRecord) -> None: ...
    def wake(self) -> None: ...


class LineWorker:
    """One line at a time on the model thread; cache lookups beside it."""

    def __init__(
        self,
        reports: LineReports,
        scope: TaskScope,
        *,
        streaming: bool,
        timing: bool,
        cache: Any = None,
        cache_store: str = "marked",
    ) -> None:
        self.reports = reports
        self.scope = scope
        self.streaming = streaming
        self.timing = timing
        self.cache = cache
        self.cache_store = cache_store
        self.synthesizer: SynthesizerLike | None = None
        self.load: ModelLoad | None = None  # the shared model's load, once the model is known
        self.cached: CachedRender | None = None  # the cache integration, once the model is known
        self.sample_rate = 0
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._cache_executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self.current: LineRecord | None = None  # the line being synthesised

    def open(self) -> None:
        self.executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="irodori-speaker")
        if self.cache is not None:  # hits are served here, never behind the model worker
            self._cache_executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="irodori-cache"
            )

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` on the model thread (outputs open / close, load, prewarm)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def attach(self, synthesizer: SynthesizerLike) -> None:
        """The model is loaded: lines go to `synthesizer`, through the phrase cache if one is set."""
        self.synthesizer = synthesizer
        self.load = model_load(synthesizer)
        self.sample_rate = int(synthesizer.sample_rate)
        if self.cache is not None:
            self.cached = CachedRender(self.cache, synthesizer, store=self.cache_store, source="speaker")

    @property
    def busy(self) -> bool:
        return self._task is not None

    # -- synthesis ---------------------------------------------------------------------------------

    def start(self, line: LineRecord, rates: list[int]) -> None:
        """Synthesise `line` (QUEUED) now; `rates`: the output rates other than the model's."""
        line.synthesising()
        self.current = line
        self._task = self.scope.spawn(self._line(line, rates), f"line-{line.id}")

    def preempt(self, reason: str = "pre-empted by a higher lane") -> None:
        """Stop the line being prefetched; it is queued again when its run has ended."""
        line = self.current
        if line is not None:
            line.preempt(reason)

    async def _line(self, line: LineRecord, rates: list[int]) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.executor, self._render_counted, loop, line, rates)
        except Cancelled:
            if not line.token.cancelled:
                self.reports.synth_failed(line, Cancelled("the synthesizer stopped on its own"))
        except Exception as e:
            self.reports.synth_failed(line, e)
        finally:
            self._task = None
            self.current = None
            with contextlib.suppress(RuntimeError):  # an abandoned Speaker's loop may be closed
                self.reports.synth_ended(line)

    def _render_counted(self, loop: asyncio.AbstractEventLoop, line: LineRecord, rates: list[int]) -> None:
        """`_render`, counted among the lines in synthesis on the shared model (the jitter
        buffers of every Speaker on it plan with that load)."""
        assert self.load is not None
        # its lane reaches the device owner: a high line's work goes ahead of other Speakers'
        with self.load.busy(), line_lane(int(line.priority)):
            self._render(loop, line, rates)

    def _render(self, loop: asyncio.AbstractEventLoop, line: LineRecord, rates: list[int]) -> None:
        """Worker thread: synthesise the line, post its chunks to the loop, store it if asked."""
        synth = self.synthesizer
        assert synth is not None
        reports = self.reports
        token = line.token

        def post(fn: Callable[..., None], *args: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
                loop.call_soon_threadsafe(fn, line, *args)

        check(token)
        src = self.sample_rate
        cached, marked = self.cached, line.cache
        x: np.ndarray | None = None  # a whole line's audio (streamed: None, the chunks are posted)
        span = SpeechSpan(src) if self.timing else None
        t0 = time.monotonic()
        post(reports.synth_started, t0)
        if self.streaming:
            streams = {r: StreamResampler(src, r) for r in rates}
            # with a cache: stored by its policy once the last chunk is out (a whole line only)
            audio_stream = (
                cached.stream(line.text, line.voice, line.options, marked=marked, lookup=False, cancel=token)
                if cached is not None
                else synth.stream(line.text, line.voice, line.options, cancel=token)
            )
            line.stream_opened(audio_stream.record)  # read by the jitter buffer on the loop
            provisional = span is not None  # the word times, sent with the first chunk
            try:
                for x in audio_stream:
                    check(token)
                    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
                    if span is not None:
                        span.add(x)
                    by_rate = {r: rs.feed(x) for r, rs in streams.items()}
                    post(reports.chunk, Chunk(x, by_rate), time.monotonic())
                    if provisional and span is not None:
                        provisional = False
                        early = provisional_timing(audio_stream.record, span)
                        if early is not None:
                            post(reports.timing, early)
                if streams:
                    empty = np.zeros(0, dtype=np.float32)
                    tail = {r: rs.flush() for r, rs in streams.items()}
                    post(reports.chunk, Chunk(empty, tail), time.monotonic())
            finally:
                audio_stream.close()
            record = audio_stream.record
            t1 = time.monotonic()
        else:
            result = (
                cached.render(
                    line.text, line.voice, line.options, marked=marked, lookup=False, cancel=token
                ).result
                if cached is not None
                else synth.synthesize(line.text, line.voice, line.options, cancel=token)
            )
            t1 = time.monotonic()
            record = result.record
            x = np.ascontiguousarray(result.audio, dtype=np.float32).reshape(-1)
            post(reports.chunk, Chunk(x, {r: resample(x, src, r) for r in rates}), t1)
            if span is not None:
                span.add(x)
        if span is not None and not token.cancelled:
            post(reports.timing, line_timing(record, span))
        # after the store: a line reported done (and so played) is in the cache, so the same
        # line asked for right after is a hit (it raced the store before; its audio is out already)
        post(reports.synth_done, record, t0, t1)

    # -- the phrase cache ----------------------------------------------------------------------------

    def start_lookup(self, line: LineRecord, rates: list[int]) -> None:
        """Look `line` up in the phrase cache on the cache thread; a hit is reported as a line
        synthesised at once (the same events, no model work)."""
        assert self._cache_executor is not None
        line.lookup_started()
        fut = asyncio.get_running_loop().run_in_executor(self._cache_executor, self._lookup, line, rates)
        fut.add_done_callback(lambda f: self._on_lookup(line, f))

    def _lookup(self, line: LineRecord, rates: list[int]) -> Any:
        """Cache thread: the stored line and its audio at the output rates, or None."""
        t0 = time.monotonic()
        assert self.cached is not None  # lookups are started only with a cache
        hit = self.cached.lookup(line.text, line.voice, line.options)  # a failed lookup is a miss
        if hit is None:
            return None
        x = np.ascontiguousarray(hit.audio, dtype=np.float32)
        timing = None
        if self.timing:
            span = SpeechSpan(self.sample_rate)
            span.add(x)
            timing = line_timing(hit.record, span)
        chunk = Chunk(x, {r: resample(x, self.sample_rate, r) for r in rates})
        return hit, chunk, t0, time.monotonic(), timing

    def _on_lookup(self, line: LineRecord, fut: Any) -> None:
        line.lookup_ended()
        self.reports.wake()  # a miss: the line may be synthesised now
        if fut.cancelled() or fut.exception() is not None or fut.result() is None:
            return
        if line.state != UtteranceState.QUEUED:  # ended meanwhile
            return
        hit, chunk, t0, t1, timing = fut.result()
        line.synthesising()
        self.reports.synth_started(line, t0)
        self.reports.chunk(line, chunk, t1)
        self.reports.timing(line, timing)
        self.reports.synth_done(line, hit.record, t0, t1)

    # -- closing -------------------------------------------------------------------------------------

    async def stop(self, timeout: float = 10.0) -> bool:
        """Wait for the line in progress to stop (its token is cancelled); True if it did not."""
        task = self._task
        if task is None:
            return False
        try:
            await asyncio.wait_for(asyncio.shield(task), timeout)
        except asyncio.TimeoutError:
            log.warning("synthesis did not stop within %g s of cancellation; leaving its thread", timeout)
            return True
        except Exception:
            pass  # its failure was reported on its line
        return False

    def shutdown(self, *, stuck: bool = False, abandon: bool = False) -> None:
        """Shut the threads down: joined (the cache thread always, the model thread unless stuck),
        or, for an abandoned Speaker, told to stop without waiting."""
        for ex, wait in ((self.executor, not stuck), (self._cache_executor, True)):
            if ex is None:
                continue
            if abandon:
                ex.shutdown(wait=False, cancel_futures=True)
            else:
                ex.shutdown(wait=wait)
        self._cache_executor = None
        if not abandon:
            self.executor = None


def provisional_timing(record: SynthesisRecord | None, span: SpeechSpan) -> Any:
    """A streamed line's word timing from its first chunk (worker thread): a line of one piece
    is as long as its kept latent frames once they are sampled and trimmed, so its words can be
    placed before the rest is decoded (a line that starts at its first chunk would otherwise
    announce its first words only when its synthesis ends). `line_timing` replaces it then."""
    if record is None or not record.text or record.pieces != 1 or record.frames <= 0:
        return None
    kept = record.frames - int(record.extra.get("trimmed_frames", 0))
    seconds = max(kept / LATENT_HZ, span.samples / span.sample_rate)
    if record.samples > span.samples:  # pre-silence already counted in the record
        seconds += (record.samples - span.samples) / span.sample_rate
    try:
        return estimate_timing(record.text, seconds, speech=(span.span()[0], seconds), source=record.source)
    except Exception as e:  # the timing is a nicety: it must never cost the line
        log.debug("no provisional timing for %r: %s", record.text[:40], e)
        return None


def line_timing(record: SynthesisRecord | None, span: SpeechSpan) -> Any:
    """The line's estimated word/mora timing (worker thread), None when it cannot be had."""
    if record is None or not record.text:
        return None
    try:
        return estimate_timing(
            record.text, span.samples / span.sample_rate, speech=span.span(), source=record.source
        )
    except Exception as e:  # the timing is a nicety: it must never cost the line
        log.debug("no timing for %r: %s", record.text[:40], e)
        return None
