"""Step-level batching: one sampler step for every live line, in one forward.

Each line keeps its own plan (schedule, MeanFlow t/dt, guidance groups and weights, CFG window),
its own step index, context, noise, cancel token and progress; a line joins or leaves the batch
at any step boundary. A step packs every live line's rows (its guidance branches, or one row)
into one batch: latent frames padded to the longest line, condition keys/values padded to the
longest context, both masked; each row takes the AdaLN modulation of its own line's step
(gathered from the per-schedule tables the fast path precomputes); the outputs go back to each
line for its own guidance and Euler update (`sampler.euler_step`, the same math as a line alone).

A line sampled here equals the line sampled alone up to the rounding of a larger GEMM (padded
keys are masked out, padded frames never reach a valid one). Lines of far different lengths
step in separate forwards (`groups`: padding within `max_padding` of the real frames, as
whole-line batches). Each forward's packed context is rebuilt only when its make-up changes (a
line joins, leaves, changes guidance group or unscales its speaker K/V), so a steady batch packs
only its latents each step.
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


class Joining(NamedTuple):
    """A line about to join: conditions of batch 1, noise (1, S, C), its options and handles."""

    conds: Conditions
    noise: Tensor
    cfg: SamplerConfig
    cancel: CancelToken | None = None
    progress: ProgressFn | None = None
    tag: object = None


@dataclass(eq=False)
class StepLine:
    """One line in flight: its plan, latent (1, S_pad, C) float32, context and step index."""

    plan: Plan
    cfg: SamplerConfig
    x: Tensor
    frames: int  # its real length (latent frames); x is padded to a frame bucket
    ctx: LineContext
    table: Tensor  # (steps, layers, 6, D): each step's modulation
    cancel: CancelToken | None = None
    progress: ProgressFn | None = None
    step: int = 0
    version: int = 0  # bumped when its context changes in place (speaker K/V unscaled)
    error: BaseException | None = None
    tag: object = field(default=None, repr=False)  # the caller's handle
    _padded: tuple[tuple, ContextKV] | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        return self.error is not None or self.step >= len(self.plan.steps)

    @property
    def group(self) -> int:
        return self.plan.steps[self.step].group

    def latent(self) -> Tensor:
        """The finished latent (1, frames, C)."""
        return self.x[:, : self.frames]

    def padded_context(self, ctx: ContextKV, length: int) -> ContextKV:
        """`ctx` (its current group's) with its keys, values and mask padded to `length`; kept
        while the group, length and context stay the same (a steady batch pads nothing)."""
        key = (id(ctx), length, self.version)
        if self._padded is not None and self._padded[0] == key:
            return self._padded[1]
        extra = length - ctx.mask.shape[1]
        if extra:
            ctx = ContextKV(
                [F.pad(k, (0, 0, 0, extra)) for k in ctx.keys],
                [F.pad(v, (0, 0, 0, extra)) for v in ctx.values],
                F.pad(ctx.mask, (0, extra), value=False),
                ctx.segments,
            )
        self._padded = (key, ctx)
        return ctx


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
        self._packed: dict[tuple, _Packed] = {}  # each group's packed context, by its make-up
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
        """Lines ready to take their first step. Those whose conditions and guidance groups match
        get their context keys/values from one call per group (rows padded to the longest context,
        masked): lines that arrive together pay one set of launches, not one each. Raises on the
        first line whose inputs or plan are refused (the device owner then starts each alone)."""
        model = self.fast.model
        with torch.inference_mode():
            plans = []
            for j in joining:
                check_inputs(model, j.conds, j.noise)
                plans.append(plan_for(model, j.conds, j.cfg))
            contexts: list[LineContext | None] = [None] * len(joining)
            by_kind: dict[tuple, list[int]] = {}
            for i, (j, plan) in enumerate(zip(joining, plans)):
                by_kind.setdefault((plan.groups, present_conditions(j.conds)), []).append(i)
            for members in by_kind.values():
                stacked = [pad_conditions(joining[i].conds, self.context_bucket) for i in members]
                for i, made in zip(members, self._contexts(stacked, plans[members[0]])):
                    contexts[i] = made
            lines = []
            for j, plan, ctx in zip(joining, plans, contexts):
                assert ctx is not None
                S = j.noise.shape[1]
                S_pad = round_up(S, self.frame_bucket * model.cfg.latent_patch_size)
                x = initial_x(F.pad(j.noise, (0, 0, 0, S_pad - S)), j.cfg, self.fast.device)
                if j.cfg.speaker_kv_scale is not None:
                    ctx.scale_speaker(j.cfg.speaker_kv_scale, j.cfg.speaker_kv_max_layers)
                table = self.fast.plan_table(plan)
                lines.append(StepLine(plan, j.cfg, x, S, ctx, table, j.cancel, j.progress, tag=j.tag))
        return lines

    def _contexts(self, conds: list[Conditions], plan: Plan) -> list[LineContext]:
        """Each line's context (its guidance groups' keys/values) from one `context_kv` call per
        group over all the lines (each line's rows copied out: it scales its own speaker K/V in
        place). The step builds its own attention masks (`_pack`), so none is made here."""
        model, B = self.fast.model, len(conds)
        batch = conds[0] if B == 1 else stack_conditions(conds)
        groups = plan.groups or (((),),)  # no guidance: one group, its one branch dropping nothing
        packed = []
        for g in groups:
            branches = [batch.dropped(*b) for b in g]
            packed.append(model.context_kv(branches[0] if len(branches) == 1 else Conditions.cat(branches)))
        out = []
        for i in range(B):
            mine = []
            for g, ctx in zip(groups, packed):
                if B == 1:
                    mine.append(ctx)
                    continue
                rows = torch.arange(i, B * len(g), B, device=ctx.mask.device)  # its row of each branch
                mine.append(
                    ContextKV(
                        [k.index_select(0, rows) for k in ctx.keys],
                        [v.index_select(0, rows) for v in ctx.values],
                        ctx.mask.index_select(0, rows),
                        ctx.segments,
                    )
                )
            out.append(LineContext(mine, [None] * len(plan.groups), mine[0].rows(1), None))
        return out

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
        if not live:
            return finished
        groups = [(self._key(g), g) for g in self.groups(live)]
        keys = {key for key, _ in groups}
        self._packed = {k: v for k, v in self._packed.items() if k in keys}  # left lines let go
        with torch.inference_mode():
            for key, group in groups:
                self._forward_and_update(group, key)
        finished += [line for line in live if line.done]
        return finished

    def groups(self, lines: list[StepLine]) -> list[list[StepLine]]:
        """`lines` by length into forwards whose padding stays within `max_padding` of their real
        frames (rows counted with their guidance branches)."""
        out: list[list[StepLine]] = []
        group: list[StepLine] = []
        real = rows = 0
        for line in sorted(lines, key=lambda line: line.x.shape[1], reverse=True):
            n = branch_rows(line.plan, line.plan.steps[line.step])
            longest = group[0].x.shape[1] if group else line.x.shape[1]
            if group and longest * (rows + n) > (1 + self.max_padding) * (real + n * line.frames):
                out.append(group)
                group, real, rows = [], 0, 0
            group.append(line)
            real, rows = real + n * line.frames, rows + n
        if group:
            out.append(group)
        return out

    @staticmethod
    def _key(lines: list[StepLine]) -> tuple:
        # the lines themselves (compared by identity), not their ids: the cache holds them, so a
        # finished line's id cannot come back as a new line's and find its stale context
        return tuple((line, line.group, line.version) for line in lines)

    def _forward_and_update(self, lines: list[StepLine], key: tuple) -> None:
        """One forward for `lines` (one length group), then every line's guidance and Euler move.

        The per-line work is a handful of ops per group, not per line (issue 27: on the H200 the
        owner thread, not the GPU, bounded the step at 16 lines): the latents are packed with one
        cat and one row gather, and the guidance of every line is one small matmul over the rows
        (`sampler.branch_coefficients`: the same sum as `sampler.euler_step`), with each line's dt
        in the same upload. A line with temporal score rescaling takes `euler_step` on its own."""
        fast, dtype = self.fast, self.fast.dtype
        packed = self._pack(lines, key)
        frames = packed.frames
        xg = torch.cat(
            [
                line.x if line.x.shape[1] == frames else F.pad(line.x, (0, 0, 0, frames - line.x.shape[1]))
                for line in lines
            ]
        )
        xb = xg.to(dtype).index_select(0, packed.row_line)
        # each row's modulation: its line's table at its line's step, (layers, 6, rows, 1, D)
        mods = torch.stack([line.table[line.step] for line in lines]).index_select(0, packed.row_line)
        mod = mods.permute(1, 2, 0, 3)[:, :, :, None].contiguous()
        out = fast.velocity(xb, mod, packed.ctx, packed.mask, packed.rope).float()
        self.steps_run += 1
        self.rows_run += xb.shape[0]
        R, G = out.shape[0], len(lines)
        # per line: its weight of each row, then its dt; a line with temporal score rescaling
        # keeps a zero row (x unchanged here) and takes euler_step on its own below
        coef = [0.0] * (G * (R + 1))
        rescaled = [line.cfg.rescale_k is not None and line.cfg.rescale_sigma is not None for line in lines]
        start = 0
        for g, (line, n) in enumerate(zip(lines, packed.branches)):
            step = line.plan.steps[line.step]
            if not rescaled[g]:
                row = g * (R + 1)
                coef[row + start : row + start + n] = branch_coefficients(line.plan, step)
                coef[row + R] = step.t_next - step.t
            start += n
        c = self.upload(torch.tensor(coef, dtype=torch.float32).view(G, R + 1), out.device)
        v = torch.matmul(c[:, :R], out.view(R, -1)).view(G, frames, -1)
        x_next = torch.addcmul(xg, v, c[:, R:].view(G, 1, 1))
        start = 0
        for g, (line, n) in enumerate(zip(lines, packed.branches)):
            step = line.plan.steps[line.step]
            S = line.x.shape[1]
            scale = line.cfg.speaker_kv_scale if step.unscale_speaker_kv else None
            if rescaled[g]:  # euler_step unscales the speaker K/V itself
                rows = out[start : start + n, :S][:, None]  # (branches, 1, S, C)
                line.x = euler_step(line.plan, line.cfg, step, line.x, rows, line.ctx)
            else:
                line.x = x_next[g : g + 1, :S]
                if scale is not None:
                    line.ctx.scale_speaker(1.0 / scale, line.cfg.speaker_kv_max_layers)
            if scale is not None:
                line.version += 1  # its context changed in place: the packed copy is stale
            start += n
            line.step += 1
            if line.progress is not None:
                line.progress(line.step, len(line.plan.steps))

    def _pack(self, lines: list[StepLine], key: tuple) -> _Packed:
        """The group's context keys/values, masks and RoPE; rebuilt when its make-up (`key`)
        changes."""
        if key in self._packed:
            return self._packed[key]
        p = self.fast.cfg.latent_patch_size
        frames = max(line.x.shape[1] for line in lines)
        parts: list[tuple[ContextKV, int, int]] = []  # (context, branches, valid frames)
        for line in lines:
            g = line.group
            ctx = line.ctx.cond if g < 0 else line.ctx.groups[g]
            parts.append((ctx, branch_rows(line.plan, line.plan.steps[line.step]), line.frames))
        L = max(c.mask.shape[1] for c, _, _ in parts)
        layers = len(parts[0][0].keys)
        padded = [line.padded_context(ctx, L) for line, (ctx, _, _) in zip(lines, parts)]
        keys = [torch.cat([c.keys[i] for c in padded]) for i in range(layers)]
        values = [torch.cat([c.values[i] for c in padded]) for i in range(layers)]
        ctx_mask = torch.cat([c.mask for c in padded])
        latent = torch.cat([frame_mask([s] * n, frames, ctx_mask.device) for _, n, s in parts])
        self_mask = latent.reshape(latent.shape[0], frames // p, p).all(-1) if p > 1 else latent
        keys_ok = torch.cat((self_mask, ctx_mask), dim=1)[:, None, None, :]
        # always a mask: deciding "all valid, none needed" would sync the host at every join
        mask = torch.zeros(keys_ok.shape, dtype=self.fast.dtype, device=keys_ok.device)
        mask.masked_fill_(~keys_ok, float("-inf"))
        rope = rope_tables(frames // p, self.fast.cfg.head_dim, ctx_mask.device)
        segments = parts[0][0].segments  # only read by speaker K/V scaling, which acts per line
        branches = [n for _, n, _ in parts]
        row_line = torch.tensor([g for g, n in enumerate(branches) for _ in range(n)])
        packed = _Packed(
            ContextKV(keys, values, ctx_mask, segments),
            mask,
            rope,
            frames,
            branches,
            self.upload(row_line, ctx_mask.device),
        )
        self._packed[key] = packed
        return packed


@dataclass
class _Packed:
    ctx: ContextKV
    mask: Tensor
    rope: tuple[Tensor, Tensor]
    frames: int
    branches: list[int]
    row_line: Tensor  # (rows,) each row's line in the group (device, long)


def run_lines(batcher: StepBatcher, lines: list[StepLine]) -> None:
    """Step `lines` together until each is done (a test and benchmark helper: the scheduler in
    synthesis/ admits and retires lines between steps instead)."""
    live = list(lines)
    while live:
        for line in batcher.step(live):
            live.remove(line)
