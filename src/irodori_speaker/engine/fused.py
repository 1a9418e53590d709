"""Fused elementwise kernels for the fast path's DiT block and text backbone (Triton), with
plain-torch twins.

A DiT block in eager PyTorch launches ~65 small kernels (norms, modulation, RoPE, concatenations,
gating); inside a CUDA graph each still costs a few microseconds, so a sampling loop of 8 steps
spends more time between GEMMs than in them. These five kernels cut a block to five elementwise
launches around its four GEMMs and the attention:

- `add_rms_modulate`: ``x += gate * y`` (the previous residual branch), then
  ``h = rms_norm(x) * scale1 + shift`` (AdaLN), one pass over each token row.
- `qkv_joint`: from the fused Q/K/V/gate projection, per-head RMS norm of q and k, RoPE on the
  first half of the heads, and the joint keys/values ``[self ; context]`` written in one pass
  (this replaces two `torch.cat` of the context per layer and step).
- `gate_heads`: attention output (B, H, S, Dh) back to (B, S, D) times ``sigmoid(gate)``.
- `swiglu`: ``silu(u1) * u3`` of the fused w1/w3 projection (`glu`, which GeGLU shares).

The v4 text backbone (ModernBERT, `engine/fast_text.py`) takes three more: `add_layer_norm`
(residual add and LayerNorm, the last one times the token mask), `rope_qkv` (RoPE on q and k and
the heads' layout for the attention) and `glu` with GELU. The scratch text encoder (v2, v3,
VoiceDesign) takes the DiT's, `add_rms_modulate` ungated with the norm's weight as its scale.

Arithmetic is fp32 inside a kernel with one rounding at each store, so results differ from the
eager composition (which rounds after every op in bf16) by that rounding only. Where Triton does not
run (CPU, MPS), or a kernel fails (`run_or_fall_back`), the fast path runs the model's own blocks
instead (`FastDiT._velocity_model`). Tests hold each kernel to a plain-torch twin
(tests/engine/kernel_twins.py) and the whole fused path to the golden outputs. The codec's kernels
are in `codec/kernels.py`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor

from .encoders import capturing
from .kernels.triton_common import HAS_TRITON, interp_bf16, interpreter_active

T = TypeVar("T")

if HAS_TRITON:
    import triton
    import triton.language as tl

    from .kernels.triton_common import round_to


_FAILED: list[str] = []  # a kernel that failed to compile or launch switches them all off


def fused_available(device: torch.device) -> bool:
    """True where the Triton kernels run: CUDA with triton, or the CPU under TRITON_INTERPRET=1."""
    if _FAILED or not HAS_TRITON:
        return False
    return device.type == "cuda" or (device.type == "cpu" and interpreter_active())


def run_or_fall_back(
    fused: Callable[[], T],
    fallback: Callable[[], T],
    *,
    what: str = "fused Triton kernels",
    switch_off: Callable[[], None] | None = None,
) -> T:
    """`fused()`; if a kernel fails to compile or launch (a Triton or driver quirk), warn once,
    switch the fused kernels off for this process and return `fallback()` (the same result, eager
    ops). Not while a CUDA graph is being captured: first calls happen in the warm-up before it.
    `switch_off`: what to switch off instead of every kernel (`what` names it in the warning), e.g.
    one decoder's fused residual units, whose block may want more shared memory than a card has."""
    try:
        return fused()
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as e:
        if capturing():
            raise
        why = f"{type(e).__name__}: {e}"
        if switch_off is None:
            _FAILED.append(why)
            why = _FAILED[0]
        else:
            switch_off()
        warnings.warn(f"{what} switched off, eager ops instead: {why}", stacklevel=2)
        return fallback()


# ------------------------------------------------------------------------------------------ triton

if HAS_TRITON:

    @triton.jit
    def _add_rms_modulate_kernel(
        x_ptr, y_ptr, g_ptr, s_ptr, b_ptr, xo_ptr, h_ptr, D, eps, ROWS, g_stride, s_stride, b_stride,
        HAS_Y: tl.constexpr, HAS_GATE: tl.constexpr, HAS_SHIFT: tl.constexpr, BLOCK: tl.constexpr,
        INTERP_BF16: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        line = row // ROWS  # the batch row whose modulation this token takes (stride 0: shared)
        offs = tl.arange(0, BLOCK)
        m = offs < D
        x = tl.load(x_ptr + row * D + offs, mask=m, other=0.0).to(tl.float32)
        if HAS_Y:
            y = tl.load(y_ptr + row * D + offs, mask=m, other=0.0).to(tl.float32)
            if HAS_GATE:
                y = y * tl.load(g_ptr + line * g_stride + offs, mask=m, other=0.0).to(tl.float32)
            xr = round_to(x + y, xo_ptr.dtype.element_ty, INTERP_BF16)
            tl.store(xo_ptr + row * D + offs, xr, mask=m)
            x = xr.to(tl.float32)  # normalise the residual as stored, as the eager path does
        r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
        h = x * r * tl.load(s_ptr + line * s_stride + offs, mask=m, other=0.0).to(tl.float32)
        if HAS_SHIFT:
            h += tl.load(b_ptr + line * b_stride + offs, mask=m, other=0.0).to(tl.float32)
        tl.store(h_ptr + row * D + offs, round_to(h, h_ptr.dtype.element_ty, INTERP_BF16), mask=m)

    @triton.jit
    def _norm_rope(t_e, t_o, w_ptr, cos_ptr, sin_ptr, pos, offs_h, offs_j, HALF, HEADS, ROPE_HEADS, Dh, eps):
        """Per-head RMS norm (weight (H, Dh)) then RoPE on heads < ROPE_HEADS; even/odd lanes."""
        r = 1.0 / tl.sqrt((tl.sum(t_e * t_e, axis=1) + tl.sum(t_o * t_o, axis=1)) / Dh + eps)
        w = w_ptr + offs_h[:, None] * Dh + 2 * offs_j[None, :]
        hmask = (offs_h < HEADS)[:, None]
        t_e = t_e * r[:, None] * tl.load(w, mask=hmask, other=0.0).to(tl.float32)
        t_o = t_o * r[:, None] * tl.load(w + 1, mask=hmask, other=0.0).to(tl.float32)
        c = tl.load(cos_ptr + pos * HALF + offs_j)[None, :]
        s = tl.load(sin_ptr + pos * HALF + offs_j)[None, :]
        rope = (offs_h < ROPE_HEADS)[:, None]
        return tl.where(rope, t_e * c - t_o * s, t_e), tl.where(rope, t_e * s + t_o * c, t_o)

    @triton.jit
    def _qkv_joint_kernel(
        p_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, ck_ptr, cv_ptr, rows_ptr, q_ptr, k_ptr, v_ptr,
        S, L, H, ROPE_HEADS, eps,
        sck_b, sck_h, sck_s, scv_b, scv_h, scv_s,
        HALF: tl.constexpr, BH: tl.constexpr, HAS_ROWS: tl.constexpr, INTERP_BF16: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0).to(tl.int64)
        b = pid // (S + L)
        pos = pid % (S + L)
        Dh = 2 * HALF
        D = H * Dh
        offs_h = tl.arange(0, BH)
        offs_j = tl.arange(0, HALF)
        offs_d = tl.arange(0, 2 * HALF)
        hmask = (offs_h < H)[:, None]
        out_row = (b * H + offs_h[:, None]) * (S + L) + pos  # joint (B, H, S + L, Dh)
        if pos < S:
            # whole head rows (contiguous, vectorised loads), split into RoPE's even/odd lanes
            base = p_ptr + (b * S + pos) * 4 * D + offs_h[:, None] * Dh + offs_d[None, :]
            q_e, q_o = tl.split(
                tl.reshape(tl.load(base, mask=hmask, other=0.0).to(tl.float32), (BH, HALF, 2))
            )
            k_e, k_o = tl.split(
                tl.reshape(tl.load(base + D, mask=hmask, other=0.0).to(tl.float32), (BH, HALF, 2))
            )
            v = tl.load(base + 2 * D, mask=hmask, other=0.0)
            q_e, q_o = _norm_rope(
                q_e, q_o, qn_ptr, cos_ptr, sin_ptr, pos, offs_h, offs_j, HALF, H, ROPE_HEADS, Dh, eps
            )
            k_e, k_o = _norm_rope(
                k_e, k_o, kn_ptr, cos_ptr, sin_ptr, pos, offs_h, offs_j, HALF, H, ROPE_HEADS, Dh, eps
            )
            dt = q_ptr.dtype.element_ty
            q = round_to(tl.reshape(tl.join(q_e, q_o), (BH, 2 * HALF)), dt, INTERP_BF16)
            k = round_to(tl.reshape(tl.join(k_e, k_o), (BH, 2 * HALF)), dt, INTERP_BF16)
            q_row = ((b * H + offs_h[:, None]) * S + pos) * Dh  # q (B, H, S, Dh)
            tl.store(q_ptr + q_row + offs_d[None, :], q, mask=hmask)
            tl.store(k_ptr + out_row * Dh + offs_d[None, :], k, mask=hmask)
            tl.store(v_ptr + out_row * Dh + offs_d[None, :], v, mask=hmask)
        else:
            c = pos - S
            if HAS_ROWS:  # row b's context is row rows[b] of the context tensors (a slot pool)
                cb = tl.load(rows_ptr + b).to(tl.int64)
            else:
                cb = b
            ck = tl.load(
                ck_ptr + cb * sck_b + offs_h[:, None] * sck_h + c * sck_s + offs_d[None, :], mask=hmask
            )
            cv = tl.load(
                cv_ptr + cb * scv_b + offs_h[:, None] * scv_h + c * scv_s + offs_d[None, :], mask=hmask
            )
            tl.store(k_ptr + out_row * Dh + offs_d[None, :], ck, mask=hmask)
            tl.store(v_ptr + out_row * Dh + offs_d[None, :], cv, mask=hmask)

    @triton.jit
    def _gate_heads_kernel(
        o_ptr, p_ptr, out_ptr, S, H, so_b, so_h, so_s,
        DH: tl.constexpr, BH: tl.constexpr, INTERP_BF16: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0).to(tl.int64)
        b = pid // S
        s = pid % S
        offs_h = tl.arange(0, BH)[:, None]
        offs_d = tl.arange(0, DH)[None, :]
        m = offs_h < H
        D = H * DH
        o = tl.load(o_ptr + b * so_b + offs_h * so_h + s * so_s + offs_d, mask=m, other=0.0).to(tl.float32)
        g = tl.load(p_ptr + pid * 4 * D + 3 * D + offs_h * DH + offs_d, mask=m, other=0.0).to(tl.float32)
        y = o * (1.0 / (1.0 + tl.exp(-g)))
        y = round_to(y, out_ptr.dtype.element_ty, INTERP_BF16)
        tl.store(out_ptr + pid * D + offs_h * DH + offs_d, y, mask=m)

    @triton.jit
    def _glu_kernel(u_ptr, out_ptr, HID, ACT: tl.constexpr, BLOCK: tl.constexpr, INTERP_BF16: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = offs < HID
        u1 = tl.load(u_ptr + row * 2 * HID + offs, mask=m, other=0.0).to(tl.float32)
        u3 = tl.load(u_ptr + row * 2 * HID + HID + offs, mask=m, other=0.0).to(tl.float32)
        if ACT == 0:  # silu
            a = u1 / (1.0 + tl.exp(-u1))
        elif ACT == 1:  # gelu, exact
            a = 0.5 * u1 * (1.0 + tl.erf(u1 * 0.7071067811865476))
        else:  # gelu, tanh approximation: 0.5 x (1 + tanh(z)) = x sigmoid(2 z)
            z = 0.7978845608028654 * (u1 + 0.044715 * u1 * u1 * u1)
            a = u1 / (1.0 + tl.exp(-2.0 * z))
        tl.store(out_ptr + row * HID + offs, round_to(a * u3, out_ptr.dtype.element_ty, INTERP_BF16), mask=m)

    @triton.jit
    def _add_layer_norm_kernel(
        x_ptr, y_ptr, w_ptr, b_ptr, m_ptr, xo_ptr, h_ptr, D, eps,
        HAS_Y: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_MASK: tl.constexpr, BLOCK: tl.constexpr,
        INTERP_BF16: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        m = offs < D
        x = tl.load(x_ptr + row * D + offs, mask=m, other=0.0).to(tl.float32)
        if HAS_Y:
            y = tl.load(y_ptr + row * D + offs, mask=m, other=0.0).to(tl.float32)
            xr = round_to(x + y, xo_ptr.dtype.element_ty, INTERP_BF16)
            tl.store(xo_ptr + row * D + offs, xr, mask=m)
            x = xr.to(tl.float32)  # normalise the residual as stored, as the eager path does
        mean = tl.sum(x, axis=0) / D
        d = tl.where(m, x - mean, 0.0)
        h = (
            d
            / tl.sqrt(tl.sum(d * d, axis=0) / D + eps)
            * tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
        )
        if HAS_BIAS:
            h += tl.load(b_ptr + offs, mask=m, other=0.0).to(tl.float32)
        if HAS_MASK:  # the row's token mask (0 / 1)
            h = h * tl.load(m_ptr + row).to(tl.float32)
        tl.store(h_ptr + row * D + offs, round_to(h, h_ptr.dtype.element_ty, INTERP_BF16), mask=m)

    @triton.jit
    def _rope_qkv_kernel(
        p_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, q_ptr, kv_ptr, L, HQ, HK, HALF, kv_stride, eps,
        BH: tl.constexpr, BJ: tl.constexpr, HAS_NORM: tl.constexpr, INTERP_BF16: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0).to(tl.int64)  # one token: (b, position)
        b = pid // L
        pos = pid % L
        Dh = 2 * HALF
        row = p_ptr + pid * (HQ + 2 * HK) * Dh  # the token's q | k | v
        offs_h = tl.arange(0, BH)[:, None]
        offs_j = tl.arange(0, BJ)[None, :]
        jm = offs_j < HALF
        c = tl.load(cos_ptr + pos * Dh + offs_j, mask=jm, other=0.0)  # each half's angles
        s = tl.load(sin_ptr + pos * Dh + offs_j, mask=jm, other=0.0)
        dt = q_ptr.dtype.element_ty
        for part in tl.static_range(3):  # q, k normed (HAS_NORM) and rotated; v laid out only
            if part == 0:
                m = (offs_h < HQ) & jm
                src = row + offs_h * Dh + offs_j
                dst = q_ptr + ((b * HQ + offs_h) * L + pos) * Dh + offs_j  # (B, HQ, L, Dh)
            else:
                m = (offs_h < HK) & jm
                src = row + (HQ + (part - 1) * HK + offs_h) * Dh + offs_j
                dst = kv_ptr + (part - 1) * kv_stride + ((b * HK + offs_h) * L + pos) * Dh + offs_j
            x1 = tl.load(src, mask=m, other=0.0).to(tl.float32)
            x2 = tl.load(src + HALF, mask=m, other=0.0).to(tl.float32)
            if part < 2:
                if HAS_NORM:  # per-head RMS norm times its multiplier (Dh,)
                    n_ptr = qn_ptr
                    if part == 1:
                        n_ptr = kn_ptr
                    r = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / Dh + eps)
                    x1 = x1 * r[:, None] * tl.load(n_ptr + offs_j, mask=jm, other=0.0).to(tl.float32)
                    x2 = x2 * r[:, None] * tl.load(n_ptr + HALF + offs_j, mask=jm, other=0.0).to(tl.float32)
                x1, x2 = x1 * c - x2 * s, x2 * c + x1 * s
            tl.store(dst, round_to(x1, dt, INTERP_BF16), mask=m)
            tl.store(dst + HALF, round_to(x2, dt, INTERP_BF16), mask=m)


# ----------------------------------------------------------------------------------------- wrappers


def add_rms_modulate(
    x: Tensor, y: Tensor | None, gate: Tensor | None, scale1: Tensor, shift: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    """(x + gate * y, rms_norm(x + gate * y) * scale1 + shift); y None skips the residual add,
    gate None adds y as it is (a scratch text encoder's residual, unmodulated).

    gate, scale1 and shift are (D,) for every row, or (B, 1, D) per batch row of x (B, S, D): the
    step batcher's rows sit at their own timesteps (engine/steps.py)."""
    D = x.shape[-1]
    x = x.contiguous()
    if y is not None:
        y = y.contiguous()
    xo = torch.empty_like(x) if y is not None else x
    h = torch.empty_like(x)
    mods = [t for t in (gate, scale1, shift) if t is not None]
    lines = max(t.numel() // D for t in mods)
    rows = x.numel() // D // lines  # tokens per batch row

    def stride(t: Tensor | None) -> int:
        if t is None or t.numel() == D:
            return 0
        if t.numel() != lines * D or t.stride(-1) != 1:
            raise ValueError(f"modulation of shape {tuple(t.shape)} for x of shape {tuple(x.shape)}")
        return int(t.stride(0))

    _add_rms_modulate_kernel[(x.numel() // D,)](
        x, y if y is not None else x, gate if gate is not None else scale1, scale1,
        shift if shift is not None else scale1, xo, h, D, eps,
        rows, stride(gate), stride(scale1), stride(shift),
        HAS_Y=y is not None, HAS_GATE=gate is not None, HAS_SHIFT=shift is not None,
        BLOCK=triton.next_power_of_2(D),
        INTERP_BF16=interp_bf16(x), num_warps=4,
    )  # fmt: skip
    return xo, h


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
    """q (B, H, S, Dh) normed and rotated; keys/values (B, H, S + L, Dh) = [self ; context].

    `ctx_rows` (B,) integer: row b's context is row `ctx_rows[b]` of `ctx_k` / `ctx_v` (the step
    batcher's context pool, engine/steps.py: no gathered copy); None: row b's own. `rope_heads`:
    the heads rotated, the first ones (the DiT's half, the default; a text encoder's all)."""
    B, S, D4 = p.shape
    Dh = D4 // 4 // heads
    L = ctx_k.shape[2]
    p = p.contiguous()
    q = torch.empty(B, heads, S, Dh, dtype=p.dtype, device=p.device)
    k = torch.empty(B, heads, S + L, Dh, dtype=p.dtype, device=p.device)
    v = torch.empty_like(k)
    if ctx_k.stride(-1) != 1:
        ctx_k = ctx_k.contiguous()
    if ctx_v.stride(-1) != 1:
        ctx_v = ctx_v.contiguous()
    rows = p if ctx_rows is None else ctx_rows  # an unread pointer when there is no table
    _qkv_joint_kernel[(B * (S + L),)](
        p, q_norm, k_norm, cos, sin, ctx_k, ctx_v, rows, q, k, v, S, L, heads,
        heads // 2 if rope_heads is None else rope_heads, eps,
        ctx_k.stride(0), ctx_k.stride(1), ctx_k.stride(2), ctx_v.stride(0), ctx_v.stride(1), ctx_v.stride(2),
        HALF=Dh // 2, BH=triton.next_power_of_2(heads), HAS_ROWS=ctx_rows is not None,
        INTERP_BF16=interp_bf16(p), num_warps=4,
    )  # fmt: skip
    return q, k, v


def gate_heads(o: Tensor, p: Tensor) -> Tensor:
    """o (B, H, S, Dh), any strides (last one 1) -> (B, S, H*Dh) * sigmoid(p's gate quarter)."""
    B, H, S, Dh = o.shape
    if o.stride(-1) != 1:
        o = o.contiguous()
    p = p.contiguous()
    out = torch.empty(B, S, H * Dh, dtype=o.dtype, device=o.device)
    _gate_heads_kernel[(B * S,)](
        o, p, out, S, H, o.stride(0), o.stride(1), o.stride(2),
        DH=Dh, BH=triton.next_power_of_2(H), INTERP_BF16=interp_bf16(o), num_warps=2,
    )  # fmt: skip
    return out


#: the gate activations of `glu`: SwiGLU's, and GeGLU's exact and tanh-approximated GELU
GLU_ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}


def glu(u: Tensor, hidden: int, act: str = "silu") -> Tensor:
    """act(u[..., :hidden]) * u[..., hidden:]: SwiGLU ("silu"), GeGLU ("gelu", "gelu_tanh")."""
    u = u.contiguous()
    rows = u.numel() // (2 * hidden)
    out = torch.empty(*u.shape[:-1], hidden, dtype=u.dtype, device=u.device)
    block = 1024
    _glu_kernel[(rows, triton.cdiv(hidden, block))](
        u, out, hidden, ACT=GLU_ACTIVATIONS[act], BLOCK=block, INTERP_BF16=interp_bf16(u), num_warps=4
    )
    return out


def swiglu(u: Tensor, hidden: int) -> Tensor:
    """silu(u[..., :hidden]) * u[..., hidden:]."""
    return glu(u, hidden, "silu")


def add_layer_norm(
    x: Tensor,
    y: Tensor | None,
    weight: Tensor,
    bias: Tensor | None,
    eps: float,
    row_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """(x + y, layer_norm(x + y) * weight + bias), the norm times `row_mask` (a 0 / 1 per row,
    e.g. the token mask (B, L)) if given; y None skips the add (x returned as is)."""
    D = x.shape[-1]
    x = x.contiguous()
    y = y.contiguous() if y is not None else None
    xo = torch.empty_like(x) if y is not None else x
    h = torch.empty_like(x)
    rm = row_mask.contiguous().view(torch.uint8) if row_mask is not None else x
    _add_layer_norm_kernel[(x.numel() // D,)](
        x, y if y is not None else x, weight, bias if bias is not None else weight, rm, xo, h, D, eps,
        HAS_Y=y is not None, HAS_BIAS=bias is not None, HAS_MASK=row_mask is not None,
        BLOCK=triton.next_power_of_2(D), INTERP_BF16=interp_bf16(x), num_warps=4,
    )  # fmt: skip
    return xo, h


def rope_qkv(
    p: Tensor,
    cos: Tensor,
    sin: Tensor,
    heads: int,
    kv_heads: int | None = None,
    head_norms: tuple[Tensor, Tensor] | None = None,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor, Tensor]:
    """A fused Q/K/V projection p (B, L, (heads + 2 kv_heads) x Dh) as q (B, heads, L, Dh) and
    k, v (B, kv_heads, L, Dh; `kv_heads` default `heads`), q and k rotated by rotate-half RoPE
    (`layers.apply_rotate_half`; cos / sin (L, Dh), each half repeated), after a per-head RMS norm
    times `head_norms` (q's, k's; (Dh,) each) if given; in float32 with one rounding: the
    attention inputs of ModernBERT and (with grouped K/V and the q / k norms) T5Gemma 2 in one pass."""
    kv_heads = heads if kv_heads is None else kv_heads
    B, L, W = p.shape
    Dh = W // (heads + 2 * kv_heads)
    p = p.contiguous()
    q = torch.empty(B, heads, L, Dh, dtype=p.dtype, device=p.device)
    kv = torch.empty(2, B, kv_heads, L, Dh, dtype=p.dtype, device=p.device)
    qn, kn = (t.contiguous() for t in head_norms) if head_norms is not None else (cos, cos)
    _rope_qkv_kernel[(B * L,)](
        p, cos.contiguous(), sin.contiguous(), qn, kn, q, kv, L, heads, kv_heads, Dh // 2, kv[0].numel(), eps,
        BH=triton.next_power_of_2(max(heads, kv_heads)), BJ=triton.next_power_of_2(Dh // 2),
        HAS_NORM=head_norms is not None, INTERP_BF16=interp_bf16(p), num_warps=2,
    )  # fmt: skip
    return q, kv[0], kv[1]
