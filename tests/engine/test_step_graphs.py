"""The step batcher's forward per (rows, frames, context) bucket (engine/step_graphs.py).

On the CPU the buckets' static buffers run eagerly (`capture=False`): what a graph replays
(rows filled up to the bucket with copies of the first, frames and context positions padded
to the bucket and masked, the mask and row table copied only when the group changes) is checked
against each line sampled alone. The capture itself needs CUDA (the last test, skipped here;
docs/status.md lists the device call). The fused kernels through the same buffers run in
test_fused.py (interpreter).
"""

from __future__ import annotations

import pytest
import torch
from dit_cases import encode, load_kind

from graph_cases import captured_equals_eager
from irodori_speaker.engine.fast import FastDiT
from irodori_speaker.engine.sampler import SamplerConfig, draw_noise, sample
from irodori_speaker.engine.steps import Joining, StepBatcher, run_lines

LINES = [  # (fixture row, frames, seed, sampler settings): rows per line differ (3, 2, 1, 3)
    (0, 24, 1, dict(steps=4, schedule="sway")),
    (1, 40, 2, dict(steps=3, schedule="linear", guidance="alternating")),
    (0, 17, 3, dict(steps=4, cfg_scale_text=0.0, cfg_scale_caption=0.0, cfg_scale_speaker=0.0)),
    (1, 33, 4, dict(steps=5, speaker_kv_scale=1.5, speaker_kv_min_t=0.5)),
]


def _inputs(dit_fixtures, kind="v2_base", device="cpu"):
    model, io, _ = load_kind(dit_fixtures, kind)
    model = model.to(device)
    io = {k: v.to(device) for k, v in io.items()}
    inputs = []
    for row, frames, seed, kw in LINES:
        conds = encode(model, io, slice(row, row + 1))
        noise = draw_noise(seed, 1, frames, model.cfg.latent_dim, device=device)
        inputs.append((conds, noise, SamplerConfig(**kw)))
    with torch.inference_mode():
        want = [sample(model, *args) for args in inputs]
    return model, inputs, want


def _prewarmed(model, *, max_rows=16, length=256, capture=False) -> StepBatcher:
    batcher = StepBatcher(FastDiT(model), max_padding=float("inf"))  # one forward for all
    made = batcher.prewarm_graphs(
        max_rows=max_rows, top_frames=64, length=length, capture=capture, frame_bucket=16, length_bucket=64
    )
    assert made == len(batcher.graphs) > 0
    return batcher


def test_lines_stepped_through_the_buckets_equal_each_line_alone(dit_fixtures):
    model, inputs, want = _inputs(dit_fixtures)
    batcher = _prewarmed(model)
    pool_keys = batcher.pool.keys[0]
    assert batcher.pool.fixed and batcher.pool.slots == 16 and batcher.pool.length == 256
    lines = [batcher.start(*inputs[0], tag=0), batcher.start(*inputs[1], tag=1)]
    buckets, filled = [], []
    live = list(lines)
    tick = 0
    while live:
        if tick == 1:  # two more join at the second step
            live += [batcher.start(*inputs[i], tag=i) for i in (2, 3)]
            lines += live[-2:]
        for line in batcher.step(live):
            live.remove(line)
        buckets += [p.bucket for p in batcher._packed.values()]
        filled += [p.bucket[0] - p.row_line.shape[0] for p in batcher._packed.values() if p.bucket]
        tick += 1
    assert batcher.graphs is not None and batcher.graphs.replays == batcher.steps_run  # every step
    rows = {b[0] for b in buckets if b is not None}
    assert rows - {1, 2, 3, 4, 6, 8, 12, 16} == set() and len(rows) > 1
    assert rows & {3, 6, 12}  # three rows a line (CFG): buckets of three times a power of two
    assert buckets and all(b is not None and b[1] >= 48 for b in buckets)  # frames to the bucket
    assert max(filled) > 0 and min(filled) >= 0  # rows filled up to their bucket
    for line in lines:
        assert line.error is None
        torch.testing.assert_close(
            line.latent(), want[line.tag], atol=1e-4, rtol=1e-4, msg=f"line {line.tag}"
        )
    # the pool kept its tensors (the graphs read them by address), every slot given back
    assert batcher.pool.held == 0 and batcher.pool.keys[0] is pool_keys


def test_a_fixed_pool_starts_only_the_lines_it_holds_the_rest_wait(dit_fixtures):
    model, inputs, want = _inputs(dit_fixtures)
    rows = []
    batcher = _prewarmed(model, max_rows=4)  # 4 slots: line 0 (3 rows) and line 2 (1 row), or 1 and 2
    waiting = [Joining(*inputs[i], tag=i) for i in range(len(inputs))]
    done = {}
    live: list = []
    while waiting or live:
        started = batcher.start_many(waiting)
        waiting = waiting[len(started) :]
        live += started
        rows.append(sum(line.held.rows for line in live))
        assert rows[-1] <= 4
        for line in batcher.step(live):
            live.remove(line)
            done[line.tag] = line
    assert batcher.pool.slots == 4 and len(batcher.graphs) > 0  # never grown, graphs kept
    assert max(rows) == 4 or len(set(rows)) > 1
    for i, line in done.items():
        torch.testing.assert_close(line.latent(), want[i], atol=1e-4, rtol=1e-4, msg=f"line {i}")


def test_a_context_longer_than_the_pool_grows_it_and_drops_the_graphs(dit_fixtures, caplog):
    model, inputs, want = _inputs(dit_fixtures)
    batcher = _prewarmed(model, length=32)  # shorter than the lines' contexts
    generation = batcher.pool.generation
    with caplog.at_level("WARNING", logger="irodori_speaker.engine"):
        lines = [batcher.start(*inputs[i], tag=i) for i in (0, 1)]
    assert batcher.pool.generation != generation and "graphs are dropped" in caplog.text
    run_lines(batcher, lines)
    assert batcher.graphs is not None and len(batcher.graphs) == 0 and batcher.graphs.replays == 0
    for line in lines:
        torch.testing.assert_close(line.latent(), want[line.tag], atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs need a GPU (docs/status.md: device call)"
)
def test_captured_step_graphs_equal_the_eager_step_on_cuda(dit_fixtures):
    model, moved, _ = _inputs(dit_fixtures, device="cuda")

    def run(capture: bool) -> list:
        batcher = _prewarmed(model, capture=capture)
        lines = [batcher.start(*args, tag=i) for i, args in enumerate(moved)]
        run_lines(batcher, lines)
        assert batcher.graphs.replays == batcher.steps_run
        return [line.latent() for line in lines]

    captured_equals_eager(run)


def test_rows_are_filled_to_powers_of_two_and_three_times_them():
    """16 v2 lines (three rows each with CFG) are 48 rows: one bucket, not 64 rows a quarter of
    them fillers."""
    from irodori_speaker.engine.step_graphs import rows_bucket

    assert [rows_bucket(n) for n in (1, 3, 5, 7, 9, 13, 17, 25, 33, 48, 49, 97, 129)] == [
        1,
        3,
        6,
        8,
        12,
        16,
        24,
        32,
        48,
        48,
        64,
        128,
        160,
    ]
