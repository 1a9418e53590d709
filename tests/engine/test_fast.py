"""The fast path (fused projections, precomputed AdaLN, padded static shapes) equals the reference."""

from __future__ import annotations

import pytest
import torch
from dit_cases import KINDS, case_settings, encode, load_kind

from graph_cases import stood_in_capture
from irodori_speaker.cancel import CancelToken
from irodori_speaker.engine.fast import FastDiT, FastSampler, pad_conditions
from irodori_speaker.engine.model import rope_tables
from irodori_speaker.engine.sampler import SamplerConfig, draw_noise, plan_sampling, sample
from irodori_speaker.errors import Cancelled

FIRST = slice(0, 1)  # the sampler cases run on the first item of the batch


@pytest.mark.parametrize("kind", KINDS)
def test_fast_velocity_equals_reference(dit_fixtures, kind):
    model, io, _ = load_kind(dit_fixtures, kind)
    conds = encode(model, io)  # both rows
    ref = model.velocity(io["x_t"], io["t"], conds, io["latent_mask"])
    fast = FastDiT(model)
    ctx = model.context_kv(conds)
    mask = model.attention_mask(ctx, 24, io["latent_mask"])
    # per-row t: build each row's modulation separately
    outs = []
    for b in range(2):
        table = fast.modulation_table([float(io["t"][b])])
        c = ctx.rows(b + 1)
        c = type(c)(
            [k[b : b + 1] for k in c.keys], [v[b : b + 1] for v in c.values], c.mask[b : b + 1], c.segments
        )
        outs.append(
            fast.velocity(io["x_t"][b : b + 1], table[0], c, mask[b : b + 1], rope_tables(24, 16, "cpu"))
        )
    torch.testing.assert_close(torch.cat(outs), ref, atol=1e-5, rtol=1e-5)
    # fusing re-pointed the originals at the fused weights: the reference path is unchanged
    torch.testing.assert_close(model.velocity(io["x_t"], io["t"], conds, io["latent_mask"]), ref)


@pytest.mark.parametrize("kind", KINDS)
def test_fast_sampler_matches_golden_cases(dit_fixtures, kind):
    """Padded to frame bucket 16 (24 -> 32) and context bucket 32: the golden outputs still hold."""
    model, io, cases = load_kind(dit_fixtures, kind)
    sampler = FastSampler(model, frame_bucket=16, context_bucket=32, use_graphs=False)
    conds = encode(model, io, FIRST)
    for name, settings in cases.items():
        kw = case_settings(settings)
        out = sampler.sample(conds, io[f"sample_{name}_noise"], SamplerConfig(**kw))
        torch.testing.assert_close(out, io[f"sample_{name}_out"], atol=1e-4, rtol=1e-4, msg=name)


def test_padding_conditions_is_exact(dit_fixtures):
    model, io, _ = load_kind(dit_fixtures, "v3_voicedesign")
    conds = encode(model, io, FIRST)
    padded = pad_conditions(conds, 32)
    assert padded.text_state.shape[1] == 32 and padded.speaker_state.shape[1] == 32
    noise = draw_noise(1, 1, 24, 32)
    cfg = SamplerConfig(steps=6, schedule="sway")
    torch.testing.assert_close(
        sample(model, padded, noise, cfg), sample(model, conds, noise, cfg), atol=1e-5, rtol=1e-5
    )


def test_modulation_table_matches_adaln(dit_fixtures):
    model, _, _ = load_kind(dit_fixtures, "v2_base")
    plan = plan_sampling(SamplerConfig(steps=8, schedule="sway"), ("text",))
    table = FastDiT(model).modulation_table([s.t for s in plan.steps])
    assert table.shape == (8, 2, 6, 64)
    t = torch.tensor([plan.steps[3].t])
    shift, scale, gate = model.blocks[1].mlp_adaln.modulation(model.time_condition(t))
    torch.testing.assert_close(table[3, 1, 3], shift[0, 0])
    torch.testing.assert_close(table[3, 1, 4], 1 + scale[0, 0])
    torch.testing.assert_close(table[3, 1, 5], gate[0, 0])


def test_eager_fast_path_cancels_between_steps(dit_fixtures):
    model, io, _ = load_kind(dit_fixtures, "v2_base")
    token = CancelToken()
    seen = []

    def progress(done, total):
        seen.append(done)
        if done == 2:
            token.cancel()

    with pytest.raises(Cancelled):
        FastSampler(model, use_graphs=False).sample(
            encode(model, io, FIRST),
            draw_noise(0, 1, 24, 32),
            SamplerConfig(steps=8),
            cancel=token,
            progress=progress,
        )
    assert seen == [1, 2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need an NVIDIA GPU (run on the H200)")
def test_cuda_graph_replay_equals_eager(dit_fixtures):
    model, io, cases = load_kind(dit_fixtures, "v3_base")
    model = model.cuda()
    conds = encode(model, {k: v.cuda() for k, v in io.items()}, FIRST)
    graphed = FastSampler(model, use_graphs=True)
    eager = FastSampler(graphed.fast, use_graphs=False)
    for name in ("independent", "sway8", "speaker_kv"):
        kw = case_settings(cases[name])
        noise = io[f"sample_{name}_noise"].cuda()
        a = graphed.sample(conds, noise, SamplerConfig(**kw))
        b = graphed.sample(conds, noise, SamplerConfig(**kw))  # a replay, not a capture
        c = eager.sample(conds, noise, SamplerConfig(**kw))
        torch.testing.assert_close(a, c, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b, c, atol=1e-4, rtol=1e-4)
    assert graphed.captures == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need an NVIDIA GPU (run on the H200)")
def test_many_captures_keep_no_memory_per_graph_beyond_their_own(dit_fixtures):
    """Each capture used to warm up on a fresh side stream, and cuBLAS keeps a workspace (32 MiB on
    an H200) per stream it sees: prewarm's 38 captures held 928 MiB that no tensor owned."""
    model, io, cases = load_kind(dit_fixtures, "v3_base")
    model = model.cuda()
    conds = encode(model, {k: v.cuda() for k, v in io.items()}, FIRST)
    sampler = FastSampler(model, use_graphs=True, frame_bucket=4)
    kw = case_settings(cases["independent"])
    noise = io["sample_independent_noise"].cuda()

    def capture_at(frames: int) -> None:
        sampler.sample(conds, torch.randn(1, frames, noise.shape[-1], device="cuda"), SamplerConfig(**kw))

    capture_at(4)  # the first capture may create the one warm-up stream's workspace
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for frames in (8, 12, 16, 20, 24, 28):
        capture_at(frames)
    torch.cuda.synchronize()
    assert sampler.captures == 7
    grown = torch.cuda.memory_allocated() - before
    assert grown < 8 * 2**20, f"six tiny captures kept {grown / 2**20:.0f} MiB"


def test_fast_path_on_an_int4_model(dit_fixtures, tmp_path):
    """Fused int4 projections (one packed GEMM, through Int4Linear.concat) give what the unfused
    int4 layers give; the originals become slices of the fused layer."""
    from irodori_speaker.engine.fusing import SliceOf
    from irodori_speaker.engine.quant.checkpoint import load_int4_model
    from irodori_speaker.engine.quant.layers import Int4Linear
    from irodori_speaker.engine.quant.quantize import quantize_checkpoint

    dst = tmp_path / "int4.safetensors"
    quantize_checkpoint(dit_fixtures / "tiny_v2_base.safetensors", dst, method="rtn", report_errors=False)
    model = load_int4_model(dst, dtype="fp32").model
    assert isinstance(model.blocks[0].attention.wq, Int4Linear)
    _, io, _ = load_kind(dit_fixtures, "v2_base")
    conds = encode(model, io, FIRST)
    noise = io["sample_sway8_noise"]
    cfg = SamplerConfig(steps=8, schedule="sway")
    ref = sample(model, conds, noise, cfg)
    fast = FastSampler(FastDiT(model, fused=True), use_graphs=False)  # fused projections, model blocks
    assert isinstance(fast.fast.blocks[0].qkvg, Int4Linear)
    assert fast.fast.blocks[0].qkvg.out_features == 4 * 64
    assert isinstance(model.blocks[0].attention.wq, SliceOf)
    torch.testing.assert_close(fast.sample(conds, noise, cfg), ref, atol=1e-4, rtol=1e-4)
    # the originals now slice the fused layer: the reference path still gives the same result
    torch.testing.assert_close(sample(model, conds, noise, cfg), ref, atol=1e-5, rtol=1e-5)


def test_without_the_kernels_the_model_is_left_as_it_is(dit_fixtures):
    """On the CPU the fast path runs the model's own blocks: no fused layers, no re-pointed weights."""
    model, _, _ = load_kind(dit_fixtures, "v2_base")
    wq = model.blocks[0].attention.wq
    before = wq.weight.data_ptr()
    fast = FastDiT(model)
    assert not fast.fused and fast.blocks == []
    assert model.blocks[0].attention.wq is wq and wq.weight.data_ptr() == before


def test_blocks_whose_projections_cannot_fuse_keep_the_model_blocks(dit_fixtures, monkeypatch):
    """The CPU preset's int8 linears where the kernels run (the interpreter): no fused blocks, no
    error (it raised in `fuse_linears`), the same velocity as the model's."""
    from irodori_speaker.engine import fast as fast_mod
    from irodori_speaker.engine.hardware.cpu_tricks import apply_int8_linears

    monkeypatch.setattr(fast_mod, "fused_available", lambda device: True)
    model, io, _ = load_kind(dit_fixtures, "v3_base")
    assert apply_int8_linears(model) > 0
    conds = encode(model, io, FIRST)
    ctx = model.context_kv(conds)
    mask = model.attention_mask(ctx, 24, io["latent_mask"][:1])
    ref = model.velocity(io["x_t"][:1], io["t"][:1], conds, io["latent_mask"][:1])
    fast = FastDiT(model)
    assert not fast.fused and fast.blocks == []
    table = fast.modulation_table([float(io["t"][0])])
    got = fast.velocity(io["x_t"][:1], table[0], ctx, mask, rope_tables(24, 16, "cpu"))
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_a_failed_kernel_falls_back_to_the_model_blocks(dit_fixtures, monkeypatch):
    """What runs on a GPU whose Triton kernel failed: the model's blocks on the fused (viewed) weights."""
    from irodori_speaker.engine import fast as fast_mod
    from irodori_speaker.engine import fused

    monkeypatch.setattr(fused, "_FAILED", [])
    monkeypatch.setattr(fast_mod, "fused_available", lambda device: True)
    model, io, _ = load_kind(dit_fixtures, "v3_base")
    conds = encode(model, io, FIRST)
    ctx = model.context_kv(conds)
    mask = model.attention_mask(ctx, 24, io["latent_mask"][:1])
    ref = model.velocity(io["x_t"][:1], io["t"][:1], conds, io["latent_mask"][:1])
    fast = FastDiT(model, fused=True)

    def broken(*args):
        raise RuntimeError("PTX assembly aborted")

    monkeypatch.setattr(fast, "_velocity_fused", broken)
    table = fast.modulation_table([float(io["t"][0])])
    with pytest.warns(UserWarning, match="switched off"):
        got = fast.velocity(io["x_t"][:1], table[0], ctx, mask, rope_tables(24, 16, "cpu"))
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_text_padded_to_the_bucket_encodes_the_same(dit_fixtures):
    """What the text-encoder graph relies on: padding (masked) changes no valid state, pads are zero."""
    import torch.nn.functional as F

    model, io, _ = load_kind(dit_fixtures, "v2_base")
    ids, mask = io["text_input_ids"][:1], io["text_mask"][:1]
    L = ids.shape[1]
    with torch.inference_mode():
        plain = model.encode_text(ids, mask)
        padded = model.encode_text(F.pad(ids, (0, 32 - L)), F.pad(mask, (0, 32 - L), value=False))
    torch.testing.assert_close(padded[:, :L][mask], plain[mask], atol=1e-6, rtol=1e-6)
    assert torch.count_nonzero(padded[:, L:]) == 0


def test_graphs_share_one_static_buffer_per_input_shape(dit_fixtures, monkeypatch):
    """A voice's states are one buffer for every frame bucket's graph (each replay copies its
    inputs in first); the latents' differ by bucket; an evicted graph's own buffers go with it.
    The lines equal the eager sampler's."""
    import irodori_speaker.engine.fast as fast_module

    monkeypatch.setattr(fast_module, "capture", stood_in_capture)
    model, io, cases = load_kind(dit_fixtures, "v2_base")
    conds = encode(model, io, FIRST)
    graphed = FastSampler(model, use_graphs=True, frame_bucket=8, max_graphs=2)
    monkeypatch.setattr(graphed, "graph_pool", lambda: None)
    eager = FastSampler(graphed.fast, use_graphs=False)
    cfg = SamplerConfig(**case_settings(cases["independent"]))
    for frames in (8, 16, 8):
        noise = draw_noise(frames, 1, frames, 32)
        torch.testing.assert_close(graphed.sample(conds, noise, cfg), eager.sample(conds, noise, cfg))
    assert graphed.captures == 2 and len(graphed._graphs) == 2
    first, second = graphed._graphs.values()
    assert first.inputs[3] is second.inputs[3] and first.inputs[1] is second.inputs[1]  # the voice, the text
    assert first.inputs[0] is not second.inputs[0]  # the latents: 8 and 16 frames
    for g in (first, second):  # within a graph every input its own (two masks may share a shape)
        held = [t for t in g.inputs if t is not None]
        assert len({id(t) for t in held}) == len(held)
    graphed.sample(conds, draw_noise(24, 1, 24, 32), cfg)  # a third bucket: the 16-frame one goes
    shapes = {k[1] for k in graphed._statics if k[0] == 0}  # the latents' buffers
    assert (1, 16, 32) not in shapes and {(1, 8, 32), (1, 24, 32)} <= shapes
    graphed.keep_room(3)  # prewarm, before a voice's captures: the LRU grows, none is evicted
    assert graphed.max_graphs == len(graphed._graphs) + 3 == 5
    read = {id(t) for g in graphed._graphs.values() for t in g.inputs if t is not None}
    assert len(graphed._statics) == len(read)  # every buffer kept is one a kept graph reads


def test_linears_with_biases_fuse_side_by_side_and_keep_their_own_outputs():
    """`fuse_linears` on biased `nn.Linear`s (the duration predictor's modulations): one layer
    giving each one's output side by side, the originals re-pointed at views of its weight and
    bias (held once); a mix of biased and bias-free layers is refused."""
    from irodori_speaker.engine.fusing import fusable, fuse_linears

    torch.manual_seed(0)
    layers = [torch.nn.Linear(6, n) for n in (4, 5)]
    x = torch.randn(3, 6)
    want = torch.cat([m(x) for m in layers], dim=-1).detach()
    fused = fuse_linears(layers)
    assert isinstance(fused, torch.nn.Linear) and fused.bias is not None
    torch.testing.assert_close(fused(x), want)
    torch.testing.assert_close(torch.cat([m(x) for m in layers], dim=-1), want)
    assert layers[1].bias.data_ptr() == fused.bias[4:].data_ptr()  # a view: held once
    assert layers[1].weight.data_ptr() == fused.weight[4:].data_ptr()
    mixed = [torch.nn.Linear(6, 4), torch.nn.Linear(6, 4, bias=False)]
    assert not fusable(mixed)
    with pytest.raises(TypeError, match="all with a bias or none"):
        fuse_linears(mixed)
