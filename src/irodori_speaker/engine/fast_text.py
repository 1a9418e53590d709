"""The text towers on the fast path: a layer's elementwise work in fused kernels.

**v4 / v4.1-MF (ModernBERT).** Eager, a ModernBERT layer launches ~27 kernels around its four GEMMs
and the attention: residual adds and LayerNorms, RoPE on q and k (casts, halves, a concatenation,
products), GELU and the gate product. The backbone of v4 / v4.1-MF has 25 layers: ~680 launches a
text-encoder call, each a few microseconds inside a CUDA graph too. On an H100 a call took 2.67 ms
for one line and 3.03 for eight (benchmarks/RESULTS.md, "Twenty-second session": the ceiling
table), on the path to every line's first audio. Here a layer is nine launches: the residual add
and LayerNorm in one pass (`fused.add_layer_norm`), RoPE and the heads' layout in one
(`fused.rope_qkv`), GELU times the gate in one (`fused.glu`), the four GEMMs and the attention; the
final norm also applies the token mask. The attention masks are made additive once a call
(`ModernBert.attention_masks`; the attention would convert them at every layer) and the RoPE
tables kept per length (`ModernBert.rope_tables`).

**v2, v3, VoiceDesign (the scratch `TextEncoder`).** Its block is the DiT's without modulation:
RMS norms, Q/K/V and a sigmoid gate from four projections, per-head RMS norms of q and k, RoPE on
every head, SwiGLU, the padding zeroed after each block, and the RoPE tables made again in every
block: ~80 launches a block eager (v2's release: 10 blocks, 512 wide). Here a block is ten: the
DiT's kernels (`fused.qkv_joint` with no context and every head rotated, `fused.gate_heads`,
`fused.swiglu`, `fused.add_rms_modulate` ungated: the residual add and the next norm) over the
same fused projections (`fusing.fuse_block`). The padding is zeroed once, at the end: eager zeroes
it after every block too, but a padded position reaches no valid one (the keys are masked, the
rest is per position), so the valid states are the same. A line with no valid token attends to
its own padding (eager: `encoders.attend_safe`), finite, and comes out zero as eager.

**v4-Large (T5Gemma 2's text tower).** A Gemma 3 layer: four `1 + w` RMS norms around a
sandwich-normed attention and GeGLU, grouped K/V with per-head q / k norms, rotate-half RoPE
per layer type: ~70 eager launches a layer (26 at the release: ~1,800 a call; counted from the
code). Here a layer is about a dozen: q | k | v as one GEMM, the heads' norms, RoPE and layout
in one (`fused.rope_qkv` with grouped K/V and head norms), the attention (grouped K/V read as
they are), o, the output's norm then the residual add with the next norm (`add_rms_modulate`
twice, rounding where eager does), gate | up as one GEMM, `fused.glu` (tanh GELU), down, and the
same two norms. The norms' multipliers (1 + w) are made once; the masks made additive once a
call.

The weights and embeddings are the model's, and its linear layers run as themselves (int4 or not).
Each kernel rounds once at its store, so the states differ from the eager forward's by rounding
only (tests/engine/test_fused_text.py holds them to the reference's golden states).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .encoders import ReferenceLatentEncoder, SelfAttention, TextBlock, TextEncoder, additive_mask, capturing
from .fused import (
    add_layer_norm,
    add_rms_modulate,
    gate_heads,
    glu,
    qkv_joint,
    rope_qkv,
    run_or_fall_back,
    swiglu,
)
from .fusing import Named, block_fusable, fusable_into, fuse_block, fuse_into
from .layers import rope_tables
from .t5gemma import Layer as GemmaLayer
from .t5gemma import T5Gemma2TextEncoder
from .text_backbone import Layer, LayerNorm, ModernBert

__all__ = ["FastModernBert", "FastT5Gemma", "FastTextEncoder", "FusedForward", "fast_text_backbone"]

T = TypeVar("T")

_GELU = {"none": "gelu", "tanh": "gelu_tanh"}  # BackboneConfig.gelu_approximate -> fused.glu's act


class FusedForward:
    """A forward with fused kernels (`_fused`, same arguments); the eager one (`eager`: the
    module's own forward by default) once a kernel fails, or while `on` is False (a benchmark's
    side-by-side run). The text towers here, the duration predictor's blocks
    (engine/fast_duration.py)."""

    what = "fused kernels"

    def __init__(self, module: nn.Module, eager: Callable[..., Tensor] | None = None) -> None:
        self.module = module
        self.eager: Callable[..., Tensor] = eager or module
        self.on = True
        self._tables: dict[tuple[int, torch.device], Any] = {}

    def __call__(self, *args: Any) -> Tensor:
        if not self.on:
            return self.eager(*args)
        return run_or_fall_back(
            lambda: self._fused(*args),
            lambda: self.eager(*args),
            what=self.what,
            switch_off=lambda: setattr(self, "on", False),
        )

    def _fused(self, *args: Any) -> Tensor:
        raise NotImplementedError

    def _kept(self, length: int, device: torch.device, make: Callable[[], T]) -> T:
        """Constants for `length` tokens (RoPE tables), made once; not kept when first asked for
        inside a CUDA graph's capture, whose memory is the graph's."""
        key = (length, device)
        if key in self._tables:
            return cast(T, self._tables[key])
        tables = make()
        if not capturing():
            self._tables[key] = tables
        return tables


class FastModernBert(FusedForward):
    """`ModernBert.forward` (v4, v4.1-MF) with its elementwise work fused."""

    what = "the text backbone's fused kernels"

    def __init__(self, backbone: ModernBert) -> None:
        super().__init__(backbone)

    def _fused(self, ids: Tensor, mask: Tensor) -> Tensor:
        bb = cast(ModernBert, self.module)
        cfg = bb.cfg
        B, L = ids.shape
        act = _GELU[cfg.gelu_approximate]
        ropes = self._kept(L, ids.device, lambda: bb.rope_tables(L, ids.device))
        dtype = bb.final_norm.weight.dtype
        masks = {kind: additive_mask(m, dtype) for kind, m in bb.attention_masks(mask).items()}
        x = h = bb.embeddings(ids)  # layer 0 has no attention norm
        y: Tensor | None = None
        for i, layer in enumerate(cast(list[Layer], list(bb.layers))):
            if i:
                x, h = _add_norm(x, y, layer.attn_norm)
            kind = str(layer.layer_type)
            q, k, v = rope_qkv(layer.attn.Wqkv(h), *ropes[kind], cfg.num_attention_heads)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=masks[kind])
            o = layer.attn.Wo(o.transpose(1, 2).reshape(B, L, cfg.hidden_size))
            x, h = _add_norm(x, o, layer.mlp_norm)
            y = layer.mlp.Wo(glu(layer.mlp.Wi(h), cfg.intermediate_size, act))
        return _add_norm(x, y, bb.final_norm, mask)[1]


class FastTextEncoder(FusedForward):
    """`TextEncoder.forward` (v2, v3, VoiceDesign) with its elementwise work fused; its blocks'
    projections fused here (modifying its layers, as the DiT's are)."""

    what = "the text encoder's fused kernels"

    def __init__(self, encoder: TextEncoder) -> None:
        super().__init__(encoder)
        self.blocks = [(cast(TextBlock, b), fuse_block(b)) for b in encoder.blocks]
        self.heads = cast(SelfAttention, self.blocks[0][0].attention).heads

    def _fused(self, ids: Tensor, mask: Tensor) -> Tensor:
        x = cast(TextEncoder, self.module).text_embedding(ids)
        heads = self.heads
        Dh = x.shape[-1] // heads
        rope = self._kept(ids.shape[1], ids.device, lambda: rope_tables(ids.shape[1], Dh, ids.device))
        # a row with no valid token attends to all of its (padded) keys: finite, and zeroed below
        valid = mask | ~mask.any(dim=1, keepdim=True)
        keys = additive_mask(valid[:, None, None, :], x.dtype)
        nothing = x.new_empty(x.shape[0], heads, 0, Dh)  # no context: the keys are the tokens'
        y: Tensor | None = None
        for blk, fb in self.blocks:
            x, h = add_rms_modulate(x, y, None, blk.attention_norm.weight, None, blk.attention_norm.eps)
            p = fb.qkvg(h)
            eps = blk.attention.q_norm.eps
            q, k, v = qkv_joint(
                p, fb.q_norm, fb.k_norm, *rope, nothing, nothing, heads, eps, rope_heads=heads
            )
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=keys)
            o = fb.wo(gate_heads(o, p))
            x, h = add_rms_modulate(x, o, None, blk.mlp_norm.weight, None, blk.mlp_norm.eps)
            y = fb.w2(swiglu(fb.w13(h), fb.hidden))
        return (x + y) * mask[..., None].to(x.dtype) if y is not None else x


class FastT5Gemma(FusedForward):
    """`T5Gemma2TextEncoder.forward` (v4-Large) with its elementwise work fused; its layers'
    projections fused here (q | k | v and gate | up, modifying its layers, as the DiT's are)."""

    what = "the T5Gemma 2 text tower's fused kernels"

    def __init__(self, encoder: T5Gemma2TextEncoder) -> None:
        super().__init__(encoder)
        layers = [cast(GemmaLayer, m) for m in encoder.layers]
        self.layers: list[tuple[GemmaLayer, nn.Module, nn.Module]] = []
        for m in layers:
            qkv, gate_up = _gemma_groups(m)
            self.layers.append((m, fuse_into(qkv), fuse_into(gate_up)))
        # every norm's multiplier (1 + w) in float32, made once: [pre-attn, post-attn, pre-ffn,
        # post-ffn, q, k] a layer, and the final norm's
        self.scales = [
            [_one_plus(n) for n in (m.pre_self_attn_layernorm, m.post_self_attn_layernorm,
                                    m.pre_feedforward_layernorm, m.post_feedforward_layernorm,
                                    m.self_attn.q_norm, m.self_attn.k_norm)]
            for m in layers
        ]  # fmt: skip
        self.final = _one_plus(encoder.norm)

    def _fused(self, ids: Tensor, mask: Tensor) -> Tensor:
        enc = cast(T5Gemma2TextEncoder, self.module)
        cfg = enc.cfg
        B, L = ids.shape
        eps, heads, kv_heads = cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads
        ropes = self._kept(L, ids.device, lambda: enc.rope_tables(L, ids.device))
        x = enc.embed_tokens(ids)
        masks = {kind: additive_mask(m, x.dtype) for kind, m in enc.attention_masks(mask).items()}
        _, h = add_rms_modulate(x, None, None, self.scales[0][0], None, eps)
        for i, (layer, qkv, gate_up) in enumerate(self.layers):
            _, post_attn, pre_ffn, post_ffn, qn, kn = self.scales[i]
            kind = str(layer.layer_type)
            q, k, v = rope_qkv(qkv(h), *ropes[kind], heads, kv_heads, (qn, kn), eps)
            o = F.scaled_dot_product_attention(
                q, k, v, attn_mask=masks[kind], scale=cfg.attention_scale, enable_gqa=kv_heads != heads
            )
            o = layer.self_attn.o_proj(o.transpose(1, 2).reshape(B, L, heads * cfg.head_dim))
            # the sandwich: the output normed, added, then the next sublayer's input normed
            x, h = add_rms_modulate(x, _rms(o, post_attn, eps), None, pre_ffn, None, eps)
            y = layer.mlp.down_proj(glu(gate_up(h), cfg.intermediate_size, _GELU[cfg.gelu_approximate]))
            nxt = self.scales[i + 1][0] if i + 1 < len(self.layers) else self.final
            x, h = add_rms_modulate(x, _rms(y, post_ffn, eps), None, nxt, None, eps)
        return h * mask[..., None].to(h.dtype)


def _one_plus(norm: nn.Module) -> Tensor:
    return 1.0 + cast(Tensor, norm.weight).detach().float()


def _rms(y: Tensor, scale: Tensor, eps: float) -> Tensor:
    """rms_norm(y) * scale (one launch)."""
    return add_rms_modulate(y, None, None, scale, None, eps)[1]


def _gemma_groups(layer: GemmaLayer) -> tuple[Named, Named]:
    """A T5Gemma 2 layer's fused groups: q | k | v and gate | up."""
    a, mlp = layer.self_attn, layer.mlp
    return [(a, "q_proj"), (a, "k_proj"), (a, "v_proj")], [(mlp, "gate_proj"), (mlp, "up_proj")]


def _add_norm(
    x: Tensor, y: Tensor | None, norm: nn.Module, row_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    assert isinstance(norm, LayerNorm)
    return add_layer_norm(x, y, norm.weight, norm.bias, norm.eps, row_mask)


def fast_text_backbone(model: nn.Module) -> FastModernBert | FastT5Gemma | FastTextEncoder | None:
    """The fused forward of a model's text tower: v4's ModernBERT or v4-Large's T5Gemma 2 backbone
    (passed to `model.encode_text` as its `backbone`), or a scratch text encoder whose heads'
    width is a power of two (the kernels' tiles) and projections that fuse; None for others (an
    int4 file's RTN-packed encoder)."""
    holder = getattr(model, "pretrained_text_backbone", None)
    backbone = getattr(holder, "backbone", None)
    if isinstance(backbone, ModernBert):
        return FastModernBert(backbone)
    if isinstance(backbone, T5Gemma2TextEncoder):
        fuses = all(fusable_into(*_gemma_groups(cast(GemmaLayer, m))) for m in backbone.layers)
        return FastT5Gemma(backbone) if fuses else None
    encoder = getattr(model, "text_encoder", None)
    if isinstance(encoder, TextEncoder) and not isinstance(encoder, ReferenceLatentEncoder):
        attention = cast(TextBlock, encoder.blocks[0]).attention if len(encoder.blocks) else None
        Dh = getattr(attention, "head_dim", 0)
        if Dh and Dh & (Dh - 1) == 0 and all(block_fusable(b) for b in encoder.blocks):
            return FastTextEncoder(encoder)
    return None
