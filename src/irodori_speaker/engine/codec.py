"""The DACVAE codec (Aratako/Semantic-DACVAE-Japanese-32dim) in plain PyTorch.

Only the paths Irodori-TTS uses are built: `decode` (32-dim latents at 25 Hz ->
48 kHz mono audio, watermark off) and the deterministic `encode` (audio ->
the posterior mean). Module and parameter names follow the reference
checkpoint's state_dict keys, so loading is a name-by-name match; weight norm
is folded into plain conv weights at load time.

Layout of the real checkpoint and the layers: `shared/specs/dacvae.md`.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..cancel import CancelToken, check
from ..errors import CheckpointError, InputError
from .fused import fused_available, run_or_fall_back
from .fused import snake as fused_snake

__all__ = [
    "DACVAE",
    "FULL_CODEC_KWARGS",
    "RECEPTIVE_FIELD_FRAMES",
    "TINY_CODEC_KWARGS",
    "CodecConfig",
    "Decoder",
    "DecoderBlock",
    "Encoder",
    "EncoderBlock",
    "OutputHead",
    "ResidualUnit",
    "Snake",
    "VAEBottleneck",
    "checkpoint_layout",
    "codec_from_state_dict",
    "convert_codec",
    "load_codec",
    "random_codec_state_dict",
    "save_random_codec_pth",
    "stream_window_lengths",
]

#: The released codec's hyper-parameters (`metadata.kwargs` of its weights.pth).
FULL_CODEC_KWARGS: dict[str, Any] = {
    "encoder_dim": 64,
    "encoder_rates": [2, 8, 10, 12],
    "latent_dim": 1024,
    "decoder_dim": 1536,
    "decoder_rates": [12, 10, 8, 2],
    "n_codebooks": 16,
    "codebook_size": 1024,
    "codebook_dim": 32,
    "quantizer_dropout": False,
    "sample_rate": 48000,
}

#: The small random test codec of `shared/fixtures/dacvae` (same rates, narrow channels).
TINY_CODEC_KWARGS: dict[str, Any] = {
    "encoder_dim": 4,
    "encoder_rates": [2, 8, 10, 12],
    "latent_dim": 64,
    "decoder_dim": 96,
    "decoder_rates": [12, 10, 8, 2],
    "n_codebooks": 16,
    "codebook_size": 1024,
    "codebook_dim": 32,
    "quantizer_dropout": False,
    "sample_rate": 48000,
}

#: An output sample of latent frame k depends on latent frames k-8 .. k+8 (see docs/codec.md).
RECEPTIVE_FIELD_FRAMES = 8

# Constructor arguments of the reference that create no tensors on the audio paths.
_IGNORED_KWARGS = {"n_codebooks", "codebook_size", "quantizer_dropout", "wm_rates"}
# The reference's defaults (DACVAE.__init__), used when a kwarg is absent.
_DEFAULT_KWARGS: dict[str, Any] = {
    "encoder_dim": 64,
    "encoder_rates": [2, 8, 10, 12],
    "latent_dim": None,
    "decoder_dim": 1536,
    "decoder_rates": [12, 10, 8, 2],
    "codebook_dim": 128,
    "sample_rate": 48000,
}
# Watermark branch of the reference (not built here; only needed to write real-format files).
_DEFAULT_WM_RATES = (8, 5, 4, 2)
_WM_HIDDEN = 512
_WM_LATENT = 128
_WM_CHANNELS = 32
_WM_NBITS = 16
_WM_DOWNSAMPLING = 3

_RESIDUAL_CONV_G = re.compile(r"\.block\.\d+\.block\.[13]\.weight_g$")

_FOLDED_FORMAT = "irodori-speaker/dacvae-folded"
_FOLDED_FORMAT_VERSION = "1"


# --------------------------------------------------------------------------- config


@dataclass(frozen=True)
class CodecConfig:
    """The hyper-parameters that shape the audio paths (from `metadata.kwargs`)."""

    encoder_dim: int
    encoder_rates: tuple[int, ...]
    latent_dim: int  # internal channels at the bottleneck (1024 in the real codec)
    decoder_dim: int
    decoder_rates: tuple[int, ...]
    codebook_dim: int  # the latent width Irodori sees (32)
    sample_rate: int

    @property
    def hop_length(self) -> int:
        return math.prod(self.encoder_rates)

    @property
    def decoder_out_dim(self) -> int:
        return self.decoder_dim // 2 ** len(self.decoder_rates)

    @classmethod
    def from_kwargs(cls, kwargs: Mapping[str, Any]) -> CodecConfig:
        """Validate reference constructor kwargs; raises `InputError` naming the bad entry."""
        if not isinstance(kwargs, Mapping):
            raise InputError(f"codec kwargs must be a mapping, got {type(kwargs).__name__}")
        unknown = sorted(set(kwargs) - set(_DEFAULT_KWARGS) - _IGNORED_KWARGS)
        if unknown:
            raise InputError(f"unknown codec kwargs: {', '.join(map(str, unknown))}")
        merged = {**_DEFAULT_KWARGS, **{k: v for k, v in kwargs.items() if k in _DEFAULT_KWARGS}}

        def positive_int(name: str) -> int:
            value = merged[name]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise InputError(f"codec kwarg {name} must be a positive integer, got {value!r}")
            return value

        def rates(name: str) -> tuple[int, ...]:
            value = merged[name]
            if (
                not isinstance(value, (list, tuple))
                or not value
                or any(isinstance(r, bool) or not isinstance(r, int) or r <= 0 for r in value)
            ):
                raise InputError(f"codec kwarg {name} must be a non-empty list of positive integers")
            return tuple(value)

        encoder_dim = positive_int("encoder_dim")
        encoder_rates = rates("encoder_rates")
        if merged["latent_dim"] is None:
            merged["latent_dim"] = encoder_dim * 2 ** len(encoder_rates)
        cfg = cls(
            encoder_dim=encoder_dim,
            encoder_rates=encoder_rates,
            latent_dim=positive_int("latent_dim"),
            decoder_dim=positive_int("decoder_dim"),
            decoder_rates=rates("decoder_rates"),
            codebook_dim=positive_int("codebook_dim"),
            sample_rate=positive_int("sample_rate"),
        )
        if cfg.decoder_dim % 2 ** len(cfg.decoder_rates):
            raise InputError(
                f"codec kwarg decoder_dim {cfg.decoder_dim} must be divisible by 2**{len(cfg.decoder_rates)}"
            )
        if math.prod(cfg.decoder_rates) != cfg.hop_length:
            raise InputError(
                f"codec decoder_rates {list(cfg.decoder_rates)} upsample by {math.prod(cfg.decoder_rates)}, "
                f"but encoder_rates {list(cfg.encoder_rates)} downsample by {cfg.hop_length}"
            )
        return cfg


# --------------------------------------------------------------------------- layers


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
        compute = torch.promote_types(x.dtype, torch.float32)
        alpha = self.alpha.to(compute)
        xc = x.to(compute)
        inv = (alpha + 1e-9).reciprocal()
        if torch.is_grad_enabled() and (xc.requires_grad or alpha.requires_grad):
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
        n = self.codebook_dim
        return nn.functional.conv1d(z, self.in_proj.weight[:n], self.in_proj.bias[:n])


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
        if h.is_cuda and type(conv) is nn.Conv1d:
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


# --------------------------------------------------------------------------- codec


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
        self._graphs: _GraphCache | None = None  # set by use_graphs
        self._graph_pool: Any = None  # the one CUDA memory pool all of this codec's graphs share

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

    def _check_latent(self, latent: Tensor) -> Tensor:
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
        if not bool(torch.isfinite(latent).all()):
            raise InputError("latent contains NaN or inf")
        return latent.to(device=self.device, dtype=self.dtype).transpose(1, 2)

    def _decode_frames(self, z: Tensor) -> Tensor:
        """(B, codebook_dim, T) in the codec dtype -> (B, 1, hop*T) float32."""
        return self.decoder(self.quantizer.out_proj(z)).float()

    def _decode_window(self, z: Tensor, a: int, b: int) -> Tensor:
        """Samples [a, b) of window `z`'s decode as a tensor of its own (a graph replay where one applies)."""
        run = None if self._graphs is None else self._graphs.runner(z)
        if run is None:
            return self._decode_frames(z)[:, :, a:b].contiguous()
        # the graph's output buffer is overwritten by the next replay: hand out a copy
        return run(z)[:, :, a:b].clone(memory_format=torch.contiguous_format)

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
    ) -> Iterator[Tensor]:
        """Yield (B, 1, hop*n) audio chunks of `chunk_frames` latent frames each, in order.

        Each chunk is decoded with up to `context_frames` extra frames on both
        sides and the context's audio discarded; with the default 8 (the
        receptive field) the concatenation equals `decode`. `first_chunk_frames`
        makes the first chunk shorter (first audio sooner) without paying the
        context overhead of small chunks for the rest. `cancel` is checked
        before each chunk (`Cancelled`). Arguments are checked on the call, not
        on the first `next()`. With `use_graphs`, `stream_window_lengths` gives
        the window lengths to pass to `prewarm_graphs`.
        """
        z = self._check_latent(latent)
        windows = _chunk_windows(z.shape[-1], chunk_frames, context_frames, first_chunk_frames)
        return self._stream(z, windows, cancel)

    def _stream(
        self, z: Tensor, windows: list[tuple[int, int, int, int]], cancel: CancelToken | None
    ) -> Iterator[Tensor]:
        hop = self.hop_length
        for lo, start, end, hi in windows:
            check(cancel)
            # no_grad is entered and left around each chunk: a mode held across `yield`
            # would leak into the consumer's code.
            with torch.no_grad():
                piece = self._decode_window(z[:, :, lo:hi], (start - lo) * hop, (end - lo) * hop)
            yield piece

    def decode_chunked(
        self, latent: Tensor, chunk_frames: int, context_frames: int = RECEPTIVE_FIELD_FRAMES
    ) -> Tensor:
        """`decode` in chunks (bounded peak memory); equal to `decode` with the default context."""
        z = self._check_latent(latent)
        windows = _chunk_windows(z.shape[-1], chunk_frames, context_frames)
        out = torch.empty(z.shape[0], 1, z.shape[-1] * self.hop_length, device=z.device)
        pos = 0
        for piece in self._stream(z, windows, None):
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
        _check_int("max_graphs", max_graphs, 1)
        _check_int("max_frames", max_frames, 1)
        if capture_on_use is not None:
            _check_int("capture_on_use", capture_on_use, 1)
        self._drop_graphs()
        self._graphs = None
        if enabled:
            self._graphs = _GraphCache(
                self._capture_window, max_graphs, capture_on_use=capture_on_use, max_frames=max_frames
            )

    def prewarm_graphs(self, lengths: Iterable[int], batch: int = 1) -> int:
        """Capture graphs for windows of these frame counts now and keep them; returns how many are new.

        Returns 0 without capturing when graphs are off or the codec is not on CUDA.
        Raises `InputError` if more shapes would be kept than `max_graphs`.
        """
        lengths = list(lengths)
        _check_int("batch", batch, 1)
        for n in lengths:
            _check_int("window length", n, 1)
        if self._graphs is None or not self._graphs.applies_to(self.device):
            return 0
        return self._graphs.prewarm([(batch, n) for n in lengths])

    @property
    def graph_shapes(self) -> list[tuple[int, int]]:
        """(batch, frames) of the graphs held now, least recently used first."""
        return [] if self._graphs is None else self._graphs.keys()

    def _drop_graphs(self) -> None:
        if self._graphs is not None:
            self._graphs.clear()
        self._graph_pool = None

    def _apply(self, fn: Any, recurse: bool = True) -> DACVAE:
        self._drop_graphs()  # the graphs would read the old tensors
        return super()._apply(fn, recurse)

    def _capture_window(self, key: tuple[int, int]) -> _WindowGraph:
        """Capture the decode of a (batch, codebook_dim, frames) window on CUDA."""
        batch, frames = key
        device = self.device
        # Under no_grad with inference mode off: the static buffers are normal tensors, which replays
        # may fill in either mode, and Snake takes the in-place branch the eager no_grad decode takes.
        with torch.cuda.device(device), torch.inference_mode(False), torch.no_grad():
            if self._graph_pool is None:
                self._graph_pool = torch.cuda.graph_pool_handle()
            static_in = torch.zeros(batch, self.latent_channels, frames, device=device, dtype=self.dtype)
            # Warm up on a side stream first (cuDNN algorithm choice, cuBLAS handles) so none of
            # that setup lands in the capture.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._decode_frames(static_in)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._graph_pool):
                static_out = self._decode_frames(static_in)
        return _WindowGraph(graph, static_in, static_out, (*self.parameters(), *self.buffers()))

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


def _check_int(name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InputError(f"{name} must be an integer >= {least}, got {value!r}")


def _stream_args(chunk_frames: int, context_frames: int, first_chunk_frames: int | None) -> int:
    """Check a stream's arguments; returns the first chunk's frames."""
    first = chunk_frames if first_chunk_frames is None else first_chunk_frames
    _check_int("chunk_frames", chunk_frames, 1)
    _check_int("context_frames", context_frames, 0)
    _check_int("first_chunk_frames", first, 1)
    return first


def _chunk_windows(
    frames: int, chunk_frames: int, context_frames: int, first_chunk_frames: int | None = None
) -> list[tuple[int, int, int, int]]:
    """(lo, start, end, hi) per chunk: emit frames [start, end), decode [lo, hi).

    The last window of a line reaches back further left when it is shorter than a middle window
    (more context than needed changes nothing), so it has the middle windows' length and reuses
    their CUDA graph instead of running eagerly.
    """
    first = _stream_args(chunk_frames, context_frames, first_chunk_frames)
    middle = chunk_frames + 2 * context_frames
    windows, start = [], 0
    while start < frames:
        end = min(start + (first if start == 0 else chunk_frames), frames)
        lo, hi = max(0, start - context_frames), min(frames, end + context_frames)
        if start > 0 and end == frames and hi - lo < middle:
            lo = max(0, hi - middle)
        windows.append((lo, start, end, hi))
        start = end
    return windows


def stream_window_lengths(
    chunk_frames: int, context_frames: int = RECEPTIVE_FIELD_FRAMES, first_chunk_frames: int | None = None
) -> list[int]:
    """The window lengths (frames) `decode_stream` decodes with these arguments, for `prewarm_graphs`.

    In order, without repeats: the first window, any next ones still cut short
    by the line's start, and the middle windows (`chunk_frames + 2 * context_frames`).
    A line's last window is stretched to the middle length when the line is long
    enough (see `_chunk_windows`); left out: lines too short for that. `decode_chunked(latent, n)`
    uses the windows of `decode_stream(latent, n)`.
    """
    first = _stream_args(chunk_frames, context_frames, first_chunk_frames)
    # long enough to reach the middle windows with the line's end still out of reach
    frames = first + chunk_frames * (context_frames + 2) + context_frames
    windows = _chunk_windows(frames, chunk_frames, context_frames, first_chunk_frames)
    return list(dict.fromkeys(hi - lo for lo, _, end, hi in windows if end + context_frames <= frames))


# --------------------------------------------------------------------------- CUDA graphs

_GraphKey = tuple[int, int]  # (batch, window frames)
_MAX_TRACKED_SHAPES = 64  # ungraphed shapes whose uses are counted (the oldest are forgotten)


class _WindowGraph:
    """One captured window decode; its output buffer is overwritten by its next replay."""

    def __init__(self, graph: Any, static_in: Tensor, static_out: Tensor, keep: tuple[Tensor, ...]) -> None:
        self.graph = graph
        self.static_in = static_in
        self.static_out = static_out
        self._keep = keep  # the weights a replay reads: alive as long as the graph, even if modules change

    def __call__(self, z: Tensor) -> Tensor:
        self.static_in.copy_(z)
        self.graph.replay()
        return self.static_out


class _GraphCache:
    """Which window shapes get a graph, and the graphs (LRU); CUDA lives only in `capture`.

    `capture(key)` returns a runner `run(z) -> audio` whose result stays valid
    until the next replay (the caller copies it out). All graphs share one
    memory pool: they replay one at a time and each output is copied out before
    the next replay, so the pool holds about one window decode's activations.
    Prewarmed keys are pinned: lazily captured graphs never evict them.
    """

    def __init__(
        self,
        capture: Callable[[_GraphKey], Callable[[Tensor], Tensor]],
        max_graphs: int,
        *,
        capture_on_use: int | None = 2,
        max_frames: int = 128,
        device_types: tuple[str, ...] = ("cuda",),
    ) -> None:
        self.capture = capture
        self.max_graphs = max_graphs
        self.capture_on_use = capture_on_use
        self.max_frames = max_frames
        self.device_types = device_types
        self.captures = 0  # graphs captured so far, evicted ones included
        self._graphs: OrderedDict[_GraphKey, Callable[[Tensor], Tensor]] = OrderedDict()
        self._pinned: set[_GraphKey] = set()
        self._uses: OrderedDict[_GraphKey, int] = OrderedDict()  # eager decodes of ungraphed shapes

    def applies_to(self, device: torch.device) -> bool:
        return device.type in self.device_types

    def keys(self) -> list[_GraphKey]:
        return list(self._graphs)

    def clear(self) -> None:
        self._graphs.clear()
        self._pinned.clear()
        self._uses.clear()

    def prewarm(self, keys: Iterable[_GraphKey]) -> int:
        """Capture (if missing) and pin these keys; returns how many were captured."""
        new = [k for k in dict.fromkeys(keys) if k not in self._pinned]
        if len(self._pinned) + len(new) > self.max_graphs:
            raise InputError(
                f"prewarming {len(self._pinned) + len(new)} window shapes, more than "
                f"max_graphs={self.max_graphs} (see use_graphs)"
            )
        captured = 0
        for key in new:
            self._pinned.add(key)
            if key in self._graphs:
                self._graphs.move_to_end(key)
            else:
                self._add(key)
                captured += 1
        return captured

    def runner(self, z: Tensor) -> Callable[[Tensor], Tensor] | None:
        """The graph for `z`'s shape, captured now if the policy says so; None: decode eagerly."""
        if not self.applies_to(z.device):
            return None
        key = (z.shape[0], z.shape[-1])
        run = self._graphs.get(key)
        if run is not None:
            self._graphs.move_to_end(key)
            return run
        if self.capture_on_use is None or key[1] > self.max_frames:
            return None
        uses = self._uses.pop(key, 0) + 1
        if uses < self.capture_on_use:
            self._uses[key] = uses
            if len(self._uses) > _MAX_TRACKED_SHAPES:
                self._uses.popitem(last=False)
            return None
        if len(self._graphs) >= self.max_graphs and self._victim() is None:
            return None  # every slot holds a prewarmed graph
        return self._add(key)

    def _victim(self) -> _GraphKey | None:
        return next((k for k in self._graphs if k not in self._pinned), None)

    def _add(self, key: _GraphKey) -> Callable[[Tensor], Tensor]:
        # capture before evicting, so the shared pool always has a live graph (torch releases a pool
        # whose graphs are all gone; capturing into its id again is not something to rely on)
        run = self._graphs[key] = self.capture(key)
        self.captures += 1
        while len(self._graphs) > self.max_graphs:
            del self._graphs[self._victim()]
        return run


# --------------------------------------------------------------------------- checkpoints


def _is_watermark_only(key: str, cfg: CodecConfig) -> bool:
    """Tensors of the reference's watermark branch: accepted in a checkpoint and ignored."""
    m = re.match(r"decoder\.model\.(\d+)\.block\.(\d+)\.", key)
    if m:
        return 1 <= int(m.group(1)) <= len(cfg.decoder_rates) and m.group(2) in {"3", "6", "7", "11"}
    return key.startswith("decoder.wm_model.") and not key.startswith(
        ("decoder.wm_model.encoder_block.pre.0.", "decoder.wm_model.encoder_block.pre.1.")
    )


def _expected_tensors(cfg: CodecConfig) -> dict[str, tuple[tuple[int, ...], bool]]:
    """Our parameter name -> (shape, is a weight-normed conv weight in the reference)."""
    model = DACVAE.from_kwargs(_config_kwargs(cfg), device="meta")
    expected = {}
    for mod_name, module in model.named_modules():
        for p_name, p in module.named_parameters(recurse=False):
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            is_conv_weight = isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)) and p_name == "weight"
            expected[name] = (tuple(p.shape), is_conv_weight)
    return expected


def _config_kwargs(cfg: CodecConfig) -> dict[str, Any]:
    return {
        "encoder_dim": cfg.encoder_dim,
        "encoder_rates": list(cfg.encoder_rates),
        "latent_dim": cfg.latent_dim,
        "decoder_dim": cfg.decoder_dim,
        "decoder_rates": list(cfg.decoder_rates),
        "codebook_dim": cfg.codebook_dim,
        "sample_rate": cfg.sample_rate,
    }


def _fold_weight_norm(g: Tensor, v: Tensor) -> Tensor:
    """W = g * v / ||v||, the norm over every dim but dim 0, no epsilon (legacy weight_norm, dim=0)."""
    v = v.float()
    norm = v.norm(dim=tuple(range(1, v.dim())), keepdim=True)
    return v * (g.float() / norm)


def _shape(t: Tensor) -> list[int]:
    return list(t.shape)


def _used_weights(state: Mapping[str, Any], cfg: CodecConfig, source: str) -> dict[str, Tensor]:
    """Strict name-by-name match: the plain (folded) fp32 weights of the audio paths."""
    out: dict[str, Tensor] = {}
    consumed: set[str] = set()

    def tensor(key: str, shape: tuple[int, ...]) -> Tensor:
        t = state.get(key)
        if t is None:
            raise CheckpointError(f"{source}: missing tensor {key} (expected shape {list(shape)})")
        if not isinstance(t, Tensor) or not t.is_floating_point():
            what = t.dtype if isinstance(t, Tensor) else type(t).__name__
            raise CheckpointError(f"{source}: tensor {key} is not floating point ({what})")
        if tuple(t.shape) != shape:
            raise CheckpointError(f"{source}: tensor {key} has shape {_shape(t)}, expected {list(shape)}")
        consumed.add(key)
        return t

    for name, (shape, weight_normed) in _expected_tensors(cfg).items():
        if weight_normed:
            prefix = name[: -len("weight")]
            has_gv = prefix + "weight_g" in state or prefix + "weight_v" in state
            if has_gv and name in state:
                raise CheckpointError(f"{source}: both {name} and {prefix}weight_g/_v are present")
            if has_gv:
                v = tensor(prefix + "weight_v", shape)
                g = tensor(prefix + "weight_g", (shape[0], 1, 1))
                w = _fold_weight_norm(g, v)
            else:
                if name not in state:
                    raise CheckpointError(
                        f"{source}: missing tensor {prefix}weight_g / {prefix}weight_v "
                        f"(weight-normed conv, weight shape {list(shape)})"
                    )
                w = tensor(name, shape).float()
        else:
            w = tensor(name, shape).float()
        if not bool(torch.isfinite(w).all()):
            raise CheckpointError(f"{source}: tensor {name} contains NaN or inf (a zero weight_v row?)")
        out[name] = w.contiguous()

    unknown = sorted(k for k in state if k not in consumed and not _is_watermark_only(k, cfg))
    if unknown:
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise CheckpointError(
            f"{source}: unexpected tensors {', '.join(unknown[:5])}{more}: "
            "the checkpoint does not match its kwargs or is not a DACVAE codec"
        )
    return out


def _read_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(raw state_dict, kwargs, format) of a weights.pth or a converted safetensors file."""
    p = Path(path)
    source = f"codec checkpoint {p}"
    if not p.is_file():
        raise CheckpointError(f"{source} not found (or not a file)")
    size = p.stat().st_size
    with p.open("rb") as f:
        head = f.read(16)
    if size == 0:
        raise CheckpointError(f"{source} is empty")
    if head[:2] == b"\x1f\x8b":
        raise CheckpointError(f"{source} is gzip-compressed", hint="gunzip it first")
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":  # torch.save: zip or legacy pickle
        return _read_torch_checkpoint(p, source)
    if len(head) >= 9 and head[8:9] == b"{":
        header_len = int.from_bytes(head[:8], "little")
        if 8 + header_len > size:
            raise CheckpointError(f"{source} is a truncated safetensors file (header runs past the end)")
        return _read_safetensors_checkpoint(p, source)
    raise CheckpointError(f"{source} is neither a torch.save file (weights.pth) nor a safetensors file")


def _read_torch_checkpoint(p: Path, source: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    try:
        # an open file, not the path: torch.load dispatches on the name's extension
        with p.open("rb") as f:
            obj = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, ... on bad files
        raise CheckpointError(
            f"{source} cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
            hint="the file is truncated or corrupt; download it again",
        ) from exc
    if not isinstance(obj, dict) or not isinstance(obj.get("state_dict"), dict):
        raise CheckpointError(f"{source} has no 'state_dict' dict: not a DACVAE weights.pth")
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("kwargs"), dict):
        raise CheckpointError(f"{source} has no metadata.kwargs: not a DACVAE weights.pth")
    return obj["state_dict"], metadata["kwargs"], "pth"


def _read_safetensors_checkpoint(p: Path, source: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    from safetensors import safe_open

    try:
        with safe_open(str(p), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except Exception as exc:  # SafetensorError and friends
        raise CheckpointError(
            f"{source} cannot be read as safetensors ({type(exc).__name__}: {str(exc)[:200]})",
            hint="the file is truncated or corrupt; convert it again",
        ) from exc
    if "kwargs" not in metadata:
        raise CheckpointError(f"{source} has no 'kwargs' metadata: not a converted codec file")
    try:
        kwargs = json.loads(metadata["kwargs"])
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{source}: its 'kwargs' metadata is not JSON ({exc})") from exc
    if not isinstance(kwargs, dict):
        raise CheckpointError(f"{source}: its 'kwargs' metadata is not a JSON object")
    return state, kwargs, "safetensors"


def _config_for(kwargs: Mapping[str, Any], source: str) -> CodecConfig:
    try:
        return CodecConfig.from_kwargs(kwargs)
    except InputError as exc:
        raise CheckpointError(f"{source}: {exc}") from exc


def _check_dtype(dtype: torch.dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InputError(f"codec dtype must be a floating-point torch.dtype, got {dtype!r}")


def codec_from_state_dict(
    state_dict: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    source: str = "codec state_dict",
) -> DACVAE:
    """Build a ready (eval, no grad) codec from a reference-format or folded state_dict."""
    _check_dtype(dtype)
    cfg = _config_for(kwargs, source)
    weights = _used_weights(state_dict, cfg, source)
    with torch.device("meta"):
        model = DACVAE(cfg)
    model.load_state_dict(weights, strict=True, assign=True)
    model.to(device=device, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    return model


def load_codec(
    path: str | os.PathLike[str], *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> DACVAE:
    """Load the real `weights.pth` or a file written by `convert_codec` (told apart by content)."""
    _check_dtype(dtype)
    state, kwargs, _ = _read_checkpoint(path)
    return codec_from_state_dict(state, kwargs, device=device, dtype=dtype, source=f"codec checkpoint {path}")


def convert_codec(src_pth: str | os.PathLike[str], dst_safetensors: str | os.PathLike[str]) -> Path:
    """Write the audio-path tensors of `src_pth` with weight norm folded to a safetensors file.

    The result loads with `load_codec` without pickle and about 14% smaller
    (no watermark weights). Written to a temporary name, then renamed.
    """
    from safetensors.torch import save_file

    source = f"codec checkpoint {src_pth}"
    state, kwargs, _ = _read_checkpoint(src_pth)
    weights = _used_weights(state, _config_for(kwargs, source), source)
    dst = Path(dst_safetensors)
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    metadata = {
        "format": _FOLDED_FORMAT,
        "format_version": _FOLDED_FORMAT_VERSION,
        "kwargs": json.dumps(kwargs, sort_keys=True),
    }
    try:
        save_file(weights, str(tmp), metadata=metadata)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dst


# --------------------------------------------------------------------------- random checkpoints


def checkpoint_layout(
    kwargs: Mapping[str, Any] | None = None, *, watermark: bool = True
) -> dict[str, list[int]]:
    """Every tensor name -> shape of a reference-format `weights.pth` for these kwargs.

    Weight-normed convs appear as `weight_g` / `weight_v`; with `watermark`, the
    reference's watermark-branch tensors too (their shapes follow the reference:
    `wm_rates` default (8, 5, 4, 2), 512-wide LSTMs).
    """
    kwargs = copy.deepcopy(dict(TINY_CODEC_KWARGS if kwargs is None else kwargs))
    cfg = CodecConfig.from_kwargs(kwargs)
    layout: dict[str, list[int]] = {}
    for name, (shape, weight_normed) in _expected_tensors(cfg).items():
        if weight_normed:
            prefix = name[: -len("weight")]
            layout[prefix + "weight_g"] = [shape[0], 1, 1]
            layout[prefix + "weight_v"] = list(shape)
        else:
            layout[name] = list(shape)
    if not watermark:
        return layout
    wm_rates = tuple(kwargs.get("wm_rates") or _DEFAULT_WM_RATES)
    for i, wm_stride in enumerate(wm_rates[: len(cfg.decoder_rates)]):
        cin = cfg.decoder_dim // 2**i // _WM_DOWNSAMPLING
        cout = cfg.decoder_dim // 2 ** (i + 1) // _WM_DOWNSAMPLING
        hidden = cout // 2
        b = f"decoder.model.{i + 1}.block"
        layout[f"{b}.3.weight"] = [cin, cout, 2 * wm_stride]  # ConvTranspose1d cin -> cout
        layout[f"{b}.3.bias"] = [cout]
        for unit in (6, 7):  # ELU residual units, compress 2
            layout[f"{b}.{unit}.block.1.weight"] = [hidden, cout, 3]
            layout[f"{b}.{unit}.block.1.bias"] = [hidden]
            layout[f"{b}.{unit}.block.3.weight"] = [cout, hidden, 1]
            layout[f"{b}.{unit}.block.3.bias"] = [cout]
        layout[f"{b}.11.weight"] = [cin, cout, 2 * wm_stride]  # Conv1d cout -> cin
        layout[f"{b}.11.bias"] = [cin]
    wm = "decoder.wm_model"
    gates = 4 * _WM_HIDDEN
    lstm = {}
    for layer in (0, 1):
        lstm |= {
            f"weight_ih_l{layer}": [gates, _WM_HIDDEN],
            f"weight_hh_l{layer}": [gates, _WM_HIDDEN],
            f"bias_ih_l{layer}": [gates],
            f"bias_hh_l{layer}": [gates],
        }
    layout[f"{wm}.encoder_block.pre.3.weight"] = [_WM_CHANNELS, 1, 7]
    layout[f"{wm}.encoder_block.pre.3.bias"] = [_WM_CHANNELS]
    layout |= {f"{wm}.encoder_block.post.0.lstm.{k}": v for k, v in lstm.items()}
    layout[f"{wm}.encoder_block.post.2.weight"] = [_WM_LATENT, _WM_HIDDEN, 7]
    layout[f"{wm}.encoder_block.post.2.bias"] = [_WM_LATENT]
    layout[f"{wm}.msg_processor.msg_processor.weight"] = [2 * _WM_NBITS, _WM_LATENT]
    layout[f"{wm}.decoder_block.pre.0.weight"] = [_WM_HIDDEN, _WM_LATENT, 7]
    layout[f"{wm}.decoder_block.pre.0.bias"] = [_WM_HIDDEN]
    layout |= {f"{wm}.decoder_block.pre.1.lstm.{k}": v for k, v in lstm.items()}
    layout[f"{wm}.decoder_block.post.1.weight"] = [1, _WM_CHANNELS, 7]
    layout[f"{wm}.decoder_block.post.1.bias"] = [1]
    return layout


def random_codec_state_dict(
    kwargs: Mapping[str, Any] | None = None, seed: int = 0, *, watermark: bool = True
) -> dict[str, Tensor]:
    """A random reference-format state_dict (legacy weight-norm keys; watermark tensors zero).

    Scaled so activations stay in a sane range (decoded noise has std ~0.13,
    unsaturated): folded conv rows have norm ~1 (~0.3 inside residual units),
    Snake alphas in [0.5, 1.5], small biases.
    """
    kwargs = TINY_CODEC_KWARGS if kwargs is None else kwargs
    cfg = CodecConfig.from_kwargs(kwargs)
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, Tensor] = {}
    for key, shape in checkpoint_layout(kwargs, watermark=watermark).items():
        if _is_watermark_only(key, cfg):
            state[key] = torch.zeros(shape)
        elif key.endswith(".alpha"):
            state[key] = 0.5 + torch.rand(shape, generator=gen)
        elif key.endswith(".weight_g"):
            # residual branches at 0.3 keep activations ~1 deep into the decoder (at 1 the
            # output saturates: 90% of samples at |x| > 0.9)
            scale = 0.3 if _RESIDUAL_CONV_G.search(key) else 1.0
            state[key] = scale * (0.8 + 0.4 * torch.rand(shape, generator=gen))
        elif key.endswith(".weight_v"):
            state[key] = torch.randn(shape, generator=gen)
        else:
            state[key] = 0.01 * torch.randn(shape, generator=gen)
    return state


def save_random_codec_pth(
    path: str | os.PathLike[str],
    kwargs: Mapping[str, Any] | None = None,
    seed: int = 0,
    *,
    watermark: bool = True,
) -> Path:
    """Write a random codec in the real `weights.pth` container (default: `TINY_CODEC_KWARGS`).

    `watermark=False` leaves out the (zero, ignored) watermark tensors: the tiny
    file shrinks from ~39 MB to ~1.6 MB.
    """
    kwargs = copy.deepcopy(dict(TINY_CODEC_KWARGS if kwargs is None else kwargs))
    state = random_codec_state_dict(kwargs, seed, watermark=watermark)
    p = Path(path)
    torch.save({"state_dict": state, "metadata": {"kwargs": kwargs}}, p)
    return p
