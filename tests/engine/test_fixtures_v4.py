"""The engine reproduces the reference v4 / v4.1-MF golden outputs (fp32, CPU, 1e-4), and the
full-size releases' manifests."""

from __future__ import annotations

import warnings

import pytest
import torch
from v4_cases import KINDS, RELEASES, V4_DATA, encode, load_kind, manifest, sampler_settings

from irodori_speaker.engine.checkpoint import build_model, read_header
from irodori_speaker.engine.config import BackboneConfig, ModelConfig
from irodori_speaker.engine.sampler import SamplerConfig, sample
from irodori_speaker.synthesis.voices import join_reference_clips, max_reference_frames

TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def loaded():
    return {kind: load_kind(kind) for kind in KINDS}


@pytest.mark.parametrize("kind", KINDS)
def test_backbone_states(loaded, kind):
    model, io, _, _ = loaded[kind]
    backbone = model.pretrained_text_backbone
    for what in ("text", "caption"):
        out = backbone(io[f"{what}_input_ids"], io[f"{what}_mask"])
        torch.testing.assert_close(out, io[f"out_{what}_backbone_state"], **TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_conditions_velocity_and_duration(loaded, kind):
    model, io, _, _ = loaded[kind]
    conds = encode(model, io)
    torch.testing.assert_close(conds.text_state, io["out_text_state"], **TOL)
    torch.testing.assert_close(conds.speaker_state, io["out_speaker_state"], **TOL)
    assert torch.equal(conds.speaker_mask, io["out_speaker_mask"])
    torch.testing.assert_close(conds.caption_state, io["out_caption_state"], **TOL)
    assert torch.equal(conds.caption_mask, io["caption_mask"])
    if kind == "v4_1_mf":
        v = model.velocity(io["x_t"], io["t"], conds, io["latent_mask"], dt=io["t"] - io["r"])
        torch.testing.assert_close(io["t"] - io["r"], io["delta_t"])
        torch.testing.assert_close(v, io["out_velocity"], **TOL)
        v0 = model.velocity(io["x_t"], io["t"], conds, io["latent_mask"], dt=torch.zeros(2))
        torch.testing.assert_close(v0, io["out_velocity_delta0"], **TOL)
        assert (v - v0).abs().max() > 1e-2  # dt changes the output: the test can fail
    else:
        v = model.velocity(io["x_t"], io["t"], conds, io["latent_mask"])
        torch.testing.assert_close(v, io["out_velocity"], **TOL)
    pred = model.predict_log_frames(
        conds, has_speaker=io["duration_has_speaker"], has_caption=io["duration_has_caption"]
    )
    torch.testing.assert_close(pred, io["out_duration_log_frames"], **TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_multiclip_no_reference_and_empty_caption(loaded, kind):
    model, io, _, notes = loaded[kind]
    first = slice(0, 1)
    # the runtime's reference from four clips: in order, stopping after the clip that reaches
    # the cap, cut to it (ceil(1.0 s * 25) = 25 frames)
    cap = max_reference_frames(notes["multiclip"]["max_ref_seconds"])
    assert cap == notes["multiclip"]["max_ref_frames"] == 25
    clips = [io[f"multiclip_clip{i}"][0] for i in range(4)]
    joined = join_reference_clips(clips, cap)
    assert torch.equal(joined[None], io["multiclip_ref_latent"])
    assert io["multiclip_ref_mask"].all()
    state, mask, _, _ = model.encode_voice(1, joined[None], io["multiclip_ref_mask"], like=io["x_t"])
    torch.testing.assert_close(state, io["out_multiclip_speaker_state"], **TOL)
    assert torch.equal(mask, io["out_multiclip_speaker_mask"])
    # no reference: the stored zero latent, and our own placeholder (None), give 2 zero positions
    for ref, ref_mask in ((io["noref_ref_latent"], io["noref_ref_mask"]), (None, None)):
        state, mask, _, _ = model.encode_voice(1, ref, ref_mask, like=io["x_t"])
        torch.testing.assert_close(state, io["out_noref_speaker_state"], atol=0, rtol=0)
        assert torch.equal(mask, io["out_noref_speaker_mask"])
    # empty caption: every state zero
    conds = model.encode_conditions(
        io["text_input_ids"][first],
        io["text_mask"][first],
        caption_ids=io["empty_caption_input_ids"],
        caption_mask=io["empty_caption_mask"],
    )
    assert not io["empty_caption_mask"].any()
    torch.testing.assert_close(conds.caption_state, io["out_empty_caption_state"], atol=0, rtol=0)


def sampler_cases():
    return [(kind, case) for kind in KINDS for case in load_kind(kind)[2]]


@pytest.mark.parametrize(("kind", "case"), sampler_cases())
def test_sampler_cases(loaded, kind, case):
    model, io, cases, _ = loaded[kind]
    spec = cases[case]
    assert spec["sampler"] == ("meanflow" if kind == "v4_1_mf" else "rf")
    conds = encode(model, io, prefix=f"sample_{case}_")
    out = sample(model, conds, io[f"sample_{case}_noise"], SamplerConfig(**sampler_settings(spec)))
    torch.testing.assert_close(out, io[f"sample_{case}_out"], **TOL)
    if spec["conditions"] in ("noref", "textonly"):
        # our runtime gives no reference as None: the same result
        assert not io[f"sample_{case}_ref_mask"].any()
        conds = encode(model, io, prefix=f"sample_{case}_", ref=False)
        out = sample(model, conds, io[f"sample_{case}_noise"], SamplerConfig(**sampler_settings(spec)))
        torch.testing.assert_close(out, io[f"sample_{case}_out"], **TOL)


def test_meanflow_steps_matter(loaded):
    """mf4 and mf2 differ, so the step count (and the test above) is not vacuous."""
    _, io, _, _ = loaded["v4_1_mf"]
    assert (io["sample_mf4_out"] - io["sample_mf2_out"]).abs().max() > 0.1


@pytest.mark.parametrize("release", RELEASES)
def test_meta_build_matches_release_manifest(release):
    m = manifest(release)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the released config has no field we do not know
        backbone = BackboneConfig.from_dict(m["text_encoder_config"])
        cfg = ModelConfig.from_dict(m["config"], text_backbone=backbone)
    model = build_model(cfg, device="meta")
    ours = {k: list(v.shape) for k, v in model.state_dict().items()}
    assert ours == {k: list(v) for k, v in m["tensors"].items()}
    n = sum(v.numel() for v in model.state_dict().values())
    assert n == m["num_parameters"] == RELEASES[release]
    assert len(ours) == m["num_tensors"]
    assert cfg.family == ("v4.1-mf" if "mf" in release else "v4")


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_files_have_both_metadata_keys(kind):
    meta, _ = read_header(V4_DATA / f"tiny_{kind}.safetensors")
    assert {"config_json", "text_encoder_config_json"} <= set(meta)
