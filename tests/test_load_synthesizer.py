"""load_synthesizer's seams: a tokenizer object and a Preset, as the benchmarks use them; its
options as one `LoadOptions` value, checked before anything loads."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from graph_cases import stood_in_capture
from irodori_speaker import LoadOptions
from irodori_speaker.engine.hardware.presets import base_preset
from irodori_speaker.errors import InputError
from irodori_speaker.options import SynthesisOptions
from irodori_speaker.synthesis.loading import load_synthesizer


class CountingTokenizer:
    """Wraps the synthesizer's own tokenizer and counts the calls (proves the object is the one used)."""

    fingerprint = "counting-v1"

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, 0

    def encode(self, text: str) -> list[int]:
        self.calls += 1
        return self.inner.encode(text)

    def batch(self, texts, max_len=None, pad_to=None):
        self.calls += 1
        return self.inner.batch(texts, max_len=max_len, pad_to=pad_to)


def test_a_tokenizer_object_is_used_as_given(synth):
    tok = CountingTokenizer(synth.tokenizer)
    other = load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False, tokenizer=tok)
    assert other.tokenizer is tok and other.fingerprints["tokenizer"] == "counting-v1"
    opts = SynthesisOptions(seed=5, seconds=1.0)
    got = other.synthesize("こんにちは。", options=opts).audio
    assert tok.calls > 0
    np.testing.assert_array_equal(got, synth.synthesize("こんにちは。", options=opts).audio)


def test_a_non_tokenizer_object_is_refused_before_loading(monkeypatch):
    import irodori_speaker.synthesis.loading as s  # where load_synthesizer finds load_dit

    monkeypatch.setattr(s, "load_dit", lambda *a: pytest.fail("loaded the model before checking"))
    with pytest.raises(InputError, match="tokenizer object"):
        load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False, tokenizer=42)


def test_a_preset_object_replaces_the_backend_preset(synth):
    """The CUDA preset on the CPU (what benchmarks' --smoke runs): its chunking, overrides applied."""
    preset = base_preset("cuda").with_overrides(
        device="cpu", dtype=torch.float32, codec_dtype=torch.float32, cuda_graphs=False, codec_graphs=False
    )
    other = load_synthesizer(tiny_random=True, voice_cache_dir=False, preset=preset, steps=4)
    assert other.preset.name == "cuda" and other.preset.stream_chunk_frames == 50
    assert other.preset.steps == 4 and other.device.type == "cpu"
    assert other.synthesize("こんにちは。", options=SynthesisOptions(seed=1, seconds=1.0)).record.steps == 4


def test_prewarm_takes_a_batch_graph_for_each_bucket_up_to_max_batch(monkeypatch) -> None:
    """max_batch 3 needs the 4-row bucket too (a batch of 3 is filled to 4); each bucket at every
    coarse frame bucket up to the prewarm length, and the text encoder at each bucket."""
    from irodori_speaker.engine.model import Conditions
    from irodori_speaker.synthesis.prewarm import batch_graphs

    synth = load_synthesizer(tiny_random="v2", backend="cpu", max_batch=3, voice_cache_dir=False)
    fast = synth.fast_sampler
    assert fast is not None and fast.batch_frame_bucket == 64
    seen, texts = [], []

    def sample_latent(conds, noise, cfg, *, frames=None, **_):
        seen.append((conds.batch_size, tuple(noise.shape[:2]), frames))

    monkeypatch.setattr(synth, "sample_latent", sample_latent)
    monkeypatch.setattr(fast, "encode_text", lambda ids, mask: texts.append(tuple(ids.shape)) or (ids, mask))
    one = Conditions(torch.zeros(1, 32, 8), torch.ones(1, 32, dtype=torch.bool))
    batch_graphs(synth, one, None, 130, fast)
    assert seen == [(rows, (rows, frames), [frames] * rows) for rows in (2, 4) for frames in (64, 128, 192)]
    assert texts == [(2, 32), (4, 32)]  # the text graphs of the batch buckets (captured with CUDA)


def test_prewarm_takes_the_batch_graphs_of_each_voice_rung_once(monkeypatch, tmp_path, caplog) -> None:
    """A server's voice book: references of 40 and 50 frames share a rung (their lines batch from
    the same graphs), 100 frames is another; a voice that cannot be read is skipped with a warning
    (its lines raise its own error); the single-line graphs are taken once per context bucket (41
    and 51 positions share the 64 bucket), the LRU grown to hold them all."""
    from safetensors.torch import save_file

    import irodori_speaker.synthesis.prewarm as prewarm
    from irodori_speaker import Voice

    synth = load_synthesizer(tiny_random="v2", backend="cpu", max_batch=4, voice_cache_dir=False)
    fast = synth.fast_sampler
    assert fast is not None
    voices = []
    for frames in (40, 50, 100, 40):
        path = tmp_path / f"ref{frames}_{len(voices)}.safetensors"
        save_file({"latent": torch.randn(frames, synth.config.latent_dim)}, str(path))
        voices.append(Voice.from_latent(path))
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"not a safetensors file")
    batches, lines = [], []
    monkeypatch.setattr(
        prewarm, "batch_graphs", lambda s, conds, *a: batches.append(conds.speaker_state.shape[1])
    )
    monkeypatch.setattr(
        synth, "sample_latent", lambda conds, *a, **k: lines.append(conds.speaker_state.shape[1])
    )
    rooms: list[int] = []
    monkeypatch.setattr(fast, "keep_room", rooms.append)
    with caplog.at_level("WARNING"):
        shapes = prewarm.line_graphs(synth, voices[0], fast, [Voice.from_latent(broken), *voices[1:]])
    assert shapes == 4  # rungs 64 and 128, each at the two text buckets
    assert batches == [41, 41, 101, 101]  # the 50-frame voice and the second 40-frame one: no new shape
    # single-line graphs: the prewarm voice's (41 positions) and the 100-frame voice's (101)
    assert sorted(set(lines)) == [41, 101] and lines.count(41) == lines.count(101) > 2
    assert rooms == [lines.count(41), lines.count(101)]  # the LRU grown before each voice's captures
    assert "prewarm skips the voice broken" in caplog.text
    one = dataclasses.replace(synth.preset, max_batch=1)
    monkeypatch.setattr(synth, "preset", one)
    batches.clear()
    lines.clear()
    assert prewarm.line_graphs(synth, voices[0], fast, voices[1:]) == 0 and batches == []
    assert sorted(set(lines)) == [41, 101]  # max_batch 1: no batch graphs, every voice's lines


def test_load_options_by_name_or_whole_load_the_same(synth):
    whole = load_synthesizer(LoadOptions(tiny_random=True, backend="cpu", voice_cache_dir=False))
    assert whole.fingerprints == synth.fingerprints
    opts = SynthesisOptions(seed=2, seconds=0.5)
    np.testing.assert_array_equal(
        whole.synthesize("はい。", options=opts).audio, synth.synthesize("はい。", options=opts).audio
    )
    # names over a whole value replace its fields; preset fields by name go into its preset
    batched = load_synthesizer(LoadOptions(tiny_random=True, backend="cuda"), backend="cpu", max_batch=2)
    assert batched.preset.name == "cpu" and batched.preset.max_batch == 2


def test_bad_load_options_fail_before_anything_loads(monkeypatch):
    import irodori_speaker.synthesis.identity as s  # where the loader's plan finds select_preset

    monkeypatch.setattr(s, "select_preset", lambda *a, **k: pytest.fail("went on to load"))
    with pytest.raises(TypeError, match=r"'cache_dir'; did you mean cache= .* or model_dir="):
        load_synthesizer(tiny_random=True, cache_dir="phrases")
    with pytest.raises(TypeError, match="multiple values for argument 'model'"):
        load_synthesizer("v2", model="v4")
    with pytest.raises(InputError, match="device must be"):
        load_synthesizer(tiny_random=True, device=0)
    with pytest.raises(InputError, match="preset must be"):
        LoadOptions(preset=3)
    with pytest.raises(TypeError, match="did you mean 'backend'"):
        LoadOptions().replace(backnd="cpu")
    assert LoadOptions().given() == {} and LoadOptions(backend="cpu").given() == {"backend": "cpu"}


def test_prewarm_with_step_batching_takes_each_voices_start_graphs(monkeypatch, tmp_path, caplog) -> None:
    """Step batching: prewarm fixes the pool, makes the step's buckets and, for the prewarm voice
    and each batch voice, the line starts' buckets at the text rungs 64 and 128; a line of a
    prewarmed voice with 70 text tokens then starts from a graph (the capture stood in for: CUDA
    only, tests/engine/test_start_graphs.py runs the same buffers)."""
    from safetensors.torch import save_file

    import irodori_speaker.engine.start_graphs as start_graphs
    import irodori_speaker.engine.step_graphs as step_graphs
    import irodori_speaker.synthesis.prewarm as prewarm
    from irodori_speaker import Voice
    from irodori_speaker.engine.sampler import draw_noise
    from irodori_speaker.engine.steps import Joining

    monkeypatch.setattr(step_graphs, "capture", stood_in_capture)
    monkeypatch.setattr(start_graphs, "capture", stood_in_capture)
    synth = load_synthesizer(
        tiny_random="v2", backend="cpu", max_batch=4, step_batching=True, voice_cache_dir=False
    )
    fast = synth.fast_sampler
    assert fast is not None
    monkeypatch.setattr(fast, "graph_pool", lambda: "pool")  # what the stood-in capture ignores
    monkeypatch.setattr(synth, "preset", dataclasses.replace(synth.preset, prewarm_seconds=1.0))
    voices = []
    for frames in (40, 100):
        path = tmp_path / f"ref{frames}.safetensors"
        save_file({"latent": torch.randn(frames, synth.config.latent_dim)}, str(path))
        voices.append(Voice.from_latent(path))
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"not a safetensors file")
    with caplog.at_level("WARNING"):  # skipped quietly: line_graphs, run before, warned of it
        steps, starts = prewarm.step_graphs(synth, fast, [*voices, Voice.from_latent(broken)])
    assert "prewarm skips" not in caplog.text
    batcher = synth._steps
    assert batcher is not None and batcher.pool.fixed and steps == len(batcher.graphs) > 0
    assert batcher.starts is not None and starts == len(batcher.starts) > 0
    speakers = {key[1][1] for key in batcher.starts._graphs}
    texts = {key[1][0] for key in batcher.starts._graphs}
    assert speakers == {64, 128} and texts == {64, 128}  # 41 and 101 positions on their buckets
    assert {key[0] for key in batcher.starts._graphs} == {1, 2, 4}
    assert prewarm.step_graphs(synth, fast, voices) == (0, 0)  # again: nothing new to make
    with torch.inference_mode():
        conds = prewarm._conditions(synth, 70, synth.voices.states(voices[1]))
        noise = draw_noise(0, 1, 40, synth.config.latent_dim)
        lines = batcher.start_many([Joining(conds, noise, synth.resolve_options(), tag=i) for i in range(3)])
    assert len(lines) == 3 and batcher.starts.replays == 1
    assert lines[0].held.segments[0] == ("text", 0, 128)


@pytest.mark.parametrize("kind, max_batch, rows", [("v4.1-mf", 4, [1, 2]), ("v3", 1, [1]), ("v2", 4, [])])
def test_prewarm_runs_the_duration_predictor_for_a_line_and_for_lines_met(monkeypatch, kind, max_batch, rows):
    """Prewarm's dummy line asks its seconds, so the predictor runs apart from it: for one line and,
    where lines meet (`max_batch` > 1), two, through the encoders' path a real line takes (on a GPU
    the fused predictor's kernels compile here, not at the first line of a `serve` client); v2 has
    no predictor."""
    from irodori_speaker.engine.duration import DurationPredictor

    seen: list[int] = []
    forward = DurationPredictor.forward

    def counted(self, text_state, *args, **kwargs):
        seen.append(text_state.shape[0])
        return forward(self, text_state, *args, **kwargs)

    monkeypatch.setattr(DurationPredictor, "forward", counted)
    synth = load_synthesizer(tiny_random=kind, backend="cpu", max_batch=max_batch, voice_cache_dir=False)
    synth.prewarm()
    assert seen == rows


def test_prewarm_times_and_logs_each_stage(monkeypatch, caplog) -> None:
    """A first start on a new machine compiles and times kernels for minutes: prewarm reports and
    logs each stage as it ends, so its log says where the time went. The graph stages (CUDA) are
    stood in for by sleeps that the report must find in their own stages."""
    import logging
    import time

    import irodori_speaker.synthesis.prewarm as prewarm

    synth = load_synthesizer(tiny_random="v2", backend="cpu", max_batch=2, voice_cache_dir=False)
    fast = synth.fast_sampler
    assert fast is not None
    predictor_calls = prewarm.predictor_calls

    def then_graphs(*a):  # the graph stages run (the lines before them stay eager)
        predictor_calls(*a)
        monkeypatch.setattr(fast, "use_graphs", True)

    monkeypatch.setattr(prewarm, "predictor_calls", then_graphs)
    monkeypatch.setattr(prewarm, "line_graphs", lambda *a: time.sleep(0.2) or 0)
    monkeypatch.setattr(prewarm, "step_graphs", lambda *a: (0, 0))
    monkeypatch.setattr(prewarm, "codec_graphs", lambda s: time.sleep(0.1) or 0)
    with caplog.at_level(logging.INFO, logger="irodori_speaker.synthesis.prewarm"):
        seconds = synth.prewarm()
    stages = synth.prewarm_report["stage_seconds"]
    names = ["readers", "first line", "duration predictor", "sampling graphs", "step graphs", "codec graphs"]
    assert list(stages) == names
    assert stages["sampling graphs"] >= 0.2 and stages["codec graphs"] >= 0.1
    assert stages["step graphs"] < 0.1 and stages["first line"] > 0  # each stage its own time
    assert sum(stages.values()) <= seconds
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prewarm: ")]
    assert [m.split(" in ")[0] for m in logged] == [f"prewarm: {n}" for n in names]
