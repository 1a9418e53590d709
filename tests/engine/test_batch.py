"""Several lines stacked into one sampler batch (engine/batch.py) sample what each does alone."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from irodori_speaker.engine.batch import (
    batch_bucket,
    fill_batch,
    frame_mask,
    signature,
    stack_conditions,
    stack_noise,
    stack_tokens,
)
from irodori_speaker.engine.fast import FastSampler, context_rung
from irodori_speaker.engine.kernels.tuning import tuning_allowed
from irodori_speaker.engine.sampler import draw_noise, sample
from irodori_speaker.engine.tiny import random_model
from irodori_speaker.options import SamplerConfig

CFG = SamplerConfig(steps=4, schedule="sway")


def _padded(rows, value=0):
    """Rows (1, L_b, ...) zero- (or `value`-) padded to the longest one by one and joined: what the
    stacking was before it became one call."""
    n = max(r.shape[1] for r in rows)
    pads = [(0, 0) * (r.dim() - 2) + (0, n - r.shape[1]) for r in rows]
    return torch.cat([torch.nn.functional.pad(r, p, value=value) for r, p in zip(rows, pads)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stacked_rows_are_each_row_padded_and_joined(dtype):
    """Noise, token ids and masks of lines of several lengths stack to the rows padded one by one
    (zeros, token 0, False), bit for bit, in their dtype; lines of one length stack unpadded."""
    g = torch.Generator().manual_seed(5)
    noises = [torch.randn(1, n, 4, generator=g).to(dtype) for n in (3, 7, 5)]
    stacked, lengths = stack_noise(noises)
    assert lengths == [3, 7, 5] and stacked.dtype == dtype and stacked.is_contiguous()
    assert torch.equal(stacked, _padded(noises))
    ids = [torch.randint(1, 50, (1, n), generator=g) for n in (4, 2, 4)]
    masks = [torch.ones(1, n, dtype=torch.bool) for n in (4, 2, 4)]
    got_ids, got_mask = stack_tokens(ids, masks)
    assert torch.equal(got_ids, _padded(ids)) and torch.equal(got_mask, _padded(masks, False))
    assert got_mask.dtype == torch.bool and got_mask.sum().item() == 10
    same, _ = stack_noise(noises[:1] * 2)
    assert torch.equal(same, torch.cat(noises[:1] * 2))


def _line(model, n_text: int, n_ref: int | None, seed: int):
    """One line's conditions (batch 1): `n_text` random tokens, a reference of `n_ref` frames."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, model.cfg.text_token_vocab, (1, n_text), generator=g)
    mask = torch.ones(1, n_text, dtype=torch.bool)
    ref = ref_mask = None
    if n_ref is not None:
        ref = torch.randn(1, n_ref, model.cfg.latent_dim, generator=g)
        ref_mask = torch.ones(1, n_ref, dtype=torch.bool)
    w = model.in_proj.weight
    if ref is not None:
        ref, ref_mask = ref.to(w.device, w.dtype), ref_mask.to(w.device)
    with torch.inference_mode():
        return model.encode_conditions(ids.to(w.device), mask.to(w.device), ref, ref_mask)


LINES = [(7, 24, 40), (19, 16, 23), (3, 40, 31), (11, 8, 17)]  # text tokens, ref frames, latent frames


@pytest.mark.parametrize("kind", ["v2", "v4.1-mf"])
@pytest.mark.parametrize("path", ["reference", "fast"])
def test_a_stacked_batch_samples_each_line_as_alone(kind, path):
    model = random_model(kind)
    lines = [
        (_line(model, t, r, i), draw_noise(i, 1, s, model.cfg.latent_dim))
        for i, (t, r, s) in enumerate(LINES)
    ]
    keys = {signature(model, c, CFG) for c, _ in lines}
    assert len(keys) == 1, "lines of one voice and options share a batch"
    conds = stack_conditions([c for c, _ in lines])
    noise, lengths = stack_noise([n for _, n in lines])
    assert lengths == [s for _, _, s in LINES] and noise.shape[:2] == (4, 40)
    with torch.inference_mode():
        if path == "fast":
            fast = FastSampler(model, use_graphs=False)
            alone = [fast.sample(c, n, CFG) for c, n in lines]
            batched = fast.sample(conds, noise, CFG, frames=lengths)
        else:
            alone = [sample(model, c, n, CFG) for c, n in lines]
            batched = sample(model, conds, noise, CFG, latent_mask=frame_mask(lengths, 40, "cpu"))
    for b, (one, n) in enumerate(zip(alone, lengths)):
        assert one.shape[1] == n
        torch.testing.assert_close(batched[b : b + 1, :n], one, rtol=1e-4, atol=1e-5)


def test_lines_that_cannot_share_a_batch_have_different_signatures():
    model = random_model("v2")
    with_ref, without = _line(model, 5, 16, 0), _line(model, 5, None, 1)
    base = signature(model, with_ref, CFG)
    assert signature(model, _line(model, 9, 30, 2), CFG) == base  # other text and voice: fine
    assert signature(model, without, CFG) != base  # no reference: other guidance branches
    assert signature(model, with_ref, dataclasses.replace(CFG, steps=6)) != base
    assert signature(model, with_ref, dataclasses.replace(CFG, cfg_scale_text=2.0)) != base
    assert signature(model, with_ref, dataclasses.replace(CFG, truncation_factor=0.8)) != base


def test_frame_mask_marks_each_rows_own_length():
    m = frame_mask([3, 1, 4], 5, "cpu")
    assert m.tolist() == [
        [True, True, True, False, False],
        [True, False, False, False, False],
        [True, True, True, True, False],
    ]


def test_batch_buckets_are_powers_of_two():
    assert [batch_bucket(n) for n in (2, 3, 4, 5, 7, 9, 13, 17, 33, 64, 65)] == [
        2, 4, 4, 8, 8, 16, 16, 32, 64, 64, 80,
    ]  # fmt: skip
    assert all(n <= batch_bucket(n) < 2 * n for n in range(2, 200))


def test_a_batch_filled_with_copies_of_its_first_line_keeps_every_row():
    model = random_model("v2")
    lines = [
        (_line(model, t, r, i), draw_noise(i, 1, s, model.cfg.latent_dim))
        for i, (t, r, s) in enumerate(LINES[:3])
    ]
    conds = stack_conditions([c for c, _ in lines])
    noise, lengths = stack_noise([n for _, n in lines])
    big, big_noise, big_lengths = fill_batch(conds, noise, lengths, 4)
    assert big.batch_size == 4 and big_noise.shape[0] == 4 and big_lengths == [*lengths, lengths[0]]
    assert torch.equal(big.text_state[3], conds.text_state[0]) and torch.equal(big_noise[3], noise[0])
    fast = FastSampler(model, use_graphs=False)
    with torch.inference_mode():
        want = fast.sample(conds, noise, CFG, frames=lengths)
        got = fast.sample(big, big_noise, CFG, frames=big_lengths)
    for b, n in enumerate(lengths):
        torch.testing.assert_close(got[b, :n], want[b, :n], rtol=1e-4, atol=1e-5)


class _Eager:
    """A CUDA graph's capture stood in for by an eager run of the same function (CPU tests)."""

    def __init__(self, fn, inputs):
        self.fn = fn

    def replay(self, inputs):
        return self.fn(*inputs)


def _graphed_lines(monkeypatch, shapes):
    """A graphed FastSampler on the CPU (capture stood in for; a batch running line by line
    fails the test) and one line per (text tokens, reference frames, latent frames)."""
    model = random_model("v2")
    graphed = FastSampler(model, use_graphs=True)
    monkeypatch.setattr(graphed, "_capture", _Eager)
    monkeypatch.setattr(graphed, "_one_by_one", lambda *a: pytest.fail("a batch ran line by line"))
    lines = [
        (_line(model, t, r, i), draw_noise(i, 1, s, model.cfg.latent_dim))
        for i, (t, r, s) in enumerate(shapes)
    ]
    return graphed, lines


def _batches_replay_one_graph(graphed, lines, groups) -> None:
    """The first group's batch captured (as in prewarm), then every group's batch replays it and
    each row equals its line sampled alone."""
    with torch.inference_mode():
        for k, members in enumerate(groups):
            conds = stack_conditions([lines[i][0] for i in members])
            noise, lengths = stack_noise([lines[i][1] for i in members])
            if k == 0:
                with tuning_allowed():
                    graphed.sample(conds, noise, CFG, frames=lengths)
            batched = graphed.sample(conds, noise, CFG, frames=lengths)
            for b, i in enumerate(members):
                c, n = lines[i]
                torch.testing.assert_close(
                    batched[b : b + 1, : n.shape[1]], graphed.sample(c, n, CFG), rtol=1e-4, atol=1e-5
                )
    assert len(graphed._batch_graphs) == 1  # every batch replayed the one captured graph


def test_a_batch_without_its_graph_runs_line_by_line_on_the_batchs_plan(monkeypatch):
    """A batch shape prewarm did not capture runs its lines one by one, each on the batch's plan:
    planning a row again reads its sliced mask (a new tensor) on the host, a sync on CUDA (found by
    the sync check on an H100). The CUDA capture is stood in for by an eager run here."""
    import irodori_speaker.engine.fast as fast_module

    model = random_model("v2")
    lines = [
        (_line(model, t, r, i), draw_noise(i, 1, s, model.cfg.latent_dim))
        for i, (t, r, s) in enumerate(LINES)
    ]
    graphed = FastSampler(model, use_graphs=True)
    monkeypatch.setattr(graphed, "_capture", _Eager)
    plans = []
    plan_for = fast_module.plan_for
    monkeypatch.setattr(fast_module, "plan_for", lambda *a: plans.append(1) or plan_for(*a))
    conds = stack_conditions([c for c, _ in lines])
    noise, lengths = stack_noise([n for _, n in lines])
    with torch.inference_mode():
        batched = graphed.sample(conds, noise, CFG, frames=lengths)
        assert len(graphed._batch_graphs) == 0 and len(plans) == 1  # the batch's plan, once
        for b, ((c, n), frames) in enumerate(zip(lines, lengths)):
            torch.testing.assert_close(
                batched[b : b + 1, :frames], graphed.sample(c, n, CFG), rtol=1e-4, atol=1e-5
            )


def test_context_rungs_double_from_the_context_bucket():
    assert [context_rung(n, 32) for n in (1, 32, 33, 64, 65, 96, 128, 129, 250, 257, 700)] == [
        32, 32, 64, 64, 128, 128, 128, 256, 256, 512, 1024,
    ]  # fmt: skip
    assert all(n <= context_rung(n, 32) < max(64, 2 * n) for n in range(1, 2000))


def test_batches_of_voices_on_one_rung_replay_one_graph_and_equal_each_line(monkeypatch):
    """Lines of voices whose references differ in length (a server's voice book) batch from one
    graph when their longest reference falls on the same rung (65-128 positions here): a batch
    of several voices no longer runs line by line for want of a graph of its exact length."""
    shapes = [(7, 70, 40), (19, 100, 23), (3, 40, 31), (11, 16, 17)]  # refs: 71, 101, 41, 17 positions
    graphed, lines = _graphed_lines(monkeypatch, shapes)
    assert graphed.batch_shape(lines[0][0], CFG) == graphed.batch_shape(lines[1][0], CFG)  # rung 128
    assert graphed.batch_shape(lines[2][0], CFG) != graphed.batch_shape(lines[0][0], CFG)  # rung 64
    _batches_replay_one_graph(graphed, lines, ([0, 2], [1, 3], [2, 1]))  # longest ref 71, 101, 101


def test_batches_of_texts_up_to_128_tokens_replay_one_graph_and_equal_each_line(monkeypatch):
    """A batch's text is padded to its rung (64, then 128 tokens): lines of 65-128 tokens (the
    splitter's 90-character pieces) batch from the 128 graph; before, a batch whose longest text
    passed 64 tokens found no graph and ran line by line."""
    shapes = [(70, 24, 30), (100, 16, 20), (40, 24, 25), (5, 16, 33)]  # text tokens, ref, frames
    graphed, lines = _graphed_lines(monkeypatch, shapes)
    assert graphed.batch_shape(lines[0][0], CFG) == graphed.batch_shape(lines[1][0], CFG)  # text rung 128
    assert graphed.batch_shape(lines[2][0], CFG) == graphed.batch_shape(lines[3][0], CFG)  # text rung 64
    assert graphed.batch_shape(lines[0][0], CFG) != graphed.batch_shape(lines[3][0], CFG)
    _batches_replay_one_graph(graphed, lines, ([0, 2], [1, 3], [3, 1]))  # longest text 70, 100, 100


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (runs in benchmarks/gpu_run.sh)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_a_batch_from_its_graph_equals_each_line_from_its_graph(dtype):
    model = random_model("v2").to("cuda", dtype)
    shapes = [*LINES, (5, 24, 12), (13, 16, 29), (9, 8, 33)]  # seven lines, the longest 40 frames
    lines = [
        (_line(model, t, r, i), draw_noise(i, 1, s, model.cfg.latent_dim, device="cuda"))
        for i, (t, r, s) in enumerate(shapes)
    ]
    graphed = FastSampler(model, use_graphs=True)  # fused kernels
    # fp32 holds the rows to the line's own; bf16 to the fused kernels' tolerance (tests/engine/
    # test_fused.py): a batch's GEMMs round in another order (one element of 992 at 0.032 on an H100)
    tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=6e-2, rtol=3e-2)

    def check(batched, lengths):
        for b, (one, n) in enumerate(zip(alone, lengths)):
            torch.testing.assert_close(batched[b : b + 1, :n].float(), one.float(), **tol)

    with torch.inference_mode():
        alone = [graphed.sample(c, n, CFG) for c, n in lines]
        conds = stack_conditions([c for c, _ in lines[:5]])
        noise, lengths = stack_noise([n for _, n in lines[:5]])
        check(graphed.sample(conds, noise, CFG, frames=lengths), lengths)  # no batch graph: line by line
        assert len(graphed._batch_graphs) == 0
        with tuning_allowed():  # as in prewarm: captured
            check(graphed.sample(conds, noise, CFG, frames=lengths), lengths)
        assert len(graphed._batch_graphs) == 1
        for size in (5, 6, 7):  # bucket 8 every time: replays of the one graph
            conds = stack_conditions([c for c, _ in lines[:size]])
            noise, lengths = stack_noise([n for _, n in lines[:size]])
            batched = graphed.sample(conds, noise, CFG, frames=lengths)
            assert batched.shape[0] == size
            check(batched, lengths)
    assert len(graphed._batch_graphs) == 1
