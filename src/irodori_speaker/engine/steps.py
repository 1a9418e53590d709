"""Step-level batching: one sampler step for every live line, in one forward.

Each line keeps its own plan (schedule, MeanFlow t/dt, guidance groups and weights, CFG window),
its own step index, context, noise, cancel token and progress; a line joins or leaves the batch
at any step boundary. A step packs every live line's rows (its guidance branches, or one row)
into one batch: latent frames padded to the longest line, condition keys/values padded to the
longest context, both masked; each row takes the AdaLN modulation of its own line's step
(gathered from the per-schedule tables the fast path precomputes); the outputs go back to each
line for its own guidance and Euler update (`sampler.euler_step`, the same math as a line alone).
Each line's context keys/values are written once, at its start, into the batcher's
`ContextPool` (engine/context_pool.py) and read there through a row -> slot table.

A line sampled here equals the line sampled alone up to the rounding of a larger GEMM (padded
keys are masked out, padded frames never reach a valid one). Lines of far different lengths
step in separate forwards (`groups`: padding within `max_padding` of the real frames, as
whole-line batches). Each forward's row table and masks are rebuilt only when its make-up changes
(a line joins, leaves or changes guidance group), so a steady batch packs only its latents.

With `prewarm_graphs` (CUDA, at prewarm) the pool is fixed and each forward whose (rows, frames,
context) bucket was captured replays its graph (engine/step_graphs.py); lines join only as many as
the fixed pool holds (`start_many` starts a prefix; the scheduler keeps the rest waiting).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from ..cancel import Cancelled, CancelToken
from .batch import frame_mask, present_conditions, stack_conditions
from .context_pool import ContextPool, Held, PoolLayout
from .fast import FastDiT, pad_conditions, round_up
from .layers import rope_tables
from .model import Conditions, ContextKV
from .sampler import (
    LineContext,
    Plan,
    ProgressFn,
    SamplerConfig,
    branch_coefficients,
    branch_rows,
    check_inputs,
    euler_step,
    initial_x,
    plan_for,
)
from .start_graphs import StartGraphs, context_layout, plan_groups, write_contexts
from .step_graphs import STEP_ROWS, StepGraphs, rows_bucket


class Joining(NamedTuple):
    """A line about to join: conditions of batch 1, noise (1, S, C) (host or device), its options
    and handles."""

    conds: Conditions
    noise: Tensor
    cfg: SamplerConfig
    cancel: CancelToken | None = None
    progress: ProgressFn | None = None
    tag: object = None


@dataclass(eq=False)
class StepLine:
    """One line in flight: its plan, latent (1, W, C) float32, context and step index."""

    plan: Plan
    cfg: SamplerConfig
    x: Tensor  # W frames: its own padded length at first, then its last forward's (a view of it)
    frames: int  # its real length (latent frames)
    padded: int  # its length padded to a frame bucket (what its forwards are grouped by)
    held: Held  # its context's slots in the batcher's pool
    table_row: int  # its first step's row in the batcher's modulation rows (`_table_row`)
    cancel: CancelToken | None = None
    progress: ProgressFn | None = None
    step: int = 0
    error: BaseException | None = None
    tag: object = field(default=None, repr=False)  # the caller's handle

    @property
    def done(self) -> bool:
        return self.error is not None or self.step >= len(self.plan.steps)

    @property
    def group(self) -> int:
        return self.plan.steps[self.step].group

    @property
    def ctx(self) -> LineContext:
        """Its context: views of its slots in the pool."""
        return self.held.context

    def latent(self) -> Tensor:
        """The finished latent (1, frames, C)."""
        return self.x[:, : self.frames]


class StepBatcher:
    """Runs one step of many lines at once on a `FastDiT` (fused or the model's own blocks)."""

    def __init__(
        self,
        fast: FastDiT,
        *,
        frame_bucket: int = 16,
        context_bucket: int = 32,
        max_padding: float = 0.5,
        upload: Callable[[Tensor, torch.device], Tensor] | None = None,
    ) -> None:
        self.fast = fast
        # host tensors to the device (the step's weights, the row index): the device owner's
        # pinned copy that does not wait (engine/hardware/owner.py), or a plain copy
        self.upload = upload or (lambda t, device: t.to(device))
        self.frame_bucket = frame_bucket
        self.context_bucket = context_bucket
        # a forward's padded frames may reach this fraction of its real ones: longer and shorter
        # lines step in separate forwards rather than every row padded to the longest line
        self.max_padding = max_padding
        self.pool = ContextPool(upload=self.upload)  # every started line's context K/V, till it leaves
        self._packed: dict[tuple, _Packed] = {}  # each group's row table and masks, by its make-up
        self.graphs: StepGraphs | None = None  # prewarm_graphs: the forward's buckets (CUDA graphs)
        self.starts: StartGraphs | None = None  # prewarm_starts: the line starts' buckets
        self._layout = PoolLayout.of(fast.cfg, fast.dtype, fast.device)
        # every plan's modulation table stacked (steps, layers, 6, D): a step gathers its rows' in
        # one op; each table's first row by its id (the tables are kept, FastDiT.plan_table)
        self._tables: Tensor | None = None
        self._table_list: list[Tensor] = []
        self._first_row: dict[int, int] = {}
        self.steps_run = 0  # forwards so far
        self.rows_run = 0  # rows over those forwards

    # ---- lines join ---------------------------------------------------------------------------
    def start(
        self,
        conds: Conditions,
        noise: Tensor,
        cfg: SamplerConfig,
        *,
        cancel: CancelToken | None = None,
        progress: ProgressFn | None = None,
        tag: object = None,
    ) -> StepLine:
        """A line (conditions of batch 1, noise (1, S, C)) ready to take its first step."""
        return self.start_many([Joining(conds, noise, cfg, cancel, progress, tag)])[0]

    def start_many(self, joining: Sequence[Joining]) -> list[StepLine]:
        """Lines ready to take their first step: those of `joining`, in order, that the pool holds
        now (all, unless it is fixed: then a prefix, at least one line when none is held; the rest
        wait for lines to finish). Those whose conditions and guidance groups match get their
        context keys/values together (one start graph's replay, or one call per group with rows
        padded to the longest context): lines that arrive together pay one set of launches.
        Raises on the first line whose inputs or plan are refused (the scheduler then starts each
        alone)."""
        model = self.fast.model
        if self.pool.held and self.pool.room([1]) == 0:
            return []  # a fixed pool full: nothing to check or plan until lines leave
        with torch.inference_mode():
            plans = []
            for j in joining:
                check_inputs(model, j.conds, j.noise)
                plans.append(plan_for(model, j.conds, j.cfg))
            kinds = [(plan.groups, present_conditions(j.conds)) for j, plan in zip(joining, plans)]
            fit = len(joining)
            if self.pool.fixed:  # the longest prefix whose lines its free slots hold, as held below
                rows = [sum(len(g) for g in plan_groups(plan.groups)) for plan in plans]
                while fit:
                    order = [i for members in _by_kind(kinds[:fit]).values() for i in members]
                    if self.pool.room([rows[i] for i in order]) == fit:
                        break
                    fit -= 1
                fit = max(fit, 0 if self.pool.held else 1)
            joining, plans = list(joining)[:fit], plans[:fit]
            by_kind = _by_kind(kinds[:fit])
            held: list[Held | None] = [None] * len(joining)
            lines: list[StepLine] = []
            try:
                for members in by_kind.values():
                    made = self._hold_contexts([joining[i].conds for i in members], plans[members[0]])
                    for i, m in zip(members, made):
                        held[i] = m
                for j, plan, h in zip(joining, plans, held):
                    assert h is not None
                    S = j.noise.shape[1]
                    S_pad = round_up(S, self.frame_bucket * model.cfg.latent_patch_size)
                    noise = self.upload(j.noise, self.fast.device)  # a line that starts: its noise only
                    x = initial_x(F.pad(noise, (0, 0, 0, S_pad - S)), j.cfg, self.fast.device)
                    row = self._table_row(plan)
                    lines.append(StepLine(plan, j.cfg, x, S, S_pad, h, row, j.cancel, j.progress, tag=j.tag))
                    if j.cfg.speaker_kv_scale is not None:
                        h.context.scale_speaker(j.cfg.speaker_kv_scale, j.cfg.speaker_kv_max_layers)
            except BaseException:
                self._give_back([h for h in held if h is not None])
                raise
        return lines

    def _table_row(self, plan: Plan) -> int:
        """The first row of `plan`'s modulation table in the stacked tables (added when new)."""
        table = self.fast.plan_table(plan)
        row = self._first_row.get(id(table))
        if row is None:
            row = self._first_row[id(table)] = sum(int(t.shape[0]) for t in self._table_list)
            self._table_list.append(table)
            self._tables = torch.cat(self._table_list)
        return row

    def _hold_contexts(self, conds: list[Conditions], plan: Plan) -> list[Held]:
        """Slots for these lines (of one kind: `_by_kind`) with their guidance groups' contexts
        written there: from a start graph where one holds their shape (engine/start_graphs.py),
        else eagerly, padded to the context bucket and stacked (one call per group for all)."""
        model, groups = self.fast.model, plan_groups(plan.groups)
        key = None if self.starts is None else self.starts.find(conds, groups)
        if key is not None:
            assert self.starts is not None
            sizes, length, segments = self.starts.layout(key)
        else:
            padded = [pad_conditions(c, self.context_bucket) for c in conds]
            batch = padded[0] if len(padded) == 1 else stack_conditions(padded)
            sizes = tuple(len(g) for g in groups)
            length, segments = context_layout(model, batch)
        held = self.pool.take(sizes, len(conds), length, segments, self._layout)
        try:
            if key is not None:
                assert self.starts is not None
                self.starts.run(key, conds, held)
            else:
                write_contexts(model, self.pool, batch, groups, self.pool.index(held))
        except BaseException:
            self._give_back(held)
            raise
        return held

    def prewarm_starts(self, conds: Conditions, cfg: SamplerConfig, *, capture: bool) -> int:
        """The start graphs (engine/start_graphs.py) of 1 up to the pool's lines like `conds` (one
        line of a voice and text length), after `prewarm_graphs` fixed the pool; returns how many
        were made."""
        if self.graphs is None:
            raise RuntimeError("StepBatcher.prewarm_starts: prewarm_graphs first")
        if self.starts is None:
            self.starts = StartGraphs(
                self.fast.model,
                self.pool,
                context_bucket=self.context_bucket,
                graph_pool=self.graphs.graph_pool,
            )
        plan = plan_for(self.fast.model, conds, cfg)
        groups = plan_groups(plan.groups)
        lines = self.pool.slots // max(1, sum(len(g) for g in groups))
        return self.starts.prewarm(conds, groups, range(1, lines + 1), graphs=capture)

    # ---- one step of every line --------------------------------------------------------------
    def step(self, lines: list[StepLine]) -> list[StepLine]:
        """Advance every live line by one step; returns the lines that finished (or were
        cancelled: their `error` is set) with this call."""
        finished: list[StepLine] = []
        live = []
        for line in lines:
            if line.cancel is not None and line.cancel.cancelled:
                line.error = Cancelled("cancelled")
                finished.append(line)
            elif not line.done:
                live.append(line)
        try:
            if live:
                groups = [(self._key(g), g) for g in self.groups(live)]
                keys = {key for key, _ in groups}
                self._packed = {k: v for k, v in self._packed.items() if k in keys}  # left lines let go
                with torch.inference_mode():
                    for key, group in groups:
                        self._forward_and_update(group, key)
        except BaseException:
            self.release(lines)  # the caller fails them all
            raise
        finished += [line for line in live if line.done]
        self.release(finished)
        return finished

    def release(self, lines: Sequence[StepLine]) -> None:
        """Give these lines' context slots back (`step` does for the lines it returns; a caller
        dropping a line unfinished does); once none is held, the pool's memory goes with them."""
        self._give_back([line.held for line in lines])

    def _give_back(self, held: list[Held]) -> None:
        for h in held:
            self.pool.release(h)
        if not self.pool.held:
            self._packed.clear()  # they view the pool's tensors

    def groups(self, lines: list[StepLine]) -> list[list[StepLine]]:
        """`lines` by length into forwards whose padding stays within `max_padding` of their real
        frames (rows counted with their guidance branches)."""
        out: list[list[StepLine]] = []
        group: list[StepLine] = []
        real = rows = 0
        for line in sorted(lines, key=lambda line: line.padded, reverse=True):
            n = branch_rows(line.plan, line.plan.steps[line.step])
            longest = group[0].padded if group else line.padded
            if group and longest * (rows + n) > (1 + self.max_padding) * (real + n * line.frames):
                out.append(group)
                group, real, rows = [], 0, 0
            group.append(line)
            real, rows = real + n * line.frames, rows + n
        if group:
            out.append(group)
        return out

    def prewarm_graphs(
        self,
        *,
        max_rows: int,
        top_frames: int,
        length: int,
        capture: bool,
        graph_pool: object = None,
        frame_bucket: int = 64,
        length_bucket: int = 256,
    ) -> int:
        """Fix the pool at `max_rows` slots of `length` context positions and make the forward's
        buckets (engine/step_graphs.py): rows up to `max_rows`'s bucket, frames up to `top_frames`
        in `frame_bucket` steps, contexts up to `length` doubling from `length_bucket`; `capture`: as
        CUDA graphs (else the same static buffers run eagerly). Returns the buckets made."""
        cfg = self.fast.cfg
        self.pool.fix(max_rows, length, self._layout)
        if self.graphs is not None and len(self.graphs) and self.graphs.generation == self.pool.generation:
            return 0  # made already on this pool (a later prewarm: another voice's starts)
        self._packed.clear()
        graphs = StepGraphs(
            self.fast,
            self.pool,
            frame_bucket=frame_bucket,
            length_bucket=length_bucket,
            graph_pool=graph_pool,
        )
        rows = [b for b in STEP_ROWS if b <= rows_bucket(max_rows)]
        step = frame_bucket * cfg.latent_patch_size
        made = graphs.prewarm(
            rows,
            range(step, top_frames + step, step),
            range(length_bucket, length + length_bucket, length_bucket),
            graphs=capture,
        )
        self.graphs = graphs
        return made

    def _key(self, lines: list[StepLine]) -> tuple:
        # the lines themselves (compared by identity), not their ids: the cache holds them, so a
        # finished line's id cannot come back as a new line's and find its stale slots; the pool's
        # generation: grown tensors are new ones
        return (self.pool.generation, *((line, line.group) for line in lines))

    def _forward_and_update(self, lines: list[StepLine], key: tuple) -> None:
        """One forward for `lines` (one length group), then every line's guidance and Euler move.

        The work is a handful of ops per group, not per line (issue 27: on the H200 the owner
        thread, not the GPU, bounded the step at 16 lines): the latents are packed with one cat
        (each line's latent is a view of its last forward's, already that wide while the group
        stays) and one row gather, the modulation of every row is one gather from the stacked
        tables, and the guidance of every line is one small matmul over the rows
        (`sampler.branch_coefficients`: the same sum as `sampler.euler_step`), with each line's dt
        in the same upload. A line with temporal score rescaling takes `euler_step` on its own."""
        fast, dtype = self.fast, self.fast.dtype
        packed = self._pack(lines, key)
        frames = packed.frames
        xs = [_width(line.x, frames) for line in lines]
        xg = torch.cat(xs) if len(xs) > 1 else xs[0]
        xd, rows = xg.to(dtype), packed.row_line
        # each row's modulation: its line's table at its line's step, (rows, layers, 6, D)
        steps = [line.table_row + line.step for line, n in zip(lines, packed.branches) for _ in range(n)]
        assert self._tables is not None
        mods = self._tables.index_select(0, self.upload(torch.tensor(steps), xg.device))
        if packed.bucket is not None and self.graphs is not None:  # the rows gathered into its buffers
            out = self.graphs.run(packed.bucket, xd, rows, mods, packed.mask, packed.row_slot, packed).float()
        else:
            mod = mods.permute(1, 2, 0, 3)[:, :, :, None].contiguous()
            xb = xd.index_select(0, rows)
            out = fast.velocity(
                xb, mod, packed.ctx, packed.mask, packed.rope, ctx_rows=packed.row_slot
            ).float()
        self.steps_run += 1
        self.rows_run += int(rows.shape[0])
        R, G = out.shape[0], len(lines)
        # per line: its weight of each row, then its dt; a line with temporal score rescaling
        # keeps a zero row (x unchanged here) and takes euler_step on its own below
        coef = [[0.0] * (R + 1) for _ in range(G)]
        rescaled = [line.cfg.rescale_k is not None and line.cfg.rescale_sigma is not None for line in lines]
        start = 0
        for g, (line, n) in enumerate(zip(lines, packed.branches)):
            step = line.plan.steps[line.step]
            if not rescaled[g]:
                coef[g][start : start + n] = branch_coefficients(line.plan, step)
                coef[g][R] = step.t_next - step.t
            start += n
        c = self.upload(torch.tensor(coef, dtype=torch.float32), out.device)
        v = torch.matmul(c[:, :R], out.view(R, -1)).view(G, frames, -1)
        x_next = torch.addcmul(xg, v, c[:, R:].view(G, 1, 1))
        nexts = x_next.split(1) if len(lines) > 1 else (x_next,)  # each line's row: one op for all
        start = 0
        for g, (line, n) in enumerate(zip(lines, packed.branches)):
            step = line.plan.steps[line.step]
            scale = line.cfg.speaker_kv_scale if step.unscale_speaker_kv else None
            if rescaled[g]:  # euler_step unscales the speaker K/V itself
                rows = out[start : start + n][:, None]  # (branches, 1, frames, C)
                line.x = euler_step(line.plan, line.cfg, step, xs[g], rows, line.ctx)
            else:
                line.x = nexts[g]
                if scale is not None:
                    line.ctx.scale_speaker(1.0 / scale, line.cfg.speaker_kv_max_layers)
            start += n
            line.step += 1
            if line.progress is not None:
                line.progress(line.step, len(line.plan.steps))

    def _pack(self, lines: list[StepLine], key: tuple) -> _Packed:
        """The group's row -> slot table, masks and RoPE (its context stays in the pool); rebuilt
        when its make-up (`key`) changes. Where a graph holds the group's bucket, frames and
        context positions are its bucket's and rows are filled up to it with copies of the first
        row (their outputs dropped; engine/step_graphs.py)."""
        if key in self._packed:
            return self._packed[key]
        p = self.fast.cfg.latent_patch_size
        frames = max(line.padded for line in lines)
        slots = [line.held.slots(line.group) for line in lines]
        parts = [(len(s), line.frames) for s, line in zip(slots, lines)]  # (branches, valid frames)
        branches = [n for n, _ in parts]
        flat = [i for s in slots for i in s]
        L = max(line.held.length for line in lines)
        bucket = None if self.graphs is None else self.graphs.find(len(flat), frames, L)
        if bucket is not None:
            filler = bucket[0] - len(flat)
            frames, L = bucket[1], bucket[2]
            flat += [flat[0]] * filler
            parts += [(filler, parts[0][1])] if filler else []
        pool = self.pool
        assert pool.mask is not None
        row_slot = self.upload(torch.tensor(flat), pool.mask.device)
        ctx_mask = pool.mask[:, :L].index_select(0, row_slot)
        latent = frame_mask([s for n, s in parts for _ in range(n)], frames, ctx_mask.device, self.upload)
        self_mask = latent.reshape(latent.shape[0], frames // p, p).all(-1) if p > 1 else latent
        keys_ok = torch.cat((self_mask, ctx_mask), dim=1)[:, None, None, :]
        # always a mask: deciding "all valid, none needed" would sync the host at every join
        mask = torch.zeros(keys_ok.shape, dtype=self.fast.dtype, device=keys_ok.device)
        mask.masked_fill_(~keys_ok, float("-inf"))
        rope = rope_tables(frames // p, self.fast.cfg.head_dim, ctx_mask.device)
        row_line = torch.tensor([g for g, n in enumerate(branches) for _ in range(n)])
        # the pool's slots up to the group's longest context: every row reads its own (row_slot);
        # no segments: speaker K/V scaling acts on each line's own views
        keys, values = [k[:, :, :L] for k in pool.keys], [v[:, :, :L] for v in pool.values]
        ctx = ContextKV(keys, values, pool.mask[:, :L], [])
        row_line = self.upload(row_line, ctx_mask.device)
        packed = _Packed(ctx, mask, rope, frames, branches, row_line, row_slot, bucket)
        self._packed[key] = packed
        return packed


@dataclass
class _Packed:
    ctx: ContextKV  # the pool's keys/values (all slots, the group's longest context)
    mask: Tensor
    rope: tuple[Tensor, Tensor]
    frames: int
    branches: list[int]
    row_line: Tensor  # (rows,) each row's line in the group (device, long)
    row_slot: Tensor  # (rows,) each row's slot in the pool (device, long); filled up to `bucket`
    bucket: tuple[int, int, int] | None = None  # the graph it replays (rows, frames, context)


def _width(x: Tensor, frames: int) -> Tensor:
    """A line's latent (1, W, C) as `frames` wide: padded with zeros or cut (past its own padded
    length W holds only padding, never read as a valid frame)."""
    width = x.shape[1]
    if width == frames:
        return x
    return F.pad(x, (0, 0, 0, frames - width)) if width < frames else x[:, :frames]


def _by_kind(kinds: list[tuple]) -> dict[tuple, list[int]]:
    """The indices of each kind, kinds in order of first appearance (`start_many` holds each
    kind's lines together, in this order)."""
    out: dict[tuple, list[int]] = {}
    for i, kind in enumerate(kinds):
        out.setdefault(kind, []).append(i)
    return out


def run_lines(batcher: StepBatcher, lines: list[StepLine]) -> None:
    """Step `lines` together until each is done (a test and benchmark helper: the scheduler in
    synthesis/ admits and retires lines between steps instead)."""
    live = list(lines)
    while live:
        for line in batcher.step(live):
            live.remove(line)
