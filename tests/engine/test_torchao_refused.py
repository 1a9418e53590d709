"""The torchao-quantised `-Quantized` v4 releases: their int8 weight-only copy is read everywhere
(the engine, the synthesizer's loader, `--int4`, `quantize`); any other torchao file or folder is
one clear error before any work.

The refused files here only have torchao's outward signs (tensor parts such as `.qdata`, torchao
named in the metadata), no `irodori_quantization_json`. The int8 reader's exactness against the
reference: tests/engine/test_fixtures_v4_large.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.engine.hardware.presets import select_preset
from irodori_speaker.engine.sources import CODEC_REPO, FilesNotAvailable, parse_source, resolve, resolve_files
from irodori_speaker.errors import CheckpointError, ModelSourceError
from irodori_speaker.synthesis.loading import load_dit

CONFIG = json.dumps({"model_dim": 64, "text_encoder_type": "pretrained"})
DATA = Path(__file__).resolve().parents[1] / "data" / "dit_v4_large"
INT8 = DATA / "tiny_v4_large.int8-weight-only.safetensors"
LARGE_Q = "Aratako/Irodori-TTS-v4-Large-Quantized"


@pytest.mark.parametrize(
    ("tensors", "meta"),
    [
        ({"blocks.0.mlp.w1.weight.qdata": torch.zeros(4, 4, dtype=torch.int8)}, {"config_json": CONFIG}),
        ({"blocks.0.mlp.w1.weight": torch.zeros(4, 4)}, {"config_json": CONFIG, "quantizer": "torchao 0.14"}),
    ],
)
def test_a_torchao_file_is_named_and_refused(tmp_path, tensors, meta):
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata=meta)
    for load in (
        lambda: load_checkpoint(path),
        lambda: load_dit(path, select_preset("cpu")),
        lambda: load_dit(path, select_preset("cpu", int4=True)),  # refused before the RTN warning
    ):
        with pytest.raises(
            CheckpointError, match="torchao-quantised copy: no irodori_quantization_json"
        ) as e:
            load()
        assert "supported: torchao int8_weight_only" in str(e.value) and "\n" not in str(e.value)
        assert "irodori-speaker quantize" in e.value.hint


def test_the_loader_reads_the_int8_copy_at_the_presets_dtype():
    ref = load_checkpoint(INT8)  # fp32: qdata * scale
    fp32 = load_dit(INT8, select_preset("cpu", dtype=torch.float32))
    bf16 = load_dit(INT8, select_preset("cpu", dtype=torch.bfloat16))
    assert fp32.config.family == "v4-large" and not fp32.quantized
    w = ref.model.blocks[0].attention.wq.weight
    assert torch.equal(fp32.model.blocks[0].attention.wq.weight, w)
    assert bf16.model.blocks[0].attention.wq.weight.dtype == torch.bfloat16
    assert torch.equal(bf16.model.blocks[0].attention.wq.weight, w.to(torch.bfloat16))


@pytest.mark.filterwarnings("ignore:.*quantising them to int4")
def test_int4_at_load_from_the_int8_copy_rounds_its_dequantised_weights():
    from irodori_speaker.engine.quant.layers import Int4Linear

    ref = load_checkpoint(INT8).model
    q = load_dit(INT8, select_preset("cpu", int4=True, dtype=torch.float32))
    assert q.quantized and q.config.family == "v4-large"
    layer = q.model.blocks[0].attention.wq
    assert isinstance(layer, Int4Linear)
    w = ref.blocks[0].attention.wq.weight
    err = float((layer.dequantize_weight() - w).norm() / w.norm())
    assert 0 < err < 0.15  # int4 group-32 rounding of the int8 weights, not something else


@pytest.mark.parametrize("folder", ["int4-weight-only", "float8-weight-only", "fp8-weight-only"])
def test_a_quantized_repos_other_folders_are_refused_before_any_download(tmp_path, monkeypatch, folder):
    def no_download(*a, **k):  # pragma: no cover - reaching it is the failure
        raise AssertionError("a download was attempted")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", no_download)
    source = f"hf://{LARGE_Q}/{folder}/model.safetensors"
    for call in (
        lambda: resolve_files(source, tmp_path / "codec.pth", None, cache_dir=tmp_path),
        lambda: resolve(source, cache_dir=tmp_path),
    ):
        with pytest.raises(ModelSourceError, match=f"{folder} of a torchao -Quantized repo is not read") as e:
            call()
        assert f"supported: its int8-weight-only/model.safetensors (--model {LARGE_Q})" in str(e.value)
        assert "irodori-speaker quantize" in e.value.hint


def test_a_quantized_repo_id_means_its_int8_copy_with_the_top_level_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for repo in (LARGE_Q, "Aratako/Irodori-TTS-v4.1-Small-Quantized"):
        assert parse_source(repo).filename == "int8-weight-only/model.safetensors"
        with pytest.raises(FilesNotAvailable) as e:
            resolve_files(repo, CODEC_REPO, None, cache_dir=tmp_path)
        named = [spec.describe() for _, spec in e.value.missing]
        assert named[:2] == [
            f"hf://{repo}/int8-weight-only/model.safetensors",
            f"hf://{CODEC_REPO}/weights.pth",
        ]
        # the tokenizer folder is named where the -Quantized repos keep it: at the top level
        assert named[2:] == [
            f"hf://{repo}/tokenizer/{n}" for n in ("tokenizer.json", "tokenizer_config.json")
        ]
        assert "llm-jp" not in str(e.value)
