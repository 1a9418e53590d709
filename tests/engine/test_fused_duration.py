"""The duration predictor's fused forward (engine/fast_duration.py) against the reference's golden
log frames and the eager forward, and the fast path's use of it.

Runs natively on CUDA; on the CPU `test_fused_interp.py` runs this module under
TRITON_INTERPRET=1 in its subprocess. Without either, every test here skips.
"""

from __future__ import annotations

from dataclasses import fields, replace

import dit_cases
import pytest
import torch
import v4_cases

from irodori_speaker.engine import fused as fu
from irodori_speaker.engine.fast import FastDiT, FastSampler
from irodori_speaker.engine.fast_duration import FastDurationPredictor, fast_duration_predictor

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not fu.fused_available(DEV), reason="needs CUDA + triton, or TRITON_INTERPRET=1 (test_fused_interp.py)"
)
GOLDEN = dict(atol=1e-4, rtol=1e-4)
# log1p of a sum of frames: the kernels round once where eager rounds after each op
TOL = {torch.float32: GOLDEN, torch.bfloat16: dict(atol=3e-2, rtol=1e-2)}
# the predictor's kinds: v3 (speaker only), v3-VoiceDesign, v4 and v4.1-MF (speaker and caption)
KINDS = ["v3_base", "v3_voicedesign", "v4", "v4_1_mf"]


def _load(dit_fixtures, kind, dtype=torch.float32):
    """(model on DEV, its conditions of the fixture's rows, has_speaker, has_caption, golden)."""
    if kind.startswith("v3"):
        model, io, _ = dit_cases.load_kind(dit_fixtures, kind)
        encode = dit_cases.encode
    else:
        model, io, _, _ = v4_cases.load_kind(kind)
        encode = v4_cases.encode
    model = model.to(DEV, dtype)
    io = {k: (v.to(DEV, dtype) if v.is_floating_point() else v.to(DEV)) for k, v in io.items()}
    with torch.inference_mode():
        conds = encode(model, io)
    return (
        model,
        conds,
        io["duration_has_speaker"],
        io.get("duration_has_caption"),
        io["out_duration_log_frames"],
    )


def _take(t: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t[rows]


def _watched(fast: FastDurationPredictor) -> list[int]:
    """Calls of `fast`'s fused forward, recorded (a fall-back to the eager one records none)."""
    calls: list[int] = []
    fused = fast._fused
    fast._fused = lambda *a: calls.append(1) or fused(*a)  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("kind", KINDS)
def test_the_fused_predictor_gives_the_reference_log_frames(dit_fixtures, kind):
    """The tiny predictors (2 blocks, with and without a caption's modulation; one row with a
    reference and caption, one without) against the reference's stored log frames; the eager
    forward, its layers now fused side by side (views), gives them too."""
    model, conds, has_speaker, has_caption, golden = _load(dit_fixtures, kind)
    fast = fast_duration_predictor(model)
    assert isinstance(fast, FastDurationPredictor)
    assert (fast.caption_modulation is not None) == (kind != "v3_base")
    calls = _watched(fast)
    with torch.inference_mode():
        got = model.predict_log_frames(conds, has_speaker, has_caption, body=fast)
        eager = model.predict_log_frames(conds, has_speaker, has_caption)
    assert calls and fast.on  # the kernels ran, no fall-back
    torch.testing.assert_close(got, golden, **GOLDEN)
    torch.testing.assert_close(eager, golden, **GOLDEN)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["v3_base", "v4_1_mf"])
def test_the_fast_sampler_predicts_through_it(dit_fixtures, kind, dtype):
    """`FastSampler.predict_log_frames` (the encoders' path) takes the fused predictor: the eager
    model's log frames up to rounding, for a row with a reference, one without, and one with no
    valid token (zeroed, token 0 counted, as eager)."""
    model, conds, has_speaker, _, _ = _load(dit_fixtures, kind, dtype)
    rows = torch.tensor([0, 1, 0], device=DEV)  # the fixture's two rows, the first again ...
    conds = replace(conds, **{f.name: _take(getattr(conds, f.name), rows) for f in fields(conds)})
    conds.text_mask[2] = False  # ... with no valid token
    has = has_speaker[rows]
    fast = FastDiT(model, fused=True)
    assert isinstance(fast.duration, FastDurationPredictor)
    calls = _watched(fast.duration)
    with torch.inference_mode():
        got = FastSampler(fast, use_graphs=False).predict_log_frames(conds, has)
        want = model.predict_log_frames(conds, has)
    assert calls and fast.duration.on
    assert got.shape == (3,) and torch.isfinite(got).all()
    torch.testing.assert_close(got, want, **TOL[dtype])


def test_no_fused_predictor_without_one_or_for_rtn_packed_layers(dit_fixtures, tmp_path):
    """v2 has no predictor; an int4 file's RTN-packed predictor layers (the compact selection) do
    not fuse: the fast path keeps the model's own forward, which still predicts."""
    from irodori_speaker.engine.quant.checkpoint import load_int4_model
    from irodori_speaker.engine.quant.quantize import quantize_checkpoint

    v2, _, _ = dit_cases.load_kind(dit_fixtures, "v2_base")
    assert fast_duration_predictor(v2) is None
    dst = tmp_path / "int4.safetensors"
    quantize_checkpoint(dit_fixtures / "tiny_v3_base.safetensors", dst, method="rtn", report_errors=False)
    model = load_int4_model(dst, dtype="fp32", device=DEV).model
    fast = FastDiT(model, fused=True)
    assert fast.duration is None
    _, io, _ = dit_cases.load_kind(dit_fixtures, "v3_base")
    io = {k: v.to(DEV) for k, v in io.items()}
    with torch.inference_mode():
        conds = dit_cases.encode(model, io)
        got = FastSampler(fast, use_graphs=False).predict_log_frames(conds, io["duration_has_speaker"])
    torch.testing.assert_close(got, io["out_duration_log_frames"], atol=0.2, rtol=0.1)  # int4's error
