"""Strict loading, the released full-size manifests, dtypes and config handling."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from irodori_speaker.engine.checkpoint import build_model, load_checkpoint
from irodori_speaker.engine.config import ModelConfig
from irodori_speaker.errors import CheckpointError, IrodoriError

RELEASES = ["v2_500m", "v2_500m_voicedesign", "v3_500m", "v3_voicedesign"]


@pytest.mark.parametrize("release", RELEASES)
def test_meta_build_matches_release_manifest(dit_fixtures, release):
    manifest = json.loads((dit_fixtures / f"{release}_keys.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the released config has no field we do not know
        cfg = ModelConfig.from_dict(manifest["config"])
    model = build_model(cfg, device="meta")
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert ours == {k: list(v) for k, v in manifest["tensors"].items()}
    assert sum(v.numel() for v in model.state_dict().values()) == manifest["num_parameters"]


def write_variant(src, dst, *, drop=None, reshape=None, add=None, metadata="keep"):
    tensors = load_file(str(src))
    with safe_open(str(src), "pt") as f:
        meta = f.metadata()
    if drop:
        del tensors[drop]
    if reshape:
        tensors[reshape] = torch.zeros(tensors[reshape].shape[0] + 1, *tensors[reshape].shape[1:])
    if add:
        tensors[add] = torch.zeros(3)
    if metadata == "drop":
        meta = {}
    elif isinstance(metadata, dict):
        meta = metadata
    save_file(tensors, str(dst), metadata=meta)
    return dst


@pytest.fixture
def tiny(dit_fixtures):
    return dit_fixtures / "tiny_v3_base.safetensors"


def test_missing_tensor_is_named(tiny, tmp_path):
    bad = write_variant(tiny, tmp_path / "m.safetensors", drop="blocks.1.mlp.w2.weight")
    with pytest.raises(CheckpointError, match=r"missing tensors: blocks\.1\.mlp\.w2\.weight"):
        load_checkpoint(bad)


def test_misshaped_tensor_is_named(tiny, tmp_path):
    bad = write_variant(tiny, tmp_path / "s.safetensors", reshape="in_proj.weight")
    with pytest.raises(CheckpointError, match=r"mis-shaped tensors: in_proj\.weight \(file \[65, 32\]"):
        load_checkpoint(bad)


def test_unexpected_tensor_is_named(tiny, tmp_path):
    bad = write_variant(tiny, tmp_path / "u.safetensors", add="blocks.0.extra.weight")
    with pytest.raises(CheckpointError, match=r"unexpected tensors: blocks\.0\.extra\.weight"):
        load_checkpoint(bad)


def test_missing_config_json(tiny, tmp_path):
    bad = write_variant(tiny, tmp_path / "c.safetensors", metadata="drop")
    with pytest.raises(CheckpointError, match="config_json"):
        load_checkpoint(bad)


def test_invalid_config_json(tiny, tmp_path):
    bad = write_variant(tiny, tmp_path / "j.safetensors", metadata={"config_json": "{not json"})
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(bad)


@pytest.mark.parametrize("content", [b"", b"hello, this is not a safetensors file", b"\x00" * 64])
def test_not_safetensors(tmp_path, content):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(content)
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_checkpoint(bad)


def test_missing_file(tmp_path):
    with pytest.raises(IrodoriError, match="no such file"):
        load_checkpoint(tmp_path / "absent.safetensors")


def test_older_config_takes_defaults_and_unknown_fields_warn(tiny, tmp_path):
    with safe_open(str(tiny), "pt") as f:
        cfg = json.loads(f.metadata()["config_json"])
    # v2-era files lack these fields; the defaults must give the same model
    for k in ("use_speaker_condition", "duration_speaker_fusion", "duration_caption_pooling"):
        cfg.pop(k)
    cfg["future_field"] = 1
    path = write_variant(tiny, tmp_path / "o.safetensors", metadata={"config_json": json.dumps(cfg)})
    with pytest.warns(UserWarning, match="future_field"):
        loaded = load_checkpoint(path)
    assert loaded.config.use_speaker_condition is None and loaded.config.speaker_enabled
    assert loaded.config.unknown == {"future_field": 1}


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float16])
def test_stored_half_precision_loads_as_fp32(tiny, tmp_path, stored):
    tensors = {k: v.to(stored) for k, v in load_file(str(tiny)).items()}
    with safe_open(str(tiny), "pt") as f:
        meta = f.metadata()
    path = tmp_path / "half.safetensors"
    save_file(tensors, str(path), metadata=meta)
    loaded = load_checkpoint(path, dtype="fp32")
    ref = load_file(str(tiny))
    for name, p in loaded.model.state_dict().items():
        assert p.dtype == torch.float32
        torch.testing.assert_close(p, ref[name].to(stored).float(), atol=0, rtol=0)


def test_unknown_dtype(tiny):
    with pytest.raises(CheckpointError, match="unknown dtype"):
        load_checkpoint(tiny, dtype="int8")


def test_an_int4_file_is_refused_with_the_loader_that_reads_it(dit_fixtures, tmp_path):
    """The engine knows no int4: the error names quant's loader, and that loader reads the file."""
    from irodori_speaker.engine.quant.checkpoint import load_int4_model
    from irodori_speaker.engine.quant.layers import Int4Linear
    from irodori_speaker.engine.quant.quantize import quantize_checkpoint

    dst = tmp_path / "int4.safetensors"
    quantize_checkpoint(dit_fixtures / "tiny_v2_base.safetensors", dst, method="rtn", report_errors=False)
    with pytest.raises(CheckpointError, match="int4 checkpoint") as info:
        load_checkpoint(dst)
    assert "load_int4_model" in (info.value.hint or "")
    loaded = load_int4_model(dst, dtype="fp32")
    assert loaded.quantized and isinstance(loaded.model.blocks[0].attention.wq, Int4Linear)


def test_loading_a_model_does_not_import_torch_dynamo(tmp_path):
    """The loaders build on the meta device; `normal_` there would import torch._dynamo (about 1.2 s
    of CPU in every process that loads a model: every `say`, every test process)."""
    import subprocess
    import sys

    from irodori_speaker.engine.quant.quantize import quantize_checkpoint
    from irodori_speaker.engine.tiny import tiny_random_files

    models = [tiny_random_files(kind, tmp_path).model for kind in ("v2", "v4", "v4-large")]
    quantize_checkpoint(models[1], tmp_path / "int4.safetensors", method="rtn", report_errors=False)
    code = f"""
import sys
from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.engine.quant.checkpoint import load_int4_checkpoint, model_from_int4
for path in {[str(m) for m in models]!r}:
    load_checkpoint(path)
model_from_int4(load_int4_checkpoint({str(tmp_path / "int4.safetensors")!r}), "int4", dequantize="all")
print("torch._dynamo" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]


def test_embeddings_built_on_a_real_device_are_still_initialised():
    from irodori_speaker.engine.layers import Embedding

    torch.manual_seed(0)
    table = Embedding(1000, 8)
    assert 0.9 < float(table.weight.detach().std()) < 1.1  # nn.Embedding's N(0, 1)
    assert Embedding(10, 8, device="meta").weight.is_meta
