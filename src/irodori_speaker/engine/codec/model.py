"""The DACVAE codec (Aratako/Semantic-DACVAE-Japanese-32dim): decode, streamed decode, encode.

Only the paths Irodori-TTS uses are built: `decode` (32-dim latents at 25 Hz -> 48 kHz mono audio,
watermark off) and the deterministic `encode` (audio -> the posterior mean). The layers are in
`layers`, the stream's windows in `streaming`, the CUDA graphs in `graphs`, files in `files`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ...cancel import CancelToken
from ...errors import InputError
from ..batch import batch_bucket
from .config import CodecConfig
from .fast import ChannelsLastDecoder, supports_channels_last
from .graphs import GraphCache, WindowGraph, capture_graph
from .layers import Decoder, Encoder, VAEBottleneck
from .stateful import LineStream
from .streaming import RECEPTIVE_FIELD_FRAMES, Window, check_int, chunk_windows, decode_windows, window_crop

__all__ = ["DACVAE"]


class DACVAE(nn.Module):
    """The codec: `decode`, `decode_chunked`, `decode_stream` and the deterministic `encode`.

    Latents are (B, T, codebook_dim) as Irodori uses them; audio is (B, 1, samples)
    at `sample_rate`. Inputs are moved to the codec's device and dtype; audio and
    latents come back as float32 on that device. On CUDA, `use_graphs` makes the
    decodes replay CUDA graphs (opt-in).
    """

    def __init__(self, cfg: CodecConfig) -> None:
        super().__init__()
        self.config = cfg
        self.encoder = Encoder(cfg)
        self.quantizer = VAEBottleneck(cfg.latent_dim, cfg.codebook_dim)
        self.decoder = Decoder(cfg)
        self._graphs: GraphCache | None = None  # set by use_graphs
        self._graph_pool: Any = None  # the one CUDA memory pool all of this codec's graphs share
        self._channels_last: ChannelsLastDecoder | None = None  # set by use_channels_last
        # windows decoded on the channels-last path carry only what their kept samples depend on
        # through the deeper blocks, not their whole context (`_decode_frames`); graphs per crop
        self.crop_windows = True

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any], *, device: str | torch.device | None = None) -> DACVAE:
        """Build with default init (e.g. on `device="meta"` to inspect shapes without memory)."""
        cfg = CodecConfig.from_kwargs(kwargs)
        with torch.device(device) if device is not None else contextlib.nullcontext():
            return cls(cfg)

    @property
    def hop_length(self) -> int:
        return self.config.hop_length

    @property
    def sample_rate(self) -> int:
        return self.config.sample_rate

    @property
    def latent_channels(self) -> int:
        return self.config.codebook_dim

    @property
    def device(self) -> torch.device:
        return self.quantizer.out_proj.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the conv weights (Snake's alpha stays fp32 under half precision)."""
        return self.quantizer.out_proj.weight.dtype

    # ---- decode

    def _check_latent(self, latent: Tensor, finite: bool = True) -> Tensor:
        if not isinstance(latent, Tensor) or latent.dim() != 3:
            shape = tuple(latent.shape) if isinstance(latent, Tensor) else type(latent).__name__
            raise InputError(f"latent must be a (batch, frames, {self.latent_channels}) tensor, got {shape}")
        if latent.shape[2] != self.latent_channels:
            raise InputError(
                f"latent must have {self.latent_channels} channels in its last dim, got shape "
                f"{tuple(latent.shape)}"
            )
        if latent.shape[0] == 0 or latent.shape[1] == 0:
            raise InputError(f"latent has no frames or no batch: shape {tuple(latent.shape)}")
        if not latent.is_floating_point():
            raise InputError(f"latent must be a floating-point tensor, got {latent.dtype}")
        if finite and not bool(torch.isfinite(latent).all()):  # a host sync
            raise InputError("latent contains NaN or inf")
        return latent.to(device=self.device, dtype=self.dtype).transpose(1, 2)

    def _decode_frames(self, z: Tensor, keep: tuple[int, int] | None = None) -> Tensor:
        """(B, codebook_dim, T) in the codec dtype -> (B, 1, hop*T) float32; with `keep` (a, b) only
        samples [a, b) of it, which the channels-last decoder computes without carrying the rest
        through its deeper blocks (`ChannelsLastDecoder.crop_spans`)."""
        if self._cropping():
            assert self._channels_last is not None
            return self._channels_last(z.transpose(1, 2), keep)
        if self._channels_last is not None:
            audio = self._channels_last(z.transpose(1, 2))
        else:
            audio = self.decoder(self.quantizer.out_proj(z)).float()
        return audio if keep is None else audio[:, :, keep[0] : keep[1]]

    def _cropping(self) -> bool:
        """Whether windows decode cropped: `crop_windows` on the channels-last decoder."""
        return self.crop_windows and self._channels_last is not None

    def _crop(self, frames: int, a: int, b: int) -> tuple[int, int]:
        """The crop a window of `frames` frames keeping samples [a, b) decodes with: (left, right),
        the context at each end its graph leaves out (`streaming.window_crop`); (0, 0) where
        cropping is off or does not apply (the (B, C, T) decoder)."""
        if not self._cropping():
            return (0, 0)
        hop = self.hop_length
        return window_crop((0, a // hop, -(-b // hop), frames))

    def use_channels_last(self, enabled: bool = True) -> bool:
        """Decode on (batch, time, channels) activations with fused conv epilogues (`codec.fast`).

        The same sums as the (B, C, T) decoder; on CUDA it avoids cuDNN's layout transposes and
        the separate bias / residual / Snake kernels. Re-lays the conv weights out in place (no
        second copy). Returns whether it is on: False when the decoder's convs are not plain convs
        (the int4 codec). Captured graphs are dropped (they would replay the other path).
        """
        self._drop_graphs()
        self._channels_last = None
        if enabled and supports_channels_last(self.decoder):
            self._channels_last = ChannelsLastDecoder(self.quantizer.out_proj, self.decoder)
        return self._channels_last is not None

    @property
    def channels_last(self) -> bool:
        return self._channels_last is not None

    def _decode_window(self, z: Tensor, a: int, b: int, dtype: torch.dtype | None = None) -> Tensor:
        """Samples [a, b) of window `z`'s decode as a tensor of its own, in `dtype` (None: the
        codec's), a graph replay where one applies: the graph of its crop, or of one that keeps
        more."""
        held = None
        if self._graphs is not None and self._graphs.applies_to(z.device):
            crop = self._crop(z.shape[-1], a, b)
            held = self._graphs.held_within(z.shape[0], z.shape[-1], crop)
            if held is None and self._graphs.runner(z, crop) is not None:  # captured on use
                held = self._graphs.held_within(z.shape[0], z.shape[-1], crop)
        if held is None:
            return _owned(self._decode_frames(z, (a, b)), dtype, copy=False)
        run, (left, _) = held
        at = left * self.hop_length  # the graph's output begins at the crop
        return _owned(run(z)[:, :, a - at : b - at], dtype)

    def decode(self, latent: Tensor) -> Tensor:
        """Decode (B, T, 32) latents to (B, 1, hop*T) audio in one pass (memory grows with T)."""
        z = self._check_latent(latent)
        with torch.no_grad():
            return self._decode_window(z, 0, z.shape[-1] * self.hop_length)

    def decode_stream(
        self,
        latent: Tensor,
        chunk_frames: int,
        context_frames: int = RECEPTIVE_FIELD_FRAMES,
        cancel: CancelToken | None = None,
        first_chunk_frames: int | None = None,
        growth: float | None = None,
    ) -> Iterator[Tensor]:
        """Yield (B, 1, hop*n) audio chunks of `chunk_frames` latent frames each, in order.

        Each chunk is decoded with up to `context_frames` extra frames on both
        sides and the context's audio discarded; with the default 8 (the
        receptive field) the concatenation equals `decode`. `first_chunk_frames`
        makes the first chunk shorter (first audio sooner) without paying the
        context overhead of small chunks for the rest; `growth` lets the chunks
        after it grow by that factor up to `chunk_frames` (see `chunk_windows`).
        `cancel` is checked before each chunk (`Cancelled`). Arguments are
        checked on the call, not on the first `next()`. With `use_graphs`,
        `stream_window_lengths` gives the window lengths to pass to `prewarm_graphs`. Where the
        decode runs eagerly on the channels-last path (`line_stream`), the same chunks come from a
        stateful stream: each frame decoded once, not with a window's context.
        """
        z = self._check_latent(latent)
        windows = self.stream_windows(z.shape[-1], chunk_frames, context_frames, first_chunk_frames, growth)
        stream = self.line_stream(z) if context_frames == RECEPTIVE_FIELD_FRAMES else None
        samples = stream.samples if stream is not None else None
        return decode_windows(self._decode_window, z, windows, self.hop_length, cancel, samples)

    def line_stream(self, z: Tensor) -> LineStream | None:
        """A stateful stream of `z` (B, codebook_dim, T) as `decoder_input` gives it, where one
        applies: the channels-last decoder on the CPU (no CUDA graphs: a push's shapes follow its
        frames; eagerly on an H200 it was 26x slower than the windows). Its `samples(a, b)` is the
        audio a window keeping samples [a, b) gives, with every frame decoded once
        (`codec.stateful`; docs/codec.md "Stateful stream")."""
        if not self.streams_statefully():
            return None
        assert self._channels_last is not None
        return LineStream(self._channels_last, z.transpose(1, 2), self.hop_length)

    def streams_statefully(self) -> bool:
        """Whether `line_stream` applies (host state only): channels-last on the CPU."""
        return self._channels_last is not None and self.device.type == "cpu"

    def decoder_input(self, latent: Tensor, *, check_finite: bool = True) -> Tensor:
        """`latent` (B, T, codebook_dim) checked and as the decoder takes it: (B, codebook_dim, T)
        in the codec's device and dtype. `check_finite` False: no NaN check (it reads the latent
        back, a host sync); the caller checks the audio instead."""
        return self._check_latent(latent, check_finite)

    def stream_windows(
        self,
        frames: int,
        chunk_frames: int,
        context_frames: int = RECEPTIVE_FIELD_FRAMES,
        first_chunk_frames: int | None = None,
        growth: float | None = None,
        tail_lengths: Sequence[int] = (),
        plan_lengths: Sequence[int] = (),
    ) -> list[Window]:
        """The windows (lo, start, end, hi) `decode_stream` walks for a latent of `frames` frames
        (host arithmetic), for callers that decode them themselves: a window decodes
        `z[..., lo:hi]` and keeps samples [(start - lo) * hop, (end - lo) * hop). With graphs a
        line's last window takes the middle length, or the shortest of `tail_lengths` that holds
        it; with `plan_lengths` the windows after the first take those lengths (`chunk_windows`)."""
        return chunk_windows(
            frames,
            chunk_frames,
            context_frames,
            first_chunk_frames,
            growth=growth,
            stretch_last=self._graphed(),
            tail_lengths=tail_lengths,
            plan_lengths=plan_lengths,
        )

    def decode_window_batch(self, windows: Sequence[tuple[Tensor, int, int]]) -> list[Tensor]:
        """Samples [a, b) of each window's decode, for windows (z (1, codebook_dim, n), a, b) of one
        length n (of several lines): one decode of them stacked, each row's piece a (1, 1, b - a)
        view of one tensor of their own (`decode_window_stack`).

        The decoder is per row (convolutions and Snake; no op mixes rows), so a row decoded in a
        batch is the row decoded alone up to the rounding of a differently sized convolution. With
        graphs, the batch is filled up to a batch bucket (engine/batch.py) whose graph is held (no
        capture here: a capture mid-stream stalls every line); without one, each window replays
        its own graph."""
        if not windows:
            return []
        rows, spans = self.decode_window_stack(windows)
        return [rows[i : i + 1, :, start:stop] for i, (start, stop) in enumerate(spans)]

    def decode_window_stack(
        self, windows: Sequence[tuple[Tensor, int, int]], dtype: torch.dtype | None = None
    ) -> tuple[Tensor, list[tuple[int, int]]]:
        """`decode_window_batch`'s pieces as the rows of one tensor (len(windows), 1, S) in `dtype`
        (None: the codec's) and each row's [start, stop) in it: the decode copied out of a graph's
        buffer (which the next replay overwrites) and cast once for the batch, not once a window,
        so a batch of windows costs one small kernel and, on its way to the host, one copy
        (`DEVICE.to_host_rows`) where it cost two kernels and a copy a window."""
        if not windows:
            raise InputError("decode_window_stack: no windows")
        n = windows[0][0].shape[-1]
        if any(z.shape[0] != 1 or z.shape[-1] != n for z, _, _ in windows):
            raise InputError("decode_window_batch: windows must be (1, channels, n) of one length n")
        if len(windows) == 1:
            z, a, b = windows[0]
            return self._decode_window(z, a, b, dtype), [(0, b - a)]
        zs = [z for z, _, _ in windows]
        # what every row keeps: the crop of the rows' widest kept span
        a0, b0 = min(a for _, a, _ in windows), max(b for _, _, b in windows)
        spans = [(a - a0, b - a0) for _, a, b in windows]
        with torch.no_grad():
            if self._graphed():
                rows = batch_bucket(len(windows))
                assert self._graphs is not None
                held = self._graphs.held_within(rows, n, self._crop(n, a0, b0))
                if held is None:
                    pieces = [self._decode_window(z, a, b, dtype) for z, a, b in windows]
                    width = max(p.shape[-1] for p in pieces)
                    out = torch.stack([nn.functional.pad(p[0], (0, width - p.shape[-1])) for p in pieces])
                    return out, [(0, p.shape[-1]) for p in pieces]
                # filled up to the bucket with copies of the first row, in the one cat
                fill = [zs[0].expand(rows - len(windows), -1, -1)] if rows > len(windows) else []
                run, (left, _) = held
                at = left * self.hop_length
                return _owned(run(torch.cat(zs + fill))[: len(windows), :, a0 - at : b0 - at], dtype), spans
            out = self._decode_frames(torch.cat(zs), (a0, b0))
        return _owned(out, dtype, copy=False), spans

    def fills_batches(self) -> bool:
        """Whether `decode_window_batch` fills a batch up to its bucket (its graphs replay)."""
        return self._graphed()

    def _graphed(self) -> bool:
        """Whether window decodes may replay graphs (inputs are on the codec's device once checked;
        the last window is then stretched to a graphed length: without graphs wasted work)."""
        return self._graphs is not None and self._graphs.applies_to(self.device)

    def decode_chunked(
        self, latent: Tensor, chunk_frames: int, context_frames: int = RECEPTIVE_FIELD_FRAMES
    ) -> Tensor:
        """`decode` in chunks (bounded peak memory); equal to `decode` with the default context."""
        z = self._check_latent(latent)
        windows = chunk_windows(z.shape[-1], chunk_frames, context_frames, stretch_last=self._graphed())
        out = torch.empty(z.shape[0], 1, z.shape[-1] * self.hop_length, device=z.device)
        pos = 0
        stream = self.line_stream(z) if context_frames == RECEPTIVE_FIELD_FRAMES else None
        samples = stream.samples if stream is not None else None
        for piece in decode_windows(self._decode_window, z, windows, self.hop_length, None, samples):
            out[:, :, pos : pos + piece.shape[-1]] = piece
            pos += piece.shape[-1]
        return out

    # ---- CUDA graphs

    def use_graphs(
        self,
        enabled: bool = True,
        max_graphs: int = 8,
        *,
        capture_on_use: int | None = 2,
        max_frames: int = 128,
    ) -> None:
        """Decode windows by replaying CUDA graphs, one per (batch, window frames); a no-op off CUDA.

        Shapes given to `prewarm_graphs` are captured there and kept. Any other
        shape of at most `max_frames` frames is captured the `capture_on_use`-th
        time it is decoded (None: never), evicting the least recently used
        graph that was not prewarmed once `max_graphs` are held; until then, and
        for longer windows, decodes run eagerly. A replay gives the eager
        result bit for bit. Captured graphs are dropped by this call and when
        the codec is moved or cast; call it again after replacing modules (as
        `quantize_codec` does). Not thread-safe: callers hold `MODEL_LOCK`, as
        for all model work (a capture must not overlap other CUDA work).
        """
        check_int("max_graphs", max_graphs, 1)
        check_int("max_frames", max_frames, 1)
        if capture_on_use is not None:
            check_int("capture_on_use", capture_on_use, 1)
        self._drop_graphs()
        self._graphs = None
        if enabled:
            self._graphs = GraphCache(
                self._capture_window, max_graphs, capture_on_use=capture_on_use, max_frames=max_frames
            )

    def prewarm_graphs(self, lengths: Iterable[int], batch: int = 1, crop: tuple[int, int] = (0, 0)) -> int:
        """Capture graphs for windows of these frame counts now and keep them; returns how many are new.

        `crop` (left, right): the frames at each end the windows keep only as context
        (`streaming.window_crop`); their graph decodes the rest (where `crop_windows` applies; else
        whole windows). Returns 0 without capturing when graphs are off or the codec is not on CUDA.
        Raises `InputError` if more shapes would be kept than `max_graphs`.
        """
        lengths = list(lengths)
        check_int("batch", batch, 1)
        for n in lengths:
            check_int("window length", n, 1)
        left, right = crop
        check_int("crop", left, 0)
        check_int("crop", right, 0)
        if any(left + right >= n for n in lengths):
            raise InputError(f"a window's crop {crop} leaves it no frames: lengths {lengths}")
        if self._graphs is None or not self._graphs.applies_to(self.device):
            return 0
        if not self._cropping():
            crop = (0, 0)
        return self._graphs.prewarm([(batch, n, *crop) for n in lengths])

    @property
    def graph_shapes(self) -> list[tuple[int, int, int, int]]:
        """(batch, frames, left, right) of the graphs held now, least recently used first."""
        return [] if self._graphs is None else self._graphs.keys()

    def _drop_graphs(self) -> None:
        if self._graphs is not None:
            self._graphs.clear()
        self._graph_pool = None

    def _apply(self, fn: Any, recurse: bool = True) -> DACVAE:
        self._drop_graphs()  # the graphs would read the old tensors
        out = super()._apply(fn, recurse)
        if self._channels_last is not None:  # rebuilt on the moved / cast weights
            self.use_channels_last(True)
        return out

    def _capture_window(self, key: tuple[int, int, int, int]) -> WindowGraph:
        """Capture the decode of a (batch, codebook_dim, frames) window on CUDA, its samples from
        `left` frames in to `right` frames before its end."""
        batch, frames, left, right = key
        hop = self.hop_length
        device = self.device
        # Under no_grad with inference mode off: the static buffers are normal tensors, which replays
        # may fill in either mode, and Snake takes the in-place branch the eager no_grad decode takes.
        with torch.cuda.device(device), torch.inference_mode(False), torch.no_grad():
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            static_in = torch.zeros(batch, self.latent_channels, frames, device=device, dtype=self.dtype)
            keep = (*self.parameters(), *self.buffers())
            decode = functools.partial(self._decode_frames, keep=(left * hop, (frames - right) * hop))
            return capture_graph(decode, static_in, self._graph_pool, keep)

    # ---- encode

    def encode(self, wave: Tensor) -> Tensor:
        """Deterministic encode: (B, 1, N) audio at 48 kHz -> (B, ceil(N / hop), 32) posterior means.

        The wave is reflect-padded on the right to a multiple of the hop, as the
        reference does. Reflect padding needs more samples than it adds, so
        N <= hop / 2 (960 at 48 kHz) is refused with `InputError`.
        """
        if not isinstance(wave, Tensor) or wave.dim() != 3 or wave.shape[1] != 1:
            shape = tuple(wave.shape) if isinstance(wave, Tensor) else type(wave).__name__
            raise InputError(f"wave must be a (batch, 1, samples) tensor, got {shape}")
        if not wave.is_floating_point():
            raise InputError(f"wave must be a floating-point tensor, got {wave.dtype}")
        n = wave.shape[-1]
        pad = (-n) % self.hop_length
        if wave.shape[0] == 0 or n == 0 or pad >= n:
            raise InputError(
                f"wave of {n} samples is too short to encode: at least {self.hop_length // 2 + 1} samples "
                f"({(self.hop_length // 2 + 1) / self.sample_rate * 1000:.0f} ms) are needed"
            )
        if not bool(torch.isfinite(wave).all()):
            raise InputError("wave contains NaN or inf")
        x = wave.to(device=self.device, dtype=self.dtype)
        with torch.no_grad():
            if pad:
                x = nn.functional.pad(x, (0, pad), mode="reflect")
            mean = self.quantizer.mean(self.encoder(x))
        return mean.transpose(1, 2).float()


def _owned(out: Tensor, dtype: torch.dtype | None, copy: bool = True) -> Tensor:
    """A decode's samples, contiguous and in `dtype` (None: their own), in at most one kernel (the
    cast in the copy). `copy`: a graph's output, a view of the buffer the next replay overwrites,
    always copied; an eager decode's own tensor is returned as it is where it already fits."""
    if copy or (dtype is not None and dtype != out.dtype):
        return out.to(dtype or out.dtype, memory_format=torch.contiguous_format, copy=True)
    return out.contiguous()  # (`to` without a copy would leave a view as it is)
