"""The v4-Large text backbone: the text tower of T5Gemma 2 (transformers' `T5Gemma2TextEncoder`),
our own, in plain PyTorch.

Module names equal the released tensor names (`pretrained_text_backbone.backbone.layers.3.
self_attn.q_proj.weight`, `...embed_tokens.eoi_embedding`, ...). Proof: the reference's golden
outputs in `tests/data/dit_v4_large` (tests/engine/test_fixtures_v4_large.py).

A Gemma 3 style bidirectional encoder: embeddings times sqrt(hidden), the end-of-image token
replaced by its own unscaled vector; per layer a sandwich-normed attention (pre and post norm)
and a sandwich-normed GeGLU MLP (tanh GELU); RMSNorms scale by (1 + w); grouped-query attention
with per-head q/k norms, rotate-half RoPE per layer type (full layers may scale positions
linearly), scores scaled by query_pre_attn_scalar^-0.5, and on sliding layers an asymmetric
window; a final norm. Everything runs in the weights' dtype with norms, RoPE and softmax in
float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .backbone_config import T5Gemma2Config
from .layers import apply_rotate_half, rotate_half_tables, window_masks


class GemmaRMSNorm(nn.Module):
    """x / rms(x) * (1 + w) in float32: the stored weight is the offset from a unit scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * (1.0 + self.weight.float())).to(x.dtype)


class ScaledEmbedding(nn.Module):
    """E[id] * sqrt(hidden); positions holding `eoi_token_index` get `eoi_embedding`, unscaled."""

    def __init__(self, cfg: T5Gemma2Config) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size))
        self.eoi_embedding = nn.Parameter(torch.zeros(cfg.hidden_size))
        if not self.weight.is_meta:  # as layers.Embedding: meta's normal_ imports torch._dynamo
            nn.init.normal_(self.weight)
        self.scale = cfg.hidden_size**0.5
        self.eoi = cfg.eoi_token_index

    def forward(self, ids: Tensor) -> Tensor:
        # sqrt(hidden) as a float32 number rounded to the weights' dtype, as the reference has it
        scale = torch.tensor(self.scale, dtype=torch.float32).to(self.weight.dtype).item()
        x = F.embedding(ids, self.weight) * scale
        if self.eoi is None:
            return x
        return torch.where((ids == self.eoi)[..., None], self.eoi_embedding.to(x.dtype), x)


class Attention(nn.Module):
    """Grouped-query self-attention: query head j reads key/value head j // (heads / kv_heads)."""

    def __init__(self, cfg: T5Gemma2Config) -> None:
        super().__init__()
        H, hd, bias = cfg.hidden_size, cfg.head_dim, cfg.attention_bias
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, hd
        self.scale = cfg.attention_scale
        self.q_proj = nn.Linear(H, self.heads * hd, bias=bias)
        self.k_proj = nn.Linear(H, self.kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(H, self.kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.heads * hd, H, bias=bias)
        self.q_norm = GemmaRMSNorm(hd, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(hd, cfg.rms_norm_eps)

    def forward(self, x: Tensor, mask: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        B, L, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, L, self.heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, L, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotate_half(q, *rope), apply_rotate_half(k, *rope)
        groups = self.heads // self.kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(B, L, self.heads * self.head_dim))


class GeGLU(nn.Module):
    """down(gelu(gate(x)) * up(x))."""

    def __init__(self, cfg: T5Gemma2Config) -> None:
        super().__init__()
        H, hidden = cfg.hidden_size, cfg.intermediate_size
        self.approximate = cfg.gelu_approximate
        self.gate_proj = nn.Linear(H, hidden, bias=False)
        self.up_proj = nn.Linear(H, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, H, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate=self.approximate) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: T5Gemma2Config, index: int) -> None:
        super().__init__()
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.layer_type = cfg.layer_types[index]
        self.pre_self_attn_layernorm = GemmaRMSNorm(H, eps)
        self.self_attn = Attention(cfg)
        self.post_self_attn_layernorm = GemmaRMSNorm(H, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(H, eps)
        self.mlp = GeGLU(cfg)
        self.post_feedforward_layernorm = GemmaRMSNorm(H, eps)

    def forward(self, x: Tensor, mask: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        x = x + self.post_self_attn_layernorm(self.self_attn(self.pre_self_attn_layernorm(x), mask, rope))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class T5Gemma2TextEncoder(nn.Module):
    """`T5Gemma2TextEncoder`'s forward: last_hidden_state (B, L, hidden) times the token mask.

    Rows with no valid key (an empty caption) come out as exact zeros, never NaN."""

    def __init__(self, cfg: T5Gemma2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = ScaledEmbedding(cfg)
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        x = self.embed_tokens(ids)
        masks, ropes = self.attention_masks(mask), self.rope_tables(ids.shape[1], x.device)
        for layer in self.layers:
            kind = str(layer.layer_type)
            x = layer(x, masks[kind], ropes[kind])
        return self.norm(x) * mask[..., None].to(x.dtype)

    def attention_masks(self, mask: Tensor) -> dict[str, Tensor]:
        """Per layer type, its boolean attention mask (B, 1, L, L) from the token mask (B, L)."""
        full, sliding = window_masks(mask, *self.cfg.window)
        return {"full_attention": full, "sliding_attention": sliding}

    def rope_tables(self, length: int, device: torch.device) -> dict[str, tuple[Tensor, Tensor]]:
        """Per layer type, its RoPE cos / sin tables (length, head_dim)."""
        cfg, tables = self.cfg, {}
        for kind in set(cfg.layer_types):
            theta, factor = cfg.rope(kind)
            tables[kind] = rotate_half_tables(length, cfg.head_dim, theta, device, factor)
        return tables
