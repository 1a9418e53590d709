"""Int4 modules: `Int4Linear` (GPTQ), `RTNLinear`, `PackedEmbedding`, `Int4Conv1d`, `Int4ConvTranspose1d`.

Quantised tensors are buffers that keep their stored dtypes: ``module.to(torch.bfloat16)`` moves them
between devices but never re-casts the fp16 scales (a bf16 round trip would lose their low bits); only
the bias follows the module dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import QuantError
from .formats import GPTQPacked, RTNPacked, dequantize_rtn, pack_gptq_qzeros, unpack_gptq_qzeros
from .w4a16_chooser import w4a16_linear
from .w4a16_kernel import zero_bias_from_zeros

__all__ = [
    "Int4Conv1d",
    "Int4ConvTranspose1d",
    "Int4Linear",
    "PackedEmbedding",
    "PackedScaledEmbedding",
    "RTNLinear",
]


class _PackedModule(nn.Module):
    """Keeps the packed buffers' dtypes fixed under `.to()` / `.half()`; moves them with the module."""

    _packed_buffers: tuple[str, ...] = ()

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> nn.Module:
        held: dict[str, torch.Tensor] = {}
        for k in self._packed_buffers:  # a None buffer (no zero tensor) stays registered as None
            t = self._buffers.get(k)
            if t is not None:
                held[k] = t
                del self._buffers[k]
        try:
            super()._apply(fn, recurse)
        finally:
            if held:
                ref = next(iter(held.values()))
                # probe where fn sends a tensor; apply the device only
                target = fn(torch.empty(0, dtype=torch.float16, device=ref.device)).device
                for k, t in held.items():
                    self._buffers[k] = t.to(device=target)
        return self


class Int4Linear(_PackedModule):
    """Linear on GPTQ-packed int4 weights (group size `group_size`, no act-order).

    Buffers as in the checkpoint: ``qweight`` int32 (K/8, N), ``qzeros`` int32 (K/gs, N/8, v1 zeros),
    ``scales`` fp16 (K/gs, N), ``g_idx`` int32 (K,), optional ``bias``. Symmetric layers (every zero 8)
    need no zero tensor in the kernel; others keep a derived fp16 ``1024 + z`` tensor (not saved).

    Forward: on CUDA with fp16/bf16 activations the fused Triton kernel or dequant-into-scratch + cuBLAS,
    whichever measured faster for this shape and M bucket; elsewhere the reference path (dequantise in
    fp32, cast to the activation dtype, F.linear; nothing is cached). Set `impl` to force one.
    """

    _packed_buffers = ("qweight", "qzeros", "scales", "g_idx", "zero_bias")
    qweight: torch.Tensor
    qzeros: torch.Tensor
    scales: torch.Tensor
    g_idx: torch.Tensor
    zero_bias: torch.Tensor | None
    bias: torch.Tensor | None

    def __init__(
        self, packed: GPTQPacked, *, device: torch.device | str | None = None, act_dtype=None
    ) -> None:
        super().__init__()
        packed.validate()
        self.in_features = packed.in_features
        self.out_features = packed.out_features
        self.group_size = packed.group_size
        self.impl = "auto"
        self.register_buffer("qweight", packed.qweight.to(device).contiguous())
        v1 = packed.to_format("gptq")  # the module always holds v1 zeros (the release's format)
        self.register_buffer("qzeros", v1.qzeros.to(device).contiguous())
        self.register_buffer("scales", packed.scales.to(device).contiguous())
        self.register_buffer("g_idx", packed.g_idx.to(device).contiguous())
        zeros = unpack_gptq_qzeros(v1.qzeros, "gptq")
        self.symmetric = bool((zeros == 8).all())
        zb = None if self.symmetric else zero_bias_from_zeros(zeros).to(device)
        self.register_buffer("zero_bias", zb, persistent=False)
        if packed.bias is not None:
            b = packed.bias.to(device=device, dtype=act_dtype or packed.bias.dtype)
            self.register_buffer("bias", b)
        else:
            self.bias = None

    @classmethod
    def from_packed(
        cls, packed: GPTQPacked, *, device: torch.device | str | None = None, act_dtype=None
    ) -> Int4Linear:
        return cls(packed, device=device, act_dtype=act_dtype)

    def packed(self, checkpoint_format: str = "gptq") -> GPTQPacked:
        """The layer's tensors as a `GPTQPacked` (on the CPU), in the requested zero format."""
        p = GPTQPacked(
            qweight=self.qweight.cpu(),
            qzeros=self.qzeros.cpu(),
            scales=self.scales.cpu(),
            g_idx=self.g_idx.cpu(),
            in_features=self.in_features,
            out_features=self.out_features,
            group_size=self.group_size,
            checkpoint_format="gptq",
            bias=None if self.bias is None else self.bias.cpu(),
        )
        return p.to_format(checkpoint_format)

    @classmethod
    def concat(cls, layers: Sequence[Int4Linear]) -> Int4Linear:
        """One layer computing `layers` side by side: the fusion interface of `engine.fast`
        (`FusableLinear`), through which the fast path fuses Q/K/V/gate and w1/w3."""
        return concat_int4_linears(list(layers))

    def dequantize_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dequantised weight [out, in] (fp32 arithmetic, then `dtype`)."""
        return self.packed().dequantize(dtype).to(self.qweight.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise QuantError(f"Int4Linear: input has {x.shape[-1]} features, expected {self.in_features}")
        return w4a16_linear(
            x,
            self.qweight,
            self.scales,
            self.zero_bias,
            self.bias,
            group_size=self.group_size,
            impl=self.impl,
        )

    def extra_repr(self) -> str:
        kind = "sym" if self.symmetric else "asym"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"group_size={self.group_size}, {kind}, bias={self.bias is not None}"
        )


def concat_int4_linears(layers: list[Int4Linear]) -> Int4Linear:
    """One `Int4Linear` computing the given layers side by side (outputs concatenated along N).

    For fused projections (Q/K/V/gate: N = 4 x 1280; w1/w3: N = 2 x 3680): one GEMM fills the GPU better.
    All layers must share in_features and group size.
    """
    if not layers:
        raise QuantError("concat_int4_linears: no layers")
    k, gs = layers[0].in_features, layers[0].group_size
    if any(layer.in_features != k or layer.group_size != gs for layer in layers):
        raise QuantError("concat_int4_linears: layers differ in in_features or group size")
    parts = [layer.packed() for layer in layers]
    has_bias = [p.bias is not None for p in parts]
    if any(has_bias) and not all(has_bias):
        raise QuantError("concat_int4_linears: either all layers have a bias or none")
    fused = GPTQPacked(
        qweight=torch.cat([p.qweight for p in parts], dim=1),
        qzeros=pack_gptq_qzeros(torch.cat([p.zeros() for p in parts], dim=1), "gptq"),
        scales=torch.cat([p.scales for p in parts], dim=1),
        g_idx=parts[0].g_idx,
        in_features=k,
        out_features=sum(p.out_features for p in parts),
        group_size=gs,
        checkpoint_format="gptq",
        bias=torch.cat([p.bias for p in parts if p.bias is not None]) if all(has_bias) else None,
    )
    out = Int4Linear(fused, device=layers[0].qweight.device)
    out.impl = layers[0].impl
    return out


class _RTNModule(_PackedModule):
    _packed_buffers = ("qweight_u8", "scales", "zeros")
    qweight_u8: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    bias: torch.Tensor | None

    def _init_packed(self, packed: RTNPacked, device) -> None:
        packed.validate()
        self.rows, self.cols, self.num_groups = packed.rows, packed.cols, packed.num_groups
        self.register_buffer("qweight_u8", packed.qweight_u8.to(device).contiguous())
        self.register_buffer("scales", packed.scales.to(device).contiguous())
        self.register_buffer("zeros", packed.zeros.to(device).contiguous())

    def _init_bias(self, bias: torch.Tensor | None, device, act_dtype) -> None:
        if bias is not None:
            self.register_buffer("bias", bias.to(device=device, dtype=act_dtype or bias.dtype))
        else:
            self.bias = None

    def packed(self) -> RTNPacked:
        return RTNPacked(
            self.qweight_u8.cpu(), self.scales.cpu(), self.zeros.cpu(), self.rows, self.cols, self.num_groups
        )

    def _dequant(self, dtype: torch.dtype, rows: torch.Tensor | None = None) -> torch.Tensor:
        p = RTNPacked.__new__(RTNPacked)  # skip validation on the hot path (validated at construction)
        p.qweight_u8, p.scales, p.zeros = self.qweight_u8, self.scales, self.zeros
        p.rows, p.cols, p.num_groups, p.meta, p.name = self.rows, self.cols, self.num_groups, {}, "layer"
        return dequantize_rtn(p, dtype, rows=rows)


class RTNLinear(_RTNModule):
    """Linear on an RTN-nibble weight [out, in] (the checkpoints' "extra" layers); dequantises per call."""

    def __init__(self, packed: RTNPacked, bias: torch.Tensor | None = None, *, device=None, act_dtype=None):
        super().__init__()
        self._init_packed(packed, device)
        self.in_features, self.out_features = packed.cols, packed.rows
        self._init_bias(bias, device, act_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self._dequant(x.dtype)
        return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))


class PackedEmbedding(_RTNModule):
    """Embedding on an RTN-nibble table (num_embeddings, embedding_dim); dequantises only looked-up rows."""

    def __init__(self, packed: RTNPacked, *, device=None, act_dtype: torch.dtype = torch.float16) -> None:
        super().__init__()
        self._init_packed(packed, device)
        self.num_embeddings, self.embedding_dim = packed.rows, packed.cols
        self.act_dtype = act_dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).to(torch.long)
        rows = self._dequant(self.act_dtype, rows=flat)
        return rows.reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, num_groups={self.num_groups}"


class PackedScaledEmbedding(PackedEmbedding):
    """v4-Large's T5Gemma 2 embedding (`t5gemma.ScaledEmbedding`) on a packed table: the looked-up
    rows dequantised, times sqrt(hidden), the end-of-image id given its own (float) vector."""

    def __init__(
        self, packed: RTNPacked, *, scale: float, eoi: int | None, device=None, act_dtype=torch.float16
    ) -> None:
        super().__init__(packed, device=device, act_dtype=act_dtype)
        self.eoi_embedding = nn.Parameter(
            torch.zeros(packed.cols, device=device, dtype=act_dtype), requires_grad=False
        )
        # sqrt(hidden) as a float32 number rounded to the compute dtype, as the float module has it
        self.scale = torch.tensor(scale, dtype=torch.float32).to(act_dtype).item()
        self.eoi = eoi

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = super().forward(ids) * self.scale
        if self.eoi is None:
            return x
        return torch.where((ids == self.eoi)[..., None], self.eoi_embedding.to(x.dtype), x)


Conv = nn.Conv1d | nn.ConvTranspose1d


def _conv_args(conv: Conv) -> dict:
    if getattr(conv, "padding_mode", "zeros") != "zeros":
        raise QuantError(f"int4 conv supports padding_mode='zeros' only, got {conv.padding_mode!r}")
    return {
        "in_channels": conv.in_channels,
        "out_channels": conv.out_channels,
        "kernel_size": conv.kernel_size[0],
        "stride": conv.stride[0],
        "padding": conv.padding if isinstance(conv.padding, str) else conv.padding[0],
        "dilation": conv.dilation[0],
        "groups": conv.groups,
    }


class _Int4Conv(_RTNModule):
    """What both int4 convolutions share: building from a float conv."""

    @classmethod
    def from_conv(cls, conv: Conv, packed: RTNPacked, *, device=None, act_dtype=None, bias=None):
        """Same geometry as `conv`; `bias` (default: conv.bias) is copied."""
        b = conv.bias.detach() if bias is None and conv.bias is not None else bias
        extra = {"output_padding": conv.output_padding[0]} if isinstance(conv, nn.ConvTranspose1d) else {}
        return cls(packed, **_conv_args(conv), **extra, bias=b, device=device, act_dtype=act_dtype)


class Int4Conv1d(_Int4Conv):
    """nn.Conv1d semantics on an RTN-nibble weight flattened to [out, in/groups * k]."""

    def __init__(
        self,
        packed: RTNPacked,
        *,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int | str = 0,
        dilation: int = 1,
        groups: int = 1,
        bias: torch.Tensor | None = None,
        device=None,
        act_dtype=None,
    ) -> None:
        super().__init__()
        if (packed.rows, packed.cols) != (out_channels, in_channels // groups * kernel_size):
            raise QuantError(
                f"Int4Conv1d: packed weight is {packed.rows}x{packed.cols}, expected "
                f"{out_channels}x{in_channels // groups * kernel_size} ([out, in/groups*k])"
            )
        self._init_packed(packed, device)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.stride, self.padding, self.dilation, self.groups = stride, padding, dilation, groups
        self._init_bias(bias, device, act_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self._dequant(x.dtype).view(self.out_channels, self.in_channels // self.groups, self.kernel_size)
        b = None if self.bias is None else self.bias.to(x.dtype)
        return F.conv1d(x, w, b, self.stride, self.padding, self.dilation, self.groups)


class Int4ConvTranspose1d(_Int4Conv):
    """nn.ConvTranspose1d semantics on an RTN-nibble weight flattened to [in, out/groups * k]."""

    def __init__(
        self,
        packed: RTNPacked,
        *,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        padding: int = 0,
        output_padding: int = 0,
        dilation: int = 1,
        groups: int = 1,
        bias: torch.Tensor | None = None,
        device=None,
        act_dtype=None,
    ) -> None:
        super().__init__()
        if (packed.rows, packed.cols) != (in_channels, out_channels // groups * kernel_size):
            raise QuantError(
                f"Int4ConvTranspose1d: packed weight is {packed.rows}x{packed.cols}, expected "
                f"{in_channels}x{out_channels // groups * kernel_size} ([in, out/groups*k])"
            )
        self._init_packed(packed, device)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.dilation, self.groups = dilation, groups
        self._init_bias(bias, device, act_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self._dequant(x.dtype).view(self.in_channels, self.out_channels // self.groups, self.kernel_size)
        b = None if self.bias is None else self.bias.to(x.dtype)
        return F.conv_transpose1d(
            x, w, b, self.stride, self.padding, self.output_padding, self.groups, self.dilation
        )
