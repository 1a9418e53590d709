"""A tensor on its way from the device to the host (`HostCopy`), made by `DeviceOwner.to_host`.

The owner queues the copy behind the work that makes it and records an event after it; a waiter
thread (`CopyWaiters`, one a CUDA stream) sees it land and wakes whoever waits (`wait`). The event
blocks (`DeviceOwner.spin_copies` off): the waiter sleeps in the driver while its copy is out,
where CUDA's default spin held a host core for as long as the GPU worked (most of the wall under
load, on a machine the card shares with OBS and an LLM). A line alone copies inline (`copy_now`),
spinning (`DeviceOwner.spin_inline`: its wait is the line's few ms on the GPU, and a blocking wake
cost one stream 6-13 % of its rate).
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from ...cancel import CancelToken, check


class HostCopy:
    """A tensor on its way to the host: `wait()` returns it once its copy has landed."""

    __slots__ = ("_cv", "_event", "_landed", "error", "tensor")

    def __init__(self, tensor: Any, event: Any = None) -> None:
        self.tensor = tensor
        self.error: BaseException | None = None  # the wait for it failed (a device error)
        self._event = event  # a CUDA event recorded after the copy, or None (already there)
        self._landed = event is None
        self._cv = threading.Condition()  # the landing, or a cancel, wakes `wait`

    def _land(self, error: BaseException | None = None) -> None:
        """Mark it landed (or failed: the line that waits for it raises `error`)."""
        with self._cv:
            self.error = error
            self._landed = True
            self._cv.notify_all()

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    @property
    def pending(self) -> bool:
        """Still on its way (a copy the owner queued without waiting)."""
        return not self._landed

    def wait(self, cancel: CancelToken | None = None) -> Any:
        """The tensor once landed; `Cancelled` at once if `cancel` is set while it is still on its
        way (woken by the cancel, not polled)."""
        if not self._landed:
            with self._cv:
                if cancel is None:
                    self._cv.wait_for(lambda: self._landed)
                else:
                    with cancel.waking(self._wake):
                        self._cv.wait_for(lambda: self._landed or cancel.cancelled)
            if not self._landed:
                check(cancel)
        if self.error is not None:
            raise self.error
        return self.tensor


def queue_copy(tensor: Any, spin: bool) -> tuple[Any, Any, Any]:
    """Queue a CUDA tensor's copy to the host behind the work that makes it: the host tensor
    (pinned, filled when its stream gets there), an event recorded after it, which blocks
    (`cudaEventBlockingSync`) unless `spin`, and the stream it is on."""
    import torch

    stream = torch.cuda.current_stream(tensor.device)  # its device's (not the current device's)
    host = tensor.to("cpu", non_blocking=True)
    event = torch.cuda.Event(blocking=not spin)
    event.record(stream)
    return host, event, stream


def copy_now(tensor: Any, spin: bool) -> Any:
    """`tensor` on the host at once (a line alone, inline). A CUDA copy waits on a blocking event
    unless `spin`: `.cpu()` waits in the driver's spin, a core held while the GPU finishes the
    line's work (the stage before the copy is most of a one-stream line's wall)."""
    if spin or tensor.device.type != "cuda":
        return tensor.cpu()
    host, event, _ = queue_copy(tensor, spin=False)
    event.synchronize()
    return host


class CopyWaiters:
    """The copies on their way to the host: a queue and a waiter thread ("irodori-device-done") a
    CUDA stream. Copies of one stream land in launch order (the stream runs them in that order);
    those of another stream do not wait behind them. A waiter ends once idle for `linger_s`."""

    def __init__(self, linger_s: float) -> None:
        self.linger_s = linger_s
        self._cond = threading.Condition()
        self._copies: dict[int, deque[HostCopy]] = {}
        self._waiters: dict[int, threading.Thread] = {}

    def add(self, copy: HostCopy, stream: int) -> None:
        """Wait for `copy` (made on `stream`, its event recorded after it) with that stream's waiter."""
        with self._cond:
            self._copies.setdefault(stream, deque()).append(copy)
            if stream not in self._waiters:
                waiter = threading.Thread(
                    target=self._wait, args=(stream,), name="irodori-device-done", daemon=True
                )
                self._waiters[stream] = waiter
                waiter.start()
            self._cond.notify_all()

    def _wait(self, stream: int) -> None:
        copies = self._copies[stream]
        while True:
            with self._cond:
                if not copies:
                    self._cond.wait(self.linger_s)
                    if not copies:
                        del self._waiters[stream]
                        return
                copy = copies.popleft()
            error = None
            try:
                copy._event.synchronize()
            except Exception as e:  # a device error: the line that waits for it raises it
                error = e
            copy._land(error)
