"""The decoder's fast path: activations kept (batch, time, channels), every conv ended by one fused pass.

`layers.Decoder` works on (B, C, T) as the reference does. On a GPU that costs, per conv: cuDNN's
fp16 tensor-core kernels want NHWC, so it transposes the input in and the output back (3.2 ms of a
7.6 s line on an H200), then a bias add, then the residual add and the next Snake (two to five
elementwise kernels). Here activations stay (B, T, C), which cuDNN reads as NHWC with H = 1, convs
run without bias, and one pass (`fused.conv_epilogue`) adds the bias and the residual and applies
the next Snake. kernel-1 convs are plain GEMMs. The sums are the decoder's: only the rounding
differs (the bias / residual sum feeds the Snake unrounded).

`ChannelsLastDecoder` reads the decoder's own parameters: its conv weights are re-laid out in place
(NHWC strides, the same storage) so no second copy is held; the eager decoder still runs on them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..fused import fused_available, run_or_fall_back
from . import kernels
from .kernels import conv_epilogue, pack_residual_unit, residual_unit
from .layers import Decoder, DecoderBlock, ResidualUnit, Snake

__all__ = ["ChannelsLastDecoder", "epilogue_torch", "supports_channels_last"]


def epilogue_torch(
    y: Tensor, bias: Tensor, residual: Tensor | None, alpha: Tensor | None, keep: bool
) -> tuple[Tensor | None, Tensor | None]:
    """`fused.conv_epilogue` in torch ops: the path where Triton does not run (CPU, MPS).

    `y` is consumed: a bf16 `y` on the CPU is overwritten (computed in bf16, in place: the fp32
    round trip cost 1.3-2x the epilogue's time on a 2-core Zen 4 for 1.4 dB less SNR over the whole
    decoder, 38.2 against 39.6 dB; each op still widens to fp32 in registers)."""
    if y.dtype == torch.bfloat16 and y.device.type == "cpu":
        h = y.add_(bias)
        if residual is not None:
            h.add_(residual)
        s = None
        if alpha is not None:
            a = alpha.reshape(-1).float()
            inv = (a + 1e-9).reciprocal().to(h.dtype)
            s = torch.mul(h, a.to(h.dtype)).sin_().square_().mul_(inv).add_(h)
        return (h if keep else None), s
    h = y.float() + bias.float()
    if residual is not None:
        h += residual.float()
    s = None
    if alpha is not None:
        a = alpha.reshape(-1).float()
        s = torch.mul(h, a).sin_().square_().mul_((a + 1e-9).reciprocal()).add_(h).to(y.dtype)
    return (h.to(y.dtype) if keep else None), s


@dataclass
class _Conv:
    """One conv of the decoder as the fast path runs it: no bias (the epilogue adds it)."""

    weight: Tensor  # (Cout, Cin, K) with NHWC strides; (Cin, Cout, K) for a transposed conv
    bias: Tensor
    kernel: int
    stride: int
    padding: int
    dilation: int
    output_padding: int
    transposed: bool
    as_gemm: bool = False  # one im2col GEMM instead of cuDNN (`gemm_able`)

    @classmethod
    def of(cls, conv: nn.Module, *, as_gemm: bool = False) -> _Conv:
        assert isinstance(conv, (nn.Conv1d, nn.ConvTranspose1d)) and conv.bias is not None
        # In place: (Cout, Cin, K) -> the same values with the channel dim innermost, which is the
        # NHWC layout of its (Cout, Cin, 1, K) view. Eager conv1d accepts the strided weight.
        conv.weight.data = conv.weight.data.transpose(1, 2).contiguous().transpose(1, 2)
        transposed = isinstance(conv, nn.ConvTranspose1d)
        out = cls(
            conv.weight,
            conv.bias,
            conv.kernel_size[0],
            conv.stride[0],
            int(conv.padding[0]),  # type: ignore[arg-type]
            conv.dilation[0],
            conv.output_padding[0] if transposed else 0,
            transposed,
        )
        out.as_gemm = as_gemm and out.gemm_able()
        return out

    def phases(self, T: int) -> int:
        """How many phases a dilated stride-1 conv over T samples runs as (1: as itself).

        Samples t = h x P + w of (B, T, C) memory are the (h, w) of an NHWC (B, C, T / P, P) image,
        so a conv of dilation d along T is one of dilation d / P along its height: the same sums,
        no copy, and cuDNN picks its dilation-1 or -3 kernels. On an H100, 16 windows of 66 frames:
        the dilation-9 convs 1.3-3.3x faster (the 384-channel one, which cuDNN ran so slowly in
        NHWC that it was a GEMM, 0.41 against the GEMM's 1.33 ms), dilation 3 1.2-1.7x but 0.88x at
        96 channels; a window 1.17x faster in all (`benchmarks/codec_roofline.py`, RESULTS.md
        nineteenth session). P: the dilation where it divides T, else 3 where that divides both
        (the decoder's 9 at a length not a multiple of 9: every stream window's T is a multiple of 3).
        """
        d = self.dilation
        if self.transposed or self.stride != 1 or d == 1 or self.padding % d:
            return 1
        for p in (d, 3):
            if d % p == 0 and T % p == 0 and self.padding % p == 0:
                return p
        return 1

    def phase_conv(self, x: Tensor, phases: int) -> Tensor:
        """The conv over (B, T, Cin) as one over (T / phases, phases) (`phases`): (B, T, Cout)."""
        B, T, C = x.shape
        x4 = x.contiguous().view(B, T // phases, phases, C).permute(0, 3, 1, 2)  # NHWC, no copy
        w = self.weight
        w4 = w.as_strided((*w.shape, 1), (*w.stride(), w.stride(2)))  # (Cout, Cin, K, 1), NHWC
        pad, dil = self.padding // phases, self.dilation // phases
        y4 = nn.functional.conv2d(x4, w4, None, 1, (pad, 0), (dil, 1))
        return y4.permute(0, 2, 3, 1).reshape(B, T, y4.shape[1])

    def gemm_able(self) -> bool:
        """Whether `as_gemm` applies: a stride-1 conv with more than one tap (im2col)."""
        return not self.transposed and self.stride == 1 and self.kernel > 1

    def __call__(self, x: Tensor) -> Tensor:
        """(B, T, Cin) -> (B, T', Cout), bias not added."""
        B, T, C = x.shape
        if self.kernel == 1 and not self.transposed:
            return torch.matmul(x, self.weight[:, :, 0].t())
        phases = self.phases(T) if x.is_cuda else 1  # the CPU's convs ran slower so (phase_convs.py)
        if phases > 1:
            return self.phase_conv(x, phases)
        if self.as_gemm:  # (B, T_out, K * Cin) windows x (K * Cin, Cout); weight memory is (Cout, K, Cin)
            xp = nn.functional.pad(x, (0, 0, self.padding, self.padding)).contiguous()
            t_out = xp.shape[1] - self.dilation * (self.kernel - 1)
            cols = xp.as_strided((B, t_out, self.kernel, C), (xp.stride(0), C, self.dilation * C, 1))
            w = self.weight.permute(0, 2, 1).reshape(self.weight.shape[0], -1)
            return torch.matmul(cols.reshape(B, t_out, -1), w.t())
        x4 = x.view(B, 1, T, C).permute(0, 3, 1, 2)  # (B, C, 1, T) in NHWC memory
        w4 = self.weight.unsqueeze(2)
        if self.transposed:
            y4 = nn.functional.conv_transpose2d(
                x4, w4, None, (1, self.stride), (0, self.padding), (0, self.output_padding)
            )
        else:
            y4 = nn.functional.conv2d(x4, w4, None, (1, self.stride), (0, self.padding), (1, self.dilation))
        return y4.permute(0, 2, 3, 1).reshape(B, y4.shape[-1], y4.shape[1])  # a view when NHWC


def supports_channels_last(decoder: Decoder) -> bool:
    """True when every conv of the decoder is a plain Conv1d / ConvTranspose1d (not int4 layers)."""
    convs = [m for m in decoder.modules() if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]
    plain = all(type(m) in (nn.Conv1d, nn.ConvTranspose1d) and m.bias is not None for m in convs)
    n_expected = 1 + sum(1 + 2 * 3 for m in decoder.model if isinstance(m, DecoderBlock)) + 1
    return plain and len(convs) == n_expected and all(isinstance(c.padding[0], int) for c in convs)


class ChannelsLastDecoder:
    """`in_proj` then `Decoder` on (B, T, C) activations: (B, T, latent) latent -> (B, 1, samples) fp32.

    The op list is built once: each conv with the Snake that follows it (if any) and whether its
    output is needed again as a residual.
    """

    def __init__(self, in_proj: nn.Conv1d, decoder: Decoder) -> None:
        if not supports_channels_last(decoder):
            raise ValueError("the decoder has convs the channels-last path does not know (int4 layers?)")
        self.in_proj = _Conv.of(in_proj)
        # The first conv (latent rate, 7 taps, the widest channels) as a GEMM: its input is a few
        # hundred frames, so the unfolded windows are small, and cuDNN's heuristic picked a direct
        # kernel that took 59 ms of a 116-frame window's 61 ms (H200, 2026-12-04; the (B, C, T)
        # decoder's legacy implicit GEMM there took 1.2 ms; benchmarks/codec_speed.py --profile-windows)
        self.first = _Conv.of(decoder.model[0], as_gemm=True)
        on_cuda = in_proj.weight.is_cuda
        # (conv, add the residual x?, alpha of the Snake after it or None, keep the sum as the next x?)
        self.steps: list[tuple[_Conv, bool, Tensor | None, bool]] = []
        blocks = [m for m in decoder.model[1:] if isinstance(m, DecoderBlock)]
        head_snake = decoder.head.pre[0]
        first_alpha = _alpha(blocks[0].block["0"])
        for i, block in enumerate(blocks):
            after = blocks[i + 1].block["0"] if i + 1 < len(blocks) else head_snake
            units: list[ResidualUnit] = [block.block[k] for k in ("4", "5", "8")]  # type: ignore[misc]
            # transposed conv: its output is the first unit's residual and goes through its Snake
            self.steps.append((_Conv.of(block.block["1"]), False, _alpha(units[0].block[0]), True))
            for j, unit in enumerate(units):
                nxt = _alpha(units[j + 1].block[0]) if j + 1 < len(units) else _alpha(after)
                last = j + 1 == len(units)
                dilated = unit.block[1]
                slow = on_cuda and _cudnn_slow(dilated)
                self.steps.append((_Conv.of(dilated, as_gemm=slow), False, _alpha(unit.block[2]), False))
                self.steps.append((_Conv.of(unit.block[3]), True, nxt, not last))
        self.first_alpha = first_alpha
        head_conv = decoder.head.pre[1]
        assert isinstance(head_conv, nn.Conv1d) and head_conv.bias is not None
        self.head_weight, self.head_bias = head_conv.weight, head_conv.bias
        self.head_padding = int(head_conv.padding[0])  # type: ignore[arg-type,index]
        # on Hopper and later each residual unit up to FUSED_UNIT_WIDTH's channels runs as one
        # kernel (`fused.residual_unit`) in fp16 / bf16 (measured there only; its block wants ~100 KB
        # of shared memory, more than consumer cards give a block); its packed weights by the
        # dilated conv's place in `steps`, made here or when switched on (never inside a capture)
        self._packs: dict[int, tuple[Tensor, Tensor]] | None = None
        self.fuse_units = on_cuda and torch.cuda.get_device_capability(in_proj.weight.device)[0] >= 9

    @property
    def fuse_units(self) -> bool:
        return self._packs is not None

    @fuse_units.setter
    def fuse_units(self, on: bool) -> None:
        self._packs = None
        if on:
            steps, widest = self.steps, FUSED_UNIT_WIDTH[kernels.UNIT_THIRDS]
            self._packs = {
                i: pack_residual_unit(conv.weight, steps[i + 1][0].weight)
                for i, (conv, _, _, _) in enumerate(steps)
                if not conv.transposed and conv.kernel > 1 and conv.weight.shape[0] <= widest
            }

    def __call__(self, z: Tensor, keep: tuple[int, int] | None = None) -> Tensor:
        """(B, T, latent_channels) in the codec dtype -> (B, 1, hop * T) float32 audio; with `keep`
        (a, b), only samples [a, b) of it, (B, 1, b - a): each block then decodes only the samples
        those depend on (`crop_spans`), not the window's whole context."""
        if not fused_available(z.device):
            return self._run(z, epilogue_torch, False, keep)

        def unfused() -> Tensor:
            return run_or_fall_back(
                lambda: self._run(z, conv_epilogue, False, keep),
                lambda: self._run(z, epilogue_torch, False, keep),
            )

        if self.fuse_units and z.dtype in (torch.float16, torch.bfloat16):
            return run_or_fall_back(
                lambda: self._run(z, conv_epilogue, True, keep),
                unfused,
                what="the codec's fused residual units",
                switch_off=lambda: setattr(self, "fuse_units", False),
            )
        return unfused()

    def crop_spans(self, a: int, b: int) -> dict[int, tuple[int, int]]:
        """For output samples [a, b): the samples [lo, hi) of each block's input (by the index of
        its transposed conv in `steps`, in that block's input rate, from the window's start) that
        those outputs depend on. Walked back through every conv (`input_span`); a residual unit's
        input is needed where its conv path or its residual reads it."""
        k = self.head_weight.shape[-1]
        lo, hi = a - self.head_padding, b - self.head_padding + k - 1
        spans: dict[int, tuple[int, int]] = {}
        residual: tuple[int, int] | None = None  # what the residual add reads of the unit's input
        for i in range(len(self.steps) - 1, -1, -1):
            conv, adds_residual, _, _ = self.steps[i]
            if adds_residual:
                residual = (lo, hi)
            lo, hi = input_span(conv, lo, hi)
            if residual is not None and not adds_residual:  # the unit's dilated conv: its input
                lo, hi, residual = min(lo, residual[0]), max(hi, residual[1]), None
            if conv.transposed:
                spans[i] = (lo, hi)
        return spans

    def _run(
        self,
        z: Tensor,
        epilogue: Callable[..., tuple[Tensor | None, Tensor | None]],
        unit: bool,
        keep: tuple[int, int] | None = None,
    ) -> Tensor:
        """The decode; `unit`: each residual unit of `_packs` (`FUSED_UNIT_WIDTH`) in one
        kernel (`fused.residual_unit`); `keep`: only samples [a, b) (`__call__`)."""
        x, _ = epilogue(self.in_proj(z.contiguous()), self.in_proj.bias, None, None, True)
        assert x is not None
        _, s = epilogue(self.first(x), self.first.bias, None, self.first_alpha, False)
        steps = enumerate(self.steps)
        packs = self._packs if unit and self._packs is not None else {}
        spans = self.crop_spans(*keep) if keep is not None else {}
        start = 0  # the window sample (at the current rate) the activations begin at
        for i, (conv, residual, alpha, keep_h) in steps:
            assert s is not None
            if i in spans:  # a block's input: only what the kept samples depend on
                start, s = _crop(s, start, spans[i], conv.stride)
            if conv.transposed:
                start *= conv.stride
            if i in packs:
                _, (tail, _, nxt, keep_h) = next(steps)  # the unit's 1-tap conv, with the residual
                assert alpha is not None and nxt is not None and x is not None
                h, s = residual_unit(s, packs[i], conv.bias, alpha, conv.dilation, tail.bias, x, nxt, keep_h)
            else:
                h, s = epilogue(conv(s), conv.bias, x if residual else None, alpha, keep_h)
            if keep_h:  # the next unit's residual
                x = h
        assert s is not None
        audio = _head(s, self.head_weight, self.head_bias, self.head_padding)
        if keep is None:
            return audio
        return audio[:, :, keep[0] - start : keep[1] - start]


def input_span(conv: _Conv, lo: int, hi: int) -> tuple[int, int]:
    """The input samples [lo', hi') that output samples [lo, hi) of `conv` read (zero padding
    aside). Stride 1: output n reads n - padding + j * dilation, j < kernel; transposed: output n
    is input i's tap j where n = i * stride - padding + j."""
    k, s, p, d = conv.kernel, conv.stride, conv.padding, conv.dilation
    if conv.transposed:
        return -(-(lo + p - (k - 1)) // s), (hi - 1 + p) // s + 1
    return lo * s - p, (hi - 1) * s - p + (k - 1) * d + 1


def _crop(s: Tensor, start: int, span: tuple[int, int], stride: int) -> tuple[int, Tensor]:
    """`s` (B, T, C), beginning at window sample `start`, cut to `span` (within it). Its length then
    times `stride` (the block's upsampling) stays a multiple of 9 where the window's allows, so the
    block's dilated convs still run in phases (`_Conv.phases`)."""
    T = s.shape[1]
    lo, hi = max(span[0] - start, 0), min(span[1] - start, T)
    if lo == 0 and hi == T:
        return start, s
    while (hi - lo) * stride % 9 and (hi < T or lo > 0):
        if hi < T:
            hi += 1
        else:
            lo -= 1
    return start + lo, s[:, lo:hi].contiguous()


#: the widest residual unit fused into one kernel (`fused.residual_unit`), by whether its outputs
#: pack in thirds (`kernels.UNIT_THIRDS`). In one chunk, the last, 96-channel stage: a unit took
#: 1.31-1.38x less time fused and the graphed window 1.06-1.08x at every window shape of the CUDA
#: preset (H100, benchmarks/RESULTS.md "Twenty-first session"), while a 192-channel unit was slower
#: than its four ops (0.92-0.96x, thirty-sixth session). In thirds the 192-channel unit is
#: 1.11-1.16x faster than its four ops, the windows with both stages fused 1.10-1.16x the unfused
#: units' (thirty-sixth session). The kernel itself takes up to 256.
FUSED_UNIT_WIDTH = {False: 96, True: 192}


#: (in channels, kernel, dilation) of the released decoder's convs for which cuDNN's NHWC heuristic
#: picks `conv2d_grouped_direct_kernel` at some lengths: the 384-channel dilation-9 conv took 19 ms
#: at a 37-frame window and 59 ms at 116 frames, against 0.08 / 0.15 ms as one GEMM, while every
#: other conv stayed under 0.35 ms (H200, cuDNN of torch 2.11; `codec_speed.py --conv-table`,
#: benchmarks/RESULTS.md). Elsewhere cuDNN is 1.1-4x faster than the GEMM, so only these run as one.
#: On CUDA a dilated conv runs in phases (`_Conv.phases`) where the length allows, before this.
CUDNN_SLOW_NHWC = {(384, 7, 9)}


def _cudnn_slow(conv: nn.Module) -> bool:
    assert isinstance(conv, nn.Conv1d)
    return (conv.in_channels, conv.kernel_size[0], conv.dilation[0]) in CUDNN_SLOW_NHWC


def _alpha(snake: nn.Module) -> Tensor:
    assert isinstance(snake, Snake)
    return snake.alpha


def _head(s: Tensor, weight: Tensor, bias: Tensor, padding: int) -> Tensor:
    """tanh(conv1d(s, weight (1, C, K), bias, padding)) for s (B, T, C): (B, 1, T_out) fp32.

    As `layers.conv_to_one_channel`, in this layout: one (T, C) x (C, K) GEMM, then each output
    sample the sum of K shifted entries (a strided view), in fp32."""
    B, T, _ = s.shape
    K = weight.shape[-1]
    zk = torch.matmul(s, weight[0].to(s.dtype))  # (B, T, K)
    zk = nn.functional.pad(zk, (0, 0, padding, padding)).contiguous()  # (B, T + 2p, K)
    T_out = T + 2 * padding - K + 1
    diag = zk.as_strided((B, T_out, K), (zk.stride(0), K, K + 1))
    y = diag.sum(-1, dtype=torch.float32) + bias.float()
    return torch.tanh(y).unsqueeze(1)
