"""The codec's layers, named as the reference checkpoint's state_dict keys (weight norm folded).

Encoder: conv, 4 x EncoderBlock (3 residual units, Snake, strided conv), Snake, conv. Decoder: conv,
4 x DecoderBlock (Snake, transposed conv, 3 residual units), then the output head (Snake, conv to one
channel, tanh). Shapes and the reference's layout: docs/codec.md ("The network as built").
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..fused import fused_available, run_or_fall_back
from .config import CodecConfig
from .kernels import snake as fused_snake

__all__ = [
    "Decoder",
    "DecoderBlock",
    "Encoder",
    "EncoderBlock",
    "OutputHead",
    "ResidualUnit",
    "Snake",
    "VAEBottleneck",
    "conv_to_one_channel",
]


def _conv(cin: int, cout: int, kernel: int, stride: int = 1, dilation: int = 1) -> nn.Conv1d:
    """Main-path Conv1d with the reference's symmetric zero padding ((k - stride) * dilation) // 2."""
    padding = ((kernel - stride) * dilation) // 2
    return nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, padding=padding)


def _upsample_conv(cin: int, cout: int, stride: int) -> nn.ConvTranspose1d:
    """Main-path ConvTranspose1d (kernel 2s): output length is exactly L * stride."""
    return nn.ConvTranspose1d(
        cin, cout, 2 * stride, stride=stride, padding=(stride + 1) // 2, output_padding=stride % 2
    )


class Snake(nn.Module):
    """Snake activation `x + sin(alpha x)^2 / (alpha + 1e-9)`, per channel.

    Always computed in at least fp32 and `alpha` stays fp32 when the module is
    cast to fp16/bf16: 1/alpha reaches ~4.5e4 in the released weights.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: Tensor) -> Tensor:
        grad = torch.is_grad_enabled() and (x.requires_grad or self.alpha.requires_grad)
        if x.dim() == 3 and not grad and fused_available(x.device):
            # one kernel instead of seven (the codec's biggest cost on a GPU)
            return run_or_fall_back(lambda: fused_snake(x, self.alpha), lambda: self._eager(x))
        return self._eager(x)

    def _eager(self, x: Tensor) -> Tensor:
        """Snake in torch ops, on (B, C, T) or channels-last (B, C, 1, T) activations."""
        alpha = self.alpha.view(1, -1, *([1] * (x.dim() - 2)))
        grad = torch.is_grad_enabled() and (x.requires_grad or alpha.requires_grad)
        if x.dtype == torch.bfloat16 and x.device.type == "cpu" and not grad:
            # bf16 on the CPU: in bf16, in place. Each op widens to fp32 in registers, one pass
            # per op; through fp32 tensors (below) a Snake took 3-4x as long and the full bf16
            # decode 1.23x (benchmarks/cpu_preset.py). alpha and 1/alpha rounded to bf16: the
            # decoder's SNR against fp32 goes from 39.5 to 38.5 dB.
            inv = (alpha + 1e-9).reciprocal().to(x.dtype)
            return torch.mul(x, alpha.to(x.dtype)).sin_().square_().mul_(inv).add_(x)
        compute = torch.promote_types(x.dtype, torch.float32)
        alpha = alpha.to(compute)
        xc = x.to(compute)
        inv = (alpha + 1e-9).reciprocal()
        if grad:
            y = xc + inv * torch.sin(alpha * xc).pow(2)
        else:  # in place: one temporary instead of four (activations are large)
            y = torch.mul(xc, alpha).sin_().square_().mul_(inv).add_(xc)
        return y.to(x.dtype)

    def _apply(self, fn: Any, recurse: bool = True) -> Snake:
        kept = self.alpha.detach().clone()
        super()._apply(fn, recurse)
        if self.alpha.dtype in (torch.float16, torch.bfloat16):
            device = self.alpha.device
            if kept.is_meta:
                restored = torch.empty(kept.shape, dtype=torch.float32, device=device)
            else:
                restored = kept.to(device=device, dtype=torch.float32)
            self.alpha.data = restored
        return self


class ResidualUnit(nn.Module):
    """`x + conv_k1(snake(conv_k7_dilated(snake(x))))` at constant length."""

    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake(channels),
            _conv(channels, channels, 7, dilation=dilation),
            Snake(channels),
            _conv(channels, channels, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        return x + self.block(x)


class EncoderBlock(nn.Module):
    """Three residual units (dilations 1, 3, 9), Snake, strided conv `cin -> cout` (kernel 2s)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            ResidualUnit(cin, 1),
            ResidualUnit(cin, 3),
            ResidualUnit(cin, 9),
            Snake(cin),
            _conv(cin, cout, 2 * stride, stride=stride),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class Encoder(nn.Module):
    """48 kHz mono -> `latent_dim` channels at 1/hop the rate."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        dim = cfg.encoder_dim
        layers: list[nn.Module] = [_conv(1, dim, 7)]
        for stride in cfg.encoder_rates:
            layers.append(EncoderBlock(dim, 2 * dim, stride))
            dim *= 2
        layers += [Snake(dim), _conv(dim, cfg.latent_dim, 3)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class VAEBottleneck(nn.Module):
    """1x1 projections between the internal channels and the latent (mean, scale) / latent."""

    def __init__(self, latent_dim: int, codebook_dim: int) -> None:
        super().__init__()
        self.codebook_dim = codebook_dim
        self.in_proj = _conv(latent_dim, 2 * codebook_dim, 1)
        self.out_proj = _conv(codebook_dim, latent_dim, 1)

    def mean(self, z: Tensor) -> Tensor:
        """The posterior mean (the first `codebook_dim` channels of in_proj), computed alone."""
        n, bias = self.codebook_dim, self.in_proj.bias
        return nn.functional.conv1d(z, self.in_proj.weight[:n], None if bias is None else bias[:n])


class DecoderBlock(nn.Module):
    """Snake, transposed conv `cin -> cout` (x stride), residual units (dilations 1, 3, 9).

    The reference block lists 12 entries; the audio path uses 0, 1, 4, 5 and 8
    (the rest are the watermark branch), so `block` is keyed by those indices.
    """

    _ORDER = ("0", "1", "4", "5", "8")

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.block = nn.ModuleDict(
            {
                "0": Snake(cin),
                "1": _upsample_conv(cin, cout, stride),
                "4": ResidualUnit(cout, 1),
                "5": ResidualUnit(cout, 3),
                "8": ResidualUnit(cout, 9),
            }
        )

    def forward(self, x: Tensor) -> Tensor:
        for key in self._ORDER:
            x = self.block[key](x)
        return x


class OutputHead(nn.Module):
    """`tanh(conv_k7(snake(x)))` down to one channel: the audio output with the watermark off.

    In the reference these are the first layers of the watermarker's encoder
    block (`wm_model.encoder_block.pre.0..2`), hence the attribute names.
    """

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.pre = nn.Sequential(Snake(channels), _conv(channels, 1, 7))

    def forward(self, x: Tensor) -> Tensor:
        snake, conv = self.pre[0], self.pre[1]
        h = snake(x)
        if h.is_cuda and type(conv) is nn.Conv1d and isinstance(conv.padding[0], int):
            # cuDNN has no good kernel for a single output channel (its legacy implicit GEMM took
            # ~0.45 ms a window on an H200): a (7, C) GEMM and a shifted sum do the same sums
            return torch.tanh(conv_to_one_channel(h, conv.weight, conv.bias, conv.padding[0]))
        return torch.tanh(conv(h))


def conv_to_one_channel(x: Tensor, weight: Tensor, bias: Tensor | None, padding: int) -> Tensor:
    """conv1d(x, weight, bias, padding) for weight (1, C, K), stride 1: (B, 1, T_out) in x's dtype.

    z[b, k, t] = sum_c weight[0, c, k] x[b, c, t] (one GEMM in x's dtype, fp32 accumulation), then
    y[b, t] = sum_k z[b, k, t + k] over the zero-padded z (one strided sum in fp32). No copy of x
    is made (a whole 30 s line at 48 kHz is large)."""
    B, _, T = x.shape
    K = weight.shape[-1]
    z = torch.matmul(weight[0].t().to(x.dtype), x)  # (B, K, T)
    z = nn.functional.pad(z, (padding, padding)).contiguous()
    T_out = T + 2 * padding - K + 1
    diag = z.as_strided((B, T_out, K), (z.stride(0), 1, z.stride(1) + 1))
    y = diag.sum(-1, keepdim=True, dtype=torch.float32).transpose(1, 2)
    if bias is not None:
        y = y + bias.float().view(1, 1, 1)
    return y.to(x.dtype)


class _WatermarkModelSlot(nn.Module):
    """Holds the output head at the reference's `wm_model.encoder_block`; the embedder is not built."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.encoder_block = OutputHead(channels)


class Decoder(nn.Module):
    """`latent_dim` channels at 25 Hz -> 48 kHz mono in [-1, 1]."""

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv(cfg.latent_dim, cfg.decoder_dim, 7)]
        for i, stride in enumerate(cfg.decoder_rates):
            layers.append(DecoderBlock(cfg.decoder_dim // 2**i, cfg.decoder_dim // 2 ** (i + 1), stride))
        self.model = nn.ModuleList(layers)
        self.wm_model = _WatermarkModelSlot(cfg.decoder_out_dim)

    @property
    def head(self) -> OutputHead:
        return self.wm_model.encoder_block

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.model:
            x = layer(x)
        return self.head(x)
