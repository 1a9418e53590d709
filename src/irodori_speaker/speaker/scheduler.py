"""The scheduler: the loop that moves lines along, a step every tick while anything plays.

A step expires lines past their time-to-live, puts lines back whose outputs all failed,
pushes ready lines to the player (gapless: `schedule_ahead_s` before the current one ends;
a streamed line only once the jitter buffer says it will not stop inside), and starts the
next synthesis when the look-ahead has room, or pre-empts a lower lane's prefetch.
The decisions are the queue's (`LineQueue`); this only carries them out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from ..audio.lipsync import Envelope
from .jitter import line_seconds_estimate
from .playback import Player
from .queue import LineQueue
from .tracker import LineTracker
from .worker import LineWorker

log = logging.getLogger("irodori_speaker.speaker")

__all__ = ["Scheduler"]


class Scheduler:
    def __init__(
        self,
        queue: LineQueue,
        tracker: LineTracker,
        worker: LineWorker,
        player: Player,
        *,
        wake: asyncio.Event,
        idle: asyncio.Event,
        closing: Callable[[], bool],
        schedule_ahead_s: float,
        lipsync_hz: float,
        tick_s: float = 0.02,
    ) -> None:
        self.queue = queue
        self.tracker = tracker
        self.worker = worker
        self.player = player
        self.wake = wake
        self.idle = idle
        self.closing = closing
        self.schedule_ahead_s = schedule_ahead_s
        self.lipsync_hz = lipsync_hz
        self.tick_s = tick_s
        self.sample_rate = tracker.sample_rate
        # ends the loop (a flag: a cancel can be swallowed, see Speaker._release_resources)
        self.stopping = False

    def busy(self) -> bool:
        return bool(self.queue or self.player.items or self.worker.busy)

    def rates(self) -> list[int]:
        """The sample rates of the healthy outputs other than the model's."""
        return sorted({o.sample_rate for o in self.player.healthy} - {self.sample_rate})

    async def run(self) -> None:
        while not self.stopping:
            if self.player.busy:
                timeout: float | None = self.tick_s
            elif self.queue:
                timeout = 0.1  # TTLs
            else:
                timeout = None
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), timeout)
            self.wake.clear()
            if self.stopping:
                return
            try:
                self.step()
            except Exception:
                log.exception("Speaker scheduler step failed")

    def step(self) -> None:
        now = time.monotonic()
        for line in self.queue.expired(now):
            self.tracker.cancel(line, "expired")
        for item in reversed(self.player.poll()):  # every output failed: lines not yet heard go back in front
            back = self.tracker.of(item)
            if back is not None and not back.state.terminal:
                back.returned()
                self.queue.put_back(back)
        if not self.closing():
            self._push_lines(now)
            self._dispatch_synthesis()
        if not self.busy():
            self.idle.set()

    def _push_lines(self, now: float) -> None:
        player = self.player
        while player.can_push(now, self.schedule_ahead_s):
            line = self.queue.head()
            if line is None or line.preempted or not (line.chunks or line.rendered):
                return
            if not line.rendered and not self.tracker.jitter.ready(
                line.feed, line_seconds_estimate(line.live_record, line.feed.received_s)
            ):
                return  # streamed slower than real time: hold enough that it never stops inside
            self.queue.remove(line)
            env = Envelope(self.sample_rate, hz=self.lipsync_hz)
            item = player.start(line.id, line.text, env)
            line.pushed(item)
            for chunk in line.chunks:
                player.add(item, chunk)
            if line.rendered:
                player.end(item)

    def _dispatch_synthesis(self) -> None:
        current = self.worker.current
        if self.worker.busy:
            if current is not None and self.queue.preempts(current):
                self.worker.preempt()
            return
        waiting = [i for i in self.player.items if i.started_at is None]
        candidate = self.queue.to_synthesise(
            scheduled=len(waiting),
            scheduled_s=sum(i.envelope.samples for i in waiting) / max(1, self.sample_rate),
            playing=bool(self.player.items),
            sample_rate=self.sample_rate,
        )
        if candidate is not None:
            self.worker.start(candidate, self.rates())
