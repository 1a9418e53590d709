"""The engine reproduces the reference v4-Large golden outputs (T5Gemma 2 text encoder; fp32, CPU,
1e-4), reads its torchao int8 weight-only copy exactly, and builds the full-size release's manifest."""

from __future__ import annotations

import gzip
import json
import re
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from v4_cases import encode, sampler_settings

from irodori_speaker.engine.backbone_config import T5Gemma2Config, parse_backbone_config
from irodori_speaker.engine.checkpoint import build_model, load_checkpoint, read_header
from irodori_speaker.engine.config import ModelConfig
from irodori_speaker.engine.quant.quantize import RELEASE_SELECTION, plan_layers
from irodori_speaker.engine.sampler import SamplerConfig, sample
from irodori_speaker.engine.t5gemma import T5Gemma2TextEncoder
from irodori_speaker.errors import CheckpointError
from irodori_speaker.synthesis.voices import join_reference_clips, max_reference_frames

DATA = Path(__file__).resolve().parents[1] / "data" / "dit_v4_large"
MODEL = DATA / "tiny_v4_large.safetensors"
INT8 = DATA / "tiny_v4_large.int8-weight-only.safetensors"
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def loaded():
    """(model, io tensors, sampler cases, io notes)."""
    model = load_checkpoint(MODEL).model
    io_path = DATA / "tiny_v4_large_io.safetensors"
    with safe_open(str(io_path), "pt") as f:
        meta = f.metadata()
    return model, load_file(str(io_path)), json.loads(meta["sampler_cases"]), json.loads(meta["io_notes"])


def test_the_file_builds_a_t5gemma_backbone(loaded):
    model, _, _, notes = loaded
    cfg = model.cfg.text_backbone
    assert model.cfg.family == "v4-large" and isinstance(cfg, T5Gemma2Config)
    assert isinstance(model.pretrained_text_backbone.backbone, T5Gemma2TextEncoder)
    assert (cfg.bos_token_id, cfg.pad_token_id, cfg.eos_token_id) == (2, 0, 1)
    assert cfg.eoi_token_index == notes["tokens"]["eoi_token_index"] == 300
    assert cfg.window == (2, 3)  # W 6: keys k in [q - 2, q + 3]
    assert cfg.rope("full_attention") == (1e6, 8.0) and cfg.rope("sliding_attention") == (1e4, 1.0)
    assert cfg.attention_scale == pytest.approx(24**-0.5)


def test_backbone_states(loaded):
    model, io, _, notes = loaded
    row, pos = notes["tokens"]["eoi_at"]
    assert int(io["text_input_ids"][row, pos]) == 300  # the end-of-image swap is exercised
    backbone = model.pretrained_text_backbone
    for what in ("text", "caption"):
        out = backbone(io[f"{what}_input_ids"], io[f"{what}_mask"])
        torch.testing.assert_close(out, io[f"out_{what}_backbone_state"], **TOL)
    empty = backbone(io["empty_caption_input_ids"], io["empty_caption_mask"])
    assert torch.equal(empty, io["out_empty_caption_backbone_state"]) and not empty.any()


def test_the_eoi_token_takes_its_own_vector(loaded):
    model, io, _, notes = loaded
    row, pos = notes["tokens"]["eoi_at"]
    embed = model.pretrained_text_backbone.backbone.embed_tokens
    x = embed(io["text_input_ids"][row : row + 1])
    assert torch.equal(x[0, pos], embed.eoi_embedding)
    torch.testing.assert_close(x[0, 0], embed.weight[2] * 48**0.5)


def test_conditions_velocity_and_duration(loaded):
    model, io, _, _ = loaded
    conds = encode(model, io)
    torch.testing.assert_close(conds.text_state, io["out_text_state"], **TOL)
    torch.testing.assert_close(conds.speaker_state, io["out_speaker_state"], **TOL)
    assert torch.equal(conds.speaker_mask, io["out_speaker_mask"])
    torch.testing.assert_close(conds.caption_state, io["out_caption_state"], **TOL)
    assert torch.equal(conds.caption_mask, io["caption_mask"])
    v = model.velocity(io["x_t"], io["t"], conds, io["latent_mask"])
    torch.testing.assert_close(v, io["out_velocity"], **TOL)
    pred = model.predict_log_frames(
        conds, has_speaker=io["duration_has_speaker"], has_caption=io["duration_has_caption"]
    )
    torch.testing.assert_close(pred, io["out_duration_log_frames"], **TOL)


def test_multiclip_no_reference_and_empty_caption(loaded):
    model, io, _, notes = loaded
    cap = max_reference_frames(notes["multiclip"]["max_ref_seconds"])
    assert cap == notes["multiclip"]["max_ref_frames"] == 25
    joined = join_reference_clips([io[f"multiclip_clip{i}"][0] for i in range(4)], cap)
    assert torch.equal(joined[None], io["multiclip_ref_latent"])
    state, mask, _, _ = model.encode_voice(1, joined[None], io["multiclip_ref_mask"], like=io["x_t"])
    torch.testing.assert_close(state, io["out_multiclip_speaker_state"], **TOL)
    assert torch.equal(mask, io["out_multiclip_speaker_mask"])
    for ref, ref_mask in ((io["noref_ref_latent"], io["noref_ref_mask"]), (None, None)):
        state, mask, _, _ = model.encode_voice(1, ref, ref_mask, like=io["x_t"])
        torch.testing.assert_close(state, io["out_noref_speaker_state"], atol=0, rtol=0)
        assert torch.equal(mask, io["out_noref_speaker_mask"])
    assert io["empty_caption_input_ids"][0].tolist() == [2] + [0] * 11  # BOS 2, then pad 0
    conds = model.encode_conditions(
        io["text_input_ids"][:1],
        io["text_mask"][:1],
        caption_ids=io["empty_caption_input_ids"],
        caption_mask=io["empty_caption_mask"],
    )
    torch.testing.assert_close(conds.caption_state, io["out_empty_caption_state"], atol=0, rtol=0)


def test_padding_does_not_change_valid_outputs(loaded):
    model, io, _, _ = loaded
    n = int(io["text_mask"][1].sum())
    backbone = model.pretrained_text_backbone
    short = backbone(io["text_input_ids"][1:, :n], io["text_mask"][1:, :n])
    ids = io["text_input_ids"][1:].clone()
    ids[:, n:] = 7  # other pad ids: no change either
    torch.testing.assert_close(backbone(ids, io["text_mask"][1:])[:, :n], short, atol=1e-5, rtol=1e-5)


SAMPLER_CASES = [
    "linear40_independent",
    "sway8_independent",
    "sway6_alternating",
    "sway8_joint",
    "sway8_nocaption",
    "sway8_noref",
    "linear40_textonly",
    "sway8_multiclip",
    "sway8_speaker_kv",
]


def test_the_nine_sampler_cases_are_all_here(loaded):
    assert sorted(loaded[2]) == sorted(SAMPLER_CASES)


@pytest.mark.parametrize("case", SAMPLER_CASES)
def test_sampler_cases(loaded, case):
    model, io, cases, _ = loaded
    spec = cases[case]
    assert spec["sampler"] == "rf"
    conds = encode(model, io, prefix=f"sample_{case}_")
    config = SamplerConfig(**sampler_settings(spec))
    out = sample(model, conds, io[f"sample_{case}_noise"], config)
    torch.testing.assert_close(out, io[f"sample_{case}_out"], **TOL)
    if spec["conditions"] in ("noref", "textonly"):  # our runtime gives no reference as None
        conds = encode(model, io, prefix=f"sample_{case}_", ref=False)
        out = sample(model, conds, io[f"sample_{case}_noise"], config)
        torch.testing.assert_close(out, io[f"sample_{case}_out"], **TOL)


# -- the torchao int8 weight-only copy --------------------------------------------------------


def test_the_int8_file_reads_exactly_as_dequantised(loaded):
    _, io, _, _ = loaded
    ref = load_file(str(DATA / "tiny_v4_large_int8_dequant_io.safetensors"))
    int8 = load_checkpoint(INT8)
    assert int8.config.family == "v4-large" and not int8.quantized
    conds = encode(int8.model, io)
    for name in ("text", "speaker", "caption"):
        torch.testing.assert_close(getattr(conds, f"{name}_state"), ref[f"out_{name}_state"], **TOL)
    v = int8.model.velocity(io["x_t"], io["t"], conds, io["latent_mask"])
    torch.testing.assert_close(v, ref["out_velocity"], **TOL)
    # weight = qdata * scale exactly; the rest is the stored bf16
    with safe_open(str(INT8), "pt") as f:
        q, s = (
            f.get_tensor("blocks.0.attention.wq._weight_qdata"),
            f.get_tensor("blocks.0.attention.wq._weight_scale"),
        )
        norm = f.get_tensor("blocks.0.attention.q_norm.weight")
    assert torch.equal(int8.model.blocks[0].attention.wq.weight, q.float() * s.float())
    assert torch.equal(int8.model.blocks[0].attention.q_norm.weight, norm.float())


def test_the_int8_file_in_bf16_keeps_torchaos_values():
    bf16 = load_checkpoint(INT8, dtype=torch.bfloat16).model
    with safe_open(str(INT8), "pt") as f:
        q, s = f.get_tensor("blocks.1.mlp.w2._weight_qdata"), f.get_tensor("blocks.1.mlp.w2._weight_scale")
    w = bf16.blocks[1].mlp.w2.weight
    assert w.dtype == torch.bfloat16 and torch.equal(w, q.to(torch.bfloat16) * s)


def _rewrite_quantization(tmp_path: Path, **changes) -> Path:
    meta, _ = read_header(INT8)
    info = json.loads(meta["irodori_quantization_json"]) | changes
    meta["irodori_quantization_json"] = json.dumps(info)
    path = tmp_path / "model.safetensors"
    save_file(load_file(str(INT8)), str(path), metadata=meta)
    return path


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        (
            {"quantization_type": "int4_weight_only", "packing_format": "tile_packed_to_4d"},
            "int4_weight_only",
        ),
        ({"quantization_type": "float8_weight_only"}, "float8_weight_only"),
        ({"format_version": 2}, "format_version 1"),
    ],
)
def test_other_torchao_files_are_refused_in_one_line(tmp_path, changes, named):
    path = _rewrite_quantization(tmp_path, **changes)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(path)
    text = str(e.value)
    assert "\n" not in text and named in text and "int8_weight_only" in text
    assert "irodori-speaker quantize" in (e.value.hint or "")


def test_a_damaged_int8_file_is_refused(tmp_path):
    tensors = load_file(str(INT8))
    meta, _ = read_header(INT8)
    tensors.pop("blocks.0.attention.wq._weight_scale")
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(CheckpointError, match=r"blocks\.0\.attention\.wq\.weight: expected"):
        load_checkpoint(path)


# -- configs and the full-size manifest ---------------------------------------------------------


def manifest() -> dict:
    with gzip.open(DATA / "v4_large_keys.json.gz", "rt", encoding="utf-8") as f:
        return json.load(f)


def full_size_model():
    m = manifest()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the released config has no field we do not know
        backbone = parse_backbone_config(m["text_encoder_config"])
        cfg = ModelConfig.from_dict(m["config"], text_backbone=backbone)
    return m, cfg, build_model(cfg, device="meta")


def test_meta_build_matches_release_manifest():
    m, cfg, model = full_size_model()
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert ours == {k: list(v) for k, v in m["tensors"].items()}
    n = sum(v.numel() for v in model.state_dict().values())
    assert n == m["num_parameters"] == 3_288_179_489
    assert len(ours) == m["num_tensors"] == 1391
    assert cfg.family == "v4-large"
    backbone = cfg.text_backbone
    assert isinstance(backbone, T5Gemma2Config)
    assert [i for i, t in enumerate(backbone.layer_types) if t == "full_attention"] == [5, 11, 17, 23]
    assert backbone.window == (255, 256)  # W 512: 256 back including itself, 256 ahead


def test_release_selection_packs_the_t5gemma_linears():
    _, _, model = full_size_model()
    shapes = {
        k[: -len(".weight")]: tuple(v.shape) for k, v in model.state_dict().items() if k.endswith(".weight")
    }
    plan = plan_layers(shapes, RELEASE_SELECTION)
    backbone = [n for n in plan.gptq if n.startswith("pretrained_text_backbone.")]
    assert len(backbone) == 26 * 7 and not plan.kept
    assert all(re.search(r"\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)$", n) for n in backbone)


def test_backbone_configs_are_chosen_by_model_type():
    m = manifest()["text_encoder_config"]
    with pytest.raises(CheckpointError, match="model_type 'bert' is not supported"):
        parse_backbone_config(dict(m, model_type="bert"))
    text = m["encoder"]["text_config"]
    for bad, match in (
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        ({"rope_parameters": {"full_attention": {"rope_type": "yarn"}}}, "rope_type 'yarn'"),
        ({"num_key_value_heads": 3}, "cannot share"),
        ({"layer_types": ["full_attention"]}, "layer_types must list 26"),
    ):
        broken = dict(m, encoder=dict(m["encoder"], text_config=dict(text, **bad)))
        with pytest.raises(CheckpointError, match=match):
            parse_backbone_config(broken)
    # a transformers 4.x style Gemma 3 text config (no layer_types / rope_parameters) reads the same
    old = {k: v for k, v in text.items() if k not in ("layer_types", "rope_parameters")}
    old |= {"sliding_window_pattern": 6, "rope_theta": 1e6, "rope_local_base_freq": 1e4}
    old |= {"rope_scaling": {"rope_type": "linear", "factor": 8.0}}
    legacy = parse_backbone_config(dict(m, encoder=dict(m["encoder"], text_config=old)))
    assert legacy == parse_backbone_config(m)


def test_the_tiny_preset_is_the_fixtures_shape(tmp_path):
    from irodori_speaker.engine.tiny import random_model, tiny_random_files

    ours = random_model("v4-large")
    fixture = load_checkpoint(MODEL).model
    shapes = {k: v.shape for k, v in ours.state_dict().items()}
    assert shapes == {k: v.shape for k, v in fixture.state_dict().items()}
    assert ours.cfg.text_backbone == fixture.cfg.text_backbone
    files = tiny_random_files("v4-large", tmp_path)
    assert files.tokenizer.parent.name == "tokenizer" and files.model.parent.name == "dit-v4-large"
    assert load_checkpoint(files.model).config.family == "v4-large"
