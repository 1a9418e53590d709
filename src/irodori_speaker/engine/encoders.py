"""The scratch condition encoders of v2 / v3 files (text, caption) and the reference speaker
encoder of every release, with the attention helpers they share with the DiT.

Module names equal the released tensor names (`text_encoder.blocks.0.attention.wq.weight`,
`speaker_encoder.in_proj.weight`, ...).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .layers import Embedding, RMSNorm, SwiGLU, apply_rope, rope_tables

# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------


def capturing() -> bool:
    """True while a CUDA graph is being captured: code must not sync the host then."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


_reads = threading.local()


@contextmanager
def no_device_reads() -> Iterator[None]:
    """On this thread, within the block, no code decides from a device tensor's values: where a
    shortcut would read one (a mask that may be all valid), the general form runs instead (same
    result). The device owner runs its jobs in it (engine/hardware/owner.py): a read there waits
    for every launch queued before it, so the GPU drains while the host waits."""
    before = getattr(_reads, "off", False)
    _reads.off = True
    try:
        yield
    finally:
        _reads.off = before


def may_read(t: Tensor) -> bool:
    """Whether host code may branch on `t`'s values here: not under CUDA-graph capture, and for a
    device tensor not inside `no_device_reads` (a host tensor costs nothing to read)."""
    if capturing():
        return False
    return _on_host(t) or not getattr(_reads, "off", False)


def _on_host(t: Tensor) -> bool:
    return t.device.type == "cpu"


def key_mask(mask: Tensor | None) -> Tensor | None:
    """(B, S) bool key mask -> (B, 1, 1, S) for SDPA; None when every key is valid.

    Deciding None reads the mask (a host sync); where that may not happen (`may_read`) the mask is
    kept (same result).
    """
    if mask is None or (may_read(mask) and bool(mask.all())):
        return None
    return mask[:, None, None, :]


def additive_mask(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """A boolean attention mask as an additive 0 / -inf one in `dtype` (others as they are): made
    once where it serves many attention calls, each of which would convert a boolean one (two
    more kernels a call)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def attend_safe(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """SDPA over (B, H, S, D); rows whose keys are all masked give zeros, not NaN.

    Used by the encoders (once per line), where a row may have no valid key (no reference).
    """
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v)
    empty = ~mask.any(dim=-1, keepdim=True)  # (B, 1, 1, 1)
    if not may_read(empty) or bool(empty.any()):  # no read allowed: always the safe form
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | empty)
        return out.masked_fill(empty, 0.0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


# ---------------------------------------------------------------------------------------------
# Condition encoders (text, caption, reference speaker)
# ---------------------------------------------------------------------------------------------


class SelfAttention(nn.Module):
    """Encoder self-attention: q/k RMS-normed per head, RoPE over the whole head, sigmoid gate."""

    def __init__(self, dim: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, dim, bias=False)
        self.q_norm = RMSNorm((heads, self.head_dim), eps)
        self.k_norm = RMSNorm((heads, self.head_dim), eps)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        B, S, D = x.shape
        q = self.q_norm(self.wq(x).view(B, S, self.heads, self.head_dim))
        k = self.k_norm(self.wk(x).view(B, S, self.heads, self.head_dim))
        v = self.wv(x).view(B, S, self.heads, self.head_dim)
        cos, sin = rope_tables(S, self.head_dim, x.device)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = attend_safe(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), key_mask(mask))
        out = out.transpose(1, 2).reshape(B, S, D)
        return self.wo(out * torch.sigmoid(self.gate(x)))


class TextBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_hidden: int, eps: float) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(dim, eps)
        self.attention = SelfAttention(dim, heads, eps)
        self.mlp_norm = RMSNorm(dim, eps)
        self.mlp = SwiGLU(dim, mlp_hidden)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        x = x + self.attention(self.attention_norm(x), mask)
        return x + self.mlp(self.mlp_norm(x))


class TextEncoder(nn.Module):
    """Token embedding + TextBlocks; padded positions are zeroed after every block."""

    def __init__(self, vocab: int, dim: int, layers: int, heads: int, mlp_hidden: int, eps: float) -> None:
        super().__init__()
        self.text_embedding = Embedding(vocab, dim)
        self.blocks = nn.ModuleList(TextBlock(dim, heads, mlp_hidden, eps) for _ in range(layers))

    def run_blocks(self, x: Tensor, mask: Tensor) -> Tensor:
        m = mask[..., None].to(x.dtype)
        x = x * m
        for block in self.blocks:
            x = block(x, mask) * m
        return x * m

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        return self.run_blocks(self.text_embedding(ids), mask)


class ReferenceLatentEncoder(TextEncoder):
    """Speaker encoder over reference latents: in_proj, /6, then the TextEncoder pattern."""

    def __init__(self, in_dim: int, dim: int, layers: int, heads: int, mlp_hidden: int, eps: float) -> None:
        nn.Module.__init__(self)
        self.in_proj = nn.Linear(in_dim, dim, bias=True)
        self.blocks = nn.ModuleList(TextBlock(dim, heads, mlp_hidden, eps) for _ in range(layers))

    def forward(self, latent: Tensor, mask: Tensor) -> Tensor:
        return self.run_blocks(self.in_proj(latent) / 6.0, mask)
