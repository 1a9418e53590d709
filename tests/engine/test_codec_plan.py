"""A stream's window plan (`chunk_windows(plan_lengths=...)`, preset `stream_window_plan`): after the
first chunk, windows of a few graphed lengths only, the fewest frames decoded, the same audio."""

from __future__ import annotations

import dataclasses
import functools
import itertools

import pytest
import torch
from codec_windows import window_synth
from test_codec_graphs import ATOL, FakeCapture, _cache, _codec, _latent

from irodori_speaker.engine.codec import stream_window_lengths, streaming
from irodori_speaker.errors import InputError

C = streaming.RECEPTIVE_FIELD_FRAMES
CUDA_PLAN = (40, 66, 116, 216)  # benchmarks/decode_frames.py's lengths
# (first chunk, lengths); 4: a first chunk within the context; 30, 50, 80: plans of equal frames and
# different windows (80 = 30 + 50) for many lines
PLANS = [(8, CUDA_PLAN), (8, (24, 41)), (4, (30, 50)), (8, (30, 50, 80))]


def _planned(frames: int, first: int, lengths: tuple[int, ...], **kw) -> list[streaming.Window]:
    return streaming.chunk_windows(frames, 50, C, first, plan_lengths=lengths, **kw)


def _frames(windows: list[streaming.Window]) -> int:
    return sum(hi - lo for lo, _, _, hi in windows)


# --------------------------------------------------------------------------- the windows


@pytest.mark.parametrize(("first", "lengths"), PLANS)
def test_a_plan_tiles_the_line_in_order_in_its_lengths_after_the_first_window(
    first: int, lengths: tuple[int, ...]
) -> None:
    for frames in range(1, 401):
        windows = _planned(frames, first, lengths)
        assert windows[0] == streaming.chunk_windows(frames, 50, C, first)[0]  # first audio unchanged
        assert [w[1] for w in windows] == [0, *(w[2] for w in windows[:-1])] and windows[-1][2] == frames
        middles = [hi - lo for lo, _, _, hi in windows[1:-1]]
        assert middles == sorted(middles), (frames, windows)  # shorter windows first
        for lo, start, end, hi in windows[1:]:
            assert start < end <= hi <= frames, (frames, windows)
            # a length of the plan; the one exception: a first chunk within the context, and a line
            # too short for any window of the plan from frame 0 (a window [0, frames), eager)
            assert hi - lo in lengths or (first < C and (lo, hi) == (0, frames) < (0, min(lengths)))
            assert hi >= min(frames, end + C)  # its right context, or the line's end
            # its left context, or the line's start: frames before 0 only where the kept ones are C in
            assert lo <= start - C or lo == 0 or (lo < 0 and start >= C), (frames, windows)


@functools.cache
def _middles(first: int, lengths: tuple[int, ...], limit: int = 400) -> list[tuple[int, int, int]]:
    """(where the last window's chunk starts, their frames, how many) for every multiset of middle
    windows laid out from the first chunk's end, each as far as its context lets it, ending by
    `limit` frames (the order changes neither their sum nor where they end)."""
    out = []
    for k in itertools.count():
        placed = False
        for middles in itertools.combinations_with_replacement(lengths, k):
            s, hi = first, 0
            for n in middles:
                lo = max(0, s - C)
                s, hi = lo + n - C, lo + n
            if hi <= limit:
                placed = True
                out.append((s, sum(middles), k))
        if not placed:
            return out
    raise AssertionError  # unreachable: itertools.count() never ends


def _brute_force(frames: int, first: int, lengths: tuple[int, ...]) -> tuple[int, int] | None:
    """(frames decoded, windows) at the least, trying every multiset of middle windows that fits the
    line (their last one's right context within it) and every last window; None: none fits."""
    head = min(frames, first + C)  # the first window
    if frames <= first:
        return head, 1
    found = [
        (head + total + n, k + 2)
        for s, total, k in _middles(first, lengths)
        if s + C <= frames or k == 0
        for n in lengths  # the last window [frames - n, frames): context enough, or the line's start
        if ((frames - n <= s - C) if s >= C else frames == n)
    ]
    return min(found, default=None)


@pytest.mark.parametrize(("first", "lengths"), PLANS)
def test_a_plan_decodes_the_fewest_frames_then_the_fewest_windows(
    first: int, lengths: tuple[int, ...]
) -> None:
    for frames in range(1, 401):
        windows = _planned(frames, first, lengths)
        want = _brute_force(frames, first, lengths)
        if want is None:  # no window of the plan fits: the one exception, a window [0, frames)
            assert first < C and windows[1:] == [(0, first, frames, frames)], (frames, windows)
            continue
        assert (_frames(windows), len(windows)) == want, (frames, windows)


def test_the_plans_frames_against_the_presets_windows() -> None:
    """news5's lines (benchmarks/decode_frames.py): 1.59x their frames in the CUDA preset's windows,
    1.30x in the plan's, never more than those windows for any line."""
    news5 = (37, 190, 252, 118, 118)
    plain = sum(_frames(streaming.chunk_windows(n, 50, C, 8)) for n in news5)
    plan = sum(_frames(_planned(n, 8, CUDA_PLAN)) for n in news5)
    assert (round(plain / sum(news5), 2), round(plan / sum(news5), 2)) == (1.59, 1.30)
    for frames in range(1, 401):
        assert (
            frames
            <= _frames(_planned(frames, 8, CUDA_PLAN))
            <= _frames(streaming.chunk_windows(frames, 50, C, 8))
        )


def test_short_lines() -> None:
    plan = (40, 66)
    assert _planned(5, 8, plan) == [(0, 0, 5, 5)]  # shorter than the first chunk: its one window
    assert _planned(8, 8, plan) == [(0, 0, 8, 8)]
    assert _planned(9, 8, plan) == [(0, 0, 8, 9), (-31, 8, 9, 9)]  # just longer: zeros before frame 0
    assert _planned(30, 8, plan) == [(0, 0, 8, 16), (-10, 8, 30, 30)]  # shorter than the plan's least
    # a first chunk within the context: its next window starts at frame 0 (no zeros before it)
    assert _planned(40, 4, plan) == [(0, 0, 4, 12), (0, 4, 40, 40)]
    assert _planned(20, 4, plan) == [(0, 0, 4, 12), (0, 4, 20, 20)]  # the exception: none of 40, 66
    # without graphs the last window keeps only the context it needs
    assert _planned(30, 8, plan, stretch_last=False) == [(0, 0, 8, 16), (0, 8, 30, 30)]
    assert _planned(118, 8, CUDA_PLAN, stretch_last=False)[-1] == (24, 32, 118, 118)


def test_a_plan_takes_the_place_of_tails_and_the_middle_length() -> None:
    for frames in (37, 118, 252):
        with_tails = streaming.chunk_windows(frames, 50, C, 8, tail_lengths=(24,), plan_lengths=CUDA_PLAN)
        assert with_tails == _planned(frames, 8, CUDA_PLAN)
    assert stream_window_lengths(50, first_chunk_frames=8, plan_lengths=(216, 40, 116, 66, 40)) == [
        16,
        40,
        66,
        116,
        216,
    ]
    assert stream_window_lengths(50, first_chunk_frames=8, plan_lengths=(40,)) == [16, 40]  # no 66


@pytest.mark.parametrize(
    "call",
    [
        lambda p: streaming.chunk_windows(100, 50, C, 8, plan_lengths=p),
        lambda p: stream_window_lengths(50, C, 8, plan_lengths=p),
    ],
)
@pytest.mark.parametrize("plan", [(16,), (40, 8), (40.0,), (True,), ("40",), "40", 40])
def test_a_bad_plan_is_an_input_error_with_a_hint(call, plan) -> None:
    with pytest.raises(InputError) as err:
        call(plan)
    assert err.value.hint and "\n" not in str(err.value)


def test_a_plan_with_growth_is_an_input_error() -> None:
    with pytest.raises(InputError, match="growth") as err:
        streaming.chunk_windows(100, 50, C, 8, growth=3.0, plan_lengths=(40,))
    assert "stream_window_plan" in (err.value.hint or "")
    with pytest.raises(InputError, match="growth"):
        stream_window_lengths(50, C, 8, 3.0, plan_lengths=(40,))


def test_a_preset_with_a_bad_plan_fails_before_any_model() -> None:
    from irodori_speaker.engine.hardware.presets import select_preset

    with pytest.raises(InputError, match=">= 17"):
        select_preset("cpu", stream_window_plan=(16,))
    with pytest.raises(InputError, match="growth"):
        select_preset("cpu", stream_chunk_growth=2.0, stream_window_plan=(40,))
    assert select_preset("cpu", stream_window_plan=CUDA_PLAN).stream_window_plan == CUDA_PLAN


# --------------------------------------------------------------------------- the audio


@pytest.mark.parametrize(
    ("frames", "first", "lengths"),
    [
        *[(5, 8, (40,)), (9, 8, (40,)), (30, 8, (40, 66)), (121, 8, CUDA_PLAN), (190, 8, CUDA_PLAN)],
        *[(77, 8, (24, 41)), (20, 4, (30, 50)), (61, 4, (30, 50)), (83, 8, (17, 30))],
    ],
)
def test_a_planned_stream_joins_to_the_one_pass_decode(
    frames: int, first: int, lengths: tuple[int, ...]
) -> None:
    codec = _codec()
    lat = _latent(frames, seed=frames)
    z = codec._check_latent(lat)
    windows = _planned(frames, first, lengths)
    parts = list(streaming.decode_windows(codec._decode_window, z, windows, codec.hop_length, None))
    torch.testing.assert_close(torch.cat(parts, -1), codec.decode(lat), atol=ATOL, rtol=0)


def test_a_synthesizers_plan_is_prewarmed_replayed_and_sounds_the_same(irodori_home) -> None:
    """`preset.stream_window_plan`: prewarm captures the plan's lengths (the codec's graphs stood in
    for on the CPU), a streamed line's every window replays one (none eager) and the audio is
    the same as without a plan."""
    import numpy as np

    from irodori_speaker.options import SynthesisOptions
    from irodori_speaker.synthesis.prewarm import codec_graphs

    audio, replayed = [], []
    for plan in ((), (24, 40)):
        synth = window_synth(stream_window_plan=plan)
        # the CPU preset's windows: 8, then 25 (41); with the plan its first window, then 24 and 40
        assert synth._window_lengths() == ([16, 41] if not plan else [16, 24, 40])
        synth.preset = dataclasses.replace(synth.preset, codec_graphs=True)
        lengths: list[int] = []  # the window lengths replayed
        cap = FakeCapture(
            lambda z, keep=None, decode=synth.codec._decode_frames, lengths=lengths: (
                lengths.append(z.shape[-1]) or decode(z, keep)
            )
        )
        synth.codec._graphs = _cache(cap, max_graphs=8, capture_on_use=None)  # as the synthesizer's
        # each length with the crops its windows take: the first keeps its right context only,
        # later ones both ends (a middle window) or their left (a line's last)
        keys = synth._window_keys()
        assert [n for n, _ in keys] == [16, *[n for n in synth._window_lengths()[1:] for _ in range(2)]]
        assert codec_graphs(synth) == len(keys)
        assert cap.keys == [(1, n, *crop) for n, crop in keys]
        eager: list[int] = []
        decode = synth.codec._decode_frames
        synth.codec._decode_frames = lambda z, keep=None, decode=decode, eager=eager: (
            eager.append(z.shape[-1]) or decode(z, keep)
        )
        lengths.clear()  # the capture's own run
        opts = SynthesisOptions(seed=3, steps=2, seconds=2.2)
        audio.append(np.concatenate(list(synth.stream("こんにちは", options=opts))))
        assert not eager, eager  # every window a prewarmed length
        replayed.append(lengths)
    assert 41 in replayed[0] and 41 not in replayed[1] and set(replayed[1]) <= {16, 24, 40}, replayed
    np.testing.assert_allclose(audio[1], audio[0], atol=1e-5)
