"""A first run with no network, as a user has it: the command line against a local hub cache.

The cache is a real huggingface_hub cache directory (HF_HOME), empty or partly filled with
tiny files in the released repos' places. No network is used: offline is HF_HUB_OFFLINE=1, or
an endpoint on 127.0.0.1 that refuses connections (a closed port) or accepts and never answers.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import soundfile as sf

from hub_cache import fill_cache
from irodori_speaker.engine.sources import CODEC_REPO, MODELS, TOKENIZER_REPO

MODEL_REPO = MODELS["v2"]
DEFAULT_REPO = MODELS["v4.1-mf"]  # what `say` loads with no --model
SAY = ["say", "こんにちは", "--backend", "cpu", "--steps", "2", "--seconds", "0.5", "--model", "v2"]


def run(args, env_extra: dict[str, str], cwd: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(OMP_NUM_THREADS="1", **env_extra)
    return subprocess.run(
        [sys.executable, "-m", "irodori_speaker.cli", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
    )


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_release(tmp_path_factory) -> dict[str, Path]:
    """Tiny files standing in for the released model (naming the released tokenizer), codec, tokenizer."""
    from irodori_speaker.engine.checkpoint import build_model, save_checkpoint
    from irodori_speaker.engine.config import InferenceConfig, ModelConfig
    from irodori_speaker.engine.tiny import TINY_CONFIGS, tiny_random_files

    d = tmp_path_factory.mktemp("tiny-release")
    files = tiny_random_files("v2", d)
    cfg = ModelConfig.from_dict(dict(TINY_CONFIGS["v2"], text_tokenizer_repo=TOKENIZER_REPO))
    model = build_model(cfg, device="cpu")
    save_checkpoint(model, d / "model.safetensors", inference=InferenceConfig(max_text_len=256))
    return {"model": d / "model.safetensors", "codec": files.codec, "tokenizer": files.tokenizer}


def one_error(r) -> tuple[str, str]:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), r.stderr
    return lines[0], lines[1]


@pytest.mark.parametrize("how", ["HF_HUB_OFFLINE", "closed port"])
def test_an_empty_cache_names_every_missing_file_at_once(how, tmp_path):
    home = tmp_path / "hf"
    env = {"HF_HOME": str(home), "IRODORI_CACHE": str(tmp_path / "irodori")}
    env.update(
        {"HF_HUB_OFFLINE": "1"}
        if how == "HF_HUB_OFFLINE"
        else {"HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}
    )
    line, hint = one_error(run([*SAY, "-o", tmp_path / "a.wav"], env, tmp_path))
    for repo, name in [
        (MODEL_REPO, "model.safetensors"),
        (CODEC_REPO, "weights.pth"),
        (TOKENIZER_REPO, "tokenizer.json"),
    ]:
        assert f"hf://{repo}/{name}" in line
        assert f"hf download {repo} {name}" in hint
    assert "are missing (3 files)" in line and str(home / "hub") in line
    assert ("HF_HUB_OFFLINE" if how == "HF_HUB_OFFLINE" else "cannot be reached") in line
    assert "--model FILE --codec FILE --tokenizer FILE" in hint
    assert not (tmp_path / "a.wav").exists()


def test_with_no_model_named_the_default_is_v4_1_mf_and_every_file_it_needs_is_named(tmp_path):
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "IRODORI_CACHE": str(tmp_path / "irodori")}
    line, hint = one_error(run(["say", "こんにちは", "-o", tmp_path / "a.wav"], env, tmp_path))
    assert f"hf download {DEFAULT_REPO} model.safetensors" in hint
    for repo, name in [
        (DEFAULT_REPO, "model.safetensors"),
        (DEFAULT_REPO, "tokenizer/tokenizer.json"),
        (DEFAULT_REPO, "tokenizer/tokenizer_config.json"),
        (CODEC_REPO, "weights.pth"),
    ]:
        assert f"hf://{repo}/{name}" in line
    assert "are missing (4 files)" in line and MODEL_REPO not in line and TOKENIZER_REPO not in line


def test_a_partly_filled_cache_names_what_is_left_and_a_full_one_speaks(tiny_release, tmp_path):
    hub = tmp_path / "hf" / "hub"
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "IRODORI_CACHE": str(tmp_path / "irodori")}
    fill_cache(hub, MODEL_REPO, {"model.safetensors": tiny_release["model"].read_bytes()})
    line, hint = one_error(run([*SAY, "-o", tmp_path / "a.wav"], env, tmp_path))
    assert "model" not in line.split(":")[1] and "are missing (2 files)" in line
    assert f"codec hf://{CODEC_REPO}/weights.pth" in line
    # the tokenizer named is the one the cached model's file names
    assert (
        f"tokenizer hf://{TOKENIZER_REPO}/tokenizer.json" in line and "--codec FILE --tokenizer FILE" in hint
    )
    fill_cache(hub, CODEC_REPO, {"weights.pth": tiny_release["codec"].read_bytes()})
    line, _ = one_error(run([*SAY, "-o", tmp_path / "a.wav"], env, tmp_path))
    assert line.startswith(f"error: tokenizer hf://{TOKENIZER_REPO}/tokenizer.json is missing")
    fill_cache(hub, TOKENIZER_REPO, {"tokenizer.json": tiny_release["tokenizer"].read_bytes()})
    r = run([*SAY, "-o", tmp_path / "a.wav"], env, tmp_path)  # no --tiny-random: the "released" files
    assert r.returncode == 0, r.stderr
    assert sf.info(str(tmp_path / "a.wav")).frames == 24_000


def test_an_endpoint_that_never_answers_costs_one_short_probe(tmp_path):
    """A black hole (accepts, never answers): one connection, no retry lines on the terminal."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        env = {
            "HF_HOME": str(tmp_path / "hf"),
            "IRODORI_CACHE": str(tmp_path / "irodori"),
            "HF_ENDPOINT": f"http://127.0.0.1:{server.getsockname()[1]}",
        }
        line, _ = one_error(run([*SAY, "-o", tmp_path / "a.wav"], env, tmp_path))
    finally:
        stop.set()
        t.join()
        server.close()
        for c in accepted:
            c.close()
    assert "cannot be reached" in line and "are missing (3 files)" in line
    assert len(accepted) == 1  # the probe; huggingface_hub was never let loose on the endpoint
