"""Capturing a CUDA graph after a warm-up run: the one way the sampler and the codec do it.

The warm-up runs first, on a side stream, so that first-call work (cuBLAS handles and workspaces,
cuDNN algorithm choice, Triton autotune, the int4 kernel chooser) stays out of the capture. The
side stream is one per device (and replay stream, below) for the whole process: cuBLAS keeps a
workspace (32 MiB on an H200) for every (handle, stream) pair it has seen, for the life of the
process, and a fresh `torch.cuda.Stream()` per capture cycles through PyTorch's pool of 32
streams. Prewarm's 38 captures left 29 such workspaces, 928 MiB, that no Python object held and
no deleted Synthesizer gave back (benchmarks/RESULTS.md, "Memory by phase"). The int4 chooser
times its candidates on this stream too (`w4a16_chooser._graph_ms`).

A graph is captured on that same stream, so the workspace it bakes in is the warm-up's, made
outside any capture. Every graph captured on one stream shares that workspace
(pytorch/pytorch#193402 describes the keying): two such graphs must never replay at once. Where
the device owner keeps a decode stream (`owner_decode_stream`), the codec's graphs replay there
beside the sampler's and the text encoders' on the default one, so they are captured on a stream
of their own (`capture(..., replay="decode")`). When all were captured on one stream, mode (e) at
16 streams with the decode stream stalled for good on an H100; the same tree with cuBLAS given no
workspace ran, and so does this one (benchmarks/RESULTS.md, thirtieth session).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["capture", "warmup_stream"]

_streams: dict[tuple[int, str], torch.cuda.Stream] = {}
_lock = threading.Lock()


def warmup_stream(replay: str = "default") -> torch.cuda.Stream:
    """The process's warm-up and capture stream on the current CUDA device for graphs that replay
    on the `replay` stream ("default", or the owner's "decode")."""
    key = (torch.cuda.current_device(), replay)
    with _lock:
        stream = _streams.get(key)
        if stream is None:
            stream = _streams[key] = torch.cuda.Stream(device=key[0])
        return stream


def capture(
    fn: Callable[..., Any],
    static: Sequence[Any],
    pool: Any,
    *,
    warm: Sequence[Any] | None = None,
    replay: str = "default",
) -> tuple[torch.cuda.CUDAGraph, Any]:
    """`fn(*warm)` (default `static`) once on the warm-up stream, then `fn(*static)` captured on
    it into a graph whose memory comes from `pool`; returns the graph and the captured output.
    `replay`: the stream the graph will replay on; graphs that may replay at the same time (the
    decode stream's beside the default one's) need different ones."""
    side = warmup_stream(replay)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*(static if warm is None else warm))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=side):
        out = fn(*static)
    return graph, out
