"""Capturing a CUDA graph after a warm-up run: the one way the sampler and the codec do it.

The warm-up runs first, on a side stream, so that first-call work (cuBLAS handles and workspaces,
cuDNN algorithm choice, Triton autotune, the int4 kernel chooser) stays out of the capture. The
side stream is one per device for the whole process: cuBLAS keeps a workspace (32 MiB on an H200)
for every (handle, stream) pair it has seen, for the life of the process, and a fresh
`torch.cuda.Stream()` per capture cycles through PyTorch's pool of 32 streams. Prewarm's 38
captures left 29 such workspaces, 928 MiB, that no Python object held and no deleted Synthesizer
gave back (benchmarks/RESULTS.md, "Memory by phase").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["capture", "warmup_stream"]

_streams: dict[int, torch.cuda.Stream] = {}
_lock = threading.Lock()


def warmup_stream() -> torch.cuda.Stream:
    """The process's one warm-up stream on the current CUDA device (the one a capture runs on)."""
    index = torch.cuda.current_device()
    with _lock:
        stream = _streams.get(index)
        if stream is None:
            stream = _streams[index] = torch.cuda.Stream(device=index)
        return stream


def capture(
    fn: Callable[..., Any], static: Sequence[Any], pool: Any, *, warm: Sequence[Any] | None = None
) -> tuple[torch.cuda.CUDAGraph, Any]:
    """`fn(*warm)` (default `static`) once on the warm-up stream, then `fn(*static)` captured into
    a graph whose memory comes from `pool`; returns the graph and the captured output."""
    side = warmup_stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*(static if warm is None else warm))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn(*static)
    return graph, out
