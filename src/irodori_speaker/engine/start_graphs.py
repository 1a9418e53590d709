"""A stepped line's start: its context keys/values written into the step batcher's pool, eagerly
or from a CUDA graph per (lines, context shape, guidance groups) bucket.

A line joining the step batch (engine/steps.py) first needs every guidance group's condition
keys/values, each layer's written into its slots of the `ContextPool`: per group a few ops per
layer and condition, ~600 launches for a v2 line with CFG. On an H100 at 16 streams these eager
starts were the largest share of the device owner's time under step batching (105.8 ms of its
0.59 s, ~15 ms a start call; benchmarks/RESULTS.md, thirteenth session). Here that work is one
graph replay: the lines' conditions copied into static buffers (a batch of lines in one `cat`
per condition), their rows' slots in one upload.

`write_contexts` is the start's math, one copy for both ways: per guidance group, its branches'
conditions (dropped ones zeroed) through each layer's context projections, written into the pool
a layer at a time (a batch of 16 v2 lines holds one layer's keys/values, ~260 MB, not all twelve).

What a graph bakes in, and how a start keeps it valid:
- the pool's tensors (fixed at prewarm; a pool grown since drops every graph, as the step's);
- the shape: the text padded to its rung (`fast.context_rung`, from 64 tokens: a few text
  lengths serve every piece up to 128 tokens), the voice's conditions to the context bucket (a
  voice is one length; prewarm captures the voices it is given), the lines to a batch bucket
  (rows past the real lines repeat the first line: the same rows written to the same slots);
- the guidance groups and which conditions are present (part of the key).
A start whose shape has no graph, or whose context would not fit the pool, runs eagerly. Without
CUDA (`capture=False`) the same static buffers run the same function eagerly: the CPU tests check
the buckets and fillers that way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .batch import batch_bucket, present_conditions
from .context_pool import ContextPool, Held
from .cuda_graphs import capture
from .fast import TEXT_RUNG_LEAST, context_rung, round_up
from .model import Conditions, TextToLatentRFDiT, context_segments

Groups = tuple  # a plan's guidance groups: per group, its branches' dropped condition names
StartKey = tuple  # (lines bucket, (text, speaker, caption) positions, groups, present conditions)

_FIELDS = ("text", "speaker", "caption")


def plan_groups(groups: Groups | None) -> Groups:
    """A plan's guidance groups; no guidance: one group whose one branch drops nothing."""
    return groups or (((),),)


def write_contexts(
    model: TextToLatentRFDiT, pool: ContextPool, batch: Conditions, groups: Groups, index: Tensor
) -> None:
    """Every guidance group's context keys/values of `batch`'s lines into `pool`'s slots `index`
    (`ContextPool.index`: group after group, within one row j * lines + i for line i's branch j),
    one layer at a time."""
    start = 0
    for group in groups:
        branches = [batch.dropped(*names) for names in group]
        conds = branches[0] if len(branches) == 1 else Conditions.cat(branches)
        rows = index[start : start + conds.batch_size]
        start += conds.batch_size
        parts = model.context_parts(conds)
        pool.write_mask(rows, torch.cat([m for _, _, m in parts], dim=1))
        for layer in range(len(model.blocks)):
            pool.write_layer(layer, rows, *model.context_layer_kv(layer, parts))


def context_layout(model: TextToLatentRFDiT, batch: Conditions) -> tuple[int, list[tuple[str, int, int]]]:
    """The context positions of `batch`'s lines and their segments (what the pool's slots hold)."""
    segments = context_segments(model.context_parts(batch))
    return segments[-1][2], segments


def _positions(conds: Conditions, name: str) -> int | None:
    state = getattr(conds, f"{name}_state")
    return None if state is None else int(state.shape[1])


def _pad_to(conds: Conditions, shape: tuple[int | None, ...]) -> list[Tensor | None]:
    """Each condition's state and mask padded with masked zeros to `shape`'s positions."""
    out: list[Tensor | None] = []
    for name, n in zip(_FIELDS, shape):
        state, mask = getattr(conds, f"{name}_state"), getattr(conds, f"{name}_mask")
        if state is None or n is None:
            out += [None, None]
            continue
        extra = n - int(state.shape[1])
        out += (
            [F.pad(state, (0, 0, 0, extra)), F.pad(mask, (0, extra), value=False)] if extra else [state, mask]
        )
    return out


@dataclass(eq=False)
class StartGraph:
    """One bucket's static inputs (None for an absent condition) and graph (None: eager)."""

    inputs: list[Tensor | None]  # text, speaker, caption: state and mask each (lines, positions, ...)
    index: Tensor  # (rows,) the slots every group's rows go to
    sizes: tuple[int, ...]  # rows of each guidance group a line holds
    length: int  # context positions
    segments: list[tuple[str, int, int]]
    forward: Callable[[], None]
    graph: Any = None

    def run(self) -> None:
        if self.graph is None:
            self.forward()
        else:
            self.graph.replay()


class StartGraphs:
    """The captured start buckets of one `StepBatcher` over its fixed pool."""

    def __init__(
        self, model: TextToLatentRFDiT, pool: ContextPool, *, context_bucket: int = 32, graph_pool: Any = None
    ) -> None:
        self.model, self.pool = model, pool
        self.context_bucket = context_bucket
        self.graph_pool = graph_pool  # shared with the sampling graphs: replays never overlap
        self.generation = pool.generation
        self._graphs: dict[StartKey, StartGraph] = {}
        # static inputs shared by the buckets: one buffer per condition shape and largest bucket,
        # each bucket's graph reading its first rows (a 30 s voice's states, ~1 MB a line, once)
        self._buffers: dict[tuple, Tensor] = {}
        self.replays = 0

    def __len__(self) -> int:
        return len(self._graphs)

    def key(self, conds: Sequence[Conditions], groups: Groups) -> StartKey:
        """The bucket of a start of these lines (batch 1 each, the same present conditions)."""
        bucket = self.context_bucket
        shape: list[int | None] = []
        for name in _FIELDS:
            lengths = [n for c in conds if (n := _positions(c, name)) is not None]
            if not lengths:
                shape.append(None)
            elif name == "text":
                shape.append(context_rung(max(lengths), bucket, TEXT_RUNG_LEAST))
            else:
                shape.append(round_up(max(lengths), bucket))
        lines = 1 if len(conds) == 1 else batch_bucket(len(conds))
        return (lines, tuple(shape), groups, present_conditions(conds[0]))

    def find(self, conds: Sequence[Conditions], groups: Groups) -> StartKey | None:
        """The captured bucket for a start of these lines, or None (start them eagerly). A pool
        grown since the capture (its tensors moved) drops every graph."""
        if self.pool.generation != self.generation:
            self._graphs.clear()
            self._buffers.clear()
            return None
        key = self.key(conds, groups)
        return key if key in self._graphs else None

    def prewarm(self, conds: Conditions, groups: Groups, lines: Iterable[int], *, graphs: bool) -> int:
        """Make the buckets of starts of 1..`lines` lines like `conds` (one line; each bucket of
        those counts), with `graphs` captured; returns how many were made. Needs a fixed pool
        with a free slot (the capture's warm-up run writes there); a shape longer than the pool
        is skipped."""
        if not self.pool.fixed or self.pool.mask is None:
            raise RuntimeError("StartGraphs.prewarm: fix the context pool first")
        if self.pool.generation != self.generation:  # graphs made on tensors the pool let go
            self._graphs.clear()
            self._buffers.clear()
            self.generation = self.pool.generation
        free = self.pool.first_free()
        buckets = sorted({1 if n == 1 else batch_bucket(n) for n in lines})
        if free is None or not buckets:
            return 0
        made = 0
        with torch.inference_mode():
            for n in buckets:
                key = self.key([conds] * n, groups)
                if key in self._graphs:
                    continue
                graph = self._make(key, conds, graphs, free, buckets[-1])
                if graph is not None:
                    self._graphs[key] = graph
                    made += 1
        return made

    def _buffer(self, like: Tensor, rows: int, top: int) -> Tensor:
        """The first `rows` rows of the shared static buffer of `top` rows shaped like `like`."""
        key = (tuple(like.shape[1:]), like.dtype, top)
        buf = self._buffers.get(key)
        if buf is None:
            buf = self._buffers[key] = like.new_zeros((top, *like.shape[1:]))
        return buf[:rows]

    def _make(self, key: StartKey, like: Conditions, graphs: bool, free: int, top: int) -> StartGraph | None:
        n, shape, groups, _ = key
        padded = _pad_to(like, shape)
        inputs = [None if t is None else self._buffer(t, n, top) for t in padded]
        batch = Conditions(*inputs)  # type: ignore[arg-type]
        length, segments = context_layout(self.model, batch)
        if length > self.pool.length:
            return None
        sizes = tuple(len(g) for g in groups)
        assert self.pool.mask is not None
        # the warm-up run writes every row to one free slot (finite zeros, nobody's line)
        index = torch.full((n * sum(sizes),), free, dtype=torch.long, device=self.pool.mask.device)
        pool, model = self.pool, self.model

        def forward() -> None:
            write_contexts(model, pool, batch, groups, index)

        g = StartGraph(inputs, index, sizes, length, segments, forward)
        if graphs:
            if self.graph_pool is None:
                self.graph_pool = torch.cuda.graph_pool_handle()
            g.graph, _ = capture(forward, [], self.graph_pool)
        return g

    def run(self, key: StartKey, conds: Sequence[Conditions], held: list[Held]) -> None:
        """Write the lines' contexts (`conds[i]` into `held[i]`'s slots) from `key`'s graph."""
        g = self._graphs[key]
        n, shape = key[0], key[1]
        rows = [_pad_to(c, shape) for c in conds]
        rows += [rows[0]] * (n - len(rows))  # filler lines: the first line's rows again
        for i, buf in enumerate(g.inputs):
            if buf is None:
                continue
            parts = [r[i] for r in rows]
            if len(parts) == 1:
                buf.copy_(parts[0])  # type: ignore[arg-type]
            else:
                torch.cat(parts, out=buf)  # type: ignore[arg-type]
        everyone = list(held) + [held[0]] * (n - len(held))
        g.index.copy_(self.pool.index(everyone))
        self.replays += 1
        g.run()

    def layout(self, key: StartKey) -> tuple[tuple[int, ...], int, list[tuple[str, int, int]]]:
        """What a line started from `key`'s graph holds: its rows per group, context positions,
        segments (the pool's `take` needs them before the replay)."""
        g = self._graphs[key]
        return g.sizes, g.length, g.segments
