"""Fused elementwise kernels for the fast path's DiT block (Triton), with plain-torch twins.

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
- `swiglu`: ``silu(u1) * u3`` of the fused w1/w3 projection.

Arithmetic is fp32 inside a kernel with one rounding at each store, so results differ from the
eager composition (which rounds after every op in bf16) by that rounding only. Where Triton does not
run (CPU, MPS), or a kernel fails (`run_or_fall_back`), the fast path runs the model's own blocks
instead (`FastDiT._velocity_model`) and the codec its eager Snake. Tests hold each kernel to a
plain-torch twin (tests/engine/kernel_twins.py) and the whole fused path to the golden outputs.
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
    from triton.language.extra import libdevice

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
        HAS_Y: tl.constexpr, HAS_SHIFT: tl.constexpr, BLOCK: tl.constexpr, INTERP_BF16: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        line = row // ROWS  # the batch row whose modulation this token takes (stride 0: shared)
        offs = tl.arange(0, BLOCK)
        m = offs < D
        x = tl.load(x_ptr + row * D + offs, mask=m, other=0.0).to(tl.float32)
        if HAS_Y:
            y = tl.load(y_ptr + row * D + offs, mask=m, other=0.0).to(tl.float32)
            g = tl.load(g_ptr + line * g_stride + offs, mask=m, other=0.0).to(tl.float32)
            xr = round_to(x + g * y, xo_ptr.dtype.element_ty, INTERP_BF16)
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
    def _swiglu_kernel(u_ptr, out_ptr, HID, BLOCK: tl.constexpr, INTERP_BF16: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = offs < HID
        u1 = tl.load(u_ptr + row * 2 * HID + offs, mask=m, other=0.0).to(tl.float32)
        u3 = tl.load(u_ptr + row * 2 * HID + HID + offs, mask=m, other=0.0).to(tl.float32)
        y = u1 / (1.0 + tl.exp(-u1)) * u3
        tl.store(out_ptr + row * HID + offs, round_to(y, out_ptr.dtype.element_ty, INTERP_BF16), mask=m)


# ----------------------------------------------------------------------------------------- wrappers


def add_rms_modulate(
    x: Tensor, y: Tensor | None, gate: Tensor | None, scale1: Tensor, shift: Tensor | None, eps: float
) -> tuple[Tensor, Tensor]:
    """(x + gate * y, rms_norm(x + gate * y) * scale1 + shift); y None skips the residual add.

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
        HAS_Y=y is not None, HAS_SHIFT=shift is not None, BLOCK=triton.next_power_of_2(D),
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
) -> tuple[Tensor, Tensor, Tensor]:
    """q (B, H, S, Dh) normed and rotated; keys/values (B, H, S + L, Dh) = [self ; context].

    `ctx_rows` (B,) integer: row b's context is row `ctx_rows[b]` of `ctx_k` / `ctx_v` (the step
    batcher's context pool, engine/steps.py: no gathered copy); None: row b's own."""
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
        p, q_norm, k_norm, cos, sin, ctx_k, ctx_v, rows, q, k, v, S, L, heads, heads // 2, eps,
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


def swiglu(u: Tensor, hidden: int) -> Tensor:
    """silu(u[..., :hidden]) * u[..., hidden:]."""
    u = u.contiguous()
    rows = u.numel() // (2 * hidden)
    out = torch.empty(*u.shape[:-1], hidden, dtype=u.dtype, device=u.device)
    block = 1024
    _swiglu_kernel[(rows, triton.cdiv(hidden, block))](
        u, out, hidden, BLOCK=block, INTERP_BF16=interp_bf16(u), num_warps=4
    )
    return out


# ------------------------------------------------------------------------------------- codec Snake


#: Snake's sine in the codec kernels is the GPU's approximation (`sin.approx.f32`, PTX ISA: absolute
#: error 2^-20.5 for |x| < 100 pi, so a Snake output is off by at most 2 min(1/a, |x|) 2^-20.5, far
#: below an fp16 / bf16 rounding) rather than libdevice's `sinf` (its reduction and slow path: 135
#: against 41 PTX instructions an element of the flat epilogue). On an H100 the epilogues took
#: 1.07x less time and the windows 1.04-1.08x; inside the fused residual unit, twice an element
#: between its GEMMs, the exact sine was most of what the unit lost (benchmarks/RESULTS.md
#: "Twenty-first session"; `codec_roofline.py --exact-sin`). False: the exact sine. The
#: interpreter has no fast sine, so it always takes the exact one.
APPROX_SIN = True


def approx_sin(t: Tensor) -> bool:
    """The APPROX_SIN flag of a kernel on `t`'s device: on the GPU unless switched off."""
    return APPROX_SIN and t.device.type == "cuda"


if HAS_TRITON:

    @triton.jit
    def _snake_of(x, a, APPROX_SIN: tl.constexpr):
        """Snake in fp32: x + sin(a x)^2 / a (the codec's; a is its channel's alpha)."""
        if APPROX_SIN:
            sn = libdevice.fast_sinf(a * x)
        else:
            sn = tl.sin(a * x)
        return x + sn * sn * (1.0 / (a + 1e-9))

    @triton.jit
    def _snake_kernel(
        x_ptr, a_ptr, y_ptr, C, T, BLOCK: tl.constexpr, INTERP_BF16: tl.constexpr, APPROX_SIN: tl.constexpr
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)  # (batch, channel) row of a contiguous (B, C, T)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = offs < T
        a = tl.load(a_ptr + row % C)
        x = tl.load(x_ptr + row * T + offs, mask=m, other=0.0).to(tl.float32)
        y = _snake_of(x, a, APPROX_SIN)
        tl.store(y_ptr + row * T + offs, round_to(y, y_ptr.dtype.element_ty, INTERP_BF16), mask=m)


def snake(x: Tensor, alpha: Tensor) -> Tensor:
    """Snake in one pass (the eager form is seven: casts, mul, sin, square, mul, add)."""
    B, C, T = x.shape
    x = x.contiguous()
    a = alpha.reshape(C).float().contiguous()
    y = torch.empty_like(x)
    block = 2048
    _snake_kernel[(B * C, triton.cdiv(T, block))](
        x, a, y, C, T, BLOCK=block, INTERP_BF16=interp_bf16(x), APPROX_SIN=approx_sin(x)
    )
    return y


# ------------------------------------------------------- codec: conv epilogue on (rows, channels)


if HAS_TRITON:

    @triton.jit
    def _conv_epilogue_kernel(
        y_ptr, b_ptr, r_ptr, a_ptr, h_ptr, s_ptr, total,
        C: tl.constexpr, HAS_RES: tl.constexpr, KEEP_H: tl.constexpr, SNAKE: tl.constexpr,
        BLOCK: tl.constexpr, INTERP_BF16: tl.constexpr, APPROX_SIN: tl.constexpr,
    ):  # fmt: skip
        # flat over the (rows, C) elements: contiguous vector loads whatever C is. A 2D tile of a
        # power-of-two width left lanes idle at C = 96 / 192 and reached 2.2 of the H100's 3.35
        # TB/s there; flat, 2.5 (16 windows of 66 frames: the epilogues 7.6 against 8.5 ms,
        # benchmarks/codec_roofline.py). C is a compile-time constant (one compile per width), so
        # an element's channel costs a multiply, not a divide
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < total
        c = offs % C
        h = tl.load(y_ptr + offs, mask=m, other=0.0).to(tl.float32)
        h += tl.load(b_ptr + c, mask=m, other=0.0).to(tl.float32)
        if HAS_RES:
            h += tl.load(r_ptr + offs, mask=m, other=0.0).to(tl.float32)
        if KEEP_H:
            tl.store(h_ptr + offs, round_to(h, h_ptr.dtype.element_ty, INTERP_BF16), mask=m)
        if SNAKE:
            s = _snake_of(h, tl.load(a_ptr + c, mask=m, other=1.0), APPROX_SIN)
            tl.store(s_ptr + offs, round_to(s, s_ptr.dtype.element_ty, INTERP_BF16), mask=m)

    @triton.jit
    def _residual_unit_kernel(
        s_ptr, w7_ptr, b7_ptr, a7_ptr, w1_ptr, b1_ptr, x_ptr, an_ptr, h_ptr, o_ptr, T,
        C: tl.constexpr, CP: tl.constexpr, KP: tl.constexpr, KC: tl.constexpr, DIL: tl.constexpr,
        KEEP_H: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
        STAGES: tl.constexpr, INTERP_BF16: tl.constexpr, APPROX_SIN: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(1).to(tl.int64)
        t = tl.program_id(0) * BT + tl.arange(0, BT)
        ch = tl.arange(0, CP)
        cm = ch < C
        row0 = b * T * C
        # the dilated conv: 7 taps x KC chunks of BK input channels, one pipelined loop (the loads
        # of the next chunks in flight while this one's product runs); the weight packed
        # (7, KP, CP) with zeros past C (`pack_residual_unit`), so its loads need no mask
        acc = tl.zeros((BT, CP), dtype=tl.float32)
        for i in tl.range(0, 7 * KC, num_stages=STAGES):
            k = i // KC
            kc = (i - k * KC) * BK + tl.arange(0, BK)
            tt = t + (k - 3) * DIL
            tm = (tt >= 0) & (tt < T)  # the conv's zero padding
            a = tl.load(
                s_ptr + row0 + tt[:, None] * C + kc[None, :], mask=tm[:, None] & (kc < C)[None, :], other=0.0
            )
            w = tl.load(w7_ptr + (k * KP + kc)[:, None] * CP + ch[None, :])
            if INTERP_BF16:
                acc += tl.dot(a.to(tl.float32), w.to(tl.float32))
            else:
                acc += tl.dot(a, w)
        y = acc + tl.load(b7_ptr + ch, mask=cm, other=0.0).to(tl.float32)[None, :]
        a7 = tl.load(a7_ptr + ch, mask=cm, other=1.0)[None, :]
        mid = round_to(_snake_of(y, a7, APPROX_SIN), s_ptr.dtype.element_ty, INTERP_BF16)
        # the 1-tap conv on it (weight packed (CP, CP)), BN output channels at a time, each with
        # its epilogue
        valid = t < T
        for n0 in tl.static_range(0, CP, BN):
            n = n0 + tl.arange(0, BN)
            nm = n < C
            w1 = tl.load(w1_ptr + ch[:, None] * CP + n[None, :])
            if INTERP_BF16:
                acc2 = tl.dot(mid.to(tl.float32), w1.to(tl.float32))
            else:
                acc2 = tl.dot(mid, w1)
            m = valid[:, None] & nm[None, :]
            offs = row0 + t[:, None] * C + n[None, :]
            hh = acc2 + tl.load(b1_ptr + n, mask=nm, other=0.0).to(tl.float32)[None, :]
            hh += tl.load(x_ptr + offs, mask=m, other=0.0).to(tl.float32)
            if KEEP_H:
                tl.store(h_ptr + offs, round_to(hh, h_ptr.dtype.element_ty, INTERP_BF16), mask=m)
            an = tl.load(an_ptr + n, mask=nm, other=1.0)[None, :]
            so = _snake_of(hh, an, APPROX_SIN)
            tl.store(o_ptr + offs, round_to(so, o_ptr.dtype.element_ty, INTERP_BF16), mask=m)


def conv_epilogue(
    y: Tensor, bias: Tensor, residual: Tensor | None, alpha: Tensor | None, keep: bool
) -> tuple[Tensor | None, Tensor | None]:
    """On (..., C) rows: ``h = y + bias (+ residual)`` and ``s = snake(h)`` in one pass.

    Returns (h if `keep`, s if `alpha` is given); h feeds the snake in fp32, unrounded. The codec's
    channels-last decoder (`codec.fast`) ends every conv with this: bias add, residual add and the
    next Snake were three to five kernels around a (B, C, T) conv."""
    y = y.contiguous()
    C = y.shape[-1]
    h = torch.empty_like(y) if keep else y
    s = torch.empty_like(y) if alpha is not None else y
    r = residual.contiguous() if residual is not None else y
    a = alpha.reshape(C).float().contiguous() if alpha is not None else bias
    total = y.numel()
    block = 4096
    _conv_epilogue_kernel[(triton.cdiv(total, block),)](
        y, bias, r, a, h, s, total,
        C=C, HAS_RES=residual is not None, KEEP_H=keep, SNAKE=alpha is not None,
        BLOCK=block, INTERP_BF16=interp_bf16(y), APPROX_SIN=approx_sin(y), num_warps=8,
    )  # fmt: skip
    return (h if keep else None), (s if alpha is not None else None)


def pack_residual_unit(weight7: Tensor, weight1: Tensor) -> tuple[Tensor, Tensor]:
    """A residual unit's conv weights as `residual_unit` reads them: the 7-tap one (C, C, 7) as
    (7, KP, CP) [tap, in, out], the 1-tap one (C, C, 1) as (CP, CP) [in, out], zero padded (KP: C
    to a multiple of 64, CP: to a power of two)."""
    C = weight7.shape[0]
    kp, cp = -(-C // 64) * 64, max(16, triton.next_power_of_2(C))
    w7 = weight7.new_zeros(7, kp, cp)
    w7[:, :C, :C] = weight7.permute(2, 1, 0)
    w1 = weight1.new_zeros(cp, cp)
    w1[:C, :C] = weight1[:, :, 0].t()
    return w7, w1


#: (BT, BK, BN, warps, stages): samples a tile, input channels a chunk, output channels of the
#: 1-tap conv at a time, and the launch's warps and pipeline stages
UnitConfig = tuple[int, int, int, int, int]


def residual_unit_config(C: int) -> UnitConfig:
    """The block configuration `residual_unit` takes for a unit of C channels."""
    # 96 channels: the best mean of the sweep over the three dilations (H100, `codec_units.py`;
    # 1.35x the unfused ops); 192: the best of the twentieth session's sweep (still 0.36x)
    return (128, 32, 128, 4, 3) if C <= 128 else (64, 64, 128, 8, 3)


def residual_unit(
    s: Tensor,
    packed: tuple[Tensor, Tensor],
    bias7: Tensor,
    alpha7: Tensor,
    dilation: int,
    bias1: Tensor,
    residual: Tensor,
    alpha_next: Tensor,
    keep: bool,
    *,
    config: UnitConfig | None = None,
) -> tuple[Tensor | None, Tensor]:
    """A codec residual unit in one kernel, on (B, T, C) channels-last activations: the 7-tap conv
    of `dilation` on `s` (zero padded), bias, Snake, the 1-tap conv, bias, the residual, then the
    next Snake. Returns (h if `keep`, s'). Unfused that is two convs and two epilogues, ten passes
    over the activation; here four (s with its halo, the residual, h and s' written).

    `packed`: the two convs' weights from `pack_residual_unit`. fp16 / bf16; C at most 256 (the
    decoder's 96- and 192-channel stages)."""
    B, T, C = s.shape
    w7, w1 = packed
    assert s.dtype in (torch.float16, torch.bfloat16) and C <= 256
    kp, cp = w7.shape[1], w7.shape[2]
    assert w7.shape[0] == 7 and w1.shape == (cp, cp) and kp >= C and cp >= C
    bt, bk, bn, warps, stages = config or residual_unit_config(C)
    bk, bn = min(bk, kp), min(bn, cp)
    s, residual = s.contiguous(), residual.contiguous()
    h = torch.empty_like(s) if keep else s
    out = torch.empty_like(s)
    grid = (triton.cdiv(T, bt), B)
    _residual_unit_kernel[grid](
        s, w7, bias7, alpha7.reshape(C).float().contiguous(), w1, bias1, residual,
        alpha_next.reshape(C).float().contiguous(), h, out, T,
        C=C, CP=cp, KP=kp, KC=-(-C // bk), DIL=dilation, KEEP_H=keep, BT=bt, BK=bk, BN=bn,
        STAGES=stages, INTERP_BF16=interp_bf16(s), APPROX_SIN=approx_sin(s), num_warps=warps,
    )  # fmt: skip
    return (h if keep else None), out
