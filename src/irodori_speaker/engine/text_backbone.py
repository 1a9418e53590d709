"""The v4 text side: a ModernBERT encoder (our own, so it can be graphed, fused and quantised),
the choice between it and v4-Large's T5Gemma 2 encoder (engine/t5gemma.py), and the projectors
that map the backbone's states to the DiT's text and caption widths.

Module names equal the released tensor names (`pretrained_text_backbone.backbone.layers.3.attn.Wqkv.weight`,
`text_encoder.residual_up.weight`, ...). Format: docs/models.md ("The v4 file format").

ModernBERT in short: token embedding + LayerNorm; per layer a pre-norm attention (layer 0 has no
norm) with rotate-half RoPE, global on "full" layers and limited to |i - j| <= window / 2 on
"sliding" ones, each kind with its own RoPE theta; a pre-norm GeGLU MLP; a final LayerNorm.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .backbone_config import BackboneConfig, TextBackboneConfig
from .layers import Embedding, RMSNorm, apply_rotate_half, rotate_half_tables, window_masks
from .t5gemma import T5Gemma2TextEncoder


class LayerNorm(nn.Module):
    """LayerNorm with a weight and an optional bias (ModernBERT's `norm_bias`)."""

    def __init__(self, dim: int, eps: float, bias: bool) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, x.shape[-1:], self.weight, self.bias, self.eps)


class Embeddings(nn.Module):
    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.tok_embeddings = Embedding(cfg.vocab_size, cfg.hidden_size)
        self.norm = LayerNorm(cfg.hidden_size, cfg.norm_eps, cfg.norm_bias)

    def forward(self, ids: Tensor) -> Tensor:
        return self.norm(self.tok_embeddings(ids))


class Attention(nn.Module):
    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        H = cfg.hidden_size
        self.heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.Wqkv = nn.Linear(H, 3 * H, bias=cfg.attention_bias)
        self.Wo = nn.Linear(H, H, bias=cfg.attention_bias)

    def forward(self, x: Tensor, mask: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        B, L, H = x.shape
        qkv = self.Wqkv(x).view(B, L, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, heads, L, head_dim) each
        q, k = apply_rotate_half(q, *rope), apply_rotate_half(k, *rope)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.Wo(out.transpose(1, 2).reshape(B, L, H))


class GeGLU(nn.Module):
    """Wo(gelu(a) * b) with [a ; b] = Wi(x)."""

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.hidden = cfg.intermediate_size
        self.approximate = cfg.gelu_approximate
        self.Wi = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.Wo = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.Wi(x).split(self.hidden, dim=-1)
        return self.Wo(F.gelu(a, approximate=self.approximate) * b)


class Layer(nn.Module):
    def __init__(self, cfg: BackboneConfig, index: int) -> None:
        super().__init__()
        H, eps, bias = cfg.hidden_size, cfg.norm_eps, cfg.norm_bias
        self.layer_type = cfg.layer_types[index]
        self.attn_norm = nn.Identity() if index == 0 else LayerNorm(H, eps, bias)
        self.attn = Attention(cfg)
        self.mlp_norm = LayerNorm(H, eps, bias)
        self.mlp = GeGLU(cfg)

    def forward(self, x: Tensor, mask: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        x = x + self.attn(self.attn_norm(x), mask, rope)
        return x + self.mlp(self.mlp_norm(x))


class ModernBert(nn.Module):
    """`ModernBertModel`'s forward: last_hidden_state (B, L, hidden) times the token mask."""

    def __init__(self, cfg: BackboneConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = Embeddings(cfg)
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.final_norm = LayerNorm(cfg.hidden_size, cfg.norm_eps, cfg.norm_bias)

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        x = self.embeddings(ids)
        masks, ropes = self.attention_masks(mask), self.rope_tables(ids.shape[1], ids.device)
        for layer in self.layers:
            kind = str(layer.layer_type)
            x = layer(x, masks[kind], ropes[kind])
        return self.final_norm(x) * mask[..., None].to(x.dtype)

    def attention_masks(self, mask: Tensor) -> dict[str, Tensor]:
        """Per layer type, its boolean attention mask (B, 1, L, L) from the token mask (B, L)."""
        window = self.cfg.local_attention // 2
        full, sliding = window_masks(mask, window, window)
        return {"full_attention": full, "sliding_attention": sliding}

    def rope_tables(self, length: int, device: torch.device) -> dict[str, tuple[Tensor, Tensor]]:
        """Per layer type, its RoPE cos / sin tables (length, head_dim)."""
        cfg = self.cfg
        return {
            kind: rotate_half_tables(length, cfg.head_dim, cfg.rope_theta(kind), device)
            for kind in set(cfg.layer_types)
        }


class PretrainedTextBackbone(nn.Module):
    """Holds the backbone under the released name `pretrained_text_backbone.backbone`: ModernBERT
    or (v4-Large) T5Gemma 2's text encoder, by the config's `model_type`. Both map (ids, mask)
    to masked states (B, L, hidden_size)."""

    def __init__(self, cfg: TextBackboneConfig) -> None:
        super().__init__()
        self.backbone: nn.Module = (
            ModernBert(cfg) if isinstance(cfg, BackboneConfig) else T5Gemma2TextEncoder(cfg)
        )

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        return self.backbone(ids, mask)


class TextProjector(nn.Module):
    """Backbone states (B, L, hidden) -> (B, L, dim): `linear`, or `residual_mlp`
    projector(s) + residual_down(silu(residual_up(residual_norm(s)))); masked."""

    def __init__(self, in_dim: int, dim: int, kind: str, hidden_ratio: float, eps: float) -> None:
        super().__init__()
        self.projector = nn.Linear(in_dim, dim, bias=True)
        self.residual = kind == "residual_mlp"
        if self.residual:
            hidden = round(dim * hidden_ratio)
            self.residual_norm = RMSNorm(in_dim, eps)
            self.residual_up = nn.Linear(in_dim, hidden, bias=True)
            self.residual_down = nn.Linear(hidden, dim, bias=True)

    def forward(self, state: Tensor, mask: Tensor) -> Tensor:
        out = self.projector(state)
        if self.residual:
            out = out + self.residual_down(F.silu(self.residual_up(self.residual_norm(state))))
        return out * mask[..., None].to(out.dtype)
