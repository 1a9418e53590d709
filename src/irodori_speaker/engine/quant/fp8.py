"""FP8 linears (`Preset.fp8`): W8A8 float8 e4m3 for GPUs with FP8 tensor cores (Ada, Hopper).

`Fp8Linear` holds the weight as e4m3 with one fp32 scale per output channel (amax / 448, the
largest finite e4m3). Each call quantises its input per token (per row, dynamic: the default) or
per tensor the same way, then multiplies e4m3 x e4m3 with fp32 accumulation and rescales:
y[m, n] = sa[m] * sb[n] * sum_k qa[m, k] qb[n, k].

On CUDA with compute capability 8.9 or more the product is `torch._scaled_mm` with row-wise
scales (scale_a (M, 1), scale_b (1, N), fp32) and a bf16 output; its second operand must be
column-major, which is the stored (N, K) row-major weight seen transposed (no copy per call).
Elsewhere (CPU, older GPUs, a `_scaled_mm` that refused) the same products are summed in fp32
from the e4m3 values (`impl="emulate"`): every e4m3 x e4m3 product is exact in fp32, so this is
the GPU's arithmetic up to the order of the fp32 sums and the bf16 rounding of the output.

`quantize_linears_fp8(model)` swaps the float `nn.Linear`s the int4 path quantises (the release's
selection, `quantize.RELEASE_SELECTION` through `plan_layers`) after loading; the model files know
nothing of it. Layers whose in / out features are not multiples of 16 (`_scaled_mm`'s rule) stay
float. The fast path fuses `Fp8Linear`s through `concat` (`engine.fusing.FusableLinear`): per-channel
weight scales and per-row activation scales make the fused GEMM equal the separate ones.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ...errors import QuantError
from .buffers import KeepsCodeDtype
from .quantize import RELEASE_SELECTION, LayerSelection, plan_layers

__all__ = [
    "ACT_SCALINGS",
    "FP8_DTYPE",
    "FP8_MAX",
    "FP8_MIN_CAPABILITY",
    "Fp8Linear",
    "Fp8Swap",
    "dequantize_fp8",
    "fp8_gemm_device",
    "quantize_act_fp8",
    "quantize_linears_fp8",
    "quantize_weight_fp8",
]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)  # 448
#: FP8 tensor cores: Ada (sm_89) and Hopper (sm_90) onwards.
FP8_MIN_CAPABILITY = (8, 9)
#: How activations are scaled: one scale per token (row), or one for the whole input.
ACT_SCALINGS = ("token", "tensor")
_ALIGN = 16  # _scaled_mm: both GEMM dimensions of the weight a multiple of 16
_TINY = 1e-12  # an all-zero row gets this scale: its codes are zeros, its output exactly 0


def fp8_gemm_device(device: torch.device | str) -> bool:
    """True where `torch._scaled_mm` runs on FP8 tensor cores: CUDA, compute capability >= 8.9."""
    dev = torch.device(device)
    return dev.type == "cuda" and _cuda_fp8(dev.index)


@functools.cache
def _cuda_fp8(index: int | None) -> bool:  # asked on every call of every layer: answered once
    if not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(index) >= FP8_MIN_CAPABILITY


def _to_fp8(x: Tensor, scale: Tensor) -> Tensor:
    # the clamp only catches rounding at the edge (x / (amax / 448) may land a hair past 448)
    return torch.div(x, scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def quantize_weight_fp8(weight: Tensor) -> tuple[Tensor, Tensor]:
    """(N, K) float -> (e4m3 (N, K), fp32 scale (N,)): per output channel, amax / 448, in fp32."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp_min(_TINY) / FP8_MAX
    return _to_fp8(w, scale[:, None]).contiguous(), scale


def quantize_act_fp8(x: Tensor, scaling: str = "token") -> tuple[Tensor, Tensor]:
    """(M, K) float -> (e4m3 (M, K), fp32 scale (M, 1)): amax / 448 per row ("token") or over the
    whole input ("tensor", the one scale repeated per row so one GEMM serves both).

    Run on every call, so in few passes over x: one reduction (max |x|, exact in x's dtype), one
    division into fp32, one cast. No clamp: |x| / (amax / 448) exceeds 448 by an ulp at most, and
    the cast rounds that to 448 (it saturates, in torch's CPU and CUDA kernels alike)."""
    if scaling == "token":
        amax = torch.linalg.vector_norm(x, ord=float("inf"), dim=1, keepdim=True)
    elif scaling == "tensor":
        amax = torch.linalg.vector_norm(x, ord=float("inf")).expand(x.shape[0], 1)
    else:
        raise QuantError(f"unknown FP8 activation scaling {scaling!r}; use one of {', '.join(ACT_SCALINGS)}")
    scale = amax.float().clamp_min(_TINY).div_(FP8_MAX).contiguous()  # (M, 1): _scaled_mm's scale_a
    return torch.div(x, scale).to(FP8_DTYPE), scale


def dequantize_fp8(q: Tensor, scale: Tensor) -> Tensor:
    """e4m3 codes times their scales (broadcast: (N,) per row of a weight, (M, 1) of an input), fp32."""
    s = scale.float()
    return q.float() * (s[:, None] if s.dim() == 1 else s)


class Fp8Linear(KeepsCodeDtype):
    """`nn.Linear` on an e4m3 weight (per-channel fp32 scale), its input quantised to e4m3 per call.

    Buffers: ``qweight`` e4m3 (out, in), row-major (its transpose is `_scaled_mm`'s column-major
    operand), ``scale_b`` fp32 (1, out), optional ``bias``. `act_scaling`: "token" or "tensor".
    `impl`: "auto" (`_scaled_mm` where `fp8_gemm_device`, else the emulation), "scaled_mm" or
    "emulate". Output: bf16 from `_scaled_mm`, fp32 from the emulation, then the input's dtype.
    """

    code_buffers = ("qweight", "scale_b")

    qweight: Tensor
    scale_b: Tensor
    bias: Tensor | None

    def __init__(
        self, qweight: Tensor, scale: Tensor, bias: Tensor | None = None, *, act_scaling: str = "token"
    ) -> None:
        super().__init__()
        if qweight.dtype != FP8_DTYPE or qweight.dim() != 2:
            raise QuantError(
                f"Fp8Linear: qweight must be 2-d {FP8_DTYPE}, got {qweight.dtype} {tuple(qweight.shape)}"
            )
        if act_scaling not in ACT_SCALINGS:
            raise QuantError(
                f"unknown FP8 activation scaling {act_scaling!r}; use one of {', '.join(ACT_SCALINGS)}"
            )
        self.out_features, self.in_features = qweight.shape
        if scale.numel() != self.out_features:
            raise QuantError(f"Fp8Linear: {scale.numel()} scales for {self.out_features} output channels")
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scale_b", scale.detach().float().reshape(1, -1).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.act_scaling = act_scaling
        self.impl = "auto"
        self._scaled_mm_ok = self.in_features % _ALIGN == 0 and self.out_features % _ALIGN == 0

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, act_scaling: str = "token") -> Fp8Linear:
        q, scale = quantize_weight_fp8(linear.weight)
        return cls(q, scale, linear.bias, act_scaling=act_scaling)

    @classmethod
    def concat(cls, layers: Sequence[Fp8Linear]) -> Fp8Linear:
        """One layer computing `layers` side by side (outputs along N): the fusion interface of
        `engine.fusing` (`FusableLinear`). Exact: every output channel keeps its own scale."""
        if not layers:
            raise QuantError("Fp8Linear.concat: no layers")
        first = layers[0]
        if any(m.in_features != first.in_features or m.act_scaling != first.act_scaling for m in layers):
            raise QuantError("Fp8Linear.concat: layers differ in in_features or activation scaling")
        has_bias = [m.bias is not None for m in layers]
        if any(has_bias) and not all(has_bias):
            raise QuantError("Fp8Linear.concat: either all layers have a bias or none")
        bias = torch.cat([m.bias for m in layers if m.bias is not None]) if all(has_bias) else None
        out = cls(
            torch.cat([m.qweight for m in layers], dim=0),
            torch.cat([m.scale_b.reshape(-1) for m in layers]),
            bias,
            act_scaling=first.act_scaling,
        )
        out.impl = first.impl
        return out

    def dequantize_weight(self) -> Tensor:
        """The weight the layer multiplies by, (out, in) fp32."""
        return dequantize_fp8(self.qweight, self.scale_b.reshape(-1))

    def uses_scaled_mm(self, device: torch.device) -> bool:
        if self.impl == "emulate" or not self._scaled_mm_ok:
            return False
        return self.impl == "scaled_mm" or fp8_gemm_device(device)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[-1] != self.in_features:
            raise QuantError(f"Fp8Linear: input has {x.shape[-1]} features, expected {self.in_features}")
        lead = x.shape[:-1]
        q, scale_a = quantize_act_fp8(x.reshape(-1, self.in_features), self.act_scaling)
        y = None
        if self.uses_scaled_mm(x.device):
            y = self._scaled_mm(q, scale_a)
        if y is None:  # e4m3 products summed in fp32, then scaled: the GEMM's arithmetic
            y = torch.matmul(q.float(), self.qweight.float().t()).mul_(scale_a).mul_(self.scale_b)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.to(x.dtype).view(*lead, self.out_features)

    def _scaled_mm(self, q: Tensor, scale_a: Tensor) -> Tensor | None:
        try:
            return torch._scaled_mm(
                q, self.qweight.t(), scale_a=scale_a, scale_b=self.scale_b, out_dtype=torch.bfloat16
            )
        except RuntimeError as e:  # an unsupported build / shape: the emulation, said once
            self._scaled_mm_ok = False
            warnings.warn(f"Fp8Linear: torch._scaled_mm failed ({e}); emulating FP8 instead", stacklevel=3)
            return None

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, e4m3 per-channel, "
            f"activations per {self.act_scaling}, bias={self.bias is not None}"
        )


@dataclass
class Fp8Swap:
    """What `quantize_linears_fp8` did: the swapped layers and those kept float (name -> why)."""

    swapped: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)


def quantize_linears_fp8(
    model: nn.Module,
    selection: LayerSelection = RELEASE_SELECTION,
    *,
    act_scaling: str = "token",
    align: int = _ALIGN,
) -> Fp8Swap:
    """Swap the plain `nn.Linear`s of `model` that the int4 path quantises (`selection`'s Linear
    patterns, through `plan_layers`) for `Fp8Linear`, in place; other kinds of layer are left alone.

    Shapes `_scaled_mm` cannot take (in or out features not a multiple of `align`, 16) stay float:
    an emulated layer on a GPU would be slower than the float one. Every full-size release's shapes
    fit; the CPU tests and the accuracy benchmark pass ``align=8`` so the tiny models' 184-wide MLPs
    (emulated there anyway) are FP8 too."""
    if act_scaling not in ACT_SCALINGS:
        raise QuantError(
            f"unknown FP8 activation scaling {act_scaling!r}; use one of {', '.join(ACT_SCALINGS)}"
        )
    shapes = {n: tuple(m.weight.shape) for n, m in model.named_modules() if type(m) is nn.Linear}
    plan = plan_layers(shapes, selection, group_size=align)
    done = Fp8Swap()
    for name in sorted([*plan.gptq, *plan.extra, *plan.kept]):
        out_features, in_features = shapes[name]
        if name in plan.kept or out_features % align:
            done.kept[name] = (
                f"{in_features}->{out_features}: in and out features must be multiples of {align}"
            )
            continue
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer = getattr(parent, attr)
        setattr(parent, attr, Fp8Linear.from_linear(layer, act_scaling=act_scaling))
        done.swapped.append(name)
    return done
