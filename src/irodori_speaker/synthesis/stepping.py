"""The device owner steps every concurrent line, one sampler step at a time.

With `max_batch` > 1 (several Speakers, a server with lines in flight) lines no longer sample
one after another, nor in whole-line batches of whoever happened to wait together: each line,
once its text is encoded, is started (its context K/V and plan, a job on the device owner) and
handed to this scheduler, a `Stepper` of the owner (engine/hardware/owner.py), which between
other jobs runs one sampler step for every live line (`engine.steps.StepBatcher`): a line that
arrives joins at the next step, a finished one leaves, a cancelled one leaves at the next step
boundary. The line's thread waits for its latent and goes on to decode it (jobs again).

A line that is alone (nothing else live, waiting or encoding) runs as before this scheduler, as
one job (on CUDA, its whole-line graph): one line keeps today's latency.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..cancel import CancelToken, check
from ..engine.hardware.owner import DEVICE, URGENT
from ..lanes import current_lane
from .batching import CountsPreparing, RunBatch, SampleRequest

log = logging.getLogger(__name__)

StartLines = Callable[[list[SampleRequest]], list[Any]]  # requests -> their engine.steps.StepLines
StepLines = Callable[[list[Any]], list[Any]]  # live StepLines -> those that finished
ReleaseLines = Callable[[list[Any]], None]  # StepLines dropped unfinished: their context slots back


class StepScheduler(CountsPreparing):
    """`sample(prepare)` as `SampleBatcher`'s, served by the device owner stepping every line."""

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
        self._waiting: list[SampleRequest] = []
        self._live: list[Any] = []  # StepLines, touched by the owner thread only
        self._alone = 0  # lines sampling alone right now
        self.batches: dict[int, int] = {}  # lines stepped together -> how many steps ran so
        self.peak_lines = 0

    def sample(self, prepare: Callable[[], SampleRequest]) -> tuple[SampleRequest, Any]:
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
        for its latent. Lines arriving together start in one job (`run_batched`): their contexts
        from one call; a start that raises runs again alone, so a refused line fails alone."""
        req.lane = current_lane()
        try:
            req.line = DEVICE.run_batched(
                (id(self), "start"), req, self._start, req.cancel, URGENT, limit=self.max_batch
            )
        except BaseException as e:  # a refused plan or a cancel: this line alone fails
            req.error, req.done = e, True
            return
        with self._cond:
            self._waiting.append(req)
        DEVICE.wake(self)
        with self._cond:  # a cancelled line too: the owner retires it at its next step
            while not req.done:
                self._cond.wait(0.05)

    # ---- the owner's side (engine/hardware/owner.Stepper) ------------------------------------
    def has_work(self) -> bool:
        return bool(self._live or self._waiting)

    def fail(self, error: BaseException) -> None:
        """End every waiting and live line with `error` (the owner's last resort)."""
        with self._cond:
            reqs = [*self._waiting, *(line.tag for line in self._live)]
            lines = [*(req.line for req in self._waiting), *self._live]
            self._waiting.clear()
            self._live.clear()
            for req in reqs:
                req.error, req.done = error, True
            self._cond.notify_all()
        try:
            self._release([line for line in lines if line is not None])
        except Exception:  # the owner is failing already: its lines are ended either way
            log.exception("giving back the failed lines' context slots failed")

    def iterate(self) -> None:
        """One iteration on the owner thread: admit the waiting lines, one step of at most
        `max_batch` of them (high lanes first, then by arrival: a high line enters the next step
        even when the batch is full; a line left out keeps its state), retire."""
        with self._cond:
            admit, self._waiting = self._waiting, []
        if not self._live and not admit:
            return
        n = 0
        chosen: list[Any] = []
        try:
            self._live += [req.line for req in admit]  # a cancelled waiting line was taken out
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


def _cancelled(line: Any) -> bool:
    return line.cancel is not None and line.cancel.cancelled
