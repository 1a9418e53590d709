"""The engine reproduces the reference implementation's golden outputs (fp32, CPU, 1e-4)."""

from __future__ import annotations

import pytest
import torch
from dit_cases import KINDS, case_settings, encode, load_kind

from irodori_speaker.engine.sampler import SamplerConfig, sample

TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_encode_conditions_velocity_duration(dit_fixtures, kind):
    model, io, _ = load_kind(dit_fixtures, kind)
    conds = encode(model, io)
    torch.testing.assert_close(conds.text_state, io["out_text_state"], **TOL)
    if "out_speaker_state" in io:
        torch.testing.assert_close(conds.speaker_state, io["out_speaker_state"], **TOL)
        assert torch.equal(conds.speaker_mask, io["out_speaker_mask"])
    else:
        assert conds.speaker_state is None
    if "out_caption_state" in io:
        torch.testing.assert_close(conds.caption_state, io["out_caption_state"], **TOL)
    v = model.velocity(io["x_t"], io["t"], conds, io["latent_mask"])
    torch.testing.assert_close(v, io["out_velocity"], **TOL)
    if "out_duration_log_frames" in io:
        pred = model.predict_log_frames(
            conds, has_speaker=io["duration_has_speaker"], has_caption=io.get("duration_has_caption")
        )
        torch.testing.assert_close(pred, io["out_duration_log_frames"], **TOL)


def sampler_cases():
    out = []
    for kind in KINDS:
        names = ["independent", "alternating", "joint", "nocfg", "truncated_rescaled"]
        names += ["sway6", "sway8", "sway8_half", "linear40"]
        if kind != "v2_voicedesign":
            names.append("speaker_kv")
        out += [(kind, n) for n in names]
    return out


@pytest.fixture(scope="module")
def loaded(dit_fixtures):
    return {kind: load_kind(dit_fixtures, kind) for kind in KINDS}


@pytest.mark.parametrize(("kind", "case"), sampler_cases())
def test_sampler_cases(loaded, kind, case):
    model, io, cases = loaded[kind]
    assert case in cases, f"fixture lacks sampler case {case}"
    settings = case_settings(cases[case])
    conds = encode(model, io, slice(0, 1))
    out = sample(model, conds, io[f"sample_{case}_noise"], SamplerConfig(**settings))
    torch.testing.assert_close(out, io[f"sample_{case}_out"], **TOL)


def test_fixture_lists_every_case_we_test(loaded):
    """Guard against a fixture gaining a case this file would silently skip."""
    tested = {c for _, c in sampler_cases()}
    for _, (_, _, cases) in loaded.items():
        assert set(cases) <= tested
