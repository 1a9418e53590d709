"""The fused W4A16 GEMM on GPTQ-packed weights: a Triton kernel, its tile configs and its launch.

``y[M, N] = x[M, K] @ W^T + bias`` with ``W[n, k] = s[k // gs, n] * (q[k, n] - z[k // gs, n])`` read
straight from the GPTQ layout (qweight int32 (K/8, N), scales fp16 (K/gs, N)). Zeros are passed either as
"symmetric" (z = 8 everywhere, the producer's default: no zero tensor is read at all) or as a precomputed
fp16 ``zero_bias`` (K/gs, N) holding ``1024 + z`` (see `zero_bias_from_zeros`).

Dequant uses the exponent-bias trick: ``(q | 0x6400)`` read as fp16 is exactly ``1024 + q``; subtracting
``1024 + z`` (exact in fp16) gives ``q - z``, then one multiply by the scale. Each K tile of the weight is
dequantised once in registers per program and fed to ``tl.dot`` with fp32 accumulation.

Two tile orientations: the plain one (``acc[BM, BN] += x_tile @ w_tile``) and the swapped one
(``acc[BN, BM] += w_tile^T @ x_tile^T``), where the dequantised weight is the *left* MMA operand: on Hopper
that operand can stay in registers (no shared-memory round trip) and the token tile may be as small as 16,
which suits small M. Split-K writes fp32 partials to a workspace reduced by a second small kernel.

Correctness is checked on the CPU with ``TRITON_INTERPRET=1``. The interpreter's ``tl.dot`` multiplies the
raw uint16 storage of bf16 tensors, so under the interpreter bf16 operands are upcast to fp32 before the dot
(``INTERP_BF16``): bf16 x bf16 products are exact in fp32, so this is the same arithmetic as the GPU's bf16
MMA with fp32 accumulation. The interpreter also truncates fp32 -> bf16 casts, so there the round-to-nearest
is done on the bits (`kernels.triton_common.round_to`); on the GPU the native cast (which rounds) is used.

The other paths on the same operands (dequantise, then a dense GEMM) are in `w4a16_dequant`; which one
a layer runs, per shape, is `w4a16_chooser`'s.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from ...errors import QuantError
from ..kernels.triton_common import HAS_TRITON, interp_bf16, interpreter_active

if HAS_TRITON:  # optional (the "cuda" extra): without it only the reference path runs
    import triton
    import triton.language as tl

    from ..kernels.triton_common import round_to

__all__ = [
    "NUM_SMS_DEFAULT",
    "KernelConfig",
    "auto_split_k",
    "check_operands",
    "default_config",
    "w4a16_kernel",
    "zero_bias_from_zeros",
]

NUM_SMS_DEFAULT = 132  # H100 / H200 SXM


@dataclass(frozen=True)
class KernelConfig:
    """One tile configuration of the fused kernel. BM tiles tokens (M), BN output features (N)."""

    bm: int
    bn: int
    bk: int
    num_warps: int = 4
    num_stages: int = 3
    swap: bool = False
    split_k: int = 1
    gather: bool = False  # per-k loads instead of compact loads + register fan-out

    def name(self) -> str:
        s = ("swap" if self.swap else "std") + ("-g" if self.gather else "")
        return f"{s}-m{self.bm}n{self.bn}k{self.bk}-w{self.num_warps}s{self.num_stages}-sk{self.split_k}"


# ------------------------------------------------------------------------------------------ kernels

if HAS_TRITON:
    # Helpers have a single return at the end: an early `return` under a constexpr `if` that is taken
    # does not compile (it did in the interpreter).

    @triton.jit
    def _expand_k(t, ROWS: tl.constexpr, REP: tl.constexpr, BN: tl.constexpr, KLAST: tl.constexpr):
        """Repeat each K-row of a compact tile REP times along K: [ROWS, BN] -> [ROWS*REP, BN]
        (or [BN, ROWS] -> [BN, ROWS*REP] when KLAST), keeping order, so every loaded word/scale is
        fetched once and fanned out in registers."""
        if REP == 1:
            out = t
        elif KLAST:
            out = tl.reshape(tl.broadcast_to(t[:, :, None], (BN, ROWS, REP)), (BN, ROWS * REP))
        else:
            out = tl.reshape(tl.broadcast_to(t[:, None, :], (ROWS, REP, BN)), (ROWS * REP, BN))
        return out

    @triton.jit
    def dequant_tile(
        qw_ptr,
        s_ptr,
        zb_ptr,
        k0,
        offs_n,
        n_mask,
        N,
        K,
        SYM: tl.constexpr,
        GS: tl.constexpr,
        GPT: tl.constexpr,
        BK: tl.constexpr,
        BN: tl.constexpr,
        KLAST: tl.constexpr,
        GATHER: tl.constexpr,
        EVEN_K: tl.constexpr,
        OUT_DTYPE: tl.constexpr,
        INTERP_BF16: tl.constexpr,
    ):
        """Dequantised weight tile for K rows k0..k0+BK: W^T [BK, BN], or W [BN, BK] when KLAST.

        Compact (GATHER false): BK/8 packed words and GPT = BK/GS scales (and zeros) per column are
        loaded once and fanned out in registers. Gather: every k loads its own word / scale (the
        duplicates hit L1); no reshape, but the staged tiles are 8x larger in shared memory."""
        offs_k = k0 + tl.arange(0, BK)
        shift = (offs_k % 8) * 4
        if GATHER:
            if KLAST:
                mask = n_mask[:, None] if EVEN_K else n_mask[:, None] & (offs_k[None, :] < K)
                packed = tl.load(qw_ptr + (offs_k // 8)[None, :] * N + offs_n[:, None], mask=mask, other=0)
                q = (packed >> shift[None, :]) & 0xF
                s_off = (offs_k // GS)[None, :] * N + offs_n[:, None]
            else:
                mask = n_mask[None, :] if EVEN_K else n_mask[None, :] & (offs_k[:, None] < K)
                packed = tl.load(qw_ptr + (offs_k // 8)[:, None] * N + offs_n[None, :], mask=mask, other=0)
                q = (packed >> shift[:, None]) & 0xF
                s_off = (offs_k // GS)[:, None] * N + offs_n[None, :]
            s = tl.load(s_ptr + s_off, mask=mask, other=0.0)
            if SYM:
                zb = 1032.0
            else:
                zb = tl.load(zb_ptr + s_off, mask=mask, other=1024.0)
        else:
            kw = k0 // 8 + tl.arange(0, BK // 8)  # packed qweight rows
            g = k0 // GS + tl.arange(0, GPT)
            if KLAST:
                wmask = n_mask[:, None] if EVEN_K else n_mask[:, None] & (kw[None, :] < K // 8)
                gmask = n_mask[:, None] if EVEN_K else n_mask[:, None] & (g[None, :] < K // GS)
                packed = tl.load(qw_ptr + kw[None, :] * N + offs_n[:, None], mask=wmask, other=0)
                q = (_expand_k(packed, BK // 8, 8, BN, True) >> shift[None, :]) & 0xF
                s_off = g[None, :] * N + offs_n[:, None]
            else:
                wmask = n_mask[None, :] if EVEN_K else n_mask[None, :] & (kw[:, None] < K // 8)
                gmask = n_mask[None, :] if EVEN_K else n_mask[None, :] & (g[:, None] < K // GS)
                packed = tl.load(qw_ptr + kw[:, None] * N + offs_n[None, :], mask=wmask, other=0)
                q = (_expand_k(packed, BK // 8, 8, BN, False) >> shift[:, None]) & 0xF
                s_off = g[:, None] * N + offs_n[None, :]
            s = _expand_k(tl.load(s_ptr + s_off, mask=gmask, other=0.0), GPT, BK // GPT, BN, KLAST)
            if SYM:
                zb = 1032.0
            else:
                zb = _expand_k(tl.load(zb_ptr + s_off, mask=gmask, other=1024.0), GPT, BK // GPT, BN, KLAST)
        # (q | 0x6400) as fp16 is 1024 + q exactly (exponent 2^10, q in the low mantissa bits);
        # minus 1024 + z (exact) is q - z; then the one rounding, in the scale multiply
        qz = (q | 0x6400).to(tl.int16).to(tl.float16, bitcast=True) - zb
        if tl.float16 == OUT_DTYPE:
            w = qz * s
        else:  # bf16: multiply in fp32 so the weight is rounded once
            w = round_to(qz.to(tl.float32) * s.to(tl.float32), OUT_DTYPE, INTERP_BF16)
        return w

    @triton.jit(do_not_specialize=["M"])
    def _w4a16_gemm_kernel(
        x_ptr,
        qw_ptr,
        s_ptr,
        zb_ptr,
        bias_ptr,
        y_ptr,
        M,
        N,
        K,
        stride_xm,
        stride_ym,
        k_per_split,
        HAS_BIAS: tl.constexpr,
        SYM: tl.constexpr,
        GS: tl.constexpr,
        GPT: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        SPLIT: tl.constexpr,
        SWAP: tl.constexpr,
        GATHER: tl.constexpr,
        EVEN_K: tl.constexpr,
        INTERP_BF16: tl.constexpr,
    ):
        pid = tl.program_id(0)
        pid_k = tl.program_id(1)
        num_pid_n = (N + BN - 1) // BN
        pid_m = pid // num_pid_n
        pid_n = pid % num_pid_n
        offs_m = pid_m * BM + tl.arange(0, BM)
        offs_n = pid_n * BN + tl.arange(0, BN)
        m_mask = offs_m < M
        n_mask = offs_n < N
        # splits are whole BK tiles, so only the last tile of K can be partial: masking on K is enough
        k_lo = pid_k * k_per_split
        k_hi = tl.minimum(K, k_lo + k_per_split)
        if SWAP:
            acc = tl.full((BN, BM), 0.0, tl.float32)
        else:
            acc = tl.full((BM, BN), 0.0, tl.float32)
        for k0 in range(k_lo, k_hi, BK):
            offs_k = k0 + tl.arange(0, BK)
            if SWAP:
                # dequantised weight [BN, BK] is the left operand, x^T [BK, BM] the right one
                x_mask = m_mask[None, :] if EVEN_K else m_mask[None, :] & (offs_k[:, None] < K)
                w = dequant_tile(
                    qw_ptr, s_ptr, zb_ptr, k0, offs_n, n_mask, N, K, SYM, GS, GPT, BK, BN, True, GATHER,
                    EVEN_K, x_ptr.dtype.element_ty, INTERP_BF16,
                )  # fmt: skip
                xt = tl.load(x_ptr + offs_m[None, :] * stride_xm + offs_k[:, None], mask=x_mask, other=0.0)
                if INTERP_BF16:
                    acc = tl.dot(w.to(tl.float32), xt.to(tl.float32), acc)
                else:
                    acc = tl.dot(w.to(xt.dtype), xt, acc)
            else:
                x_mask = m_mask[:, None] if EVEN_K else m_mask[:, None] & (offs_k[None, :] < K)
                x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=x_mask, other=0.0)
                w = dequant_tile(
                    qw_ptr, s_ptr, zb_ptr, k0, offs_n, n_mask, N, K, SYM, GS, GPT, BK, BN, False, GATHER,
                    EVEN_K, x_ptr.dtype.element_ty, INTERP_BF16,
                )  # fmt: skip
                if INTERP_BF16:
                    acc = tl.dot(x.to(tl.float32), w.to(tl.float32), acc)
                else:
                    acc = tl.dot(x, w.to(x.dtype), acc)
        if SWAP:
            out_offs = offs_m[None, :] * stride_ym + offs_n[:, None]
            out_mask = m_mask[None, :] & n_mask[:, None]
            bias_offs = offs_n[:, None]
            bias_mask = n_mask[:, None]
        else:
            out_offs = offs_m[:, None] * stride_ym + offs_n[None, :]
            out_mask = m_mask[:, None] & n_mask[None, :]
            bias_offs = offs_n[None, :]
            bias_mask = n_mask[None, :]
        if not SPLIT:
            if HAS_BIAS:
                acc += tl.load(bias_ptr + bias_offs, mask=bias_mask, other=0.0).to(tl.float32)
            tl.store(y_ptr + out_offs, round_to(acc, y_ptr.dtype.element_ty, INTERP_BF16), mask=out_mask)
        else:
            # fp32 partials into the workspace [split, M, N] (stride_ym == N)
            tl.store(y_ptr + pid_k * M * N + out_offs, acc, mask=out_mask)

    @triton.jit(do_not_specialize=["M", "SPLIT_K"])
    def _splitk_reduce_kernel(
        ws_ptr,
        bias_ptr,
        y_ptr,
        M,
        N,
        SPLIT_K,
        HAS_BIAS: tl.constexpr,
        BLOCK: tl.constexpr,
        INTERP_BF16: tl.constexpr,
    ):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < M * N
        acc = tl.full((BLOCK,), 0.0, tl.float32)
        for i in range(SPLIT_K):
            acc += tl.load(ws_ptr + i * M * N + offs, mask=mask, other=0.0)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs % N, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + offs, round_to(acc, y_ptr.dtype.element_ty, INTERP_BF16), mask=mask)


# ------------------------------------------------------------------------------------------ operands


def zero_bias_from_zeros(zeros: torch.Tensor) -> torch.Tensor:
    """Integer zeros (G, N) -> fp16 (G, N) holding 1024 + z, the kernels' zero operand."""
    return (zeros.to(torch.float32) + 1024.0).to(torch.float16).contiguous()


def check_operands(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zero_bias: torch.Tensor | None,
    group_size: int,
) -> tuple[int, int, int]:
    """(M, N, K) of valid W4A16 operands (x (M, K), qweight int32 (K/8, N), fp16 scales and zero_bias
    (K/gs, N)); a `QuantError` otherwise."""
    if x.dim() != 2:
        raise QuantError(f"w4a16: activations must be 2-D (M, K), got {tuple(x.shape)}")
    m, k = x.shape
    if qweight.dtype != torch.int32 or qweight.dim() != 2 or qweight.shape[0] * 8 != k:
        raise QuantError(
            f"w4a16: qweight must be int32 (K/8, N) with K={k}, got {qweight.dtype} {tuple(qweight.shape)}"
        )
    n = qweight.shape[1]
    if k % group_size or tuple(scales.shape) != (k // group_size, n) or scales.dtype != torch.float16:
        raise QuantError(
            f"w4a16: scales must be fp16 ({k // group_size}, {n}), got {scales.dtype} {tuple(scales.shape)}"
        )
    if zero_bias is not None and (
        tuple(zero_bias.shape) != tuple(scales.shape) or zero_bias.dtype != torch.float16
    ):
        raise QuantError("w4a16: zero_bias must be fp16 with the shape of scales")
    return m, n, k


# ------------------------------------------------------------------------------------------ launch


def auto_split_k(m: int, n: int, k: int, cfg: KernelConfig, num_sms: int = NUM_SMS_DEFAULT) -> int:
    """Smallest power-of-two split (<= 8) that fills the SMs, keeping >= 2 K tiles per split."""
    tiles = math.ceil(m / cfg.bm) * math.ceil(n / cfg.bn)
    split = 1
    while tiles * split < num_sms and split < 8 and k // (split * 2) >= 2 * cfg.bk:
        split *= 2
    return split


def default_config(m: int, n: int, k: int) -> KernelConfig:
    """A config used without measuring (interpreter, CPU, or a CUDA graph capture before any warm-up):
    the plain orientation, the tiles the first H200 run picked per bucket."""
    if m <= 32:
        cfg = KernelConfig(bm=16, bn=64, bk=128, num_warps=4, num_stages=3)
    elif m <= 256:
        cfg = KernelConfig(bm=64, bn=128, bk=64, num_warps=4, num_stages=4)
    else:
        cfg = KernelConfig(bm=128, bn=128, bk=64, num_warps=8, num_stages=3)
    return KernelConfig(**{**asdict(cfg), "split_k": auto_split_k(m, n, k, cfg)})


def w4a16_kernel(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zero_bias: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    *,
    group_size: int = 32,
    config: KernelConfig | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The fused Triton kernel: y (M, N) in x.dtype (fp16 or bf16). Runs on CUDA or in the interpreter."""
    if not HAS_TRITON:
        raise QuantError("w4a16_kernel needs triton", hint="pip install 'irodori-speaker[cuda]'")
    m, n, k = check_operands(x, qweight, scales, zero_bias, group_size)
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise QuantError(f"w4a16_kernel takes fp16 or bf16 activations, got {x.dtype}")
    if x.device.type != "cuda" and not interpreter_active():
        raise QuantError("w4a16_kernel runs on CUDA (or on the CPU with TRITON_INTERPRET=1)")
    if x.stride(1) != 1:
        x = x.contiguous()
    cfg = config or default_config(m, n, k)
    if group_size % 8 or not (cfg.bk % group_size == 0 or group_size % cfg.bk == 0):
        raise QuantError(
            f"w4a16_kernel: group size {group_size} and tile BK {cfg.bk} must nest (and gs % 8 == 0)"
        )
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    split = max(1, cfg.split_k)
    k_per_split = math.ceil(math.ceil(k / split) / cfg.bk) * cfg.bk
    even_k = k % cfg.bk == 0
    has_bias = bias is not None
    bias_t = bias.contiguous() if bias is not None else scales  # dummy pointer when absent
    zb = zero_bias if zero_bias is not None else scales
    interp_bf16_x = interp_bf16(x)
    target = out if split == 1 else torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    grid = (math.ceil(m / cfg.bm) * math.ceil(n / cfg.bn), split)
    _w4a16_gemm_kernel[grid](
        x, qweight, scales, zb, bias_t, target, m, n, k, x.stride(0), n, k_per_split,
        HAS_BIAS=has_bias, SYM=zero_bias is None, GS=group_size, GPT=max(1, cfg.bk // group_size),
        BM=cfg.bm, BN=cfg.bn, BK=cfg.bk, SPLIT=split > 1, SWAP=cfg.swap, GATHER=cfg.gather, EVEN_K=even_k,
        INTERP_BF16=interp_bf16_x,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if split > 1:
        block = 1024
        _splitk_reduce_kernel[(math.ceil(m * n / block),)](
            target,
            bias_t,
            out,
            m,
            n,
            SPLIT_K=split,
            HAS_BIAS=has_bias,
            BLOCK=block,
            INTERP_BF16=interp_bf16_x,
        )
    return out
