"""The MPS preset end to end on the tiny-random model (needs an Apple Silicon Mac: skipped here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from irodori_speaker.engine.hardware.presets import mps_available

pytestmark = pytest.mark.skipif(
    not mps_available(), reason="needs an Apple Silicon GPU (MPS); none on the CI or dev machines"
)


@pytest.mark.parametrize("kind", ["v2", "v4.1-mf"])  # v4.1-MF: the ModernBERT backbone and MeanFlow on MPS
def test_mps_preset_matches_the_cpu_within_fp32_tolerance(tmp_path, monkeypatch, kind):
    from irodori_speaker.options import SynthesisOptions
    from irodori_speaker.synthesis.loading import load_synthesizer

    monkeypatch.setenv("IRODORI_CACHE", str(tmp_path))
    mps = load_synthesizer(tiny_random=kind, backend="mps", voice_cache_dir=False)
    cpu = load_synthesizer(tiny_random=kind, backend="cpu", voice_cache_dir=False)
    assert mps.preset.dtype == torch.float32 and mps.preset.steps == 8 and mps.preset.schedule == "sway"
    assert mps.prewarm() > 0
    opts = SynthesisOptions(seed=5, seconds=2.0, tail_trim=False)
    a = mps.synthesize("エムピーエスで話します。", options=opts).audio
    b = cpu.synthesize("エムピーエスで話します。", options=opts).audio
    assert len(a) == len(b) == 96_000
    np.testing.assert_allclose(a, b, atol=1e-3)  # same seed, same noise (drawn on the CPU), fp32 both
    streamed = np.concatenate(list(mps.stream("エムピーエスで話します。", options=opts)))
    np.testing.assert_allclose(streamed, a, atol=1e-4)
