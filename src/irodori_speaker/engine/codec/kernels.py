"""The codec's Triton kernels on the CUDA path, with the decoder's eager ops as their twins.

- `snake`: Snake in one pass on (B, C, T) activations (the eager form is seven ops).
- `conv_epilogue`: what follows every conv of the channels-last decoder (`codec.fast`), on
  (..., C) rows: bias, residual, the next Snake, one pass.
- `residual_unit`: a whole residual unit (7-tap conv, Snake, 1-tap conv, residual, next Snake)
  in one kernel, its weights packed by `pack_residual_unit`.

Arithmetic is fp32 inside a kernel with one rounding at each store. Where Triton does not run, or
a kernel fails (`fused.run_or_fall_back`), the decoder runs its eager ops instead. Tests:
tests/engine/test_fused.py (each kernel against the eager ops, in the interpreter on the CPU).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..kernels.triton_common import HAS_TRITON, interp_bf16

if HAS_TRITON:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    from ..kernels.triton_common import round_to

__all__ = [
    "APPROX_SIN",
    "UnitConfig",
    "approx_sin",
    "conv_epilogue",
    "pack_residual_unit",
    "residual_unit",
    "residual_unit_config",
    "snake",
]


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
    def _mma(acc, a, w, INTERP_BF16: tl.constexpr):
        """acc + a @ w (fp32 operands under the interpreter's bf16, which has no bf16 dot)."""
        if INTERP_BF16:
            acc += tl.dot(a.to(tl.float32), w.to(tl.float32))
        else:
            acc += tl.dot(a, w)
        return acc

    @triton.jit
    def _unit_mid(acc, b7_ptr, a7_ptr, ch, C: tl.constexpr, DT: tl.constexpr, INTERP_BF16: tl.constexpr,
                  APPROX_SIN: tl.constexpr):  # fmt: skip
        """The 7-tap conv's epilogue on one chunk of its output channels: bias, Snake, rounded."""
        cm = ch < C
        y = acc + tl.load(b7_ptr + ch, mask=cm, other=0.0).to(tl.float32)[None, :]
        a7 = tl.load(a7_ptr + ch, mask=cm, other=1.0)[None, :]
        return round_to(_snake_of(y, a7, APPROX_SIN), DT, INTERP_BF16)

    @triton.jit
    def _residual_unit_kernel(
        s_ptr, w7_ptr, b7_ptr, a7_ptr, w1_ptr, b1_ptr, x_ptr, an_ptr, h_ptr, o_ptr, T,
        C: tl.constexpr, CW: tl.constexpr, THIRDS: tl.constexpr, KP: tl.constexpr, KC: tl.constexpr,
        DIL: tl.constexpr, KEEP_H: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BN: tl.constexpr,
        STAGES: tl.constexpr, INTERP_BF16: tl.constexpr, APPROX_SIN: tl.constexpr,
    ):  # fmt: skip
        # the packed width CP: one chunk of CW channels (a power of two), or three (`THIRDS`)
        CP: tl.constexpr = 3 * CW if THIRDS else CW
        b = tl.program_id(1).to(tl.int64)
        t = tl.program_id(0) * BT + tl.arange(0, BT)
        ch = tl.arange(0, CW)
        row0 = b * T * C
        dt = s_ptr.dtype.element_ty
        # the dilated conv: 7 taps x KC chunks of BK input channels, one pipelined loop (the loads
        # of the next chunks in flight while this one's product runs); the weight packed
        # (7, KP, CP) with zeros past C (`pack_residual_unit`), so its loads need no mask; its
        # output channels in one accumulator, or three of CW (tile dimensions are powers of two)
        acc0 = tl.zeros((BT, CW), dtype=tl.float32)
        acc1 = tl.zeros((BT, CW), dtype=tl.float32)
        acc2 = tl.zeros((BT, CW), dtype=tl.float32)
        for i in tl.range(0, 7 * KC, num_stages=STAGES):
            k = i // KC
            kc = (i - k * KC) * BK + tl.arange(0, BK)
            tt = t + (k - 3) * DIL
            tm = (tt >= 0) & (tt < T)  # the conv's zero padding
            a = tl.load(
                s_ptr + row0 + tt[:, None] * C + kc[None, :], mask=tm[:, None] & (kc < C)[None, :], other=0.0
            )
            w = w7_ptr + (k * KP + kc)[:, None] * CP + ch[None, :]
            acc0 = _mma(acc0, a, tl.load(w), INTERP_BF16)
            if THIRDS:
                acc1 = _mma(acc1, a, tl.load(w + CW), INTERP_BF16)
                acc2 = _mma(acc2, a, tl.load(w + 2 * CW), INTERP_BF16)
        mid0 = _unit_mid(acc0, b7_ptr, a7_ptr, ch, C, dt, INTERP_BF16, APPROX_SIN)
        if THIRDS:
            mid1 = _unit_mid(acc1, b7_ptr, a7_ptr, CW + ch, C, dt, INTERP_BF16, APPROX_SIN)
            mid2 = _unit_mid(acc2, b7_ptr, a7_ptr, 2 * CW + ch, C, dt, INTERP_BF16, APPROX_SIN)
        # the 1-tap conv on it (weight packed (CP, CP)), BN output channels at a time, each with
        # its epilogue
        valid = t < T
        for n0 in tl.static_range(0, CP, BN):
            n = n0 + tl.arange(0, BN)
            nm = n < C
            w1 = w1_ptr + ch[:, None] * CP + n[None, :]
            acc = _mma(tl.zeros((BT, BN), dtype=tl.float32), mid0, tl.load(w1), INTERP_BF16)
            if THIRDS:
                acc = _mma(acc, mid1, tl.load(w1 + CW * CP), INTERP_BF16)
                acc = _mma(acc, mid2, tl.load(w1 + 2 * CW * CP), INTERP_BF16)
            m = valid[:, None] & nm[None, :]
            offs = row0 + t[:, None] * C + n[None, :]
            hh = acc + tl.load(b1_ptr + n, mask=nm, other=0.0).to(tl.float32)[None, :]
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


#: A residual unit's output channels in three chunks of a power of two where that pads less than
#: one chunk of the next power of two (`unit_chunks`): 96 channels as 3 x 32, 192 as 3 x 64, where
#: one chunk is 128 / 256 wide and a quarter (7-tap) to 44 % (1-tap) of the unit's products
#: multiply zeros. In thirds a 96-channel unit took 1.09-1.17 ms against 1.31-1.34 in one chunk,
#: a 192-channel one 1.63-1.64 against 1.83-1.91 unfused (one chunk: 1.96-2.03, slower than
#: unfused); the graphed windows 1.10-1.16x the unfused units' (H100, `codec_units.py --thirds`,
#: benchmarks/RESULTS.md "Thirty-sixth session"). Off until its tests have passed on a GPU (only
#: the interpreter has checked its sums; on, the 192-channel units are fused too:
#: `fast.FUSED_UNIT_WIDTH`; status.md "Next" 00).
UNIT_THIRDS = False


def unit_chunks(C: int, thirds: bool | None = None) -> tuple[int, int]:
    """(chunks, chunk width) of a unit of C channels' packed outputs: (1, the next power of two)
    or, with `thirds` (default `UNIT_THIRDS`) where it pads less, (3, a power of two); at least 16
    wide (`tl.dot`'s least)."""
    whole = max(16, triton.next_power_of_2(C))
    third = max(16, triton.next_power_of_2(-(-C // 3)))
    if (UNIT_THIRDS if thirds is None else thirds) and 3 * third < whole:
        return 3, third
    return 1, whole


def pack_residual_unit(weight7: Tensor, weight1: Tensor, thirds: bool | None = None) -> tuple[Tensor, Tensor]:
    """A residual unit's conv weights as `residual_unit` reads them: the 7-tap one (C, C, 7) as
    (7, KP, CP) [tap, in, out], the 1-tap one (C, C, 1) as (CP, CP) [in, out], zero padded (KP: C
    to a multiple of 64; CP: chunks x width of `unit_chunks`, which the kernel reads back from
    CP: a power of two is one chunk)."""
    C = weight7.shape[0]
    n, width = unit_chunks(C, thirds)
    kp, cp = -(-C // 64) * 64, n * width
    w7 = weight7.new_zeros(7, kp, cp)
    w7[:, :C, :C] = weight7.permute(2, 1, 0)
    w1 = weight1.new_zeros(cp, cp)
    w1[:C, :C] = weight1[:, :, 0].t()
    return w7, w1


#: (BT, BK, BN, warps, stages): samples a tile, input channels a chunk, output channels of the
#: 1-tap conv at a time, and the launch's warps and pipeline stages
UnitConfig = tuple[int, int, int, int, int]


def residual_unit_config(C: int, thirds: bool) -> UnitConfig:
    """The block configuration `residual_unit` takes for a unit of C channels, its outputs packed
    in `thirds` or not (BN is cut to a chunk's width there)."""
    # the best of the sweep over the three dilations (H100, `codec_units.py --thirds`, thirty-sixth
    # session): 96 channels the same block in both packings (BN 32 in thirds); 192 in thirds wants
    # four warps (1.64 ms against 2.54 with eight), in one chunk eight
    if C <= 128:
        return (128, 32, 128, 4, 3)
    return (64, 64, 64, 4, 3) if thirds else (128, 64, 64, 8, 3)


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
    thirds = (cp & (cp - 1)) != 0  # not a power of two: three chunks (`pack_residual_unit`)
    cw = cp // 3 if thirds else cp
    assert (cw & (cw - 1)) == 0 and cw >= 16
    bt, bk, bn, warps, stages = config or residual_unit_config(C, thirds)
    bk, bn = min(bk, kp), min(bn, cw)  # an output block within a chunk
    s, residual = s.contiguous(), residual.contiguous()
    h = torch.empty_like(s) if keep else s
    out = torch.empty_like(s)
    grid = (triton.cdiv(T, bt), B)
    _residual_unit_kernel[grid](
        s, w7, bias7, alpha7.reshape(C).float().contiguous(), w1, bias1, residual,
        alpha_next.reshape(C).float().contiguous(), h, out, T,
        C=C, CW=cw, THIRDS=thirds, KP=kp, KC=-(-C // bk), DIL=dilation, KEEP_H=keep, BT=bt, BK=bk, BN=bn,
        STAGES=stages, INTERP_BF16=interp_bf16(s), APPROX_SIN=approx_sin(s), num_warps=warps,
    )  # fmt: skip
    return (h if keep else None), out
