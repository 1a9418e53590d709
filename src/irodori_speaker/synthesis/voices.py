"""Voices: a reference wav, a saved latent, or none (the model's own voice), plus a caption.

A reference is encoded once. Encoded latents are cached by content hash (of the
audio file and of the codec that encoded it), in memory and on disk, so the same
voice is never re-encoded per utterance, nor per process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ..dirs import cache_root
from ..engine.duration import FRAMES_PER_SECOND
from ..errors import AudioError, InputError
from ..options import SynthesisOptions
from ..text.tags import TagMap
from .fingerprint import bytes_fingerprint, file_fingerprint

#: The sample reference voice in the package (`Voice.sample()`).
SAMPLE_VOICE = Path(__file__).resolve().parents[1] / "data" / "sample_voice.opus"


@dataclass(frozen=True)
class Voice:
    """What to sound like. Build with `Voice.from_wav`, `Voice.from_latent` or `Voice()`.

    `caption` describes the voice for VoiceDesign models and v4 (ignored by the others); a v4
    voice may have a reference and a caption together. `Voice.from_clips` makes one voice of
    several recordings (or latents): each is encoded on its own, then they are joined in order
    up to the model's reference cap (120 s for v4, 30 s before).
    """

    reference: Path | None = None  # an audio file soundfile can read
    latent: Path | None = None  # a safetensors file with a (T, 32) "latent" tensor
    caption: str | None = None
    name: str | None = None
    _audio: np.ndarray | None = field(default=None, repr=False, compare=False)  # in-memory reference
    _audio_rate: int | None = field(default=None, repr=False, compare=False)
    clips: tuple[Voice, ...] = ()  # several reference clips, each a one-clip Voice (from_clips)

    def __post_init__(self) -> None:
        if self.caption is not None and not isinstance(self.caption, str):  # issue 30: was AttributeError
            raise InputError(
                f"a voice caption must be a str, got {type(self.caption).__name__}",
                hint='describe the voice in words, e.g. Voice(caption="落ち着いた女性の声")',
            )

    @classmethod
    def from_wav(
        cls, path: str | os.PathLike, *, caption: str | None = None, name: str | None = None
    ) -> Voice:
        p = Path(path)
        if not p.is_file():
            raise AudioError(f"reference voice {p} does not exist")
        return cls(reference=p, caption=caption, name=name or p.stem)

    @classmethod
    def sample(cls, *, caption: str | None = None) -> Voice:
        """The sample reference voice shipped in the package (`SAMPLE_VOICE`: 4.4 s of synthesised
        Japanese, CC0; irodori_speaker/data/SAMPLE_VOICE.md), to try a cloned voice offline."""
        return cls.from_wav(SAMPLE_VOICE, caption=caption, name="sample")

    @classmethod
    def from_path(
        cls, path: str | os.PathLike, *, caption: str | None = None, name: str | None = None
    ) -> Voice:
        """A voice from a file: a saved ``.safetensors`` latent, else a recording (what a plain
        path given as ``voice=`` means everywhere)."""
        if Path(path).suffix.lower() == ".safetensors":
            return cls.from_latent(path, caption=caption, name=name)
        return cls.from_wav(path, caption=caption, name=name)

    @classmethod
    def from_array(
        cls, audio: np.ndarray, sample_rate: int, *, caption: str | None = None, name: str | None = None
    ) -> Voice:
        """A reference voice from samples in memory: (samples,) or (samples, channels), any rate."""
        if isinstance(audio, (str, bytes, os.PathLike)):
            raise InputError(
                f"Voice.from_array takes samples, got a {type(audio).__name__} ({str(audio)[:40]!r})",
                hint="for a file use Voice.from_wav(path)",
            )
        try:
            x = np.asarray(audio, dtype=np.float32)
        except (TypeError, ValueError):
            raise InputError(
                f"Voice.from_array takes an array of samples, got {type(audio).__name__}"
            ) from None
        if x.ndim not in (1, 2) or x.size == 0:
            raise InputError(
                f"Voice.from_array takes (samples,) or (samples, channels) audio, got shape {x.shape}"
            )
        if not np.isfinite(x).all():
            raise AudioError(
                "Voice.from_array: the samples contain NaN or Inf", hint="pass finite audio in [-1, 1]"
            )
        rate_ok = isinstance(sample_rate, (int, np.integer)) and not isinstance(sample_rate, bool)
        if not rate_ok or sample_rate <= 0:
            raise InputError(f"Voice.from_array: sample_rate must be a positive integer, got {sample_rate!r}")
        return cls(caption=caption, name=name, _audio=x, _audio_rate=int(sample_rate))

    @classmethod
    def from_latent(
        cls, path: str | os.PathLike, *, caption: str | None = None, name: str | None = None
    ) -> Voice:
        p = Path(path)
        if not p.is_file():
            raise InputError(f"voice latent {p} does not exist")
        return cls(latent=p, caption=caption, name=name or p.stem)

    @classmethod
    def from_clips(
        cls,
        clips: Sequence[str | os.PathLike | Voice],
        *,
        caption: str | None = None,
        name: str | None = None,
    ) -> Voice:
        """One voice from several reference clips (recordings, latent files or Voices), used in
        order: each is encoded separately and the latents are joined, stopping once the model's
        reference cap is reached (later clips are not used), cut to it."""
        if isinstance(clips, (str, os.PathLike)) or not clips:
            raise InputError("Voice.from_clips takes a non-empty list of clips (paths or Voices)")
        parts: list[Voice] = []
        for clip in clips:
            if isinstance(clip, Voice):
                if clip.clips or not clip.has_reference:
                    raise InputError("each clip of Voice.from_clips must be one recording or latent")
                parts.append(clip)
            else:
                parts.append(cls.from_path(clip))
        if len(parts) == 1:
            return dataclasses.replace(parts[0], caption=caption, name=name or parts[0].name)
        return cls(caption=caption, name=name or "+".join(str(p.name) for p in parts), clips=tuple(parts))

    @classmethod
    def designed(cls, caption: str, *, name: str | None = None) -> Voice:
        """A caption-only voice for VoiceDesign models."""
        return cls(caption=caption, name=name)

    @property
    def has_reference(self) -> bool:
        return (
            bool(self.clips)
            or self.reference is not None
            or self.latent is not None
            or self._audio is not None
        )

    def content_key(self) -> str:
        """A hash of what the reference sounds like (file bytes), not where it lives."""
        if self.clips:
            return "clips:" + bytes_fingerprint("|".join(c.content_key() for c in self.clips).encode())
        if self.reference is not None:
            return "wav:" + file_fingerprint(self.reference)
        if self.latent is not None:
            return "latent:" + file_fingerprint(self.latent)
        if self._audio is not None:
            return f"array:{self._audio_rate}:" + bytes_fingerprint(
                np.ascontiguousarray(self._audio).tobytes()
            )
        return "none"

    def describe(self) -> str:
        return self.name or (str(self.reference or self.latent) if self.has_reference else "model voice")


def with_caption(voice: Voice | str | os.PathLike | None, caption: str) -> Voice:
    """`voice` (a Voice or a path) speaking with `caption`; None: a voice of the caption alone."""
    if voice is None:
        return Voice.designed(caption)
    base = voice if isinstance(voice, Voice) else Voice.from_path(voice)
    return dataclasses.replace(base, caption=caption)


def tagged_line(
    tags: TagMap, text: str, voice: Any, options: SynthesisOptions | None
) -> tuple[str, Any, SynthesisOptions | None]:
    """(text, voice, options) of a line once its first mapped tag (`text/tags.py`) has acted:
    its words said in place, its voice, caption and options taken. The one place the Speaker
    and the CLI apply a tag map."""
    line = tags.apply(text)
    action = line.action
    if action is None:
        return line.text, voice, options
    if action.voice is not None:
        voice = action.voice
    if action.caption is not None:
        voice = with_caption(voice, action.caption)
    if action.options:
        options = (options if options is not None else SynthesisOptions()).replace(**action.options)
    return line.text, voice, options


def max_reference_frames(seconds: float | None) -> int | None:
    """Latent frames in `seconds` of reference (ceil(seconds * 25)); None or <= 0: no cap."""
    if seconds is None or seconds <= 0:
        return None
    return math.ceil(seconds * FRAMES_PER_SECOND - 1e-9)


def join_reference_clips(latents: Sequence[torch.Tensor], max_frames: int | None) -> torch.Tensor:
    """Clips' latents (T_i, C) concatenated in order, stopping after the clip that reaches
    `max_frames` (later clips are not used), cut to it (docs/models.md, "References")."""
    if not latents:
        raise InputError("a voice needs at least one reference clip")
    used, total = [], 0
    for latent in latents:
        used.append(latent)
        total += latent.shape[0]
        if max_frames is not None and total >= max_frames:
            break
    joined = torch.cat(used, dim=0) if len(used) > 1 else used[0]
    return joined if max_frames is None else joined[:max_frames]


def save_latent(latent: torch.Tensor, path: str | os.PathLike) -> None:
    """Save an encoded voice (T, 32) so it can be used later with `Voice.from_latent`."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file({"latent": latent.detach().float().cpu().contiguous()}, str(path))


def load_latent(path: str | os.PathLike, latent_dim: int) -> torch.Tensor:
    try:
        latent = load_file(str(path))["latent"]
    except (SafetensorError, OSError, KeyError) as e:
        raise InputError(
            f"{path}: not a voice latent file (a safetensors file with a 'latent' tensor)"
        ) from e
    if latent.ndim == 3 and latent.shape[0] == 1:
        latent = latent[0]
    if latent.ndim != 2 or latent.shape[1] != latent_dim or latent.shape[0] == 0:
        raise InputError(f"{path}: voice latent must be (frames, {latent_dim}), got {tuple(latent.shape)}")
    if not torch.isfinite(latent).all():
        raise InputError(f"{path}: voice latent contains NaN or inf")
    return latent.float()


class VoiceCache:
    """Encoded reference latents by (voice content, codec) key: in memory, and on disk if a dir is given."""

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self.directory = Path(directory) if directory is not None else None
        self._memory: dict[str, torch.Tensor] = {}
        self._lock = threading.Lock()
        self.encodes = 0  # how many times a reference was actually encoded (tests, metrics)

    def _path(self, key: str) -> Path | None:
        if self.directory is None:
            return None
        return self.directory / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".safetensors")

    def get(self, key: str, *, disk: bool = True) -> torch.Tensor | None:
        with self._lock:
            if key in self._memory:
                return self._memory[key]
        path = self._path(key) if disk else None
        if path is not None and path.is_file():
            try:
                latent = load_file(str(path))["latent"]
            except (SafetensorError, OSError, KeyError):
                path.unlink(missing_ok=True)  # torn write or corruption: re-encode
                return None
            with self._lock:
                self._memory[key] = latent
            return latent
        return None

    def put(self, key: str, latent: torch.Tensor, *, disk: bool = True) -> None:
        latent = latent.detach().float().cpu().contiguous()
        with self._lock:
            self._memory[key] = latent
        path = self._path(key) if disk else None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}.{threading.get_ident()}")
            save_file({"latent": latent}, str(tmp))
            os.replace(tmp, path)  # atomic: readers see the old file or the new one


def default_voice_cache_dir() -> Path:
    return cache_root() / "voices"
