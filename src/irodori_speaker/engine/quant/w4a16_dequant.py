"""W4A16 by dequantising first: the torch reference, and the scratch path (the Triton dequant kernel
writes W^T into a buffer shared by every layer, then one cuBLAS GEMM).

The operands are the fused kernel's (`w4a16_kernel`); which path a layer runs is `w4a16_chooser`'s.
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F

from ...errors import QuantError
from ..kernels.triton_common import HAS_TRITON, interp_bf16, interpreter_active
from .w4a16_kernel import check_operands

if HAS_TRITON:  # optional (the "cuda" extra): without it `dequantize_into` runs in torch
    import triton
    import triton.language as tl

    from .w4a16_kernel import dequant_tile

__all__ = ["dequantize_into", "reference_w4a16", "release_scratch", "w4a16_scratch"]

if HAS_TRITON:

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
        w = dequant_tile(
            qw_ptr, s_ptr, zb_ptr, k0, offs_n, n_mask, N, K, SYM, GS, GPT, BK, BN, False, False, False,
            out_ptr.dtype.element_ty, INTERP_BF16,
        )  # fmt: skip
        mask = (offs_k[:, None] < K) & n_mask[None, :]
        tl.store(out_ptr + offs_k[:, None] * N + offs_n[None, :], w, mask=mask)


# ------------------------------------------------------------------------------------------ reference


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
    check_operands(x, qweight, scales, zero_bias, group_size)
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
    _m, n, k = check_operands(x, qweight, scales, zero_bias, group_size)
    w = _scratch(k * n, x.dtype, x.device).view(k, n)
    dequantize_into(qweight, scales, zero_bias, w, group_size=group_size)
    if bias is not None:
        return torch.addmm(bias.to(x.dtype), x, w)
    return torch.mm(x, w)
