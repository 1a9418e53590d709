"""The v4 text backbone (ModernBERT) on the fast path: a layer's elementwise work in fused kernels.

Eager, a ModernBERT layer launches ~27 kernels around its four GEMMs and the attention: residual
adds and LayerNorms, RoPE on q and k (casts, halves, a concatenation, products), GELU and the gate
product. The backbone of v4 / v4.1-MF has 25 layers: ~680 launches a text-encoder call, each a
few microseconds inside a CUDA graph too. On an H100 a call took 2.67 ms for one line and 3.03 for
eight (benchmarks/RESULTS.md, "Twenty-second session": the ceiling table), on the path to every
line's first audio. Here a layer is nine launches: the residual add and LayerNorm in one pass
(`fused.add_layer_norm`), RoPE and the heads' layout in one (`fused.rope_qkv`), GELU times the gate
in one (`fused.glu`), the four GEMMs and the attention; the final norm also applies the token
mask.

The weights, the embeddings, the attention masks and RoPE tables are the model's
(`ModernBert.attention_masks`, made additive once a call where the attention would convert them
at every layer; `ModernBert.rope_tables`, kept per length), and its linear layers run as
themselves (int4 or not). Each kernel rounds once at its store, so the states differ from the
eager forward's by rounding only (tests/engine/test_fused_text.py holds them to the reference's
golden states). T5Gemma 2 (v4-Large) runs its own forward.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .encoders import additive_mask, capturing
from .fused import add_layer_norm, glu, rope_qkv, run_or_fall_back
from .text_backbone import Layer, LayerNorm, ModernBert

__all__ = ["FastModernBert", "fast_text_backbone"]

_GELU = {"none": "gelu", "tanh": "gelu_tanh"}  # BackboneConfig.gelu_approximate -> fused.glu's act


class FastModernBert:
    """`ModernBert.forward` with its elementwise work fused; the eager forward if a kernel fails."""

    def __init__(self, backbone: ModernBert) -> None:
        self.backbone = backbone
        self.on = True
        self._ropes: dict[tuple[int, torch.device], dict[str, tuple[Tensor, Tensor]]] = {}

    def __call__(self, ids: Tensor, mask: Tensor) -> Tensor:
        if not self.on:
            return self.backbone(ids, mask)
        return run_or_fall_back(
            lambda: self._fused(ids, mask),
            lambda: self.backbone(ids, mask),
            what="the text backbone's fused kernels",
            switch_off=lambda: setattr(self, "on", False),
        )

    def _fused(self, ids: Tensor, mask: Tensor) -> Tensor:
        bb, cfg = self.backbone, self.backbone.cfg
        B, L = ids.shape
        act = _GELU[cfg.gelu_approximate]
        ropes = self._rope_tables(L, ids.device)
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

    def _rope_tables(self, length: int, device: torch.device) -> dict[str, tuple[Tensor, Tensor]]:
        """The backbone's RoPE tables for `length` tokens, made once (constants; not kept when
        first asked for inside a CUDA graph's capture, whose memory is the graph's)."""
        key = (length, device)
        if key in self._ropes:
            return self._ropes[key]
        tables = self.backbone.rope_tables(length, device)
        if not capturing():
            self._ropes[key] = tables
        return tables


def _add_norm(
    x: Tensor, y: Tensor | None, norm: nn.Module, row_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    assert isinstance(norm, LayerNorm)
    return add_layer_norm(x, y, norm.weight, norm.bias, norm.eps, row_mask)


def fast_text_backbone(model: nn.Module) -> FastModernBert | None:
    """The fused forward of a v4 model's ModernBERT backbone; None for other models."""
    holder = getattr(model, "pretrained_text_backbone", None)
    backbone = getattr(holder, "backbone", None)
    return FastModernBert(backbone) if isinstance(backbone, ModernBert) else None
