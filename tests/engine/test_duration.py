"""Frames from seconds and from the v3 predictor, and their clamps."""

from __future__ import annotations

import math

import pytest
import torch

from irodori_speaker.engine.duration import check_seconds, frames_for_seconds, frames_from_prediction
from irodori_speaker.errors import InputError


@pytest.mark.parametrize(("seconds", "frames"), [(1.0, 25), (0.5, 13), (0.1, 13), (2.01, 51), (30.0, 750)])
def test_frames_for_seconds(seconds, frames):
    assert frames_for_seconds(seconds) == frames == math.ceil(int(min(max(seconds, 0.5), 30) * 48000) / 1920)


def test_over_thirty_seconds_is_clamped_with_a_warning():
    warnings: list[str] = []
    assert frames_for_seconds(45.0, warnings) == 750
    assert warnings and "clamped to 30" in warnings[0]


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "long", None])
def test_bad_seconds(bad):
    with pytest.raises(InputError, match="seconds"):
        check_seconds(bad)


def test_frames_from_prediction_rounds_scales_and_clamps():
    pred = torch.log1p(torch.tensor([100.4, 100.6, 2.0, 5000.0]))
    assert frames_from_prediction(pred) == [100, 101, 13, 750]
    assert frames_from_prediction(pred, duration_scale=1.5)[:2] == [151, 151]
    # an optional cap for short prompts (v3 over-predicts them)
    assert frames_from_prediction(pred, max_frames=60) == [60, 60, 13, 60]
    with pytest.raises(InputError, match="duration_scale"):
        frames_from_prediction(pred, duration_scale=0.0)
