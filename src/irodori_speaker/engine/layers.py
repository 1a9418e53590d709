"""Building blocks shared by the DiT, its condition encoders, the projectors and the duration predictor.

Norms and rotary tables are computed in float32 (docs/engine-api.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Embedding(nn.Embedding):
    """`nn.Embedding` that leaves a meta-device table uninitialised: `normal_` on the meta device
    runs torch's Python reference, whose first call imports torch._dynamo (about 1.2 s of CPU in
    every process that loads a model; the checkpoint loaders build on the meta device)."""

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:
            super().reset_parameters()


class RMSNorm(nn.Module):
    """RMS norm over the last dim, computed in float32; weight shape (dim,) or (heads, head_dim)."""

    def __init__(self, shape: int | tuple[int, ...], eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(shape))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rms_normalize(x: Tensor, eps: float) -> Tensor:
    """Weightless RMS norm in float32 (AdaLN)."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rope_tables(seq_len: int, dim: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """cos/sin of angle = position * 10000^(-2j/dim), shape (seq_len, dim/2), float32."""
    freqs = torch.pow(10000.0, -torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    angles = torch.arange(seq_len, device=device, dtype=torch.float32)[:, None] * freqs[None, :]
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate adjacent pairs (x[2j], x[2j+1]) of x (B, S, H, D) as complex numbers, in float32."""
    x32 = x.float()
    x0, x1 = x32[..., 0::2], x32[..., 1::2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    out = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
    return out.to(x.dtype)


def timestep_embedding(t: Tensor, dim: int) -> Tensor:
    """[cos(t f), sin(t f)] with f_j = 1000 exp(-ln(10000) j / (dim/2)); t (B,) in [0, 1]."""
    half = dim // 2
    freqs = 1000.0 * torch.exp(
        -math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half
    )
    angles = t.float()[:, None] * freqs[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def rotate_half_tables(
    seq_len: int, dim: int, theta: float, device: torch.device, factor: float = 1.0
) -> tuple[Tensor, Tensor]:
    """cos/sin (seq_len, dim) of angle = position * theta^(-2j/dim) / factor, each half repeated:
    [a, a]. `factor` is the "linear" RoPE scaling of Hugging Face configs (1: none)."""
    inv = torch.pow(theta, -torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim)
    if factor != 1.0:
        inv = inv / factor
    angles = torch.arange(seq_len, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rotate_half(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x cos + rot(x) sin with rot(x) = [-x2, x1] for x (B, H, S, D), in float32."""
    x32 = x.float()
    x1, x2 = x32.chunk(2, dim=-1)
    out = x32 * cos + torch.cat((-x2, x1), dim=-1) * sin
    return out.to(x.dtype)


def window_masks(mask: Tensor, back: int, ahead: int) -> tuple[Tensor, Tensor]:
    """Boolean attention masks (B, 1, L, L) of a bidirectional text encoder from its token mask
    (B, L): full layers see every valid key, sliding layers the valid keys k with
    q - back <= k <= q + ahead.

    A query row with no allowed key (padding on a sliding layer, every row of an empty caption)
    attends to every key instead: its output stays finite and is zeroed by the encoder's final
    mask product, and padding keys are masked for every valid row, so valid outputs do not
    change. No host sync (graph-safe).
    """
    L = mask.shape[1]
    keys = mask[:, None, None, :]
    pos = torch.arange(L, device=mask.device)
    offset = pos[None, :] - pos[:, None]  # k - q
    near = (offset >= -back) & (offset <= ahead)
    full = keys.expand(-1, 1, L, L)
    sliding = keys & near[None, None]
    return tuple(m | ~m.any(dim=-1, keepdim=True) for m in (full, sliding))  # type: ignore[return-value]
