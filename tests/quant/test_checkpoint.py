"""Int4 checkpoint files: write/read round trip, apply to a module tree by name, strictness and errors."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from irodori_speaker.engine.layers import Embedding
from irodori_speaker.engine.quant.checkpoint import (
    Int4Checkpoint,
    apply_int4,
    is_int4_checkpoint,
    load_int4_checkpoint,
    save_int4_checkpoint,
)
from irodori_speaker.engine.quant.formats import QuantCorruptionWarning, pack_gptq, rtn_quantize
from irodori_speaker.engine.quant.layers import Int4Conv1d, Int4Linear, PackedEmbedding
from irodori_speaker.errors import QuantError


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(64)
        self.wq = nn.Linear(64, 64, bias=False)
        self.w1 = nn.Linear(64, 96, bias=True)
        self.w2 = nn.Linear(96, 64, bias=False)
        self.odd = nn.Linear(64, 20, bias=False)  # N % 8 != 0: stays a float tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.w2(torch.relu(self.w1(h))) + self.wq(h) + self.odd(h).sum(-1, keepdim=True)


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(37, 64)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.conv = nn.Conv1d(64, 16, 3, padding=1)
        self.head = nn.Linear(16, 10)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x)
        return self.head(self.conv(x.transpose(1, 2)).transpose(1, 2))


GPTQ_NAMES = [f"blocks.{i}.{n}" for i in range(2) for n in ("wq", "w1", "w2")]


def _rtn_codes(w: torch.Tensor):
    """Symmetric RTN codes for a GPTQ layer (stand-in for the quantiser)."""
    n, k = w.shape
    wg = w.view(n, k // 32, 32)
    s = (2 * wg.abs().amax(-1) / 15).half().float()
    q = (torch.round(wg / s[..., None]) + 8).clamp(0, 15).view(n, k)
    return q, torch.full_like(s, 8), s


def make_checkpoint(fmt: str = "gptq", asym_first: bool = False) -> tuple[Toy, Int4Checkpoint]:
    """A random Toy and its int4 checkpoint; returns the Toy with the *dequantised* weights put back in."""
    torch.manual_seed(0)
    model = Toy()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    ckpt = Int4Checkpoint(config={"kind": "toy", "dim": 64}, checkpoint_format=fmt)
    for i, name in enumerate(GPTQ_NAMES):
        w = state.pop(f"{name}.weight")
        q, z, s = _rtn_codes(w)
        if asym_first and i == 0:
            z = torch.randint(0, 16, z.shape)
        ckpt.gptq[name] = pack_gptq(q, z, s, checkpoint_format=fmt, bias=state.get(f"{name}.bias"))
    ckpt.embed["emb"] = rtn_quantize(state.pop("emb.weight"), group_size=32)
    ckpt.extra["conv"] = rtn_quantize(state.pop("conv.weight").reshape(16, -1), group_size=None)
    ckpt.tensors = {k: v.half() for k, v in state.items()}
    # reference model: every tensor as the checkpoint will deliver it
    ref = Toy()
    sd = {k: v.half().float() for k, v in state.items()}
    for name, p in ckpt.gptq.items():
        sd[f"{name}.weight"] = p.dequantize()
    sd["emb.weight"] = ckpt.embed["emb"].dequantize()
    sd["conv.weight"] = ckpt.extra["conv"].dequantize().view(16, 64, 3)
    ref.load_state_dict(sd)
    return ref, ckpt


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Toy, Path]:
    ref, ckpt = make_checkpoint()
    path = tmp_path / "toy-int4.safetensors"
    save_int4_checkpoint(path, ckpt)
    return ref, path


def _rewrite(src: Path, dst: Path, edit_tensors=None, edit_meta=None) -> Path:
    with safe_open(str(src), framework="pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    if edit_tensors:
        edit_tensors(tensors)
    if edit_meta:
        edit_meta(meta)
    save_file(tensors, str(dst), metadata=meta)
    return dst


def test_file_layout_and_round_trip(saved) -> None:
    _, path = saved
    assert is_int4_checkpoint(path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        keys = set(f.keys())
        dtypes = {k: f.get_tensor(k).dtype for k in keys}
    assert meta["quant_method"] == "autobit" and meta["checkpoint_format"] == "gptq"
    layers = json.loads(meta["quant_layers_json"])
    assert {e["name"] for e in layers} == set(GPTQ_NAMES)
    assert all(e["wbits"] == 4 and e["groupsize"] == 32 and e["actorder"] is False for e in layers)
    assert json.loads(meta["embed_quant_layers_json"]) == [
        {"name": "emb", "num_embeddings": 37, "embedding_dim": 64, "num_groups": 2}
    ]
    assert json.loads(meta["extra_quant_layers_json"])[0]["in_features"] == 192
    assert (
        "blocks.0.wq.weight" not in keys and "blocks.0.wq.qweight" in keys and "_embed.emb.qweight_u8" in keys
    )
    assert dtypes["blocks.0.wq.qweight"] == torch.int32 and dtypes["_extra.conv.qweight_u8"] == torch.uint8
    floats = [k for k in keys if not k.endswith(("qweight", "qzeros", "g_idx", "qweight_u8"))]
    assert floats and all(dtypes[k] == torch.float16 for k in floats)
    ckpt = load_int4_checkpoint(path)
    assert ckpt.config == {"kind": "toy", "dim": 64}
    _, orig = make_checkpoint()
    for name, p in orig.gptq.items():
        assert torch.equal(ckpt.gptq[name].dequantize(), p.dequantize())
        assert torch.equal(ckpt.gptq[name].qzeros, p.qzeros)
    assert torch.equal(ckpt.embed["emb"].qweight_u8, orig.embed["emb"].qweight_u8)
    assert set(ckpt.tensors) == set(orig.tensors)


@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("act_dtype", [torch.float32, torch.bfloat16])
def test_apply_int4_matches_dequantised_reference(tmp_path: Path, fmt: str, act_dtype) -> None:
    ref, ckpt = make_checkpoint(fmt, asym_first=True)
    path = tmp_path / "t.safetensors"
    save_int4_checkpoint(path, ckpt)
    with torch.device("meta"):
        model = Toy()
    apply_int4(model, path, device="cpu", act_dtype=act_dtype)
    assert isinstance(model.blocks[0].wq, Int4Linear) and not model.blocks[0].wq.symmetric
    assert model.blocks[1].wq.symmetric
    assert isinstance(model.emb, PackedEmbedding) and isinstance(model.conv, Int4Conv1d)
    assert isinstance(model.blocks[0].odd, nn.Linear) and model.blocks[0].odd.weight.dtype == act_dtype
    assert not any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    ids = torch.randint(0, 37, (2, 7))
    with torch.no_grad():
        expect = ref.to(act_dtype)(ids).float()
        got = model(ids).float()
    tol = 1e-5 if act_dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got, expect, rtol=tol, atol=tol)


def test_dequantize_policy(saved) -> None:
    ref, path = saved
    with torch.device("meta"):
        model = Toy()
    apply_int4(model, path, act_dtype=torch.float32, dequantize={"blocks.0.", "emb"})
    assert type(model.blocks[0].wq) is nn.Linear and type(model.emb) is Embedding  # dense tables
    assert isinstance(model.blocks[1].wq, Int4Linear) and isinstance(model.conv, Int4Conv1d)
    ids = torch.randint(0, 37, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), ref(ids), rtol=1e-5, atol=1e-5)
    with torch.device("meta"):
        model = Toy()
    apply_int4(model, path, act_dtype=torch.float32, dequantize="all")
    assert not any(isinstance(m, (Int4Linear, PackedEmbedding, Int4Conv1d)) for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(ids), ref(ids), rtol=1e-5, atol=1e-5)


def _meta(key: str, fn):
    def edit(meta):
        meta[key] = json.dumps(fn(json.loads(meta[key]))) if key.endswith("_json") else fn(meta[key])

    return edit


@pytest.mark.parametrize(
    ("edit_tensors", "edit_meta", "match"),
    [
        (None, _meta("quant_layers_json", lambda v: [{**v[0], "actorder": True}, *v[1:]]), "actorder"),
        (None, _meta("quant_layers_json", lambda v: [{**v[0], "wbits": 8}, *v[1:]]), "wbits"),
        (None, _meta("checkpoint_format", lambda v: "awq"), "checkpoint_format 'awq'"),
        (None, _meta("quant_method", lambda v: "bnb"), "quant_method 'bnb'"),
        (lambda t: t.pop("blocks.1.w2.qzeros"), None, "blocks.1.w2.qzeros .*blocks.1.w2"),
        (lambda t: t.pop("_embed.emb.scales"), None, "_embed.emb.scales"),
        (lambda t: t.__setitem__("blocks.0.wq.g_idx", t["blocks.0.wq.g_idx"].flip(0)), None, "act-order"),
        (
            lambda t: t.__setitem__("blocks.0.wq.scales", t["blocks.0.wq.scales"][:1]),
            None,
            "blocks.0.wq.scales",
        ),
        (
            lambda t: t.__setitem__("blocks.0.wq.weight", torch.zeros(64, 64).half()),
            None,
            "blocks.0.wq.weight",
        ),
        (
            lambda t: t.__setitem__("_extra.head.qweight_u8", torch.zeros(10, 8, dtype=torch.uint8)),
            None,
            "not listed",
        ),
    ],
)
def test_bad_files_are_rejected_on_read(saved, tmp_path, edit_tensors, edit_meta, match) -> None:
    _, path = saved
    bad = _rewrite(path, tmp_path / "bad.safetensors", edit_tensors, edit_meta)
    with pytest.raises(QuantError, match=match):
        load_int4_checkpoint(bad)


@pytest.mark.parametrize(
    ("edit_tensors", "match"),
    [
        (lambda t: t.pop("blocks.1.norm.bias"), "missing from the checkpoint: blocks.1.norm.bias"),
        (
            lambda t: t.__setitem__("blocks.0.extra", torch.zeros(3).half()),
            "not in the model: blocks.0.extra",
        ),
        (lambda t: t.__setitem__("head.weight", torch.zeros(10, 17).half()), "head.weight: checkpoint shape"),
        (lambda t: t.pop("blocks.0.w1.bias"), "blocks.0.w1: bias missing"),
    ],
)
def test_apply_is_strict(saved, tmp_path, edit_tensors, match) -> None:
    _, path = saved
    bad = _rewrite(path, tmp_path / "bad.safetensors", edit_tensors)
    with torch.device("meta"):
        model = Toy()
    with pytest.raises(QuantError, match=match):
        apply_int4(model, bad, act_dtype=torch.float32)


def test_apply_rejects_model_mismatch(saved) -> None:
    _, path = saved
    with torch.device("meta"):
        model = Toy()
    model.blocks[0].w1 = nn.Linear(64, 104)
    with pytest.raises(QuantError, match=r"blocks\.0\.w1: checkpoint has 64->96, model has 64->104"):
        apply_int4(model, path)
    with torch.device("meta"):
        model = Toy()
    del model.blocks[1].w2
    with pytest.raises(QuantError, match=r"blocks\.1\.w2 is not a module"):
        apply_int4(model, path)
    with torch.device("meta"):
        model = Toy()
    model.conv = nn.Identity()
    with pytest.raises(QuantError, match="conv is a Identity"):
        apply_int4(model, path)


def test_corrupted_zeros_warn_on_load(tmp_path: Path) -> None:
    _, ckpt = make_checkpoint()
    p = ckpt.gptq["blocks.0.wq"]
    qz = p.qzeros.clone()
    qz[0, 0] = -16  # 0xFFFFFFF0: nibble 0 = 0, nibbles 1..7 = 0xF (a zero of 0 at nibble 1, unmasked)
    ckpt.gptq["blocks.0.wq"] = type(p)(**{**p.__dict__, "qzeros": qz})
    path = tmp_path / "c.safetensors"
    save_int4_checkpoint(path, ckpt)
    with pytest.warns(QuantCorruptionWarning, match="blocks.0.wq"):
        load_int4_checkpoint(path)
    clean = tmp_path / "clean.safetensors"
    save_int4_checkpoint(clean, make_checkpoint()[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_int4_checkpoint(clean)


def test_not_an_int4_file(tmp_path: Path) -> None:
    plain = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(plain), metadata={"config_json": "{}"})
    assert not is_int4_checkpoint(plain)
    with pytest.raises(QuantError, match="not an int4 checkpoint"):
        load_int4_checkpoint(plain)
    with pytest.raises(QuantError, match="not found"):
        load_int4_checkpoint(tmp_path / "nope.safetensors")
