"""A stepped line's start from a graph per (lines, context shape, groups) bucket
(engine/start_graphs.py).

On the CPU the buckets' static buffers run eagerly (`capture=False`): what a graph replays (the
text padded to its rung, lines filled up to the bucket with the first line's rows written to its
own slots again) is checked against each line sampled alone and against the eager start's pool
contents. The capture needs CUDA (the last test, skipped here; docs/status.md lists the device
call).
"""

from __future__ import annotations

import pytest
import torch
from dit_cases import encode, load_kind

from graph_cases import captured_equals_eager
from irodori_speaker.engine.fast import FastDiT
from irodori_speaker.engine.sampler import SamplerConfig, draw_noise, sample
from irodori_speaker.engine.steps import Joining, StepBatcher, run_lines

CFG = SamplerConfig(steps=4, schedule="sway")  # three rows a line (v2: CFG on text and speaker)
LINES = [(0, 24, 1), (1, 40, 2), (0, 17, 3)]  # (fixture row, frames, seed): one kind, one shape


def _inputs(dit_fixtures, device="cpu"):
    model, io, _ = load_kind(dit_fixtures, "v2_base")
    model = model.to(device)
    io = {k: v.to(device) for k, v in io.items()}
    inputs = []
    for row, frames, seed in LINES:
        conds = encode(model, io, slice(row, row + 1))
        inputs.append((conds, draw_noise(seed, 1, frames, model.cfg.latent_dim, device=device), CFG))
    with torch.inference_mode():
        want = [sample(model, *args) for args in inputs]
    return model, inputs, want


def _batcher(model, inputs, *, capture=False, starts=True) -> StepBatcher:
    batcher = StepBatcher(FastDiT(model), max_padding=float("inf"))
    batcher.prewarm_graphs(
        max_rows=16, top_frames=64, length=256, capture=capture, frame_bucket=16, length_bucket=64
    )
    if starts:
        assert batcher.prewarm_starts(inputs[0][0], CFG, capture=capture) > 0
    return batcher


def _valid_context(line):
    """Each group's keys and values per layer at the line's valid context positions."""
    out = []
    for group in line.ctx.groups:
        valid = group.mask[0]
        out += [k[:, :, valid] for k in group.keys] + [v[:, :, valid] for v in group.values]
    return out


def test_lines_started_from_a_graph_equal_each_line_alone(dit_fixtures):
    model, inputs, want = _inputs(dit_fixtures)
    batcher = _batcher(model, inputs)
    starts = batcher.starts
    assert starts is not None
    assert {key[0] for key in starts._graphs} == {1, 2, 4, 8}  # 16 slots: up to 5 lines of 3 rows
    lines = batcher.start_many([Joining(*args, tag=i) for i, args in enumerate(inputs)])
    assert starts.replays == 1 and len(lines) == 3  # one replay for the three (a bucket of 4)
    text = inputs[0][0].text_state.shape[1]
    assert lines[0].held.segments[0] == ("text", 0, 64) and text < 64  # the text on its rung
    run_lines(batcher, lines)
    for line in lines:
        torch.testing.assert_close(line.latent(), want[line.tag], atol=1e-4, rtol=1e-4)


def test_a_graph_start_writes_what_the_eager_start_does_and_nothing_else(dit_fixtures):
    model, inputs, _ = _inputs(dit_fixtures)
    eager = _batcher(model, inputs, starts=False)
    graphed = _batcher(model, inputs)
    # a line already live in the graphed pool: the filler rows of the next start must not touch it
    first = graphed.start_many([Joining(*inputs[2], tag=2)])[0]
    before = [t.clone() for t in graphed.pool.keys + graphed.pool.values]
    kept = range(first.held.start, first.held.start + first.held.rows)
    a = eager.start_many([Joining(*args, tag=i) for i, args in enumerate(inputs[:2])])
    b = graphed.start_many([Joining(*args, tag=i) for i, args in enumerate(inputs[:2])])
    assert graphed.starts is not None and graphed.starts.replays == 2 and eager.starts is None
    for x, y in zip(a, b):
        assert x.held.length < y.held.length  # the graph's text on its rung, the eager start's not
        for p, q in zip(_valid_context(x), _valid_context(y)):
            torch.testing.assert_close(p, q, atol=1e-5, rtol=1e-5)
    for old, new in zip(before, graphed.pool.keys + graphed.pool.values):
        assert torch.equal(old[list(kept)], new[list(kept)])


def test_a_start_without_a_graph_runs_eagerly_and_a_grown_pool_drops_them(dit_fixtures):
    model, inputs, want = _inputs(dit_fixtures)
    batcher = _batcher(model, inputs)
    starts = batcher.starts
    assert starts is not None
    other = SamplerConfig(steps=3, schedule="sway", guidance="alternating")  # other guidance groups
    line = batcher.start(inputs[0][0], inputs[0][1], other, tag=0)
    assert starts.replays == 0 and line.held.segments[0][2] < 64  # eager: the text on its bucket
    run_lines(batcher, [line])
    with torch.inference_mode():
        torch.testing.assert_close(line.latent(), sample(model, inputs[0][0], inputs[0][1], other))
    # a second prewarm (another voice) keeps the pool, its step graphs and the start graphs made
    assert batcher.prewarm_graphs(max_rows=16, top_frames=64, length=256, capture=False) == 0
    run_lines(batcher, [batcher.start(*inputs[0], tag=0)])
    assert starts.replays == 1
    batcher.pool.fix(16, 512, batcher._layout)  # its tensors replaced, as a too-long context does
    line = batcher.start(*inputs[1], tag=1)
    assert len(starts) == 0 and starts.replays == 1  # every start graph dropped: eager
    run_lines(batcher, [line])
    assert batcher.graphs is not None and len(batcher.graphs) == 0  # the step's dropped too
    torch.testing.assert_close(line.latent(), want[1], atol=1e-4, rtol=1e-4)
    # the next prewarm makes the step's graphs again on the moved pool
    assert batcher.prewarm_graphs(max_rows=16, top_frames=64, length=256, capture=False) > 0


def test_a_prewarm_after_the_pool_moved_makes_its_graphs_again(dit_fixtures):
    model, inputs, want = _inputs(dit_fixtures)
    batcher = _batcher(model, inputs)
    starts = batcher.starts
    assert starts is not None
    made = len(starts)
    batcher.pool.fix(16, 512, batcher._layout)  # new tensors: the graphs made on the old are stale
    assert batcher.prewarm_starts(inputs[0][0], CFG, capture=False) == made == len(starts)
    lines = batcher.start_many([Joining(*args, tag=i) for i, args in enumerate(inputs)])
    assert starts.replays == 1
    run_lines(batcher, lines)
    for line in lines:
        torch.testing.assert_close(line.latent(), want[line.tag], atol=1e-4, rtol=1e-4)


def test_a_line_scaling_its_speaker_keys_from_a_graph_start_equals_it_alone(dit_fixtures):
    model, inputs, _ = _inputs(dit_fixtures)
    scaled = SamplerConfig(steps=4, schedule="sway", speaker_kv_scale=1.5, speaker_kv_min_t=0.5)
    batcher = _batcher(model, inputs)
    assert batcher.prewarm_starts(inputs[1][0], scaled, capture=False) >= 0
    line = batcher.start(inputs[1][0], inputs[1][1], scaled, tag=1)
    assert batcher.starts is not None and batcher.starts.replays == 1
    run_lines(batcher, [line])
    with torch.inference_mode():
        want = sample(model, inputs[1][0], inputs[1][1], scaled)
    torch.testing.assert_close(line.latent(), want, atol=1e-4, rtol=1e-4)


def test_the_buckets_share_one_static_buffer_per_condition_shape(dit_fixtures):
    """Every bucket's graph reads the first rows of one buffer per condition shape: the voice's
    states once for all buckets and both text rungs, the text's once per rung."""
    import torch.nn.functional as F

    from irodori_speaker.engine.model import Conditions

    model, inputs, _ = _inputs(dit_fixtures)
    batcher = _batcher(model, inputs)
    conds = inputs[0][0]
    longer = Conditions(  # a text of 70 positions: the 128 rung
        F.pad(conds.text_state, (0, 0, 0, 70 - conds.text_state.shape[1])),
        F.pad(conds.text_mask, (0, 70 - conds.text_mask.shape[1]), value=False),
        conds.speaker_state,
        conds.speaker_mask,
    )
    assert batcher.prewarm_starts(longer, CFG, capture=False) == 4
    starts = batcher.starts
    assert starts is not None
    graphs = list(starts._graphs.values())
    assert len(graphs) == 8 and {k[1][0] for k in starts._graphs} == {64, 128}
    storages = [{g.inputs[i].untyped_storage().data_ptr() for g in graphs} for i in range(4)]
    assert [len(s) for s in storages] == [2, 2, 1, 1]  # text state / mask per rung, the voice's once
    for (n, *_), g in starts._graphs.items():
        assert all(t.shape[0] == n and t.is_contiguous() for t in g.inputs if t is not None)
    lines = batcher.start_many([Joining(longer, inputs[0][1], CFG, tag=0), Joining(*inputs[1], tag=1)])
    assert starts.replays == 1 and lines[0].held.segments[0] == ("text", 0, 128)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs need a GPU (docs/status.md: device call)"
)
def test_captured_start_graphs_equal_the_eager_start_on_cuda(dit_fixtures):
    model, inputs, _ = _inputs(dit_fixtures, device="cuda")

    def run(capture: bool) -> list:
        batcher = _batcher(model, inputs, capture=capture)
        lines = batcher.start_many([Joining(*args, tag=i) for i, args in enumerate(inputs)])
        assert batcher.starts is not None and batcher.starts.replays == 1
        run_lines(batcher, lines)
        return [line.latent() for line in lines]

    captured_equals_eager(run)
