"""The MeanFlow sampler's plan, its refusals, dt handling, and no host sync inside its loop."""

from __future__ import annotations

import pytest
import torch
from host_sync import forbid_host_sync_after_first_step
from v4_cases import load_kind

from irodori_speaker.cancel import CancelToken
from irodori_speaker.engine.sampler import (
    MEANFLOW_DEFAULT_STEPS,
    SamplerConfig,
    draw_noise,
    plan_for,
    plan_meanflow,
    sample,
)
from irodori_speaker.errors import Cancelled, InputError


@pytest.fixture(scope="module")
def mf():
    model, io, _, _ = load_kind("v4_1_mf")
    return model, io


@pytest.fixture(scope="module")
def rf():
    model, io, _, _ = load_kind("v4")
    return model, io


def conds_of(model, io):
    return model.encode_conditions(
        io["text_input_ids"][:1],
        io["text_mask"][:1],
        io["ref_latent"][:1],
        io["ref_mask"][:1],
        io["caption_input_ids"][:1],
        io["caption_mask"][:1],
    )


def test_four_steps_by_default_with_the_release_schedule():
    plan = plan_meanflow(SamplerConfig())
    assert len(plan.steps) == MEANFLOW_DEFAULT_STEPS == 4
    assert [(s.t, s.t_next, s.dt) for s in plan.steps] == [
        (1.0, 0.75, 0.25),
        (0.75, 0.5, 0.25),
        (0.5, 0.25, 0.25),
        (0.25, 0.0, 0.25),
    ]
    assert plan.groups == () and all(s.group == -1 for s in plan.steps)


def test_uneven_steps_are_float32_differences():
    s = torch.linspace(1.0, 0.0, 4, dtype=torch.float32)
    plan = plan_meanflow(SamplerConfig(steps=3))
    assert [st.t for st in plan.steps] == s[:-1].tolist()
    assert [st.dt for st in plan.steps] == (s[:-1] - s[1:]).tolist()
    assert plan.steps[0].t == 1.0 and plan.steps[-1].t_next == 0.0  # no 0.999 factor


def test_guidance_settings_are_ignored_not_applied(mf):
    """CFG scales, mode, window and schedule do not change a MeanFlow result."""
    model, io = mf
    conds = conds_of(model, io)
    noise = draw_noise(5, 1, 24, 32)
    base = sample(model, conds, noise, SamplerConfig(steps=4))
    other = SamplerConfig(steps=4, guidance="joint", cfg_scale_text=7.0, schedule="sway", cfg_min_t=0.0)
    assert torch.equal(sample(model, conds, noise, other), base)
    assert len(plan_for(model, conds, other).steps) == 4


@pytest.mark.parametrize(
    "setting",
    [{"truncation_factor": 0.8}, {"rescale_k": 1.2, "rescale_sigma": 2.0}, {"speaker_kv_scale": 1.5}],
)
def test_rf_only_settings_are_refused(mf, setting):
    model, io = mf
    with pytest.raises(InputError, match="MeanFlow") as e:
        sample(model, conds_of(model, io), draw_noise(0, 1, 24, 32), SamplerConfig(**setting))
    assert e.value.hint


def test_dt_is_required_by_meanflow_and_refused_by_rf(mf, rf):
    for (model, io), dt, match in ((mf, None, "needs dt"), (rf, torch.zeros(2), "dt is for MeanFlow")):
        conds = model.encode_conditions(io["text_input_ids"], io["text_mask"])
        with pytest.raises(InputError, match=match):
            model.velocity(io["x_t"], io["t"], conds, dt=dt)


def test_rf_default_is_forty_steps(rf):
    model, io = rf
    assert len(plan_for(model, conds_of(model, io), SamplerConfig()).steps) == 40


def test_cancel_between_steps(mf):
    model, io = mf
    token, seen = CancelToken(), []

    def progress(done, total):
        seen.append((done, total))
        if done == 2:
            token.cancel("enough")

    with pytest.raises(Cancelled, match="enough"):
        sample(model, conds_of(model, io), draw_noise(0, 1, 24, 32), cancel=token, progress=progress)
    assert seen == [(1, 4), (2, 4)]


def test_loop_never_syncs_the_host(mf, monkeypatch):
    """After the first step, any tensor->Python conversion inside the MeanFlow loop fails the test."""
    model, io = mf

    progress = forbid_host_sync_after_first_step(monkeypatch)

    out = sample(model, conds_of(model, io), draw_noise(0, 1, 24, 32), SamplerConfig(), progress=progress)
    monkeypatch.undo()
    assert torch.isfinite(out).all()
