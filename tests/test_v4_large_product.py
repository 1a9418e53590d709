"""Irodori-TTS v4-Large through the product: `--tiny-kind v4-large`, a tiny Large release (and its
torchao int8 `-Quantized` copy) in a hub cache through `say`, the Speaker and `serve`, the Gemma
Terms of Use named once, the release's defaults, the empty caption, the phrase-cache key.

The models are tiny random v4-Large files in the release's format (model.safetensors with its
Gemma 3 style tokenizer/ folder; the int8 copy is the shared fixture written by torchao 0.16);
their output is noise. The hub cache is a real huggingface_hub cache directory filled by hand
(tests/hub_cache.py); nothing touches the network.
"""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from hub_cache import fill_cache, run_cli_offline
from irodori_speaker.cache import PhraseCache
from irodori_speaker.engine.sources import CODEC_REPO, GEMMA_TOKENIZER_REPO, MODELS
from irodori_speaker.engine.tiny import tiny_random_files
from irodori_speaker.synthesis.loading import load_synthesizer
from irodori_speaker.synthesis.voices import Voice
from irodori_speaker.text.backbone_tokenizer import TOKENIZER_FILES

LARGE = MODELS["v4-large"]
LARGE_Q = LARGE + "-Quantized"
DATA = Path(__file__).resolve().parent / "data"
INT8 = DATA / "dit_v4_large" / "tiny_v4_large.int8-weight-only.safetensors"
TEXT = "こんにちは、今日もよろしくお願いします。"
TERMS = "Gemma Terms of Use"
cli = run_cli_offline


@pytest.fixture(scope="module")
def synths(irodori_home):
    return {
        kind: load_synthesizer(tiny_random=kind, backend="cpu", voice_cache_dir=False, user_dict=False)
        for kind in ("v4", "v4-large")
    }


def _tokenizer_folder(folder: Path) -> dict[str, bytes]:
    return {f"tokenizer/{n}": (folder / n).read_bytes() for n in TOKENIZER_FILES}


@pytest.fixture(scope="module")
def large_hub(irodori_home, tmp_path_factory) -> Path:
    """An HF_HOME whose hub cache holds a tiny Large release, its int8 copy and the codec."""
    files = tiny_random_files("v4-large")
    home = tmp_path_factory.mktemp("hf")
    folder = _tokenizer_folder(files.tokenizer.parent)
    fill_cache(home / "hub", LARGE, {"model.safetensors": files.model.read_bytes(), **folder})
    # the -Quantized layout: int8-weight-only/model.safetensors, tokenizer/ at the repo's top level
    fill_cache(home / "hub", LARGE_Q, {"int8-weight-only/model.safetensors": INT8.read_bytes(), **folder})
    fill_cache(home / "hub", CODEC_REPO, {"weights.pth": files.codec.read_bytes()})
    return home


def _speaks(path: Path) -> None:
    audio, sr = sf.read(str(path), dtype="float32")
    assert sr == 48_000 and len(audio) > 0 and np.any(audio != 0)


# ---- the command line -----------------------------------------------------------------------


def test_say_tiny_kind_v4_large_with_a_caption(irodori_home, tmp_path):
    out = tmp_path / "a.wav"
    args = ["say", TEXT, "--tiny-kind", "v4-large", "--caption", "落ち着いた声", "--seed", "1", "-o", out]
    r = cli(args, tmp_path / "hf", tmp_path)
    assert r.returncode == 0, r.stderr
    _speaks(out)
    assert TERMS not in r.stderr  # random weights: no Gemma-derived file was selected


@pytest.mark.parametrize("model", ["v4-large", LARGE, LARGE_Q])
def test_say_speaks_a_cached_large_release_and_names_the_gemma_terms_once(large_hub, tmp_path, model):
    out = tmp_path / "a.wav"
    r = cli(
        ["say", TEXT, "--model", model, "--backend", "cpu", "--seed", "3", "-o", out], large_hub, tmp_path
    )
    assert r.returncode == 0, r.stderr
    _speaks(out)
    assert r.stderr.count(TERMS) == 1, r.stderr  # selected, then loaded: one line per process


def test_a_large_release_without_its_folder_names_the_gemma_tokenizer_files(tmp_path):
    files = tiny_random_files("v4-large")
    home = tmp_path / "hf"
    fill_cache(home / "hub", LARGE, {"model.safetensors": files.model.read_bytes()})
    fill_cache(home / "hub", CODEC_REPO, {"weights.pth": files.codec.read_bytes()})
    r = cli(
        ["say", TEXT, "--model", "v4-large", "--backend", "cpu", "-o", tmp_path / "a.wav"], home, tmp_path
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    line = next(x for x in r.stderr.splitlines() if x.startswith("error:"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert f"hf://{LARGE}/tokenizer/{name}" in line
    assert "llm-jp" not in line


def test_a_local_large_file_without_a_folder_falls_back_to_the_ungated_copy(tmp_path, monkeypatch):
    """The release's text_tokenizer_repo (google/t5gemma-2-1b-1b) is gated on the Hub: the Large
    release's own tokenizer/ is looked for first."""
    from irodori_speaker.engine.sources import FilesNotAvailable, resolve_files
    from irodori_speaker.engine.tiny import TINY_CONFIGS

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for key in ("text_tokenizer_repo", "caption_tokenizer_repo"):  # as the release names it
        monkeypatch.setitem(TINY_CONFIGS["v4-large"], key, "google/t5gemma-2-1b-1b")
    files = tiny_random_files("v4-large", tmp_path / "tiny")
    lone = tmp_path / "lone" / "model.safetensors"
    lone.parent.mkdir()
    lone.write_bytes(files.model.read_bytes())
    with pytest.raises(FilesNotAvailable) as e:
        resolve_files(lone, files.codec, None, cache_dir=tmp_path)
    named = [spec.describe() for _, spec in e.value.missing]
    assert named == [
        f"hf://{GEMMA_TOKENIZER_REPO}/tokenizer/{n}" for n in ("tokenizer.json", "tokenizer_config.json")
    ]


# ---- the Speaker and serve --------------------------------------------------------------------


def test_the_speaker_speaks_the_cached_large_release(large_hub):
    from irodori_speaker.speaker import Speaker

    async def body():
        async with Speaker(
            model="v4-large",
            model_dir=large_hub / "hub",
            backend="cpu",
            output="null",
            voice_cache_dir=False,
            user_dict=False,
            prewarm=True,
        ) as s:
            assert s.synthesizer.config.family == "v4-large"
            return await s.say(TEXT, seed=5, steps=2, voice=Voice.designed("明るい声"))

    h = asyncio.run(asyncio.wait_for(body(), 240))
    assert h.record.steps == 2 and h.record.extra["duration_source"] == "predictor"
    assert len(h.audio) > 0


def test_serve_speaks_a_large_voice_from_voices_toml(large_hub, tmp_path):
    sys.path.insert(0, str(Path(__file__).parent / "server"))
    from server_helpers import httpx, start_server

    home = tmp_path / "srv"
    home.mkdir()
    cfg = home / "voices.toml"
    cfg.write_text(
        '[[speakers]]\nname = "いろどり"\nstyles = [{ name = "ノーマル", id = 0 }]\n'
        '[[speakers]]\nname = "ラージ"\n'
        'styles = [{ name = "落ち着き", id = 3, caption = "落ち着いた低い声", aliases = ["calm"] }]\n',
        encoding="utf-8",
    )
    cmd = [sys.executable, "-m", "irodori_speaker.cli", "serve", "--model", "v4-large", "--backend", "cpu"]
    env = {"HF_HOME": str(large_hub), "HF_HUB_OFFLINE": "1"}
    srv = start_server(home, env=env, cmd=[*cmd, "--voices", str(cfg)], wait_s=240)
    try:
        body = {"model": "tts-1", "input": "はい、どうぞ。", "voice": "calm", "response_format": "wav"}
        r = httpx.post(srv.url + "/v1/audio/speech", json=body, timeout=240)
        assert r.status_code == 200, r.text
        audio, _ = sf.read(io.BytesIO(r.content), dtype="float32")
        assert len(audio) > 0 and np.isfinite(audio).all()
    finally:
        assert srv.stop() == 130  # Ctrl-C
    assert srv.log.read_text().count(TERMS) == 1


# ---- defaults, the empty caption, the cache key -------------------------------------------------


def test_large_takes_v4_1_smalls_defaults(synths):
    small, large = synths["v4"], synths["v4-large"]
    assert large.config.family == "v4-large" and large.sampler_kind == "rf"
    assert large.resolve_options() == small.resolve_options()  # preset steps, independent CFG, window
    opts = large.resolve_options()
    assert (opts.guidance, opts.cfg_scale_text, opts.cfg_scale_speaker, opts.cfg_scale_caption) == (
        "independent",
        3.0,
        5.0,
        3.0,
    )
    assert (opts.cfg_min_t, opts.cfg_max_t) == (0.5, 1.0)
    assert large.voices.inference.ref_max_seconds == 120.0
    assert large.prewarm() > 0 and large.prewarm_report["seconds"] > 0


def test_the_caption_tokens_are_gemmas_and_no_caption_equals_the_references_empty_caption(synths):
    large = synths["v4-large"]
    tok = large.caption_tokenizer
    assert (tok.bos_id, tok.pad_id) == (2, 0)  # Gemma 3's, read from the folder (ModernBERT: 1, 3)
    ids, mask = large.voices.caption(Voice.designed("明るい声"))
    assert ids[0, 0] == 2 and bool(mask.all())
    assert large.voices.caption(Voice.designed("   ")) == (None, None)
    # what the product does with no caption (one masked zero token) against the reference's empty
    # caption ([BOS, PAD, ...], mask all false): the same velocity and duration
    model = large.model
    pad_ids, pad_mask = tok.batch(["x"], pad_to=12)
    assert pad_ids[0, -1] == 0 and not pad_mask[0, -1]  # padded with Gemma's pad id, masked
    empty_ids = torch.tensor([[tok.bos_id] + [tok.pad_id] * 11])
    empty_mask = torch.zeros_like(empty_ids, dtype=torch.bool)
    assert empty_ids[0].tolist() == [2] + [0] * 11
    text_ids, text_mask = large.tokenizer.batch([large.spoken_text(TEXT)])
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 20, 32, generator=gen)
    t = torch.tensor([0.7])
    with torch.inference_mode():
        ref = model.encode_conditions(text_ids, text_mask, caption_ids=empty_ids, caption_mask=empty_mask)
        ours = model.encode_conditions(text_ids, text_mask)
        assert not ref.caption_state.any()
        v_ref, v_ours = model.velocity(x, t, ref), model.velocity(x, t, ours)
        d_ref = model.predict_log_frames(ref, has_caption=torch.tensor([False]))
        d_ours = model.predict_log_frames(ours, has_caption=torch.tensor([False]))
    torch.testing.assert_close(v_ours, v_ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(d_ours, d_ref, atol=1e-6, rtol=1e-6)


def test_the_cache_key_keeps_large_apart_from_v4(synths, tmp_path):
    small, large = synths["v4"], synths["v4-large"]
    opts = {"seed": 1, "steps": 4}
    a, b = small.render_identity(TEXT, None, opts), large.render_identity(TEXT, None, opts)
    assert (a["family"], b["family"]) == ("v4", "v4-large") and a["sampler"] == b["sampler"] == "rf"
    with PhraseCache(tmp_path / "cache") as cache:
        fingerprints = dict(large.fingerprints)
        large.fingerprints = dict(small.fingerprints)  # equal files as far as the key can see
        try:
            assert cache.key(small, TEXT, None, opts) != cache.key(large, TEXT, None, opts)
        finally:
            large.fingerprints = fingerprints
