"""Lines that wait for the sampler at the same time are sampled as one batch.

Several Speakers, or a server with several lines in flight, each call the Synthesizer from
their own thread. On the one device owner (engine/hardware/owner.py) they would sample one
after another; here each line joins a waiting list and then hands the owner its job. The first
such job to run takes every line waiting at that moment whose plan matches its own
(`engine.batch.signature`, up to `max_batch`), samples them as one batch (rows padded and
masked, `engine.batch`) and hands each line its rows. A line whose line was taken finds it done
when its own job runs.

Only what is already waiting is batched, unless `admit_s` is set: then a line whose sampling
would start while the device still runs more than `admit_backlog` (0) of the owner's launches
(`DeviceOwner.backlog_above`: a batch held back then only leaves a queue it would have joined),
with fewer lines waiting than are
in flight (`CountsPreparing.line`: from a piece's encoders to its last window) and than
`admit_up_to`, waits up to `admit_s` for more to join (issue 27: under many streams the lines
that happened to wait together were 1-2, and a batch of 8 costs a line a quarter of its sampling
alone). The GPU is busy meanwhile: a batch launched later, not a GPU left idle. `admit_up_to`
lets admission top up small batches only: at 64 streams, where batches of 8-16 form by
themselves, holding them back for a full one underran lines (benchmarks/RESULTS.md "Twentieth
session"). With `admit_encoders` the wait comes before the line's text encoders instead
(`_hold`): lines let go together encode as one call, which costs nearly what one line's does.
On in the CUDA preset, where `max_batch` > 1: 40 ms, up to 8 lines, backlog 1, before the
encoders ("Twenty-third session": 1.05-1.21x the 15 ms / 4-line wait after them at 16 streams).

A line alone starts at once, as before, with its CUDA graph. In a batch a line is cancelled on
its own (its rows are dropped when the batch ends); the batch stops early only when every line
in it is cancelled. Progress callbacks of the lines in a batch are called from the owner thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..cancel import Cancelled, CancelToken, check
from ..engine.batch import lines_to_take
from ..engine.hardware.owner import DEVICE
from ..lanes import HIGH_LANE, NORMAL_LANE, current_lane

ProgressFn = Callable[[int, int], None]


@dataclass(eq=False)
class SampleRequest:
    """One line's sampling: its conditions (batch 1), noise (1, S, C) and options."""

    conds: Any
    noise: Any
    cfg: Any
    key: Hashable
    cancel: CancelToken | None = None
    progress: ProgressFn | None = None
    result: Any = None
    # its tail-trim frame on the way to the host (a HostCopy), made with the latent in the sampling
    # job when its options ask for the trim: no job of its own on the device owner
    trim: Any = None
    # an event after the sampling that made its latent, where the decode runs on a stream of its
    # own (`DeviceOwner.ready_mark`): its decode waits for that alone
    ready: Any = None
    error: BaseException | None = None
    done: bool = False
    length: int = 1  # its rows' length (latent frames): lines of near lengths batch together
    batch_size: int = 0  # how many lines it was sampled with (itself included)
    line: Any = None  # stepping.py: its engine.steps.StepLine, made on its own thread
    lane: int = NORMAL_LANE  # its line's lane (irodori_speaker.lanes): HIGH, NORMAL or LOW
    taken: bool = field(default=False, repr=False)


class AllCancelled(CancelToken):
    """Set when every one of `tokens` is (a line without a token is never cancelled)."""

    __slots__ = ("tokens",)

    def __init__(self, tokens: list[CancelToken | None]) -> None:
        super().__init__()
        self.tokens = tokens

    @property
    def cancelled(self) -> bool:
        return all(t is not None and t.cancelled for t in self.tokens)

    def raise_if_cancelled(self) -> None:
        if self.cancelled:
            raise Cancelled("every line of the batch was cancelled")


RunBatch = Callable[[list[SampleRequest], CancelToken, ProgressFn | None], list[Any]]


class CountsPreparing:
    """Counts the lines encoding their text (about to wait for the sampler): a line that finds
    others encoding does not start alone. Shared by SampleBatcher and stepping.StepScheduler."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._preparing = 0
        self._flying = 0  # lines between a piece's encoders and its last window (`line`)

    @contextmanager
    def line(self) -> Iterator[None]:
        """Count a piece in flight while its caller renders and decodes it."""
        with self._cond:
            self._flying += 1
        try:
            yield
        finally:
            with self._cond:
                self._flying -= 1
                self._cond.notify_all()

    def _prepare(self, prepare: Callable[[], SampleRequest], counted: bool = False) -> SampleRequest:
        """`prepare()`, counted as encoding meanwhile (`counted`: from before, by the caller)."""
        if not counted:
            with self._cond:
                self._preparing += 1
        try:
            return prepare()
        finally:
            with self._cond:
                self._preparing -= 1
                self._cond.notify_all()


class SampleBatcher(CountsPreparing):
    """Batches concurrent `sample` calls; `run(requests, cancel, progress)` returns one result
    per request and is called on the device owner (engine/hardware/owner.py)."""

    def __init__(
        self,
        run: RunBatch,
        max_batch: int = 1,
        *,
        max_padding: float = 0.5,
        gather_s: float = 0.25,
        fill_buckets: bool = False,
        admit_s: float = 0.0,
        admit_up_to: int = 0,
        admit_backlog: int = 0,
        admit_encoders: bool = False,
    ) -> None:
        super().__init__()
        self._run = run
        self.max_batch = max(1, int(max_batch))
        # a batch's padded frames may reach this fraction of its real ones (lines far shorter
        # than the others wait for a batch of their own: padding is computed, not free)
        self.max_padding = max_padding
        self.gather_s = gather_s  # the longest a line waits for others still encoding their text
        # the sampler fills a batch up to its bucket (CUDA graphs): a batch that would be mostly
        # fillers is cut to the bucket below, the rest sampled next (engine.batch.lines_to_take)
        self.fill_buckets = fill_buckets
        # the longest a line waits for lines in flight to join its batch while the device is busy
        self.admit_s = admit_s
        # admission waits only while fewer lines than this wait (0: up to a full batch)
        self.admit_up_to = admit_up_to
        # admission waits while the device holds more than this many of the owner's launches
        # unfinished (0: while it runs any); held back meanwhile, a batch loses no time: its launch
        # would only queue behind them
        self.admit_backlog = max(0, int(admit_backlog))
        # admission before the encoders instead of after: the lines let go together encode as one
        # call, then sample as one batch (`_hold`)
        self.admit_encoders = admit_encoders
        self._held = 0  # lines held before their encoders now, not yet let go
        self._let_go = 0  # how many times held lines were let go (every line held then goes)
        # the owner marks its launches from now on (a CUDA event each) so that `_admit` can ask
        DEVICE.track_busy = DEVICE.track_busy or (admit_s > 0 and self.max_batch > 1)
        self._waiting: list[SampleRequest] = []
        self.batches: dict[int, int] = {}  # batch size -> how many batches ran with it

    def sample(
        self, prepare: Callable[[], SampleRequest], cancel: CancelToken | None = None
    ) -> tuple[SampleRequest, Any]:
        """`prepare()` (the line's encoders, on the device owner) makes the request; then its
        result, sampled alone or with the lines waiting beside it. `cancel`: the line's token,
        seen while it is held before its encoders (`admit_encoders`; after them the request's).

        A line waits for the lines that are encoding at that moment (each takes a few
        milliseconds, at most `gather_s`), so that lines which arrived together are sampled
        together; a line alone waits for nothing."""
        req = self._prepare(prepare, counted=self.admit_encoders and self._hold(cancel))
        with self._cond:
            self._waiting.append(req)
            self._cond.notify_all()
        try:
            self._gather(req)
            if not self.admit_encoders:
                self._admit(req)
            DEVICE.run(lambda: DEVICE.launched_nothing() if req.done else self._lead(req), req.cancel)
        finally:
            with self._cond:
                if not req.taken:  # cancelled while waiting: nobody runs it
                    self._waiting.remove(req)
        if req.error is not None:
            raise req.error
        check(req.cancel)  # cancelled while in another line's batch: its rows are dropped
        return req, req.result

    def _gather(self, req: SampleRequest) -> None:
        """Wait (at most `gather_s`) until no line is encoding."""
        self._wait(req, self.gather_s, 0.01, lambda: self._preparing > 0)

    def _admit(self, req: SampleRequest) -> None:
        """Wait (at most `admit_s`, polling every 0.5 ms) while `_admits` the lines of its key that
        wait. A high-lane line (an interruption, `lanes.HIGH_LANE`) never waits: its first audio is
        the point of its lane."""
        if current_lane() == HIGH_LANE:
            return
        self._wait(
            req, self.admit_s, 0.0005, lambda: self._admits(sum(r.key == req.key for r in self._waiting))
        )

    def _admits(self, waiting: int) -> bool:
        """Admission still waits, with `waiting` lines counted: fewer than are in flight (`line`)
        and than `admit_up_to`, and the device holds more than `admit_backlog` of the owner's
        launches unfinished."""
        top = min(self.max_batch, self.admit_up_to or self.max_batch)
        return waiting < min(top, self._flying) and DEVICE.backlog_above(self.admit_backlog)

    def _hold(self, cancel: CancelToken | None) -> bool:
        """Admission before the encoders (`admit_encoders`): wait as `_admit` does, counting the
        lines held here and those waiting to sample; the first line let go (its batch full, the
        backlog down to `admit_backlog`, its `admit_s` out) lets every line held with it go, each
        counted as encoding from that moment (so that `_gather` waits for them all: they encode
        as one call and meet at the sampler). True if it counted the line so. `cancel` ends the
        hold with `Cancelled` (unless the line was let go meanwhile: then it counts as encoding,
        and its encoders' job sees the token)."""
        if current_lane() == HIGH_LANE or self.admit_s <= 0 or self.max_batch <= 1 or DEVICE.on_owner():
            return False
        deadline = time.monotonic() + self.admit_s
        with self._cond:
            round_ = self._let_go
            self._held += 1
            try:
                while self._let_go == round_:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._admits(self._held + len(self._waiting)):
                        # every line held goes to its encoders now, counted there from now on; a
                        # line let go leaves the count at once, not when its thread wakes (a line
                        # held after it must not count it again)
                        self._preparing += self._held
                        self._held = 0
                        self._let_go += 1
                        self._cond.notify_all()
                        break
                    self._cond.wait(min(left, 0.0005))
                    if self._let_go == round_:
                        check(cancel)
                return True
            finally:
                if self._let_go == round_:  # left unlet (an exception while held)
                    self._held -= 1

    def _wait(self, req: SampleRequest, seconds: float, poll: float, pending: Callable[[], bool]) -> None:
        """Wait under `_cond` while `pending()` and `req` is not taken, at most `seconds`; not on the
        owner thread (the lines it waits for would wait for it), nor with batching off."""
        if seconds <= 0 or self.max_batch <= 1 or DEVICE.on_owner():
            return
        deadline = time.monotonic() + seconds
        with self._cond:
            while not req.taken and pending():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(min(left, poll))
                check(req.cancel)

    def _pick(self, req: SampleRequest) -> list[SampleRequest]:
        """`req` and the waiting lines of its key closest to its length, while the batch's
        padding (every row padded to the longest) stays within `max_padding` of its real rows."""
        if self.max_batch <= 1:
            return [req]
        live = [
            r
            for r in self._waiting
            if r is not req and r.key == req.key and (r.cancel is None or not r.cancel.cancelled)
        ]
        live.sort(key=lambda r: abs(r.length - req.length))
        batch, longest, total = [req], req.length, req.length
        for r in live:
            if len(batch) >= self.max_batch:
                break
            top = max(longest, r.length)
            if top * (len(batch) + 1) > (1 + self.max_padding) * (total + r.length):
                continue
            batch.append(r)
            longest, total = top, total + r.length
        return batch[: lines_to_take(len(batch))] if self.fill_buckets else batch

    def _lead(self, req: SampleRequest) -> None:
        with self._cond:
            if req.cancel is not None and req.cancel.cancelled:  # cancelled just now: run nothing
                DEVICE.launched_nothing()
                return
            batch = self._pick(req)
            for r in batch:
                r.taken = True
                self._waiting.remove(r)
        self.batches[len(batch)] = self.batches.get(len(batch), 0) + 1
        progress = _fan_out([r.progress for r in batch])
        cancel = (
            req.cancel
            if len(batch) == 1 and req.cancel is not None
            else AllCancelled([r.cancel for r in batch])
        )
        try:
            results = self._run(batch, cancel, progress)
        except Cancelled as e:
            for r in batch:
                r.error, r.done = e, True
            return
        except Exception as e:
            if len(batch) == 1:
                req.error, req.done = e, True
                return
            # a batch that failed (out of memory, say) is retried line by line: each line
            # then fails or succeeds on its own, as it would have alone
            results = []
            for r in batch:
                try:
                    results.append(self._run([r], r.cancel or CancelToken(), r.progress)[0])
                except Exception as each:
                    r.error = each
                    results.append(None)
        for r, out in zip(batch, results):
            r.result, r.batch_size, r.done = out, len(batch), True
            if r.error is not None:
                r.batch_size = 1


def _fan_out(fns: list[ProgressFn | None]) -> ProgressFn | None:
    live = [f for f in fns if f is not None]
    if not live:
        return None
    if len(live) == 1:
        return live[0]

    def progress(done: int, total: int) -> None:
        for f in live:
            f(done, total)

    return progress
