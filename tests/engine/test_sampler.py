"""Schedules, guidance planning, batched candidates, precision, cancellation and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from host_sync import forbid_host_sync_after_first_step
from safetensors.torch import load_file

from irodori_speaker.cancel import CancelToken
from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.engine.sampler import SamplerConfig, draw_noise, plan_sampling, sample, time_schedule
from irodori_speaker.errors import Cancelled, InputError


@pytest.mark.parametrize("n", [6, 8])
def test_sway_minus_one_is_a_cosine(n):
    ts = time_schedule(n, "sway", -1.0)
    expected = [0.999 * math.cos(math.pi * i / (2 * n)) for i in range(n + 1)]
    assert ts == pytest.approx(expected, abs=1e-12)


def test_linear_schedule():
    assert time_schedule(4) == pytest.approx([0.999, 0.74925, 0.4995, 0.24975, 0.0])


@pytest.mark.parametrize("coeff", [-3.0, 3.0])
def test_non_monotonic_sway_is_refused(coeff):
    with pytest.raises(InputError, match="not strictly decreasing"):
        time_schedule(8, "sway", coeff)


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_bad_step_count(bad):
    with pytest.raises(InputError, match="num_steps"):
        time_schedule(bad)


def test_plan_guidance_window_and_alternation():
    cfg = SamplerConfig(steps=8, schedule="sway", guidance="alternating")
    plan = plan_sampling(cfg, ("text", "speaker"))
    assert plan.groups == (((), ("text",)), ((), ("speaker",)))
    for i, step in enumerate(plan.steps):
        expect = (i % 2) if 0.5 <= step.t <= 1.0 else -1
        assert step.group == expect
    # sway front-loads steps at high t: 6 of 8 steps are guided
    assert sum(s.group >= 0 for s in plan.steps) == 6


def test_joint_needs_equal_scales():
    with pytest.raises(InputError, match="equal scales"):
        plan_sampling(SamplerConfig(guidance="joint"), ("text", "speaker"))


def test_unknown_modes():
    with pytest.raises(InputError, match="guidance"):
        plan_sampling(SamplerConfig(guidance="both"), ("text",))
    with pytest.raises(InputError, match="schedule"):
        time_schedule(8, "cosine")


@pytest.fixture(scope="module")
def v2(dit_fixtures):
    model = load_checkpoint(dit_fixtures / "tiny_v2_base.safetensors").model
    io = load_file(str(dit_fixtures / "tiny_v2_base_io.safetensors"))
    return model, io


def conds_of(model, io, rows=slice(0, 1)):
    return model.encode_conditions(
        io["text_input_ids"][rows], io["text_mask"][rows], io["ref_latent"][rows], io["ref_mask"][rows]
    )


def test_batched_candidates_equal_single_runs(v2):
    model, io = v2
    conds = conds_of(model, io)
    cfg = SamplerConfig(steps=6, schedule="sway")
    noise = draw_noise(7, 3, 24, 32)
    batched = sample(model, conds.repeat(3), noise, cfg)
    for i in range(3):
        single = sample(model, conds, noise[i : i + 1], cfg)
        torch.testing.assert_close(batched[i : i + 1], single, atol=1e-5, rtol=1e-5)


def test_batch_of_different_lines_equals_single_runs(v2):
    """Two different texts/references in one batch, with a padded latent mask."""
    model, io = v2
    conds = conds_of(model, io, slice(0, 2))
    cfg = SamplerConfig(steps=4)
    noise = draw_noise(3, 2, 24, 32)
    both = sample(model, conds, noise, cfg)
    for i in range(2):
        single = sample(model, conds_of(model, io, slice(i, i + 1)), noise[i : i + 1], cfg)
        torch.testing.assert_close(both[i : i + 1], single, atol=1e-5, rtol=1e-5)


def test_seeded_noise_is_reproducible_and_device_independent():
    a = draw_noise(123, 1, 10, 32)
    b = draw_noise(123, 1, 10, 32)
    assert torch.equal(a, b)
    assert not torch.equal(a, draw_noise(124, 1, 10, 32))
    assert draw_noise(123, 1, 10, 32, device="meta").device.type == "meta"


@pytest.mark.parametrize(("dtype", "tol"), [(torch.bfloat16, 3e-2), (torch.float16, 5e-3)])
def test_half_precision_tracks_fp32(dit_fixtures, v2, dtype, tol):
    """Measured on the tiny v2 model, 8 sway steps: bf16 1.2e-2, fp16 1.5e-3 relative error."""
    model, io = v2
    half = load_checkpoint(dit_fixtures / "tiny_v2_base.safetensors", dtype=dtype).model
    cfg = SamplerConfig(steps=8, schedule="sway")
    noise = io["sample_sway8_noise"]
    ref = sample(model, conds_of(model, io), noise, cfg)
    out = sample(half, conds_of(half, io), noise, cfg)
    assert out.dtype == torch.float32
    rel = ((out - ref).norm() / ref.norm()).item()
    assert rel < tol


def test_progress_and_cancel_between_steps(v2):
    model, io = v2
    token, seen = CancelToken(), []

    def progress(done, total):
        seen.append((done, total))
        if done == 3:
            token.cancel("stop now")

    with pytest.raises(Cancelled, match="stop now"):
        sample(
            model,
            conds_of(model, io),
            draw_noise(0, 1, 24, 32),
            SamplerConfig(steps=8),
            cancel=token,
            progress=progress,
        )
    assert seen == [(1, 8), (2, 8), (3, 8)]


def test_loop_never_syncs_the_host(v2, monkeypatch):
    """After the first step, any tensor->Python conversion inside the loop fails the test."""
    model, io = v2

    progress = forbid_host_sync_after_first_step(monkeypatch)

    cfg = SamplerConfig(
        steps=8,
        schedule="sway",
        rescale_k=1.2,
        rescale_sigma=2.0,
        speaker_kv_scale=1.5,
        speaker_kv_max_layers=1,
    )
    out = sample(model, conds_of(model, io), draw_noise(0, 1, 24, 32), cfg, progress=progress)
    monkeypatch.undo()
    assert torch.isfinite(out).all()


def test_mismatched_batch_and_shapes(v2):
    model, io = v2
    conds = conds_of(model, io)
    with pytest.raises(InputError, match="batch"):
        sample(model, conds, draw_noise(0, 2, 24, 32), SamplerConfig(steps=2))
    with pytest.raises(InputError, match="latent_dim"):
        sample(model, conds, torch.zeros(1, 24, 16), SamplerConfig(steps=2))


def test_bad_model_inputs_are_clear_errors(v2):
    model, io = v2
    ids, mask = io["text_input_ids"][:1], io["text_mask"][:1]
    ref, ref_mask = io["ref_latent"][:1], io["ref_mask"][:1]
    with pytest.raises(InputError, match=r"token ids must be in \[0, 300\)"):
        model.encode_conditions(ids + 1000, mask, ref, ref_mask)
    with pytest.raises(InputError, match="token ids"):
        model.encode_conditions(ids - 100, mask, ref, ref_mask)
    with pytest.raises(InputError, match="mask"):
        model.encode_conditions(ids, mask[:, :3], ref, ref_mask)
    with pytest.raises(InputError, match="ref_latent must be"):
        model.encode_conditions(ids, mask, io["ref_latent"], io["ref_mask"])  # batch 2 vs 1
    with pytest.raises(InputError, match="integer"):
        model.encode_conditions(ids.float(), mask, ref, ref_mask)


def test_the_old_num_steps_spelling_is_refused():
    with pytest.raises(TypeError, match="num_steps"):
        SamplerConfig(num_steps=6)  # type: ignore[call-arg]


def test_unset_steps_take_upstreams_forty_linear_steps():
    assert SamplerConfig().time_grid() == (40, "linear", -1.0)
    assert len(plan_sampling(SamplerConfig(), ()).steps) == 40
