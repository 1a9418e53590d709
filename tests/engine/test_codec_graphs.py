"""CUDA-graph window decodes: the window lengths, the capture policy (on the CPU) and, on a GPU, exactness."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch
from codec_windows import eager_graph_windows, window_synth

from irodori_speaker.engine.codec import (
    DACVAE,
    TINY_CODEC_KWARGS,
    codec_from_state_dict,
    graphs,
    random_codec_state_dict,
    stream_window_lengths,
    streaming,
)
from irodori_speaker.errors import InputError

HOP = 1920
ATOL = 1e-5  # the stream tests' tolerance (tests/engine/test_codec.py)

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def _codec(device: str = "cpu", dtype: torch.dtype = torch.float32) -> DACVAE:
    state = random_codec_state_dict(TINY_CODEC_KWARGS, seed=0, watermark=False)
    return codec_from_state_dict(state, TINY_CODEC_KWARGS, device=device, dtype=dtype)


@pytest.fixture(scope="module")
def tiny() -> DACVAE:
    return _codec()


def _latent(frames: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, frames, 32, generator=torch.Generator().manual_seed(seed))


class FakeCapture:
    """A stand-in for the CUDA capture: records keys; its runners reuse one output buffer, like a graph."""

    def __init__(self, decode: Callable[..., torch.Tensor] | None = None, hop: int = HOP) -> None:
        self.decode = decode
        self.hop = hop
        self.keys: list[tuple[int, int, int, int]] = []

    def __call__(self, key: tuple[int, int, int, int]) -> Callable[[torch.Tensor], torch.Tensor]:
        self.keys.append(key)
        out: list[torch.Tensor] = []
        batch, frames, left, right = key

        def run(z: torch.Tensor) -> torch.Tensor:
            assert (z.shape[0], z.shape[-1]) == (batch, frames)
            keep = (left * self.hop, (frames - right) * self.hop)  # as `DACVAE._capture_window`
            audio = self.decode(z, keep) if self.decode is not None else torch.zeros(1)
            if not out:
                out.append(torch.empty_like(audio))
            return out[0].copy_(audio)  # the static buffer: overwritten by the next replay

        return run


def _cache(capture: FakeCapture, max_graphs: int = 3, **kw) -> graphs.GraphCache:
    return graphs.GraphCache(capture, max_graphs, device_types=("cpu",), **kw)


def _z(frames: int, batch: int = 1) -> torch.Tensor:
    return torch.zeros(batch, 32, frames)


# --------------------------------------------------------------------------- window lengths


@pytest.mark.parametrize(
    ("chunk", "context", "first", "want"),
    [
        (25, 8, 8, [16, 41]),
        (25, 8, 2, [10, 35, 41]),  # the second window still starts at frame 0
        (4, 8, None, [12, 16, 20]),
        (50, 8, None, [58, 66]),
        (5, 0, 3, [3, 5]),
    ],
)
def test_stream_window_lengths_examples(chunk: int, context: int, first: int | None, want: list[int]) -> None:
    assert stream_window_lengths(chunk, context, first) == want


@pytest.mark.parametrize(("chunk", "context", "first"), [(1, 8, None), (3, 8, 1), (7, 4, 20), (25, 8, 8)])
def test_stream_window_lengths_cover_every_window_but_the_last(
    chunk: int, context: int, first: int | None
) -> None:
    lengths = set(stream_window_lengths(chunk, context, first))
    for frames in range(1, 120):
        windows = streaming.chunk_windows(frames, chunk, context, first)
        for lo, _, end, hi in windows[:-1]:
            if end + context <= frames:  # a window the line's end does not cut
                assert hi - lo in lengths, (frames, lo, hi)


def test_stream_window_lengths_checks_arguments() -> None:
    with pytest.raises(InputError, match="chunk_frames"):
        stream_window_lengths(0)
    with pytest.raises(InputError, match="first_chunk_frames"):
        stream_window_lengths(5, first_chunk_frames=0)


# --------------------------------------------------------------------------- capture policy (no CUDA)


def test_a_shape_is_captured_on_its_second_use() -> None:
    cap = FakeCapture()
    cache = _cache(cap)
    assert cache.runner(_z(10)) is None and cap.keys == []  # first use: eager
    run = cache.runner(_z(10))
    assert run is not None and cap.keys == [(1, 10, 0, 0)]
    assert cache.runner(_z(10)) is run and cap.keys == [(1, 10, 0, 0)]  # replayed, not captured again
    assert cache.runner(_z(10, batch=2)) is None  # the batch is part of the shape


def test_capture_on_use_max_frames_and_device() -> None:
    cap = FakeCapture()
    at_once = _cache(cap, capture_on_use=1, max_frames=20)
    assert at_once.runner(_z(20)) is not None
    assert all(at_once.runner(_z(21)) is None for _ in range(3))  # longer windows stay eager
    never = _cache(cap, capture_on_use=None)
    assert all(never.runner(_z(5)) is None for _ in range(3))
    cuda_only = graphs.GraphCache(cap, 3, capture_on_use=1)
    assert cuda_only.runner(_z(5)) is None  # a CPU tensor: eager
    assert cap.keys == [(1, 20, 0, 0)]


def test_lru_eviction_spares_prewarmed_shapes() -> None:
    cap = FakeCapture()
    cache = _cache(cap, max_graphs=3, capture_on_use=1)
    assert cache.prewarm([(1, 16, 0, 0), (1, 41, 0, 0), (1, 41, 0, 0)]) == 2
    for frames in (9, 10, 11, 12, 9):
        assert cache.runner(_z(frames)) is not None
        assert len(cache.keys()) <= 3
        assert {(1, 16, 0, 0), (1, 41, 0, 0)} <= set(cache.keys())
    # one slot left for the rest: each new shape evicted the last one
    assert cap.keys == [
        (1, 16, 0, 0),
        (1, 41, 0, 0),
        (1, 9, 0, 0),
        (1, 10, 0, 0),
        (1, 11, 0, 0),
        (1, 12, 0, 0),
        (1, 9, 0, 0),
    ]
    assert cache.captures == 7
    assert cache.keys() == [(1, 16, 0, 0), (1, 41, 0, 0), (1, 9, 0, 0)]
    cache.runner(_z(16))  # a replay refreshes its place in the LRU order
    assert cache.keys() == [(1, 41, 0, 0), (1, 9, 0, 0), (1, 16, 0, 0)]


def test_prewarm_pins_without_capturing_twice_and_refuses_too_many() -> None:
    cap = FakeCapture()
    cache = _cache(cap, max_graphs=2, capture_on_use=1)
    cache.runner(_z(7))
    assert cache.prewarm([(1, 7, 0, 0)]) == 0  # already held: pinned, not captured again
    assert cache.prewarm([(1, 8, 0, 0)]) == 1
    with pytest.raises(InputError, match="max_graphs=2"):
        cache.prewarm([(1, 9, 0, 0)])
    assert cap.keys == [(1, 7, 0, 0), (1, 8, 0, 0)]
    assert all(cache.runner(_z(9)) is None for _ in range(3))  # every slot pinned: eager
    assert cache.keys() == [(1, 7, 0, 0), (1, 8, 0, 0)]


def test_uses_of_ungraphed_shapes_are_forgotten_oldest_first() -> None:
    cap = FakeCapture()
    cache = _cache(cap, max_graphs=2)
    n = graphs.MAX_TRACKED_SHAPES + 1
    for frames in range(1, n + 1):
        assert cache.runner(_z(frames)) is None
    assert len(cache._uses) == graphs.MAX_TRACKED_SHAPES
    assert cache.runner(_z(n)) is not None  # its first use is remembered
    assert cache.runner(_z(1)) is None  # its first use was forgotten
    assert cap.keys == [(1, n, 0, 0)]


def test_clear_drops_graphs_pins_and_counts() -> None:
    cap = FakeCapture()
    cache = _cache(cap)
    cache.prewarm([(1, 4, 0, 0)])
    cache.runner(_z(5))
    cache.clear()
    assert cache.keys() == [] and not cache._pinned and not cache._uses


# --------------------------------------------------------------------------- the codec's graph path (no CUDA)


def _with_fake_graphs(codec: DACVAE, max_graphs: int = 3, **kw) -> FakeCapture:
    cap = FakeCapture(codec._decode_frames)
    codec._graphs = _cache(cap, max_graphs=max_graphs, **kw)
    return cap


def test_stream_through_graph_runners_equals_eager() -> None:
    codec = _codec()
    lat = _latent(23, seed=4)
    # the windows graphs decode (the last one stretched left, unlike an eager stream's), eagerly
    assert streaming.chunk_windows(23, 5, 8, 2) != streaming.chunk_windows(23, 5, 8, 2, stretch_last=False)
    want = eager_graph_windows(codec, lat, 5, 2)
    cap = _with_fake_graphs(codec, max_graphs=3, capture_on_use=1)
    got = list(codec.decode_stream(lat, 5, first_chunk_frames=2))
    # windows of 10, 15, 20, 19, 14 and 21 frames through 3 slots (the last one reaches back to
    # the middle length, 5 + 2 * 8)
    assert cap.keys == [(2, n, 0, 0) for n in (10, 15, 20, 19, 14, 21)]
    assert codec.graph_shapes == [(2, 19, 0, 0), (2, 14, 0, 0), (2, 21, 0, 0)]
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.is_contiguous() and torch.equal(a, b)  # copies: later replays did not overwrite them
    torch.testing.assert_close(codec.decode_chunked(lat, 5), codec.decode(lat), atol=ATOL, rtol=0)


def test_decode_through_a_graph_runner_is_a_copy() -> None:
    codec = _codec()
    lat = _latent(6, seed=1)
    want = codec.decode(lat)
    _with_fake_graphs(codec, capture_on_use=1)
    first = codec.decode(lat)
    codec.decode(_latent(6, seed=2))  # the same graph, other input
    assert codec.graph_shapes == [(2, 6, 0, 0)]
    assert torch.equal(first, want)


def test_moving_or_casting_the_codec_drops_its_graphs() -> None:
    codec = _codec()
    _with_fake_graphs(codec, capture_on_use=1)
    codec.decode(_latent(3))
    assert codec.graph_shapes == [(2, 3, 0, 0)]
    codec.float()
    assert codec.graph_shapes == [] and codec._graphs is not None  # still enabled
    codec.decode(_latent(3))
    assert codec.graph_shapes == [(2, 3, 0, 0)]


def test_use_graphs_is_a_noop_on_the_cpu(tiny: DACVAE) -> None:
    lat = _latent(4, seed=3)
    want = tiny.decode(lat)
    try:
        tiny.use_graphs(max_graphs=2)
        assert tiny.prewarm_graphs([12, 4], batch=2) == 0
        for _ in range(3):
            assert torch.equal(tiny.decode(lat), want)
        assert tiny.graph_shapes == []
    finally:
        tiny.use_graphs(False)
    assert tiny._graphs is None and tiny.prewarm_graphs([4]) == 0


def test_graph_arguments_are_checked(tiny: DACVAE) -> None:
    for kwargs, name in [
        ({"max_graphs": 0}, "max_graphs"),
        ({"capture_on_use": 0}, "capture_on_use"),
        ({"max_frames": True}, "max_frames"),
    ]:
        with pytest.raises(InputError, match=name):
            tiny.use_graphs(**kwargs)
    with pytest.raises(InputError, match="window length"):
        tiny.prewarm_graphs([4, 0])
    with pytest.raises(InputError, match="batch"):
        tiny.prewarm_graphs([4], batch=0)


# --------------------------------------------------------------------------- on a GPU


def _exact_cudnn() -> contextlib.AbstractContextManager:
    # Fixed, deterministic cuDNN algorithms and no TF32: the eager and the graphed decode of a shape
    # then run the same kernels, and windowed fp32 decodes stay within 1e-5 of the full decode.
    return torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True, allow_tf32=False)


def _gpu_codec(kind: str) -> DACVAE:
    from irodori_speaker.engine.quant.codec import quantize_codec

    dtype = torch.float32 if kind == "fp32" else torch.float16
    codec = _codec("cuda", dtype)
    if kind == "int4":
        quantize_codec(codec)
    return codec


@needs_gpu
@pytest.mark.parametrize("kind", ["fp16", "int4", "fp32"])
def test_graph_decode_equals_eager_exactly(kind: str) -> None:
    codec = _gpu_codec(kind)
    lats = [_latent(41, seed=s).cuda() for s in range(3)]
    with _exact_cudnn():
        want = [codec.decode(lat) for lat in lats]
        codec.use_graphs(max_graphs=2)
        assert codec.prewarm_graphs([41], batch=2) == 1
        got = [codec.decode(lat) for lat in lats]
    assert codec.graph_shapes == [(2, 41, 0, 0)] and codec._graphs.captures == 1
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert got[0].data_ptr() != got[1].data_ptr()  # copies, not the graph's output buffer


@needs_gpu
@pytest.mark.parametrize("kind", ["fp16", "int4"])
def test_graph_stream_equals_eager_stream_exactly(kind: str) -> None:
    codec = _gpu_codec(kind)
    lines = [_latent(n, seed=n).cuda() for n in (40, 57, 40, 33)]
    with _exact_cudnn(), torch.inference_mode():  # as the synthesizer calls it
        want = [torch.cat(eager_graph_windows(codec, lat, 25, 8), -1) for lat in lines]
        codec.use_graphs(max_graphs=3)
        codec.prewarm_graphs(stream_window_lengths(25, first_chunk_frames=8), batch=2)
        got = [torch.cat(list(codec.decode_stream(lat, 25, first_chunk_frames=8)), -1) for lat in lines]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # windows: 16 and 41 (prewarmed); the lines' other windows are 40 + 40 (the last one stretched
    # left to 40, all the line has), 41 + 41 (stretched to the middle length), 40 + 40, and 33;
    # 40 recurs within the first line and is captured there, in the one slot left; 33 stays eager
    assert codec._graphs.captures == 3
    assert set(codec.graph_shapes) == {(2, 16, 0, 0), (2, 41, 0, 0), (2, 40, 0, 0)}


@needs_gpu
def test_graph_stream_equals_decode_and_stays_within_max_graphs() -> None:
    codec = _gpu_codec("fp32")
    codec.use_graphs(max_graphs=6, capture_on_use=1)
    with _exact_cudnn():
        codec.prewarm_graphs(stream_window_lengths(5, first_chunk_frames=2), batch=2)
        for frames in (1, 9, 17, 23, 30, 23):
            lat = _latent(frames, seed=frames).cuda()
            pieces = list(codec.decode_stream(lat, 5, first_chunk_frames=2))
            torch.testing.assert_close(torch.cat(pieces, -1), codec.decode(lat), atol=ATOL, rtol=0)
            torch.testing.assert_close(codec.decode_chunked(lat, 7), codec.decode(lat), atol=ATOL, rtol=0)
            assert len(codec.graph_shapes) <= 6
    assert codec._graphs.captures > 6  # lazily captured shapes were evicted, the prewarmed ones kept
    assert {(2, n, 0, 0) for n in stream_window_lengths(5, first_chunk_frames=2)} <= set(codec.graph_shapes)


def test_a_long_lines_windows_after_the_first_all_have_the_middle_length() -> None:
    """So a stream of any long line replays two graphs (first and middle) and decodes nothing eagerly."""
    for frames in (66, 67, 100, 190, 751):
        windows = streaming.chunk_windows(frames, 50, 8, 8)
        assert [hi - lo for lo, _, _, hi in windows[1:]] == [66] * (len(windows) - 1)
        assert all(start - lo >= 8 and (hi - end >= 8 or hi == frames) for lo, start, end, hi in windows[1:])
        assert sorted(set(hi - lo for lo, _, _, hi in windows)) == sorted(stream_window_lengths(50, 8, 8))


def test_growing_chunks_and_their_window_lengths() -> None:
    windows = streaming.chunk_windows(200, 50, 8, 8, growth=3.0)
    assert [end - start for _, start, end, _ in windows] == [8, 24, 50, 50, 50, 18]
    assert stream_window_lengths(50, 8, 8, 3.0) == [16, 40, 66]
    assert stream_window_lengths(50, 8, 8) == [16, 66]
    # without graphs the last window keeps its own context; with them it reaches back to 66
    assert streaming.chunk_windows(200, 50, 8, 8, growth=3.0, stretch_last=False)[-1] == (174, 182, 200, 200)
    assert streaming.chunk_windows(200, 50, 8, 8, growth=3.0)[-1] == (134, 182, 200, 200)
    for bad in (0.5, "3", True):
        with pytest.raises(InputError, match="growth"):
            streaming.chunk_windows(10, 5, 8, 2, growth=bad)


@pytest.mark.parametrize(("chunk", "first", "growth"), [(5, 1, 2.0), (7, 2, 1.5), (50, 8, 3.0)])
def test_growing_stream_lengths_cover_every_window_but_the_last(
    chunk: int, first: int, growth: float
) -> None:
    lengths = set(stream_window_lengths(chunk, 8, first, growth))
    for frames in range(1, 160):
        for lo, _, end, hi in streaming.chunk_windows(frames, chunk, 8, first, growth=growth)[:-1]:
            if end + 8 <= frames:
                assert hi - lo in lengths, (frames, lo, hi)


def test_a_growing_stream_joins_to_the_one_pass_decode() -> None:
    codec = _codec()
    lat = _latent(41, seed=5)
    parts = list(codec.decode_stream(lat, 9, first_chunk_frames=2, growth=2.0))
    assert [p.shape[-1] // codec.hop_length for p in parts] == [2, 4, 8, 9, 9, 9]
    torch.testing.assert_close(torch.cat(parts, -1), codec.decode(lat), atol=ATOL, rtol=0)


def test_a_short_lines_last_window_starts_before_frame_0_at_the_middle_length() -> None:
    """A line shorter than a middle window: its last window is padded on the left to the middle
    length (a graph replay, batched with other lines' middle windows) once its kept frames start
    at least the context in; before that, or without graphs, it keeps its own length."""
    for frames in (9, 17, 37, 58):
        *_, (lo, start, end, hi) = streaming.chunk_windows(frames, 50, 8, 8)
        assert (start, end, hi, hi - lo) == (8, frames, frames, 66) and lo < 0
        assert streaming.chunk_windows(frames, 50, 8, 8, stretch_last=False)[-1] == (0, 8, frames, frames)
    assert streaming.chunk_windows(65, 50, 8, 8)[-1] == (-1, 58, 65, 65)  # its third window
    assert streaming.chunk_windows(8, 50, 8, 8) == [(0, 0, 8, 8)]  # its only window is its first
    # a first chunk shorter than the context: the kept frames' samples reach frame 0's edge
    assert streaming.chunk_windows(20, 50, 8, 2)[-1][0] == 0


@pytest.mark.parametrize("frames", [9, 23, 37])
def test_what_stands_before_frame_0_changes_no_kept_sample(frames: int) -> None:
    """The padded last window of a short line joins the stream to the one-pass decode; random
    frames in place of the zeros give the same kept samples (they depend on frames >= 0 only)."""
    codec = _codec()
    lat = _latent(frames, seed=frames)
    windows = streaming.chunk_windows(frames, 50, 8, 8)
    assert windows[-1][0] < 0
    want = codec.decode(lat)
    torch.testing.assert_close(torch.cat(eager_graph_windows(codec, lat, 50, 8), -1), want, atol=ATOL, rtol=0)
    z = codec._check_latent(lat)
    lo, start, end, hi = windows[-1]
    noise = torch.randn(z.shape[0], z.shape[1], -lo, generator=torch.Generator().manual_seed(1))
    hop = codec.hop_length
    got = codec._decode_window(torch.cat((noise, z[..., :hi]), -1), (start - lo) * hop, (end - lo) * hop)
    torch.testing.assert_close(got, want[..., start * hop : end * hop], atol=ATOL, rtol=0)


def test_a_lines_last_window_takes_the_shortest_tail_length_that_holds_it() -> None:
    """`tail_lengths`: the last window is stretched only as far as the shortest given length that
    holds it (the middle length where none does); every other window is as before."""
    for frames in range(9, 240):
        plain = streaming.chunk_windows(frames, 50, 8, 8)
        tails = streaming.chunk_windows(frames, 50, 8, 8, tail_lengths=(40, 24))
        assert tails[:-1] == plain[:-1]
        own = streaming.chunk_windows(frames, 50, 8, 8, stretch_last=False)[-1]
        lo, start, end, hi = tails[-1]
        need = own[3] - own[0]
        if len(tails) > 1:
            want = 24 if need <= 24 else 40 if need <= 40 else 66
            assert (start, end, hi) == own[1:] and hi - lo == (want if start >= 8 else hi - max(0, hi - want))
            assert lo <= start - 8 or lo == 0  # the context it needs, or all the frames there are
        else:
            assert tails == plain


@pytest.mark.parametrize("frames", [9, 23, 37, 75, 121])
def test_tail_windows_join_to_the_one_pass_decode(frames: int) -> None:
    codec = _codec()
    lat = _latent(frames, seed=frames)
    z = codec._check_latent(lat)
    windows = streaming.chunk_windows(frames, 50, 8, 8, tail_lengths=(40,))
    parts = list(streaming.decode_windows(codec._decode_window, z, windows, codec.hop_length, None))
    torch.testing.assert_close(torch.cat(parts, -1), codec.decode(lat), atol=ATOL, rtol=0)


def test_a_synthesizers_tail_windows_are_graphed_and_sound_the_same(irodori_home) -> None:
    """`preset.stream_tail_windows`: prewarm's window lengths take them, a streamed line's last
    window replays one (the codec's graphs stood in for on the CPU) and the audio is unchanged."""
    import numpy as np

    from irodori_speaker.options import SynthesisOptions

    audio, keys = [], []
    for tails in ((), (40,)):  # 40: any last window after the first (at most 25 + 8 frames)
        synth = window_synth(stream_tail_windows=tails)
        assert synth._window_lengths() == [16, 41, *tails]  # the CPU preset's windows: 8, then 25
        cap = FakeCapture(synth.codec._decode_frames)
        synth.codec._graphs = _cache(cap, max_graphs=8, capture_on_use=1)
        opts = SynthesisOptions(seed=3, steps=2, seconds=2.2)
        audio.append(np.concatenate(list(synth.stream("こんにちは", options=opts))))
        keys.append({k[1] for k in cap.keys})
    assert 40 not in keys[0] and 40 in keys[1], keys
    np.testing.assert_allclose(audio[1], audio[0], atol=1e-5)
