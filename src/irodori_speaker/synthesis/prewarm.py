"""Prewarm: first-call costs paid before the first real line (`Synthesizer.prewarm`).

One short dummy synthesis (allocator, kernel selection, autotune) and the duration predictor's
first calls (its fused kernels compiled); with CUDA graphs every graph
a real line would otherwise capture mid-stream (a capture stalls every waiting line):
- the single-line sampling graphs of every frame bucket up to `preset.prewarm_seconds`, for the
  two shortest text buckets, in the prewarm voice and each of `batch_voices` of another
  context bucket (the LRU grown to hold them all);
- with `max_batch` > 1 the whole-line batch graphs (per batch bucket and coarse frame bucket) for
  the text rungs 64 and 128 and the prewarm voice and each of `batch_voices` whose batch shape is
  new: a batch's conditions are padded to a rung (`engine.fast.context_rung`), so texts up to 128
  tokens and voices of many reference lengths share a few shapes (a batch of several voices
  takes its longest one's rung); and the text encoder's per batch bucket for every text length
  up to 128 tokens (lines that meet are encoded together, padded to the context bucket);
- with step batching, the step batcher's buckets (engine/step_graphs.py) and its line starts'
  for the prewarm voice and each of `batch_voices` (engine/start_graphs.py);
- the codec's stream windows (and their batches).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from ..engine.batch import BATCH_BUCKETS, batch_bucket, stack_conditions
from ..engine.duration import frames_for_seconds
from ..engine.fast import TEXT_RUNG_LEAST
from ..engine.hardware.lock import hold_model_lock
from ..engine.hardware.memory import step_pool_size
from ..engine.kernels.tuning import tuning_allowed
from ..errors import IrodoriError
from ..options import SynthesisOptions
from ..text.english import english_backends
from ..text.length import estimate_seconds
from .stepping import StepScheduler

if TYPE_CHECKING:
    from ..engine.fast import FastSampler

# `synth` below is a synthesis.synthesizer.Synthesizer (not imported: it imports this module)
Synthesizer = Any

log = logging.getLogger(__name__)


def prewarm_synthesizer(synth: Synthesizer, voice: Any = None, batch_voices: Sequence[Any] = ()) -> float:
    """`synth.prewarm(voice, batch_voices=...)`: the wall time in seconds; sets `prewarm_report`,
    each stage's seconds in its "stage_seconds" (each logged as it ends: a first start on a new
    machine compiles and times kernels for minutes, and its log says where)."""
    t0 = time.perf_counter()
    fast = synth.fast_sampler
    before = (0, 0) if fast is None else (fast.captures, fast.text_captures)
    stages: dict[str, float] = {}
    with _stage(stages, "readers"):
        estimate_seconds("こんにちは。")  # loads the reading dictionary (pyopenjtalk) once
        english_backends()  # and the English reader (e2k), so the first English word pays nothing
    with tuning_allowed():  # kernel choosers measure here, not mid-stream (engine/kernels/tuning.py)
        with _stage(stages, "first line"):
            synth.synthesize("こんにちは。", voice, SynthesisOptions(seconds=1.0, seed=0))
        with _stage(stages, "duration predictor"):
            predictor_calls(synth, voice)
        steps = starts = batch_shapes = 0
        if fast is not None and fast.use_graphs:
            with _stage(stages, "sampling graphs"):
                batch_shapes = line_graphs(synth, voice, fast, batch_voices)
            with _stage(stages, "step graphs"):
                steps, starts = step_graphs(synth, fast, [voice, *batch_voices])
        with _stage(stages, "codec graphs"):
            codec = codec_graphs(synth)
    captured = (0, 0) if fast is None else (fast.captures - before[0], fast.text_captures - before[1])
    seconds = time.perf_counter() - t0
    synth.prewarm_report = {
        "seconds": seconds,
        "stage_seconds": stages,
        "graphs_captured": captured[0],
        "text_graphs_captured": captured[1],
        "codec_graphs_captured": codec,
        "step_graphs_captured": steps,
        "start_graphs_captured": starts,
        "batch_voice_shapes": batch_shapes,
        "voice": repr(voice),
    }
    return seconds


@contextmanager
def _stage(stages: dict[str, float], name: str) -> Iterator[None]:
    """Time a stage of prewarm into `stages[name]` and log it as it ends."""
    t0 = time.perf_counter()
    yield
    stages[name] = time.perf_counter() - t0
    log.info("prewarm: %s in %.2f s", name, stages[name])


def predictor_calls(synth: Synthesizer, voice: Any) -> None:
    """The duration predictor for one line and, with `max_batch` > 1, two lines met: the dummy
    line above asks its seconds, so without this the first line that asks none (every `serve`
    client's) would compile the fused predictor's kernels (engine/fast_duration.py)."""
    if not synth.config.use_duration_predictor:
        return
    fast = synth.fast_sampler
    tokens = fast.context_bucket if fast is not None else 32  # a line's text is padded to a bucket
    with hold_model_lock(), torch.inference_mode():
        conds = _conditions(synth, tokens, synth.voices.states(voice))
        for rows in (1, 2) if synth.preset.max_batch > 1 else (1,):
            synth._encoders.predict([conds] * rows, [True] * rows)


def codec_graphs(synth: Synthesizer) -> int:
    """Capture the codec's graphs for the stream's windows: each length with the crops its windows
    take (`Synthesizer._window_keys`), for one line and for the batches of lines that meet."""
    if not synth.preset.codec_graphs or not hasattr(synth.codec, "prewarm_graphs"):
        return 0
    keys = synth._window_keys()
    captured = 0
    with hold_model_lock():
        for rows in (1, *synth._decode_rows()):  # windows of lines that meet, decoded as one batch
            for n, crop in keys:
                captured += synth.codec.prewarm_graphs([n], batch=rows, crop=crop)
        return captured


def step_graphs(synth: Synthesizer, fast: FastSampler, voices: Sequence[Any] = ()) -> tuple[int, int]:
    """With step batching: the step batcher's context pool fixed within the budget's plan, its
    forward captured per (rows, frames, context) bucket (engine/step_graphs.py), and the line
    starts per lines bucket for each of `voices` at the text rungs 64 and 128
    (engine/start_graphs.py). Returns (step graphs, start graphs) made."""
    if not isinstance(synth._batcher, StepScheduler):
        return 0, 0
    rows, length = step_pool_size(synth.config, synth.inference, synth.preset.max_batch, fast.context_bucket)
    top = frames_for_seconds(synth.preset.prewarm_seconds)
    cfg, bucket = synth.resolve_options(), fast.context_bucket
    with hold_model_lock():
        batcher = synth._step_batcher()
        steps = batcher.prewarm_graphs(
            max_rows=rows, top_frames=top, length=length, capture=True, graph_pool=fast.graph_pool()
        )
        starts = 0
        with torch.inference_mode():
            for i, v in enumerate(voices):
                states = _states(synth, v, first=i == 0, warn=False)  # line_graphs warned already
                for tokens in (TEXT_RUNG_LEAST * bucket, 2 * TEXT_RUNG_LEAST * bucket) if states else ():
                    conds = _conditions(synth, tokens, states)
                    starts += batcher.prewarm_starts(conds, cfg, capture=True)
        return steps, starts


def line_graphs(synth: Synthesizer, voice: Any, fast: FastSampler, batch_voices: Sequence[Any] = ()) -> int:
    """Capture every frame bucket up to `preset.prewarm_seconds` for the two shortest text buckets
    in `voice` and in each of `batch_voices` whose conditions' bucket is new (`line_shape`: a line
    alone, of any of them, then replays a graph instead of capturing one mid-stream; the LRU grows
    to hold them all); with `max_batch` > 1 the batch graphs (`batch_graphs`) of the text rungs 64
    and 128 for each voice whose batch shape is new. Returns the batch shapes prewarmed."""
    cfg = synth.resolve_options()
    top = frames_for_seconds(synth.preset.prewarm_seconds)
    bucket, batches = fast.context_bucket, synth.preset.max_batch > 1
    frame_buckets = range(fast.frame_bucket, top + fast.frame_bucket, fast.frame_bucket)
    lines: set = set()
    shapes: set = set()
    with hold_model_lock(), torch.inference_mode():
        if batches:
            text_graphs(synth, bucket, 2 * TEXT_RUNG_LEAST * bucket)
        for i, v in enumerate([voice, *batch_voices]):
            states = _states(synth, v, first=i == 0)
            if states is None:
                continue
            if (line := fast.line_shape(_conditions(synth, bucket, states))) not in lines:
                lines.add(line)
                fast.keep_room(2 * len(frame_buckets))
                for tokens in (bucket, 2 * bucket):
                    conds = _conditions(synth, tokens, states)
                    for frames in frame_buckets:
                        noise = torch.zeros(1, frames, synth.config.latent_dim, device=synth.device)
                        synth.sample_latent(conds, noise, cfg)
            for tokens in (TEXT_RUNG_LEAST * bucket, 2 * TEXT_RUNG_LEAST * bucket) if batches else ():
                conds = _conditions(synth, tokens, states)
                if (shape := fast.batch_shape(conds, cfg)) not in shapes:
                    shapes.add(shape)
                    batch_graphs(synth, conds, cfg, top, fast)
    return len(shapes)


def _conditions(synth: Synthesizer, tokens: int, states: Any) -> Any:
    """Conditions of a dummy line of `tokens` text tokens in the voice of `states`."""
    ids = torch.full((1, tokens), 5, dtype=torch.long)
    return synth._conditions(ids, torch.ones_like(ids, dtype=torch.bool), states)


def text_graphs(synth: Synthesizer, bucket: int, longest: int) -> None:
    """The text encoder's graphs of lines that meet: per batch bucket up to `max_batch`, every
    text length in context buckets up to `longest` tokens (encoded together, lines are padded to
    the longest one's `bucket`; a shape without a graph is encoded eagerly)."""
    for rows in [b for b in BATCH_BUCKETS if b <= batch_bucket(synth.preset.max_batch)]:
        for tokens in range(bucket, longest + bucket, bucket):
            ids = torch.full((1, tokens), 5, dtype=torch.long)
            synth._encoders.text_states([ids] * rows, [torch.ones_like(ids, dtype=torch.bool)] * rows)


def _states(synth: Synthesizer, voice: Any, first: bool, warn: bool = True) -> Any:
    """A voice's states; a batch voice that cannot be read: None, with a warning (`warn`: once,
    by the first stage that meets it); the prewarm voice's error is raised: it is the one the
    caller asked for."""
    if first:
        return synth.voices.states(voice)
    try:
        return synth.voices.states(voice)
    except IrodoriError as e:
        if warn:
            log.warning("prewarm skips the voice %s: %s", getattr(voice, "name", None) or voice, e)
        return None


def batch_graphs(synth: Synthesizer, conds: Any, cfg: Any, top: int, fast: FastSampler) -> None:
    """With `max_batch` > 1: a graph per batch bucket up to it and per coarse frame bucket, and
    the text encoder's per batch bucket for the text length of `conds`; a batch whose shape has
    none runs line by line (its text eagerly, engine/fast.py), so none is captured live."""
    step = fast.batch_frame_bucket
    top_rows = batch_bucket(synth.preset.max_batch) if synth.preset.max_batch > 1 else 1
    ids = torch.full((1, conds.text_state.shape[1]), 5, dtype=torch.long)
    mask = torch.ones_like(ids, dtype=torch.bool)
    for rows in [b for b in BATCH_BUCKETS if b <= top_rows]:
        synth._encoders.text_states([ids] * rows, [mask] * rows)
        batch = stack_conditions([conds] * rows)
        for frames in range(step, top + step, step):
            noise = torch.zeros(rows, frames, synth.config.latent_dim, device=synth.device)
            synth.sample_latent(batch, noise, cfg, frames=[frames] * rows)
