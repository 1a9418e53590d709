"""Plain-torch twins of the Triton kernels in engine/fused.py: the oracle the kernel tests compare with.

Each computes what its kernel computes, in fp32 with one rounding at the end (as the kernel stores),
so a kernel may differ from its twin only by rounding order. They are test code: where the kernels do
not run, the product runs the model's own blocks (engine/fast.py `FastDiT._velocity_model`).
"""

from __future__ import annotations

import torch
from torch import Tensor


def add_rms_modulate(
    x: Tensor, y: Tensor | None, gate: Tensor | None, scale1: Tensor, shift: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    if y is not None:
        x = x + (gate * y if gate is not None else y)
    x32 = x.float()
    h = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps) * scale1.float()
    if shift is not None:
        h = h + shift.float()
    return x, h.to(x.dtype)


def qkv_joint(
    p: Tensor,
    q_norm: Tensor,
    k_norm: Tensor,
    cos: Tensor,
    sin: Tensor,
    ctx_k: Tensor,
    ctx_v: Tensor,
    heads: int,
    eps: float,
    ctx_rows: Tensor | None = None,
    rope_heads: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    if ctx_rows is not None:
        ctx_k, ctx_v = ctx_k.index_select(0, ctx_rows), ctx_v.index_select(0, ctx_rows)
    B, S, _ = p.shape
    D = p.shape[-1] // 4
    Dh = D // heads
    half = heads // 2 if rope_heads is None else rope_heads
    q, k, v, _g = p.view(B, S, 4, heads, Dh).unbind(2)

    def norm_rope(t: Tensor, w: Tensor) -> Tensor:
        t = t.float()
        t = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps) * w.float()
        even, odd = t[:, :, :half, 0::2], t[:, :, :half, 1::2]
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        rot = torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2)
        return torch.cat((rot, t[:, :, half:]), dim=2).to(p.dtype).transpose(1, 2)

    keys = torch.cat((norm_rope(k, k_norm), ctx_k), dim=2)
    values = torch.cat((v.transpose(1, 2), ctx_v), dim=2)
    return norm_rope(q, q_norm).contiguous(), keys, values


def gate_heads(o: Tensor, p: Tensor) -> Tensor:
    B, H, S, Dh = o.shape
    g = p[..., 3 * H * Dh :]
    return (o.transpose(1, 2).reshape(B, S, H * Dh).float() * torch.sigmoid(g.float())).to(o.dtype)


def swiglu(u: Tensor, hidden: int) -> Tensor:
    u1, u3 = u.float().split(hidden, dim=-1)
    return (torch.nn.functional.silu(u1) * u3).to(u.dtype)


def snake(x: Tensor, alpha: Tensor) -> Tensor:
    """x + sin(alpha x)^2 / (alpha + 1e-9) in fp32 (alpha (1, C, 1)), returned in x's dtype."""
    xc = x.float()
    a = alpha.float()
    return (xc + torch.sin(a * xc).pow(2) / (a + 1e-9)).to(x.dtype)
