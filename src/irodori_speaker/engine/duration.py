"""Utterance length: the duration predictor network, frames from its prediction or from seconds,
and the tail trim (docs/engine-api.md, "Duration")."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..audio.signal import SAMPLE_RATE
from ..errors import InputError
from .config import ModelConfig
from .encoders import may_read
from .layers import RMSNorm, SwiGLU

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
    """Clamp to [0.5, 30] s (warning above 30), then frames = ceil(int(seconds * SAMPLE_RATE) / HOP)."""
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
    return int(trim_frame(latent))


def trim_frame(latent: Tensor) -> Tensor:
    """`tail_trim_frames` as a 0-d tensor on the latent's device (no host read: the device
    owner copies it to the host without waiting)."""
    T = latent.shape[0]
    padded = F.pad(latent.float(), (0, 0, 0, TRIM_WINDOW))
    windows = padded.unfold(0, TRIM_WINDOW, 1)[:T]  # (T, C, W): window i = frames i..i+W-1
    flat = windows.reshape(T, -1)
    quiet = (flat.std(dim=1) < TRIM_STD) & (flat.mean(dim=1).abs() < TRIM_MEAN)
    # a quiet mark after the last window: the first quiet window, else T, with no host read (a
    # sync on CUDA) and in fewer ops than a test of any() (this runs once a line on the device
    # owner, whose eager ops bound many streams: issue 27)
    return torch.argmax(F.pad(quiet.to(torch.uint8), (0, 1), value=1))


# ---------------------------------------------------------------------------------------------
# The duration predictor (v3, v3-VoiceDesign, v4, v4.1, v4.1-MF)
# ---------------------------------------------------------------------------------------------


class DurationBlock(nn.Module):
    """h += tanh(gate) * mlp(norm(h) * (1 + scale) + shift), modulated by speaker (and caption)."""

    def __init__(self, hidden: int, speaker_dim: int, caption_dim: int | None, eps: float) -> None:
        super().__init__()
        self.norm = RMSNorm(hidden, eps)
        self.modulation = nn.Linear(speaker_dim, 3 * hidden, bias=True)
        if caption_dim is not None:
            self.caption_modulation = nn.Linear(caption_dim, 3 * hidden, bias=True)
        self.mlp = SwiGLU(hidden, hidden)

    def forward(self, h: Tensor, spk: Tensor, cap: Tensor | None) -> Tensor:
        mod = self.modulation(F.silu(spk))
        if cap is not None:
            mod = mod + self.caption_modulation(F.silu(cap))
        shift, scale, gate = mod[:, None, :].chunk(3, dim=-1)
        return h + torch.tanh(gate) * self.mlp(self.norm(h) * (1 + scale) + shift)


class DurationPredictor(nn.Module):
    """`token_sum_(dual_)adarn_zero_no_aux`: per-token frames, summed; returns log1p(frames)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden, eps = cfg.duration_hidden_dim, cfg.norm_eps
        caption_dim = cfg.caption("dim") if cfg.dual_duration else None
        self.token_input_proj = nn.Linear(cfg.text_dim, hidden, bias=True)
        self.token_blocks = nn.ModuleList(
            DurationBlock(hidden, cfg.speaker_dim, caption_dim, eps) for _ in range(cfg.duration_layers)
        )
        self.token_out_norm = RMSNorm(hidden, eps)
        self.token_out_proj = nn.Linear(hidden, 1, bias=True)
        self.null_speaker = nn.Parameter(torch.zeros(cfg.speaker_dim))
        if caption_dim is not None:
            self.null_caption = nn.Parameter(torch.zeros(caption_dim))

    def forward(
        self,
        text_state: Tensor,
        text_mask: Tensor,
        speaker_summary: Tensor | None,
        has_speaker: Tensor,
        caption_pooled: Tensor | None = None,
        has_caption: Tensor | None = None,
        body: Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor] | None = None,
    ) -> Tensor:
        """The rows prepared (a row with no valid token zeroed, its token 0 marked valid; the null
        speaker or caption where a row has none), then `body` (default `self.body`; the fast
        path's fused one, engine/fast_duration.py)."""
        B = text_state.shape[0]
        empty = ~text_mask.any(dim=1)
        # the same ops, a no-op on rows that have tokens, where the mask may not be read
        if not may_read(empty) or bool(empty.any()):
            text_state = text_state.masked_fill(empty[:, None, None], 0.0)
            text_mask = text_mask.clone()
            text_mask[:, 0] |= empty
        null_spk = self.null_speaker.to(text_state.dtype).expand(B, -1)
        spk = (
            null_spk
            if speaker_summary is None
            else torch.where(has_speaker[:, None], speaker_summary, null_spk)
        )
        cap = None
        if hasattr(self, "null_caption"):
            null_cap = self.null_caption.to(text_state.dtype).expand(B, -1)
            if caption_pooled is None or has_caption is None:
                cap = null_cap
            else:
                cap = torch.where(has_caption[:, None], caption_pooled, null_cap)
        return (body or self.body)(text_state, text_mask, spk, cap)

    def body(self, text_state: Tensor, text_mask: Tensor, spk: Tensor, cap: Tensor | None) -> Tensor:
        """log1p(frames) of prepared rows: the blocks, the output norm, the frames' sum."""
        h = self.token_input_proj(text_state)
        for block in self.token_blocks:
            h = block(h, spk, cap)
        return self.log_total(self.token_out_norm(h), text_mask)

    def log_total(self, normed: Tensor, text_mask: Tensor) -> Tensor:
        """log1p of the valid tokens' frames summed, from the blocks' output after `token_out_norm`."""
        frames = F.softplus(self.token_out_proj(normed).float()).squeeze(-1)
        return torch.log1p((frames * text_mask.float()).sum(dim=1))
