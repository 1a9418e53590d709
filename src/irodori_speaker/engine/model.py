"""Irodori-TTS TextToLatentRFDiT in plain PyTorch, readable top to bottom (the condition
encoders are in engine/encoders.py, the v4 text backbones in engine/text_backbone.py).

Module names equal the released tensor names (`blocks.3.attention.wq.weight`, ...),
so the released checkpoints load unchanged. Proof: the reference's golden outputs in
`tests/data/dit` (docs/engine-api.md).

Data flow: `encode_conditions` (text / speaker / caption encoders, once per line) ->
`context_kv` (per-layer keys and values of the conditions, once per line: they do
not depend on t) -> `velocity(x_t, t, ctx)` per sampler step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import InputError
from .config import ModelConfig
from .duration import DurationPredictor
from .encoders import ReferenceLatentEncoder, TextEncoder, key_mask
from .layers import RMSNorm, SwiGLU, apply_rope, rms_normalize, rope_tables, timestep_embedding
from .text_backbone import PretrainedTextBackbone, TextProjector

# ---------------------------------------------------------------------------------------------
# Diffusion transformer
# ---------------------------------------------------------------------------------------------


class LowRankAdaLN(nn.Module):
    """shift/scale/gate = c + up(down(silu(c))) each; the block applies rms(x) * (1 + scale) + shift."""

    def __init__(self, dim: int, rank: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.shift_down, self.shift_up = nn.Linear(dim, rank, bias=False), nn.Linear(rank, dim, bias=True)
        self.scale_down, self.scale_up = nn.Linear(dim, rank, bias=False), nn.Linear(rank, dim, bias=True)
        self.gate_down, self.gate_up = nn.Linear(dim, rank, bias=False), nn.Linear(rank, dim, bias=True)

    def modulation(self, cond: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(shift, scale, tanh(gate)) from cond (B, 1, 3D); depends on t only."""
        shift, scale, gate = cond.chunk(3, dim=-1)
        shift = shift + self.shift_up(self.shift_down(F.silu(shift)))
        scale = scale + self.scale_up(self.scale_down(F.silu(scale)))
        gate = gate + self.gate_up(self.gate_down(F.silu(gate)))
        return shift, scale, torch.tanh(gate)


class JointAttention(nn.Module):
    """Latent self-attention joined with cached condition keys/values.

    RoPE rotates the first half of the heads only; context keys get k_norm but no RoPE.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        D = cfg.model_dim
        self.heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.wq = nn.Linear(D, D, bias=False)
        self.wk = nn.Linear(D, D, bias=False)
        self.wv = nn.Linear(D, D, bias=False)
        self.wo = nn.Linear(D, D, bias=False)
        self.gate = nn.Linear(D, D, bias=False)
        self.q_norm = RMSNorm((self.heads, self.head_dim), cfg.norm_eps)
        self.k_norm = RMSNorm((self.heads, self.head_dim), cfg.norm_eps)
        self.wk_text = nn.Linear(cfg.text_dim, D, bias=False)
        self.wv_text = nn.Linear(cfg.text_dim, D, bias=False)
        if cfg.speaker_enabled:
            self.wk_speaker = nn.Linear(cfg.speaker_dim, D, bias=False)
            self.wv_speaker = nn.Linear(cfg.speaker_dim, D, bias=False)
        if cfg.caption_enabled:
            self.wk_caption = nn.Linear(cfg.caption("dim"), D, bias=False)
            self.wv_caption = nn.Linear(cfg.caption("dim"), D, bias=False)

    def context_kv(self, state: Tensor, name: str) -> tuple[Tensor, Tensor]:
        """Keys k_norm(wk_<name>(state)) and values wv_<name>(state), as (B, H, S, Dh)."""
        B, S, _ = state.shape
        k = getattr(self, f"wk_{name}")(state).view(B, S, self.heads, self.head_dim)
        v = getattr(self, f"wv_{name}")(state).view(B, S, self.heads, self.head_dim)
        return self.k_norm(k).transpose(1, 2), v.transpose(1, 2)

    def forward(
        self, h: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor | None, rope: tuple[Tensor, Tensor]
    ) -> Tensor:
        B, S, D = h.shape
        q = self.q_norm(self.wq(h).view(B, S, self.heads, self.head_dim))
        k = self.k_norm(self.wk(h).view(B, S, self.heads, self.head_dim))
        v = self.wv(h).view(B, S, self.heads, self.head_dim)
        half = self.heads // 2
        q = torch.cat((apply_rope(q[:, :, :half], *rope), q[:, :, half:]), dim=2)
        k = torch.cat((apply_rope(k[:, :, :half], *rope), k[:, :, half:]), dim=2)
        k = torch.cat((k.transpose(1, 2), ctx_k), dim=2)
        v = torch.cat((v.transpose(1, 2), ctx_v), dim=2)
        # The latent's own keys are always there, so no row is fully masked: no check, no sync.
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(B, S, D)
        return self.wo(out * torch.sigmoid(self.gate(h)))


class DiffusionBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_adaln = LowRankAdaLN(cfg.model_dim, cfg.adaln_rank, cfg.norm_eps)
        self.attention = JointAttention(cfg)
        self.mlp_adaln = LowRankAdaLN(cfg.model_dim, cfg.adaln_rank, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.model_dim, cfg.mlp_hidden)

    def forward(
        self, x: Tensor, cond: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor | None, rope
    ) -> Tensor:
        return self.modulated(x, self.modulation(cond), ctx_k, ctx_v, mask, rope)

    def modulation(self, cond: Tensor) -> tuple[Tensor, ...]:
        """(shift, 1 + scale, gate) of the attention, then of the MLP; depends on t only."""
        out: list[Tensor] = []
        for adaln in (self.attention_adaln, self.mlp_adaln):
            shift, scale, gate = adaln.modulation(cond)
            out += [shift, 1 + scale, gate]
        return tuple(out)

    def modulated(
        self, x: Tensor, mod: Sequence[Tensor], ctx_k: Tensor, ctx_v: Tensor, mask: Tensor | None, rope
    ) -> Tensor:
        """The block given its `modulation` (the fast path computes it once per schedule)."""
        a_shift, a_scale1, a_gate, f_shift, f_scale1, f_gate = mod
        h = rms_normalize(x, self.attention_adaln.eps) * a_scale1 + a_shift
        x = x + a_gate * self.attention(h, ctx_k, ctx_v, mask, rope)
        h = rms_normalize(x, self.mlp_adaln.eps) * f_scale1 + f_shift
        return x + f_gate * self.mlp(h)


# ---------------------------------------------------------------------------------------------
# The whole model
# ---------------------------------------------------------------------------------------------


@dataclass
class Conditions:
    """Encoded conditions of a batch; absent ones are None."""

    text_state: Tensor
    text_mask: Tensor
    speaker_state: Tensor | None = None  # (B, S_ref + 1, speaker_dim), summary token first
    speaker_mask: Tensor | None = None
    caption_state: Tensor | None = None
    caption_mask: Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.text_state.shape[0]

    def dropped(self, *names: str) -> Conditions:
        """The unconditional branch for `names`: state zeroed AND mask all false."""
        out = self
        for name in names:
            state, mask = getattr(self, f"{name}_state"), getattr(self, f"{name}_mask")
            if state is None:
                continue
            out = replace(
                out, **{f"{name}_state": torch.zeros_like(state), f"{name}_mask": torch.zeros_like(mask)}
            )
        return out

    def repeat(self, n: int) -> Conditions:
        """Each row repeated n times (batched candidates)."""

        def rep(x: Tensor | None) -> Tensor | None:
            return None if x is None else x.repeat_interleave(n, dim=0)

        text = (self.text_state.repeat_interleave(n, dim=0), self.text_mask.repeat_interleave(n, dim=0))
        return Conditions(*text, *(rep(getattr(self, f)) for f in _VOICE_FIELDS))

    def row(self, b: int) -> Conditions:
        """Row b alone (batch 1; views, no copy)."""

        def one(x: Tensor | None) -> Tensor | None:
            return None if x is None else x[b : b + 1]

        text = (self.text_state[b : b + 1], self.text_mask[b : b + 1])
        return Conditions(*text, *(one(getattr(self, f)) for f in _VOICE_FIELDS))

    @staticmethod
    def cat(items: list[Conditions]) -> Conditions:
        def c(name: str) -> Tensor | None:
            xs = [getattr(it, name) for it in items]
            return None if xs[0] is None else torch.cat(xs, dim=0)

        text = (torch.cat([it.text_state for it in items]), torch.cat([it.text_mask for it in items]))
        return Conditions(*text, *(c(f) for f in _VOICE_FIELDS))


_VOICE_FIELDS = ("speaker_state", "speaker_mask", "caption_state", "caption_mask")


@dataclass
class ContextKV:
    """Per-layer condition keys/values (B, H, S_ctx, Dh) and their mask (B, S_ctx).

    `segments` gives (name, start, end) of each condition along S_ctx.
    """

    keys: list[Tensor]
    values: list[Tensor]
    mask: Tensor
    segments: list[tuple[str, int, int]]

    def rows(self, n: int) -> ContextKV:
        """The first n batch rows (views, no copy)."""
        return ContextKV(
            [k[:n] for k in self.keys], [v[:n] for v in self.values], self.mask[:n], self.segments
        )

    def scale_segment(self, name: str, factor: float, max_layers: int | None) -> None:
        """Multiply keys and values of one condition in the first `max_layers` layers, in place."""
        for start_end in [(s, e) for n, s, e in self.segments if n == name]:
            s, e = start_end
            layers = len(self.keys) if max_layers is None else min(max_layers, len(self.keys))
            for i in range(layers):
                self.keys[i][:, :, s:e].mul_(factor)
                self.values[i][:, :, s:e].mul_(factor)


def time_mlp(cfg: ModelConfig) -> nn.Sequential:
    """timestep embedding -> (B, 3D) conditioning (keys .0/.2/.4): `cond_module`, `delta_cond_module`."""
    D = cfg.model_dim
    return nn.Sequential(
        nn.Linear(cfg.timestep_embed_dim, D, bias=False),
        nn.SiLU(),
        nn.Linear(D, D, bias=False),
        nn.SiLU(),
        nn.Linear(D, 3 * D, bias=False),
    )


class TextToLatentRFDiT(nn.Module):
    """The DiT and its condition encoders, for every release (v2, v3, v4, v4.1, v4.1-MF).

    v4 files (`text_encoder_type` "pretrained") replace the scratch text and caption encoders
    with one pretrained backbone (ModernBERT, or T5Gemma 2's text encoder in v4-Large: chosen
    once by `PretrainedTextBackbone` from the file's backbone config) and a projector per
    condition; MeanFlow files add `delta_cond_module`, which conditions the output on the
    interval length dt.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        eps = cfg.norm_eps
        backbone = cfg.text_backbone if cfg.pretrained_text else None
        if backbone is not None:
            self.pretrained_text_backbone = PretrainedTextBackbone(backbone)
            self.text_encoder: nn.Module = self._projector(backbone.hidden_size, cfg.text_dim)
        else:
            self.text_encoder = TextEncoder(
                cfg.text_vocab_size, cfg.text_dim, cfg.text_layers, cfg.text_heads, cfg.text_mlp_hidden, eps
            )
        self.text_norm = RMSNorm(cfg.text_dim, eps)
        if cfg.speaker_enabled:
            self.speaker_encoder = ReferenceLatentEncoder(
                cfg.speaker_in_dim,
                cfg.speaker_dim,
                cfg.speaker_layers,
                cfg.speaker_heads,
                cfg.speaker_mlp_hidden,
                eps,
            )
            self.speaker_norm = RMSNorm(cfg.speaker_dim, eps)
        if cfg.caption_enabled:
            if backbone is not None:
                self.caption_encoder: nn.Module = self._projector(backbone.hidden_size, cfg.caption("dim"))
            else:
                self.caption_encoder = TextEncoder(
                    cfg.caption("vocab_size"),
                    cfg.caption("dim"),
                    cfg.caption("layers"),
                    cfg.caption("heads"),
                    cfg.caption_mlp_hidden,
                    eps,
                )
            self.caption_norm = RMSNorm(cfg.caption("dim"), eps)
        D = cfg.model_dim
        self.cond_module = time_mlp(cfg)
        if cfg.meanflow:
            self.delta_cond_module = time_mlp(cfg)
        self.in_proj = nn.Linear(cfg.patched_latent_dim, D, bias=True)
        self.blocks = nn.ModuleList(DiffusionBlock(cfg) for _ in range(cfg.num_layers))
        self.out_norm = RMSNorm(D, eps)
        self.out_proj = nn.Linear(D, cfg.patched_latent_dim, bias=True)
        if cfg.use_duration_predictor:
            self.duration_predictor = DurationPredictor(cfg)

    def _projector(self, in_dim: int, dim: int) -> TextProjector:
        cfg = self.cfg
        return TextProjector(
            in_dim, dim, cfg.pretrained_projector_type, cfg.pretrained_projector_hidden_ratio, cfg.norm_eps
        )

    # ---- conditions -------------------------------------------------------------------------
    def encode_conditions(
        self,
        text_ids: Tensor,
        text_mask: Tensor,
        ref_latent: Tensor | None = None,
        ref_mask: Tensor | None = None,
        caption_ids: Tensor | None = None,
        caption_mask: Tensor | None = None,
    ) -> Conditions:
        """Text, speaker and caption states: `encode_text` plus `encode_voice`."""
        check_ids(text_ids, text_mask, self.cfg.text_token_vocab, "text")
        text_state = self.encode_text(text_ids, text_mask)
        voice = self.encode_voice(
            text_ids.shape[0], ref_latent, ref_mask, caption_ids, caption_mask, like=text_state
        )
        return Conditions(text_state, text_mask, *voice)

    def encode_text(
        self, text_ids: Tensor, text_mask: Tensor, backbone: Callable[[Tensor, Tensor], Tensor] | None = None
    ) -> Tensor:
        """The text encoder's states (B, L, text_dim); ids are checked by `encode_conditions`.
        `backbone`: another forward of the text tower (the fast path's fused one): of v4's
        backbone (the projector after it), or of the scratch encoder."""
        return self.text_norm(self._encode_tokens(self.text_encoder, text_ids, text_mask, backbone))

    def _encode_tokens(
        self,
        encoder: nn.Module,
        ids: Tensor,
        mask: Tensor,
        backbone: Callable[[Tensor, Tensor], Tensor] | None = None,
    ) -> Tensor:
        """A scratch encoder on token ids, or (v4) the shared backbone then the projector;
        `backbone` in place of the backbone, or of a scratch encoder."""
        if self.cfg.pretrained_text:
            return encoder((backbone or self.pretrained_text_backbone)(ids, mask), mask)
        return (backbone or encoder)(ids, mask)

    def encode_voice(
        self,
        batch: int,
        ref_latent: Tensor | None = None,
        ref_mask: Tensor | None = None,
        caption_ids: Tensor | None = None,
        caption_mask: Tensor | None = None,
        *,
        like: Tensor | None = None,
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]:
        """(speaker_state, speaker_mask, caption_state, caption_mask) of a voice, for `batch` rows.

        They do not depend on the text, so a caller may compute them once per voice. `like`
        gives the dtype/device when there is no reference (the model's otherwise).
        """
        cfg, B = self.cfg, batch
        dtype = like.dtype if like is not None else self.in_proj.weight.dtype
        device = like.device if like is not None else self.in_proj.weight.device
        if ref_latent is not None:
            if ref_latent.ndim != 3 or ref_latent.shape[0] != B or ref_latent.shape[2] != cfg.latent_dim:
                raise InputError(
                    f"ref_latent must be (batch {B}, frames, {cfg.latent_dim}), got {tuple(ref_latent.shape)}"
                )
            if ref_mask is not None and tuple(ref_mask.shape) != tuple(ref_latent.shape[:2]):
                raise InputError(f"ref_mask {tuple(ref_mask.shape)} does not match ref_latent")
        if caption_ids is not None:
            if caption_ids.shape[0] != B:
                raise InputError(f"caption batch {caption_ids.shape[0]} differs from text batch {B}")
            if cfg.caption_enabled:
                check_ids(caption_ids, caption_mask, cfg.caption_token_vocab, "caption")
        speaker_state = speaker_mask = caption_state = caption_mask_out = None
        if cfg.speaker_enabled:
            if ref_latent is None:  # no reference: one patch of zero frames with an all-false mask
                frames = cfg.latent_patch_size * cfg.speaker_patch_size
                ref_latent = torch.zeros((B, frames, cfg.latent_dim), dtype=dtype, device=device)
                ref_mask = torch.zeros(B, frames, dtype=torch.bool, device=device)
            elif ref_mask is None:
                ref_mask = torch.ones(ref_latent.shape[:2], dtype=torch.bool, device=ref_latent.device)
            # patched by latent_patch_size as the DiT sees latents, then by speaker_patch_size
            latent, mask = patch_reference(ref_latent.to(dtype), ref_mask, cfg.latent_patch_size)
            latent, mask = patch_reference(latent, mask, cfg.speaker_patch_size)
            state = self.speaker_norm(self.speaker_encoder(latent, mask))
            m = mask[..., None].to(state.dtype)
            summary = (state * m).sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1.0)
            speaker_state = torch.cat((summary, state), dim=1)
            speaker_mask = torch.cat((mask.any(dim=1, keepdim=True), mask), dim=1)
        if cfg.caption_enabled and caption_ids is not None:
            if caption_mask is None:
                caption_mask = torch.ones_like(caption_ids, dtype=torch.bool)
            caption_state = self.caption_norm(
                self._encode_tokens(self.caption_encoder, caption_ids, caption_mask)
            )
            caption_mask_out = caption_mask
        elif cfg.caption_enabled:  # no caption given: one masked zero token
            caption_state = torch.zeros(B, 1, cfg.caption("dim"), dtype=dtype, device=device)
            caption_mask_out = torch.zeros(B, 1, dtype=torch.bool, device=device)
        return speaker_state, speaker_mask, caption_state, caption_mask_out

    def context_parts(self, conds: Conditions) -> list[tuple[str, Tensor, Tensor]]:
        """The conditions the context holds, in its order [text, speaker, caption]: (name, state,
        mask) each."""
        parts = [("text", conds.text_state, conds.text_mask)]
        if self.cfg.speaker_enabled and conds.speaker_state is not None:
            parts.append(("speaker", conds.speaker_state, _mask_of(conds, "speaker")))
        if self.cfg.caption_enabled and conds.caption_state is not None:
            parts.append(("caption", conds.caption_state, _mask_of(conds, "caption")))
        return parts

    def context_layer_kv(self, layer: int, parts: list[tuple[str, Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
        """One layer's keys and values of the context `parts` (`context_parts`): (B, H, S_ctx, Dh)."""
        attention = cast(DiffusionBlock, self.blocks[layer]).attention
        kv = [attention.context_kv(state, name) for name, state, _ in parts]
        return torch.cat([k for k, _ in kv], dim=2), torch.cat([v for _, v in kv], dim=2)

    def context_kv(self, conds: Conditions) -> ContextKV:
        """Keys/values of every condition for every layer, in the order [text, speaker, caption]."""
        parts = self.context_parts(conds)
        kv = [self.context_layer_kv(i, parts) for i in range(len(self.blocks))]
        mask = torch.cat([m for _, _, m in parts], dim=1)
        return ContextKV([k for k, _ in kv], [v for _, v in kv], mask, context_segments(parts))

    # ---- flow velocity ----------------------------------------------------------------------
    def time_condition(self, t: Tensor, dt: Tensor | None = None) -> Tensor:
        """cond_module(temb(t)) as (B, 1, 3D); MeanFlow files add delta_cond_module(temb(dt)).

        An RF file refuses a dt, a MeanFlow file needs one (dt = t - r >= 0, 0 for the
        instantaneous velocity)."""
        if self.cfg.meanflow and dt is None:
            raise InputError("this MeanFlow model needs dt (the interval t - r the step covers)")
        if not self.cfg.meanflow and dt is not None:
            raise InputError("dt is for MeanFlow models; this model predicts the instantaneous velocity")
        dtype, dim = self.in_proj.weight.dtype, self.cfg.timestep_embed_dim
        cond = self.cond_module(timestep_embedding(t, dim).to(dtype))
        if dt is not None:
            cond = cond + self.delta_cond_module(timestep_embedding(dt, dim).to(dtype))
        return cond[:, None]

    def attention_mask(
        self, ctx: ContextKV, seq_len: int, latent_mask: Tensor | None = None
    ) -> Tensor | None:
        """The joint key mask (B, 1, 1, S + S_ctx) for latents of `seq_len` frames; None if all valid.

        Computed once per line (it syncs the host to decide None), then reused every step.
        """
        B, p = ctx.mask.shape[0], self.cfg.latent_patch_size
        n = seq_len // p
        if latent_mask is None:
            self_mask = torch.ones(B, n, dtype=torch.bool, device=ctx.mask.device)
        else:
            self_mask = latent_mask.reshape(B, n, p).all(dim=-1) if p > 1 else latent_mask
        return key_mask(torch.cat((self_mask.to(ctx.mask.device), ctx.mask), dim=1))

    def velocity(
        self,
        x_t: Tensor,
        t: Tensor,
        ctx: ContextKV | Conditions,
        latent_mask: Tensor | None = None,
        *,
        dt: Tensor | None = None,
        attn_mask: Tensor | str | None = "auto",
    ) -> Tensor:
        """Predicted v = noise - x0 for x_t (B, S, latent_dim) at flow time t (B,); for a MeanFlow
        model, given dt (B,), the average velocity over [t - dt, t].

        `attn_mask` from `attention_mask()` skips rebuilding the mask (and its host sync) per step.
        """
        if isinstance(ctx, Conditions):
            ctx = self.context_kv(ctx)
        p = self.cfg.latent_patch_size
        B, S, C = x_t.shape
        if isinstance(attn_mask, str):
            attn_mask = self.attention_mask(ctx, S, latent_mask)
        x = x_t.reshape(B, S // p, p * C) if p > 1 else x_t
        cond = self.time_condition(t, dt)
        x = self.in_proj(x.to(cond.dtype))
        rope = rope_tables(x.shape[1], self.cfg.head_dim, x.device)
        for block, k, v in zip(self.blocks, ctx.keys, ctx.values):
            x = block(x, cond, k, v, attn_mask, rope)
        out = self.out_proj(self.out_norm(x))
        return out.reshape(B, S, C) if p > 1 else out

    # ---- duration ---------------------------------------------------------------------------
    def predict_log_frames(
        self,
        conds: Conditions,
        has_speaker: Tensor | None = None,
        has_caption: Tensor | None = None,
        body: Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor] | None = None,
    ) -> Tensor:
        """log1p(total frames) from the duration predictor (v3, v4, v4.1, v4.1-MF); `body` stands in
        for its blocks (`DurationPredictor.body`; the fast path's fused one, engine/fast_duration.py)."""
        if not self.cfg.use_duration_predictor:
            raise AttributeError("this model has no duration predictor (v2); estimate seconds from the text")
        B = conds.batch_size
        device = conds.text_state.device
        summary = None if conds.speaker_state is None else conds.speaker_state[:, 0]
        if has_speaker is None:
            has_speaker = (
                conds.speaker_mask[:, 0]
                if conds.speaker_mask is not None
                else torch.zeros(B, dtype=torch.bool, device=device)
            )
        pooled = None
        if conds.caption_state is not None:
            caption_mask = _mask_of(conds, "caption")
            m = caption_mask[..., None].to(conds.caption_state.dtype)
            pooled = (conds.caption_state * m).sum(1) / m.sum(1).clamp(min=1.0)
            if has_caption is None:
                has_caption = caption_mask.any(dim=1)
        return self.duration_predictor(
            conds.text_state, conds.text_mask, summary, has_speaker, pooled, has_caption, body
        )


def context_segments(parts: list[tuple[str, Tensor, Tensor]]) -> list[tuple[str, int, int]]:
    """(name, start, end) of each of the context `parts` (`context_parts`) along its positions."""
    segments, start = [], 0
    for name, state, _ in parts:
        segments.append((name, start, start + int(state.shape[1])))
        start += int(state.shape[1])
    return segments


def _mask_of(conds: Conditions, name: str) -> Tensor:
    """The mask of a condition whose state is given (it must have one)."""
    mask = getattr(conds, f"{name}_mask")
    if mask is None:
        raise InputError(f"conditions have a {name}_state but no {name}_mask")
    return mask


def check_ids(ids: Tensor, mask: Tensor | None, vocab: int, what: str) -> None:
    """Token ids must be (B, L) integers in [0, vocab) with a matching mask (one host sync per line)."""
    if ids.ndim != 2 or ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8):
        raise InputError(
            f"{what} ids must be a (batch, length) integer tensor, got {ids.dtype} {tuple(ids.shape)}"
        )
    if mask is not None and tuple(mask.shape) != tuple(ids.shape):
        raise InputError(f"{what} mask {tuple(mask.shape)} does not match ids {tuple(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise InputError(
            f"{what} token ids must be in [0, {vocab}), got [{int(ids.min())}, {int(ids.max())}]",
            hint="the tokenizer does not match this model (check its vocab size)",
        )


def patch_reference(latent: Tensor, mask: Tensor, patch: int) -> tuple[Tensor, Tensor]:
    """Group `patch` frames per position (dropping the remainder); valid when all its frames are."""
    if patch == 1:
        return latent, mask
    B, T, C = latent.shape
    n = T // patch
    if n == 0:
        return latent.new_zeros(B, 1, C * patch), torch.zeros(B, 1, dtype=torch.bool, device=latent.device)
    latent = latent[:, : n * patch].reshape(B, n, patch * C)
    mask = mask[:, : n * patch].reshape(B, n, patch).all(dim=-1)
    return latent, mask
