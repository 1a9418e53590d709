"""Configurations with latent_patch_size > 1 (and speaker_patch_size > 1): the reference is
patched by latent_patch_size first, then by speaker_patch_size."""

from __future__ import annotations

import pytest
import torch

from irodori_speaker.engine.checkpoint import build_model, load_checkpoint, save_checkpoint
from irodori_speaker.engine.config import ModelConfig
from irodori_speaker.engine.sampler import SamplerConfig, draw_noise, sample
from irodori_speaker.engine.tiny import TINY_CONFIGS

LP, SP, C = 2, 3, 32


@pytest.fixture(scope="module")
def model():
    cfg = ModelConfig.from_dict(dict(TINY_CONFIGS["v3"], latent_patch_size=LP, speaker_patch_size=SP))
    torch.manual_seed(0)
    return build_model(cfg, device="cpu").eval().requires_grad_(False)


def test_speaker_encoder_width(model):
    assert model.cfg.speaker_in_dim == C * LP * SP
    assert tuple(model.speaker_encoder.in_proj.weight.shape) == (model.cfg.speaker_dim, C * LP * SP)
    assert tuple(model.in_proj.weight.shape) == (model.cfg.model_dim, C * LP)


def test_checkpoint_round_trip_loads_strictly(model, tmp_path):
    path = tmp_path / "lp.safetensors"
    save_checkpoint(model, path)
    loaded = load_checkpoint(path)
    assert loaded.config.latent_patch_size == LP and loaded.config.speaker_patch_size == SP
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], tensor)


def test_reference_grouping_remainder_and_validity(model):
    T = 2 * LP * SP + 5  # two whole speaker positions and a remainder of 5 frames
    ref = torch.randn(1, T, C)
    mask = torch.ones(1, T, dtype=torch.bool)
    mask[0, LP * SP + 1] = False  # one invalid frame invalidates the second position only
    state, smask, _, _ = model.encode_voice(1, ref, mask)
    assert state.shape[1] == T // (LP * SP) + 1  # summary token first
    assert smask.tolist() == [[True, True, False]]
    # the same as grouping LP * SP consecutive frames by hand
    n = T // (LP * SP)
    grouped = ref[:, : n * LP * SP].reshape(1, n, LP * SP * C)
    pos_mask = mask[:, : n * LP * SP].reshape(1, n, LP * SP).all(-1)
    enc = model.speaker_norm(model.speaker_encoder(grouped, pos_mask))
    torch.testing.assert_close(state[:, 1:], enc, atol=0, rtol=0)


def test_no_reference_placeholder(model):
    state, mask, _, _ = model.encode_voice(1)
    assert state.shape[1] == 2 and not mask.any() and not state.any()


def test_sampling_and_the_latent_mask(model):
    conds = model.encode_conditions(
        torch.tensor([[1, 20, 30, 40]]), torch.ones(1, 4, dtype=torch.bool), torch.randn(1, 13, C)
    )
    noise = draw_noise(0, 1, 8 * LP, C)
    out = sample(model, conds, noise, SamplerConfig(steps=3))
    assert out.shape == noise.shape and torch.isfinite(out).all()
    mask = torch.ones(1, 8 * LP, dtype=torch.bool)
    mask[:, -LP:] = False  # the last patch invalid: the valid frames see 7 positions
    padded = sample(model, conds, noise, SamplerConfig(steps=3), latent_mask=mask)
    alone = sample(model, conds, noise[:, : 7 * LP], SamplerConfig(steps=3))
    torch.testing.assert_close(padded[:, : 7 * LP], alone, atol=1e-5, rtol=1e-5)
