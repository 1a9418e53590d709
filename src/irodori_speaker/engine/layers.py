"""Building blocks shared by the DiT, its condition encoders, the projectors and the duration predictor.

Norms and rotary tables are computed in float32 (docs/engine-api.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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
