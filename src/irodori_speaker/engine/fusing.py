"""Linear layers fused side by side, and a block's fused projections (the fast path's).

The fast path computes Q/K/V/gate as one GEMM (N = 4D) and w1/w3 as one (N = 2 x hidden), for the
DiT's blocks (`engine/fast.py`) and a scratch text encoder's (`engine/fast_text.py`). It works on
whatever linear layers the model holds: plain `nn.Linear`, or any layer class offering `concat`
(`FusableLinear`), as the int4 layers do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from torch import Tensor, nn


class FusableLinear(Protocol):
    """A linear layer whose class can fuse several of its kind into one (outputs side by side)."""

    in_features: int
    out_features: int

    @classmethod
    def concat(cls, layers: Sequence[Any]) -> nn.Module: ...


def fuse_linears(layers: Sequence[nn.Module]) -> nn.Module:
    """One module computing `layers` side by side (outputs concatenated along the last dim).

    `nn.Linear`s (all with a bias or none): one weight (and bias), and the originals are
    re-pointed at views into it (no copy kept). Any other kind fuses through its class's `concat`
    (`FusableLinear`).
    """
    if _plain_linears(layers):
        linears = [m for m in layers if isinstance(m, nn.Linear)]
        weight = torch.cat([m.weight.detach() for m in linears], dim=0)
        biased = linears[0].bias is not None
        bias = torch.cat([cast(Tensor, m.bias).detach() for m in linears]) if biased else None
        fused = nn.Linear(weight.shape[1], weight.shape[0], bias=biased, device="meta")
        fused.weight = nn.Parameter(weight, requires_grad=False)
        if bias is not None:
            fused.bias = nn.Parameter(bias, requires_grad=False)
        start = 0
        for m in linears:  # re-point the originals so the memory is held once
            n = m.weight.shape[0]
            m.weight = nn.Parameter(weight[start : start + n], requires_grad=False)
            if bias is not None:
                m.bias = nn.Parameter(bias[start : start + n], requires_grad=False)
            start += n
        return fused
    if not fusable(layers):
        names = sorted({type(m).__name__ for m in layers})
        raise TypeError(
            f"fuse_linears: layers must all be nn.Linear (all with a bias or none) or all of one "
            f"class with a `concat` classmethod, got {names}"
        )
    concat: Callable[[Sequence[nn.Module]], nn.Module] = getattr(type(layers[0]), "concat")  # noqa: B009
    return concat(layers)


def fusable(layers: Sequence[nn.Module]) -> bool:
    """Whether `fuse_linears` can fuse `layers` (an int4 file's RTN-packed encoder layers cannot)."""
    if _plain_linears(layers):
        return True
    kind = type(layers[0])
    return callable(getattr(kind, "concat", None)) and all(type(m) is kind for m in layers)


def _plain_linears(layers: Sequence[nn.Module]) -> bool:
    """`nn.Linear`s (not a subclass), all with a bias or all without."""
    return all(type(m) is nn.Linear for m in layers) and len({m.bias is None for m in layers}) == 1


class SliceOf(nn.Module):
    """Columns [start, end) of a fused projection: what a non-viewable original becomes.

    Packed weights (int4) cannot be viewed per original, so the originals are dropped (no
    duplicate memory) and the model's own path computes the fused projection and slices it.
    """

    def __init__(self, fused: nn.Module, start: int, end: int) -> None:
        super().__init__()
        self.fused = [fused]  # a list: not registered as a submodule (no duplicate in state_dict)
        self.start, self.end = start, end

    def forward(self, x: Tensor) -> Tensor:
        return self.fused[0](x)[..., self.start : self.end]


Named = list[tuple[nn.Module, str]]  # linear layers as (parent, attribute): one fused group


def fusable_into(*groups: Named) -> bool:
    """Whether `fuse_into` can fuse each of `groups`."""
    return all(fusable([getattr(parent, name) for parent, name in g]) for g in groups)


def fuse_into(parent_names: Named) -> nn.Module:
    """Fuse the named linear attributes; originals that are not plain Linears become `SliceOf`."""
    layers: list[nn.Module] = [getattr(parent, name) for parent, name in parent_names]
    fused = fuse_linears(layers)
    if type(layers[0]) is not nn.Linear:
        start = 0
        for (parent, name), layer in zip(parent_names, layers):
            n = int(getattr(layer, "out_features"))  # noqa: B009 - any FusableLinear
            setattr(parent, name, SliceOf(fused, start, start + n))
            start += n
    return fused


@dataclass
class FastBlock:
    """A block of gated attention and SwiGLU (a DiT block, a scratch text encoder's block) as the
    fused kernels use it: fused projections and the head norms."""

    qkvg: nn.Module
    wo: nn.Module
    w13: nn.Module
    w2: nn.Module
    q_norm: Tensor
    k_norm: Tensor
    hidden: int


def block_groups(block: nn.Module) -> tuple[Named, Named]:
    """A block's fused groups: its `attention`'s wq, wk, wv, gate and its SwiGLU `mlp`'s w1, w3."""
    a, mlp = cast(Any, block.attention), cast(Any, block.mlp)
    return [(a, "wq"), (a, "wk"), (a, "wv"), (a, "gate")], [(mlp, "w1"), (mlp, "w3")]


def block_fusable(block: nn.Module) -> bool:
    """Whether `fuse_block` can fuse `block`'s projections."""
    return fusable_into(*block_groups(block))


def fuse_block(block: nn.Module) -> FastBlock:
    """A block's projections fused (modifying its layers, `fuse_into`): its `attention` has wq, wk,
    wv, gate, wo and per-head q_norm / k_norm, its `mlp` is a SwiGLU (w1, w2, w3)."""
    a, mlp = cast(Any, block.attention), cast(Any, block.mlp)
    hidden = int(mlp.w1.out_features)  # before fusing: a fused int4 w1 becomes a slice
    qkvg, w13 = block_groups(block)
    return FastBlock(
        qkvg=fuse_into(qkvg),
        wo=a.wo,
        w13=fuse_into(w13),
        w2=mlp.w2,
        q_norm=a.q_norm.weight,
        k_norm=a.k_norm.weight,
        hidden=hidden,
    )
