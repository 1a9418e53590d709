"""What a voice gives the model: its reference latent, its caption, and the speaker / caption
states the DiT encodes from them. A member of `Synthesizer` (`synth.voices`), kept apart
because none of it depends on the text of a line.

- The reference latent: a recording is prepared (audio/signal.py: mono, 48 kHz, -16 LUFS,
  cut) and encoded by the codec once, cached in memory and on disk by content, codec and cut
  (`voices.VoiceCache`); a saved latent is read once; several clips are joined up to the
  model's cap.
- The caption: normalised (v2 / v3) or stripped (v4), tokenised for the caption encoder.
- The states: `model.encode_voice` of both, kept for the last VOICE_STATES_KEPT voices, so a
  line in a voice already heard starts with the text encoder.

`reference_latent` takes the model lock (engine/hardware/lock.py) itself; `reference`,
`caption` and `states` run inside a stage that holds it (`Synthesizer._run`, prewarm).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from ..audio.signal import prepare_reference
from ..engine.config import DEFAULT_REF_MAX_SECONDS
from ..engine.hardware.lock import hold_model_lock
from ..engine.hardware.owner import DEVICE
from ..errors import InputError
from ..options import SynthesisRecord
from ..text.normalize import normalize_or_raise
from .voices import Voice, VoiceCache, join_reference_clips, load_latent, max_reference_frames

__all__ = ["VOICE_STATES_KEPT", "VoiceConditions"]

VOICE_STATES_KEPT = 8  # voices whose encoded speaker/caption states are kept on the device


class VoiceConditions:
    """A voice (a `Voice`, a path or None) as the model's conditions: reference latent, caption
    ids, and the speaker / caption states encoded from them.

    `cache` holds the encoded reference latents (shared by synthesizers that share it);
    `codec_key` names the codec in its keys (a latent is only valid for the codec that made it).
    """

    def __init__(
        self,
        model: Any,
        codec: Any,
        inference: Any,
        caption_tokenizer: Any,
        cache: VoiceCache,
        codec_key: object,
    ) -> None:
        self.model = model
        self.codec = codec
        self.inference = inference
        self.caption_tokenizer = caption_tokenizer
        self.cache = cache
        self.codec_key = codec_key
        self.device = next(model.parameters()).device
        self._kept: dict[tuple, tuple] = {}  # insertion order = least recently used first

    def reference_latent(self, voice: Any, record: SynthesisRecord | None = None) -> Any:
        """The voice's reference latent (1, T, C) on the model's device, or None; encoded once, cached."""
        with hold_model_lock():
            return self.reference(voice, record)[1]

    def key(self, voice: Any, record: SynthesisRecord | None = None) -> tuple:
        """What `voice`'s states are kept by: its reference's content key, its caption as the
        caption encoder reads it, the model's dtype. Host work (a file's memoised hash: a path
        resolved and stat'ed), so a line makes it on its own thread before its encoders' job:
        on the device owner it cost 5 % of the owner's time at 64 streams (H100, RESULTS.md
        thirty-second session). Raises what a bad voice or caption raises."""
        voice = _as_voice(voice)
        content = self.reference_key(voice, record)
        return (content, self.caption_text(voice), str(self.model.in_proj.weight.dtype))

    def states(
        self, voice: Any, record: SynthesisRecord | None = None, key: tuple | None = None
    ) -> tuple[bool, Any]:
        """(whether a reference is used, the speaker / caption states) of `voice`: they do not
        depend on the text, so they are encoded once per voice and kept (a few voices, least
        recently used dropped). With the model lock held. `key`: `self.key(voice, record)`,
        made before (else here).

        A kept voice is found by its key alone: its latent is not read again nor uploaded. This
        runs in the encoders' job on the device owner, where a plain upload from pageable memory
        waits for the GPU to drain; a voice not kept goes up through the owner's pinned upload
        (`DEVICE.upload`)."""
        voice = _as_voice(voice)
        if key is None:
            key = self.key(voice, record)
        content, caption, _ = key
        hit = self._kept.pop(key, None)
        if hit is None:
            ref = None if content is None else self._latent(voice, record)
            cap = (None, None) if caption is None else self._caption_tokens(caption)
            ref_mask = (
                None if ref is None else torch.ones(ref.shape[:2], dtype=torch.bool, device=self.device)
            )
            with torch.inference_mode():
                hit = (ref is not None, self.model.encode_voice(1, ref, ref_mask, *cap))
        self._kept[key] = hit
        while len(self._kept) > VOICE_STATES_KEPT:
            self._kept.pop(next(iter(self._kept)))
        return hit

    def forget(self) -> None:
        """Drop the kept states: the next line in each voice encodes them anew."""
        self._kept.clear()

    def reference(self, voice: Any, record: SynthesisRecord | None = None) -> tuple[str | None, Any]:
        """(the voice's content key, its reference latent on the model's device), or (None, None)
        when it has none used. With the model lock held."""
        voice = _as_voice(voice)
        content = self.reference_key(voice, record)
        return (None, None) if content is None else (content, self._latent(voice, record))

    def reference_key(self, voice: Voice | None, record: SynthesisRecord | None = None) -> str | None:
        """The content key of the reference `voice` gives the model (host work: its file's
        memoised hash), or None when it has none used (a record notes a reference ignored)."""
        if voice is None or not voice.has_reference:
            return None
        if not self.model.cfg.speaker_enabled:
            if record is not None:
                record.warnings.append("this model has no speaker branch: the reference voice is ignored")
            return None
        return voice.content_key()  # hashes in-memory audio: once per line

    def _latent(self, voice: Voice, record: SynthesisRecord | None) -> Any:
        """The voice's reference latent (1, T, C) on the model's device, in its dtype."""
        # several clips: joined up to the model's cap (v4: its ref_max_seconds); v2 / v3 cut a
        # recording to 30 s and use a saved latent whole, as before
        many = len(voice.clips) > 1
        capped = many or self.inference.ref_max_seconds is not None
        cap = max_reference_frames(self.inference.reference_seconds) if capped else None
        latents, total = [], 0
        for clip in voice.clips or (voice,):
            latent = self._clip_latent(clip, record)
            latents.append(latent)
            total += latent.shape[0]
            if cap is not None and total >= cap:  # later clips are not used: not even encoded
                break
        joined = join_reference_clips(latents, cap)[None].to(self.model.in_proj.weight.dtype)
        return DEVICE.upload(joined, self.device)

    def caption(self, voice: Any) -> tuple[Any, Any]:
        """The voice's caption as (ids, mask) on the model's device, or (None, None) without one
        (or on a model without a caption branch)."""
        caption = self.caption_text(_as_voice(voice))
        return (None, None) if caption is None else self._caption_tokens(caption)

    def caption_text(self, voice: Voice | None) -> str | None:
        """The caption as the caption encoder reads it (normalised for v2 / v3, stripped for v4),
        or None without one (or on a model without a caption branch). Host work."""
        caption = getattr(voice, "caption", None)
        if not self.model.cfg.caption_enabled or not caption:
            return None
        if self.model.cfg.pretrained_text:  # v4 only strips the caption; empty: no caption
            return caption.strip() or None
        return normalize_or_raise(caption)

    def _caption_tokens(self, caption: str) -> tuple[Any, Any]:
        max_len = self.inference.max_caption_len or self.inference.max_text_len or 256
        ids, mask = self.caption_tokenizer.batch([caption], max_len=max_len)
        return DEVICE.upload(ids, self.device), DEVICE.upload(mask, self.device)

    def _clip_latent(self, clip: Any, record: SynthesisRecord | None) -> Any:
        """One clip's latent (T, C) on the CPU: a saved latent read once, a recording encoded once
        (cached in memory and on disk by content, codec and cut)."""
        content = clip.content_key()
        if clip.latent is not None:  # a saved latent: read once, kept in memory
            latent = self.cache.get(content, disk=False)
            if latent is None:
                latent = load_latent(clip.latent, self.model.cfg.latent_dim)
                self.cache.put(content, latent, disk=False)
            return latent
        seconds = self.inference.reference_seconds
        cut = "" if seconds == DEFAULT_REF_MAX_SECONDS else f"|cut:{seconds:g}"
        # a half-precision codec encodes ~1e-2 away from fp32: its latents are kept apart (fp32
        # keys are as before, so caches made in fp32 stay valid)
        dtype = str(getattr(self.codec, "dtype", "torch.float32"))
        precision = "" if dtype == "torch.float32" else f"|{dtype.removeprefix('torch.')}"
        key = f"{content}|codec:{self.codec_key}{precision}{cut}"
        latent = self.cache.get(key)
        if latent is None:
            latent = self._encode(clip, record, seconds)
            self.cache.put(key, latent)
            self.cache.encodes += 1
        return latent

    def _encode(self, voice: Any, record: SynthesisRecord | None, max_seconds: float) -> Any:
        if voice.reference is not None:
            wave, warns = prepare_reference(voice.reference, max_seconds=max_seconds)
        else:
            wave, warns = prepare_reference(voice._audio, voice._audio_rate, max_seconds=max_seconds)
        if record is not None:
            record.warnings.extend(warns)
        x = torch.from_numpy(np.ascontiguousarray(wave))[None, None].to(self.codec.device, self.codec.dtype)
        with torch.inference_mode():
            latent = self.codec.encode(x)[0].float()
        return latent.cpu()


def _as_voice(voice: Any) -> Voice | None:
    """`voice` as a Voice (a path read as one), or None."""
    if voice is None or isinstance(voice, Voice):
        return voice
    if isinstance(voice, (str, os.PathLike)):
        return Voice.from_path(voice)
    raise InputError(f"voice must be a Voice, a path or None, got {type(voice).__name__}")
