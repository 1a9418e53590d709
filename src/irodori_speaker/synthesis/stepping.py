"""The device owner steps every concurrent line, one sampler step at a time.

With `max_batch` > 1 (several Speakers, a server with lines in flight) lines no longer sample
one after another, nor in whole-line batches of whoever happened to wait together: each line,
once its text is encoded, is started (its context K/V and plan, a job on the device owner; lines
arriving together in one: `engine.steps.StepBatcher.start_many`) and handed to this scheduler, a
`Stepper` of the owner (engine/hardware/owner.py), which between other jobs runs one sampler step
for every live line: a line that arrives joins at the next step, a finished one leaves, a
cancelled one leaves at the next step boundary. The line's thread waits for its latent and goes
on to decode it (jobs again).

Only as many lines start as the step batcher's pool holds now (a fixed pool: step graphs): a line
it cannot hold waits un-started, and the owner's iteration starts it (high lanes first, then by
arrival, ahead of lines that arrive later) once finished lines free room. That back-pressure keeps
the step's memory fixed, as its CUDA graphs need.

A line that is alone (nothing else live, waiting or encoding) runs as before this scheduler, as
one job (on CUDA, its whole-line graph): one line keeps today's latency.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..cancel import Cancelled, CancelToken, check
from ..engine.hardware.owner import DEVICE, URGENT
from ..lanes import current_lane
from .batching import CountsPreparing, RunBatch, SampleRequest

log = logging.getLogger(__name__)

# requests -> the StepLines (engine.steps) of a prefix of them: those that fit now, maybe none
StartLines = Callable[[list[SampleRequest]], list[Any]]
StepLines = Callable[[list[Any]], list[Any]]  # live StepLines -> those that finished
ReleaseLines = Callable[[list[Any]], None]  # StepLines dropped unfinished: their context slots back


class StepScheduler(CountsPreparing):
    """`sample(prepare)` as `SampleBatcher`'s, served by the device owner stepping every line.

    A line's start job holds it only where the step batcher's pool has room (`start` returns
    the lines of a prefix of the requests); one it could not hold waits un-started and the
    owner's iteration starts it, in lane then arrival order, once finished lines free room."""

    def __init__(
        self,
        start: StartLines,
        step: StepLines,
        run_alone: RunBatch,
        max_batch: int,
        release: ReleaseLines,
    ) -> None:
        super().__init__()
        self._start = start
        self._step = step
        self._release = release
        self._run_alone = run_alone
        self.max_batch = max(1, int(max_batch))  # 1: every line alone, one after another
        # handed over: started by their job, or un-started (no room then; those held back first)
        self._waiting: list[SampleRequest] = []
        self._live: list[Any] = []  # StepLines, touched by the owner thread only
        # the lines a start left waiting while others were live, until a live line leaves: while
        # no other line waits, asking again would find no more room (the owner's thread only)
        self._no_room: list[SampleRequest] | None = None
        self._alone = 0  # lines sampling alone right now
        self.batches: dict[int, int] = {}  # lines stepped together -> how many steps ran so
        self.peak_lines = 0

    def sample(
        self, prepare: Callable[[], SampleRequest], cancel: CancelToken | None = None
    ) -> tuple[SampleRequest, Any]:
        """As `SampleBatcher.sample` (`cancel`: unused here, no hold before the encoders)."""
        req = self._prepare(prepare)
        with self._cond:
            alone = self.max_batch <= 1 or not (self._live or self._waiting or self._preparing or self._alone)
            if alone:
                self._alone += 1
        if alone:
            try:
                self._sample_alone(req)
            finally:
                with self._cond:
                    self._alone -= 1
        else:
            self._hand_over(req)
        if req.error is not None:
            raise req.error
        check(req.cancel)
        return req, req.result

    def _sample_alone(self, req: SampleRequest) -> None:
        def run() -> Any:
            return self._run_alone([req], req.cancel or CancelToken(), req.progress)[0]

        try:
            req.result = DEVICE.run(run, req.cancel, URGENT)
        except BaseException as e:
            req.error = e
        req.batch_size, req.done = 1, True

    def _hand_over(self, req: SampleRequest) -> None:
        """Start the line (its context K/V and plan) as a job, queue it for the steps and wait
        for its latent. Lines arriving together start in one job (`run_batched`); a start that
        raises runs again alone, so a refused line fails alone. A line the batcher's fixed pool
        cannot hold now (`start` returned no line for it) waits un-started: the owner's
        iteration starts it once lines leave (`_admit`)."""
        req.lane = current_lane()
        try:
            req.line = DEVICE.run_batched(
                (id(self), "start"), req, self._start_padded, req.cancel, URGENT, limit=self.max_batch
            )
        except BaseException as e:  # a refused plan or a cancel: this line alone fails
            req.error, req.done = e, True
            return
        with self._cond:
            self._waiting.append(req)
        DEVICE.wake(self)
        with self._cond:  # a cancelled line too: the owner ends it at its next iteration
            while not req.done:
                self._cond.wait(0.05)

    def _start_padded(self, reqs: list[SampleRequest]) -> list[Any]:
        """`start` as a batched job: one result per request, None for those not held now.

        The start stays a job of its own rather than a part of the owner's iteration: started
        there, at 32 Speakers on the CPU (tiny model, max_batch 8) 25-43 of 96 lines had a hole
        against 8-15 (benchmarks/RESULTS.md, eleventh session)."""
        lines = list(self._start(reqs))
        return lines + [None] * (len(reqs) - len(lines))

    # ---- the owner's side (engine/hardware/owner.Stepper) ------------------------------------
    def has_work(self) -> bool:
        return bool(self._live or self._waiting)

    def fail(self, error: BaseException) -> None:
        """End every waiting and live line with `error` (the owner's last resort)."""
        with self._cond:
            reqs = [*self._waiting, *(line.tag for line in self._live)]
            # a waiting request has no line (it starts on the owner); should one have, it goes too
            lines = [*(req.line for req in self._waiting if req.line is not None), *self._live]
            self._waiting.clear()
            self._live.clear()
            self._no_room = None
            for req in reqs:
                req.error, req.done = error, True
            self._cond.notify_all()
        try:
            self._release(lines)
        except Exception:  # the owner is failing already: its lines are ended either way
            log.exception("giving back the failed lines' context slots failed")

    def iterate(self) -> None:
        """One iteration on the owner thread: start the waiting lines that fit, one step of at
        most `max_batch` live lines (high lanes first, then by arrival: a high line enters the
        next step even when the batch is full; a line left out keeps its state), retire."""
        self._admit()
        if not self._live:
            return
        n = 0
        chosen: list[Any] = []
        try:
            chosen = sorted(self._live, key=lambda line: line.tag.lane)[: self.max_batch]
            n = len(chosen)
            # a line left out that was cancelled leaves now, too (the step retires it)
            left_out = [line for line in self._live if line not in chosen and _cancelled(line)]
            finished = self._step(chosen + left_out)
        except BaseException as e:  # one failed step fails its lines, not the owner
            log.exception("a sampler step failed")
            finished = chosen or list(self._live)
            for line in finished:
                line.error = e
        if n:
            self.batches[n] = self.batches.get(n, 0) + 1
            self.peak_lines = max(self.peak_lines, n)
        with self._cond:
            if finished:
                self._no_room = None  # their room is free: the waiting lines may fit now
            for line in finished:
                self._live.remove(line)
                req = line.tag
                if line.error is not None:
                    req.error = line.error
                else:
                    req.result = line.latent()
                req.batch_size = max(req.batch_size, n)
                req.done = True
            self._cond.notify_all()

    def _admit(self) -> None:
        """The lines their jobs started go live; of those that found no room, end the cancelled
        ones and start the others that fit now (lane, then arrival order: the pool's room goes
        to a prefix); those that still do not fit wait, ahead of the lines that arrive later."""
        with self._cond:
            waiting, self._waiting = self._waiting, []
            # started by their job: live now (a cancelled one is retired by the step, its slots back)
            self._live += [req.line for req in waiting if req.line is not None]
            waiting = [req for req in waiting if req.line is None]
            cancelled = [req for req in waiting if req.cancel is not None and req.cancel.cancelled]
            for req in cancelled:  # never started: nothing to give back
                req.error, req.done = Cancelled("cancelled"), True
            if cancelled:
                self._cond.notify_all()
            reqs = sorted((req for req in waiting if req not in cancelled), key=lambda r: r.lane)
            held = {id(req) for req in self._no_room or ()}
            # nothing left and nothing new arrived since the last start found no room: skip it
            skip = bool(self._live) and self._no_room is not None and all(id(r) in held for r in reqs)
        left = reqs
        try:
            if reqs and not skip:
                left = self._start_prefix(reqs)
        finally:  # should anything past the start raise, no line is lost: `fail` finds them all
            started = {id(line.tag) for line in self._live}
            with self._cond:
                left = [r for r in left if not r.done and id(r) not in started]
                self._no_room = left if left and self._live else None
                self._waiting[:0] = left

    def _start_prefix(self, reqs: list[SampleRequest]) -> list[SampleRequest]:
        """Start what fits of `reqs` in one call, or, when that call raises, each alone (a line
        whose start raises fails alone). Returns the requests left waiting, in order."""
        try:
            lines = self._start(reqs)
        except BaseException:  # a refused plan or input: find it, each line alone
            log.debug("starting %d lines together failed; starting each alone", len(reqs), exc_info=True)
            return self._start_each(reqs)
        self._take(lines)
        started = {id(line.tag) for line in lines}
        return [req for req in reqs if id(req) not in started]

    def _start_each(self, reqs: list[SampleRequest]) -> list[SampleRequest]:
        for i, req in enumerate(reqs):
            try:
                lines = self._start([req])
            except BaseException as e:  # this line's own error: it alone fails
                with self._cond:
                    req.error, req.done = e, True
                    self._cond.notify_all()
                continue
            if not lines:  # no room for it: it and those after it wait, in order
                return reqs[i:]
            self._take(lines)
        return []

    def _take(self, lines: list[Any]) -> None:
        for line in lines:
            line.tag.line = line
        self._live += lines


def _cancelled(line: Any) -> bool:
    return line.cancel is not None and line.cancel.cancelled
