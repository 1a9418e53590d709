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

Order: URGENT jobs first (a new line's encoders, sampling start and first window: first audio is
what a viewer hears), then one step of every live line, then the NORMAL jobs by when they are
due: the moment a line needs the result (a streamed window's is when its line's played audio runs
out, less a margin), or when it was asked for if that is later (a job already late queues first
come, first served). While lines are being stepped, a NORMAL job not yet due (`DUE_S`) waits for
a later round, so a line far ahead of its playback yields to new lines and to lines about to run
dry. (Running a window past its deadline before new lines' work was tried: more holes, not fewer,
benchmarks/RESULTS.md "Ninth session".)

Jobs of one kind (`run_batched`: the decode windows of one length, the text encoder) queued
together run as one call: every line that is waiting is served by one launch of a batch. A batch
that raises runs its jobs again one by one, so an error reaches only the line that caused it.

With `decode_stream` (the preset's `owner_decode_stream`) the decode's jobs run on a second CUDA
stream, wherever they run (the codec's graphs share a memory pool: they must replay in one
order): the text encoders' and the sampler's small kernels can then run beside the decoder's
wide ones instead of after them. A decode job waits there only for its own line's latent (an
event recorded after the sampling, `ready_mark`, `consume`); each stream's copies have a waiter
of their own, so a window's samples do not wait behind a later sampling's trim frame.

A queue depth (`queue_depth`, the preset's `owner_queue_depth`; 0: none) bounds how far the owner
runs ahead of the GPU: with that many of its launches unfinished there, it waits for the oldest
before taking the next job. Without a bound, under many streams the GPU is the bottleneck and the
owner, never waiting, launches each job the moment it comes: the backlog sits in the GPU's queue,
where no two lines meet in a batch and a new line's first audio queues behind every line's windows
(fifteenth session: GPU busy 87 %, the owner idle 75 %, batches of 1-8 lines). With a bound, the
backlog waits here, where jobs of one kind run as one call and URGENT ones go first.

Both threads start with work and end when idle for `linger_s`, so no thread outlives the lines.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from ...cancel import CancelToken, check
from ...lanes import HIGH_LANE, LOW_LANE, current_lane
from .cuda_device import current_cuda_device, on_cuda_device
from .host_copy import CopyWaiters, HostCopy, copy_now, queue_copy
from .lock import MODEL_LOCK

log = logging.getLogger(__name__)

T = TypeVar("T")
I = TypeVar("I")

URGENT, NORMAL = 0, 1  # a new line's encoders and first window; later windows and the rest
DECODE = "decode"  # the stream a job asks for (`run(stream=...)`) where the owner runs the decode apart
# the decode stream's CUDA priority, above the default stream's 0: at 0, 16 streams lost (0.89-0.91x;
# at -1 0.97-1.03x, 64 streams 1.07-1.17x: H100, (o), benchmarks/RESULTS.md twenty-fifth session)
DECODE_PRIORITY = -1
DUE_S = 0.02  # while lines are stepped, a NORMAL job runs once its deadline is this near


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
    priority: int = NORMAL
    deadline: float = 0.0  # time.monotonic() by which it is needed (orders the NORMAL jobs)
    high: bool = False  # a high-lane line's start: ahead of the other URGENT jobs
    key: Hashable | None = None  # jobs of one key queued together run as one call of `many`
    item: Any = None
    many: Callable[[list[Any]], list[Any]] | None = None
    limit: int = 1  # the most jobs of its key in one call
    take: Callable[[int], int] | None = None  # of n jobs of its key that could run, how many do
    result: Any = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    stream: str | None = None  # DECODE: on the owner's decode stream, where it keeps one
    device: int | None = None  # the CUDA device current where it was asked for: it runs there


class DeviceOwner:
    """The process's device thread (`DEVICE`); see the module's docstring."""

    def __init__(self, linger_s: float = 0.05, queue_depth: int = 0) -> None:
        self.linger_s = linger_s
        # the most of the owner's launches the device may hold unfinished before it waits (0: none)
        self.queue_depth = queue_depth
        self._launched: deque[Any] = deque()  # a mark (a recorded CUDA event) after each launch
        # a mark after the owner's every launch, the unfinished ones kept (`backlog_above`), once
        # a sampler with admission asked for it (`SampleBatcher.admit_s`; for the process's life)
        self.track_busy = False
        self._marks: deque[Any] = deque(maxlen=256)
        self._nothing = False  # the job running now said it launched nothing
        self._mark: Callable[[], Any] = _device_mark
        self.depth_waits = 0  # how often the owner waited for the device's queue to shorten
        self.depth_wait_s = 0.0  # and for how long (not counted in busy_s)
        self._cond = threading.Condition()
        self._urgent: deque[Job] = deque()
        self._normal: list[tuple[float, int, Job]] = []  # a heap by (when due, arrival order)
        self._seq = itertools.count()
        # those with lines in flight, by id, each with the CUDA device it runs on (in arrival order)
        self._steppers: dict[int, tuple[Stepper, int | None]] = {}
        self._thread: threading.Thread | None = None
        self._copies = CopyWaiters(linger_s)  # the copies on their way to the host, a waiter a stream
        # the waiter's copy events spin-wait in the driver (CUDA's default: a core held while a
        # copy is out); off, they block (`cudaEventBlockingSync`) and the waiter sleeps until its
        # copy lands: level in rate at 16 and 64 streams, a core given back (thirty-third and
        # thirty-sixth sessions, H100)
        self.spin_copies = False
        # a line alone's inline copy spins: blocking measured 0.87-0.94x one stream's rate and a
        # millisecond more first audio (H100, thirty-sixth session); its core is held only for
        # the line's few ms of GPU work
        self.spin_inline = True
        # the decode's jobs (`stream=DECODE`) on a CUDA stream of their own (the preset's
        # `owner_decode_stream`), at this CUDA priority (lower: the GPU serves it first)
        self.decode_stream = False
        self.decode_priority = DECODE_PRIORITY
        self._streams: dict[tuple[int, int], Any] = {}
        self.jobs_run = 0
        self.batches_run = 0  # calls of a batched kind that served more than one job
        self.batched_jobs = 0  # the jobs those calls served
        self.rounds = 0
        # the owner thread's time in rounds: its launches, plus any wait inside a job (a host
        # read a job still does, a launch blocked on a full GPU queue)
        self.busy_s = 0.0

    # ---- callers ---------------------------------------------------------------------------
    def on_owner(self) -> bool:
        """True on the owner thread, or on a thread holding the model lock (it runs inline)."""
        return threading.current_thread() is self._thread or MODEL_LOCK.held_by_me()

    def run(
        self,
        fn: Callable[[], T],
        cancel: CancelToken | None = None,
        priority: int = NORMAL,
        deadline: float | None = None,
        *,
        stream: str | None = None,
    ) -> T:
        """`fn()` on the owner thread; its result or its exception. A job not started when
        `cancel` is set is dropped with `Cancelled`. `deadline` (`time.monotonic()`): when a
        NORMAL job's result is needed (default: now). `stream=DECODE`: on the decode stream where
        the owner keeps one (`decode_stream`); the job waits there for what it reads (`consume`).

        While the owner is idle (no thread, the model lock free) the caller runs `fn` itself
        with the lock held, as a line alone always did: one line pays no hand-over between
        threads (a thread wake per job and per copy, on a line whose stages take a few ms)."""
        job: Job[T] = Job(fn, cancel, priority, time.monotonic() if deadline is None else deadline)
        job.stream = stream
        return self._submit(job)

    def run_batched(
        self,
        key: Hashable,
        item: I,
        many: Callable[[list[I]], list[T]],
        cancel: CancelToken | None = None,
        priority: int = NORMAL,
        *,
        limit: int = 8,
        deadline: float | None = None,
        take: Callable[[int], int] | None = None,
        stream: str | None = None,
    ) -> T:
        """`many([item, ...])[i]`: this job's result, computed in one call with the other jobs of
        `key` queued when the owner reaches it (at most `limit`, the URGENT ones first), by the
        first one's `many`: a key names one kind of work, whoever submits it. `many` takes the
        items in a list and returns one result each, in order. Alone (or inline) it is
        `many([item])[0]`. If a call of several raises, each job runs again alone. `take(n)`: of
        the n jobs that could go in one call, how many do (the rest wait for the next call; e.g.
        `engine.batch.lines_to_take`, where a call is filled up to a graph's bucket). `stream`: as
        `run`'s (a key's jobs all ask for one)."""
        job: Job[T] = Job(
            lambda: many([item])[0], cancel, priority, time.monotonic() if deadline is None else deadline
        )
        job.key, job.item, job.many, job.limit = key, item, many, max(1, int(limit))
        job.take, job.stream = take, stream
        return self._submit(job)

    def queued(self) -> int:
        """Jobs waiting for the owner now."""
        with self._cond:
            return len(self._urgent) + len(self._normal)

    def _submit(self, job: Job[T]) -> T:
        cancel = job.cancel
        check(cancel)
        lane = current_lane()
        if lane == HIGH_LANE and job.priority == URGENT:
            # a high line's first-audio work ahead of every other line's; the rest of its work
            # keeps its place: a high line's every job served first made holes in the other
            # Speakers' lines (RESULTS.md "Ninth session")
            job.high = True
        elif lane == LOW_LANE:  # a low line's first audio waits behind the others'
            job.priority = NORMAL
        # inline too, a decode job runs on the decode stream: the codec's graphs share one memory
        # pool and their inputs, so none may replay on another stream while that one has work
        if self.on_owner():
            with self._on_stream(job.stream):
                return job.fn()
        if self._thread is None and MODEL_LOCK.acquire(blocking=False):
            try:
                if self._thread is None:  # else the owner started meanwhile: queue behind it
                    import torch

                    with torch.inference_mode(), self._on_stream(job.stream):
                        return job.fn()
            finally:
                MODEL_LOCK.release()
        job.device = current_cuda_device()  # queued: the owner runs it on this (the model's) device
        with self._cond:
            if job.high:  # after the high jobs queued before it, before every other one
                at = next((i for i, j in enumerate(self._urgent) if not j.high), len(self._urgent))
                self._urgent.insert(at, job)
            elif job.priority == URGENT:
                self._urgent.append(job)
            else:
                # when it is needed, but never before it was asked for: a job past its deadline
                # queues by arrival (under overload the order stays first come, first served
                # rather than serving the line most behind at the cost of all the others)
                due = max(job.deadline, time.monotonic())
                heapq.heappush(self._normal, (due, next(self._seq), job))
            self._start()
            self._cond.notify_all()
        if cancel is None:
            job.done.wait()
        else:  # a cancel takes the job out of its queue at once (not polled: 100 wakes a second
            # a waiting line, each for the GIL, cost 2-4 % of 64 streams' rate on the CPU)
            with cancel.waking(lambda: self._drop(job)):
                if cancel.cancelled:
                    self._drop(job)
                job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    def _drop(self, job: Job) -> None:
        """A cancelled job still queued ends now with `Cancelled` (one running finishes)."""
        with self._cond:
            if self._take(job):
                self._dropped(job)

    def _take(self, job: Job) -> bool:
        """Take `job` out of its queue (under `_cond`); False if it is not queued (running, done)."""
        if job in self._urgent:
            self._urgent.remove(job)
            return True
        for i, entry in enumerate(self._normal):
            if entry[2] is job:
                self._normal[i] = self._normal[-1]
                self._normal.pop()
                heapq.heapify(self._normal)
                return True
        return False

    def wake(self, stepper: Stepper) -> None:
        """`stepper` has new work (a line handed over): the owner steps it till it has none, on
        the CUDA device current here."""
        with self._cond:
            self._steppers[id(stepper)] = (stepper, current_cuda_device())
            self._start()
            self._cond.notify_all()

    # ---- from jobs -------------------------------------------------------------------------
    def to_host(self, tensor: Any) -> HostCopy:
        """Copy a device tensor to the host (called in a job): on the owner thread without
        waiting (`HostCopy.pending`); inline (a line alone) at once, as before."""
        return self._to_host(tensor, lambda host: [host])[0]

    def to_host_rows(self, rows: Any, spans: list[tuple[int, int]]) -> list[HostCopy]:
        """Row i's [start, stop) of a device tensor each on its way to the host (called in a
        job), as `to_host` but in one copy: one pinned buffer and one event for them all, where a
        `to_host` a row would make one of each (a batch of decode windows)."""
        return self._to_host(rows, lambda host: [host[i, a:b] for i, (a, b) in enumerate(spans)])

    def _to_host(self, tensor: Any, parts: Callable[[Any], list[Any]]) -> list[HostCopy]:
        if tensor.device.type != "cuda" or threading.current_thread() is not self._thread:
            return [HostCopy(part) for part in parts(copy_now(tensor, self.spin_inline))]
        host, event, stream = queue_copy(tensor, self.spin_copies)
        copies = [HostCopy(part, event) for part in parts(host)]
        for copy in copies:  # one event: each lands once the one copy has
            self._copies.add(copy, stream.cuda_stream)
        return copies

    def ready_mark(self, tensor: Any) -> Any:
        """Called in a job after it launched `tensor`, which a decode job will read: a CUDA event
        after it on its device's stream, where the owner keeps a decode stream (else None)."""
        return _device_mark(tensor.device) if self.decode_stream and tensor.device.type == "cuda" else None

    def consume(self, tensor: Any, ready: Any) -> None:
        """In a decode job, before it reads `tensor`, made on another stream maybe (a latent: the
        default stream; a line's decoder input: inline or on the decode stream): wait here for
        `ready` (`ready_mark`, recorded after it was made; None: for all the default stream's work
        so far), and keep its memory from other use until this stream has read it."""
        if not self.decode_stream or tensor.device.type != "cuda":
            return
        import torch

        here = torch.cuda.current_stream(tensor.device)
        if ready is not None:
            here.wait_event(ready)  # free where it was made here or has finished
        elif here != torch.cuda.default_stream(tensor.device):
            here.wait_stream(torch.cuda.default_stream(tensor.device))
        tensor.record_stream(here)

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
        return bool(self._urgent or self._normal or any(s.has_work() for s, _ in self._steppers.values()))

    def _own(self) -> None:
        import torch  # here, not at the top: the runtime side imports this package torch-free

        from ..encoders import no_device_reads

        try:
            while True:
                with self._cond:
                    if not self._busy():
                        self._cond.wait(self.linger_s)
                        if not self._busy():
                            self._thread = None
                            return
                with MODEL_LOCK, torch.inference_mode(), no_device_reads():
                    t0, waited = time.perf_counter(), self.depth_wait_s
                    self._round()
                    self.busy_s += time.perf_counter() - t0 - (self.depth_wait_s - waited)
                    self.rounds += 1
        except BaseException as e:  # a bug past every job's own handling: nothing may hang on it
            log.exception("the device owner failed; its queued lines fail with it")
            with self._cond:
                jobs = [*self._urgent, *(job for _, _, job in self._normal)]
                self._urgent.clear()
                self._normal.clear()
                steppers, self._steppers = [s for s, _ in self._steppers.values()], {}
                self._thread = None
            for job in jobs:
                job.error = e
                job.done.set()
            for stepper in steppers:
                stepper.fail(e)

    def _round(self) -> None:
        """Urgent jobs, one step of every stepper, then the NORMAL jobs queued before the step
        by when due (while lines are stepped, only those due)."""
        while True:
            self._room()
            if (job := self._pop_urgent()) is None:
                break
            self._launch(job)
        stepping = False
        for stepper, device in list(self._steppers.values()):
            if stepper.has_work():
                stepping = True
                self._room()
                with on_cuda_device(device):
                    try:
                        stepper.iterate()
                    except Exception as e:  # its lines fail, the owner and other lines go on
                        log.exception("a step failed past its own handling")
                        stepper.fail(e)
                    self._note_launch(True)
        with self._cond:  # one step of work left no trace: forget it (no reference kept)
            self._steppers = {k: v for k, v in self._steppers.items() if v[0].has_work()}
            n = len(self._normal)
        for _ in range(n):
            self._room()
            job = self._pop_urgent() or self._pop_normal(due_only=stepping)
            if job is None:
                break
            self._launch(job)

    def _launch(self, job: Job) -> None:
        """Run `job` (with its batch) on its device and stream, and mark its end there."""
        with on_cuda_device(job.device), self._on_stream(job.stream):
            self._note_launch(self._do(job))

    def _on_stream(self, name: str | None) -> Any:
        """The decode stream, made current, for a job that asks for it while the owner keeps one
        on CUDA (a CPU model's job runs as any other): the current CUDA device's, which is the
        job's model's (`_launch`, the Synthesizer's `on_cuda_device`), one stream a device."""
        if name is None or not self.decode_stream:
            return contextlib.nullcontext()
        import torch

        if not torch.cuda.is_initialized():
            return contextlib.nullcontext()
        key = (torch.cuda.current_device(), self.decode_priority)
        if (stream := self._streams.get(key)) is None:
            stream = self._streams[key] = torch.cuda.Stream(priority=self.decode_priority)
        return torch.cuda.stream(stream)

    def _room(self) -> None:
        """With a queue depth, wait until fewer than `queue_depth` of the owner's launches are
        unfinished on the device (the jobs that arrive meanwhile queue here, where they batch and
        URGENT ones go first)."""
        if self.queue_depth <= 0:
            return
        launched = self._launched
        while launched and _finished(launched[0]):
            launched.popleft()
        if len(launched) >= self.queue_depth:
            t0 = time.perf_counter()
            while len(launched) >= self.queue_depth:
                mark = launched.popleft()
                try:
                    mark.synchronize()
                except Exception:  # a device error: the line whose copy fails raises it
                    log.debug("waiting for a launch failed", exc_info=True)
            self.depth_waits += 1
            self.depth_wait_s += time.perf_counter() - t0

    def _note_launch(self, ran: bool) -> None:
        """Mark the end of what the owner just launched (with a queue depth or `track_busy`; on
        CUDA), unless the job ran nothing or said it launched nothing (`launched_nothing`)."""
        nothing, self._nothing = self._nothing, False
        if not ran or nothing or (self.queue_depth <= 0 and not self.track_busy):
            return
        if (mark := self._mark()) is not None:
            if self.track_busy:
                marks = self._marks
                while marks and _finished(marks[0]):  # they finish in launch order (one stream)
                    marks.popleft()
                marks.append(mark)
            if self.queue_depth > 0:
                self._launched.append(mark)

    def backlog_above(self, n: int) -> bool:
        """Whether the device holds more than `n` of the owner's launches unfinished (CUDA, with
        `track_busy` on; elsewhere a job's work is done when it returns: False). One query, however
        deep the queue: one stream finishes them in launch order, so the (n + 1)-th newest is
        unfinished only if all after it are (with the decode stream, roughly: lines waiting for
        admission ask every 0.5 ms)."""
        try:
            mark = self._marks[-1 - n]
        except IndexError:  # fewer kept (or one let go meanwhile by the owner thread)
            return False
        return not _finished(mark)

    def launched_nothing(self) -> None:
        """Called by a job that found nothing to launch (a line sampled meanwhile in another
        line's batch): it takes no place in the queue depth (a mark after it would end with the
        work before it and make the owner wait for that with the GPU's queue one job short)."""
        if threading.current_thread() is self._thread:
            self._nothing = True

    def _pop_urgent(self) -> Job | None:
        with self._cond:
            return self._urgent.popleft() if self._urgent else None

    def _pop_normal(self, due_only: bool) -> Job | None:
        with self._cond:
            if not self._normal or (due_only and self._normal[0][0] > time.monotonic() + DUE_S):
                return None
            return heapq.heappop(self._normal)[2]

    def _batch_of(self, job: Job) -> list[Job]:
        """`job` and the queued jobs of its key (URGENT ones first, then by deadline), at most its
        limit; those taken leave their queues."""
        batch = [job]
        if job.key is None or job.limit <= 1:
            return batch
        with self._cond:
            normal = sorted(e for e in self._normal if e[2].key == job.key)  # by (due, arrival)
            same = [j for j in self._urgent if j.key == job.key] + [j for _, _, j in normal]
            n = 1 + len(same[: job.limit - 1])
            if job.take is not None:
                n = max(1, min(n, job.take(n)))
            for other in same[: n - 1]:
                self._take(other)
                batch.append(other)
        return batch

    def _do(self, job: Job) -> bool:
        """Run `job` (with its batch); False if nothing ran (every job cancelled before it started)."""
        self._nothing = False
        batch = [j for j in self._batch_of(job) if not self._dropped(j)]
        if len(batch) > 1:
            assert job.many is not None
            try:
                results = job.many([j.item for j in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"a batch of {len(batch)} gave {len(results)} results")
            except Exception:  # find the job at fault: each again alone, each its own outcome
                log.debug("a batch of %d raised; its jobs run one by one", len(batch), exc_info=True)
                for j in batch:
                    self._do_one(j)
                return True
            self.batches_run += 1
            self.batched_jobs += len(batch)
            self.jobs_run += len(batch)
            for j, result in zip(batch, results):
                j.result = result
                j.done.set()
        elif batch:
            self._do_one(batch[0])
        return bool(batch)

    @staticmethod
    def _dropped(job: Job) -> bool:
        """A job cancelled before it started: it ends with `Cancelled`, unrun."""
        try:
            check(job.cancel)
        except BaseException as e:
            job.error = e
            job.done.set()
            return True
        return False

    def _do_one(self, job: Job) -> None:
        try:
            check(job.cancel)
            job.result = job.fn()
        except BaseException as e:  # the caller re-raises it; the owner goes on
            job.error = e
        self.jobs_run += 1
        job.done.set()


def _device_mark(device: Any = None) -> Any:
    """A CUDA event recorded on the current stream (of `device`, default the current device), or
    None where CUDA is not in use (nothing queued: a CPU job's work is done when it returns)."""
    import torch

    if not torch.cuda.is_initialized():
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def _finished(mark: Any) -> bool:
    try:
        return bool(mark.query())
    except Exception:  # a device error: forget the mark (the line's own copy raises it)
        return True


DEVICE = DeviceOwner()
