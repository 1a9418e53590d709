"""What a Speaker runs, and how it starts and stops: queue, tracker, worker, outputs, scheduler.

`open` opens the outputs and loads / prewarms the model on the worker thread, then starts the
scheduler loop in the Speaker's `TaskScope`; a failure on the way closes what was opened.
`close` is bounded in every state: the fades are heard (at most the output latency + 0.2 s),
the loop stops (a flag and a wake, then a cancel), the line in synthesis stops within one
step or chunk (else its thread is left after 10 s), the outputs close, the threads are
joined and the scope awaits whatever task is left. `abandon` is the same without a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from ..cancel import CancelToken, check
from ..options import SynthesizerLike
from ..outputs import Output, SoundDeviceOutput, make_output
from ..synthesis.load_options import LoadOptions
from ..timing.estimate import estimate_timing
from .events import Closed, EventBus, OutputRecovered, Queued
from .playback import Player
from .queue import LineQueue
from .record import LineRecord
from .scheduler import Scheduler
from .settings import load_synthesizer_for, voice_labels
from .tasks import TaskScope
from .tracker import LineTracker
from .utterance import UtteranceState
from .worker import LineWorker

log = logging.getLogger("irodori_speaker.speaker")

__all__ = ["Runtime"]


class Config(Protocol):
    """What the runtime reads of its Speaker (its arguments, as attributes)."""

    streaming: bool
    timing: bool
    prewarm: bool
    pause_s: float
    lipsync_lead_s: float
    lipsync_hz: float
    schedule_ahead_s: float
    tick_s: float
    cache: Any
    cache_store: str
    _closing: bool

    def _abandon(self, at_exit: bool = False) -> None: ...


class Runtime:
    """The Speaker's parts and their lifecycle: built with the Speaker, started by `open`."""

    def __init__(
        self, config: Config, queue: LineQueue, bus: EventBus, *, wake: asyncio.Event, own_cache: bool
    ) -> None:
        self.config = config
        self.queue = queue
        self.bus = bus
        self.wake = wake
        self.tracker = LineTracker(
            queue, emit=bus.emit, wake=wake.set, streaming=config.streaming, pause_s=config.pause_s
        )
        self.scope = TaskScope("irodori-speaker")
        self.worker = LineWorker(
            self.tracker,
            self.scope,
            streaming=config.streaming,
            timing=config.timing,
            cache=config.cache,
            cache_store=config.cache_store,
        )
        self.own_cache = own_cache  # made from a directory by the Speaker: closed with it
        self.outputs: list[Output] = []
        self.player: Player | None = None
        self.scheduler: Scheduler | None = None
        self._task: asyncio.Task[None] | None = None

    async def open(
        self,
        specs: Sequence[Any],
        synthesizer: SynthesizerLike | None,
        load_options: LoadOptions | None,
        token: CancelToken,
        voices: Sequence[Any],
        idle: asyncio.Event,
    ) -> tuple[SynthesizerLike, dict[str, float]]:
        """Open the outputs, load (unless given) and prewarm the model, start the player and
        the scheduler loop; the synthesizer and the prewarm seconds by voice name
        (`settings.voice_labels`: "default" for the model's own voice)."""
        config, worker = self.config, self.worker
        worker.open()
        opened: list[Output] = []
        prewarmed: dict[str, float] = {}
        try:
            for spec in specs:
                o = make_output(spec)
                await worker.call(o.open)
                opened.append(o)
            if synthesizer is None:
                check(token)
                synthesizer = await worker.call(load_synthesizer_for, load_options)
            assert synthesizer is not None
            worker.attach(synthesizer)
            assert worker.load is not None
            self.tracker.jitter.attach(worker.load)
            self.tracker.sample_rate = worker.sample_rate
            if config.timing:  # the reading dictionary loads now, not (holding the GIL) mid-line
                await worker.call(estimate_timing, "あ", 1.0)
            for label, voice in zip(voice_labels(voices), voices):
                prewarmed[label] = await worker.call(_prewarm, synthesizer, voice, token)
        except BaseException:
            token.cancel("open aborted")
            for o in opened:
                with contextlib.suppress(Exception):
                    await worker.call(o.close)
            worker.shutdown(abandon=True)
            worker.executor = None
            raise
        self.outputs = opened
        tracker = self.tracker
        self.player = tracker.player = Player(
            opened,
            source_rate=tracker.sample_rate,
            pause_s=config.pause_s,
            emit=tracker.emit,
            on_started=tracker.play_started,
            on_finished=tracker.play_finished,
            lipsync_lead_s=config.lipsync_lead_s,
            clock=time.monotonic,
        )
        self.scheduler = Scheduler(
            self.queue,
            tracker,
            worker,
            self.player,
            wake=self.wake,
            idle=idle,
            closing=lambda: config._closing,
            schedule_ahead_s=config.schedule_ahead_s,
            lipsync_hz=config.lipsync_hz,
            tick_s=config.tick_s,
        )
        self._task = self.scope.spawn(self._loop(self.scheduler, config), "scheduler")
        return synthesizer, prewarmed

    @staticmethod
    async def _loop(scheduler: Scheduler, config: Config) -> None:
        try:
            await scheduler.run()
        except asyncio.CancelledError:
            if not config._closing:  # the loop ends without aclose() (asyncio.run returning)
                config._abandon()
            raise

    async def close(self) -> None:
        """Stop everything (the lines have been cancelled); bounded."""
        player, scheduler = self.player, self.scheduler
        assert player is not None and scheduler is not None
        # let the fades be heard: bounded by the output latency, never forever
        limit = time.monotonic() + 0.2 + max((o.latency for o in self.outputs), default=0.0)
        while player.items and time.monotonic() < limit:
            scheduler.step()
            await asyncio.sleep(scheduler.tick_s)
        if self._task is not None:
            # Stop the loop with a flag and a wake, not only a cancel: on Python 3.10 / 3.11
            # `asyncio.wait_for` returns the inner result when a cancel lands just after the
            # inner wait completed, swallowing the cancel, and the loop then waited forever.
            scheduler.stopping = True
            scheduler.wake.set()
            done, _ = await asyncio.wait({self._task}, timeout=1.0)
            if not done:
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=1.0)
        stuck = await self.worker.stop(10.0)
        for o in self.outputs:
            try:
                if stuck:
                    o.close()
                else:
                    await self.worker.call(o.close)
            except Exception:
                log.exception("closing output %s failed", o.name)
        for line in self.tracker.open_lines():  # whatever is left ends now
            state = UtteranceState.CANCELLED if line.item is None else UtteranceState.INTERRUPTED
            self.tracker.finish(line, state)
        self.worker.shutdown(stuck=stuck)
        await self.scope.aclose()
        if self.own_cache and self.config.cache is not None:
            self.config.cache.close()
        self.tracker.emit(Closed(time.monotonic()))
        await self.bus.aclose()

    def abandon(self, reason: str) -> None:
        """Without the event loop: cancel every line (the worker stops within one step or chunk,
        so the exit's join of it is immediate), close the outputs, tell the threads to stop."""
        for line in self.tracker.open_lines():
            line.token.cancel(reason)
        for o in self.outputs:
            with contextlib.suppress(Exception):
                o.close()
        self.worker.shutdown(abandon=True)
        with contextlib.suppress(Exception):
            if self.own_cache and self.config.cache is not None:
                self.config.cache.close()
        with contextlib.suppress(Exception):
            self.bus.close()

    async def reopen_outputs(self, rescan: bool) -> list[Output]:
        """Reopen the failed outputs (by their device name); AudioError if one is still gone."""
        player = self.player
        assert player is not None
        reopened = []
        for o in self.outputs:
            if id(o) not in player.failed:
                continue
            await self.worker.call(o.close)
            opener = (lambda o=o: o.open(rescan=rescan)) if isinstance(o, SoundDeviceOutput) else o.open
            await self.worker.call(opener)
            player.reset_output(o)
            reopened.append(o)
            self.tracker.emit(OutputRecovered(time.monotonic(), o.name))
        return reopened

    def admit(self, line: LineRecord, now: float) -> None:
        """Queue a line (open Speaker): its Queued event, its cache lookup, the queue bound."""
        assert self.player is not None and self.scheduler is not None
        position = self.queue.add(line) + len(self.player.items)
        self.tracker.add(line)
        self.tracker.emit(Queued(now, line.id, line.text, line.priority.name.lower(), position))
        if self.config.cache is not None and line.cache is not False:
            self.worker.start_lookup(line, self.scheduler.rates())
        for victim in self.queue.overflow(line):
            self.tracker.cancel(victim, "overflow")

    async def drain(self, idle: asyncio.Event) -> None:
        """Until nothing is queued, synthesised or playing (`idle` is set by the scheduler)."""
        while True:
            await idle.wait()
            if not self.busy():
                return
            idle.clear()

    def busy(self) -> bool:
        return bool(self.queue or self.worker.busy or (self.scheduler is not None and self.scheduler.busy()))


def _prewarm(synth: SynthesizerLike, voice: Any, token: CancelToken) -> float:
    check(token)  # the synthesizer takes the model lock itself
    return float(synth.prewarm(voice))
