"""The torchao-quantised `-Quantized` v4 releases: a file that is not torchao int8 weight-only is one
clear CheckpointError, before any work (the int8 reader: tests/engine/test_fixtures_v4_large.py).

The files here only have torchao's outward signs (tensor parts such as `.qdata`, torchao named in
the metadata), no `irodori_quantization_json`. The synthesizer still refuses every torchao file
until it is wired to the engine's reader.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.engine.hardware.presets import select_preset
from irodori_speaker.engine.sources import resolve_files
from irodori_speaker.errors import CheckpointError
from irodori_speaker.synthesis.loading import load_dit

CONFIG = json.dumps({"model_dim": 64, "text_encoder_type": "pretrained"})


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
    with pytest.raises(CheckpointError, match="torchao-quantised copy: no irodori_quantization_json") as e:
        load_checkpoint(path)
    assert "supported: torchao int8_weight_only" in str(e.value)
    assert "irodori-speaker quantize" in e.value.hint
    with pytest.raises(CheckpointError, match="torchao-quantised copy") as e:
        load_dit(path, select_preset("cpu", int4=True))
    assert "not read yet" in str(e.value) and "irodori-speaker quantize" in e.value.hint


def test_a_quantized_repo_is_refused_before_any_download(tmp_path):
    with pytest.raises(CheckpointError, match=r"Irodori-TTS-v4\.1-Small-Quantized is a torchao") as e:
        resolve_files(
            "Aratako/Irodori-TTS-v4.1-Small-Quantized", tmp_path / "codec.pth", None, cache_dir=tmp_path
        )
    assert "Irodori-TTS-v4.1-Small" in e.value.hint
