"""The fused DiT-block kernels (engine/fused.py) against their torch twins (kernel_twins.py) and the model.

Runs natively on CUDA; on the CPU `test_fused_interp.py` runs this module again in a subprocess
with TRITON_INTERPRET=1 (Triton picks interpretation when a kernel is defined, so the variable has
to be set before import). Without either, every test here skips.
"""

from __future__ import annotations

import kernel_twins as twins
import pytest
import torch
from dit_cases import KINDS, case_settings, encode, load_kind

from irodori_speaker.engine import fused as fu
from irodori_speaker.engine.codec import kernels as ck
from irodori_speaker.engine.fast import FastDiT, FastSampler
from irodori_speaker.engine.model import rope_tables
from irodori_speaker.engine.sampler import SamplerConfig

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not fu.fused_available(DEV), reason="needs CUDA + triton, or TRITON_INTERPRET=1 (test_fused_interp.py)"
)
# fp32: one rounding order against another; bf16: the fused kernels round once where the twins
# round after each op, so they may differ by an ulp or two of bf16
TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),  # an ulp where tl.sin and torch.sin round apart
    torch.bfloat16: dict(atol=6e-2, rtol=3e-2),
}
DTYPES = [torch.float32, torch.bfloat16]


def _close(a, b, dtype):
    torch.testing.assert_close(a.float(), b.float(), **TOL[dtype])


def _randn(*shape, dtype):
    return torch.randn(*shape, device=DEV).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [True, False])
def test_add_rms_modulate(dtype, residual):
    torch.manual_seed(0)
    D = 80  # not a power of two: the row block is masked
    x = _randn(2, 3, D, dtype=dtype)
    y, gate = (_randn(2, 3, D, dtype=dtype), _randn(D, dtype=dtype)) if residual else (None, None)
    scale1, shift = _randn(D, dtype=dtype), (_randn(D, dtype=dtype) if residual else None)
    got = fu.add_rms_modulate(x, y, gate, scale1, shift, 1e-5)
    want = twins.add_rms_modulate(x, y, gate, scale1, shift, 1e-5)
    for a, b in zip(got, want):
        _close(a, b, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_modulate_per_row(dtype):
    """The step batcher's rows at their own timesteps: gate, scale and shift (B, 1, D) per batch
    row, taken as strided views of one (6, B, 1, D) table, and mixed with a shared (D,) scale."""
    torch.manual_seed(2)
    B, S, D = 3, 5, 80
    x, y = _randn(B, S, D, dtype=dtype), _randn(B, S, D, dtype=dtype)
    gate, scale1, shift = _randn(3, B, 1, D, dtype=dtype).unbind(0)
    got = fu.add_rms_modulate(x, y, gate, scale1, shift, 1e-5)
    want = twins.add_rms_modulate(x, y, gate, scale1, shift, 1e-5)
    for a, b in zip(got, want):
        _close(a, b, dtype)
    shared = _randn(D, dtype=dtype)  # the final norm: a per-row gate, a shared weight, no shift
    got = fu.add_rms_modulate(x, y, gate, shared, None, 1e-5)
    want = twins.add_rms_modulate(x, y, gate, shared, None, 1e-5)
    for a, b in zip(got, want):
        _close(a, b, dtype)
    for b in range(B):  # and each row as it would run alone
        alone = fu.add_rms_modulate(x[b : b + 1], y[b : b + 1], gate[b, 0], scale1[b, 0], shift[b, 0], 1e-5)
        _close(got[0][b], alone[0][0], dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qkv_joint(dtype):
    torch.manual_seed(1)
    B, S, L, H, Dh = 2, 5, 7, 5, 16  # odd heads (RoPE on the first 2), masked head block
    p = _randn(B, S, 4 * H * Dh, dtype=dtype)
    qn, kn = _randn(H, Dh, dtype=dtype), _randn(H, Dh, dtype=dtype)
    cos, sin = rope_tables(S, Dh, DEV)
    ctx_k = _randn(B, L, H, Dh, dtype=dtype).transpose(1, 2)  # strided, as context_kv makes them
    ctx_v = _randn(B, H, L, Dh, dtype=dtype)
    got = fu.qkv_joint(p, qn, kn, cos, sin, ctx_k, ctx_v, H, 1e-5)
    want = twins.qkv_joint(p, qn, kn, cos, sin, ctx_k, ctx_v, H, 1e-5)
    for a, b in zip(got, want):
        assert a.shape == b.shape
        _close(a, b, dtype)
    assert torch.equal(got[1][:, :, S:], ctx_k) and torch.equal(got[2][:, :, S:], ctx_v)


@pytest.mark.parametrize("dtype", DTYPES)
def test_qkv_joint_reads_each_rows_context_through_a_row_table(dtype):
    torch.manual_seed(3)
    B, S, slots, L, H, Dh = 3, 4, 5, 6, 4, 16
    p = _randn(B, S, 4 * H * Dh, dtype=dtype)
    qn, kn = _randn(H, Dh, dtype=dtype), _randn(H, Dh, dtype=dtype)
    cos, sin = rope_tables(S, Dh, DEV)
    pool_k = _randn(slots, H, L + 3, Dh, dtype=dtype)[:, :, :L]  # a pool longer than the step reads
    pool_v = _randn(slots, H, L + 3, Dh, dtype=dtype)[:, :, :L]
    rows = torch.tensor([4, 0, 4], device=DEV)  # any slots, one of them twice
    got = fu.qkv_joint(p, qn, kn, cos, sin, pool_k, pool_v, H, 1e-5, ctx_rows=rows)
    want = fu.qkv_joint(p, qn, kn, cos, sin, pool_k[rows], pool_v[rows], H, 1e-5)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert torch.equal(got[1][:, :, S:], pool_k[rows])


@pytest.mark.parametrize("dtype", DTYPES)
def test_gate_heads_and_swiglu(dtype):
    torch.manual_seed(2)
    B, S, H, Dh = 2, 3, 5, 16
    o = _randn(B, S, H, Dh, dtype=dtype).transpose(1, 2)  # the layout SDPA returns
    p = _randn(B, S, 4 * H * Dh, dtype=dtype)
    _close(fu.gate_heads(o, p), twins.gate_heads(o, p), dtype)
    u = _randn(B, S, 2 * 1100, dtype=dtype)  # hidden over one block, not a multiple of it
    _close(fu.swiglu(u, 1100), twins.swiglu(u, 1100), dtype)


@pytest.mark.parametrize("kind", KINDS)
def test_fused_velocity_equals_reference(dit_fixtures, kind):
    model, io, _ = load_kind(dit_fixtures, kind)
    model = model.to(DEV)
    io = {k: v.to(DEV) for k, v in io.items()}
    conds = encode(model, io, slice(0, 1))
    ctx = model.context_kv(conds)
    mask = model.attention_mask(ctx, 24, io["latent_mask"][:1])
    t = float(io["t"][0])
    ref = model.velocity(io["x_t"][:1], io["t"][:1], conds, io["latent_mask"][:1])
    fast = FastDiT(model, fused=True)
    table = fast.modulation_table([t])
    got = fast.velocity(io["x_t"][:1], table[0], ctx, mask, rope_tables(24, model.cfg.head_dim, DEV))
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_fused_velocity_on_an_int4_model(dit_fixtures, tmp_path):
    """The kernels around fused int4 projections (Int4Linear.concat) give the int4 model's velocity."""
    from irodori_speaker.engine.quant.checkpoint import load_int4_model
    from irodori_speaker.engine.quant.layers import Int4Linear
    from irodori_speaker.engine.quant.quantize import quantize_checkpoint

    dst = tmp_path / "int4.safetensors"
    quantize_checkpoint(dit_fixtures / "tiny_v3_base.safetensors", dst, method="rtn", report_errors=False)
    model = load_int4_model(dst, dtype="fp32", device=DEV).model
    _, io, _ = load_kind(dit_fixtures, "v3_base")
    io = {k: v.to(DEV) for k, v in io.items()}
    conds = encode(model, io, slice(0, 1))
    ctx = model.context_kv(conds)
    mask = model.attention_mask(ctx, 24, io["latent_mask"][:1])
    ref = model.velocity(io["x_t"][:1], io["t"][:1], conds, io["latent_mask"][:1])
    fast = FastDiT(model, fused=True)
    assert isinstance(fast.blocks[0].qkvg, Int4Linear)
    assert fast.text_backbone is None  # its text encoder's RTN-packed layers do not fuse: eager
    table = fast.modulation_table([float(io["t"][0])])
    got = fast.velocity(io["x_t"][:1], table[0], ctx, mask, rope_tables(24, model.cfg.head_dim, DEV))
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_fused_sampler_matches_a_golden_case(dit_fixtures):
    model, io, cases = load_kind(dit_fixtures, "v3_base")
    model = model.to(DEV)
    io = {k: v.to(DEV) for k, v in io.items()}
    # buckets of 5: every length still padded and masked (24 frames -> 25, the text's 16 tokens ->
    # 20, the reference's 11 positions -> 15), with fewer padded positions to interpret than the
    # defaults' 32 frames and 32 + 32 context (the interpreter's time grows with rows x positions)
    sampler = FastSampler(FastDiT(model, fused=True), use_graphs=False, frame_bucket=5, context_bucket=5)
    assert sampler.fast.fused
    # sway6: sway8's schedule and guidance in 6 steps, still some with CFG (t >= 0.5, three rows)
    # and some without; each step is ~1-3 s in the interpreter (test_sampler.py runs every case)
    name = "sway6"
    out = sampler.sample(
        encode(model, io, slice(0, 1)),
        io[f"sample_{name}_noise"],
        SamplerConfig(**case_settings(cases[name])),
    )
    torch.testing.assert_close(out, io[f"sample_{name}_out"], atol=1e-4, rtol=1e-4)


# the step-batching cases' buckets, a quarter of the defaults (16 frames, 32 context positions) as
# their lines are a quarter of 12 and 20 frames: the interpreter's time grows with rows x positions,
# and every length is still padded, the two lines in two frame buckets
STEP_FRAMES, STEP_CONTEXT = 4, 8


def _step_batch_lines(dit_fixtures):
    """(the v3 model's fused fast path, the two lines of the step-batching tests as `sample` arguments)."""
    from irodori_speaker.engine.sampler import draw_noise

    model, io, _ = load_kind(dit_fixtures, "v3_base")
    model = model.to(DEV)
    io = {k: v.to(DEV) for k, v in io.items()}
    # the second line joins at the first line's second step: one shared forward of both (the
    # interpreter is slow, so few steps; the CPU tests in test_steps.py cover longer plans). 3 and 5
    # frames: padded to 4 and 8, so the first line is widened (4 -> 8 frames) when the second joins
    cfgs = [SamplerConfig(steps=2, schedule="sway"), SamplerConfig(steps=1, guidance="alternating")]
    lines_in = [
        (encode(model, io, slice(b, b + 1)), draw_noise(b, 1, 3 + 2 * b, 32, device=DEV), cfgs[b])
        for b in range(2)
    ]
    return FastDiT(model, fused=True), lines_in


@pytest.fixture(scope="module")
def lines_sampled_alone(dit_fixtures):
    """Each line of `_step_batch_lines` sampled alone on the fused path: what both step-batching
    cases must equal, sampled once for both (a fresh model of the same file: ~3 s interpreted)."""
    fast, lines_in = _step_batch_lines(dit_fixtures)
    alone = FastSampler(fast, use_graphs=False, frame_bucket=STEP_FRAMES, context_bucket=STEP_CONTEXT)
    return [alone.sample(*args) for args in lines_in]


@pytest.mark.parametrize("buckets", [False, True], ids=["eager", "buckets"])
def test_fused_step_batch_equals_each_line_alone(dit_fixtures, lines_sampled_alone, buckets):
    """Step-level batching (engine/steps.py) on the fused kernels: rows at their own timesteps
    (per-row modulation), lines of two lengths joining at different steps, each equal to its
    line sampled alone on the same fused path; `buckets`: through the step graphs' buffers
    (engine/step_graphs.py: rows filled up to the bucket, frames and context padded; captured
    as CUDA graphs on a GPU)."""
    from irodori_speaker.engine.steps import StepBatcher

    fast, lines_in = _step_batch_lines(dit_fixtures)
    want = lines_sampled_alone
    # one forward for both
    batcher = StepBatcher(
        fast, frame_bucket=STEP_FRAMES, context_bucket=STEP_CONTEXT, max_padding=float("inf")
    )
    if buckets:
        batcher.prewarm_graphs(
            max_rows=8,
            top_frames=2 * STEP_FRAMES,
            length=5 * STEP_CONTEXT,  # longer than the lines' contexts: the graphs read a slice of each slot
            capture=DEV.type == "cuda",
            frame_bucket=STEP_FRAMES,
            length_bucket=2 * STEP_CONTEXT,
        )
    live = [batcher.start(*lines_in[0])]
    batcher.step(live)  # the second line joins one step later
    live.append(batcher.start(*lines_in[1]))
    done, lengths = [], []
    pack = batcher._pack

    def packing(lines, key):  # each step's bucket: its context positions
        packed = pack(lines, key)
        lengths.append(packed.bucket[2] if packed.bucket else None)
        return packed

    batcher._pack = packing
    while live:
        for line in batcher.step(live):
            live.remove(line)
            done.append(line)
    assert batcher.rows_run > batcher.steps_run
    if buckets:
        assert batcher.graphs is not None and batcher.graphs.replays == batcher.steps_run
        assert lengths and all(n is not None and n < batcher.pool.length for n in lengths)
    for line, w in zip(sorted(done, key=lambda d: d.frames), want):
        torch.testing.assert_close(line.latent(), w, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_snake_matches_the_codec_snake(dtype):
    from irodori_speaker.engine.codec import Snake

    torch.manual_seed(3)
    C, T = 6, 3000  # T over one block, not a multiple of it
    module = Snake(C).to(DEV)
    module.alpha.data = torch.rand(1, C, 1, device=DEV) * 3 + 1e-3  # fp32, as a half codec keeps it
    x = _randn(2, C, T, dtype=dtype)
    y = ck.snake(x, module.alpha)
    assert y.dtype == dtype and y.shape == x.shape
    _close(y, twins.snake(x, module.alpha), dtype)
    _close(module._eager(x), y, dtype)
    with torch.no_grad():  # the codec decodes without grad: there its Snake is the fused kernel
        assert torch.equal(module(x), y)


@pytest.mark.parametrize("kind", ["v4", "v4_1_mf"])
def test_fused_velocity_matches_the_v4_fixtures(kind):
    """The fused kernels on the v4 DiT (its blocks are v3's; MeanFlow adds dt to the modulation
    table): one forward against the reference's stored (average) velocity. One forward only: the
    interpreter is slow (the sampler cases run eagerly in test_fast_v4.py)."""
    from v4_cases import encode as encode_v4
    from v4_cases import load_kind as load_v4

    model, io, _, _ = load_v4(kind)
    model = model.to(DEV)
    io = {k: v.to(DEV) for k, v in io.items()}
    conds = encode_v4(model, io, rows=slice(0, 1))
    ctx = model.context_kv(conds)
    mask = model.attention_mask(ctx, 24, io["latent_mask"][:1])
    fast = FastDiT(model, fused=True)
    assert fast.fused
    dts = [float(io["delta_t"][0])] if model.cfg.meanflow else None
    table = fast.modulation_table([float(io["t"][0])], dts)
    got = fast.velocity(io["x_t"][:1], table[0], ctx, mask, rope_tables(24, model.cfg.head_dim, DEV))
    torch.testing.assert_close(got, io["out_velocity"][:1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "residual, snake, keep", [(False, False, True), (False, True, False), (True, True, True)]
)
@pytest.mark.parametrize("shape", [(37, 200), (2, 23, 96)])
def test_conv_epilogue_matches_the_torch_path(dtype, residual, snake, keep, shape):
    """Rows of one size (200 channels: no power of two) and the decoder's (B, T, 96) activations;
    the element count is no multiple of the kernel's block."""
    from irodori_speaker.engine.codec.fast import epilogue_torch

    torch.manual_seed(4)
    C = shape[-1]
    y = _randn(*shape, dtype=dtype)
    bias = _randn(C, dtype=dtype)
    res = _randn(*shape, dtype=dtype) if residual else None
    alpha = (torch.rand(1, C, 1, device=DEV) * 3 + 1e-3) if snake else None  # fp32, as the codec keeps it
    h, s = ck.conv_epilogue(y, bias, res, alpha, keep)
    want_h, want_s = epilogue_torch(y, bias, res, alpha, keep)
    assert (h is None) == (not keep) and (s is None) == (not snake)
    for got, want in ((h, want_h), (s, want_s)):
        if want is not None:
            assert got is not None and got.dtype == dtype and got.shape == y.shape
            _close(got, want, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "C, dilation, keep, thirds",
    [
        (24, 1, True, False),
        (24, 9, False, False),
        (40, 3, True, False),
        (40, 9, True, True),
        (96, 3, False, True),
        (192, 9, True, True),
    ],
)
def test_residual_unit_matches_the_unfused_unit(dtype, C, dilation, keep, thirds):
    """A residual unit in one kernel against the decoder's ops (the 7-tap conv, epilogue, 1-tap
    conv, epilogue): the conv's zero padding at both ends, 200 samples (two tiles of 128, the
    second partial), widths not a power of two, each dilation the decoder has; packed in one
    chunk of outputs or in three (`thirds`: 40 channels as 3 x 16, the last padded; 96 as 3 x 32;
    192 as 3 x 64, in the wide units' block)."""
    from torch import nn

    from irodori_speaker.engine.codec.fast import _Conv, epilogue_torch

    torch.manual_seed(6)
    c7 = _Conv.of(nn.Conv1d(C, C, 7, dilation=dilation, padding=3 * dilation).to(DEV, dtype))
    c1 = _Conv.of(nn.Conv1d(C, C, 1).to(DEV, dtype))
    s, x = _randn(2, 200, C, dtype=dtype), _randn(2, 200, C, dtype=dtype)
    a7, an = (torch.rand(1, C, 1, device=DEV) * 3 + 1e-3 for _ in range(2))
    with torch.no_grad():
        _, mid = epilogue_torch(c7(s), c7.bias, None, a7, False)
        assert mid is not None
        want_h, want_s = epilogue_torch(c1(mid), c1.bias, x, an, True)
        packed = ck.pack_residual_unit(c7.weight, c1.weight, thirds=thirds)
        assert packed[1].shape[0] == {40: 48, 96: 96, 192: 192}[C] if thirds else packed[1].shape[0] >= 32
        h, out = ck.residual_unit(s, packed, c7.bias, a7, dilation, c1.bias, x, an, keep)
    assert out.dtype == dtype and out.shape == s.shape and (h is not None) == keep
    assert want_h is not None and want_s is not None
    if h is not None:
        _close(h, want_h, dtype)
    _close(out, want_s, dtype)


def test_unit_chunks_pack_in_thirds_only_where_that_pads_less():
    assert ck.unit_chunks(96, thirds=False) == (1, 128)
    assert [ck.unit_chunks(C, thirds=True) for C in (96, 192, 40, 24, 128, 8)] == [
        (3, 32),
        (3, 64),
        (3, 16),
        (1, 32),
        (1, 128),
        (1, 16),
    ]
    assert ck.unit_chunks(192) == ck.unit_chunks(192, thirds=ck.UNIT_THIRDS)


@pytest.mark.parametrize("thirds", [False, True])
def test_the_decoder_with_fused_units_decodes_as_without(monkeypatch, thirds):
    """The tiny codec's channels-last decoder with its units fused (the 96-channel-and-under
    stages: all of the tiny one's) against unfused, both against the fp32 decode; one latent
    frame (the interpreter is slow). With `UNIT_THIRDS` its 48-channel stage packs as 3 x 16."""
    monkeypatch.setattr(ck, "UNIT_THIRDS", thirds)
    from irodori_speaker.engine.codec import TINY_CODEC_KWARGS, codec_from_state_dict, random_codec_state_dict

    state = random_codec_state_dict(TINY_CODEC_KWARGS, seed=1, watermark=False)
    lat = torch.randn(1, 1, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = codec_from_state_dict(state, TINY_CODEC_KWARGS, device=DEV).decode(lat)
        codec = codec_from_state_dict(state, TINY_CODEC_KWARGS, device=DEV, dtype=torch.float16)
        assert codec.use_channels_last(True) and codec._channels_last is not None
        codec._channels_last.fuse_units = True
        widths = sorted({w1.shape[0] for _, w1 in (codec._channels_last._packs or {}).values()})
        assert widths == ([16, 32, 48] if thirds else [16, 32, 64])
        fused_units = codec.decode(lat)
        codec._channels_last.fuse_units = False
        unfused = codec.decode(lat)
    err_fused, err_unfused = ((x - want).abs().max().item() for x in (fused_units, unfused))
    assert 0 < (fused_units - unfused).abs().max().item() < 2e-3  # it ran, and rounds alike
    assert err_fused < 1.5 * err_unfused + 1e-4


@pytest.mark.skipif(DEV.type != "cuda", reason="the approximate sine is the GPU's (the interpreter has none)")
def test_the_approximate_sine_stays_within_its_bound(monkeypatch):
    """On the GPU Snake's sine is `sin.approx.f32` (absolute error 2^-20.5 for |x| < 100 pi, PTX
    ISA): in fp32 a Snake output then differs from the exact sine's by at most 2 min(1/a, |h|)
    2^-20.5 plus fp32 rounding, here over arguments |a h| up to ~250 and alphas down to 1e-3."""
    torch.manual_seed(5)
    C = 96
    y = torch.randn(4, 1000, C, device=DEV) * 15
    bias = torch.zeros(C, device=DEV)
    alpha = torch.rand(1, C, 1, device=DEV) * 3 + 1e-3
    alpha[0, :8, 0] = 1e-3  # tiny alphas: sin(a h)^2 / a is where an absolute error could grow
    y[..., :8] *= 0.01
    assert ck.APPROX_SIN
    h, s_approx = ck.conv_epilogue(y, bias, None, alpha, keep=True)
    monkeypatch.setattr(ck, "APPROX_SIN", False)
    _, s_exact = ck.conv_epilogue(y, bias, None, alpha, keep=True)
    assert h is not None and s_approx is not None and s_exact is not None
    assert not torch.equal(s_approx, s_exact)  # the flag reaches the kernel
    a = alpha.reshape(C)
    bound = 2 * torch.minimum(1 / a, h.abs()) * 2**-20.5 + 4 * s_exact.abs() * 2**-23 + 1e-7
    assert ((s_approx - s_exact).abs() <= bound).all()
