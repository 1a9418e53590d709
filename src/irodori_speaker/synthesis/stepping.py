"""One sampler thread owns the sampling of every concurrent line, one step at a time.

With `max_batch` > 1 (several Speakers, a server with lines in flight) the lines' threads no
longer sample behind the model lock one after another, nor in whole-line batches of whoever
happened to wait together: each line, once its text is encoded (`prepare`, by its own thread),
is handed to the scheduler's owner thread, which runs one sampler step for every live line per
iteration (`engine.steps.StepBatcher`): a line that arrives joins at the next step, a finished
one leaves, a cancelled one leaves at the next step boundary. The line's thread waits for its
latent and goes on to decode it. The owner holds the model lock for a few steps at a time
(`quantum`).

A line that is alone (nothing else live, waiting or encoding) runs as before this scheduler, on
its own thread through `run_alone` (on CUDA, its whole-line graph): one line keeps today's
latency. The owner thread starts when there is work and ends when there is none (it holds no
resources between bursts), so no thread outlives the lines that needed it. Each step holds the
model lock; other lines' encoders and decoders take it between steps.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ..cancel import CancelToken, check
from ..engine.hardware.lock import hold_model_lock
from .batching import CountsPreparing, RunBatch, SampleRequest

log = logging.getLogger(__name__)

StartLine = Callable[[SampleRequest], Any]  # request -> engine.steps.StepLine
StepLines = Callable[[list[Any]], list[Any]]  # live StepLines -> those that finished


class StepScheduler(CountsPreparing):
    """`sample(prepare)` as `SampleBatcher`'s, served by one owner thread stepping every line."""

    def __init__(
        self, start: StartLine, step: StepLines, run_alone: RunBatch, max_batch: int, *, quantum: int = 4
    ) -> None:
        super().__init__()
        self._start = start
        self._step = step
        self._run_alone = run_alone
        self.max_batch = max(1, int(max_batch))  # 1: every line alone, one after another
        self._waiting: list[SampleRequest] = []
        self._live: list[Any] = []  # StepLines, touched by the owner thread only
        self._alone = 0  # lines sampling alone on their own thread right now
        self._owner: threading.Thread | None = None
        self.batches: dict[int, int] = {}  # lines stepped together -> how many steps ran so
        self.peak_lines = 0
        self.quantum = quantum  # steps the owner runs per hold of the model lock

    def sample(self, prepare: Callable[[], SampleRequest]) -> tuple[SampleRequest, Any]:
        req = self._prepare(prepare)
        with self._cond:
            alone = self.max_batch <= 1 or (
                self._owner is None and not self._waiting and not self._preparing and not self._alone
            )
            if alone:
                self._alone += 1
        if alone:
            try:
                self._sample_alone(req)
            finally:
                with self._cond:
                    self._alone -= 1
                    self._cond.notify_all()
        else:
            self._hand_over(req)
        if req.error is not None:
            raise req.error
        check(req.cancel)
        return req, req.result

    def _hand_over(self, req: SampleRequest) -> None:
        """Build the line's context K/V and plan (host syncs) on its own thread, not the owner's,
        queue it for the owner and wait for its latent."""
        try:
            with hold_model_lock(req.cancel):
                req.line = self._start(req)
        except BaseException as e:  # a refused plan or a cancel: this line alone fails
            req.error, req.done = e, True
            return
        with self._cond:
            self._waiting.append(req)
            self._ensure_owner()
            while not req.done:
                self._cond.wait(0.05)
                if req.cancel is not None and req.cancel.cancelled and req in self._waiting:
                    self._waiting.remove(req)  # never stepped: nothing to retire
                    req.done = True

    def _sample_alone(self, req: SampleRequest) -> None:
        with hold_model_lock(req.cancel):
            try:
                req.result = self._run_alone([req], req.cancel or CancelToken(), req.progress)[0]
            except BaseException as e:
                req.error = e
        req.batch_size, req.done = 1, True

    def _ensure_owner(self) -> None:
        if self._owner is None:
            self._owner = threading.Thread(target=self._own, name="irodori-sampler", daemon=True)
            self._owner.start()

    def _own(self) -> None:
        """The owner thread: admit waiting lines, step every live line, retire the finished.

        It keeps the model lock for up to `quantum` steps in a row: handing the lock over after
        every step put each step behind every waiting decode window and its host sync (issue 27,
        measured on the H200)."""
        while True:
            with self._cond:
                while self._alone and not self._live:  # a lone line is running: let it finish first
                    self._cond.wait(0.05)
                if not self._live and not self._waiting:
                    self._owner = None
                    return
            with hold_model_lock():
                for _ in range(self.quantum):
                    if not self._iterate():
                        break

    def _iterate(self) -> bool:
        """One iteration (the model lock held): admit, one step, retire. False when idle."""
        with self._cond:
            admit: list[SampleRequest] = []
            while self._waiting and len(self._live) + len(admit) < self.max_batch:
                admit.append(self._waiting.pop(0))
        if not self._live and not admit:
            return False
        n = 0
        try:
            self._live += [req.line for req in admit]  # a cancelled waiting line was taken out
            n = len(self._live)
            finished = self._step(self._live) if self._live else []
        except BaseException as e:  # one failed step fails its lines, not the thread
            log.exception("a sampler step failed")
            finished = list(self._live)
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
        return True
