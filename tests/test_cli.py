"""The command line, run as a user runs it (a subprocess), on the tiny-random model."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import soundfile as sf

from irodori_speaker.options.memory import BUDGET_ENV


def run_cli(*args, cache=None, env=None, timeout=300):
    """`irodori-speaker ARGS` in a subprocess, offline, with no GPU budget from the caller's shell;
    `cache`: IRODORI_CACHE and HF_HOME under it; `env`: more variables."""
    environ = {k: v for k, v in os.environ.items() if k != BUDGET_ENV}
    environ["HF_HUB_OFFLINE"] = "1"
    if cache is not None:
        environ.update(IRODORI_CACHE=str(cache), HF_HOME=str(cache / "hf"))
    environ.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "irodori_speaker.cli", *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cli-cache")


def test_say_writes_a_48k_wav_of_the_expected_length(cache, tmp_path):
    out = tmp_path / "hello.wav"
    r = run_cli(
        "say",
        "こんにちは、配信を始めます。",
        "-o",
        str(out),
        "--tiny-random",
        "--backend",
        "cpu",
        "--seconds",
        "2",
        "--seed",
        "7",
        "--no-tail-trim",
        cache=cache,
    )
    assert r.returncode == 0, r.stderr
    info = sf.info(str(out))
    assert info.samplerate == 48_000 and info.channels == 1 and info.frames == 96_000
    assert "noise" in r.stderr  # the tiny-random note is printed
    assert "seed 7" in r.stdout
    audio, _ = sf.read(str(out))
    assert np.abs(audio).max() > 0


def test_same_seed_same_file(cache, tmp_path):
    a, b = tmp_path / "a.wav", tmp_path / "b.wav"
    for f in (a, b):
        r = run_cli(
            "say", "同じです。", "-o", str(f), "--tiny-random", "--backend", "cpu", "--seed", "3", cache=cache
        )
        assert r.returncode == 0, r.stderr
    assert sf.read(str(a))[0].tolist() == sf.read(str(b))[0].tolist()


def test_errors_are_one_line_with_a_hint_and_exit_nonzero(cache, tmp_path):
    r = run_cli("say", "   ", "-o", str(tmp_path / "x.wav"), "--tiny-random", cache=cache)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and "Traceback" not in r.stderr
    r = run_cli(
        "say",
        "こんにちは",
        "-o",
        str(tmp_path / "x.wav"),
        "--model",
        str(tmp_path / "none.safetensors"),
        cache=cache,
    )
    assert r.returncode == 1 and r.stderr.startswith("error: ") and "hint: " in r.stderr
    r = run_cli("say", "こんにちは", "-o", str(tmp_path / "x.wav"), "--model", "org/absent-repo", cache=cache)
    assert r.returncode == 1 and "model hf://org/absent-repo/model.safetensors" in r.stderr
    assert "are missing (3 files)" in r.stderr and "hint: " in r.stderr


def test_usage_errors_exit_2(cache):
    assert run_cli("say", cache=cache).returncode == 2
    assert run_cli("no-such-command", cache=cache).returncode == 2
    h = run_cli("say", "--help", cache=cache)
    assert h.returncode == 0 and "--tiny-random" in h.stdout and "--seed" in h.stdout
