"""The decoder's CPU path (`Preset.cpu_codec`): channels-last activations for oneDNN's convolutions.

`layers.Decoder` runs (B, C, T) activations as the reference does. oneDNN's CPU convolutions work
on channels-innermost data, so every Conv1d reorders its input in and its output back, and an
elementwise op with a per-channel operand (Snake's alpha) strides across channels. `CpuDecoder`
keeps the activations as (B, C, 1, T) tensors in channels-last memory from the first conv to the
output head: each conv is a Conv2d of kernel (1, K) on views of the same weights (no copy, no
re-layout: the eager decoder still runs on them), Snake runs in the same layout
(`Snake._eager` takes 4-d input). The sums are the decoder's; only the order of the additions in
oneDNN's kernels differs (within bf16 rounding: the same 38.5 dB SNR against fp32 as the bf16
(B, C, T) decoder on the full codec).

Measured (benchmarks/cpu_preset.py, full-size codec, news5 sentence 1 streamed, one Zen 4 core):
bf16 2.73 s against 3.48 s for the bf16 (B, C, T) decoder and 5.65 s for fp32; in fp32 this layout
was slower (6.72 s), so fp32 input takes the inherited forward. `use_cpu_decoder(codec)` switches
a loaded codec over by class (`CpuDecoder` is a `Decoder`: same modules, state_dict and `.to()`);
on another device, with grad, or for the int4 codec (its convs are not plain Conv1d) the
inherited forward runs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .layers import Decoder, DecoderBlock, ResidualUnit, Snake

__all__ = ["CpuDecoder", "cpu_decoder_supported", "use_cpu_decoder"]


def _conv(conv: nn.Module, x: Tensor) -> Tensor:
    """`conv` (Conv1d or ConvTranspose1d) on a (B, C, 1, T) channels-last tensor."""
    assert isinstance(conv, (nn.Conv1d, nn.ConvTranspose1d))
    w = conv.weight.unsqueeze(2)  # a view: (Cout, Cin, 1, K); (Cin, Cout, 1, K) transposed
    padding = int(conv.padding[0])  # type: ignore[arg-type]  # int: checked by cpu_decoder_supported
    if isinstance(conv, nn.ConvTranspose1d):
        return F.conv_transpose2d(
            x, w, conv.bias, (1, conv.stride[0]), (0, padding), (0, conv.output_padding[0])
        )
    return F.conv2d(x, w, conv.bias, (1, conv.stride[0]), (0, padding), (1, conv.dilation[0]))


def _snake(snake: nn.Module, x: Tensor) -> Tensor:
    assert isinstance(snake, Snake)
    return snake._eager(x)


def cpu_decoder_supported(decoder: nn.Module) -> bool:
    """True when every conv of `decoder` is a plain Conv1d / ConvTranspose1d (not the int4 codec's)."""
    if not isinstance(decoder, Decoder):
        return False
    convs = [m for m in decoder.modules() if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]
    expected = 1 + sum(1 + 2 * 3 for m in decoder.model if isinstance(m, DecoderBlock)) + 1
    return (
        len(convs) == expected
        and all(type(m) in (nn.Conv1d, nn.ConvTranspose1d) for m in convs)
        and all(isinstance(m.padding[0], int) for m in convs)
    )


class CpuDecoder(Decoder):
    """`Decoder` whose forward keeps channels-last (B, C, 1, T) bf16 activations on the CPU.

    bf16 only: in fp32 the channels-last decoder measured 0.84x the (B, C, T) one (oneDNN's fp32
    kernels gain nothing from the layout), so fp32 input takes the inherited forward."""

    def forward(self, x: Tensor) -> Tensor:
        if x.device.type != "cpu" or x.dtype != torch.bfloat16 or torch.is_grad_enabled():
            return super().forward(x)
        h = _conv(self.model[0], x.unsqueeze(2).contiguous(memory_format=torch.channels_last))
        for block in self.model[1:]:
            assert isinstance(block, DecoderBlock)
            layers: Any = block.block
            h = _conv(layers["1"], _snake(layers["0"], h))
            for key in ("4", "5", "8"):
                unit = layers[key]
                assert isinstance(unit, ResidualUnit)
                s1, c1, s2, c2 = unit.block
                h = h + _conv(c2, _snake(s2, _conv(c1, _snake(s1, h))))
        snake, conv = self.head.pre[0], self.head.pre[1]
        return torch.tanh(_conv(conv, _snake(snake, h))).squeeze(2)


def use_cpu_decoder(codec: nn.Module, enabled: bool = True) -> bool:
    """Switch `codec.decoder` to `CpuDecoder` (or back); True when the CPU path is on.

    Off (and left as it was) when the decoder's convs are not plain convs (the int4 codec). The
    switch is by class: no weight is copied or moved."""
    decoder = getattr(codec, "decoder", None)
    if not isinstance(decoder, Decoder):
        return False
    on = enabled and cpu_decoder_supported(decoder)
    if on or type(decoder) is CpuDecoder:
        cls: type[Decoder] = CpuDecoder if on else Decoder
        decoder.__class__ = cls
    return on
