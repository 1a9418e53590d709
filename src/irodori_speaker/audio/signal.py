"""Audio helpers: the sample rate, read, downmix, resample (whole or streamed), measure and
normalise loudness, limit peaks.

`SAMPLE_RATE` is the one rate of the package: the codec's, the synthesizer's and every
default output's. `resample` and `StreamResampler` are its one resampler (soxr, quality HQ);
no other module calls soxr.

Arrays are float32, shaped (samples,) for mono or (samples, channels). The
reference-voice front end (`prepare_reference`) chains them into what the
codec's encoder expects: mono, 48 kHz, -16 LUFS (ITU-R BS.1770), peak <= 1,
at most 30 s. Playback reuses the same functions.

Decisions (see docs/codec.md):
- NaN or inf samples raise `AudioError` (nothing is silently cleaned).
- Silence (loudness -inf: every 0.4 s block under the -70 LUFS gate) is left
  unchanged by `normalize_loudness`; `prepare_reference` rejects it.
- A signal shorter than one 0.4 s gating block is measured as if repeated to
  fill one block, so short clips still get a sensible loudness.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import soxr

from ..errors import AudioError, InputError

__all__ = [
    "REFERENCE_LUFS",
    "REFERENCE_MAX_SECONDS",
    "SAMPLE_RATE",
    "StreamResampler",
    "loudness_lufs",
    "normalize_loudness",
    "peak_limit",
    "prepare_reference",
    "read_audio",
    "resample",
    "to_mono",
]

SAMPLE_RATE = 48_000  # Hz: what the codec decodes, the synthesizer returns and outputs default to
_QUALITY = "HQ"  # soxr's default, and what every caller used
REFERENCE_LUFS = -16.0
REFERENCE_MAX_SECONDS = 30.0

_BLOCK_SECONDS = 0.4  # BS.1770 gating block
_MAX_CHANNELS = 64  # more than this almost always means a (channels, samples) array


def read_audio(path: str | os.PathLike[str]) -> tuple[np.ndarray, int]:
    """Read any file soundfile (libsndfile) decodes -> (float32 (samples, channels), sample rate)."""

    p = Path(path)
    if not p.exists():
        raise AudioError(f"audio file not found: {p}")
    if not p.is_file():
        raise AudioError(f"not an audio file (a directory?): {p}")
    try:
        data, sr = sf.read(str(p), dtype="float32", always_2d=True)
    except Exception as exc:  # LibsndfileError, RuntimeError, TypeError on odd headers
        raise AudioError(
            f"cannot read audio file {p}: {str(exc).strip()[:200]}",
            hint="use a WAV, FLAC, OGG or MP3 file",
        ) from exc
    if data.shape[0] == 0:
        raise AudioError(f"audio file {p} contains no samples")
    return np.ascontiguousarray(data, dtype=np.float32), int(sr)


def _as_audio(x: object, what: str = "audio") -> np.ndarray:
    """Validate an audio array and return it as float32 (integer PCM is scaled to [-1, 1))."""
    if not isinstance(x, np.ndarray):
        raise InputError(f"{what} must be a numpy array, got {type(x).__name__}")
    if x.ndim not in (1, 2):
        raise InputError(f"{what} must be shaped (samples,) or (samples, channels), got {x.shape}")
    if x.ndim == 2 and x.shape[1] > _MAX_CHANNELS:
        raise InputError(
            f"{what} has {x.shape[1]} channels: pass (samples, channels), not (channels, samples)"
        )
    if x.dtype.kind in "iu":
        bits = x.dtype.itemsize * 8
        offset = 2 ** (bits - 1) if x.dtype.kind == "u" else 0
        return ((x.astype(np.float64) - offset) / 2 ** (bits - 1)).astype(np.float32)
    if x.dtype.kind != "f":
        raise InputError(f"{what} must hold floating-point or integer samples, got {x.dtype}")
    return x.astype(np.float32, copy=False)


def _check_finite(x: np.ndarray, what: str = "audio") -> None:
    if not np.isfinite(x).all():
        bad = int(np.size(x) - np.count_nonzero(np.isfinite(x)))
        raise AudioError(f"{what} contains {bad} NaN or inf samples")


def _check_rate(sr: object, name: str = "sample rate") -> int:
    if isinstance(sr, bool) or not isinstance(sr, (int, np.integer)) or sr <= 0:
        raise InputError(f"{name} must be a positive integer, got {sr!r}")
    return int(sr)


def to_mono(x: np.ndarray) -> np.ndarray:
    """Downmix (samples, channels) to (samples,) by averaging channels; mono passes through."""
    x = _as_audio(x)
    if x.ndim == 1:
        return x.copy()
    return x.mean(axis=1, dtype=np.float64).astype(np.float32)


def resample(audio: np.ndarray, from_hz: int, to_hz: int) -> np.ndarray:
    """Resample mono (samples,) or multichannel (samples, channels) audio with soxr (HQ).

    Equal rates return a float32 copy. Output length is about
    len(audio) * to_hz / from_hz (soxr rounds it).
    """
    x = _as_audio(audio)
    from_hz, to_hz = _check_rate(from_hz, "from_hz"), _check_rate(to_hz, "to_hz")
    _check_finite(x)
    if from_hz == to_hz or x.shape[0] == 0:
        return x.copy()
    y = soxr.resample(np.ascontiguousarray(x), from_hz, to_hz, quality=_QUALITY)
    return np.asarray(y, dtype=np.float32)


class StreamResampler:
    """`resample` chunk by chunk, for audio that arrives in pieces: `feed` each chunk, `flush`
    once at the end for the filter's tail. The concatenated output equals `resample` of the
    whole (to float rounding) however the audio was cut. Equal rates pass chunks through (copied).

    Chunks are float32 (samples,) for one channel, (samples, channels) for more; they are not
    checked (a hot path: the caller's audio is the synthesizer's).
    """

    def __init__(self, from_hz: int, to_hz: int, channels: int = 1) -> None:
        self.from_hz, self.to_hz = _check_rate(from_hz, "from_hz"), _check_rate(to_hz, "to_hz")
        self.channels = channels
        self._stream: Any = None
        if self.from_hz != self.to_hz:
            self._stream = soxr.ResampleStream(
                self.from_hz, self.to_hz, channels, dtype="float32", quality=_QUALITY
            )

    def feed(self, chunk: np.ndarray) -> np.ndarray:
        """The resampled audio this chunk completes (may be shorter than its share, or empty)."""
        x = np.ascontiguousarray(chunk, dtype=np.float32)
        if self._stream is None:
            return x.copy() if x is chunk else x
        return np.asarray(self._stream.resample_chunk(x), dtype=np.float32)

    def flush(self) -> np.ndarray:
        """The rest of the stream (the filter's tail); the resampler is then ready for a new one."""
        empty = np.zeros((0, self.channels) if self.channels > 1 else 0, dtype=np.float32)
        if self._stream is None:
            return empty
        tail = np.asarray(self._stream.resample_chunk(empty, last=True), dtype=np.float32)
        self._stream.clear()
        return tail

    def reset(self) -> None:
        """Drop what is buffered (an abandoned stream), ready for a new one."""
        if self._stream is not None:
            self._stream.clear()


def _fill_one_block(x: np.ndarray, sr: int) -> np.ndarray:
    """Repeat a signal shorter than one gating block until it fills one."""
    need = math.ceil(_BLOCK_SECONDS * sr)
    if x.shape[0] >= need:
        return x
    reps = math.ceil(need / x.shape[0])
    tiled = np.tile(x, (reps,) + (1,) * (x.ndim - 1))
    return tiled[:need]


def loudness_lufs(x: np.ndarray, sr: int) -> float:
    """Integrated loudness (ITU-R BS.1770-4, K-weighted, gated) in LUFS via pyloudnorm.

    Multichannel input (up to 5 channels, BS.1770 order L, R, C, Ls, Rs) is
    measured as such. Silence gives -inf. Signals shorter than 0.4 s are
    measured as if repeated to fill one block.
    """
    import pyloudnorm

    x = _as_audio(x)
    sr = _check_rate(sr)
    if x.shape[0] == 0:
        raise AudioError("cannot measure the loudness of empty audio")
    if x.ndim == 2 and x.shape[1] > 5:
        raise InputError(f"loudness is defined for up to 5 channels, got {x.shape[1]}; downmix first")
    _check_finite(x)
    meter = pyloudnorm.Meter(sr, block_size=_BLOCK_SECONDS)
    return float(meter.integrated_loudness(_fill_one_block(x.astype(np.float64), sr)))


def normalize_loudness(x: np.ndarray, sr: int, target_lufs: float = REFERENCE_LUFS) -> np.ndarray:
    """Scale to `target_lufs` integrated loudness. Silence (-inf LUFS) is returned unchanged.

    The result may exceed [-1, 1]; follow with `peak_limit`.
    """
    if not math.isfinite(target_lufs):
        raise InputError(f"target_lufs must be finite, got {target_lufs!r}")
    x = _as_audio(x)
    loudness = loudness_lufs(x, sr)
    if not math.isfinite(loudness):
        return x.copy()
    gain = 10.0 ** ((target_lufs - loudness) / 20.0)
    return (x.astype(np.float64) * gain).astype(np.float32)


def peak_limit(x: np.ndarray, peak: float = 1.0) -> np.ndarray:
    """Divide by the peak (times `peak`) when the absolute peak exceeds `peak`; else unchanged."""
    if not (isinstance(peak, (int, float)) and math.isfinite(peak) and peak > 0):
        raise InputError(f"peak must be a positive number, got {peak!r}")
    x = _as_audio(x)
    _check_finite(x)
    current = float(np.max(np.abs(x))) if x.size else 0.0
    if current <= peak:
        return x.copy()
    return (x.astype(np.float64) / current * peak).astype(np.float32)


def prepare_reference(
    path_or_array: str | os.PathLike[str] | np.ndarray,
    sr: int | None = None,
    max_seconds: float = REFERENCE_MAX_SECONDS,
) -> tuple[np.ndarray, list[str]]:
    """A reference voice as the codec's encoder wants it -> (float32 mono 48 kHz, warnings).

    Downmix to mono, cut to `max_seconds` (warning), resample to 48 kHz,
    normalise to -16 LUFS, then peak-limit to 1 (warning when that leaves it
    quieter than -16 LUFS). A file carries its own rate; an array needs `sr`.
    Raises `AudioError` for unreadable, empty, non-finite or silent audio.
    """
    warnings: list[str] = []
    if isinstance(path_or_array, (str, os.PathLike)):
        if sr is not None:
            raise InputError("sr is only for arrays: an audio file carries its own sample rate")
        data, sr = read_audio(path_or_array)
    else:
        if sr is None:
            raise InputError("prepare_reference needs sr= when given an array")
        data = _as_audio(path_or_array, "reference audio")
    sr = _check_rate(sr)
    if not (isinstance(max_seconds, (int, float)) and math.isfinite(max_seconds) and max_seconds > 0):
        raise InputError(f"max_seconds must be a positive number, got {max_seconds!r}")
    if data.shape[0] == 0:
        raise AudioError("reference audio contains no samples")
    _check_finite(data, "reference audio")

    mono = to_mono(data)
    # Cut before resampling (cheaper, same result up to the filter's edge).
    keep = round(max_seconds * sr)
    if mono.shape[0] > keep:
        warnings.append(f"reference audio is {mono.shape[0] / sr:.1f} s; using its first {max_seconds:g} s")
        mono = mono[:keep]
    out = resample(mono, sr, SAMPLE_RATE)[: round(max_seconds * SAMPLE_RATE)]

    loudness = loudness_lufs(out, SAMPLE_RATE)
    if not math.isfinite(loudness):
        raise AudioError("reference audio is silent (every 0.4 s block is below the -70 LUFS gate)")
    out = (out.astype(np.float64) * 10.0 ** ((REFERENCE_LUFS - loudness) / 20.0)).astype(np.float32)
    peak = float(np.max(np.abs(out)))
    if peak > 1.0:
        out = peak_limit(out, 1.0)
        warnings.append(
            f"reference audio was peak-limited: its loudness is {REFERENCE_LUFS - 20 * math.log10(peak):.1f} "
            f"LUFS instead of {REFERENCE_LUFS:g}"
        )
    return out, warnings
