"""The server's synthesis workers: a fair queue in front of the Synthesizer.

Every route hands its line to `SpeechService.stream`; a phrase-cache hit is answered at
once, a miss waits in a queue with one lane per client (round robin across lanes, so one
client's burst does not starve another; a client with fewer lines in synthesis goes first).
`streams` worker threads render lines; lines that reach the sampler together are sampled as
one batch (synthesis/batching.py), and their decode windows interleave on the device owner
(engine/hardware/owner.py). The
cache is the one integration, `CachedRender` (cache/policy.py), with store policy "seeded": a
line with a seed (the server's default, `serve --seed 0`) is stored once rendered whole; a
random one is rendered as asked and never stored. Chunks reach the event loop as the decoder
produces them. A request that goes away cancels its line: its CancelToken stops the sampler
between steps (or takes the line out of the queue). Shutdown lets the running lines finish
for a grace period, then cancels what is left.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cache import CachedRender
from ..cancel import CancelToken
from ..errors import Cancelled, IrodoriError
from .metrics import Metrics

_DONE = object()
CLIENT_GONE = "the client went away"


class QueueFull(IrodoriError):
    """The synthesis queue is at its limit; `retry_after` says when to try again (seconds)."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message, hint=f"retry after {retry_after} s")
        self.retry_after = retry_after


class ShuttingDown(IrodoriError):
    """The server is stopping and takes no new lines."""


@dataclass(eq=False)  # hashed by identity: the running set
class Line:
    """One line in flight: what to render, and the channel its chunks come back on."""

    text: str
    voice: Any
    options: Any
    client: str
    route: str
    loop: asyncio.AbstractEventLoop
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: CancelToken = field(default_factory=CancelToken)
    record: Any = None
    enqueued: float = field(default_factory=time.perf_counter)
    started: float = 0.0

    def send(self, item: Any) -> None:
        self.loop.call_soon_threadsafe(self.out.put_nowait, item)


class FairQueue:
    """Lanes per client, served round robin; a client with fewer lines in synthesis goes
    first (so one client's burst cannot fill every stream while another waits). Thread-safe."""

    def __init__(self) -> None:
        self._lanes: dict[str, deque[Line]] = {}
        self._order: deque[str] = deque()
        self._busy: dict[str, int] = {}  # client -> its lines out (`get` until `done`)
        self._cond = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        with self._cond:
            return sum(len(q) for q in self._lanes.values())

    def put(self, line: Line) -> None:
        with self._cond:
            lane = self._lanes.get(line.client)
            if lane is None:
                lane = self._lanes[line.client] = deque()
                self._order.append(line.client)
            lane.append(line)
            self._cond.notify()

    def get(self) -> Line | None:
        """The next line (blocks); None once closed and empty."""
        with self._cond:
            while not self._order:
                if self._closed:
                    return None
                self._cond.wait()
            client = min(self._order, key=lambda c: self._busy.get(c, 0))  # the first of the least busy
            self._order.remove(client)
            lane = self._lanes[client]
            line = lane.popleft()
            if lane:
                self._order.append(client)
            else:
                del self._lanes[client]
            self._busy[client] = self._busy.get(client, 0) + 1
            return line

    def done(self, line: Line) -> None:
        """`line` (from `get`) is finished."""
        with self._cond:
            left = self._busy.pop(line.client, 1) - 1
            if left > 0:
                self._busy[line.client] = left

    def drain(self) -> list[Line]:
        with self._cond:
            lines = [line for lane in self._lanes.values() for line in lane]
            self._lanes.clear()
            self._order.clear()
            return lines

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class SpeechService:
    """Owns the Synthesizer (and the optional phrase cache) for the app's lifetime."""

    def __init__(
        self,
        synth: Any,
        *,
        cache: Any = None,
        max_queue: int = 64,
        metrics: Metrics | None = None,
        streams: int = 1,
    ) -> None:
        self.synth = synth
        self.cache = cache
        self.cached: CachedRender | None = None  # lookup -> render -> store, with the cache
        if cache is not None:
            self.cached = CachedRender(cache, synth, store="seeded", source="server")
        self.max_queue = max_queue
        self.metrics = metrics or Metrics()
        self._queue = FairQueue()
        self.streams = max(1, int(streams))  # lines in synthesis at once (worker threads)
        self._running: set[Line] = set()
        self._threads: list[threading.Thread] = []
        self._accepting = False
        self._mean_line_s = 1.0  # moving average of a miss's render time (Retry-After)
        self.initialized: set[Any] = set()

    # ---- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        if not self._threads:
            self._accepting = True
            for i in range(self.streams):
                t = threading.Thread(target=self._work, name=f"irodori-synthesis-{i}", daemon=True)
                self._threads.append(t)
                t.start()

    async def stop(self, grace_s: float = 10.0) -> None:
        """No new lines; the queued and running ones get `grace_s`, then are cancelled."""
        self._accepting = False
        deadline = time.monotonic() + grace_s
        while (len(self._queue) or self._running) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for line in self._queue.drain():
            line.cancel.cancel("server shutting down")
            line.send(Cancelled("server shutting down"))
        for running in list(self._running):
            running.cancel.cancel("server shutting down")
        self._queue.close()
        for t in self._threads:
            await asyncio.to_thread(t.join, 30.0)
        self._threads = []

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    # ---- the worker thread ------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            line = self._queue.get()
            if line is None:
                return
            self.metrics.queue_length.set(len(self._queue))
            if line.cancel.cancelled:
                self._queue.done(line)
                line.send(Cancelled(line.cancel.reason))
                continue
            self._running.add(line)
            t0 = line.started = time.perf_counter()
            try:
                self._render(line)
            except BaseException as e:  # handed to the request; the worker keeps serving
                line.send(e if isinstance(e, Exception) else Cancelled("worker stopped"))
            else:
                line.send(_DONE)
            finally:
                self._running.discard(line)
                self._queue.done(line)
                # a line's time per worker: with several streams, lines finish that much faster
                per_line = (time.perf_counter() - t0) / self.streams
                self._mean_line_s = 0.8 * self._mean_line_s + 0.2 * per_line

    def _render(self, line: Line) -> None:
        steps = self.metrics.sampler_steps

        def progress(done: int, total: int, *_: Any) -> None:
            steps.inc()

        if self.cached is not None:  # looked up already (`stream`); stored once its last chunk is out
            stream = self.cached.stream(
                line.text, line.voice, line.options, lookup=False, cancel=line.cancel, progress=progress
            )
        else:
            stream = self.synth.stream(line.text, line.voice, line.options, line.cancel, progress=progress)
        try:
            for chunk in stream:
                line.cancel.raise_if_cancelled()
                line.send(chunk)
        finally:
            stream.close()
        line.record = stream.record
        if stream.record.frames:  # sampled (not a cache hit, not only pauses)
            self.metrics.sample_batch.observe(stream.record.extra.get("sample_batch", 1))
        audio_s = stream.record.audio_seconds
        if audio_s > 0:
            self.metrics.rtf.observe((time.perf_counter() - line.started) / audio_s)

    # ---- the request side -------------------------------------------------------------------
    async def stream(
        self,
        text: str,
        voice: Any,
        options: Any,
        *,
        client: str = "-",
        route: str = "-",
        is_disconnected: Callable[[], Any] | None = None,
    ) -> AsyncIterator[np.ndarray]:
        """48 kHz float32 chunks of one line. Raises InputError (bad input, before any work),
        QueueFull, ShuttingDown or Cancelled. Closing the iterator cancels the line."""
        if not self._accepting:
            raise ShuttingDown("the server is shutting down", hint="retry in a moment")
        self.synth.spoken_text(text, options)  # input errors now, before queueing
        if self.cached is not None:  # a failed lookup is a miss; a refused line an InputError
            hit = await asyncio.to_thread(self.cached.lookup, text, voice, options)
            if hit is not None:
                self.metrics.cache_hits.inc()
                yield hit.audio
                return
        pending = len(self._queue)
        if pending >= self.max_queue:
            retry = max(1, math.ceil(pending * self._mean_line_s))
            raise QueueFull(f"the synthesis queue is full ({pending} lines waiting)", retry)
        line = Line(text, voice, options, client, route, asyncio.get_running_loop())
        self._queue.put(line)
        self.metrics.queue_length.set(len(self._queue))
        watcher = None
        if is_disconnected is not None:
            watcher = asyncio.create_task(self._watch(line, is_disconnected))
        finished = False
        try:
            while True:
                item = await line.out.get()
                if item is _DONE:
                    finished = True
                    break
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                yield item
        finally:
            if watcher is not None:
                watcher.cancel()
            if not finished:  # the consumer stopped reading: the request is gone
                line.cancel.cancel(CLIENT_GONE)
            if line.cancel.cancelled and line.cancel.reason == CLIENT_GONE:
                self.metrics.cancelled.inc()

    async def _watch(self, line: Line, is_disconnected: Callable[[], Any]) -> None:
        while not line.cancel.cancelled:
            await asyncio.sleep(0.1)
            if await is_disconnected():
                line.cancel.cancel(CLIENT_GONE)
                line.send(Cancelled(CLIENT_GONE))
                return

    async def render(self, text: str, voice: Any, options: Any, **kwargs: Any) -> np.ndarray:
        """The whole line (48 kHz float32)."""
        parts = [c async for c in self.stream(text, voice, options, **kwargs)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    async def initialize(self, style_id: int, voice: Any) -> None:
        """Encode the voice's reference once (the first line of it then starts sooner)."""
        if voice is not None and voice.has_reference:  # the synthesizer takes the model lock
            await asyncio.to_thread(self.synth.reference_latent, voice)
        self.initialized.add(style_id)
