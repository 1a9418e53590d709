"""Issue 12, hostile checkpoints: a damaged or hand-edited DiT file (empty, truncated, a pickle
renamed .safetensors, mis-shaped tensors, a `config_json` field of the wrong type) is one
`CheckpointError` line naming what is wrong, raised before the model is built. No Speaker can
exist on such a file: each case asserts instead that the process then loads a good model and
speaks (`loads_and_speaks`, tests/hostile.py)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from hostile import loads_and_speaks
from irodori_speaker.engine import checkpoint as checkpoint_mod
from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.errors import CheckpointError

pytestmark = pytest.mark.timeout(60)

#: (config field, a value of the wrong type or range): each is a CheckpointError naming the field.
BAD_FIELDS = [
    ("model_dim", "abc"),
    ("model_dim", [64]),
    ("model_dim", 64.5),
    ("model_dim", True),
    ("num_layers", None),
    ("num_heads", {"n": 2}),
    ("mlp_ratio", "2.875"),
    ("mlp_ratio", -1.0),
    ("text_vocab_size", 0),
    ("text_add_bos", "yes"),
    ("use_caption_condition", 1),
    ("duration_architecture", 3),
    ("text_tokenizer_repo", ["a"]),
    ("caption_dim", "wide"),
    ("norm_eps", 0.0),
    ("dropout", 1.5),
    ("speaker_patch_size", -2),
    ("max_text_len", "long"),
    ("ref_max_seconds", "thirty"),
]


@pytest.fixture(scope="module")
def tiny(dit_fixtures):
    return dit_fixtures / "tiny_v3_base.safetensors"


def config_of(path) -> dict:
    with safe_open(str(path), "pt") as f:
        return json.loads(f.metadata()["config_json"])


def with_config(src, dst, cfg: dict):
    save_file(load_file(str(src)), str(dst), metadata={"config_json": json.dumps(cfg)})
    return dst


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize(("name", "value"), BAD_FIELDS, ids=[f"{n}={v!r}" for n, v in BAD_FIELDS])
def test_a_config_field_of_the_wrong_type_is_a_checkpoint_error_before_the_build(
    tiny, irodori_home, tmp_path, monkeypatch, name, value
):
    cfg = config_of(tiny)
    if name == "norm_eps" or name == "dropout":
        assert isinstance(cfg.get(name, 0.1), float)
    cfg[name] = value
    path = with_config(tiny, tmp_path / "bad.safetensors", cfg)

    def no_build(*a, **kw):
        raise AssertionError("the model was built from a bad config")

    monkeypatch.setattr(checkpoint_mod, "build_model", no_build)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    assert name in one_line(e) and str(path) in str(e.value)
    monkeypatch.undo()
    loads_and_speaks()


def test_the_untouched_file_still_loads(tiny, tmp_path):
    loaded = load_checkpoint(with_config(tiny, tmp_path / "ok.safetensors", config_of(tiny)))
    assert loaded.config.model_dim == config_of(tiny)["model_dim"]


def test_config_json_that_is_not_an_object_is_refused(tiny, irodori_home, tmp_path):
    for text in ("[1, 2]", '"text"', "null", "{"):
        path = tmp_path / "x.safetensors"
        save_file(load_file(str(tiny)), str(path), metadata={"config_json": text})
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(path)
        assert "config_json" in one_line(e)
    loads_and_speaks()


def _empty(src, dst):
    dst.write_bytes(b"")


def _truncated(src, dst):
    data = src.read_bytes()
    dst.write_bytes(data[: len(data) // 2])


def _header_only(src, dst):
    data = src.read_bytes()
    n = int.from_bytes(data[:8], "little")
    dst.write_bytes(data[: 8 + n])


def _pickle(src, dst):
    torch.save(load_file(str(src)), str(dst))


def _garbage_header(src, dst):
    data = bytearray(src.read_bytes())
    data[10:20] = b"\xff" * 10
    dst.write_bytes(bytes(data))


def _misshaped(src, dst):
    tensors = load_file(str(src))
    name = sorted(tensors)[0]
    tensors[name] = torch.zeros(*[s + 1 for s in tensors[name].shape])
    with safe_open(str(src), "pt") as f:
        save_file(tensors, str(dst), metadata=f.metadata())


def _int_tensor(src, dst):
    tensors = load_file(str(src))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].to(torch.int32)
    with safe_open(str(src), "pt") as f:
        save_file(tensors, str(dst), metadata=f.metadata())


def _no_metadata(src, dst):
    save_file(load_file(str(src)), str(dst))


@pytest.mark.parametrize(
    "damage",
    [_empty, _truncated, _header_only, _pickle, _garbage_header, _misshaped, _int_tensor, _no_metadata],
)
def test_a_damaged_checkpoint_file_is_one_checkpoint_error(tiny, irodori_home, tmp_path, damage):
    path = tmp_path / "model.safetensors"
    damage(tiny, path)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    assert str(path) in one_line(e)
    loads_and_speaks()


def test_a_missing_or_directory_checkpoint_is_one_clear_error(irodori_home, tmp_path):
    from irodori_speaker.errors import IrodoriError

    for path in (tmp_path / "absent.safetensors", tmp_path):
        with pytest.raises(IrodoriError) as e:
            load_checkpoint(path)
        one_line(e)
    loads_and_speaks()
