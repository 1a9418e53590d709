"""The fast sampling path: the reference loop with a few deliberate moves.

1. AdaLN modulation precomputed for every step of the schedule: it depends on t only,
   so the 12 x 2 x 3 low-rank projections leave the loop.
2. Static shapes: frames and condition lengths are padded up to buckets (padded keys
   are masked, so valid outputs are unchanged) and on CUDA the whole sampling loop is
   captured once per bucket as a CUDA graph and replayed: one launch per line.
3. Where the Triton kernels of `engine.fused` run (CUDA): each block's elementwise work
   in five kernels, and fused projections, Q/K/V/gate as one GEMM (N = 4D), w1/w3 as one
   (N = 2 x hidden). Elsewhere (CPU, MPS, or a kernel that failed) the model's own blocks
   run with the precomputed modulation: the block math exists once for eager use.

It computes what `engine.sampler.sample` computes (tests compare the two on the CPU,
and the kernels in Triton's interpreter). It works on whatever linear layers the model
holds (`engine/fusing.py`: plain `nn.Linear`, or any layer class offering `concat`, as
the int4 layers do). Cancellation: eager runs check between steps; a graph replay runs
the whole loop (a few milliseconds) and is checked before and after.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from ..cancel import CancelToken, check
from .batch import batch_bucket, fill_batch, fill_tokens, frame_mask
from .cuda_graphs import capture
from .encoders import additive_mask
from .fast_duration import fast_duration_predictor
from .fast_text import fast_text_backbone
from .fused import add_rms_modulate, fused_available, gate_heads, qkv_joint, run_or_fall_back, swiglu
from .fusing import FastBlock, block_fusable, fuse_block
from .kernels.tuning import is_tuning_allowed
from .model import Conditions, ContextKV, DiffusionBlock, TextToLatentRFDiT, rope_tables
from .sampler import (
    LineContext,
    Plan,
    ProgressFn,
    SamplerConfig,
    check_inputs,
    euler_loop,
    initial_x,
    plan_for,
    prepare_context,
)


def diffusion_blocks(model: TextToLatentRFDiT) -> list[DiffusionBlock]:
    """The model's DiT blocks, typed (iterating an nn.ModuleList yields plain Modules)."""
    return [cast(DiffusionBlock, b) for b in model.blocks]


def round_up(n: int, bucket: int) -> int:
    return max(bucket, math.ceil(n / bucket) * bucket)


class FastDiT:
    """Inference-only view of a TextToLatentRFDiT: precomputed modulation; with the fused
    kernels (`fused`), fused projections too (built here, modifying the model's layers)."""

    def __init__(self, model: TextToLatentRFDiT, *, fused: bool | None = None) -> None:
        self.model = model
        self.cfg = model.cfg
        Dh = self.cfg.head_dim
        self.model_blocks = diffusion_blocks(model)
        # the Triton kernels of engine.fused where they run (CUDA); head_dim a power of two
        # (tl.arange) and projections that fuse (not the CPU preset's int8 linears)
        if fused is None:
            fused = fused_available(self.device) and Dh & (Dh - 1) == 0
            fused = fused and all(block_fusable(b) for b in self.model_blocks)
        self.fused = fused
        self._tables: dict[tuple, Tensor] = {}  # plan_table's, by schedule
        self.blocks: list[FastBlock] = []
        # the text tower's layers with fused kernels too (engine/fast_text.py): v4's ModernBERT, or
        # the scratch encoder of v2 / v3 / VoiceDesign
        self.text_backbone = fast_text_backbone(model) if self.fused else None
        self.duration = fast_duration_predictor(model) if self.fused else None  # engine/fast_duration.py
        if not self.fused:  # the model's own blocks: nothing to fuse (on the CPU separate GEMMs are as fast)
            return
        self.blocks = [fuse_block(blk) for blk in self.model_blocks]

    @property
    def dtype(self) -> torch.dtype:
        return self.model.in_proj.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.in_proj.weight.device

    def plan_table(self, plan: Plan) -> Tensor:
        """`modulation_table` of a plan's steps, made once per schedule and kept."""
        key = tuple((s.t, s.dt) for s in plan.steps)
        if key not in self._tables:
            ts = [s.t for s in plan.steps]
            dts = [float(s.dt or 0.0) for s in plan.steps] if self.cfg.meanflow else None
            self._tables[key] = self.modulation_table(ts, dts)
        return self._tables[key]

    @torch.inference_mode()
    def modulation_table(self, ts: list[float], dts: list[float] | None = None) -> Tensor:
        """(steps, layers, 6, D): attention shift/1+scale/gate, then mlp shift/1+scale/gate, per
        step; a MeanFlow model's also depends on each step's interval `dts`."""
        t = torch.tensor(ts, device=self.device, dtype=torch.float32)
        dt = None if dts is None else torch.tensor(dts, device=self.device, dtype=torch.float32)
        cond = self.model.time_condition(t, dt)  # (steps, 1, 3D)
        rows = [torch.cat(blk.modulation(cond), dim=1) for blk in self.model_blocks]
        return torch.stack(rows, dim=1).contiguous()  # each row (steps, 6, D)

    def velocity(
        self,
        x_t: Tensor,
        mod: Tensor,
        ctx: ContextKV,
        attn_mask: Tensor | None,
        rope: tuple[Tensor, Tensor],
        ctx_rows: Tensor | None = None,
    ) -> Tensor:
        """Velocity with the step's modulation `mod` (layers, 6, D); same result as model.velocity.
        `ctx_rows` (B,): row b's context is row `ctx_rows[b]` of `ctx` (the step batcher's pool)."""
        if self.fused and fused_available(self.device):
            return run_or_fall_back(
                lambda: self._velocity_fused(x_t, mod, ctx, attn_mask, rope, ctx_rows),
                lambda: self._velocity_model(x_t, mod, ctx, attn_mask, rope, ctx_rows),
            )
        return self._velocity_model(x_t, mod, ctx, attn_mask, rope, ctx_rows)

    def _velocity_model(
        self,
        x_t: Tensor,
        mod: Tensor,
        ctx: ContextKV,
        attn_mask: Tensor | None,
        rope: tuple[Tensor, Tensor],
        ctx_rows: Tensor | None = None,
    ) -> Tensor:
        """`velocity` through the model's own blocks, given each block's modulation."""
        m = self.model
        x = m.in_proj(x_t)
        for i, blk in enumerate(self.model_blocks):
            k, v = ctx.keys[i], ctx.values[i]
            if ctx_rows is not None:  # the blocks take each row's context as its own row
                k, v = k.index_select(0, ctx_rows), v.index_select(0, ctx_rows)
            x = blk.modulated(x, mod[i].unbind(0), k, v, attn_mask, rope)
        return m.out_proj(m.out_norm(x))

    def _velocity_fused(
        self,
        x_t: Tensor,
        mod: Tensor,
        ctx: ContextKV,
        attn_mask: Tensor | None,
        rope: tuple[Tensor, Tensor],
        ctx_rows: Tensor | None = None,
    ) -> Tensor:
        """`velocity` with the block's elementwise work in five Triton kernels (engine.fused).

        Each residual add is folded into the next norm: x += gate * y happens in the
        add_rms_modulate that starts the next sub-block (or the final norm)."""
        m, H, eps = self.model, self.cfg.num_heads, self.cfg.norm_eps
        x = m.in_proj(x_t)
        y = gate = None
        for i, fb in enumerate(self.blocks):
            a_shift, a_scale1, a_gate, f_shift, f_scale1, f_gate = mod[i].unbind(0)
            x, h = add_rms_modulate(x, y, gate, a_scale1, a_shift, eps)
            p = fb.qkvg(h)
            q, keys, values = qkv_joint(
                p, fb.q_norm, fb.k_norm, *rope, ctx.keys[i], ctx.values[i], H, eps, ctx_rows=ctx_rows
            )
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=attn_mask)
            x, h = add_rms_modulate(x, fb.wo(gate_heads(o, p)), a_gate, f_scale1, f_shift, eps)
            y, gate = fb.w2(swiglu(fb.w13(h), fb.hidden)), f_gate
        _, h = add_rms_modulate(x, y, gate, m.out_norm.weight, None, eps)
        return m.out_proj(h)


def context_rung(n: int, bucket: int, least: int = 1) -> int:
    """`n` positions rounded up to `bucket` times a power of two (32, 64, 128, ...), at least
    `least` buckets."""
    return bucket * max(least, 1 << max(0, math.ceil(n / bucket) - 1).bit_length())


#: A batch's text on the rungs from two context buckets up (64, 128, 256 tokens): prewarm's batch
#: graphs at 64 and 128 then serve every piece up to 128 tokens (the splitter's 90-character
#: pieces are ~73 llm-jp tokens), a short line paying 64 positions of text instead of 32.
TEXT_RUNG_LEAST = 2


def pad_conditions(conds: Conditions, bucket: int, *, rungs: bool = False) -> Conditions:
    """Pad every condition's length up to a multiple of `bucket` with masked zeros (exact).

    `rungs` (a whole-line batch's): every condition up to its `context_rung` instead (the text's
    at least `TEXT_RUNG_LEAST` buckets), so lines of many text and reference lengths fall into a
    few shapes (a batch graph per shape serves them all, at the cost of attending to up to
    twice the positions)."""

    def pad(state: Tensor, mask: Tensor, least: int = 1) -> tuple[Tensor, Tensor]:
        n = state.shape[1]
        extra = (context_rung(n, bucket, least) if rungs else round_up(n, bucket)) - n
        if extra == 0:
            return state, mask
        return F.pad(state, (0, 0, 0, extra)), F.pad(mask, (0, extra), value=False)

    def pad_voice(state: Tensor | None, mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        return (state, mask) if state is None or mask is None else pad(state, mask)

    ts, tm = pad(conds.text_state, conds.text_mask, TEXT_RUNG_LEAST)
    ss, sm = pad_voice(conds.speaker_state, conds.speaker_mask)
    cs, cm = pad_voice(conds.caption_state, conds.caption_mask)
    return Conditions(ts, tm, ss, sm, cs, cm)


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: list[Tensor | None]  # static input buffers, refilled before each replay
    out: Tensor

    def replay(self, inputs: Sequence[Tensor | None]) -> Tensor:
        """Copy `inputs` into the static buffers, replay; the output buffer (overwritten next time)."""
        for dst, src in zip(self.inputs, inputs):
            if dst is not None and src is not None:
                dst.copy_(src)
        self.graph.replay()
        return self.out


def additive_masks(ctx: LineContext, dtype: torch.dtype) -> LineContext:
    """The context's boolean key masks as additive 0 / -inf masks in `dtype`, made once per line
    (SDPA would convert a boolean mask on every call: 2 extra kernels per layer and step)."""
    masks = [additive_mask(m, dtype) for m in ctx.group_masks]
    return LineContext(ctx.groups, masks, ctx.cond, additive_mask(ctx.cond_mask, dtype))


class FastSampler:
    """Runs `sample()`'s loop on a FastDiT, padded to static buckets; CUDA-graphed on CUDA.

    A graph covers the whole line after the encoders: the condition keys/values of every guidance
    group (`prepare_context`), then every step. Its inputs are the padded conditions and the
    initial noise, copied into static buffers before each replay. `encode_text` replays a second,
    small graph per (batch bucket, text-length bucket) for the text encoder.
    """

    def __init__(
        self,
        model: TextToLatentRFDiT | FastDiT,
        *,
        frame_bucket: int = 16,
        context_bucket: int = 32,
        batch_frame_bucket: int = 64,
        use_graphs: bool | None = None,
        max_graphs: int = 64,
        upload: Callable[[Tensor, torch.device], Tensor] | None = None,
    ) -> None:
        self.fast = model if isinstance(model, FastDiT) else FastDiT(model)
        self.upload = upload  # host -> device without waiting (the device owner's), else `.to`
        self.frame_bucket = frame_bucket
        self.context_bucket = context_bucket
        self.batch_frame_bucket = batch_frame_bucket  # coarser for batches: fewer graphs to prewarm
        self.use_graphs = self.fast.device.type == "cuda" if use_graphs is None else use_graphs
        self.max_graphs = max_graphs
        self._graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        # batches of several lines, by batch bucket: captured only in warm-up (prewarm), so a
        # bounded set, kept apart from the lines' LRU and never evicted
        self._batch_graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self._text_graphs: dict[tuple, _Graph] = {}
        # the graphs' static inputs, one buffer per shape shared by every graph taking one: each
        # replay copies its inputs in first, and replays run one at a time (a voice's states were
        # cloned once per frame bucket, ~0.4 MB a line for a 10 s reference on the full-size v2)
        self._statics: dict[tuple, Tensor] = {}
        self._pool: Any = None  # one memory pool for every graph: replays are sequential
        self.captures = 0  # sampling graphs captured so far (prewarm reports it)
        self.text_captures = 0  # text-encoder graphs captured so far

    # ---- per-line preparation ------------------------------------------------------------------
    def text_width(self, length: int) -> int:
        """The width of the states `encode_text` returns for `length` tokens (padded with graphs)."""
        return round_up(length, self.context_bucket) if self.use_graphs else length

    def predict_log_frames(self, conds: Conditions, has_speaker: Tensor) -> Tensor:
        """`model.predict_log_frames`, through the fused predictor where there is one (eager: a
        line's length is asked once, at its encoders)."""
        with torch.inference_mode():
            return self.fast.model.predict_log_frames(conds, has_speaker, body=self.fast.duration)

    def encode_text(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """`model.encode_text` as (states, mask); with graphs, replayed from one graph per
        (batch, length padded to the context bucket) and returned padded (`text_width`).

        Several rows (lines encoded together) are filled up to a batch bucket with copies of the
        first (`fill_tokens`; their outputs dropped), so a few graphs serve every batch size; a
        batch shape that warm-up did not capture runs eagerly: a capture mid-stream would stall
        every waiting line.
        Padded positions are masked (their states are zero), so `sample` gives what it gives on
        the unpadded states (it pads them itself when they are not).
        """
        model, backbone = self.fast.model, self.fast.text_backbone
        # the model's own call where the backbone is its own (no fused one here)
        encode = model.encode_text if backbone is None else partial(model.encode_text, backbone=backbone)
        with torch.inference_mode():
            if not self.use_graphs:  # eager: no point encoding padding
                return encode(ids, mask), mask
            B = ids.shape[0]
            pad = round_up(ids.shape[1], self.context_bucket) - ids.shape[1]
            ids, mask = F.pad(ids, (0, pad), value=0), F.pad(mask, (0, pad), value=False)
            rows = 1 if B == 1 else batch_bucket(B)
            key = (rows, ids.shape[1])
            g = self._text_graphs.get(key)
            if g is None and B > 1 and not is_tuning_allowed():
                return encode(ids, mask), mask
            inputs: list[Tensor | None] = list(fill_tokens(ids, mask, rows))
            if g is None:
                g = self._text_graphs[key] = self._capture(encode, inputs)
                self.text_captures += 1
            return g.replay(inputs)[:B].clone(), mask

    def line_shape(self, conds: Conditions) -> tuple:
        """What a voice's single-line graphs are captured for beyond text and frames: its
        conditions' lengths on the context bucket (voices of one bucket share the graphs)."""
        padded = pad_conditions(conds, self.context_bucket)
        return tuple(None if t is None else (t.shape[1], t.dtype) for t in _fields(padded)[2:])

    def keep_room(self, graphs: int) -> None:
        """Grow the single-line graphs' LRU so that `graphs` more fit beside those it holds
        (prewarm, before it captures a voice's: no voice's graphs evict another's)."""
        self.max_graphs = max(self.max_graphs, len(self._graphs) + graphs)

    def batch_shape(self, conds: Conditions, cfg: SamplerConfig) -> tuple:
        """What the batch graphs of lines like `conds` are captured for, beyond rows and frames:
        the plan and the padded conditions' lengths (on their rungs). Lines of texts and voices
        with one batch shape share the batch graphs."""
        padded = pad_conditions(conds, self.context_bucket, rungs=True)
        lengths = tuple(None if t is None else (t.shape[1], t.dtype) for t in _fields(padded))
        return (plan_for(self.fast.model, conds, cfg), lengths)

    def sample(
        self,
        conds: Conditions,
        noise: Tensor,
        cfg: SamplerConfig | None = None,
        *,
        cancel: CancelToken | None = None,
        progress: ProgressFn | None = None,
        frames: Sequence[int] | None = None,
    ) -> Tensor:
        """Same contract as `engine.sampler.sample`; padding is handled here. `frames`: each row's
        own length when the rows are several lines of different lengths (`engine.batch`): row b
        is valid in [0, frames[b]) and the rest is masked (default: every row is all valid)."""
        with torch.inference_mode():  # graph buffers are inference tensors: always use them inside it
            return self._sample(conds, noise, cfg or SamplerConfig(), cancel, progress, frames)

    def _sample(self, conds, noise, cfg, cancel, progress, frames=None, plan=None) -> Tensor:
        model = self.fast.model
        check_inputs(model, conds, noise)
        plan = plan_for(model, conds, cfg) if plan is None else plan
        B, S, _ = noise.shape
        lengths = [S] * B if frames is None else list(frames)
        bucket = self.frame_bucket
        batch = self.use_graphs and frames is not None and B > 1
        if batch:
            # several lines: filled up to a batch bucket, so a graph per bucket serves every size
            lines = (conds, noise, lengths)
            conds, noise, lengths = fill_batch(conds, noise, lengths, batch_bucket(B))
            bucket = self.batch_frame_bucket
        S_pad = round_up(S, bucket * model.cfg.latent_patch_size)
        # a batch's conditions on the rungs: lines of many texts and voices share a few batch graphs
        padded = pad_conditions(conds, self.context_bucket, rungs=batch)
        latent_mask = None
        if S_pad != S or self.use_graphs or frames is not None:  # graphs: always a mask (one graph, both)
            latent_mask = frame_mask(lengths, S_pad, self.fast.device, self.upload)
            noise = F.pad(noise, (0, 0, 0, S_pad - S))
        x0 = initial_x(noise, cfg, self.fast.device)
        table = self.fast.plan_table(plan)
        check(cancel)

        inputs = [x0, *_fields(padded), latent_mask]
        if not self.use_graphs:
            return self._loop_line(plan, cfg, table, S_pad, *inputs, cancel=cancel, progress=progress)[:, :S]
        key = (
            plan,
            cfg.rescale_k,
            cfg.rescale_sigma,
            cfg.speaker_kv_scale,
            cfg.speaker_kv_max_layers,
            tuple(None if t is None else (tuple(t.shape), t.dtype) for t in inputs),
        )
        # the rows' lengths are data (the latent mask), so one graph serves any lengths of a shape
        graphs = self._graphs if B == 1 else self._batch_graphs
        g = graphs.get(key)
        if g is None and B > 1 and frames is not None and not is_tuning_allowed():
            # a batch shape prewarm did not capture: a capture here would stall every waiting line
            # for longer than running them one by one, each from its own graph
            return self._one_by_one(*lines, cfg, cancel, progress, plan)
        if g is None:
            if B == 1 and len(graphs) >= self.max_graphs:  # batch graphs: warm-up only, a bounded set
                graphs.popitem(last=False)
                self._forget_statics()
            # captured without cancel/progress: a replay runs the whole line at once
            g = graphs[key] = self._capture(lambda *xs: self._loop_line(plan, cfg, table, S_pad, *xs), inputs)
            self.captures += 1
        else:
            graphs.move_to_end(key)
        out = g.replay(inputs)[:B, :S].clone()
        check(cancel)
        if progress is not None:
            progress(len(plan.steps), len(plan.steps))
        return out

    def _one_by_one(self, conds, noise, lengths, cfg, cancel, progress, plan) -> Tensor:
        """The rows of a batch sampled as lone lines, stacked back: (B, S, C), zero past each length.
        Each row keeps the batch's plan (its lines share it): planning a row anew would read its
        sliced mask, a new tensor, on the host (a sync on CUDA)."""
        out = torch.zeros(noise.shape, dtype=torch.float32, device=self.fast.device)
        for b, n in enumerate(lengths):
            row = self._sample(conds.row(b), noise[b : b + 1, :n], cfg, cancel, progress, plan=plan)
            out[b, :n] = row[0]
        return out

    def _loop_line(self, plan, cfg, table, S_pad, x0, *cond_and_mask, cancel=None, progress=None) -> Tensor:
        """One line from its padded inputs: condition K/V of every group, then the loop."""
        *states, lm = cond_and_mask
        ctx = prepare_context(self.fast.model, Conditions(*states), plan, S_pad, lm)
        return self._loop(plan, cfg, x0, additive_masks(ctx, self.fast.dtype), table, cancel, progress)

    def _loop(self, plan, cfg, x0, ctx, table, cancel=None, progress=None) -> Tensor:
        rope = rope_tables(x0.shape[1] // self.fast.cfg.latent_patch_size, self.fast.cfg.head_dim, x0.device)
        fast = self.fast

        def velocity(xb: Tensor, i: int, c: ContextKV, mask: Tensor | None) -> Tensor:
            return fast.velocity(xb, table[i], c, mask, rope)

        if cfg.speaker_kv_scale is not None:
            ctx.scale_speaker(cfg.speaker_kv_scale, cfg.speaker_kv_max_layers)
        return euler_loop(plan, cfg, x0, ctx, velocity, dtype=fast.dtype, cancel=cancel, progress=progress)

    # ---- CUDA graphs -------------------------------------------------------------------------------
    def graph_pool(self) -> Any:
        """The memory pool of every graph here, and of the step batcher's (engine/step_graphs.py):
        all replay one after another on the device owner, so they share it."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def _capture(self, fn, inputs: list[Tensor | None]) -> _Graph:
        """Capture `fn(*static_inputs)` as a CUDA graph after a warm-up run (`cuda_graphs.capture`);
        its static inputs are the shared buffers of their shapes (`_static`)."""
        static = [None if t is None else self._static(i, t) for i, t in enumerate(inputs)]
        warm = [None if t is None else t.clone() for t in inputs]
        graph, out = capture(fn, static, self.graph_pool(), warm=warm)
        return _Graph(graph, static, out)

    def _static(self, index: int, like: Tensor) -> Tensor:
        """The static buffer of a graph's input `index` of `like`'s shape, dtype and device (made
        from `like`): by index too, so that two inputs of one graph never share one (a text mask
        and a voice mask can have one shape)."""
        key = (index, tuple(like.shape), like.dtype, like.device)
        buf = self._statics.get(key)
        if buf is None:
            buf = self._statics[key] = like.clone()
        return buf

    def _forget_statics(self) -> None:
        """Let go of the buffers no kept graph reads (after a single-line graph is evicted)."""
        kept = {
            id(t)
            for table in (self._graphs, self._batch_graphs, self._text_graphs)
            for g in table.values()
            for t in g.inputs
            if t is not None
        }
        self._statics = {k: t for k, t in self._statics.items() if id(t) in kept}


def _fields(c: Conditions) -> list[Tensor | None]:
    return [c.text_state, c.text_mask, c.speaker_state, c.speaker_mask, c.caption_state, c.caption_mask]
