"""Int8 linears for the CPU (`Preset.int8_linears`): int8 weights, activations quantised per row.

`Int8Linear` holds the weight as int8 with one fp32 scale per output channel (symmetric, absmax /
127). Each call quantises its input per row (per token) the same way, multiplies int8 x int8 into
int32 with `torch._int_mm` (oneDNN: AMX-INT8 / AVX512-VNNI / AVX-VNNI where the CPU has them) and
rescales to the input's dtype. This is what torch.ao's deprecated `quantize_dynamic` did, with a
per-channel weight and a per-row (not per-tensor, 7-bit) activation scale: on the 500M model's
shapes the GEMM error is about half (benchmarks/cpu_preset.py states the error of each variant).

`quantize_linears_int8(model)` swaps the eight per-step GEMMs of every diffusion block
(attention wq / wk / wv / gate / wo, MLP w1 / w3 / w2); the encoders, the condition keys/values
(once per line) and the low-rank AdaLN (once per schedule) stay float. The engine knows nothing of
this: the modules are swapped after loading (`engine.hardware.cpu_tricks`).

Siblings that read the same activation (wq / wk / wv / gate on the attention's input, w1 / w3 on
the MLP's) share one `SharedRows`: the first of them quantises the input, the others reuse the
(int8, scale) pair, so each activation is quantised once, not four or two times (the same int8
values and scales: the outputs are bit for bit those of unshared layers). The pair is keyed on the
input tensor itself (`is`) and lives for one call of the parent module (hooks on the attention /
the MLP clear it before and after), within which the block's code does not change its input.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import Tensor, nn

from .buffers import KeepsCodeDtype

__all__ = [
    "BLOCK_LINEARS",
    "SHARED_INPUTS",
    "Int8Linear",
    "SharedRows",
    "quantize_linears_int8",
    "quantize_weight_int8",
    "share_rows",
]

#: The linears of a diffusion block run at every sampler step (module path inside the block).
BLOCK_LINEARS = (
    "attention.wq",
    "attention.wk",
    "attention.wv",
    "attention.gate",
    "attention.wo",
    "mlp.w1",
    "mlp.w3",
    "mlp.w2",
)
#: Siblings reading the same input within one call of their parent (parent path, linear names).
SHARED_INPUTS = (
    ("attention", ("wq", "wk", "wv", "gate")),
    ("mlp", ("w1", "w3")),
)
_QMAX = 127.0


def quantize_weight_int8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(N, K) float -> (int8 (N, K), fp32 scale (N,)): symmetric per output channel, absmax / 127."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / _QMAX
    q = torch.round(w / scale[:, None]).clamp_(-_QMAX, _QMAX).to(torch.int8)
    return q, scale


def _quantize_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """(M, K) float -> (int8 (M, K), fp32 scale (M, 1)): per row, absmax / 127, computed in fp32."""
    xf = x.float()
    scale = xf.abs().amax(dim=1, keepdim=True).clamp_min_(1e-12).div_(_QMAX)
    return xf.div(scale).round_().clamp_(-_QMAX, _QMAX).to(torch.int8), scale


class SharedRows:
    """One quantised input shared by sibling `Int8Linear`s within one call of their parent module.

    `rows(x, k)` quantises x (viewed as (M, k)) unless the held pair is x's; `clear` drops it (the
    parent's forward pre-hook and hook). One attribute holds (x, int8, scale) and is read once per
    call, so a model run from several threads at once stays right (it only shares less).
    """

    def __init__(self) -> None:
        self._held: tuple[Tensor, Tensor, Tensor] | None = None

    def rows(self, x: Tensor, in_features: int) -> tuple[Tensor, Tensor]:
        held = self._held
        if held is not None and held[0] is x:
            return held[1], held[2]
        q, scale = _quantize_rows(x.reshape(-1, in_features))
        self._held = (x, q, scale)
        return q, scale

    def clear(self, *_: Any) -> None:
        """Drop the held pair (signature of a forward pre-hook and of a forward hook)."""
        self._held = None


class Int8Linear(KeepsCodeDtype):
    """`nn.Linear` on an int8 weight (per-channel scale) with its input quantised per row at run time.

    Buffers: ``qweight`` int8 (out, in), ``scale`` fp32 (out,), optional ``bias`` (follows the module
    dtype). The output has the input's dtype. Where `torch._int_mm` cannot run (an old or unusual
    build) the same integer products are summed in fp32 instead (slower, the same result up to the
    fp32 rounding of sums past 2^24). ``shared``: the `SharedRows` of its siblings, if any.
    """

    code_buffers = ("qweight", "scale")

    qweight: Tensor
    scale: Tensor
    bias: Tensor | None
    shared: SharedRows | None

    def __init__(self, qweight: Tensor, scale: Tensor, bias: Tensor | None = None) -> None:
        super().__init__()
        if qweight.dtype != torch.int8 or qweight.dim() != 2:
            raise ValueError(f"qweight must be a 2-d int8 tensor, got {qweight.dtype} {tuple(qweight.shape)}")
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scale", scale.detach().float().reshape(-1).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self._int_mm_ok = True
        self.shared = None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        q, scale = quantize_weight_int8(linear.weight)
        return cls(q, scale, linear.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"

    def _int_products(self, q: Tensor) -> Tensor:
        if self._int_mm_ok:
            try:
                return torch._int_mm(q, self.qweight.t())
            except RuntimeError:
                self._int_mm_ok = False
        return torch.matmul(q.float(), self.qweight.t().float())

    def forward(self, x: Tensor) -> Tensor:
        lead = x.shape[:-1]
        if self.shared is None:
            q, row_scale = _quantize_rows(x.reshape(-1, self.in_features))
        else:
            q, row_scale = self.shared.rows(x, self.in_features)
        y = torch.mul(self._int_products(q), row_scale).mul_(self.scale)  # int32 x fp32: fp32
        if self.bias is not None:
            y += self.bias.float()
        return y.to(x.dtype).view(*lead, self.out_features)


def quantize_linears_int8(
    model: nn.Module, names: tuple[str, ...] = BLOCK_LINEARS, *, share_inputs: bool = True
) -> int:
    """Swap `names` in every `model.blocks[i]` for `Int8Linear` in place; returns how many.

    Works on the engine's DiT (v2 / v3 / v4 families); layers that are not plain `nn.Linear`
    (int4 layers, already swapped ones) are left as they are. `share_inputs`: siblings reading
    one input quantise it once (`SHARED_INPUTS`, `share_rows`); off, each quantises its own.
    """
    count = 0
    for block in getattr(model, "blocks", ()):
        for path in names:
            parent_path, _, attr = path.rpartition(".")
            parent = block.get_submodule(parent_path) if parent_path else block
            layer = getattr(parent, attr, None)
            if type(layer) is nn.Linear:
                setattr(parent, attr, Int8Linear.from_linear(layer))
                count += 1
        if share_inputs:
            for parent_path, siblings in SHARED_INPUTS:
                share_rows(block.get_submodule(parent_path), siblings)
    return count


def share_rows(parent: nn.Module, siblings: tuple[str, ...]) -> bool:
    """Let the `Int8Linear`s `siblings` of `parent` quantise their common input once per call of
    `parent` (one `SharedRows`, cleared by hooks on `parent`); True if linked now.

    Nothing is done unless they are all unlinked `Int8Linear`s of one input width: a second call
    is harmless. The parent must not change the input in place between the siblings' calls.
    """
    layers = [getattr(parent, name, None) for name in siblings]
    ok = all(isinstance(m, Int8Linear) and m.shared is None for m in layers)
    if not ok or len({cast(Int8Linear, m).in_features for m in layers}) != 1:
        return False
    shared = SharedRows()
    for m in layers:
        cast(Int8Linear, m).shared = shared
    # bound methods: a deep copy of the model re-binds them to its own copy of `shared`
    parent.register_forward_pre_hook(shared.clear)
    parent.register_forward_hook(shared.clear)
    return True
