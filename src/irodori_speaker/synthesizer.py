"""One utterance end to end: text (+ voice) -> 48 kHz mono float32 audio and a record.

The data types it speaks (`SynthesisOptions`, `SynthesisRecord`, `SynthesisResult`,
`AudioStream`, the `SynthesizerLike` protocol) live in the torch-free `irodori_speaker.types`
and are re-exported here. Options are resolved against the device preset once per line
(`Synthesizer.resolve_options`); every stage reads that one object.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .backends.lock import hold_model_lock
from .cancel import CancelToken
from .errors import InputError
from .types import (
    SAMPLE_RATE,
    AudioStream,
    SamplerConfig,
    SynthesisOptions,
    SynthesisRecord,
    SynthesisResult,
    SynthesizerLike,
)

if TYPE_CHECKING:
    from .text.pauses import Pause

__all__ = [
    "SAMPLE_RATE",
    "AudioStream",
    "SamplerConfig",
    "SynthesisOptions",
    "SynthesisRecord",
    "SynthesisResult",
    "Synthesizer",
    "SynthesizerLike",
    "load_synthesizer",
]

# ---------------------------------------------------------------------------------------------
# The synthesizer
# ---------------------------------------------------------------------------------------------

VOICE_STATES_KEPT = 8  # voices whose encoded speaker/caption states are kept on the device
PIECE_GAP_S = 0.12  # silence between the pieces of a split long text
EDGE_FADE_S = 0.008  # raised-cosine fade at piece edges: no click where a piece was cut


def _fade_edges(audio: np.ndarray, fade_in: bool, fade_out: bool) -> np.ndarray:
    n = min(int(EDGE_FADE_S * SAMPLE_RATE), len(audio) // 2)
    if n <= 0 or not (fade_in or fade_out):
        return audio
    ramp = (0.5 - 0.5 * np.cos(np.linspace(0.0, np.pi, n, dtype=np.float32))).astype(np.float32)
    audio = audio.copy()
    if fade_in:
        audio[:n] *= ramp
    if fade_out:
        audio[-n:] *= ramp[::-1]
    return audio


@dataclass
class _Piece:
    text: str
    ids: Any  # (1, L) LongTensor
    mask: Any
    after: float = 0.0  # seconds of exact silence after it (PIECE_GAP_S, or a pause's)


class _Plan(list[_Piece]):
    """A line's pieces in order (each with the silence after it), and `lead`: the silence
    before the first one (all of a line that is only pauses)."""

    lead: float = 0.0


@dataclass
class _Rendered:
    """A sampled piece, ready to decode: latent frames [0, decode_frames) give `samples` samples."""

    latent: Any  # (1, T, C) on the model's device
    decode_frames: int
    samples: int


class Synthesizer:
    """Text (+ voice) -> 48 kHz mono float32 audio. Synchronous; thread-safe through MODEL_LOCK."""

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        model: Any,
        codec: Any,
        tokenizer: Any,
        *,
        caption_tokenizer: Any = None,
        inference: Any = None,
        preset: Any = None,
        voice_cache: Any = None,
        fingerprints: dict[str, str] | None = None,
        note: str | None = None,
        user_dict: Any = None,
    ) -> None:
        from .backends.presets import select_preset
        from .engine.config import InferenceConfig
        from .text.userdict import resolve_user_dict
        from .voices import VoiceCache

        self.model = model
        self.codec = codec
        self.tokenizer = tokenizer
        self.caption_tokenizer = caption_tokenizer or tokenizer
        self.inference = inference or InferenceConfig()
        self.preset = preset or select_preset("cpu")
        self.voice_cache = voice_cache if voice_cache is not None else VoiceCache()
        self.fingerprints = dict(fingerprints or {})
        self.note = note  # e.g. "tiny-random model: the output is noise"
        self.user_dict = resolve_user_dict(user_dict)  # None (the default file), a path, or False
        self.device = next(model.parameters()).device
        self._fast = None  # engine.fast.FastSampler, built on first use when the preset asks for it
        self._voice_states_cache: dict[tuple, tuple] = {}  # insertion order = least recently used first
        codec_device = getattr(codec, "device", None)
        if self.preset.codec_channels_last and hasattr(codec, "use_channels_last"):
            codec.use_channels_last(True)  # before the graphs: they capture whichever path is on
        if self.preset.codec_graphs and codec_device is not None and codec_device.type == "cuda":
            # the stream's first and middle windows replayed from graphs, captured by prewarm; other
            # lengths (a line's last window) stay eager: a capture mid-stream would cost more
            codec.use_graphs(True, capture_on_use=None)
        self.prewarm_report: dict[str, Any] = {}

    @property
    def fast_sampler(self):
        """The preset's fast sampling path (None when the preset uses the reference loop)."""
        if self._fast is None and self.preset.fast_path:
            from .engine.fast import FastSampler

            self._fast = FastSampler(
                self.model, use_graphs=self.preset.cuda_graphs and self.device.type == "cuda"
            )
        return self._fast

    # ---- public API -------------------------------------------------------------------------
    @property
    def config(self):
        return self.model.cfg

    def spoken_text(self, text: str, options: SynthesisOptions | Mapping[str, Any] | None = None) -> str:
        """What the model reads for `text` (pause markup taken out: `spoken_parts` keeps the pauses)."""
        return "".join(p for p in self.spoken_parts(text, options) if isinstance(p, str))  # Pauses dropped

    def _spoken(self, text: str, opts: SynthesisOptions) -> str:
        """One text part: the reference normalisation, the user dictionary, the readings pass of
        `opts` (tags, URLs, laughter, numbers, English: text/readings.py), then the reference
        normalisation again, so the model always reads text in the form it was trained on."""
        from .text.normalize import normalize_or_raise, normalize_text
        from .text.readings import apply_readings

        normalized = normalize_or_raise(text)
        if self.user_dict is not None:
            normalized = self.user_dict.apply(normalized)
        spoken = apply_readings(normalized, opts)
        if spoken != normalized:
            spoken = normalize_text(spoken)
            if not spoken.strip():
                raise InputError(
                    f"text {text[:40]!r} has nothing to say once tags and URLs are taken out",
                    hint="options tags='keep' / urls='keep' read them as text",
                )
        return spoken

    def spoken_parts(
        self, text: str, options: SynthesisOptions | Mapping[str, Any] | None = None
    ) -> list[str | Pause]:
        """`text` split at its pause markup (`text/pauses.py`): each text part as the model reads
        it (`spoken_text`), and the Pauses between them. Without markup: `[spoken_text(text)]`.
        A part with nothing to say between pauses is dropped; a line of only pauses is silence."""
        from .text.pauses import Pause, split_pauses, strip_markup

        if not isinstance(text, str):
            raise InputError(f"text must be a str, got {type(text).__name__}")
        opts = options if isinstance(options, SynthesisOptions) else SynthesisOptions.coerce(options)
        if not opts.pause_markup:  # chat text: no silence from markup, and nothing read of it
            text = strip_markup(text)
        parts = split_pauses(text)
        if len(parts) == 1 and isinstance(parts[0], str):
            return [self._spoken(text, opts)]
        out: list[str | Pause] = []
        for part in parts:
            if isinstance(part, Pause):
                out.append(part)
            elif part.strip():
                with contextlib.suppress(InputError):  # e.g. only a bracket between two pauses
                    out.append(self._spoken(part, opts))
        return out

    def resolve_options(
        self, options: SynthesisOptions | Mapping[str, Any] | None = None
    ) -> SynthesisOptions:
        """`options` as this synthesizer renders them: checked, `None` preset-backed options
        (steps, schedule, sway_coeff) filled from the preset, size options bounded by the model.

        The one place the preset fallback happens: the stages, the CLI, the benchmarks and the
        phrase-cache key all read the object it returns. `options` may be a mapping of options.
        """
        limits = {"max_text_len": self.inference.max_text_len or 256}
        opts = SynthesisOptions.coerce(options)
        if self.config.meanflow:  # the release's defaults (4 steps), not the RF preset's
            from .engine.sampler import meanflow_defaults, plan_meanflow

            opts = opts.with_defaults(meanflow_defaults())
            plan_meanflow(opts)  # RF-only settings are an InputError here, before any work
        return opts.resolve(self.preset, limits)

    @property
    def sampler_kind(self) -> str:
        """ "meanflow" (v4.1-MF: average velocity, no guidance) or "rf" (every other file)."""
        return "meanflow" if self.config.meanflow else "rf"

    def synthesize(
        self,
        text: str,
        voice: Any = None,
        options: SynthesisOptions | Mapping[str, Any] | None = None,
        cancel: CancelToken | None = None,
        progress: Any = None,
    ) -> SynthesisResult:
        """Render one line (split into pieces when it is longer than one utterance can hold).

        `progress(done, total)` counts the sampler steps of all pieces plus one per piece for
        its decode, from 1 to total, once for the whole line.
        """
        stream = self.stream(text, voice, options, cancel, progress=progress, _whole=True)
        parts = list(stream)
        audio = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        return SynthesisResult(audio.astype(np.float32, copy=False), stream.record)

    def stream(
        self,
        text: str,
        voice: Any = None,
        options: SynthesisOptions | Mapping[str, Any] | None = None,
        cancel: CancelToken | None = None,
        *,
        progress: Any = None,
        _whole: bool = False,
    ) -> AudioStream:
        """Audio chunks in order as the decoder produces them (first chunk after the first piece samples).

        Input errors are raised here, before any chunk; the work happens while iterating.
        """
        opts = self.resolve_options(options)
        record = SynthesisRecord()
        pieces = self._prepare_text(text, opts, record)
        chunks = self._run(pieces, voice, opts, record, cancel, progress, whole=_whole)
        return AudioStream(chunks, record)

    def prewarm(self, voice: Any = None) -> float:
        """Absorb first-call costs before the first real line; returns the wall time in seconds.

        One short dummy synthesis (allocator, kernel selection, autotune); with CUDA graphs also
        the capture of every length bucket up to `preset.prewarm_seconds` for the two shortest
        text buckets and this voice, so no real line pays a capture. `self.prewarm_report` says
        what was done.
        """
        from .text.english import english_backends
        from .text.length import estimate_seconds

        t0 = time.perf_counter()
        fast = self.fast_sampler
        before = (0, 0) if fast is None else (fast.captures, fast.text_captures)
        estimate_seconds("こんにちは。")  # loads the reading dictionary (pyopenjtalk) once
        english_backends()  # and the English reader (e2k), so the first English word pays nothing
        self.synthesize("こんにちは。", voice, SynthesisOptions(seconds=1.0, seed=0))
        if fast is not None and fast.use_graphs:
            self._prewarm_graphs(voice, fast)
        codec_graphs = self._prewarm_codec_graphs()
        captured = (0, 0) if fast is None else (fast.captures - before[0], fast.text_captures - before[1])
        seconds = time.perf_counter() - t0
        self.prewarm_report = {
            "seconds": seconds,
            "graphs_captured": captured[0],
            "text_graphs_captured": captured[1],
            "codec_graphs_captured": codec_graphs,
            "voice": repr(voice),
        }
        return seconds

    def _prewarm_codec_graphs(self) -> int:
        """Capture the codec's graphs for the stream's window lengths (first and middle windows)."""
        from .engine.codec import stream_window_lengths

        if not self.preset.codec_graphs or not hasattr(self.codec, "prewarm_graphs"):
            return 0
        lengths = stream_window_lengths(
            self.preset.stream_chunk_frames, first_chunk_frames=self.preset.stream_first_chunk_frames
        )
        with hold_model_lock():
            return self.codec.prewarm_graphs(lengths)

    def _prewarm_graphs(self, voice: Any, fast: Any) -> None:
        """Capture every frame bucket up to `preset.prewarm_seconds` for the two shortest text buckets."""
        import torch

        from .engine.duration import frames_for_seconds

        cfg = self.resolve_options()
        top = frames_for_seconds(self.preset.prewarm_seconds)
        with hold_model_lock(), torch.inference_mode():
            content, ref = self._reference(voice)
            voice_states = self._voice_states(content, ref, self._caption(voice))
            for tokens in (fast.context_bucket, 2 * fast.context_bucket):
                ids = torch.full((1, tokens), 5, dtype=torch.long)
                conds = self._conditions(ids, torch.ones_like(ids, dtype=torch.bool), voice_states)
                for frames in range(fast.frame_bucket, top + fast.frame_bucket, fast.frame_bucket):
                    noise = torch.zeros(1, frames, self.config.latent_dim, device=self.device)
                    self.sample_latent(conds, noise, cfg)

    @property
    def identity(self) -> dict[str, Any]:
        """What this synthesizer is, as far as the sound goes: content hashes of the model,
        codec and tokenizer files (each once), and the precision it runs at."""
        from .fingerprint import file_fingerprint

        fps = dict(self.fingerprints)
        for name, tok in (("tokenizer", self.tokenizer), ("caption_tokenizer", self.caption_tokenizer)):
            source = getattr(tok, "source", None)  # a hand-built Synthesizer: hash the file it read
            if not fps.get(name) and isinstance(source, str) and os.path.isfile(source):
                fps[name] = file_fingerprint(source)
        caption_tok = fps.get("caption_tokenizer")
        return {
            "model": fps.get("model"),
            "codec": fps.get("codec"),
            "tokenizer": fps.get("tokenizer"),
            "caption_tokenizer": None if caption_tok == fps.get("tokenizer") else caption_tok,
            "precision": [str(self.preset.dtype), str(self.preset.codec_dtype), self.preset.name]
            + [flag for flag in ("int4", "codec_int4") if getattr(self.preset, flag, False)],
        }

    def render_identity(
        self, text: str, voice: Any = None, options: SynthesisOptions | Mapping[str, Any] | None = None
    ) -> dict:
        """Everything that changes the sound of `text` rendered with `voice` and `options`.

        JSON-serialisable; the phrase cache hashes it into its key. The options enter resolved
        (preset defaults filled in), those marked as changing the sound only. `options.seed`
        must be set (a random seed is not reproducible, so such a line cannot be cached).
        """
        from .text.pauses import canonical
        from .voices import Voice

        opts = self.resolve_options(options)
        if opts.seed is None:
            raise InputError("a cacheable line needs a fixed seed (options.seed)")
        if isinstance(voice, (str, os.PathLike)):
            voice = Voice.from_path(voice)
        options_key = opts.audio_identity()
        if self.config.meanflow:  # guidance and schedule change nothing: one key for all of them
            from .engine.sampler import MEANFLOW_IGNORED

            options_key = {k: v for k, v in options_key.items() if k not in MEANFLOW_IGNORED}
        return {
            # after the dictionary and the readings (a new reading is a new line), pauses in one spelling
            "text": "".join(
                p if isinstance(p, str) else canonical(p.seconds) for p in self.spoken_parts(text, opts)
            ),
            "voice": None if voice is None else voice.content_key(),
            "caption": getattr(voice, "caption", None),
            "options": options_key,
            # the family and sampler too: two families never share a line, even on equal files
            "family": self.config.family,
            "sampler": self.sampler_kind,
            **self.identity,
        }

    def reference_latent(self, voice: Any, record: SynthesisRecord | None = None) -> Any:
        """The voice's reference latent (1, T, C) on the model's device, or None; encoded once, cached."""
        with hold_model_lock():
            return self._reference(voice, record)[1]

    def _reference(self, voice: Any, record: SynthesisRecord | None = None) -> tuple[str | None, Any]:
        """(the voice's content key, its reference latent), or (None, None) when it has none used."""
        from .voices import Voice, join_reference_clips, max_reference_frames

        if voice is None:
            return None, None
        if isinstance(voice, (str, os.PathLike)):
            voice = Voice.from_path(voice)
        if not isinstance(voice, Voice):
            raise InputError(f"voice must be a Voice, a path or None, got {type(voice).__name__}")
        if not voice.has_reference:
            return None, None
        if not self.config.speaker_enabled:
            if record is not None:
                record.warnings.append("this model has no speaker branch: the reference voice is ignored")
            return None, None
        content = voice.content_key()  # hashes in-memory audio: once per line
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
        joined = join_reference_clips(latents, cap)
        return content, joined[None].to(self.device, self.model.in_proj.weight.dtype)

    def _clip_latent(self, clip: Any, record: SynthesisRecord | None) -> Any:
        """One clip's latent (T, C) on the CPU: a saved latent read once, a recording encoded once
        (cached in memory and on disk by content, codec and cut)."""
        from .engine.config import DEFAULT_REF_MAX_SECONDS
        from .voices import load_latent

        content = clip.content_key()
        if clip.latent is not None:  # a saved latent: read once, kept in memory
            latent = self.voice_cache.get(content, disk=False)
            if latent is None:
                latent = load_latent(clip.latent, self.config.latent_dim)
                self.voice_cache.put(content, latent, disk=False)
            return latent
        seconds = self.inference.reference_seconds
        cut = "" if seconds == DEFAULT_REF_MAX_SECONDS else f"|cut:{seconds:g}"
        key = f"{content}|codec:{self.fingerprints.get('codec', id(self.codec))}{cut}"
        latent = self.voice_cache.get(key)
        if latent is None:
            latent = self._encode_reference(clip, record, seconds)
            self.voice_cache.put(key, latent)
            self.voice_cache.encodes += 1
        return latent

    # ---- stages -----------------------------------------------------------------------------
    def _prepare_text(self, text: str, opts: SynthesisOptions, record: SynthesisRecord) -> _Plan:
        """The line as pieces to render with the silences between them: a long text split into
        pieces joined by PIECE_GAP_S, pause markup as its exact silence."""
        from .lines import check_line_text
        from .text.pauses import Pause
        from .text.split import split_for_synthesis

        t0 = time.perf_counter()
        parts = self.spoken_parts(check_line_text(text), opts)
        record.text = "".join(p for p in parts if isinstance(p, str))
        record.source = caption_source(text, opts)
        max_len = self.inference.max_text_len or 256
        plan: list[_Piece | float] = []
        for part in parts:
            if isinstance(part, Pause):
                plan.append(part.seconds)
                continue
            queue = split_for_synthesis(part) if opts.seconds is None else [part]
            first = True
            while queue:
                piece = queue.pop(0)
                if len(self.tokenizer.encode(piece)) > max_len:  # over the token limit: split further
                    queue[:0] = self._split_to_token_limit(piece, max_len, record)
                    continue
                tok_ids, tok_mask = self.tokenizer.batch([piece], max_len=max_len, pad_to=opts.pad_text_to)
                if not first:
                    plan.append(PIECE_GAP_S)
                plan.append(_Piece(piece, tok_ids, tok_mask))
                first = False
        pieces = _Plan()
        for entry in plan:
            if isinstance(entry, _Piece):
                pieces.append(entry)
            elif pieces:
                pieces[-1].after += entry
            else:
                pieces.lead += entry
        record.pieces = len(pieces)
        record.timings["tokenize"] = time.perf_counter() - t0
        return pieces

    def _split_to_token_limit(self, part: str, max_len: int, record: SynthesisRecord) -> list[str]:
        """Pieces of `part` that each strictly shrink it, so the caller's loop ends (issue 12:
        a run the splitter cannot cut used to come back unchanged forever). The splitter at
        half the length first; where that makes no progress (a piece too short for it, or
        whitespace it does not count), the longest character prefix within the token limit."""
        from .text.split import measure, split_for_synthesis

        # halve what the splitter counts (non-whitespace): halving len() let "a " * 2000 come
        # back as itself minus a space, 1,874 pieces in all where `seconds` skips the first split
        size = measure(part)
        half = size // 2
        if half >= 8:
            split = split_for_synthesis(part, max_chars=half)
            if len(split) > 1 and all(measure(p) < size for p in split):
                return split
        lo, hi = 1, len(part) - 1  # longest prefix part[:n] that fits (n >= 1 always progresses)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if len(self.tokenizer.encode(part[:mid])) <= max_len:
                lo = mid
            else:
                hi = mid - 1
        if len(part) == 1 or len(self.tokenizer.encode(part[:lo])) > max_len:
            # one character over the limit on its own: dropped, and said
            record.warnings.append(f"text cut to the model's {max_len}-token limit")
            return [part[1:]] if len(part) > 1 else []
        return [p for p in (part[:lo], part[lo:]) if p.strip()]

    def _encode_reference(self, voice: Any, record: SynthesisRecord | None, max_seconds: float) -> Any:
        import torch

        from .audio import prepare_reference

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

    def _caption(self, voice: Any) -> tuple[Any, Any]:
        caption = getattr(voice, "caption", None)
        if not self.config.caption_enabled or not caption:
            return None, None
        from .text.normalize import normalize_or_raise

        max_len = self.inference.max_caption_len or self.inference.max_text_len or 256
        if self.config.pretrained_text:  # v4 only strips the caption; empty: no caption
            caption = caption.strip()
            if not caption:
                return None, None
        else:
            caption = normalize_or_raise(caption)
        ids, mask = self.caption_tokenizer.batch([caption], max_len=max_len)
        return ids.to(self.device), mask.to(self.device)

    def _frames(self, piece: _Piece, conds: Any, has_ref: bool, opts: SynthesisOptions, record) -> int:
        import torch

        from .engine.duration import FRAMES_PER_SECOND, frames_for_seconds, frames_from_prediction
        from .text.length import estimate_seconds

        if opts.seconds is not None:
            if opts.speed != 1.0 and "speed is not used with seconds" not in record.warnings:
                record.warnings.append("speed is not used with seconds")
            return frames_for_seconds(opts.seconds, record.warnings)
        scale = opts.duration_scale / opts.speed  # speed > 1: a shorter line, the same words
        cap_frames = None if opts.max_seconds is None else frames_for_seconds(opts.max_seconds)
        if self.config.use_duration_predictor:
            has = torch.tensor([has_ref], device=self.device)
            pred = self.model.predict_log_frames(conds, has_speaker=has)
            if opts.predictor_cap is not None:
                est = estimate_seconds(piece.text) * opts.predictor_cap * scale
                cap = frames_for_seconds(est)
                cap_frames = cap if cap_frames is None else min(cap, cap_frames)
            frames = frames_from_prediction(pred, scale, cap_frames)[0]
            record.extra.setdefault("duration_source", "predictor")
            return frames
        seconds = estimate_seconds(piece.text) * scale
        record.extra.setdefault("duration_source", "text estimate")
        frames = frames_for_seconds(seconds)
        if cap_frames is not None:
            frames = min(frames, cap_frames)
        return max(frames, int(0.5 * FRAMES_PER_SECOND))

    def sample_latent(self, conds: Any, noise: Any, cfg: SamplerConfig, *, cancel=None, progress=None) -> Any:
        """Run the sampler (the preset's fast path, or the reference loop) with resolved options
        (SynthesisOptions is a SamplerConfig: the sampler reads its own fields of it)."""
        from .engine.sampler import sample

        fast = self.fast_sampler
        if fast is not None:
            return fast.sample(conds, noise, cfg, cancel=cancel, progress=progress)
        return sample(self.model, conds, noise, cfg, cancel=cancel, progress=progress)

    def _voice_states(self, content: str | None, ref: Any, caption: tuple[Any, Any]) -> tuple:
        """(has_reference, speaker/caption states) of a voice: they do not depend on the text, so
        they are encoded once per voice and kept (a few voices, least recently used dropped).
        `content` is the reference's content key (None without a reference)."""
        import torch

        cap_ids = caption[0]
        key = (
            content,
            None if cap_ids is None else tuple(cap_ids[0].tolist()),
            str(self.model.in_proj.weight.dtype),
        )
        hit = self._voice_states_cache.pop(key, None)
        if hit is None:
            ref_mask = (
                None if ref is None else torch.ones(ref.shape[:2], dtype=torch.bool, device=self.device)
            )
            with torch.inference_mode():
                hit = (ref is not None, self.model.encode_voice(1, ref, ref_mask, *caption))
        self._voice_states_cache[key] = hit
        while len(self._voice_states_cache) > VOICE_STATES_KEPT:
            self._voice_states_cache.pop(next(iter(self._voice_states_cache)))
        return hit

    def _conditions(self, ids: Any, mask: Any, voice_states: tuple) -> Any:
        """Conditions of one piece: the text encoded now (graph-replayed on the fast path)."""
        from .engine.model import Conditions, check_ids

        check_ids(ids, mask, self.config.text_token_vocab, "text")
        ids, mask = ids.to(self.device), mask.to(self.device)
        fast = self.fast_sampler
        if fast is not None:
            text_state, mask = fast.encode_text(ids, mask)
        else:
            text_state = self.model.encode_text(ids, mask)
        return Conditions(text_state, mask, *voice_states[1])

    def _render(self, piece, voice_states, seed, opts, record, cancel, progress) -> _Rendered:
        """Encode the text, choose the length, sample; all under the model lock."""
        import torch

        with torch.inference_mode():
            return self._render_inner(piece, voice_states, seed, opts, record, cancel, progress)

    def _render_inner(self, piece, voice_states, seed, opts, record, cancel, progress) -> _Rendered:
        from .engine.duration import HOP, tail_trim_frames
        from .engine.sampler import draw_noise

        t0 = time.perf_counter()
        conds = self._conditions(piece.ids, piece.mask, voice_states)
        frames = self._frames(piece, conds, voice_states[0], opts, record)
        self._sync()
        t1 = time.perf_counter()
        record.timings["duration"] = record.timings.get("duration", 0.0) + (t1 - t0)
        noise = draw_noise(seed, 1, frames, self.config.latent_dim, device=self.device)
        latent = self.sample_latent(conds, noise, opts, cancel=cancel, progress=progress)
        self._sync()
        record.timings["sampling"] = record.timings.get("sampling", 0.0) + (time.perf_counter() - t1)
        record.frames += frames
        record.steps, record.schedule = opts.time_grid()[:2]
        if self.config.meanflow:
            record.schedule = "meanflow"
        samples = frames * HOP
        if opts.seconds is not None:
            samples = min(samples, int(min(opts.seconds, 30.0) * SAMPLE_RATE))
        decode_frames = frames
        if opts.tail_trim:
            end = tail_trim_frames(latent[0])
            if 0 < end < frames:
                samples = min(samples, end * HOP)
                # 8 frames of right context make the kept audio equal to a full decode
                decode_frames = min(frames, end + 8)
                record.extra["trimmed_frames"] = record.extra.get("trimmed_frames", 0) + (frames - end)
        return _Rendered(latent, decode_frames, samples)

    def _decode_chunks(self, rendered: _Rendered, opts, cancel, whole: bool):
        """Yield (float32 numpy chunk, is_last) of one rendered piece, cut to its sample count."""
        import torch

        latent = rendered.latent[:, : rendered.decode_frames].to(self.codec.device, self.codec.dtype)
        first = None
        if opts.chunk_frames is not None:
            chunk = opts.chunk_frames
        elif whole:
            chunk = self.preset.decode_chunk_frames
        else:
            chunk, first = self.preset.stream_chunk_frames, self.preset.stream_first_chunk_frames
        remaining = rendered.samples
        with torch.inference_mode():
            if chunk is None or (chunk >= rendered.decode_frames and first is None):
                with hold_model_lock(cancel):
                    audio = self.codec.decode(latent)
                yield audio[0, 0, :remaining].float().cpu().numpy(), True
                return
            it = self.codec.decode_stream(latent, chunk, cancel=cancel, first_chunk_frames=first)
            while remaining > 0:
                with hold_model_lock(cancel):
                    part = next(it, None)
                    if part is None:
                        return
                    out = part[0, 0, :remaining].float().cpu().numpy()
                remaining -= len(out)
                yield out, remaining <= 0

    def _run(self, pieces: _Plan, voice, opts, record, cancel, progress, *, whole: bool):
        """The line's audio in order: pre_silence, each piece (sampled, decoded, the output
        controls applied) and the silences between them, post_silence."""
        from .controls import PieceGain, needs_processing, needs_whole_piece, process_piece, silence

        if self.note:
            record.warnings.append(self.note)
        record.seed = int(opts.seed) if opts.seed is not None else secrets.randbits(31)
        record.extra["fingerprints"] = self.fingerprints
        # pitch, intonation, loudness (and anything in `synthesize`): each piece decoded whole,
        # then processed; volume alone, streamed: a gain per chunk (no wait for the piece)
        gained = not whole and needs_processing(opts) and not needs_whole_piece(opts)
        post = not gained and needs_processing(opts)

        def quiet(seconds: float) -> np.ndarray:
            gap = silence(seconds, SAMPLE_RATE)
            record.samples += len(gap)
            return gap

        if opts.pre_silence + pieces.lead > 0:
            yield quiet(opts.pre_silence + pieces.lead)
        voice_states = None
        if pieces:  # a line of only pauses needs no model
            t0 = time.perf_counter()
            with hold_model_lock(cancel):
                content, ref = self._reference(voice, record)
                voice_states = self._voice_states(content, ref, self._caption(voice))
            record.timings["reference"] = time.perf_counter() - t0
        line_progress = _LineProgress(progress, pieces) if progress is not None else None
        for i, piece in enumerate(pieces):
            first, last = i == 0, i == len(pieces) - 1
            step = line_progress.step(i) if line_progress is not None else None
            with hold_model_lock(cancel):
                rendered = self._render(piece, voice_states, record.seed, opts, record, cancel, step)
            t_dec = time.perf_counter()
            chunks = self._decode_chunks(rendered, opts, cancel, whole)
            if gained:
                chunks = _gained(chunks, PieceGain(opts, record.warnings))
            elif post:  # decode the whole piece, then process it
                parts = [c for c, _ in chunks]
                whole_piece = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
                t_post = time.perf_counter()
                chunks = iter([(process_piece(whole_piece, SAMPLE_RATE, opts, record.warnings), True)])
                spent = time.perf_counter() - t_post
                record.timings["controls"] = record.timings.get("controls", 0.0) + spent
                t_dec += spent  # the decode's time is without it
            head = True  # each chunk goes out as soon as it is decoded (the first one is first audio)
            for chunk, chunk_is_last in chunks:
                yield _fade_edges(chunk, fade_in=head and not first, fade_out=chunk_is_last and not last)
                head = False
            record.samples += rendered.samples
            record.timings["decode"] = record.timings.get("decode", 0.0) + (time.perf_counter() - t_dec)
            if line_progress is not None:
                line_progress.decoded(i)
            if piece.after > 0:
                yield quiet(piece.after)
        if opts.post_silence > 0:
            yield quiet(opts.post_silence)

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elif self.device.type == "mps":
            torch.mps.synchronize()


def _gained(chunks: Any, gain: Any) -> Any:
    """(chunk, is_last) of one piece with `gain` (controls.PieceGain) applied as they come; its
    note, if the limiter engaged, once the piece has ended."""
    for chunk, is_last in chunks:
        yield gain(chunk), is_last
    gain.finish()


class _LineProgress:
    """The sampler's progress(step, steps) of each piece as progress(done, total) of the whole line.

    Units: every sampler step of every piece, plus one per piece for its decode; so one bar runs
    once across a long text (the splitter's pieces are of similar length) and reaches the end
    when the audio does.
    """

    def __init__(self, progress: Any, pieces: list[_Piece]) -> None:
        self.progress = progress
        self.pieces = len(pieces)
        self.steps = 0

    def _report(self, i: int, units_done: int) -> None:
        per_piece = self.steps + 1
        self.progress(i * per_piece + units_done, self.pieces * per_piece)

    def step(self, i: int) -> Any:
        def report(done: int, steps: int) -> None:
            self.steps = steps
            self._report(i, done)

        return report

    def decoded(self, i: int) -> None:
        if self.steps:
            self._report(i, self.steps + 1)


def caption_source(text: str, options: SynthesisOptions) -> str:
    """`text` as captions show it: as written, less what is neither said nor shown (pause
    markup, and the tags `options.tags="strip"` takes out; lone surrogates, which no file or
    database can hold, as the normalisation drops them); `source_spans.SourceMap` aligns the
    spoken text to it."""
    from .text.normalize import drop_lone_surrogates
    from .text.pauses import strip_markup
    from .text.tags import strip_tags

    shown = strip_markup(drop_lone_surrogates(text))
    return strip_tags(shown) if options.tags == "strip" else shown


def _with_bos(tok: Any, add_bos: bool) -> Any:
    """The same tokenizer with BOS on or off (the caption's `caption_add_bos`)."""
    from .text.tokenizer import TextTokenizer

    return TextTokenizer(tok._tok, add_bos=add_bos, bos_id=tok.bos_id, pad_id=tok.pad_id, source=tok.source)


def load_dit(path: Any, preset: Any) -> Any:
    """The DiT for `preset`, by the loader its file needs: float files by the engine's, int4 files
    by quant's; with preset.int4 a float file is RTN-quantised at load."""
    import warnings

    from .engine.checkpoint import is_torchao_file, load_checkpoint, read_header, torchao_error

    meta, shapes = read_header(path)
    if is_torchao_file(meta, shapes):  # before any loader: the -Quantized releases are not read
        raise torchao_error(str(path))
    if "quant_method" in meta:
        from .quant.checkpoint import load_int4_model

        return load_int4_model(path, dtype=preset.dtype, device=preset.device)
    if not preset.int4:
        return load_checkpoint(path, dtype=preset.dtype, device=preset.device)
    from .quant.checkpoint import model_from_int4
    from .quant.quantize import quantize_checkpoint

    warnings.warn(
        f"{path} holds float weights: quantising them to int4 with RTN at load. A GPTQ file "
        "(irodori-speaker quantize, or the released int4 checkpoints) keeps more quality.",
        UserWarning,
        stacklevel=3,
    )
    report = quantize_checkpoint(path, None, method="rtn", report_errors=False, device=preset.device)
    return model_from_int4(
        report.checkpoint, f"{path} (int4 RTN at load)", dtype=preset.dtype, device=preset.device
    )


def load_codec_for(path: Any, preset: Any) -> Any:
    """The codec for `preset` on `preset.codec_device` (default: the DiT's device): float
    (`engine.codec.load_codec`), or with preset.codec_int4 its decoder packed as RTN int4
    (`quant.codec.load_int4_codec`)."""
    device = preset.codec_device or preset.device
    if preset.codec_int4:
        from .quant.codec import load_int4_codec

        return load_int4_codec(path, device=device, dtype=preset.codec_dtype)
    from .engine.codec import load_codec

    return load_codec(path, device=device, dtype=preset.codec_dtype)


def load_synthesizer(
    model: str | os.PathLike | None = None,
    *,
    codec: str | os.PathLike | None = None,
    tokenizer: Any = None,
    backend: str = "auto",
    device: str | None = None,
    dtype: str | None = None,
    tiny_random: bool | str = False,
    voice_cache_dir: str | os.PathLike | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    preset: Any = None,
    user_dict: Any = None,
    **preset_overrides: Any,
) -> Synthesizer:
    """Load model, codec and tokenizer from sources (local paths, hf:// URIs, repo ids).

    `tiny_random=True` (or "v2"/"v3") builds a small random model in the real formats: the
    whole pipeline runs offline, and its output is noise. Two seams for benchmarks and tests:
    `tokenizer` may be a tokenizer object (with `encode` and `batch`, as `TextTokenizer`; its
    `fingerprint` attribute, else its class name, goes into cache keys), and `preset` a
    `Preset` used instead of the backend's (`device`, `dtype` and overrides still apply), or a
    mapping of preset fields (`preset={"int4": True}`) applied to the backend's.
    `user_dict`: the user dictionary applied to every line (None: the default file,
    `text/userdict.py`; False: none).
    """
    from pathlib import Path

    import torch

    from .backends.presets import select_preset
    from .engine.checkpoint import resolve_dtype
    from .engine.sources import CODEC_REPO, DEFAULT_MODEL, TOKENIZER_REPO, resolve, resolve_files
    from .fingerprint import file_fingerprint
    from .text.tokenizer import TextTokenizer
    from .voices import VoiceCache, default_voice_cache_dir

    if isinstance(preset, Mapping):  # preset fields by name: overrides of the backend's preset
        preset_overrides = {**preset, **preset_overrides}
        preset = None
    given_tok = tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike))
    if given_tok and not all(callable(getattr(tokenizer, m, None)) for m in ("encode", "batch")):
        raise InputError(
            f"tokenizer must be a path, a source or a tokenizer object, got {type(tokenizer).__name__}",
            hint="a tokenizer object needs encode(text) and batch(texts, max_len=, pad_to=)",
        )
    overrides = dict(preset_overrides)
    if device is not None:
        overrides["device"] = device
    if dtype is not None:
        overrides["dtype"] = resolve_dtype(dtype)
    preset = preset.with_overrides(**overrides) if preset is not None else select_preset(backend, **overrides)
    if preset.threads:
        torch.set_num_threads(preset.threads)
    note = None
    tok_path: Path | None
    if tiny_random:
        from .engine.tiny import tiny_random_files

        files = tiny_random_files(kind=tiny_random if isinstance(tiny_random, str) else "v2")
        model_path, codec_path, tok_path = files.model, files.codec, files.tokenizer
        note = "tiny-random model: the output is noise, not speech"
    else:
        # all three at once, so a first run offline names every missing file in one error
        model_path, codec_path, tok_path = resolve_files(
            model or DEFAULT_MODEL,
            codec or CODEC_REPO,
            tokenizer,
            cache_dir=cache_dir,
            want_tokenizer=not given_tok,
        )
    with hold_model_lock():  # the weights go to the device: no other model work meanwhile
        loaded = load_dit(model_path, preset)
    cfg = loaded.config
    cap_path: Any = None
    if given_tok:
        text_tok = tokenizer
    elif cfg.pretrained_text:  # v4: the release's tokenizer/ folder, for text and caption
        from .text.backbone_tokenizer import tokenizer_for_model

        text_tok = tokenizer_for_model(tok_path, model_path, cfg.text_backbone, add_bos=cfg.text_add_bos)
        tok_path = cap_path = Path(text_tok.source)  # its tokenizer.json (hashed for the cache key)
    else:
        if tok_path is None:
            tok_source = tokenizer or cfg.text_tokenizer_repo or TOKENIZER_REPO
            tok_path = resolve(tok_source, "tokenizer", cache_dir=cache_dir)
        text_tok = TextTokenizer.from_file(
            tok_path, add_bos=cfg.text_add_bos, expected_vocab_size=cfg.text_vocab_size
        )
    caption_tok = None
    if cfg.caption_enabled and given_tok:
        caption_tok = text_tok
    elif cfg.caption_enabled and cfg.pretrained_text:
        add_bos = cfg.caption_add_bos if cfg.caption_add_bos is not None else cfg.text_add_bos
        caption_tok = text_tok if add_bos == text_tok.add_bos else _with_bos(text_tok, add_bos)
    elif cfg.caption_enabled:
        same = cfg.caption_tokenizer_repo in (None, cfg.text_tokenizer_repo) and tokenizer is None
        cap_path = tok_path if same or tiny_random else resolve(cfg.caption_tokenizer_repo, "tokenizer")
        add_bos = cfg.caption_add_bos if cfg.caption_add_bos is not None else cfg.text_add_bos
        caption_tok = TextTokenizer.from_file(
            cap_path, add_bos=add_bos, expected_vocab_size=cfg.caption("vocab_size")
        )
    with hold_model_lock():
        codec_model = load_codec_for(codec_path, preset)
    if voice_cache_dir is False:
        cache = VoiceCache()
    elif voice_cache_dir is None or voice_cache_dir is True:
        cache = VoiceCache(default_voice_cache_dir())
    else:
        cache = VoiceCache(voice_cache_dir)
    fingerprints = {
        "model": file_fingerprint(model_path),
        "codec": file_fingerprint(codec_path),
        "tokenizer": (
            file_fingerprint(tok_path)
            if tok_path is not None and not given_tok
            else str(getattr(text_tok, "fingerprint", None) or f"object:{type(text_tok).__qualname__}")
        ),
    }
    if caption_tok is not None and not given_tok and cap_path is not None and cap_path != tok_path:
        fingerprints["caption_tokenizer"] = file_fingerprint(cap_path)
    return Synthesizer(
        loaded.model,
        codec_model,
        text_tok,
        caption_tokenizer=caption_tok,
        inference=loaded.inference,
        preset=preset,
        voice_cache=cache,
        fingerprints=fingerprints,
        note=note,
        user_dict=user_dict,
    )
