"""Utterance length in latent frames, and the tail trim (docs/engine-api.md, "Duration")."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..errors import InputError

SAMPLE_RATE = 48_000
HOP = 1920  # audio samples per latent frame
FRAMES_PER_SECOND = SAMPLE_RATE // HOP  # 25
MIN_SECONDS, MAX_SECONDS = 0.5, 30.0
MIN_PRED_FRAMES, MAX_PRED_FRAMES = 13, 750

TRIM_WINDOW = 20
TRIM_STD = 0.05
TRIM_MEAN = 0.1


def check_seconds(seconds: float) -> float:
    """Validate a caller-given length: NaN, inf and <= 0 are errors."""
    try:
        s = float(seconds)
    except (TypeError, ValueError):
        raise InputError(f"seconds must be a number, got {seconds!r}") from None
    if math.isnan(s) or math.isinf(s) or s <= 0:
        raise InputError(f"seconds must be a positive finite number, got {seconds!r}")
    return s


def frames_for_seconds(seconds: float, warnings: list[str] | None = None) -> int:
    """Clamp to [0.5, 30] s (warning above 30), then frames = ceil(int(seconds * 48000) / 1920)."""
    s = check_seconds(seconds)
    if s > MAX_SECONDS and warnings is not None:
        warnings.append(f"seconds={s:g} is longer than one utterance can be; clamped to {MAX_SECONDS:g} s")
    s = min(max(s, MIN_SECONDS), MAX_SECONDS)
    return math.ceil(int(s * SAMPLE_RATE) / HOP)


def frames_from_prediction(
    log_frames: Tensor, duration_scale: float = 1.0, max_frames: int | None = None
) -> list[int]:
    """v3 predictor output -> frames = round(expm1(pred) * scale), clamped to [13, 750] (and a cap)."""
    if not (duration_scale > 0 and math.isfinite(duration_scale)):
        raise InputError(f"duration_scale must be positive and finite, got {duration_scale!r}")
    hi = MAX_PRED_FRAMES if max_frames is None else max(MIN_PRED_FRAMES, min(MAX_PRED_FRAMES, max_frames))
    frames = torch.round(torch.expm1(log_frames.float()) * duration_scale)
    return [int(f) for f in frames.clamp(MIN_PRED_FRAMES, hi).tolist()]


def tail_trim_frames(latent: Tensor) -> int:
    """The first frame i whose 20-frame window (zero-padded at the end) is near silent.

    `latent` is (T, C). Returns T when no window qualifies before the end (callers cut the
    audio at i * 1920 samples only when 0 < i).
    """
    T = latent.shape[0]
    padded = torch.cat((latent.float(), latent.new_zeros(TRIM_WINDOW, latent.shape[1]).float()))
    windows = padded.unfold(0, TRIM_WINDOW, 1)[:T]  # (T, C, W): window i = frames i..i+W-1
    flat = windows.reshape(T, -1)
    quiet = (flat.std(dim=1) < TRIM_STD) & (flat.mean(dim=1).abs() < TRIM_MEAN)
    hits = torch.nonzero(quiet).flatten()
    return int(hits[0]) if hits.numel() else T
