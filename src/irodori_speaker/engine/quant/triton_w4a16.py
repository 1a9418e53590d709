"""W4A16 GEMM on GPTQ-packed weights: a fused Triton kernel, a dequant-into-scratch + cuBLAS path, and a
per-shape chooser that measures both on first use.

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
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ...dirs import cache_root
from ...errors import QuantError
from ..kernels.triton_common import HAS_TRITON, interp_bf16, interpreter_active
from ..kernels.tuning import is_tuning_allowed

if HAS_TRITON:  # optional (the "cuda" extra); everything here falls back to the reference path without it
    import triton
    import triton.language as tl

    from ..kernels.triton_common import round_to

__all__ = [
    "HAS_TRITON",
    "KernelConfig",
    "candidate_configs",
    "choose_impl",
    "dequantize_into",
    "interpreter_active",
    "m_bucket",
    "nearest_choice",
    "reference_w4a16",
    "tune_file",
    "w4a16_kernel",
    "w4a16_linear",
    "w4a16_scratch",
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
    def _dequant_tile(
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
                w = _dequant_tile(
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
                w = _dequant_tile(
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

    @triton.jit
    def _dequant_kernel(
        qw_ptr,
        s_ptr,
        zb_ptr,
        out_ptr,
        K,
        N,
        SYM: tl.constexpr,
        GS: tl.constexpr,
        GPT: tl.constexpr,
        BK: tl.constexpr,
        BN: tl.constexpr,
        INTERP_BF16: tl.constexpr,
    ):
        k0 = tl.program_id(0) * BK
        offs_k = k0 + tl.arange(0, BK)
        offs_n = tl.program_id(1) * BN + tl.arange(0, BN)
        n_mask = offs_n < N
        w = _dequant_tile(
            qw_ptr, s_ptr, zb_ptr, k0, offs_n, n_mask, N, K, SYM, GS, GPT, BK, BN, False, False, False,
            out_ptr.dtype.element_ty, INTERP_BF16,
        )  # fmt: skip
        mask = (offs_k[:, None] < K) & n_mask[None, :]
        tl.store(out_ptr + offs_k[:, None] * N + offs_n[None, :], w, mask=mask)


# ------------------------------------------------------------------------------------------ helpers


def zero_bias_from_zeros(zeros: torch.Tensor) -> torch.Tensor:
    """Integer zeros (G, N) -> fp16 (G, N) holding 1024 + z, the kernels' zero operand."""
    return (zeros.to(torch.float32) + 1024.0).to(torch.float16).contiguous()


def _check_operands(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zero_bias: torch.Tensor | None,
    group_size: int,
) -> tuple[int, int, int]:
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


def reference_w4a16(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zero_bias: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    *,
    group_size: int = 32,
    compute_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Dequantise (fp32) then F.linear in `compute_dtype` (default: x.dtype); output in x.dtype."""
    _check_operands(x, qweight, scales, zero_bias, group_size)
    w = _dequant_torch(qweight, scales, zero_bias, group_size)  # (K, N) fp32
    cd = compute_dtype or x.dtype
    y = F.linear(x.to(cd), w.t().to(cd), None if bias is None else bias.to(cd))
    return y.to(x.dtype)


def _dequant_torch(
    qweight: torch.Tensor, scales: torch.Tensor, zero_bias: torch.Tensor | None, group_size: int
) -> torch.Tensor:
    shifts = torch.arange(0, 32, 4, dtype=torch.int32, device=qweight.device)
    k8, n = qweight.shape
    q = ((qweight.unsqueeze(1) >> shifts.view(1, 8, 1)) & 0xF).reshape(k8 * 8, n).to(torch.float32)
    z = torch.full_like(scales, 8.0, dtype=torch.float32) if zero_bias is None else zero_bias.float() - 1024.0
    return (q - z.repeat_interleave(group_size, 0)) * scales.float().repeat_interleave(group_size, 0)


# --------------------------------------------------------------------------------------- kernel path


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return NUM_SMS_DEFAULT


def auto_split_k(m: int, n: int, k: int, cfg: KernelConfig, num_sms: int = NUM_SMS_DEFAULT) -> int:
    """Smallest power-of-two split (<= 8) that fills the SMs, keeping >= 2 K tiles per split."""
    tiles = math.ceil(m / cfg.bm) * math.ceil(n / cfg.bn)
    split = 1
    while tiles * split < num_sms and split < 8 and k // (split * 2) >= 2 * cfg.bk:
        split *= 2
    return split


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
    m, n, k = _check_operands(x, qweight, scales, zero_bias, group_size)
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


# -------------------------------------------------------------------------------------- scratch path

_SCRATCH: dict[tuple[str, torch.dtype], torch.Tensor] = {}
# Buffers a larger layer grew out of. A CUDA graph captured earlier still writes into the old one at
# replay, so it must stay allocated: freeing it (and torch.cuda.empty_cache() unmapping it) made the
# v4 text encoder's graph, captured before the larger DiT layers grew the buffer, fault at replay
# (an illegal memory access, H200, 2026-12-03). They are small next to the current buffer.
_RETIRED: list[torch.Tensor] = []
_SCRATCH_LOCK = threading.Lock()


def _scratch(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A flat buffer shared by every layer on (device, dtype), grown to the largest layer seen.

    A grown-out buffer is retired, not freed (see `_RETIRED`).
    """
    key = (str(device), dtype)
    with _SCRATCH_LOCK:
        buf = _SCRATCH.get(key)
        if buf is None or buf.numel() < numel:
            if buf is not None:
                _RETIRED.append(buf)
            buf = torch.empty(numel, dtype=dtype, device=device)
            _SCRATCH[key] = buf
    return buf[:numel]


def release_scratch() -> None:
    """Drop the shared dequant buffers (they are re-made on the next scratch-path call).

    Only when no CUDA graph that ran the scratch path is alive: its replay would write into them.
    """
    with _SCRATCH_LOCK:
        _SCRATCH.clear()
        _RETIRED.clear()


def dequantize_into(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zero_bias: torch.Tensor | None,
    out: torch.Tensor,
    *,
    group_size: int = 32,
) -> torch.Tensor:
    """Dequantise W^T (K, N) into `out` (K, N) with the Triton dequant kernel (or torch elsewhere)."""
    k, n = qweight.shape[0] * 8, qweight.shape[1]
    if tuple(out.shape) != (k, n):
        raise QuantError(f"dequantize_into: out must be ({k}, {n}), got {tuple(out.shape)}")
    if HAS_TRITON and (out.device.type == "cuda" or interpreter_active()):
        bk, bn = 32, 128
        _dequant_kernel[(math.ceil(k / bk), math.ceil(n / bn))](
            qweight, scales, zero_bias if zero_bias is not None else scales, out, k, n,
            SYM=zero_bias is None, GS=group_size, GPT=max(1, bk // group_size), BK=bk, BN=bn,
            INTERP_BF16=interp_bf16(out), num_warps=4,
        )  # fmt: skip
    else:
        out.copy_(_dequant_torch(qweight, scales, zero_bias, group_size))
    return out


def w4a16_scratch(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zero_bias: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    *,
    group_size: int = 32,
) -> torch.Tensor:
    """Dequantise into the shared scratch buffer (x.dtype), then one cuBLAS GEMM (addmm with bias)."""
    _m, n, k = _check_operands(x, qweight, scales, zero_bias, group_size)
    w = _scratch(k * n, x.dtype, x.device).view(k, n)
    dequantize_into(qweight, scales, zero_bias, w, group_size=group_size)
    if bias is not None:
        return torch.addmm(bias.to(x.dtype), x, w)
    return torch.mm(x, w)


# ------------------------------------------------------------------------------------------ chooser


def m_bucket(m: int) -> int:
    """Power-of-two bucket of M (16 .. 4096): tiles and the kernel/scratch choice are cached per bucket."""
    b = 16
    while b < m and b < 4096:
        b *= 2
    return b


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


def candidate_configs(m: int, n: int, k: int, num_sms: int = NUM_SMS_DEFAULT) -> list[KernelConfig]:
    """The small tile list tried for M's bucket (BM 16-128, BN 64-256, BK 64/128), plus split-K variants."""
    b = m_bucket(m)
    # (bm, bn, bk, warps, stages, swap, gather); measured on an H200 (docs/int4.md)
    if b <= 32:
        tiles = [(16, 64, 128, 4, 3, False, False), (32, 64, 64, 4, 4, False, False),
                 (16, 64, 128, 4, 4, True, False), (32, 64, 128, 4, 4, True, False),
                 (16, 128, 128, 4, 4, True, False), (16, 64, 64, 4, 3, False, True),
                 (16, 64, 64, 4, 3, True, True)]  # fmt: skip
    elif b <= 128:
        tiles = [(64, 64, 64, 4, 4, False, False), (64, 128, 64, 4, 4, False, False),
                 (32, 128, 64, 4, 4, True, False), (64, 128, 64, 4, 4, True, False),
                 (64, 64, 128, 4, 3, True, False), (32, 64, 64, 4, 3, True, True)]  # fmt: skip
    elif b <= 256:
        tiles = [(64, 128, 64, 4, 4, False, False), (128, 64, 64, 4, 4, False, False),
                 (128, 128, 64, 8, 3, False, False), (64, 128, 64, 4, 4, True, False),
                 (128, 128, 64, 8, 3, True, False)]  # fmt: skip
    else:
        tiles = [(128, 128, 64, 8, 3, False, False), (128, 256, 64, 8, 3, False, False),
                 (128, 128, 128, 8, 3, False, False), (64, 256, 64, 8, 3, False, False),
                 (128, 128, 64, 8, 3, True, False), (128, 256, 64, 8, 3, True, False)]  # fmt: skip
    out: list[KernelConfig] = []
    for bm, bn, bk, w, s, swap, gather in tiles:
        cfg = KernelConfig(bm=bm, bn=bn, bk=bk, num_warps=w, num_stages=s, swap=swap, gather=gather)
        out.append(cfg)
        split = auto_split_k(m, n, k, cfg, num_sms)
        if split > 1:
            out.append(KernelConfig(**{**asdict(cfg), "split_k": split}))
    return out


@dataclass(frozen=True)
class Choice:
    """What `w4a16_linear` runs for one (device, dtype, N, K, zero kind, M bucket)."""

    impl: str  # "kernel" | "scratch"
    config: KernelConfig | None = None
    time_ms: float | None = None
    timings: tuple[tuple[str, float], ...] = ()  # every candidate measured: (name, ms)


_CHOICES: dict[tuple, Choice] = {}
_CHOICES_LOCK = threading.Lock()
_TUNE_FILE_ENV = "IRODORI_INT4_TUNE_CACHE"


_DEVICE_NAMES: dict[int, str] = {}


def _device_name(device: torch.device) -> str:
    if device.type != "cuda":
        return device.type
    idx = device.index if device.index is not None else torch.cuda.current_device()
    name = _DEVICE_NAMES.get(idx)
    if name is None:
        name = _DEVICE_NAMES[idx] = torch.cuda.get_device_name(idx)
    return name


def _choice_key(x: torch.Tensor, n: int, k: int, sym: bool, group_size: int) -> tuple:
    return (_device_name(x.device), str(x.dtype), n, k, sym, group_size, m_bucket(x.shape[0]))


def tune_file() -> Path | None:
    """Where the chooser's measurements persist: ``$IRODORI_INT4_TUNE_CACHE`` if set ("" or "off":
    nowhere), else ``kernels/int4-tune.json`` under the cache root (`dirs.cache_root`). Without it
    every process start re-times every (layer shape, M bucket) in prewarm."""
    env = os.environ.get(_TUNE_FILE_ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "0", "off", "none") else Path(env)
    return cache_root() / "kernels" / "int4-tune.json"


def _tune_stamp() -> str:
    """What a saved choice was measured with: another torch or triton re-measures."""
    return f"torch {torch.__version__}, triton {getattr(triton, '__version__', '?') if HAS_TRITON else '-'}"


def _read_tune_rows(path: Path) -> list[dict]:
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError):
        return []  # a stale or broken file only costs a re-measurement
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def _load_tune_file() -> None:
    path = tune_file()
    if path is None or not path.is_file():
        return
    stamp = _tune_stamp()
    for row in _read_tune_rows(path):
        try:
            if row.get("stamp") != stamp:
                continue
            cfg = KernelConfig(**row["config"]) if row.get("config") else None
            timings = tuple((str(a), float(b)) for a, b in row.get("timings", []))
            _CHOICES.setdefault(tuple(row["key"]), Choice(row["impl"], cfg, row.get("time_ms"), timings))
        except (KeyError, TypeError, ValueError):
            continue


def _save_tune_file() -> None:
    """Merge this process's measured choices into the file (atomically: another process may read)."""
    path = tune_file()
    if path is None:
        return
    stamp = _tune_stamp()
    ours = {
        json.dumps(list(key)): {
            "key": list(key),
            "impl": c.impl,
            "config": asdict(c.config) if c.config else None,
            "time_ms": c.time_ms,
            "stamp": stamp,
        }
        for key, c in _CHOICES.items()
        if c.time_ms is not None
    }
    rows = {json.dumps(r.get("key")): r for r in _read_tune_rows(path)}
    rows.update(ours)
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(list(rows.values()), indent=1))
        os.replace(tmp, path)


_TUNE_MODE_ENV = "IRODORI_INT4_TUNE_MODE"


def _bench_ms(fn: Callable[[], object]) -> float:
    """GPU time of `fn` (ms, median). Default: replayed from a CUDA graph, as the sampler runs it, so
    Python launch overhead does not favour single-launch tiles; IRODORI_INT4_TUNE_MODE=eager measures
    eager launches instead (for models run without graphs)."""
    fn()  # compile / allocate outside any capture
    torch.cuda.synchronize()
    if os.environ.get(_TUNE_MODE_ENV, "graph") != "eager":
        try:
            return float(triton.testing.do_bench_cudagraph(fn, rep=20, return_mode="median"))
        except Exception:  # capture not possible here (e.g. another capture in progress): measure eagerly
            pass
    return float(triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median"))


def choose_impl(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zero_bias: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    *,
    group_size: int = 32,
    measure: bool = True,
) -> Choice:
    """Pick kernel (with its tile config) or scratch+cuBLAS for this shape's M bucket, measuring on first use.

    The choice is cached per (GPU, dtype, N, K, zero kind, group size, M bucket) and persisted to
    `tune_file()` (the cache folder, or ``IRODORI_INT4_TUNE_CACHE``; per torch and triton version).
    A new bucket is measured inside `kernels.tuning.tuning_allowed()` (warm-up) or when the layer
    shape was never measured at all; otherwise it takes a measured bucket's choice one octave away
    at most (`nearest_choice`), else scratch above M = 64 and the fused kernel below (neither
    cached: a later warm-up still measures the bucket). Nothing is measured while a CUDA graph is
    being captured.
    """
    m, n, k = x.shape[0], qweight.shape[1], qweight.shape[0] * 8
    key = _choice_key(x, n, k, zero_bias is None, group_size)
    with _CHOICES_LOCK:
        if not _CHOICES:
            _load_tune_file()
        hit = _CHOICES.get(key)
    if hit is not None:
        return hit
    capturing = x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    can_measure = x.device.type == "cuda" and measure and not capturing
    if not (can_measure and is_tuning_allowed()):
        near = nearest_choice(key, max_octaves=1)
        if near is not None:  # mid-stream: no stall, a measured neighbour's pick
            return near
        if can_measure and nearest_choice(key) is not None:
            # the layer was measured, but far from this M: no stall to measure here either. Above
            # M = 64 dequantise + cuBLAS was 1.1-1.8x cuBLAS bf16 at every DiT shape (M >= 150) on
            # the H200, the fused kernel up to 10x slower (benchmarks/int4_gpu.py, RESULTS.md)
            return Choice("scratch") if m > 64 else Choice("kernel", default_config(m, n, k))
    if not can_measure:
        return Choice("kernel", default_config(m, n, k))
    timings: list[tuple[str, float]] = []
    t = _bench_ms(lambda: w4a16_scratch(x, qweight, scales, zero_bias, bias, group_size=group_size))
    timings.append(("scratch", t))
    best_impl, best_cfg, best_t = "scratch", None, t
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    for cfg in candidate_configs(m, n, k, _num_sms(x.device)):

        def run(cfg: KernelConfig = cfg) -> torch.Tensor:
            return w4a16_kernel(
                x, qweight, scales, zero_bias, bias, group_size=group_size, config=cfg, out=out
            )

        try:
            t = _bench_ms(run)
        except Exception:  # a tile that does not compile or fit (shared memory) on this GPU is skipped
            continue
        timings.append((cfg.name(), t))
        if t < best_t:
            best_impl, best_cfg, best_t = "kernel", cfg, t
    best = Choice(best_impl, best_cfg, best_t, tuple(timings))
    with _CHOICES_LOCK:
        _CHOICES[key] = best
        _save_tune_file()
    return best


def nearest_choice(key: tuple, max_octaves: float = math.inf) -> Choice | None:
    """The measured choice of the same layer shape at the M bucket nearest `key`'s (ties: the larger
    bucket) within `max_octaves` of it, or None. Used outside `tuning_allowed()` so a line that
    reaches a new bucket mid-stream (a batch of lines, a long line) does not stop to measure."""
    bucket = key[-1]
    with _CHOICES_LOCK:
        same = [
            (abs(math.log2(kk[-1] / bucket)), -kk[-1], c) for kk, c in _CHOICES.items() if kk[:-1] == key[:-1]
        ]
    if not same:
        return None
    octaves, _, choice = min(same, key=lambda t: t[:2])
    return choice if octaves <= max_octaves else None


def clear_choices() -> None:
    """Forget every cached choice (the next call measures again)."""
    with _CHOICES_LOCK:
        _CHOICES.clear()


def w4a16_linear(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zero_bias: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    *,
    group_size: int = 32,
    impl: str = "auto",
) -> torch.Tensor:
    """``x (..., K) @ W^T + bias`` on packed weights; output (..., N) in x.dtype.

    impl: "auto" (CUDA fp16/bf16: measured choice of kernel vs scratch; otherwise the reference),
    "kernel", "scratch" or "reference".
    """
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    n = qweight.shape[1]
    if impl == "auto":
        if HAS_TRITON and x2.is_cuda and x2.dtype in (torch.float16, torch.bfloat16):
            choice = choose_impl(x2, qweight, scales, zero_bias, bias, group_size=group_size)
            impl = choice.impl
            cfg = choice.config
        elif x2.is_cuda and HAS_TRITON:
            impl, cfg = "scratch", None  # fp32 activations on the GPU: dequantise, fp32 cuBLAS
        else:
            impl, cfg = "reference", None
    else:
        cfg = None
    if impl == "kernel":
        y = w4a16_kernel(x2, qweight, scales, zero_bias, bias, group_size=group_size, config=cfg)
    elif impl == "scratch":
        y = w4a16_scratch(x2, qweight, scales, zero_bias, bias, group_size=group_size)
    elif impl == "reference":
        y = reference_w4a16(x2, qweight, scales, zero_bias, bias, group_size=group_size)
    else:
        raise QuantError(f"unknown w4a16 impl {impl!r} (auto, kernel, scratch, reference)")
    return y.reshape(*lead, n)
