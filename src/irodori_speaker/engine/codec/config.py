"""The codec's hyper-parameters: the reference constructor's kwargs, checked, as a `CodecConfig`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...audio.signal import SAMPLE_RATE
from ...errors import InputError

__all__ = ["FULL_CODEC_KWARGS", "TINY_CODEC_KWARGS", "CodecConfig"]

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
    "sample_rate": SAMPLE_RATE,
}

#: The small random test codec of `tests/data/dacvae` (same rates, narrow channels).
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
    "sample_rate": SAMPLE_RATE,
}

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
    "sample_rate": SAMPLE_RATE,
}


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
        if cfg.sample_rate != SAMPLE_RATE:
            raise InputError(
                f"codec sample_rate is {cfg.sample_rate} Hz; irodori-speaker works at {SAMPLE_RATE} Hz"
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
