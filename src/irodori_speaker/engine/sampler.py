"""Euler sampler over the flow ODE: a plain loop, for both parameterisations.

- Rectified flow (v2, v3, v4, v4.1): the instantaneous velocity with classifier-free
  guidance, 40 linear steps by default.
- MeanFlow (v4.1-MF): the average velocity over each step's interval, t from 1 to 0 in N
  equal steps (4 by default), one forward per step, no guidance: it is distilled into the
  model.

Everything that decides what a step does (its t and dt, whether guidance is on, which
condition an alternating step drops, when speaker K/V scaling ends) is planned on
the host before the loop, so the loop never waits for the device.
Settings and the golden cases it matches: docs/engine-api.md ("Sample from explicit noise").
`SamplerConfig` is defined in the torch-free `irodori_speaker.options` (the sampler part of
`SynthesisOptions`: each option once, with its check); it is re-exported here.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..cancel import CancelToken, check
from ..errors import InputError
from ..options import GUIDANCE_MODES as GUIDANCE_MODES  # re-exported
from ..options import SCHEDULES, SamplerConfig, SamplerDefaults
from .model import Conditions, ContextKV, TextToLatentRFDiT

UPSTREAM_CONFIG = SamplerConfig()  # 40 linear steps, independent CFG
RF_DEFAULT_STEPS = 40  # upstream's default for rectified-flow files
MEANFLOW_DEFAULT_STEPS = 4  # what the v4.1-Small-MF release runs


def default_steps(meanflow: bool) -> int:
    return MEANFLOW_DEFAULT_STEPS if meanflow else RF_DEFAULT_STEPS


def _check_steps(num_steps: object) -> int:
    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
        raise InputError(f"num_steps must be a positive integer, got {num_steps!r}")
    return num_steps


def time_schedule(num_steps: int, schedule: str = "linear", sway_coeff: float = -1.0) -> list[float]:
    """t_0 > t_1 > ... > t_N with t_i = 0.999 * (1 - u_i); raises if not strictly decreasing."""
    _check_steps(num_steps)
    if schedule not in SCHEDULES:
        raise InputError(f"unknown schedule {schedule!r}; use one of {', '.join(SCHEDULES)}")
    ts = []
    for i in range(num_steps + 1):
        u = i / num_steps
        if schedule == "sway":
            u = min(max(u + sway_coeff * (math.cos(math.pi * u / 2) + u - 1), 0.0), 1.0)
        ts.append(0.999 * (1.0 - u))
    if any(b >= a for a, b in itertools.pairwise(ts)):
        raise InputError(
            f"sway coefficient {sway_coeff} gives a schedule that is not strictly decreasing "
            f"for {num_steps} steps; use a coefficient in about [-1, 0]"
        )
    return ts


@dataclass(frozen=True)
class Step:
    t: float
    t_next: float
    group: int  # index into Plan.groups; -1 = conditional branch only (no guidance)
    unscale_speaker_kv: bool = False  # divide the speaker K/V scaling back after this step
    dt: float | None = None  # MeanFlow: the interval t - r the step's average velocity covers


@dataclass(frozen=True)
class Plan:
    """Host-side plan: branch groups (each a tuple of dropped-condition tuples) and the steps."""

    enabled: tuple[str, ...]
    groups: tuple[tuple[tuple[str, ...], ...], ...]
    weights: tuple[tuple[float, ...], ...]  # per group: the scale of each non-conditional branch
    steps: tuple[Step, ...]


def enabled_conditions(model: TextToLatentRFDiT, conds: Conditions, cfg: SamplerConfig) -> tuple[str, ...]:
    """The conditions guidance runs on: speaker only with a reference (some valid position),
    caption only with a non-empty caption (one host sync each, the first time a mask is seen)."""
    enabled = []
    if cfg.cfg_scale_text > 0:
        enabled.append("text")
    if cfg.cfg_scale_speaker > 0 and model.cfg.speaker_enabled and _any(conds.speaker_mask):
        enabled.append("speaker")
    if cfg.cfg_scale_caption > 0 and _any(conds.caption_mask):
        enabled.append("caption")
    return tuple(enabled)


_ANY: dict[int, tuple[weakref.ref, bool]] = {}  # id(mask) -> (the mask, whether any is set)


def _any(mask: Tensor | None) -> bool:
    """Whether `mask` has a valid position; kept per mask tensor: a voice's masks are made once
    and reused by every line, so only its first line pays the host sync (engine/hardware/owner.py).
    (Keyed by id with a weak reference: a WeakKeyDictionary compares tensors with ==.)"""
    if mask is None:
        return False
    known = known_any(mask)
    if known is not None:
        return known
    got = bool(mask.any())
    note_any(mask, got)
    return got


def known_any(mask: Tensor) -> bool | None:
    """`_any(mask)` if it is known without reading the mask, else None."""
    hit = _ANY.get(id(mask))
    return hit[1] if hit is not None and hit[0]() is mask else None


def note_any(mask: Tensor, got: bool) -> None:
    """Tell `_any` what `mask` holds without reading it (a batch's mask stacked from its lines',
    whose answers are known: engine/batch.py)."""
    key = id(mask)

    def forget(_: object) -> None:
        _ANY.pop(key, None)

    _ANY[key] = (weakref.ref(mask, forget), got)


def plan_sampling(cfg: SamplerConfig, enabled: tuple[str, ...]) -> Plan:
    """The rectified-flow plan: schedule, guidance groups, the CFG window, speaker K/V scaling."""
    num_steps, schedule, sway_coeff = cfg.time_grid()
    ts = time_schedule(num_steps, schedule, sway_coeff)
    groups: list[tuple[tuple[str, ...], ...]] = []
    weights: list[tuple[float, ...]] = []
    if enabled and cfg.guidance == "independent":
        groups.append(((), *tuple((name,) for name in enabled)))
        weights.append(tuple(cfg.scale(n) for n in enabled))
    elif enabled and cfg.guidance == "joint":
        scales = {cfg.scale(n) for n in enabled}
        if len(scales) != 1:
            raise InputError(
                "joint guidance needs equal scales for every enabled condition, got "
                + ", ".join(f"{n}={cfg.scale(n)}" for n in enabled)
            )
        groups.append(((), tuple(enabled)))
        weights.append((scales.pop(),))
    elif enabled:  # alternating: one group per condition
        for name in enabled:
            groups.append(((), (name,)))
            weights.append((cfg.scale(name),))

    steps, kv_scaled = [], cfg.speaker_kv_scale is not None
    for i in range(num_steps):
        t, t_next = ts[i], ts[i + 1]
        group = -1
        if enabled and cfg.cfg_min_t <= t <= cfg.cfg_max_t:
            group = i % len(enabled) if cfg.guidance == "alternating" else 0
        unscale = kv_scaled and t_next < cfg.speaker_kv_min_t
        if unscale:
            kv_scaled = False
        steps.append(Step(t, t_next, group, unscale))
    return Plan(tuple(enabled), tuple(groups), tuple(weights), tuple(steps))


# Settings of the rectified-flow sampler that a MeanFlow model cannot honour (its guidance is
# distilled in); each would silently change nothing, so asking for one is an error.
RF_ONLY = ("truncation_factor", "rescale_k", "rescale_sigma", "speaker_kv_scale")


# Sampler options a MeanFlow model does not read at all (guidance is distilled in, the schedule
# is fixed): they change nothing in the sound (the phrase cache leaves them out of its key).
MEANFLOW_IGNORED = (
    "schedule",
    "sway_coeff",
    "guidance",
    "cfg_scale_text",
    "cfg_scale_speaker",
    "cfg_scale_caption",
    "cfg_min_t",
    "cfg_max_t",
    "speaker_kv_min_t",
    "speaker_kv_max_layers",
)


def meanflow_defaults() -> SamplerDefaults:
    """What a MeanFlow file runs when the caller leaves the sampler options unset: the
    release's 4 steps (schedule and sway are not read)."""
    return SamplerDefaults(steps=MEANFLOW_DEFAULT_STEPS, schedule="linear", sway_coeff=-1.0)


def meanflow_conflicts(cfg: SamplerConfig) -> list[str]:
    """The RF-only settings `cfg` asks for (the Synthesizer drops them with a warning)."""
    return [name for name in RF_ONLY if getattr(cfg, name) is not None]


def plan_meanflow(cfg: SamplerConfig) -> Plan:
    """MeanFlow: s_i = linspace(1, 0, N + 1) in float32; step i covers [s_{i+1}, s_i], dt = s_i - s_{i+1}.

    One conditional forward per step; CFG scales, guidance mode, window and schedule are ignored.
    """
    conflicts = meanflow_conflicts(cfg)
    if conflicts:
        raise InputError(
            f"{', '.join(conflicts)} cannot be used with a MeanFlow model",
            hint="MeanFlow files (v4.1-MF) have guidance distilled in; leave these unset",
        )
    n = _check_steps(MEANFLOW_DEFAULT_STEPS if cfg.steps is None else cfg.steps)
    s = torch.linspace(1.0, 0.0, n + 1, dtype=torch.float32)
    ts, dts = s.tolist(), (s[:-1] - s[1:]).tolist()
    steps = tuple(Step(ts[i], ts[i + 1], -1, dt=dts[i]) for i in range(n))
    return Plan((), (), (), steps)


def plan_for(model: TextToLatentRFDiT, conds: Conditions, cfg: SamplerConfig) -> Plan:
    """The model's sampler: MeanFlow for MeanFlow files, else rectified flow with guidance."""
    if model.cfg.meanflow:
        return plan_meanflow(cfg)
    return plan_sampling(cfg, enabled_conditions(model, conds, cfg))


def rescale_velocity(v: Tensor, x: Tensor, t: float, k: float, sigma: float) -> Tensor:
    """Temporal score rescaling (applied for t < 1)."""
    if t >= 1.0:
        return v
    snr = (1 - t) ** 2 / t**2
    r = (snr * sigma**2 + 1) / (snr * sigma**2 / k + 1)
    return (r * ((1 - t) * v + x) - x) / (1 - t)


ProgressFn = Callable[[int, int], None]
# velocity(x in model dtype (rows, S, C), step index, context, attention mask) -> model output
VelocityFn = Callable[[Tensor, int, ContextKV, "Tensor | None"], Tensor]


@dataclass
class LineContext:
    """Per-line condition keys/values and masks for each branch group (built once, before the loop)."""

    groups: list[ContextKV]
    group_masks: list[Tensor | None]
    cond: ContextKV  # rows [0, B) of group 0: the conditional branch alone
    cond_mask: Tensor | None

    def scale_speaker(self, factor: float, max_layers: int | None) -> None:
        for c in self.groups:  # cond is a view of groups[0]: scaled with it
            c.scale_segment("speaker", factor, max_layers)


def prepare_context(
    model: TextToLatentRFDiT, conds: Conditions, plan: Plan, seq_len: int, latent_mask: Tensor | None = None
) -> LineContext:
    B = conds.batch_size
    if plan.groups:
        groups = [model.context_kv(Conditions.cat([conds.dropped(*b) for b in g])) for g in plan.groups]
        lms = [None if latent_mask is None else latent_mask.repeat(len(g), 1) for g in plan.groups]
        masks = [model.attention_mask(c, seq_len, m) for c, m in zip(groups, lms)]
    else:
        groups, masks = [model.context_kv(conds)], []
    cond = groups[0].rows(B)
    return LineContext(groups, masks, cond, model.attention_mask(cond, seq_len, latent_mask))


def euler_loop(
    plan: Plan,
    cfg: SamplerConfig,
    x: Tensor,
    ctx: LineContext,
    velocity: VelocityFn,
    *,
    dtype: torch.dtype,
    cancel: CancelToken | None = None,
    progress: ProgressFn | None = None,
) -> Tensor:
    """The sampling loop proper: guidance, rescaling, the Euler update; x is float32 (B, S, C)."""
    B, S, C = x.shape
    for i, step in enumerate(plan.steps):
        check(cancel)
        n = branch_rows(plan, step)
        xb = x.to(dtype) if n == 1 else x.to(dtype).repeat(n, 1, 1)
        c, mask = (
            (ctx.cond, ctx.cond_mask)
            if step.group < 0
            else (ctx.groups[step.group], ctx.group_masks[step.group])
        )
        out = velocity(xb, i, c, mask).float().view(n, B, S, C)
        x = euler_step(plan, cfg, step, x, out, ctx)
        if progress is not None:
            progress(i + 1, len(plan.steps))
    return x


def branch_rows(plan: Plan, step: Step) -> int:
    """How many branches (rows per line) the step's forward runs: 1 without guidance."""
    return 1 if step.group < 0 else len(plan.groups[step.group])


def branch_coefficients(plan: Plan, step: Step) -> list[float]:
    """The guided velocity as one weighted sum of the step's branch outputs: [1 + sum w, -w_1,
    ...] (`euler_step`'s v_c + sum_j w_j (v_c - out_j), rearranged), for rows sampled in one
    matmul across lines (engine/steps.py)."""
    if step.group < 0:
        return [1.0]
    ws = plan.weights[step.group]
    return [1.0 + sum(ws), *(-w for w in ws)]


def euler_step(
    plan: Plan, cfg: SamplerConfig, step: Step, x: Tensor, out: Tensor, ctx: LineContext
) -> Tensor:
    """One step's update from the model's outputs `out` (branches, B, S, C) in float32: guidance,
    rescaling, the Euler move, and the planned speaker K/V unscaling of `ctx` (in place)."""
    v_c = out[0]
    if step.group < 0:
        v = v_c
    else:
        v = v_c.clone()
        for j, w in enumerate(plan.weights[step.group], start=1):
            v = v + w * (v_c - out[j])
    if cfg.rescale_k is not None and cfg.rescale_sigma is not None:
        v = rescale_velocity(v, x, step.t, cfg.rescale_k, cfg.rescale_sigma)
    x = x + v * (step.t_next - step.t)
    if step.unscale_speaker_kv and cfg.speaker_kv_scale is not None:  # planned only with a scale
        ctx.scale_speaker(1.0 / cfg.speaker_kv_scale, cfg.speaker_kv_max_layers)
    return x


def check_inputs(model: TextToLatentRFDiT, conds: Conditions, noise: Tensor) -> None:
    B, S, C = noise.shape
    if conds.batch_size != B:
        raise InputError(f"conditions have batch {conds.batch_size} but noise has batch {B}")
    if model.cfg.latent_dim != C:
        raise InputError(f"noise has {C} channels, the model expects latent_dim {model.cfg.latent_dim}")
    if S % model.cfg.latent_patch_size:
        raise InputError(f"sequence length {S} is not a multiple of latent_patch_size")


def initial_x(noise: Tensor, cfg: SamplerConfig, device: torch.device) -> Tensor:
    x = noise.to(device=device, dtype=torch.float32)
    return x * cfg.truncation_factor if cfg.truncation_factor is not None else x


def sample(
    model: TextToLatentRFDiT,
    conds: Conditions,
    noise: Tensor,
    cfg: SamplerConfig = UPSTREAM_CONFIG,
    *,
    latent_mask: Tensor | None = None,
    cancel: CancelToken | None = None,
    progress: ProgressFn | None = None,
) -> Tensor:
    """Integrate from `noise` (B, S, latent_dim) at t ~ 1 down to t ~ 0; returns the latent.

    `conds` has batch B (use `Conditions.repeat` for several candidates of one line).
    This is the reference path; `engine.fast` runs the same loop with fused weights and CUDA graphs.
    """
    check_inputs(model, conds, noise)
    plan = plan_for(model, conds, cfg)
    device = model.in_proj.weight.device
    ctx = prepare_context(model, conds, plan, noise.shape[1], latent_mask)
    if cfg.speaker_kv_scale is not None:
        ctx.scale_speaker(cfg.speaker_kv_scale, cfg.speaker_kv_max_layers)
    ts = torch.tensor([s.t for s in plan.steps], device=device, dtype=torch.float32)
    dts = None
    if model.cfg.meanflow:
        dts = torch.tensor([s.dt for s in plan.steps], device=device, dtype=torch.float32)

    def velocity(xb: Tensor, i: int, c: ContextKV, mask: Tensor | None) -> Tensor:
        dt = None if dts is None else dts[i].expand(xb.shape[0])
        return model.velocity(xb, ts[i].expand(xb.shape[0]), c, dt=dt, attn_mask=mask)

    x = initial_x(noise, cfg, device)
    dtype = model.in_proj.weight.dtype
    return euler_loop(plan, cfg, x, ctx, velocity, dtype=dtype, cancel=cancel, progress=progress)


def draw_noise(
    seed: int, batch: int, frames: int, latent_dim: int, *, device: str | torch.device = "cpu"
) -> Tensor:
    """N(0, I) noise drawn on the CPU with a seeded generator: a seed is the same voice on every device."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    return torch.randn(batch, frames, latent_dim, generator=gen, dtype=torch.float32).to(device)
