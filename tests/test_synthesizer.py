"""One utterance end to end on the tiny-random model and codec."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import soundfile as sf
import torch

from irodori_speaker.audio.signal import SAMPLE_RATE
from irodori_speaker.cancel import CancelToken
from irodori_speaker.engine.duration import HOP, tail_trim_frames
from irodori_speaker.errors import AudioError, Cancelled, InputError
from irodori_speaker.options import SynthesisOptions
from irodori_speaker.synthesis.loading import load_synthesizer
from irodori_speaker.synthesis.plan import PIECE_GAP_S
from irodori_speaker.synthesis.synthesizer import EDGE_FADE_S
from irodori_speaker.synthesis.voices import Voice, VoiceCache, save_latent

SR = SAMPLE_RATE


@pytest.fixture(scope="module")
def tiny_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("irodori-cache")


@pytest.fixture(scope="module")
def synth(tiny_cache, monkeypatch_module):
    monkeypatch_module.setenv("IRODORI_CACHE", str(tiny_cache))
    return load_synthesizer(tiny_random="v2", backend="cpu", voice_cache_dir=tiny_cache / "voices")


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def opts(**kw):
    kw.setdefault("seed", 1)
    return SynthesisOptions(**kw)


def test_record_and_noise_note(synth):
    res = synth.synthesize("こんにちは、今日はいい天気ですね。", options=opts(seconds=1.5, tail_trim=False))
    rec = res.record
    assert res.sample_rate == SR and res.audio.dtype == np.float32 and res.audio.ndim == 1
    assert len(res.audio) == rec.samples == int(1.5 * SR)
    assert rec.frames == 38  # ceil(72000 / 1920)
    assert rec.seed == 1 and rec.steps == 8 and rec.schedule == "sway"
    assert set(rec.timings) >= {"tokenize", "reference", "duration", "sampling", "decode"}
    assert any("noise" in w for w in rec.warnings)
    assert np.isfinite(res.audio).all() and np.abs(res.audio).max() <= 1.0


def test_same_seed_same_audio(synth):
    a = synth.synthesize("同じ声で話します。", options=opts(seed=5)).audio
    b = synth.synthesize("同じ声で話します。", options=opts(seed=5)).audio
    c = synth.synthesize("同じ声で話します。", options=opts(seed=6)).audio
    assert np.array_equal(a, b)
    assert len(a) != len(c) or not np.array_equal(a, c)


def test_fresh_seed_is_reported_and_reproduces(synth):
    first = synth.synthesize("シードを覚えておきます。")
    again = synth.synthesize("シードを覚えておきます。", options=opts(seed=first.record.seed))
    assert np.array_equal(first.audio, again.audio)


def test_stream_equals_whole(synth):
    o = opts(seed=3, seconds=3.0, chunk_frames=7)
    whole = synth.synthesize("ストリーミングでも同じ音です。", options=opts(seed=3, seconds=3.0)).audio
    chunks = list(synth.stream("ストリーミングでも同じ音です。", options=o))
    assert len(chunks) > 1
    np.testing.assert_allclose(np.concatenate(chunks), whole, atol=1e-5)
    # the preset's streaming: a short first chunk (8 frames), then 25-frame chunks
    default = list(synth.stream("ストリーミングでも同じ音です。", options=opts(seed=3, seconds=3.0)))
    assert [len(c) for c in default] == [8 * HOP, 25 * HOP, 25 * HOP, 17 * HOP]
    np.testing.assert_allclose(np.concatenate(default), whole, atol=1e-5)


def test_a_short_lines_stream_with_its_last_window_padded_before_frame_0_equals_whole(synth, monkeypatch):
    """With codec graphs a short line's last window starts before frame 0 (engine/codec/streaming.py)
    so it has the middle windows' length; through the device owner's window decode it still joins
    to the whole line. (No CUDA here: the codec is told it replays graphs, and decodes eagerly.)"""
    text = "短い一言です。"
    whole = synth.synthesize(text, options=opts(seed=4, seconds=1.0)).audio
    monkeypatch.setattr(synth.codec, "_graphed", lambda: True)
    windows = synth.codec.stream_windows(25, 25, first_chunk_frames=8)
    assert windows[-1][0] < 0  # the case under test: its last window padded
    chunks = list(synth.stream(text, options=opts(seed=4, seconds=1.0)))
    assert [len(c) for c in chunks] == [8 * HOP, 17 * HOP]
    np.testing.assert_allclose(np.concatenate(chunks), whole, atol=1e-5)


def test_tail_trim_rule_on_latents():
    g = torch.Generator().manual_seed(0)
    speech = torch.randn(30, 32, generator=g)
    quiet = torch.cat((speech, torch.zeros(20, 32)))
    assert tail_trim_frames(quiet) == 30
    assert tail_trim_frames(torch.randn(40, 32, generator=g)) == 40  # loud to the end: no trim
    # the zero padding counts: a loud latent whose last 19 frames are quiet trims there
    assert tail_trim_frames(torch.cat((speech, 0.001 * torch.ones(19, 32)))) == 30
    # a mean far from zero is not silence
    assert tail_trim_frames(torch.cat((speech, torch.full((25, 32), 0.5)))) == 55


def _trim_before(latent):
    """`trim_frame` as it was written before its ops were cut (the reference it must equal)."""
    from irodori_speaker.engine.duration import TRIM_MEAN, TRIM_STD, TRIM_WINDOW

    T = latent.shape[0]
    padded = torch.cat((latent.float(), latent.new_zeros(TRIM_WINDOW, latent.shape[1]).float()))
    flat = padded.unfold(0, TRIM_WINDOW, 1)[:T].reshape(T, -1)
    quiet = (flat.std(dim=1) < TRIM_STD) & (flat.mean(dim=1).abs() < TRIM_MEAN)
    first = torch.argmax(quiet.to(torch.uint8))
    return torch.where(quiet.any(), first, torch.full_like(first, T))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_trim_frame_is_the_first_quiet_window_as_before(dtype):
    """Quiet from the start, in the middle, within the padding, never: the same frame as before,
    a 0-d int64 tensor."""
    from irodori_speaker.engine.duration import trim_frame

    g = torch.Generator().manual_seed(7)
    loud = torch.randn(50, 32, generator=g)
    cases = [
        torch.zeros(30, 32),
        torch.cat((loud[:12], torch.zeros(25, 32), loud[:10])),
        torch.cat((loud, 0.001 * torch.ones(19, 32))),
        loud,
        loud[:1],
    ]
    for latent in cases:
        got, want = trim_frame(latent.to(dtype)), _trim_before(latent.to(dtype))
        assert got.dim() == 0 and got.dtype == torch.int64 and int(got) == int(want), (int(got), int(want))
    assert [int(trim_frame(c)) for c in cases] == [0, 12, 50, 50, 1]


def test_a_batchs_trim_frames_go_to_the_host_as_one_copy_each_lines_own(monkeypatch):
    """The job that made a batch's latents sends every line's tail-trim frame in one copy (one
    `to_host_rows`), each the frame that line has alone; a line without the trim gets none."""
    from types import SimpleNamespace

    from irodori_speaker.engine.hardware.owner import DEVICE
    from irodori_speaker.synthesis.synthesizer import _made

    g = torch.Generator().manual_seed(3)
    loud = torch.randn(40, 32, generator=g)
    latents = [torch.cat((loud[:n], torch.zeros(40 - n, 32)))[None] for n in (12, 40, 25)]
    reqs = [SimpleNamespace(cfg=SimpleNamespace(tail_trim=t), trim=None) for t in (True, True, False)]
    calls = []
    real = DEVICE.to_host_rows
    monkeypatch.setattr(
        DEVICE, "to_host_rows", lambda rows, spans: calls.append(len(spans)) or real(rows, spans)
    )
    _made(reqs, latents)
    assert calls == [2] and reqs[2].trim is None
    assert [int(r.trim.wait()) for r in reqs[:2]] == [12, 40]
    assert [int(r.trim.wait()) for r in reqs[:2]] == [tail_trim_frames(x[0]) for x in latents[:2]]
    one = [SimpleNamespace(cfg=SimpleNamespace(tail_trim=True), trim=None)]
    _made(one, latents[2:])  # a line alone: its own copy, as before
    assert calls == [2] and int(one[0].trim.wait()) == 25


def test_tail_trim_cuts_audio_where_the_latent_goes_quiet(synth, monkeypatch):
    real_sample = synth.sample_latent

    def quiet_tail(conds, noise, cfg, **kw):
        out = real_sample(conds, noise, cfg, **kw)
        out[:, 20:] = 0.0
        return out

    monkeypatch.setattr(synth, "sample_latent", quiet_tail)
    trimmed = synth.synthesize("しっぽを切ります。", options=opts(seconds=2.0))
    assert len(trimmed.audio) == 20 * HOP
    full = synth.synthesize("しっぽを切ります。", options=opts(seconds=2.0, tail_trim=False))
    assert len(full.audio) == 2 * SR
    # the kept part equals the untrimmed decode (8 frames of right context were decoded)
    np.testing.assert_allclose(trimmed.audio, full.audio[: 20 * HOP], atol=1e-5)


def test_thirty_second_cap(synth):
    res = synth.synthesize("長すぎる指定です。", options=opts(seconds=45.0, tail_trim=False, steps=1))
    assert len(res.audio) == 30 * SR
    assert any("clamped to 30" in w for w in res.record.warnings)


def test_long_text_is_split_and_joined_in_order(synth):
    sentences = [
        "今日は朝から雨が降っていて、駅までの道がとても混んでいました。",
        "午後になると雲が切れて、少しずつ青空が見えてきました。",
        "夕方には虹が出て、たくさんの人が空を見上げていました。",
        "明日は一日中よく晴れて、気温も上がる見込みだそうです。",
        "週末は家族で公園に出かけて、お弁当を食べる予定にしています。",
        "皆さんも体調に気をつけて、楽しい週末を過ごしてくださいね。",
    ]
    text = "".join(sentences)
    o = opts(seed=9, tail_trim=False)
    res = synth.synthesize(text, options=o)
    assert res.record.pieces > 1
    # Render each piece alone with the same seed: the long audio is those, in order, with gaps.
    from irodori_speaker.text.split import split_for_synthesis

    pieces = split_for_synthesis(res.record.text)
    assert len(pieces) == res.record.pieces
    assert "".join(pieces).replace(" ", "") == res.record.text.replace(" ", "")
    singles = [synth.synthesize(p, options=o).audio for p in pieces]
    gap, fade = int(PIECE_GAP_S * SR), int(EDGE_FADE_S * SR)
    assert len(res.audio) == sum(map(len, singles)) + gap * (len(singles) - 1)
    pos = 0
    for i, single in enumerate(singles):
        seg = res.audio[pos : pos + len(single)]
        np.testing.assert_allclose(seg[fade:-fade], single[fade:-fade], atol=1e-5)
        if i < len(singles) - 1:
            assert np.all(res.audio[pos + len(single) : pos + len(single) + gap] == 0)
            assert abs(seg[-1]) <= abs(single[-1]) + 1e-7  # faded out: no click at the cut
        pos += len(single) + gap


def test_reference_voice_is_encoded_once_and_cached_on_disk(synth, tmp_path):
    t = np.arange(int(1.5 * SR)) / SR
    wav = tmp_path / "ref.wav"
    sf.write(str(wav), (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), SR)
    voice = Voice.from_wav(wav)
    before = synth.voice_cache.encodes
    a = synth.synthesize("声をまねします。", voice, opts(seed=2)).audio
    b = synth.synthesize("もう一度まねします。", voice, opts(seed=2)).audio
    assert synth.voice_cache.encodes == before + 1
    assert not np.array_equal(a[: min(len(a), len(b))], b[: min(len(a), len(b))])
    # a new process-level cache on the same directory finds it on disk: no encode
    fresh = VoiceCache(synth.voice_cache.directory)
    key = next(k for k in synth.voice_cache._memory if k.startswith("wav:"))
    assert fresh.get(key) is not None
    # the same latent saved to a file is the same voice
    latent = synth.reference_latent(voice)[0]
    save_latent(latent, tmp_path / "v.safetensors")
    c = synth.synthesize(
        "声をまねします。", Voice.from_latent(tmp_path / "v.safetensors"), opts(seed=2)
    ).audio
    np.testing.assert_allclose(c, a, atol=1e-5)
    # ... and so is its path given as a plain string (issue 12: it was read as a recording)
    d = synth.synthesize("声をまねします。", str(tmp_path / "v.safetensors"), opts(seed=2)).audio
    np.testing.assert_allclose(d, a, atol=1e-5)


def test_a_bf16_codec_does_not_reuse_an_fp32_codec_reference(synth, tmp_path):
    t = np.arange(int(1.5 * SR)) / SR
    wav = tmp_path / "ref16.wav"
    sf.write(str(wav), (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), SR)
    voice = Voice.from_wav(wav)
    shared = synth.voice_cache
    half = load_synthesizer(
        tiny_random="v2", backend="cpu", codec_dtype=torch.bfloat16, voice_cache_dir=shared.directory
    )
    half.voices.cache = shared  # one process-wide cache, as the Speaker and the server share it
    before = shared.encodes
    full_latent = synth.reference_latent(voice)
    half_latent = half.reference_latent(voice)
    assert shared.encodes == before + 2  # the bf16 codec encoded its own
    assert not torch.equal(full_latent.float(), half_latent.float())
    half.reference_latent(voice)
    synth.reference_latent(voice)
    assert shared.encodes == before + 2  # and each is then reused by its own kind


def test_reference_changes_the_output(synth, tmp_path):
    t = np.arange(SR) / SR
    wav = tmp_path / "r.wav"
    sf.write(str(wav), (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), SR)
    plain = synth.synthesize("比べます。", None, opts(seed=4, seconds=1.0, tail_trim=False)).audio
    voiced = synth.synthesize(
        "比べます。", Voice.from_wav(wav), opts(seed=4, seconds=1.0, tail_trim=False)
    ).audio
    assert not np.allclose(plain, voiced)


def test_cancel_between_steps_and_between_decode_chunks(synth):
    token = CancelToken()

    def progress(done, total):
        if done == 2:
            token.cancel("user stop")

    with pytest.raises(Cancelled, match="user stop"):
        synth.synthesize("止めてください。", options=opts(seconds=2.0), cancel=token, progress=progress)

    token = CancelToken()
    stream = synth.stream(
        "途中で止めます。", options=opts(seconds=3.0, chunk_frames=5, tail_trim=False), cancel=token
    )
    first = next(stream)
    assert len(first) > 0
    token.cancel("enough")
    with pytest.raises(Cancelled):
        next(stream)


def test_thread_safe_from_worker_threads(synth):
    texts = ["一つ目です。", "二つ目です。", "三つ目です。"]
    expected = [synth.synthesize(t, options=opts(seed=11)).audio for t in texts]
    results: dict[int, np.ndarray] = {}

    def work(i):
        results[i] = synth.synthesize(texts[i], options=opts(seed=11)).audio

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for i in range(3):
        assert np.array_equal(results[i], expected[i])


@pytest.mark.parametrize("text", ["", "   ", "\t\u3000", "《》▼"])
def test_empty_text(synth, text):
    with pytest.raises(InputError):
        synth.synthesize(text)


@pytest.mark.parametrize("seconds", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_seconds(synth, seconds):
    with pytest.raises(InputError, match="seconds"):
        synth.synthesize("こんにちは。", options=SynthesisOptions(seconds=seconds))


def test_bad_voice(synth, tmp_path):
    with pytest.raises(AudioError):
        Voice.from_wav(tmp_path / "absent.wav")
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"not audio at all")
    with pytest.raises(AudioError):
        synth.synthesize("こんにちは。", Voice.from_wav(junk))
    with pytest.raises(InputError):
        synth.synthesize("こんにちは。", voice=123)


def test_fast_path_and_reference_loop_give_the_same_audio(synth, tiny_cache):
    reference = load_synthesizer(tiny_random="v2", backend="cpu", fast_path=False, voice_cache_dir=False)
    assert synth.fast_sampler is not None and reference.fast_sampler is None
    text = "速い道でも同じ音になります。"
    a = synth.synthesize(text, options=opts(seed=21)).audio
    b = reference.synthesize(text, options=opts(seed=21)).audio
    assert len(a) == len(b)
    np.testing.assert_allclose(a, b, atol=1e-4)


def _count_windows(synth, monkeypatch) -> list[int]:
    """The frames of each window the codec decodes from now on (appended as they are decoded): a
    window's frames with its context, or on the stateful stream (the CPU preset's) the frames of
    the chunk asked of it."""
    from irodori_speaker.engine.codec.stateful import LineStream

    windows: list[int] = []
    real, samples = synth.codec._decode_window, LineStream.samples

    def counting(z, a, b, dtype=None):
        windows.append(z.shape[-1])
        return real(z, a, b, dtype)

    def asked(stream, a, b):
        windows.append((b - a) // HOP)
        return samples(stream, a, b)

    monkeypatch.setattr(synth.codec, "_decode_window", counting)
    monkeypatch.setattr(LineStream, "samples", asked)
    return windows


def test_first_chunk_leaves_before_the_second_window_is_decoded(synth, monkeypatch):
    """Time to first audio is one window's decode; chunks join to the one-pass audio (no stray fades)."""
    windows = _count_windows(synth, monkeypatch)
    stream = synth.stream("最初の音はすぐに出ます。", options=opts(seconds=3.0, tail_trim=False))
    first = next(iter(stream))
    assert len(windows) == 1 and len(first) == 8 * 1920  # the 8-frame first chunk, alone
    rest = list(stream)
    assert len(windows) == 1 + len(rest) and len(rest) >= 2
    whole = synth.synthesize("最初の音はすぐに出ます。", options=opts(seconds=3.0, tail_trim=False)).audio
    np.testing.assert_allclose(np.concatenate([first, *rest]), whole, atol=1e-5)


def test_voice_states_are_encoded_once_per_voice(synth, tmp_path, monkeypatch):
    """The speaker encoder runs once per voice, not per line; a different voice is encoded anew."""
    from irodori_speaker.synthesis.voices import Voice

    calls = []
    real = synth.model.encode_voice

    def counting(*args, **kwargs):
        calls.append(args[1] is not None)  # a reference latent was given
        return real(*args, **kwargs)

    monkeypatch.setattr(synth.model, "encode_voice", counting)
    synth.voices.forget()
    rng = np.random.default_rng(0)
    a = Voice.from_array(0.1 * rng.standard_normal(24_000).astype(np.float32), 24_000)
    b = Voice.from_array(0.1 * rng.standard_normal(24_000).astype(np.float32), 24_000)
    first = synth.synthesize("一行目です。", a, opts(seconds=1.0)).audio
    again = synth.synthesize("二行目です。", a, opts(seconds=1.0)).audio
    assert calls == [True] and len(again) > 0
    synth.synthesize("別の声です。", b, opts(seconds=1.0))
    synth.synthesize("声なしです。", None, opts(seconds=1.0))
    assert calls == [True, True, False]
    synth.voices.forget()  # a fresh encode gives what the kept states gave
    np.testing.assert_array_equal(synth.synthesize("一行目です。", a, opts(seconds=1.0)).audio, first)


@pytest.mark.parametrize("stateful", [False, True], ids=["windows", "stateful"])
def test_growing_stream_chunks_join_and_skip_the_stretched_last_window(synth, monkeypatch, stateful):
    """`stream_chunk_growth`: 8, 16, 20, 20, ... frames; without graphs (the CPU) the last window
    is not stretched left, so no frame is decoded twice more than its context needs. The stateful
    stream (the CPU preset's) is asked for the same chunks."""
    import dataclasses

    windows = _count_windows(synth, monkeypatch)
    growing = dict(stream_chunk_frames=20, stream_chunk_growth=2.0, stream_stateful=stateful)
    monkeypatch.setattr(synth, "preset", dataclasses.replace(synth.preset, **growing))
    o = opts(seed=3, seconds=3.0, tail_trim=False)
    chunks = list(synth.stream("ストリーミングでも同じ音です。", options=o))
    frames = sum(len(c) for c in chunks) // HOP
    assert [len(c) // HOP for c in chunks] == [8, 16, 20, 20, frames - 64][: len(chunks)]
    assert len(chunks) == 5 and frames - 64 < 20
    if stateful:  # each frame decoded once: the stream is asked for the chunks themselves
        assert windows == [8, 16, 20, 20, frames - 64]
    else:  # windows: each chunk with its 8 context frames on both sides, the line's ends cut them
        assert windows == [16, 32, 36, 36, frames - 64 + 8]
    whole = synth.synthesize("ストリーミングでも同じ音です。", options=o).audio
    np.testing.assert_allclose(np.concatenate(chunks), whole, atol=1e-5)
