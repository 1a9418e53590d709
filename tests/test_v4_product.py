"""Irodori-TTS v4 / v4.1-MF through the product: hub cache, CLI, Speaker, defaults, voices, cache key.

The models are the tiny-random v4 kinds (the release's file format: model.safetensors with its
tokenizer/ folder beside it); their output is noise. The hub cache is a real huggingface_hub
cache directory filled by hand (tests/hub_cache.py); nothing touches the network.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from hub_cache import fill_cache, run_cli_offline
from irodori_speaker.cache import PhraseCache
from irodori_speaker.engine.config import InferenceConfig
from irodori_speaker.engine.sources import CODEC_REPO, MODELS
from irodori_speaker.engine.tiny import tiny_random_files
from irodori_speaker.errors import InputError
from irodori_speaker.synthesis.loading import load_synthesizer
from irodori_speaker.synthesis.voices import Voice, join_reference_clips, max_reference_frames, save_latent
from irodori_speaker.text.backbone_tokenizer import TOKENIZER_FILES

MF_REPO = MODELS["v4.1-mf"]
TEXT = "こんにちは、今日もよろしくお願いします。"


@pytest.fixture(scope="module")
def synths(irodori_home):
    return {
        kind: load_synthesizer(tiny_random=kind, backend="cpu", voice_cache_dir=False, user_dict=False)
        for kind in ("v4", "v4.1-mf")
    }


@pytest.fixture(scope="module")
def mf_hub(irodori_home, tmp_path_factory) -> Path:
    """An HF_HOME whose hub cache holds a tiny v4.1-MF release and the codec, as downloaded."""
    files = tiny_random_files("v4.1-mf")
    home = tmp_path_factory.mktemp("hf")
    release = {"model.safetensors": files.model.read_bytes()}
    for name in TOKENIZER_FILES:
        release[f"tokenizer/{name}"] = (files.tokenizer.parent / name).read_bytes()
    fill_cache(home / "hub", MF_REPO, release)
    fill_cache(home / "hub", CODEC_REPO, {"weights.pth": files.codec.read_bytes()})
    return home


cli = run_cli_offline


# ---- the hub cache: say and the Speaker, no extra flags --------------------------------------


@pytest.mark.parametrize("model", [None, MF_REPO, "v4.1-mf"])
def test_say_speaks_a_cached_mf_release_offline(mf_hub, tmp_path, model):
    """None: no --model at all (v4.1-MF is the default)."""
    out = tmp_path / "a.wav"
    pick = [] if model is None else ["--model", model]
    r = cli(["say", TEXT, *pick, "--backend", "cpu", "--seed", "3", "-o", out], mf_hub, tmp_path)
    assert r.returncode == 0, r.stderr
    audio, sr = sf.read(str(out), dtype="float32")
    assert sr == 48_000 and len(audio) > 0 and np.any(audio != 0)


def test_a_release_without_its_tokenizer_folder_names_the_folder_files(tmp_path):
    files = tiny_random_files("v4.1-mf")
    home = tmp_path / "hf"
    fill_cache(home / "hub", MF_REPO, {"model.safetensors": files.model.read_bytes()})
    fill_cache(home / "hub", CODEC_REPO, {"weights.pth": files.codec.read_bytes()})
    r = cli(["say", TEXT, "--model", MF_REPO, "--backend", "cpu", "-o", tmp_path / "a.wav"], home, tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[0]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert f"hf://{MF_REPO}/tokenizer/{name}" in line
    assert "llm-jp" not in line  # not the v2 tokenizer


def test_the_speaker_speaks_the_cached_release_with_the_release_defaults(mf_hub, run_async):
    from irodori_speaker.speaker import Speaker

    async def body():
        async with Speaker(  # no model named: the default is v4.1-MF
            model_dir=mf_hub / "hub",
            backend="cpu",
            output="null",
            voice_cache_dir=False,
            user_dict=False,
            prewarm=False,
        ) as s:
            return await s.say(TEXT, seed=5)

    h = run_async(body())
    assert h.record.steps == 4 and h.record.schedule == "meanflow"  # MF: 4 steps, no CFG
    assert h.record.extra["duration_source"] == "predictor"
    assert len(h.audio) > 0


@pytest.fixture
def run_async():
    def _run(coro, timeout: float = 240.0):
        async def guarded():
            return await asyncio.wait_for(coro, timeout)

        return asyncio.run(guarded())

    return _run


# ---- defaults of each release -------------------------------------------------------------------


def test_release_defaults_mf_four_steps_rf_the_preset_and_every_guidance_mode(synths):
    mf, rf = synths["v4.1-mf"], synths["v4"]
    assert mf.resolve_options().steps == 4 and mf.resolve_options({"steps": 2}).steps == 2
    assert rf.resolve_options().steps == rf.preset.steps
    with pytest.raises(InputError, match="cannot be used with a MeanFlow model"):
        mf.resolve_options({"truncation_factor": 0.8})
    voice = Voice.designed("落ち着いた声")
    for guidance in ("independent", "joint", "alternating"):
        opts = {"seed": 1, "seconds": 0.6, "guidance": guidance, "steps": 2}
        if guidance == "joint":
            opts.update(cfg_scale_text=2.0, cfg_scale_caption=2.0)
        r = rf.synthesize("はい。", voice, opts)
        assert r.record.steps == 2 and len(r.audio) > 0
    r = mf.synthesize("はい。", None, {"seed": 1})
    assert r.record.steps == 4 and r.record.schedule == "meanflow"


def test_the_duration_predictor_and_its_short_prompt_cap_are_used(synths):
    from irodori_speaker.engine.duration import frames_from_prediction

    mf = synths["v4.1-mf"]
    opts = {"seed": 1, "tail_trim": False, "duration_scale": 10.0}
    free = mf.synthesize(TEXT, None, {**opts, "predictor_cap": None}).record
    capped = mf.synthesize(TEXT, None, {**opts, "predictor_cap": 0.05}).record
    assert free.extra["duration_source"] == capped.extra["duration_source"] == "predictor"
    ids, mask = mf.tokenizer.batch([mf.spoken_text(TEXT)])
    with torch.inference_mode():
        conds = mf._conditions(ids, mask, mf.voices.states(None))
        pred = mf.model.predict_log_frames(conds, has_speaker=torch.tensor([False]))
    assert free.frames == frames_from_prediction(pred, 10.0, None)[0] > 13
    assert 13 <= capped.frames < free.frames  # the short-prompt cap (a multiple of the text estimate)


# ---- voices: several clips, clone + caption -----------------------------------------------------


def test_several_clips_are_joined_in_order_up_to_the_cap(synths, tmp_path):
    mf = synths["v4.1-mf"]
    gen = torch.Generator().manual_seed(0)
    clips = [torch.randn(n, 32, generator=gen) for n in (9, 7, 11, 5)]
    paths = []
    for i, c in enumerate(clips):
        paths.append(tmp_path / f"clip{i}.safetensors")
        save_latent(c, paths[-1])
    voice = Voice.from_clips(paths)
    assert voice.has_reference and len(voice.clips) == 4
    saved = mf.voices.inference
    try:
        mf.voices.inference = InferenceConfig(max_text_len=256, max_caption_len=512, ref_max_seconds=1.0)
        got = mf.reference_latent(voice)[0].float()
    finally:
        mf.voices.inference = saved
    want = join_reference_clips(clips, max_reference_frames(1.0))
    assert got.shape == (25, 32)  # 9 + 7 + 11 reach the cap of 25: the fourth clip is not used
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got, torch.cat(clips[:3])[:25])
    # without a cap short of them, all four, in order (v4's 120 s)
    torch.testing.assert_close(mf.reference_latent(voice)[0].float(), torch.cat(clips))


def test_recorded_clips_past_the_cap_are_not_even_encoded(synths, tmp_path):
    mf = synths["v4"]
    t = np.arange(48_000) / 48_000
    paths = []
    for i, f in enumerate((220.0, 330.0, 440.0)):
        paths.append(tmp_path / f"c{i}.wav")
        sf.write(str(paths[-1]), (0.3 * np.sin(2 * np.pi * f * t)).astype(np.float32), 48_000)
    saved, encodes = mf.voices.inference, mf.voice_cache.encodes
    try:
        mf.voices.inference = InferenceConfig(max_text_len=256, ref_max_seconds=1.5)
        latent = mf.reference_latent(Voice.from_clips(paths))
    finally:
        mf.voices.inference = saved
    assert latent.shape[1] == max_reference_frames(1.5) == 38
    assert mf.voice_cache.encodes - encodes == 2  # 25 + 25 frames reach 38: clip 3 is skipped


def test_clone_and_caption_together_use_both_branches(synths, tmp_path):
    rf = synths["v4"]
    t = np.arange(48_000) / 48_000
    wav = tmp_path / "ref.wav"
    sf.write(str(wav), (0.3 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), 48_000)
    opts = {"seed": 2, "seconds": 0.6, "steps": 2}
    both = rf.synthesize("はい。", Voice.from_wav(wav, caption="明るい声"), opts).audio
    clone = rf.synthesize("はい。", Voice.from_wav(wav), opts).audio
    design = rf.synthesize("はい。", Voice.designed("明るい声"), opts).audio
    has_ref, states = rf.voices.states(Voice.from_wav(wav, caption="明るい声"))
    assert has_ref and states[0] is not None and bool(states[3].any())  # speaker + caption states
    assert not np.array_equal(both, clone) and not np.array_equal(both, design)


def test_a_v4_caption_is_stripped_not_normalised(synths):
    rf = synths["v4"]
    ids, _ = rf.voices.caption(Voice.designed("  ！？声  "))
    assert ids[0].tolist() == rf.caption_tokenizer.encode("！？声")  # NFKC would make it "!?声"
    assert rf.voices.caption(Voice.designed("   ")) == (None, None)


# ---- the phrase-cache key -----------------------------------------------------------------------


def test_the_cache_key_has_the_family_and_the_sampler(synths, tmp_path):
    rf, mf = synths["v4"], synths["v4.1-mf"]
    opts = {"seed": 1, "steps": 4}
    a, b = rf.render_identity(TEXT, None, opts), mf.render_identity(TEXT, None, opts)
    assert (a["family"], a["sampler"]) == ("v4", "rf") and (b["family"], b["sampler"]) == (
        "v4.1-mf",
        "meanflow",
    )
    # MF ignores guidance and schedule: one key for all of them; its steps stay in the key
    assert mf.render_identity(TEXT, None, {**opts, "cfg_scale_text": 9.0, "schedule": "linear"}) == b
    assert mf.render_identity(TEXT, None, {"seed": 1, "steps": 2}) != b
    assert rf.render_identity(TEXT, None, {**opts, "cfg_scale_text": 9.0}) != a
    # equal model files under two families never share a line
    with PhraseCache(tmp_path / "cache") as cache:
        assert cache.key(rf, TEXT, None, opts) != cache.key(mf, TEXT, None, opts)
        fingerprints = dict(mf.fingerprints)
        mf.fingerprints = dict(rf.fingerprints)  # the same files, as far as the key can see
        try:
            assert cache.key(rf, TEXT, None, opts) != cache.key(mf, TEXT, None, opts)
        finally:
            mf.fingerprints = fingerprints


def test_the_tiny_release_layout_is_a_model_with_its_tokenizer_folder():
    files = tiny_random_files("v4")
    assert files.model.name == "model.safetensors"
    assert files.tokenizer.parent == files.model.parent / "tokenizer"
    assert all((files.tokenizer.parent / name).is_file() for name in TOKENIZER_FILES)
    copy = files.model.parent.parent / "copy-test"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(files.model.parent, copy)
    try:  # a local path: the folder beside it is found with no --tokenizer
        s = load_synthesizer(
            copy / "model.safetensors", codec=files.codec, backend="cpu", voice_cache_dir=False
        )
        assert Path(s.tokenizer.source) == copy / "tokenizer" / "tokenizer.json"
        assert s.caption_tokenizer is s.tokenizer
    finally:
        shutil.rmtree(copy)


def test_quantize_calibrates_a_v4_model_with_its_tokenizer_folder(irodori_home, tmp_path):
    """GPTQ calibration tokenizes with the release's tokenizer/ folder beside the model."""
    from irodori_speaker.engine.quant.checkpoint import load_int4_model

    files = tiny_random_files("v4.1-mf")
    calibration = tmp_path / "calib.txt"
    calibration.write_text("こんにちは。\n今日はいい天気ですね。\n", encoding="utf-8")
    out = tmp_path / "mf-int4.safetensors"
    args = ["quantize", files.model, "-o", out, "--calibration-file", calibration, "--no-report"]
    r = cli(args, tmp_path / "hf", tmp_path)
    assert r.returncode == 0, r.stderr
    assert "gptq" in r.stdout and load_int4_model(out, dtype="fp32").model.cfg.meanflow


def test_hf_uris_and_subfolders_find_the_tokenizer_folder_in_the_cache(tmp_path):
    from irodori_speaker.engine.sources import resolve_files

    files = tiny_random_files("v4.1-mf")
    tok = {f"tokenizer/{n}": (files.tokenizer.parent / n).read_bytes() for n in TOKENIZER_FILES}
    model = files.model.read_bytes()
    fill_cache(tmp_path, "org/v4", {"model.safetensors": model, "int8/model.safetensors": model, **tok})
    fill_cache(tmp_path, CODEC_REPO, {"weights.pth": b"codec"})
    for source, folder in [
        ("hf://org/v4/model.safetensors", "tokenizer"),
        ("org/v4", "tokenizer"),
        ("hf://org/v4/int8/model.safetensors", "tokenizer"),  # sub/model.safetensors: the repo's folder
    ]:
        _, _, tok_path = resolve_files(source, CODEC_REPO, None, cache_dir=tmp_path)
        assert tok_path.name == "tokenizer.json" and tok_path.parent.name == folder, source
        assert (tok_path.parent / "tokenizer_config.json").is_file()


def test_an_uncached_folder_of_a_subfolder_model_is_named_where_it_is_looked_for_first(tmp_path, monkeypatch):
    from irodori_speaker.engine.sources import FilesNotAvailable, resolve_files

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no network: the cache only

    files = tiny_random_files("v4.1-mf")
    fill_cache(tmp_path, "org/v4", {"int8/model.safetensors": files.model.read_bytes()})
    fill_cache(tmp_path, CODEC_REPO, {"weights.pth": b"codec"})
    with pytest.raises(FilesNotAvailable) as e:
        resolve_files("hf://org/v4/int8/model.safetensors", CODEC_REPO, None, cache_dir=tmp_path)
    named = [spec.describe() for _, spec in e.value.missing]
    assert named == [f"hf://org/v4/int8/tokenizer/{n}" for n in ("tokenizer.json", "tokenizer_config.json")]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (run on the H200)")
@pytest.mark.parametrize("kind", ["v4.1-mf", "v4"])
def test_v4_int4_speaks_on_cuda_with_graphs(irodori_home, kind):
    """v4 int4 on CUDA through the product's loader and the CUDA preset (graphs, prewarm): it
    faulted at the text-encoder graph's replay until the scratch buffer stopped being freed."""
    import numpy as np

    from irodori_speaker import load_synthesizer

    synth = load_synthesizer(
        tiny_random=kind, backend="cuda", int4=True, voice_cache_dir=False, user_dict=False
    )
    synth.prewarm()
    torch.cuda.empty_cache()  # unmaps freed blocks: a dangling graph pointer faults here
    for text in ("こんにちは。", "今日はいい天気ですね、配信を始めます。"):
        audio = synth.synthesize(text).audio
        assert len(audio) > 0 and np.isfinite(audio).all()
