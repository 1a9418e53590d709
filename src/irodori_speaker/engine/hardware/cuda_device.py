"""Which CUDA device a thread's work goes to, for a model on another one than cuda:0.

PyTorch's ops follow their tensors' device, but three things follow the calling thread's
*current* device instead: Triton's launches (the fused kernels), a CUDA graph's capture and replay
(on the current device's current stream), and `torch.cuda.current_stream()` without an argument
(the owner's decode stream and its marks). A thread's current device is cuda:0 unless set, so a
model on cuda:1 would launch its kernels on the wrong GPU. The Synthesizer runs its work inside its
device (`on_cuda_device`, `steps_on_device`: a stream's every resumption, whichever thread
resumes it), and the device owner runs each job and step on the device that was current where it
was asked for (`current_cuda_device`). A model on the CPU or MPS changes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["current_cuda_device", "on_cuda_device", "steps_on_device"]


def current_cuda_device() -> int | None:
    """The calling thread's current CUDA device, where CUDA is in use (else None)."""
    import torch

    return torch.cuda.current_device() if torch.cuda.is_initialized() else None


def on_cuda_device(device: Any) -> Any:
    """A context in which `device` (a CUDA torch.device or index) is current; anything else
    (None, the CPU, MPS): nothing changes."""
    import torch

    if device is None or (isinstance(device, torch.device) and device.type != "cuda"):
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def steps_on_device(device: Any, steps: Iterator[T]) -> Iterator[T]:
    """`steps` with `device` current while each step runs (a generator resumes in whichever thread
    asks for its next item; the thread's own device is back between steps)."""
    import torch

    if not (isinstance(device, torch.device) and device.type == "cuda"):
        return steps
    return _on_device(device, steps)


def _on_device(device: Any, steps: Iterator[T]) -> Iterator[T]:
    try:
        while True:
            with on_cuda_device(device):
                try:
                    item = next(steps)
                except StopIteration:
                    return
            yield item
    finally:  # closed early (a stream dropped, cancelled): its own clean-up on the device too
        close = getattr(steps, "close", None)
        if close is not None:
            with on_cuda_device(device):
                close()
