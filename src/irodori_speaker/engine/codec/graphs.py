"""CUDA graphs of window decodes: capture one, and the cache of which window shapes get one.

`GraphCache` holds the policy (prewarmed shapes pinned, others captured on their n-th use, LRU
eviction) and knows nothing of CUDA: `capture` is given to it (tests pass a fake on the CPU).
`capture_graph` is the CUDA part. `DACVAE.use_graphs` / `prewarm_graphs` switch them on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from ...errors import InputError
from ..cuda_graphs import capture

__all__ = ["GraphCache", "WindowGraph", "capture_graph"]

# (batch, window frames, left, right): left / right, the frames at each end that only give context
# (`streaming.window_crop`), which a cropped decode does not carry through the deeper blocks
GraphKey = tuple[int, int, int, int]
Crop = tuple[int, int]
MAX_TRACKED_SHAPES = 64  # ungraphed shapes whose uses are counted (the oldest are forgotten)


class WindowGraph:
    """One captured window decode; its output buffer is overwritten by its next replay."""

    def __init__(self, graph: Any, static_in: Tensor, static_out: Tensor, keep: tuple[Tensor, ...]) -> None:
        self.graph = graph
        self.static_in = static_in
        self.static_out = static_out
        self._keep = keep  # the weights a replay reads: alive as long as the graph, even if modules change

    def __call__(self, z: Tensor) -> Tensor:
        self.static_in.copy_(z)
        self.graph.replay()
        return self.static_out


def capture_graph(
    decode: Callable[[Tensor], Tensor], static_in: Tensor, pool: Any, keep: tuple[Tensor, ...]
) -> WindowGraph:
    """Capture `decode(static_in)` into a CUDA graph (memory from `pool`), after a warm-up run.

    The warm-up (cuDNN algorithm choice, cuBLAS handles) stays out of the capture
    (`engine.cuda_graphs.capture`), on the decode stream's capture stream: a window's graph may
    replay there beside the sampler's. `keep`: the tensors a replay reads (the weights).
    """
    graph, static_out = capture(decode, [static_in], pool, replay="decode")
    return WindowGraph(graph, static_in, static_out, keep)


class GraphCache:
    """Which window shapes get a graph, and the graphs (LRU); CUDA lives only in `capture`.

    `capture(key)` returns a runner `run(z) -> audio` whose result stays valid
    until the next replay (the caller copies it out). All graphs share one
    memory pool: they replay one at a time and each output is copied out before
    the next replay, so the pool holds about one window decode's activations.
    Prewarmed keys are pinned: lazily captured graphs never evict them.
    """

    def __init__(
        self,
        capture: Callable[[GraphKey], Callable[[Tensor], Tensor]],
        max_graphs: int,
        *,
        capture_on_use: int | None = 2,
        max_frames: int = 128,
        device_types: tuple[str, ...] = ("cuda",),
    ) -> None:
        self.capture = capture
        self.max_graphs = max_graphs
        self.capture_on_use = capture_on_use
        self.max_frames = max_frames
        self.device_types = device_types
        self.captures = 0  # graphs captured so far, evicted ones included
        self._graphs: OrderedDict[GraphKey, Callable[[Tensor], Tensor]] = OrderedDict()
        self._pinned: set[GraphKey] = set()
        self._uses: OrderedDict[GraphKey, int] = OrderedDict()  # eager decodes of ungraphed shapes

    def applies_to(self, device: torch.device) -> bool:
        return device.type in self.device_types

    def keys(self) -> list[GraphKey]:
        return list(self._graphs)

    def clear(self) -> None:
        self._graphs.clear()
        self._pinned.clear()
        self._uses.clear()

    def prewarm(self, keys: Iterable[GraphKey]) -> int:
        """Capture (if missing) and pin these keys; returns how many were captured."""
        new = [k for k in dict.fromkeys(keys) if k not in self._pinned]
        if len(self._pinned) + len(new) > self.max_graphs:
            raise InputError(
                f"prewarming {len(self._pinned) + len(new)} window shapes, more than "
                f"max_graphs={self.max_graphs} (see use_graphs)"
            )
        captured = 0
        for key in new:
            self._pinned.add(key)
            if key in self._graphs:
                self._graphs.move_to_end(key)
            else:
                self._add(key)
                captured += 1
        return captured

    def held(self, key: GraphKey) -> Callable[[Tensor], Tensor] | None:
        """The graph held for `key` (batch, frames, left, right), or None; never captures."""
        run = self._graphs.get(key)
        if run is not None:
            self._graphs.move_to_end(key)
        return run

    def held_within(
        self, batch: int, frames: int, crop: Crop
    ) -> tuple[Callable[[Tensor], Tensor], Crop] | None:
        """A held graph whose window keeps at least what `crop` keeps (the same crop, or one that
        crops one side or neither) and its crop, or None; never captures."""
        left, right = crop
        for c in dict.fromkeys([(left, right), (left, 0), (0, right), (0, 0)]):
            run = self.held((batch, frames, *c))
            if run is not None:
                return run, c
        return None

    def runner(self, z: Tensor, crop: Crop = (0, 0)) -> Callable[[Tensor], Tensor] | None:
        """The graph for `z`'s shape and `crop`, captured now if the policy says so; None: decode
        eagerly."""
        if not self.applies_to(z.device):
            return None
        key = (z.shape[0], z.shape[-1], *crop)
        run = self._graphs.get(key)
        if run is not None:
            self._graphs.move_to_end(key)
            return run
        if self.capture_on_use is None or key[1] > self.max_frames:
            return None
        uses = self._uses.pop(key, 0) + 1
        if uses < self.capture_on_use:
            self._uses[key] = uses
            if len(self._uses) > MAX_TRACKED_SHAPES:
                self._uses.popitem(last=False)
            return None
        if len(self._graphs) >= self.max_graphs and self._victim() is None:
            return None  # every slot holds a prewarmed graph
        return self._add(key)

    def _victim(self) -> GraphKey | None:
        return next((k for k in self._graphs if k not in self._pinned), None)

    def _add(self, key: GraphKey) -> Callable[[Tensor], Tensor]:
        # capture before evicting, so the shared pool always has a live graph (torch releases a pool
        # whose graphs are all gone; capturing into its id again is not something to rely on)
        run = self._graphs[key] = self.capture(key)
        self.captures += 1
        while len(self._graphs) > self.max_graphs and (victim := self._victim()) is not None:
            del self._graphs[victim]
        return run
