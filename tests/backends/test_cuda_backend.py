"""The CUDA preset end to end on the tiny-random model (runs on the H200 through the device tool)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@pytest.mark.parametrize("kind", ["v2", "v4", "v4.1-mf"])  # v4: the backbone in the text graph, MF's dt
def test_prewarm_captures_every_bucket_and_graphs_match_eager(tmp_path, monkeypatch, kind):
    from irodori_speaker.options import SynthesisOptions
    from irodori_speaker.synthesis.loading import load_synthesizer

    monkeypatch.setenv("IRODORI_CACHE", str(tmp_path))
    # max_batch 1: the single-line graphs only (the preset's 16 adds the batch graphs, below)
    synth = load_synthesizer(
        tiny_random=kind, backend="cuda", prewarm_seconds=3.0, max_batch=1, voice_cache_dir=False
    )
    synth.prewarm()
    fast = synth.fast_sampler
    buckets = len(range(fast.frame_bucket, 75 + fast.frame_bucket, fast.frame_bucket))  # 3 s = 75 frames
    # every frame bucket for the two shortest text buckets (the dummy line's graph included)
    assert synth.prewarm_report["graphs_captured"] == 2 * buckets
    assert synth.prewarm_report["text_graphs_captured"] == 2
    from irodori_speaker.engine.codec import stream_window_lengths

    windows = stream_window_lengths(synth.preset.stream_chunk_frames, first_chunk_frames=8)  # [16, 66]
    keys = synth._window_keys()  # each length with the crops its windows take
    assert {n for n, _ in keys} == set(synth._window_lengths()) >= {windows[0]}
    assert synth.prewarm_report["codec_graphs_captured"] == len(keys)
    assert sorted(k[1:] for k in synth.codec.graph_shapes) == sorted((n, *crop) for n, crop in keys)
    before = fast.captures
    opts = SynthesisOptions(seed=3, seconds=2.0, tail_trim=False)
    graphed = synth.synthesize("グラフで再生します。", options=opts).audio
    assert fast.captures == before  # the prewarmed bucket was reused, nothing captured
    fast.use_graphs = False
    eager = synth.synthesize("グラフで再生します。", options=opts).audio
    assert np.isfinite(graphed).all() and len(graphed) == len(eager) == 96_000
    np.testing.assert_allclose(graphed, eager, atol=2e-3)


def test_a_streamed_line_joins_to_the_whole_line(tmp_path, monkeypatch):
    """The CUDA preset's graphed stream windows join to the one-pass decode: every chunk whole and
    in order."""
    from irodori_speaker.options import SynthesisOptions
    from irodori_speaker.synthesis.loading import load_synthesizer

    monkeypatch.setenv("IRODORI_CACHE", str(tmp_path))
    synth = load_synthesizer(tiny_random="v2", backend="cuda", voice_cache_dir=False)
    opts = SynthesisOptions(seed=5, seconds=6.0, tail_trim=False)
    whole = synth.synthesize("ストリームとまとめて。", options=opts).audio
    chunks = list(synth.stream("ストリームとまとめて。", options=opts))
    # the preset's windows for the line's 150 frames: 8 frames, then its plan's (3 chunks; the
    # test asked for more than 3 from before the plan, and failed on the H100 in the thirty-first
    # session)
    preset = synth.preset
    windows = synth.codec.stream_windows(
        150,
        preset.stream_chunk_frames,
        first_chunk_frames=preset.stream_first_chunk_frames,
        growth=preset.stream_chunk_growth,
        tail_lengths=tuple(preset.stream_tail_windows),
        plan_lengths=tuple(preset.stream_window_plan),
    )
    assert [len(c) for c in chunks] == [(end - start) * 1920 for _, start, end, _ in windows]
    assert len(chunks) >= 3 and all(c.dtype == np.float32 for c in chunks)
    streamed = np.concatenate(chunks)
    assert len(streamed) == len(whole) == 288_000
    # fp16 windows against one pass: rounding only; a chunk lost or out of order is far larger
    assert np.abs(streamed - whole).max() <= 0.02 * np.abs(whole).max() + 1e-4


def test_with_max_batch_prewarm_captures_the_batch_buckets_and_batches_replay_them(tmp_path, monkeypatch):
    from irodori_speaker.synthesis.loading import load_synthesizer

    monkeypatch.setenv("IRODORI_CACHE", str(tmp_path))
    synth = load_synthesizer(
        tiny_random="v2", backend="cuda", prewarm_seconds=3.0, max_batch=4, voice_cache_dir=False
    )
    synth.prewarm()
    fast = synth.fast_sampler
    lines = len(range(fast.frame_bucket, 75 + fast.frame_bucket, fast.frame_bucket))
    coarse = len(range(fast.batch_frame_bucket, 75 + fast.batch_frame_bucket, fast.batch_frame_bucket))
    # batch buckets 2 and 4, each coarse frame bucket, both text buckets
    assert synth.prewarm_report["graphs_captured"] == 2 * lines + 2 * 2 * coarse
    assert len(fast._batch_graphs) == 2 * 2 * coarse


def test_lines_of_the_prewarmed_batch_voices_batch_from_their_rungs_graphs(tmp_path, monkeypatch):
    """A server's voice book on the CUDA preset at `serve`'s 16 streams: prewarm with the other voices as
    `batch_voices` captures the batch graphs of each reference rung; lines of those voices that
    meet (several voices in one batch) replay them, none runs line by line, nothing is captured."""
    from safetensors.torch import save_file

    from irodori_speaker import Voice
    from irodori_speaker.engine.batch import stack_conditions
    from irodori_speaker.options import SynthesisOptions
    from irodori_speaker.synthesis.loading import load_synthesizer

    monkeypatch.setenv("IRODORI_CACHE", str(tmp_path))
    synth = load_synthesizer(
        tiny_random="v2", backend="cuda", prewarm_seconds=3.0, max_batch=16, voice_cache_dir=False
    )
    voices = []
    for frames in (40, 50, 100):
        path = tmp_path / f"ref{frames}.safetensors"
        save_file({"latent": torch.randn(frames, synth.config.latent_dim)}, str(path))
        voices.append(Voice.from_latent(path))
    synth.prewarm(voices[0], batch_voices=voices[1:])
    assert synth.prewarm_report["batch_voice_shapes"] == 4  # rungs 64 and 128, two text buckets each
    fast = synth.fast_sampler
    # single-line graphs: two voice buckets (41 and 51 positions share 64; 101 is 128), two text
    # buckets, every frame bucket up to 3 s; and batches cut to their bucket (graphs fill them)
    lines = len(range(fast.frame_bucket, 75 + fast.frame_bucket, fast.frame_bucket))
    assert len(fast._graphs) == 2 * 2 * lines and synth._batcher.fill_buckets
    graphs = len(fast._batch_graphs)
    monkeypatch.setattr(fast, "_one_by_one", lambda *a: pytest.fail("a batch ran line by line"))
    cfg = synth.resolve_options(SynthesisOptions(seed=1))
    with torch.inference_mode():
        for members in ([1, 2], [0, 1], [2, 0, 1]):  # each batch's longest reference: its rung
            lines = []
            for i in members:
                ids = torch.full((1, 9 + i), 5, dtype=torch.long)
                states = synth.voices.states(voices[i])
                lines.append(synth._conditions(ids, torch.ones_like(ids, dtype=torch.bool), states))
            frames = [30 + 7 * i for i in members]
            noise = torch.randn(len(members), max(frames), synth.config.latent_dim, device="cuda")
            out = synth.sample_latent(stack_conditions(lines), noise, cfg, frames=frames)
            assert out.shape[0] == len(members) and bool(torch.isfinite(out).all())
    assert len(fast._batch_graphs) == graphs  # replays of the prewarmed graphs, none captured


def test_the_codec_can_run_on_the_cpu_and_as_int4(tmp_path, monkeypatch):
    """codec_device="cpu" keeps the DiT on the GPU and the codec off it; codec_int4 packs its decoder
    on the CPU before moving it. Both render the same line as the plain CUDA preset (as noise)."""
    from irodori_speaker.engine.quant.layers import Int4ConvTranspose1d
    from irodori_speaker.options import SynthesisOptions
    from irodori_speaker.synthesis.loading import load_synthesizer

    monkeypatch.setenv("IRODORI_CACHE", str(tmp_path))
    opts = SynthesisOptions(seed=4, seconds=1.0, tail_trim=False)
    plain = load_synthesizer(tiny_random="v2", backend="cuda", voice_cache_dir=False)
    on_cpu = load_synthesizer(
        tiny_random="v2", backend="cuda", voice_cache_dir=False, codec_device="cpu", codec_dtype=torch.float32
    )
    assert on_cpu.device.type == "cuda" and on_cpu.codec.device.type == "cpu"
    assert on_cpu.codec.graph_shapes == []  # no CUDA graphs for a CPU codec
    packed = load_synthesizer(tiny_random="v2", backend="cuda", voice_cache_dir=False, codec_int4=True)
    conv = packed.codec.decoder.model[1].block["1"]
    assert isinstance(conv, Int4ConvTranspose1d) and conv.qweight_u8.is_cuda
    ref = plain.synthesize("コーデックの置き場所。", options=opts).audio
    for synth in (on_cpu, packed):
        audio = synth.synthesize("コーデックの置き場所。", options=opts).audio
        assert len(audio) == len(ref) == 48_000 and np.isfinite(audio).all()
    # fp32 codec on the CPU against the fp16 one on the GPU: the same latent, the same decode up to the
    # fp16 rounding (relative L2 7.5e-4 on the tiny codec, tests/engine/test_codec.py)
    cpu_audio = on_cpu.synthesize("コーデックの置き場所。", options=opts).audio
    assert np.linalg.norm(cpu_audio - ref) / np.linalg.norm(ref) < 1e-2
