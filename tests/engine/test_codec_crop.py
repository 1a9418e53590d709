"""Cropped window decodes: a window's deeper blocks carry only what its kept samples depend on.

On the CPU (the tiny random codec, fp32, the channels-last decoder; the codec's graphs stood in
for by `FakeCapture`) and, on a GPU, the graphs of cropped windows against eager.
"""

from __future__ import annotations

import pytest
import torch
from codec_windows import window_synth
from test_codec_graphs import FakeCapture, _cache, _exact_cudnn, needs_gpu

from irodori_speaker.engine.codec import (
    DACVAE,
    TINY_CODEC_KWARGS,
    codec_from_state_dict,
    random_codec_state_dict,
    stream_window_keys,
    streaming,
)
from irodori_speaker.engine.codec.fast import _crop, input_span
from irodori_speaker.errors import InputError

HOP = 1920
C = streaming.RECEPTIVE_FIELD_FRAMES


def _codec(device: str = "cpu", dtype: torch.dtype = torch.float32) -> DACVAE:
    state = random_codec_state_dict(TINY_CODEC_KWARGS, seed=0, watermark=False)
    codec = codec_from_state_dict(state, TINY_CODEC_KWARGS, device=device, dtype=dtype)
    assert codec.use_channels_last(True)
    return codec


@pytest.fixture(scope="module")
def codec() -> DACVAE:
    return _codec()


def _z(frames: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    """(batch, frames, 32): the channels-last decoder's input."""
    return torch.randn(batch, frames, 32, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(
    ("frames", "a", "b"),
    [
        (66, 8 * HOP, 58 * HOP),  # a middle window
        (16, 0, 8 * HOP),  # a line's first window: no left context
        (66, 20 * HOP, 66 * HOP),  # a line's last window, reaching further left than it needs
        (40, 0, 40 * HOP),  # the whole window
        (33, 8 * HOP + 7, 25 * HOP - 300),  # samples not on a frame's edge
        (9, 3 * HOP, 4 * HOP),  # a short window: every block sees its edges
    ],
)
def test_a_cropped_decode_gives_the_whole_windows_samples(codec: DACVAE, frames: int, a: int, b: int) -> None:
    d = codec._channels_last
    z = _z(frames, seed=frames)
    with torch.no_grad():
        whole = d(z)[:, :, a:b]
        kept = d(z, keep=(a, b))
    assert kept.shape == whole.shape == (2, 1, b - a)
    torch.testing.assert_close(kept, whole, atol=1e-6, rtol=0)


def test_the_deeper_blocks_carry_about_the_kept_frames_only(codec: DACVAE) -> None:
    d = codec._channels_last
    spans = d.crop_spans(8 * HOP, 58 * HOP)  # a 66-frame middle window keeps frames [8, 58)
    blocks = sorted(spans)  # each block's input, by its transposed conv's place
    assert len(blocks) == 4
    rates = [1, 12, 120, 960]  # samples a frame at each block's input (upsampled 12, 10, 8, 2)
    frames = [(spans[i][1] - spans[i][0]) / r for i, r in zip(blocks, rates, strict=True)]
    # the frame-rate block still needs most of the context (the first conv and its units see
    # +-4.5 frames), the 300 Hz one ~1 frame of it, the 3 and 24 kHz ones next to nothing
    assert 55 < frames[0] < 66 and 50 < frames[1] < 53 and 50 < frames[2] < 51 and 50 < frames[3] < 50.1
    # and every span lies around the kept frames, each inside the one before it (in frames)
    for i, r in zip(blocks, rates, strict=True):
        lo, hi = spans[i][0] / r, spans[i][1] / r
        assert 0 < lo < 8 and 58 < hi < 66


def test_the_kept_samples_read_no_latent_frame_outside_the_first_span(codec: DACVAE) -> None:
    """What `crop_spans` says the kept samples depend on is all they depend on: the frames before
    the first block's span (itself the input span of the first conv widened by its 3 taps a side)
    and after it can change without changing a kept sample of the whole window's decode."""
    d = codec._channels_last
    a, b = 30 * HOP, 60 * HOP  # a window of 90 frames keeping [30, 60): context to spare
    spans = d.crop_spans(a, b)
    lo, hi = spans[min(spans)]
    lo, hi = lo - 3, hi + 3  # the first conv's 7 taps before the block (in_proj: one)
    assert 20 < lo < 30 and 60 < hi < 70
    z = _z(90, seed=5)
    other = z.clone()
    other[:, :lo] = torch.randn(2, lo, 32)
    other[:, hi:] = torch.randn(2, 90 - hi, 32)
    with torch.no_grad():
        assert torch.equal(d(z)[:, :, a:b], d(other)[:, :, a:b])
        # a frame inside it does change them (the test can tell)
        other[:, lo] += 1.0
        assert not torch.equal(d(z)[:, :, a:b], d(other)[:, :, a:b])


def test_input_spans_of_a_conv_and_a_transposed_conv(codec: DACVAE) -> None:
    steps = codec._channels_last.steps
    up = steps[0][0]  # the first block's transposed conv: kernel 24, stride 12, padding 6
    assert (up.transposed, up.kernel, up.stride, up.padding) == (True, 24, 12, 6)
    # output n = 12 i - 6 + j, j < 24: output 0 reads inputs -1 (zero padding) and 0, output 11
    # inputs 0 and 1
    assert input_span(up, 0, 12) == (-1, 2)
    assert input_span(up, 24, 36) == (1, 4)
    dilated = steps[5][0]  # the third unit's 7-tap conv, dilation 9, padding 27
    assert (dilated.kernel, dilated.dilation, dilated.padding) == (7, 9, 27)
    assert input_span(dilated, 100, 110) == (73, 137)


@pytest.mark.parametrize("stride", [12, 10, 8, 2])
def test_a_crop_keeps_the_blocks_length_a_multiple_of_9_where_it_can(stride: int) -> None:
    s = torch.arange(2 * 90 * 3, dtype=torch.float32).reshape(2, 90, 3)
    start, cut = _crop(s, 10, (30, 61), stride)  # [20, 51) of the tensor: 31 samples
    assert cut.is_contiguous() and torch.equal(cut, s[:, start - 10 : start - 10 + cut.shape[1]])
    assert start == 30 and cut.shape[1] >= 31 and cut.shape[1] * stride % 9 == 0
    # the span's end at the tensor's: the crop grows to the left instead
    start, cut = _crop(s, 0, (60, 95), stride)
    assert start + cut.shape[1] == 90 and start <= 60 and cut.shape[1] * stride % 9 == 0
    # a span over the whole tensor is the tensor itself
    assert _crop(s, 0, (-5, 120), stride) == (0, s)


def test_window_crops_and_the_keys_a_stream_prewarms() -> None:
    assert streaming.window_crop((0, 0, 8, 16)) == (0, C)  # a first window
    assert streaming.window_crop((42, 50, 100, 108)) == (C, C)  # a middle one
    assert streaming.window_crop((84, 130, 150, 150)) == (C, 0)  # a line's last
    assert streaming.window_crop((0, 4, 30, 38)) == (0, C)  # starts within the line's first C frames
    assert streaming.window_crop((0, 0, 20, 20)) == (0, 0)  # a line in one window
    keys = stream_window_keys(50, first_chunk_frames=8, plan_lengths=(40, 66, 116))
    assert keys == [(16, (0, C)), *[(n, crop) for n in (40, 66, 116) for crop in ((C, C), (C, 0))]]
    # every length keeps its place, one too short to crop uncropped
    short = stream_window_keys(50, first_chunk_frames=8, tail_lengths=(C,))
    assert short == [(16, (0, C)), (66, (C, C)), (66, (C, 0)), (C, (0, 0))]


@pytest.mark.parametrize(
    "args",
    [
        {"chunk_frames": 50, "first_chunk_frames": 8, "plan_lengths": (40, 66, 116)},
        {"chunk_frames": 50, "first_chunk_frames": 8, "tail_lengths": (40,)},
        {"chunk_frames": 25, "first_chunk_frames": 8, "growth": 3.0},
        {"chunk_frames": 25, "first_chunk_frames": 4, "plan_lengths": (24, 40)},
    ],
)
def test_every_window_of_a_prewarmed_length_has_its_crops_graph(args: dict) -> None:
    keys = set(stream_window_keys(**args))
    lengths = {n for n, _ in keys}
    tails = args.pop("tail_lengths", ())
    for frames in range(1, 300):
        windows = streaming.chunk_windows(frames, context_frames=C, tail_lengths=tails, **args)
        for w in windows:
            n = w[3] - w[0]
            if n in lengths and streaming.window_crop(w) != (0, 0):  # (0, 0): a line in one window
                assert (n, streaming.window_crop(w)) in keys, (frames, w)


def test_a_batch_of_windows_keeping_different_ends_sounds_as_each_alone(codec: DACVAE) -> None:
    z = _z(40, batch=3, seed=2).transpose(1, 2)
    rows = [
        (z[i : i + 1], a, b)
        for i, (a, b) in enumerate([(8 * HOP, 32 * HOP), (8 * HOP, 40 * HOP), (0, 32 * HOP)])
    ]
    with torch.no_grad():
        pieces = codec.decode_window_batch(rows)
        alone = [codec._decode_frames(zi)[:, :, a:b] for zi, a, b in rows]
    for got, want in zip(pieces, alone, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    # through a graph of the batch's bucket: the rows' widest span keeps both ends ((0, C)...
    # [0, 40)): the whole window's graph; the first two rows alone keep [C, 40): the left-cropped
    cap = FakeCapture(codec._decode_frames)
    codec._graphs = _cache(cap, max_graphs=4, capture_on_use=None)
    try:
        codec._graphs.prewarm([(4, 40, 0, 0), (2, 40, C, 0)])
        with torch.no_grad():
            for batch in (rows, rows[:2]):
                pieces = codec.decode_window_batch(batch)
                for got, want in zip(pieces, alone, strict=False):
                    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        assert cap.keys == [(4, 40, 0, 0), (2, 40, C, 0)]
    finally:
        codec._graphs = None


def test_a_window_replays_the_graph_of_its_crop_or_one_that_keeps_more(codec: DACVAE) -> None:
    cap = FakeCapture(codec._decode_frames)
    codec._graphs = _cache(cap, max_graphs=4, capture_on_use=None)
    try:
        codec._graphs.prewarm([(1, 40, C, 0), (1, 40, 0, 0)])
        z = _z(40, batch=1, seed=3).transpose(1, 2)
        with torch.no_grad():
            want = codec._decode_frames(z)
            replays = []
            for a, b in [(C * HOP, 32 * HOP), (C * HOP, 40 * HOP), (0, 32 * HOP), (12 * HOP, 40 * HOP)]:
                n = len(cap.keys)
                piece = codec._decode_window(z, a, b)
                torch.testing.assert_close(piece, want[:, :, a:b], atol=1e-6, rtol=0)
                replays.append(codec._graphs.held_within(1, 40, codec._crop(40, a, b))[1])
                assert len(cap.keys) == n  # nothing captured on use
        # (C, C) and (C, 0) both replay the left-cropped graph; (0, C) the whole window's
        assert replays == [(C, 0), (C, 0), (0, 0), (C, 0)]
        codec.crop_windows = False  # cropping off: the whole window's graph for every window
        assert codec._crop(40, C * HOP, 32 * HOP) == (0, 0)
    finally:
        codec.crop_windows = True
        codec._graphs = None


def test_prewarm_checks_its_crop(codec: DACVAE) -> None:
    with pytest.raises(InputError, match="no frames"):
        codec.prewarm_graphs([16], crop=(C, C))
    with pytest.raises(InputError, match="crop"):
        codec.prewarm_graphs([16], crop=(-1, 0))


def test_a_synthesizers_windows_sound_the_same_cropped_or_not(irodori_home) -> None:
    """The CPU preset's windows decoded as on a GPU (not its stateful stream), with the codec's
    graphs stood in for: the same audio with cropping on and off (within the windows' rounding)."""
    import numpy as np

    from irodori_speaker.options import SynthesisOptions

    audio = []
    for crop in (True, False):
        synth = window_synth(stream_window_plan=(24, 40))
        synth.codec.crop_windows = crop
        opts = SynthesisOptions(seed=3, steps=2, seconds=2.2)
        audio.append(np.concatenate(list(synth.stream("こんにちは", options=opts))))
    np.testing.assert_allclose(audio[0], audio[1], atol=1e-5)


# --------------------------------------------------------------------------- on a GPU


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_cropped_graphs_replay_the_cropped_eager_decode_exactly(dtype: torch.dtype) -> None:
    """fp16 takes the fused residual units on Hopper (`FUSED_UNIT_WIDTH`), fp32 the unfused ops."""
    codec = _codec("cuda", dtype)
    z = [_z(66, batch=2, seed=s).transpose(1, 2).cuda().to(dtype) for s in range(2)]
    keep = (C * HOP, (66 - C) * HOP)
    with _exact_cudnn(), torch.no_grad():
        want = [codec._decode_frames(zi, keep) for zi in z]
        whole = [codec._decode_frames(zi)[:, :, keep[0] : keep[1]] for zi in z]
        codec.use_graphs(max_graphs=2)
        assert codec.prewarm_graphs([66], batch=2, crop=(C, C)) == 1
        got = [codec._decode_window(zi, *keep) for zi in z]
    assert codec.graph_shapes == [(2, 66, C, C)]
    for g, w, full in zip(got, want, whole, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
        torch.testing.assert_close(g, full, rtol=0, atol=1e-5 if dtype == torch.float32 else 2e-3)
