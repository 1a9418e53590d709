"""One thread owns the device when lines meet: their model work runs on it, in order.

Line threads (Speakers, the server's requests, prebuild) hand the owner a job (a closure that
launches work and reads nothing back from the device) and wait for its result; a line alone (the
owner idle, the lock free) runs its job itself with the lock held, as before the owner. Between
jobs the owner runs one step of every live line (`Stepper`s: the step scheduler of
synthesis/stepping.py), so a line's job waits at most one step. The owner holds `MODEL_LOCK`
while it works (loading weights, prewarm and captures still take the lock and exclude it), and
runs a job inline when its caller already holds the lock (prewarm, a job calling a helper that
submits another).

A result the host must read (a decode window's samples, a trim position) is copied with
`to_host`: the copy is queued behind the work that makes it and a second thread
("irodori-device-done") waits for those copies in launch order and wakes each line as its copy
lands. So the owner never waits for the GPU and the GPU never waits for the host (issue 27: every
host sync under the model lock left the GPU idle while a line's thread woke and launched the next
stage). On the CPU and MPS a job's work is done when it returns; MPS's rule (one thread at a time
on its command buffers) is kept: the owner, or a lone line, holds the model lock.

Both threads start with work and end when idle for `linger_s`, so no thread outlives the lines.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from ...cancel import CancelToken, check
from .lock import MODEL_LOCK

log = logging.getLogger(__name__)

T = TypeVar("T")

URGENT, NORMAL = 0, 1  # a new line's encoders and first window; later windows and the rest


class Stepper(Protocol):
    """Work the owner runs between jobs: one step of every live line."""

    def has_work(self) -> bool: ...

    def iterate(self) -> None: ...

    def fail(self, error: BaseException) -> None:
        """An iteration raised past its own handling: end every line it holds with `error`."""


@dataclass(eq=False)
class Job(Generic[T]):
    fn: Callable[[], T]
    cancel: CancelToken | None = None
    result: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class HostCopy:
    """A tensor on its way to the host: `wait()` returns it once its copy has landed."""

    __slots__ = ("_event", "_ready", "error", "tensor")

    def __init__(self, tensor: Any, event: Any = None) -> None:
        self.tensor = tensor
        self.error: BaseException | None = None  # the wait for it failed (a device error)
        self._event = event  # a CUDA event recorded after the copy, or None (already there)
        self._ready = threading.Event()
        if event is None:
            self._ready.set()

    @property
    def pending(self) -> bool:
        """Still on its way (a copy the owner queued without waiting)."""
        return not self._ready.is_set()

    def wait(self, cancel: CancelToken | None = None) -> Any:
        while not self._ready.wait(0.01):
            check(cancel)
        if self.error is not None:
            raise self.error
        return self.tensor


class DeviceOwner:
    """The process's device thread (`DEVICE`); see the module's docstring."""

    def __init__(self, linger_s: float = 0.05) -> None:
        self.linger_s = linger_s
        self._cond = threading.Condition()
        self._jobs: tuple[deque[Job], deque[Job]] = (deque(), deque())
        self._steppers: list[Stepper] = []  # those with lines in flight
        self._thread: threading.Thread | None = None
        self._copies: deque[HostCopy] = deque()
        self._waiter: threading.Thread | None = None
        self.jobs_run = 0
        self.rounds = 0
        # the owner thread's time in rounds: its launches, plus any wait inside a job (a host
        # read a job still does, a launch blocked on a full GPU queue)
        self.busy_s = 0.0

    # ---- callers ---------------------------------------------------------------------------
    def on_owner(self) -> bool:
        """True on the owner thread, or on a thread holding the model lock (it runs inline)."""
        return threading.current_thread() is self._thread or MODEL_LOCK.held_by_me()

    def run(self, fn: Callable[[], T], cancel: CancelToken | None = None, priority: int = NORMAL) -> T:
        """`fn()` on the owner thread; its result or its exception. A job not started when
        `cancel` is set is dropped with `Cancelled`.

        While the owner is idle (no thread, the model lock free) the caller runs `fn` itself
        with the lock held, as a line alone always did: one line pays no hand-over between
        threads (a thread wake per job and per copy, on a line whose stages take a few ms)."""
        check(cancel)
        if self.on_owner():
            return fn()
        if self._thread is None and MODEL_LOCK.acquire(blocking=False):
            try:
                if self._thread is None:  # else the owner started meanwhile: queue behind it
                    import torch

                    with torch.inference_mode():
                        return fn()
            finally:
                MODEL_LOCK.release()
        job: Job[T] = Job(fn, cancel)
        with self._cond:
            self._jobs[priority].append(job)
            self._start()
            self._cond.notify_all()
        while not job.done.wait(0.01):
            if cancel is not None and cancel.cancelled:
                with self._cond:
                    if job in self._jobs[priority]:
                        self._jobs[priority].remove(job)
                        check(cancel)
        if job.error is not None:
            raise job.error
        return job.result

    def wake(self, stepper: Stepper) -> None:
        """`stepper` has new work (a line handed over): the owner steps it till it has none."""
        with self._cond:
            if stepper not in self._steppers:
                self._steppers.append(stepper)
            self._start()
            self._cond.notify_all()

    # ---- from jobs -------------------------------------------------------------------------
    def to_host(self, tensor: Any) -> HostCopy:
        """Copy a device tensor to the host (called in a job): on the owner thread without
        waiting (`HostCopy.pending`); inline (a line alone) at once, as before."""
        if tensor.device.type != "cuda" or threading.current_thread() is not self._thread:
            return HostCopy(tensor.cpu())
        import torch

        host = tensor.to("cpu", non_blocking=True)  # pinned, filled when the stream gets there
        event = torch.cuda.Event()
        event.record()
        copy = HostCopy(host, event)
        with self._cond:
            self._copies.append(copy)
            if self._waiter is None:
                self._waiter = threading.Thread(
                    target=self._wait_copies, name="irodori-device-done", daemon=True
                )
                self._waiter.start()
            self._cond.notify_all()
        return copy

    def upload(self, tensor: Any, device: Any) -> Any:
        """A host tensor on `device` (called in a job): on the owner thread through pinned memory
        without waiting, so the copy queues behind the work before it instead of draining the GPU."""
        cuda = getattr(device, "type", str(device)) == "cuda"
        if not cuda or tensor.device.type != "cpu" or threading.current_thread() is not self._thread:
            return tensor.to(device)
        return tensor.pin_memory().to(device, non_blocking=True)

    # ---- the owner thread ------------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._own, name="irodori-device", daemon=True)
            self._thread.start()

    def _busy(self) -> bool:
        return bool(self._jobs[0] or self._jobs[1] or any(s.has_work() for s in self._steppers))

    def _own(self) -> None:
        import torch  # here, not at the top: the runtime side imports this package torch-free

        try:
            while True:
                with self._cond:
                    if not self._busy():
                        self._cond.wait(self.linger_s)
                        if not self._busy():
                            self._thread = None
                            return
                with MODEL_LOCK, torch.inference_mode():
                    t0 = time.perf_counter()
                    self._round()
                    self.busy_s += time.perf_counter() - t0
                    self.rounds += 1
        except BaseException as e:  # a bug past every job's own handling: nothing may hang on it
            log.exception("the device owner failed; its queued lines fail with it")
            with self._cond:
                jobs = [*self._jobs[URGENT], *self._jobs[NORMAL]]
                self._jobs[URGENT].clear()
                self._jobs[NORMAL].clear()
                steppers, self._steppers = self._steppers, []
                self._thread = None
            for job in jobs:
                job.error = e
                job.done.set()
            for stepper in steppers:
                stepper.fail(e)

    def _round(self) -> None:
        """Urgent jobs, one step of every stepper, the other jobs queued before the step."""
        while (job := self._pop(URGENT)) is not None:
            self._do(job)
        for stepper in list(self._steppers):
            if stepper.has_work():
                try:
                    stepper.iterate()
                except Exception as e:  # its lines fail, the owner and other lines go on
                    log.exception("a step failed past its own handling")
                    stepper.fail(e)
        with self._cond:  # one step of work left no trace: forget it (no reference kept)
            self._steppers = [s for s in self._steppers if s.has_work()]
        with self._cond:
            n = len(self._jobs[NORMAL])
        for _ in range(n):
            if (job := self._pop(URGENT)) is not None or (job := self._pop(NORMAL)) is not None:
                self._do(job)

    def _pop(self, priority: int) -> Job | None:
        with self._cond:
            return self._jobs[priority].popleft() if self._jobs[priority] else None

    def _do(self, job: Job) -> None:
        try:
            check(job.cancel)
            job.result = job.fn()
        except BaseException as e:  # the caller re-raises it; the owner goes on
            job.error = e
        self.jobs_run += 1
        job.done.set()

    def _wait_copies(self) -> None:
        """Wait for the copies in launch order (one stream: they land in that order)."""
        while True:
            with self._cond:
                if not self._copies:
                    self._cond.wait(self.linger_s)
                    if not self._copies:
                        self._waiter = None
                        return
                copy = self._copies.popleft()
            try:
                copy._event.synchronize()
            except Exception as e:  # a device error: the line that waits for it raises it
                copy.error = e
            copy._ready.set()


DEVICE = DeviceOwner()
