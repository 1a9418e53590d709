"""Model sources against a real (hand-built) huggingface_hub cache, and with no network."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hub_cache import fill_cache
from irodori_speaker.engine.sources import MODELS, parse_source, resolve
from irodori_speaker.errors import ModelSourceError


def test_local_path(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")  # the strict loader reads it (and says what is wrong with it)
    assert resolve(f) == f
    assert resolve(tmp_path) == f  # a release folder: its model.safetensors


def test_repo_id_and_alias_from_cache(tmp_path):
    fill_cache(tmp_path, MODELS["v2"], {"model.safetensors": b"dit", "tokenizer.json": b"tok"})
    got = resolve("v2", cache_dir=tmp_path, local_only=True)
    assert got.read_bytes() == b"dit"
    assert resolve(MODELS["v2"], cache_dir=tmp_path, local_only=True) == got
    tok = resolve(MODELS["v2"], "tokenizer", cache_dir=tmp_path, local_only=True)
    assert tok.read_bytes() == b"tok"


def test_hf_uri_with_subfolder(tmp_path):
    fill_cache(tmp_path, "org/repo", {"int4/dit_int4.safetensors": b"q"})
    got = resolve("hf://org/repo/int4/dit_int4.safetensors", cache_dir=tmp_path, local_only=True)
    assert got.read_bytes() == b"q"


def test_missing_from_cache_offline_names_file_and_remedy(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fill_cache(tmp_path, "org/repo", {"other.bin": b"1"})
    with pytest.raises(ModelSourceError) as e:
        resolve("hf://org/repo/model.safetensors", cache_dir=tmp_path)
    msg = str(e.value)
    assert "hf://org/repo/model.safetensors" in msg and "offline" in msg
    assert "hf download org/repo model.safetensors" in msg and str(tmp_path) in msg


def test_no_network_is_a_clear_error(tmp_path):
    """A real download attempt against an endpoint that refuses connections."""
    code = (
        "from irodori_speaker.engine.sources import resolve\n"
        "from irodori_speaker.errors import ModelSourceError\n"
        "try:\n"
        f"    resolve('org/repo', cache_dir={str(tmp_path)!r})\n"
        "except ModelSourceError as e:\n"
        "    print('ERR', e)\n"
    )
    env = dict(os.environ, HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_OFFLINE="0", HF_HUB_ETAG_TIMEOUT="2")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("ERR"), out.stdout + out.stderr
    assert "model hf://org/repo/model.safetensors is missing: the Hugging Face Hub at" in out.stdout
    assert "cannot be reached" in out.stdout and "give local files (--model FILE" in out.stdout


@pytest.mark.parametrize("bad", ["hf://org", "hf://org/repo/", "./nothing/here.safetensors", "no such file"])
def test_bad_sources(bad):
    with pytest.raises(ModelSourceError):
        parse_source(bad)


def test_revision_syntax():
    spec = parse_source("hf://org/repo@v1.0/model.safetensors")
    assert (spec.repo_id, spec.revision, spec.filename) == ("org/repo", "v1.0", "model.safetensors")
