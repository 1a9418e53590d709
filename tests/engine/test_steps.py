"""Step-level batching (engine/steps.py): every line in a shared step equals the line alone.

Lines of different lengths, texts, voices, seeds and plans (sway / linear, independent /
alternating guidance, a CFG window, speaker K/V scaling, score rescaling, MeanFlow) join at
different steps and leave when done; each one's latent is compared with the reference loop
(`sampler.sample`) run on that line alone. On the CPU the model's own blocks run (fp32); the
fused Triton kernels with per-row modulation are checked in test_fused.py (CUDA, or the
interpreter).
"""

from __future__ import annotations

import pytest
import torch
from dit_cases import encode, load_kind

from irodori_speaker.cancel import CancelToken
from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.engine.context_pool import ContextPool
from irodori_speaker.engine.fast import FastDiT
from irodori_speaker.engine.sampler import SamplerConfig, draw_noise, sample
from irodori_speaker.engine.steps import StepBatcher, run_lines
from irodori_speaker.engine.tiny import tiny_random_files
from irodori_speaker.errors import Cancelled

LINES = [  # (fixture row, frames, seed, sampler settings)
    (0, 24, 1, dict(steps=6, schedule="sway")),
    (1, 40, 2, dict(steps=4, schedule="linear", guidance="alternating")),
    (0, 17, 3, dict(steps=5, schedule="sway", cfg_min_t=0.3, cfg_max_t=0.8)),
    (1, 33, 4, dict(steps=6, speaker_kv_scale=1.5, speaker_kv_min_t=0.5)),
    (0, 8, 5, dict(steps=3, cfg_scale_text=0.0, cfg_scale_caption=0.0, cfg_scale_speaker=0.0)),
    (1, 28, 6, dict(steps=4, rescale_k=1.3, rescale_sigma=0.7)),  # rescaled: euler_step on its own
]


def _alone(model, conds, noise, cfg):
    with torch.inference_mode():
        return sample(model, conds, noise, cfg)


def _lines_and_alone(dit_fixtures, kind):
    """The model, LINES as (conditions, noise, config), and each line sampled alone."""
    model, io, _ = load_kind(dit_fixtures, kind)
    inputs = []
    for row, frames, seed, kw in LINES:
        conds = encode(model, io, slice(row, row + 1))
        inputs.append((conds, draw_noise(seed, 1, frames, model.cfg.latent_dim), SamplerConfig(**kw)))
    return model, inputs, [_alone(model, *args) for args in inputs]


@pytest.mark.parametrize("kind", ["v2_base", "v3_voicedesign"])
def test_lines_joining_at_different_steps_equal_each_line_alone(dit_fixtures, kind):
    model, inputs, want = _lines_and_alone(dit_fixtures, kind)
    batcher = StepBatcher(FastDiT(model), max_padding=float("inf"))  # one forward for all
    batcher.pool = ContextPool(min_slots=1)  # it grows as lines join, lines in flight moved over
    generations = set()
    progress: dict[int, list[int]] = {}
    live, done = [], {}
    joins = {0: [0, 1], 2: [2, 5], 3: [3, 4]}  # at which step of the loop each line arrives
    tick = 0
    while len(done) < len(LINES):
        for i in joins.get(tick, []):
            conds, noise, cfg = inputs[i]
            live.append(
                batcher.start(
                    conds, noise, cfg, tag=i, progress=lambda d, n, i=i: progress.setdefault(i, []).append(d)
                )
            )
        generations.add(batcher.pool.generation)
        for line in batcher.step(live):
            live.remove(line)
            done[line.tag] = line
        for packed in batcher._packed.values():  # the step reads the contexts where they are held
            assert packed.ctx.keys[0].data_ptr() == batcher.pool.keys[0].data_ptr()
        tick += 1
    assert len(generations) > 1  # grown while lines were in flight
    assert batcher.pool.held == 0 and batcher.pool.keys == [] and not batcher._packed  # all given back
    assert batcher.rows_run > batcher.steps_run  # lines really shared forwards
    for i, w in enumerate(want):
        line = done[i]
        assert line.error is None
        torch.testing.assert_close(line.latent(), w, atol=1e-4, rtol=1e-4, msg=f"line {i}")
        assert progress[i] == list(range(1, LINES[i][3]["steps"] + 1))


@pytest.mark.parametrize("kind", ["v2_base", "v3_voicedesign"])
def test_lines_started_together_equal_each_line_alone(dit_fixtures, kind):
    """`start_many`: lines of every plan of LINES join in one call (those whose guidance groups
    match share one context call, rows padded to the longest context), then step together."""
    from irodori_speaker.engine.steps import Joining

    model, inputs, want = _lines_and_alone(dit_fixtures, kind)
    calls: list[int] = []
    real = model.context_layer_kv

    def context_layer_kv(layer, parts):  # layer 0: once per context call (one a guidance group)
        if layer == 0:
            calls.append(parts[0][1].shape[0])
        return real(layer, parts)

    batcher = StepBatcher(FastDiT(model), max_padding=float("inf"))
    model.context_layer_kv = context_layer_kv
    try:
        lines = batcher.start_many([Joining(*args, tag=i) for i, args in enumerate(inputs)])
    finally:
        del model.context_layer_kv
    groups = sum(len(plan.groups) or 1 for plan in {line.plan.groups: line.plan for line in lines}.values())
    assert len(calls) < sum(len(line.plan.groups) or 1 for line in lines)  # lines shared calls
    assert len(calls) >= groups  # one per guidance group of each kind of line
    run_lines(batcher, lines)
    for i, w in enumerate(want):
        assert lines[i].error is None and lines[i].tag == i
        torch.testing.assert_close(lines[i].latent(), w, atol=1e-4, rtol=1e-4, msg=f"line {i}")


def test_meanflow_lines_and_packing_reuse():
    model = load_checkpoint(tiny_random_files("v4.1-mf").model).model
    assert model.cfg.meanflow
    torch.manual_seed(0)
    lines_in = []
    for n, (frames, steps) in enumerate([(20, 4), (36, 2), (12, 4)]):
        ids = torch.randint(3, 200, (1, 6 + n))
        mask = torch.ones_like(ids, dtype=torch.bool)
        ref = torch.randn(1, 10 + 4 * n, model.cfg.latent_dim)
        with torch.inference_mode():
            conds = model.encode_conditions(ids, mask, ref, None)
        lines_in.append((conds, draw_noise(n, 1, frames, model.cfg.latent_dim), SamplerConfig(steps=steps)))
    want = [_alone(model, *args) for args in lines_in]
    batcher = StepBatcher(FastDiT(model), max_padding=float("inf"))  # one forward for all
    lines = [batcher.start(*args) for args in lines_in]
    packs = []
    original = batcher._pack

    def counting(ls, key):
        packed = original(ls, key)
        packs.append(packed)  # held, so a new pack cannot reuse a freed one's id
        return packed

    batcher._pack = counting  # count how often the context is packed anew
    run_lines(batcher, lines)
    for line, w in zip(lines, want):
        torch.testing.assert_close(line.latent(), w, atol=1e-4, rtol=1e-4)
    # 4 steps; the 2-step line leaves after step 2: packed for 3 lines, then for 2
    assert len(packs) == 4 and len({id(p) for p in packs}) == 2


def test_a_cancelled_line_leaves_and_the_others_are_unchanged(dit_fixtures):
    model, io, _ = load_kind(dit_fixtures, "v2_base")
    C = model.cfg.latent_dim
    cfg = SamplerConfig(steps=6, schedule="sway")
    a = (encode(model, io, slice(0, 1)), draw_noise(1, 1, 24, C), cfg)
    b = (encode(model, io, slice(1, 2)), draw_noise(2, 1, 30, C), cfg)
    want_b = _alone(model, *b)
    batcher = StepBatcher(FastDiT(model), max_padding=float("inf"))  # one forward for all
    token = CancelToken()
    line_a = batcher.start(*a, cancel=token)
    line_b = batcher.start(*b)
    live = [line_a, line_b]
    batcher.step(live)
    token.cancel()
    finished = batcher.step(live)  # takes effect at the next step boundary
    assert finished == [line_a] and isinstance(line_a.error, Cancelled) and line_a.step == 1
    assert batcher.pool.held == 1  # a's slots given back as it left
    live.remove(line_a)
    run_lines(batcher, live)
    torch.testing.assert_close(line_b.latent(), want_b, atol=1e-4, rtol=1e-4)


def test_lines_of_far_different_lengths_step_in_separate_forwards_and_equal_alone(dit_fixtures):
    model, io, _ = load_kind(dit_fixtures, "v2_base")
    C = model.cfg.latent_dim
    cfg = SamplerConfig(steps=3, schedule="sway")
    lengths = [150, 140, 24, 20]  # two long lines and two short ones (padded to 160 and 32)
    inputs = [
        (encode(model, io, slice(i % 2, i % 2 + 1)), draw_noise(i, 1, n, C), cfg)
        for i, n in enumerate(lengths)
    ]
    want = [_alone(model, *args) for args in inputs]
    batcher = StepBatcher(FastDiT(model), max_padding=0.5)
    lines = [batcher.start(*args) for args in inputs]
    groups = batcher.groups(lines)
    assert [sorted(line.frames for line in g) for g in groups] == [[140, 150], [20, 24]]
    run_lines(batcher, lines)
    assert batcher.steps_run == 2 * 3  # two forwards a step
    for line, w in zip(lines, want):
        torch.testing.assert_close(line.latent(), w, atol=1e-4, rtol=1e-4)
    assert not batcher._packed or len(batcher._packed) <= 2


def test_a_step_that_raises_gives_back_its_lines_slots(dit_fixtures, monkeypatch):
    model, io, _ = load_kind(dit_fixtures, "v2_base")
    cfg = SamplerConfig(steps=3, schedule="sway")
    batcher = StepBatcher(FastDiT(model), max_padding=float("inf"))
    lines = [
        batcher.start(encode(model, io, slice(i, i + 1)), draw_noise(i, 1, 20, model.cfg.latent_dim), cfg)
        for i in (0, 1)
    ]
    assert batcher.pool.held == 2

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(batcher.fast, "velocity", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        batcher.step(lines)
    assert batcher.pool.held == 0  # the caller fails them: nothing is left held
