"""The fast path and int4 on v4 / v4.1-MF models: equal to the reference (golden cases, 1e-4).

The DiT blocks are the ones v2 / v3 use; what is new is the text side (the ModernBERT
backbone, run eagerly or in the text-encoder graph) and MeanFlow's dt conditioning, which the
fast path's precomputed modulation table must carry.
"""

from __future__ import annotations

import pytest
import torch
from v4_cases import KINDS, V4_DATA, encode, load_kind, sampler_settings

from irodori_speaker.engine.fast import FastDiT, FastSampler
from irodori_speaker.engine.sampler import SamplerConfig, plan_meanflow, sample

TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def loaded():
    return {kind: load_kind(kind) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_eager_fast_sampler_matches_every_golden_case(loaded, kind):
    """Padded to the frame (24 -> 32) and context buckets, the model's own blocks (CPU)."""
    model, io, cases, _ = loaded[kind]
    sampler = FastSampler(model, frame_bucket=16, context_bucket=32, use_graphs=False)
    for name, spec in cases.items():
        conds = encode(model, io, prefix=f"sample_{name}_")
        out = sampler.sample(conds, io[f"sample_{name}_noise"], SamplerConfig(**sampler_settings(spec)))
        torch.testing.assert_close(out, io[f"sample_{name}_out"], **TOL, msg=name)


def test_the_meanflow_modulation_table_carries_dt(loaded):
    model = loaded["v4_1_mf"][0]
    plan = plan_meanflow(SamplerConfig(steps=4))
    fast = FastDiT(model)
    table = fast.modulation_table([s.t for s in plan.steps], [s.dt for s in plan.steps])
    t, dt = torch.tensor([plan.steps[2].t]), torch.tensor([plan.steps[2].dt])
    shift, scale, _ = model.blocks[1].attention_adaln.modulation(model.time_condition(t, dt))
    torch.testing.assert_close(table[2, 1, 0], shift[0, 0])
    torch.testing.assert_close(table[2, 1, 1], 1 + scale[0, 0])
    with pytest.raises(Exception, match="needs dt"):
        fast.modulation_table([s.t for s in plan.steps])


def test_text_encoder_padding_to_the_bucket_is_exact(loaded):
    """What the text-encoder graph relies on for the backbone: padding changes no valid state."""
    import torch.nn.functional as F

    model, io, _, _ = loaded["v4"]
    ids, mask = io["text_input_ids"][1:], io["text_mask"][1:]  # row 1: 9 valid of 16
    L = ids.shape[1]
    with torch.inference_mode():
        plain = model.encode_text(ids, mask)
        padded = model.encode_text(F.pad(ids, (0, 32 - L)), F.pad(mask, (0, 32 - L), value=False))
    torch.testing.assert_close(padded[:, :L][mask], plain[mask], atol=1e-5, rtol=1e-5)
    assert torch.count_nonzero(padded[:, L:]) == 0


@pytest.mark.parametrize("kind", KINDS)
def test_int4_v4_files_keep_the_backbone_config_and_the_fast_path_equals_their_reference(
    loaded, kind, tmp_path
):
    from safetensors import safe_open

    from irodori_speaker.engine.quant.checkpoint import load_int4_model
    from irodori_speaker.engine.quant.layers import Int4Linear
    from irodori_speaker.engine.quant.quantize import quantize_checkpoint

    src = V4_DATA / f"tiny_{kind}.safetensors"
    dst = tmp_path / "int4.safetensors"
    quantize_checkpoint(src, dst, method="rtn", report_errors=False)
    with safe_open(str(dst), "pt") as f, safe_open(str(src), "pt") as g:
        assert f.metadata()["text_encoder_config_json"] == g.metadata()["text_encoder_config_json"]
    model = load_int4_model(dst, dtype="fp32").model
    assert model.cfg.family == ("v4.1-mf" if kind == "v4_1_mf" else "v4")
    assert isinstance(model.blocks[0].attention.wq, Int4Linear)
    _, io, cases, _ = loaded[kind]
    name = "mf4" if kind == "v4_1_mf" else "sway8_independent"
    conds = encode(model, io, prefix=f"sample_{name}_")
    noise, cfg = io[f"sample_{name}_noise"], SamplerConfig(**sampler_settings(cases[name]))
    ref = sample(model, conds, noise, cfg)
    # int4 is near the float reference (RTN on tiny random weights), not equal to it
    assert float((ref - io[f"sample_{name}_out"]).abs().max()) < 0.5
    fast = FastSampler(FastDiT(model, fused=True), use_graphs=False)  # fused int4 projections
    torch.testing.assert_close(fast.sample(conds, noise, cfg), ref, **TOL)


def test_a_float_v4_file_is_quantised_at_load_with_its_backbone(tmp_path):
    from irodori_speaker.engine.hardware.presets import select_preset
    from irodori_speaker.engine.quant.layers import Int4Linear
    from irodori_speaker.synthesis.loading import load_dit

    with pytest.warns(UserWarning, match="quantising them to int4 with RTN at load"):
        loaded = load_dit(V4_DATA / "tiny_v4_1_mf.safetensors", select_preset("cpu", int4=True))
    assert loaded.config.meanflow and loaded.config.text_backbone is not None
    assert isinstance(loaded.model.blocks[0].mlp.w1, Int4Linear)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need an NVIDIA GPU (run on the H200)")
@pytest.mark.parametrize("kind", KINDS)
def test_cuda_graph_replay_equals_eager_on_v4(loaded, kind):
    model, io, cases, _ = load_kind(kind)
    model = model.cuda()
    io = {k: v.cuda() for k, v in io.items()}
    graphed = FastSampler(model, use_graphs=True)
    eager = FastSampler(graphed.fast, use_graphs=False)
    for name, spec in cases.items():
        conds = encode(model, io, prefix=f"sample_{name}_")
        noise, cfg = io[f"sample_{name}_noise"], SamplerConfig(**sampler_settings(spec))
        a = graphed.sample(conds, noise, cfg)
        b = graphed.sample(conds, noise, cfg)  # a replay
        torch.testing.assert_close(a, eager.sample(conds, noise, cfg), **TOL, msg=name)
        torch.testing.assert_close(b, a, **TOL, msg=name)
        torch.testing.assert_close(a, io[f"sample_{name}_out"], atol=2e-4, rtol=2e-4, msg=name)
    ids, mask = io["text_input_ids"], io["text_mask"]
    text_state, _ = graphed.encode_text(ids, mask)  # the backbone in the text-encoder graph
    want = model.encode_text(ids, mask)
    torch.testing.assert_close(text_state[:, : ids.shape[1]], want, **TOL)


def test_the_backbone_is_packed_too_where_its_shapes_fit(tmp_path):
    """The ModernBERT linears and the token embedding go int4 (the full-size 768-wide backbone fits
    the packing; the fixtures' 48-wide one does not, so a 64-wide tiny model checks it)."""
    from irodori_speaker.engine.checkpoint import build_model, save_checkpoint
    from irodori_speaker.engine.config import BackboneConfig, InferenceConfig, ModelConfig
    from irodori_speaker.engine.quant.checkpoint import load_int4_model
    from irodori_speaker.engine.quant.layers import Int4Linear
    from irodori_speaker.engine.quant.quantize import quantize_checkpoint
    from irodori_speaker.engine.tiny import TINY_BACKBONE, TINY_CONFIGS

    backbone = BackboneConfig.from_dict(dict(TINY_BACKBONE, hidden_size=64, intermediate_size=96))
    cfg = ModelConfig.from_dict(TINY_CONFIGS["v4.1-mf"], text_backbone=backbone)
    torch.manual_seed(0)
    src, dst = tmp_path / "mf.safetensors", tmp_path / "mf_int4.safetensors"
    save_checkpoint(build_model(cfg, device="cpu"), src, inference=InferenceConfig(max_text_len=64))
    quantize_checkpoint(src, dst, method="rtn", report_errors=False)
    model = load_int4_model(dst, dtype="fp32").model
    layer = model.pretrained_text_backbone.backbone.layers[1]
    assert all(
        isinstance(m, Int4Linear) for m in (layer.attn.Wqkv, layer.attn.Wo, layer.mlp.Wi, layer.mlp.Wo)
    )
    assert not isinstance(
        model.pretrained_text_backbone.backbone.embeddings.tok_embeddings, torch.nn.Embedding
    )
    from irodori_speaker.engine.checkpoint import load_checkpoint

    ref = load_checkpoint(src).model
    ids = torch.randint(7, 512, (1, 12))
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.inference_mode():
        want, got = ref.encode_text(ids, mask), model.encode_text(ids, mask)
    rel = float((got - want).norm() / want.norm())
    assert 0 < rel < 0.2, rel  # RTN int4 of random weights: near, not equal
