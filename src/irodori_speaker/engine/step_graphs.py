"""The step batcher's forward from CUDA graphs, one per (rows, frames, context) bucket.

A step of many lines (engine/steps.py) is one `FastDiT.velocity` over every live row: eagerly a
few hundred kernel launches from the device owner's thread, which bounded the step on the H200
(the owner busy 92-98 % of the wall at 16 streams, benchmarks/RESULTS.md, eighth session). Here
that forward is captured once per bucket at prewarm and replayed: one launch per step.

What a graph bakes in, and how the step keeps it valid:
- the lines' context keys/values: read in place from the batcher's `ContextPool`, `fix`ed at
  prewarm so that its tensors never move (`generation` changes only if a too-long context grows
  it; every graph is dropped then and steps run eagerly), through a row -> slot table;
- static inputs, filled before each replay: the rows' latents (a buffer per rows and frames
  bucket) and their modulation (per rows bucket: the largest input), shared by the graphs of
  those buckets; the attention mask and the row -> slot table per graph, copied only when the
  group's make-up changed since this graph last ran;
- rows filled up to the bucket repeat the first row (its slot, its mask: finite values, and
  outputs dropped), frames up to the frame bucket and context positions up to the length bucket
  are masked, as in whole-line batches (engine/batch.py).
Graphs are captured only here, at prewarm (a capture mid-stream would stall every live line); a
shape without one runs eagerly. Without CUDA (`capture=False`) the same static buffers run the
same function eagerly: the CPU tests check the buckets, fillers and masks that way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .context_pool import ContextPool
from .cuda_graphs import capture
from .fast import FastDiT, round_up
from .layers import rope_tables
from .model import ContextKV

Bucket = tuple[int, int, int]  # (rows, frames, context positions)


#: a step's rows are filled up to one of these: the powers of two and three times them. A v2 line
#: with CFG is three rows, so 16 lines are 48 rows, which the powers of two alone ran as 64 (a
#: quarter fillers: the forward's time grows with its rows); a line batch's cut to its bucket
#: (`engine.batch.lines_to_take`) does not apply here, every live line steps
STEP_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def rows_bucket(rows: int) -> int:
    """The smallest of `STEP_ROWS` holding `rows` (past the largest: `rows` rounded up to 32)."""
    for bucket in STEP_ROWS:
        if bucket >= rows:
            return bucket
    return -(-rows // 32) * 32


@dataclass(eq=False)
class StepGraph:
    """One bucket's graph (None: run `forward` on the static buffers eagerly) and its buffers."""

    x: Tensor  # (rows, frames, C) in the model's dtype
    mod: Tensor  # (layers, 6, rows, 1, D), shared by the rows bucket's graphs
    mask: Tensor  # (rows, 1, 1, frames / patch + length) additive
    slots: Tensor  # (rows,) each row's slot in the pool
    out: Tensor | None
    forward: Callable[[], Tensor]
    graph: Any = None
    filled: object = field(default=None, repr=False)  # the make-up whose mask and slots are in

    def run(self) -> Tensor:
        if self.graph is None:
            return self.forward()
        self.graph.replay()
        assert self.out is not None
        return self.out


class StepGraphs:
    """The captured buckets of one `StepBatcher`'s forward over its fixed pool."""

    def __init__(
        self,
        fast: FastDiT,
        pool: ContextPool,
        *,
        frame_bucket: int = 64,
        length_bucket: int = 256,
        graph_pool: Any = None,
    ) -> None:
        self.fast, self.pool = fast, pool
        self.frame_bucket = frame_bucket * fast.cfg.latent_patch_size
        self.length_bucket = length_bucket
        self.graph_pool = graph_pool  # shared with the whole-line graphs: replays never overlap
        self.generation = pool.generation
        self._graphs: dict[Bucket, StepGraph] = {}
        self._mods: dict[int, Tensor] = {}
        self._inputs: dict[tuple[int, int], Tensor] = {}
        self.replays = 0

    def __len__(self) -> int:
        return len(self._graphs)

    def bucket(self, rows: int, frames: int, length: int) -> Bucket:
        """The bucket of a forward of `rows` rows, `frames` latent frames, contexts up to `length`:
        rows as `STEP_ROWS`, frames in `frame_bucket` steps, context positions doubling from
        `length_bucket` up to the pool's length (a short line's masked keys cost attention work,
        a bucket per step of them would cost graphs)."""
        positions = self.length_bucket
        while positions < length:
            positions *= 2
        return rows_bucket(rows), round_up(frames, self.frame_bucket), min(positions, self.pool.length)

    def find(self, rows: int, frames: int, length: int) -> Bucket | None:
        """The captured bucket for such a forward, or None (run it eagerly). A pool grown since the
        capture (its tensors moved) drops every graph."""
        if self.pool.generation != self.generation:
            if self._graphs:
                self._graphs.clear()
                self._mods.clear()
                self._inputs.clear()
            return None
        key = self.bucket(rows, frames, length)
        return key if key in self._graphs else None

    def prewarm(
        self, rows: Iterable[int], frames: Iterable[int], lengths: Iterable[int], *, graphs: bool
    ) -> int:
        """Make every bucket of these sizes (with `graphs`: captured; else static buffers run
        eagerly); returns how many were made. The pool must be `fix`ed first."""
        if self.pool.mask is None:
            raise RuntimeError("StepGraphs.prewarm: fix the context pool first")
        self.generation = self.pool.generation
        made = 0
        with torch.inference_mode():
            for key in sorted({self.bucket(r, f, n) for r in rows for f in frames for n in lengths}):
                if key not in self._graphs:
                    self._graphs[key] = self._make(key, graphs)
                    made += 1
        return made

    def _make(self, key: Bucket, graphs: bool) -> StepGraph:
        R, Fr, L = key
        fast, cfg, dtype, device = self.fast, self.fast.cfg, self.fast.dtype, self.fast.device
        p = cfg.latent_patch_size
        mod = self._mods.get(R)
        if mod is None:
            mod = self._mods[R] = torch.zeros(
                cfg.num_layers, 6, R, 1, cfg.model_dim, dtype=dtype, device=device
            )
        x = self._inputs.get((R, Fr))
        if x is None:  # shared by the (rows, frames) bucket's graphs, as `mod` by the rows bucket's
            x = self._inputs[R, Fr] = torch.zeros(R, Fr, cfg.latent_dim, dtype=dtype, device=device)
        mask = torch.zeros(R, 1, 1, Fr // p + L, dtype=dtype, device=device)
        slots = torch.zeros(R, dtype=torch.long, device=device)
        rope = rope_tables(Fr // p, cfg.head_dim, device)
        pool = self.pool
        assert pool.mask is not None
        ctx = ContextKV(
            [k[:, :, :L] for k in pool.keys], [v[:, :, :L] for v in pool.values], pool.mask[:, :L], []
        )

        def forward(x: Tensor = x, mod: Tensor = mod, mask: Tensor = mask, slots: Tensor = slots) -> Tensor:
            return fast.velocity(x, mod, ctx, mask, rope, ctx_rows=slots)

        g = StepGraph(x, mod, mask, slots, None, forward)
        if graphs:
            if self.graph_pool is None:
                self.graph_pool = torch.cuda.graph_pool_handle()
            g.graph, g.out = capture(forward, [x, mod, mask, slots], self.graph_pool)
        return g

    def run(
        self,
        key: Bucket,
        x: Tensor,
        row_line: Tensor,
        mods: Tensor,
        mask: Tensor,
        slots: Tensor,
        made: object,
    ) -> Tensor:
        """One forward from bucket `key`'s graph: the rows' latents gathered from `x` (lines,
        frames, C) by `row_line`, their modulation `mods` (rows, layers, 6, D); `mask` and
        `slots` (already filled up to the bucket's rows) copied only when `made` (the group's
        make-up) differs from what the graph last ran. Returns the real rows' output (a view of
        the graph's output buffer: read it before the next replay)."""
        g = self._graphs[key]
        n = int(row_line.shape[0])
        torch.index_select(x, 0, row_line, out=g.x[:n])
        g.mod[:, :, :n].copy_(mods.permute(1, 2, 0, 3)[:, :, :, None])
        if g.filled is not made:
            g.mask.copy_(mask)
            g.slots.copy_(slots)
            g.filled = made
        self.replays += 1
        return g.run()[:n]
