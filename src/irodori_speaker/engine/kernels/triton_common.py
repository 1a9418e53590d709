"""What every Triton kernel of the project shares: is triton there, is its CPU interpreter on, and the
one rounding helper kernels store through.

Kernels are checked on the CPU with ``TRITON_INTERPRET=1``. The interpreter truncates fp32 -> bf16
casts (the GPU rounds to nearest even), so a kernel writing bf16 under the interpreter rounds on the
bits instead (`round_to` with ``INTERP_BF16``); the flag is `interp_bf16(out)`, false on the GPU.
"""

from __future__ import annotations

import os

import torch

try:  # triton is optional (the "cuda" extra): without it every caller takes its torch path
    import triton
    import triton.language as tl

    HAS_TRITON = True
except Exception:  # pragma: no cover - depends on the install
    HAS_TRITON = False

__all__ = ["HAS_TRITON", "interp_bf16", "interpreter_active", "round_to"]


def interpreter_active() -> bool:
    """True when Triton runs kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def interp_bf16(t: torch.Tensor) -> bool:
    """The INTERP_BF16 flag of a kernel writing `t`: bf16 under the interpreter."""
    return interpreter_active() and t.dtype == torch.bfloat16


if HAS_TRITON:
    # A single return at the end: an early `return` under a constexpr `if` that is taken does not
    # compile (it did in the interpreter).

    @triton.jit
    def round_to(x, DTYPE: tl.constexpr, INTERP_BF16: tl.constexpr):
        """fp32 -> DTYPE, round to nearest even; under the interpreter (INTERP_BF16) on the bits."""
        if INTERP_BF16 and tl.bfloat16 == DTYPE:
            bits = x.to(tl.uint32, bitcast=True)
            bits = bits + 0x7FFF + ((bits >> 16) & 1)
            y = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        else:
            y = x.to(DTYPE)
        return y
