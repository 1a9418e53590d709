"""A streamed decode that carries each conv's left context instead of decoding it again.

`streaming.chunk_windows` decodes every window with 8 latent frames of context a side and drops
their audio: news5's lines in 8/50-frame windows decode 1.59x their frames, a 37-frame line in
the bf16 CPU preset's 8/24/50 windows 1.78x. Here each conv of the channels-last decoder
(`fast.ChannelsLastDecoder`) keeps the input samples its next outputs still need, each residual
unit keeps the residual its branch has not caught up with, and a push of latent frames runs every
layer on what is new only. Every layer emits the outputs whose inputs are all in, so the audio
lags the latent by the receptive field (8 frames, as `RECEPTIVE_FIELD_FRAMES`), and `finish`
pads each layer's input with the zeros a one-pass decode pads it with. The convs then do the
one-pass decode's sums once: a line decodes its frames 1.0x, and its audio equals `decode`'s up
to the rounding of a differently sized conv.

Per layer, with outputs numbered from 0 as in a one-pass decode:
- a stride-1 conv (kernel k, dilation d, padding p = (k - 1) d / 2) keeps the last (k - 1) d of
  its inputs; it starts with p zeros (the left padding), so its first output is output 0;
- a transposed conv (stride s, kernel 2s, padding P) keeps its last input: output n sums inputs
  floor((n + P) / s) - 1 and floor((n + P) / s), so with inputs [q, b) in hand (q the kept one)
  outputs [(q + 1) s - P, b s - P) are final; its first push drops the P outputs before 0 (a
  zero input stands at -1), `finish` adds a zero input at the end and keeps outputs < T s.

Rows of one stream advance together (one line, or lines pushed in step). No CUDA graphs yet: a
push's shapes follow its frames (the first and last pushes differ from the middle ones), so the
stream is for decodes that run eagerly, and only on the CPU (eagerly on the H200 it was 26x
slower than the windows; docs/codec.md "Stateful stream").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from ..fused import fused_available
from .fast import ChannelsLastDecoder, _Conv, _head, epilogue_torch
from .kernels import conv_epilogue
from .streaming import RECEPTIVE_FIELD_FRAMES

__all__ = ["LineStream", "StatefulDecode"]

Epilogue = Callable[..., tuple[Tensor | None, Tensor | None]]


class _Carry:
    """The inputs a stride-1 conv (span (k - 1) d, padding p = span / 2) has not used up: it starts
    with the p zeros of its left padding; `finish` adds the p of its right padding."""

    def __init__(self, span: int, rows: int, channels: int, dtype: torch.dtype, device: torch.device):
        assert span % 2 == 0
        self.span = span
        self.kept = torch.zeros(rows, span // 2, channels, dtype=dtype, device=device)

    def inputs(self, x: Tensor, final: bool) -> Tensor | None:
        """The inputs to run the conv on (unpadded): every output they give is final; None: none yet."""
        parts = [self.kept, x]
        if final:
            parts.append(x.new_zeros(x.shape[0], self.span // 2, x.shape[2]))
        buf = torch.cat(parts, dim=1)
        n_out = buf.shape[1] - self.span
        self.kept = buf[:, max(0, n_out) :]
        return buf if n_out > 0 else None


class _CarriedConv:
    """One conv of the decoder on a stream: (B, n, Cin) new inputs -> (B, m, Cout) new outputs
    (no bias), with the inputs its next outputs need kept."""

    def __init__(self, conv: _Conv, rows: int, dtype: torch.dtype, device: torch.device) -> None:
        self.conv = dataclasses.replace(conv, padding=0, output_padding=0)
        self.transposed = conv.transposed
        cin, cout = conv.weight.shape[:2] if conv.transposed else conv.weight.shape[1::-1]
        self.empty = torch.zeros(rows, 0, cout, dtype=dtype, device=device)
        self.stride = conv.stride
        self.carry: _Carry | None = None
        if conv.transposed:
            assert conv.kernel == 2 * conv.stride, "the decoder's upsampling convs have kernel 2 x stride"
            self.last = torch.zeros(rows, 1, cin, dtype=dtype, device=device)  # input -1: none
            self.inputs = 0  # inputs pushed so far
            self.emitted = 0  # outputs handed out so far
            self.to_drop = conv.padding  # outputs -P .. -1 (the first push's)
        else:
            assert conv.stride == 1 and 2 * conv.padding == (conv.kernel - 1) * conv.dilation
            if conv.kernel > 1:
                self.carry = _Carry((conv.kernel - 1) * conv.dilation, rows, cin, dtype, device)

    def push(self, x: Tensor, final: bool) -> Tensor:
        if self.transposed:
            return self._push_transposed(x, final)
        if self.carry is None:  # one tap: nothing to keep
            return self.conv(x)
        buf = self.carry.inputs(x, final)
        return self.empty if buf is None else self.conv(buf)

    def _push_transposed(self, x: Tensor, final: bool) -> Tensor:
        self.inputs += x.shape[1]
        parts = [self.last, x]
        if final:
            parts.append(x.new_zeros(x.shape[0], 1, x.shape[2]))
        buf = torch.cat(parts, dim=1)
        s = self.stride
        y = self.conv(buf)[:, s : buf.shape[1] * s]  # outputs whose two inputs are both in buf
        drop = min(self.to_drop, y.shape[1])
        self.to_drop -= drop
        y = y[:, drop:]
        if final:  # the one-pass decode has inputs x stride outputs
            y = y[:, : self.inputs * s - self.emitted]
        self.emitted += y.shape[1]
        self.last = buf[:, -1:]
        return y


class _Residual:
    """The residual a unit's second conv adds: its unit's input, kept until the branch catches up."""

    def __init__(self) -> None:
        self.kept: Tensor | None = None

    def put(self, h: Tensor) -> None:
        self.kept = h if self.kept is None else torch.cat([self.kept, h], dim=1)

    def take(self, n: int) -> Tensor:
        assert self.kept is not None and self.kept.shape[1] >= n
        out, self.kept = self.kept[:, :n], self.kept[:, n:]
        return out


class StatefulDecode:
    """One stream of the channels-last decoder: `push` latent frames, then `finish`; each returns
    the audio that became final, (B, 1, n) fp32, and together they equal one `decode` of all the
    frames (up to rounding). Frames are (B, n, latent channels) in the codec's dtype."""

    def __init__(self, decoder: ChannelsLastDecoder, rows: int, dtype: torch.dtype, device: torch.device):
        self.decoder = decoder
        self.first = _CarriedConv(decoder.first, rows, dtype, device)
        self.convs = [_CarriedConv(conv, rows, dtype, device) for conv, _, _, _ in decoder.steps]
        self.residuals = {i: _Residual() for i, step in enumerate(decoder.steps) if step[1]}
        self.feeds = {  # a step that keeps its sum -> the residual step it is the residual of
            i: min(j for j in self.residuals if j > i) for i, step in enumerate(decoder.steps) if step[3]
        }
        _, channels, taps = decoder.head_weight.shape
        assert 2 * decoder.head_padding == taps - 1
        self.head = _Carry(taps - 1, rows, channels, dtype, device)
        self.no_frames = torch.zeros(rows, 0, decoder.in_proj.weight.shape[1], dtype=dtype, device=device)
        self.finished = False

    def push(self, z: Tensor) -> Tensor:
        """New latent frames (B, n, C) -> the audio that is final now."""
        return self._run(z, final=False)

    def finish(self, z: Tensor | None = None) -> Tensor:
        """The last frames (if any) -> the rest of the audio; the stream is done."""
        return self._run(self.no_frames if z is None else z, final=True)

    def _run(self, z: Tensor, final: bool) -> Tensor:
        if self.finished:
            raise RuntimeError("the stream is finished")
        self.finished = final
        # no `run_or_fall_back` as the windows have: a push changes the carried state, so a push
        # that failed half way cannot run again on the torch path
        return self._layers(z, final, conv_epilogue if fused_available(z.device) else epilogue_torch)

    def _layers(self, z: Tensor, final: bool, epilogue: Epilogue) -> Tensor:
        d = self.decoder
        x = _epilogue(epilogue, d.in_proj(z.contiguous()), d.in_proj.bias, None, None, True)[0]
        assert x is not None
        _, s = _epilogue(epilogue, self.first.push(x, final), d.first.bias, None, d.first_alpha, False)
        for i, ((conv, residual, alpha, keep), carried) in enumerate(zip(d.steps, self.convs)):
            assert s is not None
            y = carried.push(s, final)
            res = self.residuals[i].take(y.shape[1]) if residual else None
            h, s = _epilogue(epilogue, y, conv.bias, res, alpha, keep)
            if keep:
                assert h is not None
                self.residuals[self.feeds[i]].put(h)
        assert s is not None
        buf = self.head.inputs(s, final)
        if buf is None:
            return torch.zeros(s.shape[0], 1, 0, device=s.device)
        return _head(buf, d.head_weight, d.head_bias, 0)


def _epilogue(
    epilogue: Epilogue, y: Tensor, bias: Tensor, residual: Tensor | None, alpha: Tensor | None, keep: bool
) -> tuple[Tensor | None, Tensor | None]:
    """`epilogue` where there are rows to run it on (a push may leave a layer nothing new)."""
    if y.shape[1] == 0:
        return (y if keep else None), (y if alpha is not None else None)
    return epilogue(y, bias, residual, alpha, keep)


class LineStream:
    """A line's latent decoded by one `StatefulDecode` as its chunks ask: `samples(a, b)` pushes the
    frames samples [a, b) need (their frames and 8 more, `RECEPTIVE_FIELD_FRAMES`; the line's last
    frames with `finish`) and returns them, (B, 1, b - a) fp32. Chunks may be asked for out of
    order (a job queue may run a later one first): audio not yet handed out is kept."""

    def __init__(self, decoder: ChannelsLastDecoder, z: Tensor, hop: int) -> None:
        self.z, self.hop = z, hop  # z: (B, T, C) in the codec's dtype
        self.stream = StatefulDecode(decoder, z.shape[0], z.dtype, z.device)
        self.pushed = 0
        self.audio = torch.zeros(z.shape[0], 1, 0, device=z.device)
        self.base = 0  # the sample self.audio starts at

    def samples(self, a: int, b: int) -> Tensor:
        frames = self.z.shape[1]
        if not 0 <= a <= b <= frames * self.hop or a < self.base:
            raise ValueError(f"samples [{a}, {b}) are not left in a line of {frames} frames")
        while self.base + self.audio.shape[-1] < b:
            upto = min(frames, -(-b // self.hop) + RECEPTIVE_FIELD_FRAMES)
            if self.stream.finished or upto <= self.pushed:  # pushing up to `upto` gives b: never here
                raise RuntimeError(f"the stream gave {self.base + self.audio.shape[-1]} samples, not {b}")
            piece = self.z[:, self.pushed : upto]
            new = self.stream.finish(piece) if upto == frames else self.stream.push(piece)
            self.pushed = upto
            self.audio = torch.cat([self.audio, new], -1)
        out = self.audio[..., a - self.base : b - self.base]
        if a == self.base:  # handed out in order: what is before b is not asked for again
            self.audio, self.base = self.audio[..., b - self.base :], b
        return out
