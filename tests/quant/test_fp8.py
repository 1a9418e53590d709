"""W8A8 FP8 linears (engine/quant/fp8.py): the quantisation math, the emulated layer, fusion, the
model swap on the fast path, the preset field and its refusals; `_scaled_mm` and a graphed line on
a GPU with FP8 tensor cores (skipped elsewhere, with the reason)."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.engine.fast import FastDiT, FastSampler
from irodori_speaker.engine.fusing import SliceOf
from irodori_speaker.engine.hardware import presets
from irodori_speaker.engine.hardware.presets import AUDIO_FLAGS, Preset, check_fp8, select_preset
from irodori_speaker.engine.model import rope_tables
from irodori_speaker.engine.quant import fp8
from irodori_speaker.engine.quant.fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    Fp8Linear,
    dequantize_fp8,
    fp8_gemm_device,
    quantize_act_fp8,
    quantize_linears_fp8,
    quantize_weight_fp8,
)
from irodori_speaker.engine.quant.quantize import RELEASE_SELECTION, plan_layers
from irodori_speaker.engine.sampler import SamplerConfig, sample
from irodori_speaker.errors import BackendError, QuantError

FIRST = slice(0, 1)
# e4m3: 3 mantissa bits, so rounding a normal number moves it by at most 2^-4 of itself; below
# 2^-6 (subnormal) the spacing is 2^-9, half of it 2^-10 (both in units of the scale)
REL_STEP, SUB_HALF_STEP = 2.0**-4, 2.0**-10


def load_kind(dit_fixtures, kind):
    """(model, io tensors) of one golden fixture kind (tests/data/dit)."""
    model = load_checkpoint(dit_fixtures / f"tiny_{kind}.safetensors").model
    return model, load_file(str(dit_fixtures / f"tiny_{kind}_io.safetensors"))


def encode(model, io, rows=slice(None)):
    keys = ("text_input_ids", "text_mask", "ref_latent", "ref_mask", "caption_input_ids", "caption_mask")
    return model.encode_conditions(*(io[k][rows] if k in io else None for k in keys))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


# ---- the quantisation math -------------------------------------------------------------------------


def test_weight_scales_are_amax_over_448_per_output_channel():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 64, generator=g) * torch.logspace(-3, 1, 24)[:, None]  # rows of very different size
    q, scale = quantize_weight_fp8(w)
    assert q.dtype == FP8_DTYPE and q.shape == w.shape and q.is_contiguous()
    assert scale.dtype == torch.float32 and scale.shape == (24,)
    torch.testing.assert_close(scale, w.abs().amax(dim=1) / 448.0)
    # every row's largest weight lands on the largest e4m3 code, exactly
    assert torch.equal(q.float().abs().amax(dim=1), torch.full((24,), FP8_MAX))
    assert FP8_MAX == 448.0
    err = (dequantize_fp8(q, scale) - w).abs()
    bound = torch.maximum(w.abs() * REL_STEP, scale[:, None] * SUB_HALF_STEP) * (1 + 1e-6)
    assert bool((err <= bound).all())


def test_e4m3_values_survive_the_round_trip_and_the_range_is_clamped():
    codes = torch.arange(256, dtype=torch.uint8).view(FP8_DTYPE).float()
    finite = codes[torch.isfinite(codes)]
    row = torch.cat([finite, finite.new_zeros(1)])[None, :]
    q, scale = quantize_weight_fp8(row)  # amax 448: scale 1, every e4m3 value is its own code
    assert float(scale) == 1.0 and torch.equal(q.float(), row)
    x = torch.tensor([[1.0, -3.0e9, 2.0]])  # one huge value: clamped to +-448 codes, never inf/nan
    qa, _ = quantize_act_fp8(x)
    assert bool(torch.isfinite(qa.float()).all()) and float(qa.float().abs().max()) == FP8_MAX


def test_zeros_quantise_to_zeros_and_give_zero_outputs():
    q, scale = quantize_weight_fp8(torch.zeros(16, 32))
    assert not bool(q.float().any()) and bool((scale > 0).all())  # a tiny scale, never 0 / 0
    x = torch.zeros(3, 32)
    x[1] = torch.linspace(-1, 1, 32)
    qa, _ = quantize_act_fp8(x)
    assert not bool(qa[0].float().any()) and not bool(qa[2].float().any())
    layer = Fp8Linear.from_linear(nn.Linear(32, 16, bias=False))
    y = layer(x)
    assert not bool(y[0].any()) and not bool(y[2].any()) and bool(y[1].any())


def test_activations_per_token_and_per_tensor():
    x = torch.randn(5, 48) * torch.tensor([1e-3, 1.0, 30.0, 0.1, 5.0])[:, None]
    q, s = quantize_act_fp8(x, "token")
    assert s.shape == (5, 1) and s.dtype == torch.float32
    torch.testing.assert_close(s[:, 0], x.abs().amax(dim=1) / 448.0)
    # per token, the small rows keep their relative precision
    assert _rel(dequantize_fp8(q, s)[0], x[0]) < REL_STEP
    qt, st = quantize_act_fp8(x, "tensor")
    assert st.shape == (5, 1) and st.is_contiguous() and s.is_contiguous() and bool((st == st[0]).all())
    torch.testing.assert_close(st[0, 0], x.abs().max() / 448.0)
    # per tensor, the 1e-3 row sits far below the scale: coarser than per token
    assert _rel(dequantize_fp8(qt, st)[0], x[0]) > _rel(dequantize_fp8(q, s)[0], x[0])
    with pytest.raises(QuantError, match="activation scaling"):
        quantize_act_fp8(x, "channel")


# ---- the layer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("scaling", ["token", "tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_emulated_layer_is_the_fp8_arithmetic(scaling, dtype):
    """Emulation = dequantised e4m3 operands multiplied in float64 (then rounded to the input's
    dtype); against the float layer the error is that of 8-bit floats (a few percent)."""
    torch.manual_seed(1)
    lin = nn.Linear(96, 80, bias=True).to(dtype)
    layer = Fp8Linear.from_linear(lin, act_scaling=scaling).to(dtype)
    x = torch.randn(2, 9, 96).to(dtype)
    with torch.no_grad():
        y = layer(x)
        qa, sa = quantize_act_fp8(x.reshape(-1, 96), scaling)
        ref = dequantize_fp8(qa, sa).double() @ layer.dequantize_weight().double().t() + lin.bias.double()
        assert y.dtype == dtype and y.shape == (2, 9, 80)
        tol = 1e-6 if dtype == torch.float32 else 2.0**-8
        assert _rel(y.reshape(-1, 80), ref) < tol
        assert 1e-3 < _rel(y, lin(x)) < 0.06


def test_the_layer_keeps_its_fp8_weight_and_fp32_scales_under_to():
    layer = Fp8Linear.from_linear(nn.Linear(32, 16)).to(torch.bfloat16)
    assert layer.qweight.dtype == FP8_DTYPE and layer.scale_b.dtype == torch.float32
    assert layer.bias is not None and layer.bias.dtype == torch.bfloat16
    assert layer.scale_b.shape == (1, 16)  # _scaled_mm's (1, N) operand, made once


def test_bad_layers_and_inputs_are_refused():
    with pytest.raises(QuantError, match="2-d"):
        Fp8Linear(torch.zeros(4, 4), torch.ones(4))
    with pytest.raises(QuantError, match="scales"):
        Fp8Linear(torch.zeros(4, 4).to(FP8_DTYPE), torch.ones(3))
    layer = Fp8Linear.from_linear(nn.Linear(32, 16))
    with pytest.raises(QuantError, match="expected 32"):
        layer(torch.zeros(2, 31))


def _scaled_mm_on_cpu() -> bool:
    try:
        a = torch.zeros(16, 16).to(FP8_DTYPE)
        torch._scaled_mm(
            a, a.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16
        )
    except (RuntimeError, NotImplementedError):
        return False
    return True


@pytest.mark.skipif(not _scaled_mm_on_cpu(), reason="this torch build has no CPU torch._scaled_mm")
def test_the_scaled_mm_call_equals_the_emulation_on_the_cpu():
    """The very call the GPU makes (row-wise scales (M, 1) / (1, N), the weight's transpose as the
    column-major operand, bf16 out), run by torch's CPU kernel: the emulation within bf16."""
    torch.manual_seed(2)
    layer = Fp8Linear.from_linear(nn.Linear(64, 48, bias=False))
    x = torch.randn(7, 64)
    layer.impl = "emulate"
    ref = layer(x)
    layer.impl = "scaled_mm"
    got = layer(x)
    assert layer._scaled_mm_ok and _rel(got, ref) < 2.0**-8


def test_auto_picks_the_emulation_without_fp8_tensor_cores():
    layer = Fp8Linear.from_linear(nn.Linear(32, 16))
    assert not fp8_gemm_device("cpu") and not layer.uses_scaled_mm(torch.device("cpu"))
    odd = Fp8Linear.from_linear(nn.Linear(24, 16))  # 24 inputs: not a _scaled_mm shape, even if forced
    odd.impl = "scaled_mm"
    assert not odd.uses_scaled_mm(torch.device("cpu"))


def test_concat_computes_the_layers_side_by_side():
    torch.manual_seed(3)
    parts = [Fp8Linear.from_linear(nn.Linear(64, n, bias=False)) for n in (32, 16, 48)]
    fused = Fp8Linear.concat(parts)
    assert fused.out_features == 96 and fused.in_features == 64
    x = torch.randn(3, 5, 64)
    torch.testing.assert_close(fused(x), torch.cat([p(x) for p in parts], dim=-1), rtol=1e-6, atol=1e-6)
    with pytest.raises(QuantError, match="in_features"):
        Fp8Linear.concat([parts[0], Fp8Linear.from_linear(nn.Linear(32, 16))])
    with pytest.raises(QuantError, match="bias"):
        Fp8Linear.concat([parts[0], Fp8Linear.from_linear(nn.Linear(64, 16))])


# ---- the model swap and the fast path -------------------------------------------------------------------


def test_the_swap_takes_the_int4_selection(dit_fixtures):
    model, _ = load_kind(dit_fixtures, "v2_base")
    shapes = {n: tuple(m.weight.shape) for n, m in model.named_modules() if type(m) is nn.Linear}
    selected = plan_layers(shapes, RELEASE_SELECTION, group_size=8).gptq
    aligned = [n for n in selected if shapes[n][0] % 16 == 0 and shapes[n][1] % 16 == 0]
    assert 0 < len(aligned) < len(selected)  # the tiny model's MLP is 184 wide: not a _scaled_mm shape
    swap = quantize_linears_fp8(copy.deepcopy(model))
    assert sorted(swap.swapped) == sorted(aligned)
    assert "blocks.0.mlp.w2" in swap.kept and "must be multiples of 16" in swap.kept["blocks.0.mlp.w2"]
    swap = quantize_linears_fp8(model, align=8)  # emulated on the CPU: any width will do
    assert sorted(swap.swapped) == sorted(selected) and swap.kept == {}
    assert isinstance(model.blocks[0].attention.wq, Fp8Linear)
    assert isinstance(model.blocks[0].mlp.w2, Fp8Linear)
    assert type(model.in_proj) is nn.Linear and type(model.out_proj) is nn.Linear  # not in the selection
    assert quantize_linears_fp8(model).swapped == []  # a second call: a no-op
    with pytest.raises(QuantError, match="activation scaling"):
        quantize_linears_fp8(model, act_scaling="row")


@pytest.mark.parametrize("kind", ["v2_base", "v3_voicedesign"])
def test_the_fused_fast_path_equals_the_eager_path_on_an_fp8_model(dit_fixtures, kind):
    """Fused FP8 projections (one e4m3 GEMM through Fp8Linear.concat) give the separate fp8 layers'
    velocity; the originals become slices of the fused layer. Over a whole line the two paths agree
    within FP8's own error only: the fast path's precomputed modulation differs from the eager one
    in the last fp32 bits (6e-7 on the float model), enough to move an activation across an e4m3
    rounding boundary now and then, and the ODE carries such a flip on."""
    model, io = load_kind(dit_fixtures, kind)
    conds = encode(model, io, FIRST)
    noise = io["sample_sway8_noise"]
    cfg = SamplerConfig(steps=8, schedule="sway")
    float_out = sample(model, conds, noise, cfg)
    quantize_linears_fp8(model, align=8)
    conds = encode(model, io, FIRST)
    ref_v = model.velocity(io["x_t"][:1], io["t"][:1], conds, io["latent_mask"][:1])
    fast = FastDiT(model, fused=True)
    assert isinstance(fast.blocks[0].qkvg, Fp8Linear) and isinstance(fast.blocks[0].w13, Fp8Linear)
    assert isinstance(model.blocks[0].attention.wq, SliceOf)
    ctx = model.context_kv(conds)
    mask = model.attention_mask(ctx, 24, io["latent_mask"][:1])
    table = fast.modulation_table([float(io["t"][0])])
    got_v = fast.velocity(io["x_t"][:1], table[0], ctx, mask, rope_tables(24, model.cfg.head_dim, "cpu"))
    torch.testing.assert_close(got_v, ref_v, atol=1e-5, rtol=1e-5)
    ref = sample(model, conds, noise, cfg)
    err_fp8 = _rel(ref, float_out)
    assert 0 < err_fp8 < 0.1  # FP8 moves the line by an 8-bit float's rounding, not more
    got = FastSampler(fast, use_graphs=False).sample(conds, noise, cfg)
    assert _rel(got, ref) <= err_fp8


# ---- the preset field, the refusals, the cache key, the command line -------------------------------------


def test_fp8_is_an_audio_flag_and_off_by_default():
    assert "fp8" in AUDIO_FLAGS
    for name in ("cpu", "cuda", "mps"):
        assert presets.base_preset(name).fp8 is False  # opt-in only (issue 27: where it measures faster)
    assert Preset("x", "cuda", fp8=True).audio_flags() == ["fp8"]
    assert presets.FP8_MIN_CAPABILITY == fp8.FP8_MIN_CAPABILITY


def test_fp8_is_refused_where_there_are_no_fp8_tensor_cores(monkeypatch):
    with pytest.raises(BackendError, match="FP8 tensor cores") as e:
        select_preset("cpu", fp8=True)
    assert e.value.hint and "\n" not in str(e.value)
    with pytest.raises(BackendError, match="fp8 and int4"):
        select_preset("cpu", fp8=True, int4=True)
    # an Ampere GPU (8.6) and an H200 (9.0): faked, as this machine has no GPU
    monkeypatch.setattr(presets, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 6))
    with pytest.raises(BackendError, match=r"compute capability 8\.6"):
        check_fp8(Preset("cuda", "cuda", fp8=True))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_fp8(Preset("cuda", "cuda", fp8=True))
    with pytest.raises(BackendError, match="fp8 and int4"):
        check_fp8(Preset("cuda", "cuda", fp8=True, int4=True))
    with pytest.raises(BackendError, match="mps"):
        check_fp8(Preset("mps", "mps", fp8=True))


def test_load_synthesizer_refuses_fp8_before_loading(tmp_path, monkeypatch):
    """preset={"fp8": True} (what Speaker(preset=...) and --fp8 pass) and a whole Preset alike."""
    from irodori_speaker.synthesis.loading import load_synthesizer

    monkeypatch.setenv("IRODORI_CACHE", str(tmp_path))
    with pytest.raises(BackendError, match="FP8 tensor cores"):
        load_synthesizer(tiny_random=True, backend="cpu", preset={"fp8": True})
    with pytest.raises(BackendError, match="FP8 tensor cores"):
        load_synthesizer(tiny_random=True, fp8=True, backend="cpu")
    with pytest.raises(BackendError, match="FP8 tensor cores"):
        load_synthesizer(tiny_random=True, preset=dataclasses.replace(select_preset("cpu"), fp8=True))
    assert not (tmp_path / "tiny").exists() or True  # nothing to check on disk: the error came first


@pytest.fixture
def fp8_allowed_here(monkeypatch):
    """The device check passed as on an FP8 GPU (none here): the loader's FP8 path runs, emulated."""
    from irodori_speaker.synthesis import loading

    monkeypatch.setattr(presets, "check_fp8", lambda preset: None)
    monkeypatch.setattr(loading, "check_fp8", lambda preset: None)


def test_the_loader_swaps_the_linears_with_fp8(tmp_path, monkeypatch, fp8_allowed_here):
    from irodori_speaker.synthesis.loading import load_synthesizer

    monkeypatch.setenv("IRODORI_CACHE", str(tmp_path))
    plain = load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False)
    synth = load_synthesizer(tiny_random=True, backend="cpu", fp8=True, voice_cache_dir=False)
    assert synth.preset.fp8 and isinstance(synth.model.blocks[0].attention.wq, Fp8Linear)
    assert not any(isinstance(m, Fp8Linear) for m in plain.model.modules())
    *head, last = plain.identity["precision"]
    assert last == "codec_channels_last"  # the CPU preset's; flags in AUDIO_FLAGS' order
    assert synth.identity["precision"] == [*head, "fp8", last]
    a = synth.synthesize("テストです。", options={"seed": 1}).audio
    b = plain.synthesize("テストです。", options={"seed": 1}).audio
    assert (
        len(a) > 0
        and bool(torch.isfinite(torch.as_tensor(a)).all())
        and not torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    )


def test_an_int4_file_with_fp8_is_refused(tmp_path, dit_fixtures, fp8_allowed_here):
    from irodori_speaker.engine.quant.quantize import quantize_checkpoint
    from irodori_speaker.synthesis.loading import load_dit

    dst = tmp_path / "int4.safetensors"
    quantize_checkpoint(dit_fixtures / "tiny_v2_base.safetensors", dst, method="rtn", report_errors=False)
    with pytest.raises(BackendError, match="int4 weights") as e:
        load_dit(dst, dataclasses.replace(select_preset("cpu"), fp8=True))
    assert e.value.hint


def test_fp8_enters_the_phrase_cache_key(synth):
    *head, last = synth.identity["precision"]
    assert last == "codec_channels_last"  # the CPU preset's; flags in AUDIO_FLAGS' order
    real = synth.preset
    try:
        synth.preset = dataclasses.replace(real, fp8=True)
        assert synth.identity["precision"] == [*head, "fp8", last]
    finally:
        synth.preset = real


@pytest.mark.parametrize(
    "argv",
    [["say", "テスト", "--output", "a.wav"], ["bench", "--json", "b.json"], ["serve", "--port", "38977"]],
    ids=["say", "bench", "serve"],
)
def test_the_fp8_flag_reaches_the_preset_and_is_refused_on_the_cpu_in_one_line(tmp_path, argv):
    """--fp8 on say / bench / serve (a real CLI process): refused before any model loads, the
    server before it binds its port."""
    env = dict(os.environ, IRODORI_CACHE=str(tmp_path), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    # --backend cpu: refused on every machine, the H200 of the GPU run included
    cmd = [sys.executable, "-m", "irodori_speaker.cli", *argv, "--tiny-random", "--backend", "cpu", "--fp8"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("error: fp8 needs FP8 tensor cores") and lines[1].startswith("hint: ")
    assert (
        "Traceback" not in r.stderr
        and not (tmp_path / "a.wav").exists()
        and not (tmp_path / "b.json").exists()
    )


# ---- on a GPU with FP8 tensor cores ---------------------------------------------------------------------

_NO_FP8_GPU = "needs an NVIDIA GPU with FP8 tensor cores (compute capability 8.9+)"
needs_fp8_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or not fp8_gemm_device("cuda"), reason=_NO_FP8_GPU
)


@needs_fp8_gpu
@pytest.mark.parametrize(("k", "n"), [(1280, 5120), (1280, 1280), (3680, 1280), (1280, 7360)])
@pytest.mark.parametrize("m", [1, 25, 150, 750])
@pytest.mark.parametrize("scaling", ["token", "tensor"])
def test_scaled_mm_equals_the_emulation_on_the_gpu(k, n, m, scaling):
    torch.manual_seed(k + n + m)
    lin = nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = Fp8Linear.from_linear(lin, act_scaling=scaling)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    assert layer.uses_scaled_mm(x.device)
    got = layer(x)
    assert layer._scaled_mm_ok, "torch._scaled_mm failed and the layer fell back"
    layer.impl = "emulate"
    ref = layer(x)
    assert got.dtype == torch.bfloat16 and _rel(got, ref.float()) < 2.0**-7


@needs_fp8_gpu
def test_a_graphed_fast_sampler_line_on_an_fp8_model(dit_fixtures):
    """The whole line under CUDA graphs (fused Triton blocks around fused FP8 GEMMs) equals the
    same fp8 model's eager line (emulated GEMMs) within bf16's error."""
    model, io = load_kind(dit_fixtures, "v3_base")
    model = model.to("cuda", torch.bfloat16)
    quantize_linears_fp8(model)
    io = {k: v.to("cuda") for k, v in io.items()}
    conds = encode(model, io, FIRST)
    noise = io["sample_sway8_noise"]
    cfg = SamplerConfig(steps=8, schedule="sway")
    eager = FastSampler(FastDiT(model, fused=False), use_graphs=False)
    for m in model.modules():
        if isinstance(m, Fp8Linear):
            m.impl = "emulate"
    ref = eager.sample(conds, noise, cfg)
    for m in model.modules():
        if isinstance(m, Fp8Linear):
            m.impl = "auto"
    graphed = FastSampler(FastDiT(model, fused=True), use_graphs=True)
    out = graphed.sample(conds, noise, cfg)
    again = graphed.sample(conds, noise, cfg)
    assert graphed.captures == 1 and torch.equal(out, again)
    assert isinstance(graphed.fast.blocks[0].qkvg, Fp8Linear) and graphed.fast.blocks[0].qkvg._scaled_mm_ok
    assert _rel(out, ref) < 0.1  # two FP8 paths agree within FP8's own error (see the CPU twin)


@needs_fp8_gpu
def test_load_synthesizer_with_fp8_speaks_on_the_gpu(tmp_path, monkeypatch):
    """`fp8=True` as users pass it: the loaded DiT holds FP8 layers, a line renders (graphs on),
    and the cache key names fp8."""
    from irodori_speaker.synthesis.loading import load_synthesizer

    monkeypatch.setenv("IRODORI_CACHE", str(tmp_path))
    synth = load_synthesizer(tiny_random="v4.1-mf", backend="cuda", fp8=True, voice_cache_dir=False)
    layers = [m for m in synth.model.modules() if isinstance(m, Fp8Linear)]
    assert layers and synth.preset.fp8 and "fp8" in synth.identity["precision"]
    audio = synth.synthesize("テストです。").audio
    assert len(audio) > 0 and bool(torch.isfinite(torch.as_tensor(audio)).all())
    assert all(m._scaled_mm_ok for m in layers)  # no layer fell back to the emulation
