"""One utterance end to end: text (+ voice) -> 48 kHz mono float32 audio and a record.

    synth = load_synthesizer()                     # irodori_speaker.synthesis.loading
    result = synth.synthesize("こんにちは。", voice, {"seed": 3})
    for chunk in synth.stream(text, voice, options): ...

The line's plan (the spoken text, its pieces and silences, `plan.py`) is made first, with no
model work; then per piece: the voice's states (`voice_conditions.py`, the `voices` member),
the text encoder and the length (`encoding.py`: those of lines that meet run as one batch), the
sampler, the tail trim and the decode (`decoding.py`), each stage and decode window a job of the
device owner (engine/hardware/owner.py: run on its thread when lines meet, inline under the model
lock when a line is alone), then the output controls (audio/controls.py), and the chunks go out
as they are decoded.

The data types it speaks (`SynthesisOptions`, `SynthesisRecord`, `SynthesisResult`,
`AudioStream`, the `SynthesizerLike` protocol) live in the torch-free `irodori_speaker.options`.
Options are resolved against the device preset once per line (`Synthesizer.resolve_options`);
every stage reads that one object.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..audio.controls import PieceGain, needs_processing, needs_whole_piece, process_piece, silence
from ..cancel import CancelToken
from ..engine.batch import BATCH_BUCKETS, batch_bucket, frame_mask, signature, stack_conditions, stack_noise
from ..engine.codec import stream_window_keys
from ..engine.config import InferenceConfig
from ..engine.duration import (
    FRAMES_PER_SECOND,
    HOP,
    frames_for_seconds,
    frames_from_prediction,
    trim_frame,
)
from ..engine.fast import FastDiT, FastSampler
from ..engine.hardware.cuda_device import on_cuda_device, steps_on_device
from ..engine.hardware.memory import budget_errors
from ..engine.hardware.owner import DEVICE
from ..engine.hardware.presets import select_preset
from ..engine.model import Conditions
from ..engine.sampler import draw_noise, sample
from ..engine.steps import Joining, StepBatcher, StepLine
from ..options import (
    SAMPLE_RATE,
    AudioStream,
    SamplerConfig,
    SynthesisOptions,
    SynthesisRecord,
    SynthesisResult,
)
from ..text.length import estimate_seconds
from ..text.pauses import Pause
from ..text.userdict import resolve_user_dict
from .batching import SampleBatcher, SampleRequest
from .decoding import Playback, Rendered, decode_chunks
from .encoding import EncodeItem, TextEncoders
from .fingerprint import file_fingerprint
from .identity import ModelIdentity, resolve_options
from .plan import LineProgress, Piece, Plan, plan_line, spoken_parts
from .prewarm import prewarm_synthesizer
from .stepping import StepScheduler
from .voice_conditions import VoiceConditions
from .voices import VoiceCache

__all__ = ["EDGE_FADE_S", "Synthesizer"]

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


class Synthesizer:
    """Text (+ voice) -> 48 kHz mono float32 audio. Synchronous; thread-safe through MODEL_LOCK.

    The voice side (reference latents, captions, voice states) is its member `voices`, a
    `VoiceConditions` (voice_conditions.py)."""

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
        voice_cache: VoiceCache | None = None,
        fingerprints: dict[str, str] | None = None,
        note: str | None = None,
        user_dict: Any = None,
    ) -> None:
        self.model = model
        self.codec = codec
        self.tokenizer = tokenizer
        self.caption_tokenizer = caption_tokenizer or tokenizer
        self.inference = inference or InferenceConfig()
        self.preset = preset or select_preset("cpu")
        self.fingerprints = dict(fingerprints or {})
        self.note = note  # e.g. "tiny-random model: the output is noise"
        self.user_dict = resolve_user_dict(user_dict)  # None (the default file), a path, or False
        self.device = next(model.parameters()).device
        self.voices = VoiceConditions(
            model,
            codec,
            self.inference,
            self.caption_tokenizer,
            voice_cache if voice_cache is not None else VoiceCache(),
            codec_key=self.fingerprints.get("codec", id(codec)),
        )
        self._fast = None  # engine.fast.FastSampler, built on first use when the preset asks for it
        # the encoders of lines that meet on the device owner run as one batch (encoding.py)
        self._encoders = TextEncoders(
            model, lambda: self.fast_sampler, self._sample_key, self.preset.max_batch
        )
        # lines waiting for the sampler at the same time go as one batch (batching.py)
        self._steps: StepBatcher | None = None  # engine.steps, built on first use
        self._batcher: SampleBatcher | StepScheduler
        if self.preset.max_batch > 1 and self.preset.step_batching:
            self._batcher = StepScheduler(
                self._start_lines,
                self._step_lines,
                self._sample_batch,
                self.preset.max_batch,
                release=self._release_lines,
            )
        else:
            self._batcher = SampleBatcher(
                self._sample_batch,
                self.preset.max_batch,
                max_padding=self.preset.max_padding,
                fill_buckets=self._graphed(),  # a batch filled up to its bucket: cut, not filled
                admit_s=self.preset.sample_admit_s,
                admit_up_to=self.preset.sample_admit_up_to,
                admit_backlog=self.preset.sample_admit_backlog,
                admit_encoders=self.preset.sample_admit_encoders,
            )
        codec_device = getattr(codec, "device", None)
        if self.preset.codec_channels_last and hasattr(codec, "use_channels_last"):
            codec.use_channels_last(True)  # before the graphs: they capture whichever path is on
        if self.preset.codec_graphs and codec_device is not None and codec_device.type == "cuda":
            # the stream's first and middle windows replayed from graphs, captured by prewarm; other
            # lengths (a line's last window) stay eager: a capture mid-stream would cost more
            shapes = len(self._window_keys()) * (1 + len(self._decode_rows()))
            codec.use_graphs(True, capture_on_use=None, max_graphs=max(8, shapes))
        if self.device.type == "cuda" and self.preset.owner_queue_depth:
            DEVICE.queue_depth = self.preset.owner_queue_depth  # one owner: process-wide
        if self.device.type == "cuda" and self.preset.owner_decode_stream and self.preset.max_batch > 1:
            DEVICE.decode_stream = True  # process-wide, as the queue depth
        self.prewarm_report: dict[str, Any] = {}

    @property
    def fast_sampler(self):
        """The preset's fast sampling path (None when the preset uses the reference loop)."""
        if self._fast is None and self.preset.fast_path:
            self._fast = FastSampler(self.model, use_graphs=self._graphed(), upload=DEVICE.upload)
        return self._fast

    def _graphed(self) -> bool:
        """Whether sampling replays CUDA graphs (the fast sampler, built on first use: a caller
        may still change the model, as FP8 quantisation does, before any line)."""
        return bool(self.preset.fast_path and self.preset.cuda_graphs and self.device.type == "cuda")

    # ---- public API -------------------------------------------------------------------------
    @property
    def config(self):
        return self.model.cfg

    @property
    def voice_cache(self) -> VoiceCache:
        """The encoded reference latents, by voice content and codec (`voices.cache`)."""
        return self.voices.cache

    def reference_latent(self, voice: Any, record: SynthesisRecord | None = None) -> Any:
        """The voice's reference latent (1, T, C) on the model's device, or None; encoded once, cached."""
        with on_cuda_device(self.device):
            return self.voices.reference_latent(voice, record)

    def spoken_text(self, text: str, options: SynthesisOptions | Mapping[str, Any] | None = None) -> str:
        """What the model reads for `text` (pause markup taken out: `spoken_parts` keeps the pauses)."""
        return "".join(p for p in self.spoken_parts(text, options) if isinstance(p, str))  # Pauses dropped

    def spoken_parts(
        self, text: str, options: SynthesisOptions | Mapping[str, Any] | None = None
    ) -> list[str | Pause]:
        """`text` split at its pause markup (`text/pauses.py`): each text part as the model reads
        it (`spoken_text`), and the Pauses between them. Without markup: `[spoken_text(text)]`.
        A part with nothing to say between pauses is dropped; a line of only pauses is silence."""
        return spoken_parts(text, options, self.user_dict)

    def resolve_options(
        self, options: SynthesisOptions | Mapping[str, Any] | None = None
    ) -> SynthesisOptions:
        """`options` as this synthesizer renders them: checked, `None` preset-backed options
        (steps, schedule, sway_coeff) filled from the preset, size options bounded by the model.

        The one place the preset fallback happens: the stages, the CLI, the benchmarks and the
        phrase-cache key all read the object it returns. `options` may be a mapping of options.
        """
        return resolve_options(self.config, self.inference, self.preset, options)

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
        # each resumption on the model's CUDA device (engine/hardware/cuda_device.py)
        chunks = steps_on_device(
            self.device, self._run(pieces, voice, opts, record, cancel, progress, whole=_whole)
        )
        budget = getattr(self.preset, "max_gpu_memory", None)  # past it: OverBudgetError, not a raw OOM
        return AudioStream(budget_errors(chunks, budget), record)

    def prewarm(self, voice: Any = None, *, batch_voices: Sequence[Any] = ()) -> float:
        """Absorb first-call costs before the first real line; returns the wall time in seconds.

        One short dummy synthesis (allocator, kernel selection, autotune); with CUDA graphs also
        the capture of every length bucket up to `preset.prewarm_seconds` for the two shortest
        text buckets and this voice, so no real line pays a capture (and with `max_batch` > 1 the
        batch buckets' graphs). `batch_voices`: the other voices lines will be spoken in (a
        server's voice book): their single-line graphs too (once per context bucket; ~0.1 s a
        graph, 38 a voice at the defaults) and, with `max_batch` > 1, the batch graphs of each
        one's reference rung, so their lines batch (synthesis/prewarm.py). `self.prewarm_report`
        says what was done.
        """
        with on_cuda_device(self.device):
            return prewarm_synthesizer(self, voice, batch_voices)

    def _window_keys(self) -> list[tuple[int, tuple[int, int]]]:
        """(length, crop) of the stream's windows that get graphs: its first and middle windows and
        the shorter lengths a line's last window may take (`preset.stream_tail_windows`), or with a
        window plan (`preset.stream_window_plan`) its first window and the plan's lengths; each with
        the crops its windows take (`codec.streaming.stream_window_keys`: a line's first, middle and
        last windows keep different ends)."""
        return stream_window_keys(
            self.preset.stream_chunk_frames,
            first_chunk_frames=self.preset.stream_first_chunk_frames,
            growth=self.preset.stream_chunk_growth,
            plan_lengths=tuple(self.preset.stream_window_plan),
            tail_lengths=tuple(self.preset.stream_tail_windows),
        )

    def _window_lengths(self) -> list[int]:
        """The lengths (frames) of `_window_keys`, in order."""
        return list(dict.fromkeys(n for n, _ in self._window_keys()))

    def _decode_rows(self) -> list[int]:
        """The batch buckets of stream windows decoded together (`preset.decode_batch`)."""
        # only where lines are expected to meet (max_batch > 1): one stream keeps its memory
        top = min(int(self.preset.decode_batch), int(self.preset.max_batch))
        return [b for b in BATCH_BUCKETS if b <= batch_bucket(top)] if top > 1 else []

    @property
    def model_identity(self) -> ModelIdentity:
        """What the phrase-cache key needs of this synthesizer (identity.py: the same as
        `model_identity()` finds for its files without loading them)."""
        fps = dict(self.fingerprints)
        for name, tok in (("tokenizer", self.tokenizer), ("caption_tokenizer", self.caption_tokenizer)):
            source = getattr(tok, "source", None)  # a hand-built Synthesizer: hash the file it read
            if not fps.get(name) and isinstance(source, str) and os.path.isfile(source):
                fps[name] = file_fingerprint(source)
        return ModelIdentity(self.config, self.inference, self.preset, fps, self.user_dict)

    @property
    def identity(self) -> dict[str, Any]:
        """What this synthesizer is, as far as the sound goes: content hashes of the model,
        codec and tokenizer files (each once), and the precision it runs at."""
        return self.model_identity.identity

    def render_identity(
        self, text: str, voice: Any = None, options: SynthesisOptions | Mapping[str, Any] | None = None
    ) -> dict:
        """Everything that changes the sound of `text` rendered with `voice` and `options`.

        JSON-serialisable; the phrase cache hashes it into its key. The options enter resolved
        (preset defaults filled in), those marked as changing the sound only. `options.seed`
        must be set (a random seed is not reproducible, so such a line cannot be cached).
        """
        return self.model_identity.render_identity(text, voice, options)

    # ---- stages -----------------------------------------------------------------------------
    def _prepare_text(self, text: str, opts: SynthesisOptions, record: SynthesisRecord) -> Plan:
        """The line as pieces to render with the silences between them (plan.py; no model work)."""
        max_len = self.inference.max_text_len or 256
        return plan_line(text, opts, record, self.tokenizer, max_len, self.user_dict)

    def _sample_key(self, conds: Conditions, opts: SynthesisOptions) -> Any:
        """The plan's key only where whole-line batches match lines by it (the step scheduler
        steps lines of any plan together)."""
        batches = isinstance(self._batcher, SampleBatcher) and self._batcher.max_batch > 1
        return signature(self.model, conds, opts) if batches else None

    def _frames(self, piece: Piece, pred: Any, opts: SynthesisOptions, record) -> int:
        """The piece's latent frames: asked seconds, the predictor's `pred` (on the host), or the
        text's estimate."""
        if opts.seconds is not None:
            if opts.speed != 1.0 and "speed is not used with seconds" not in record.warnings:
                record.warnings.append("speed is not used with seconds")
            return frames_for_seconds(opts.seconds, record.warnings)
        scale = opts.duration_scale / opts.speed  # speed > 1: a shorter line, the same words
        cap_frames = None if opts.max_seconds is None else frames_for_seconds(opts.max_seconds)
        if pred is not None:
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

    def sample_latent(
        self, conds: Any, noise: Any, cfg: SamplerConfig, *, cancel=None, progress=None, frames=None
    ) -> Any:
        """Run the sampler (the preset's fast path, or the reference loop) with resolved options
        (SynthesisOptions is a SamplerConfig: the sampler reads its own fields of it). `frames`:
        each row's own length, for rows that are several lines (`engine.batch`)."""
        fast = self.fast_sampler
        if fast is not None:
            return fast.sample(conds, noise, cfg, cancel=cancel, progress=progress, frames=frames)
        mask = None if frames is None else frame_mask(frames, noise.shape[1], self.device, DEVICE.upload)
        return sample(self.model, conds, noise, cfg, latent_mask=mask, cancel=cancel, progress=progress)

    def _sample_batch(self, reqs: list, cancel: Any, progress: Any) -> list:
        """Sample `reqs` (SampleRequests of one signature) together; a job of the device owner."""
        if len(reqs) == 1:  # alone: as before batching (on CUDA from its graph)
            r = reqs[0]
            noise = DEVICE.upload(r.noise, self.device)
            outs = [self.sample_latent(r.conds, noise, r.cfg, cancel=cancel, progress=progress)]
        else:
            conds = stack_conditions([r.conds for r in reqs])
            noise, lengths = stack_noise([r.noise for r in reqs])
            noise = DEVICE.upload(noise, self.device)
            latent = self.sample_latent(
                conds, noise, reqs[0].cfg, cancel=cancel, progress=progress, frames=lengths
            )
            outs = [latent[b : b + 1, :n] for b, n in enumerate(lengths)]
        _made(reqs, outs)
        return outs

    def _start_lines(self, reqs: list[SampleRequest]) -> list[StepLine]:
        """Lines joining the step batch (stepping.py) together: their contexts and plans, on the
        owner thread (`StepBatcher.start_many`: one context call for the lines that match)."""
        # the noise stays on the host: the batcher uploads that of the lines its pool holds now
        joining = [Joining(r.conds, r.noise, r.cfg, r.cancel, r.progress, r) for r in reqs]
        return self._step_batcher().start_many(joining)

    def _step_batcher(self) -> StepBatcher:
        if self._steps is None:
            fast = self.fast_sampler
            dit = fast.fast if fast is not None else FastDiT(self.model, fused=False)
            self._steps = StepBatcher(dit, max_padding=self.preset.max_padding, upload=DEVICE.upload)
        return self._steps

    def _step_lines(self, lines: list[StepLine]) -> list[StepLine]:
        assert self._steps is not None
        finished = self._steps.step(lines)
        done = [line for line in finished if line.error is None and isinstance(line.tag, SampleRequest)]
        _made([line.tag for line in done], [line.latent() for line in done])
        return finished

    def _release_lines(self, lines: list[StepLine]) -> None:
        if self._steps is not None:
            self._steps.release(lines)

    def _conditions(self, ids: Any, mask: Any, voice_states: tuple) -> Any:
        """Conditions of one piece: the text encoded now (graph-replayed on the fast path)."""
        [(text_state, mask)] = self._encoders.text_states([ids], [mask])
        return Conditions(text_state, mask, *voice_states[1])

    def _render(self, piece, voice_states, seed, opts, record, cancel, progress) -> Rendered:
        """Encode the text and choose the length (a job of the device owner), sample (with the lines
        waiting beside it, `batching.py`), trim the tail. `voice_states()`: the line's voice."""
        with torch.inference_mode():
            return self._render_inner(piece, voice_states, seed, opts, record, cancel, progress)

    def _render_inner(self, piece, voice_states, seed, opts, record, cancel, progress) -> Rendered:
        stage: list[float] = []

        def prepare() -> SampleRequest:
            item = EncodeItem(piece.ids, piece.mask, voice_states, opts)
            conds, key, pred = self._encoders.encode(item, cancel)  # with other lines' (encoding.py)
            frames = self._frames(piece, None if pred is None else pred.wait(cancel), opts, record)
            noise = draw_noise(seed, 1, frames, self.config.latent_dim)  # on the host: jobs upload it
            stage[:] = [item.started, time.perf_counter()]
            return SampleRequest(conds, noise, opts, key, cancel=cancel, progress=progress, length=frames)

        req, latent = self._batcher.sample(prepare, cancel)
        t0, t1, t2 = stage[0], stage[1], time.perf_counter()
        frames = req.length
        record.timings["duration"] = record.timings.get("duration", 0.0) + (t1 - t0)
        # sampling: from the encoders' end to the latent, the wait for a batch included
        record.timings["sampling"] = record.timings.get("sampling", 0.0) + (t2 - t1)
        record.extra["sample_batch"] = max(record.extra.get("sample_batch", 1), req.batch_size)
        record.frames += frames
        record.steps, record.schedule = opts.time_grid()[:2]
        if self.config.meanflow:
            record.schedule = "meanflow"
        samples = frames * HOP
        if opts.seconds is not None:
            samples = min(samples, int(min(opts.seconds, 30.0) * SAMPLE_RATE))
        trim = None
        if opts.tail_trim:
            trim = req.trim
            if trim is None:  # a sampler path that did not make it with the latent
                trim = DEVICE.run(lambda: DEVICE.to_host(trim_frame(latent[0])), cancel)
        # the trim is applied where the decode needs it (`Rendered.settle`): a streamed line's
        # first window may go to the device before the trim frame has landed
        return Rendered(latent, frames, samples, trim, ready=req.ready)

    def _run(self, pieces: Plan, voice, opts, record, cancel, progress, *, whole: bool):
        """The line's audio in order: pre_silence, each piece (sampled, decoded, the output
        controls applied) and the silences between them, post_silence."""
        if self.note:
            record.warnings.append(self.note)
        record.seed = int(opts.seed) if opts.seed is not None else secrets.randbits(31)
        record.extra["fingerprints"] = self.fingerprints
        # pitch, intonation, loudness (and anything in `synthesize`): each piece decoded whole,
        # then processed; volume alone, streamed: a gain per chunk (no wait for the piece)
        gained = not whole and needs_processing(opts) and not needs_whole_piece(opts)
        post = not gained and needs_processing(opts)

        playback = Playback()  # the line's audio handed out: its windows' deadlines count from it

        def quiet(seconds: float) -> np.ndarray:
            gap = silence(seconds, SAMPLE_RATE)
            record.samples += len(gap)
            playback.handed(len(gap))
            return gap

        if opts.pre_silence + pieces.lead > 0:
            yield quiet(opts.pre_silence + pieces.lead)
        states: list[tuple] = []
        kept_by = self.voices.key(voice, record)  # host work on this thread, not the device owner's

        def voice_states() -> tuple:
            """The voice's states, made by the first piece (inside its `prepare`, so a line
            that is still reading its reference counts as on its way to the sampler)."""
            if not states:
                t0 = time.perf_counter()
                states.append(self.voices.states(voice, record, kept_by))  # in the encoders' job
                record.timings["reference"] = time.perf_counter() - t0
            return states[0]

        line_progress = LineProgress(progress, pieces) if progress is not None else None
        for i, piece in enumerate(pieces):
            first, last = i == 0, i == len(pieces) - 1
            step = line_progress.step(i) if line_progress is not None else None
            with self._batcher.line():  # in flight: lines about to sample may wait for it
                rendered = self._render(piece, voice_states, record.seed, opts, record, cancel, step)
                t_dec = time.perf_counter()
                chunks = decode_chunks(self.codec, self.preset, rendered, opts, cancel, whole, playback)
                if gained:
                    chunks = PieceGain(opts, record.warnings).chunks(chunks)
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
                if rendered.trimmed:
                    record.extra["trimmed_frames"] = record.extra.get("trimmed_frames", 0) + rendered.trimmed
                record.timings["decode"] = record.timings.get("decode", 0.0) + (time.perf_counter() - t_dec)
            if line_progress is not None:
                line_progress.decoded(i)
            if piece.after > 0:
                yield quiet(piece.after)
        if opts.post_silence > 0:
            yield quiet(opts.post_silence)


def _made(reqs: list, latents: list[Any]) -> None:
    """In the job that made the lines' latents (1, S, C each): each line's tail-trim frame, copied
    to the host without waiting (the line reads it there instead of queueing a job of its own),
    and one event after them all, which their decode waits for on its own stream (`ready`). A
    batch's frames go as one copy (one pinned buffer and one event on the device owner, not one
    a line)."""
    trims = [
        (req, trim_frame(latent[0]))
        for req, latent in zip(reqs, latents)
        if getattr(req.cfg, "tail_trim", False)
    ]
    if len(trims) > 1:
        frames = torch.stack([frame for _, frame in trims])[:, None]
        copies = DEVICE.to_host_rows(frames, [(0, 1)] * len(trims))
    else:
        copies = [DEVICE.to_host(frame) for _, frame in trims]
    for (req, _), copy in zip(trims, copies):
        req.trim = copy
    ready = DEVICE.ready_mark(latents[0]) if latents else None
    for req in reqs:
        req.ready = ready
