"""The decode on a CUDA stream of its own (the preset's `owner_decode_stream`, `DeviceOwner.decode_stream`).

The decode's jobs ask for the decode stream (checked for every window in tests/test_decode_batch.py);
where the owner keeps one, a line's first decode job waits there for the event recorded after its
sampling, and each stream's copies to the host land through a waiter of their own. The streams
themselves need CUDA: those tests are written and skipped here (run on the device). On the CPU the
copy waiters run with stand-in events (a CUDA event cannot be made here), and a CPU model ignores
the option.
"""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest
import torch

from irodori_speaker.engine.hardware.owner import DeviceOwner, HostCopy
from irodori_speaker.engine.hardware.presets import base_preset
from test_batching import TEXTS, opts
from test_text_batching import together

CUDA = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA streams and events run only on CUDA (run on the H200)"
)


class _Held:
    """A stand-in for a CUDA event recorded after a copy: `synchronize` returns once released."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def synchronize(self) -> None:
        assert self.released.wait(10)


def test_a_copy_of_one_stream_lands_while_an_earlier_one_of_another_is_still_on_its_way():
    owner = DeviceOwner()
    slow, fast = _Held(), _Held()
    held = HostCopy(torch.zeros(2), slow)  # e.g. a sampling's trim frame behind a long launch
    window = HostCopy(torch.ones(2), fast)  # a decode window's samples, queued after it
    owner._copies.add(held, 1)
    owner._copies.add(window, 2)
    fast.released.set()
    assert torch.equal(window.wait(), torch.ones(2))
    assert held.pending  # its own stream's waiter still waits for it
    slow.released.set()
    assert torch.equal(held.wait(), torch.zeros(2))
    for waiter in list(owner._copies._waiters.values()):
        waiter.join(2)
    assert not owner._copies._waiters  # both waiters end once idle


def test_copies_of_one_stream_land_in_launch_order():
    owner = DeviceOwner()
    first, second = _Held(), _Held()
    a, b = HostCopy(torch.zeros(1), first), HostCopy(torch.ones(1), second)
    owner._copies.add(a, 1)
    owner._copies.add(b, 1)
    second.released.set()
    threading.Event().wait(0.1)
    assert b.pending  # behind the first: one stream finishes in launch order
    first.released.set()
    assert b.wait() is not None and not a.pending


@contextlib.contextmanager
def _decode_stream(on: bool):
    """The process-wide switch set for a while (a CUDA Synthesizer of the preset sets it on)."""
    from irodori_speaker.engine.hardware.owner import DEVICE

    was, DEVICE.decode_stream = DEVICE.decode_stream, on
    try:
        yield
    finally:
        DEVICE.decode_stream = was


def test_a_decode_job_runs_under_the_decode_stream_on_the_owner_and_inline_alike():
    """Inline (a line alone), on the owner (lines that meet) and nested in a job, a job asking
    for the decode stream enters it and no other job does: the codec's graphs share one memory
    pool and their inputs, so a window must never replay on another stream (`_on_stream` stands
    in for the CUDA stream here, which cannot run on the CPU)."""
    from irodori_speaker.engine.hardware.owner import DECODE
    from owner_threads import queue_then_release

    owner = DeviceOwner()
    owner.decode_stream = True
    entered: list[tuple[str | None, str]] = []

    @contextlib.contextmanager
    def on_stream(name):
        entered.append((name, threading.current_thread().name))
        yield

    owner._on_stream = on_stream
    assert owner.run(lambda: "alone", stream=DECODE) == "alone"
    assert owner.run(lambda: "encoders") == "encoders"
    assert entered == [(DECODE, "MainThread"), (None, "MainThread")]
    entered.clear()
    nested = lambda o: o.run(lambda: o.run(lambda: 2, stream=DECODE))  # noqa: E731
    jobs = [lambda o: o.run(lambda: 1, stream=DECODE), nested]
    assert sorted(queue_then_release(owner, jobs)) == [1, 2]
    on_owner = [name for name, thread in entered if thread == "irodori-device"]
    assert sorted(on_owner, key=str) == [None, DECODE, DECODE]  # the nested one too


def test_no_preset_has_the_decode_stream():
    """Off since the thirtieth session's measurement (the CUDA preset says why); asked for, it runs."""
    assert not any(base_preset(n).owner_decode_stream for n in ("cuda", "mps", "cpu"))


def test_a_cpu_synthesizer_asked_for_the_decode_stream_leaves_it_off(irodori_home):
    from irodori_speaker.engine.hardware.owner import DEVICE
    from irodori_speaker.synthesis.loading import load_synthesizer

    with _decode_stream(False):
        load_synthesizer(
            tiny_random="v2", backend="cpu", voice_cache_dir=False, max_batch=4, owner_decode_stream=True
        )
        assert DEVICE.decode_stream is False


def test_a_cpu_model_ignores_the_decode_stream(irodori_home):
    from irodori_speaker.synthesis.loading import load_synthesizer

    synth = load_synthesizer(tiny_random="v2", backend="cpu", voice_cache_dir=False, max_batch=4)
    jobs = [(t, opts(seed=i, seconds=1.0)) for i, t in enumerate(TEXTS[:3])]
    with _decode_stream(False):
        one = together(synth, jobs)
    with _decode_stream(True):
        apart = together(synth, jobs)
    for a, b in zip(one, apart):
        assert b.record.extra["sample_batch"] == a.record.extra["sample_batch"] > 1
        np.testing.assert_array_equal(b.audio, a.audio)


@CUDA
def test_on_cuda_lines_that_meet_sound_the_same_with_the_decode_on_its_own_stream(irodori_home):
    """The CUDA preset (graphed windows, windows of lines that meet batched) asked for the decode on a
    stream of its own: every window ran off the default stream, and each line sounds as with one."""
    from irodori_speaker.engine.hardware.owner import DEVICE
    from irodori_speaker.synthesis.loading import load_synthesizer

    synth = load_synthesizer(
        tiny_random="v4.1-mf", backend="cuda", voice_cache_dir=False, max_batch=8, owner_decode_stream=True
    )
    assert DEVICE.decode_stream  # asked for, with lines batched
    synth.prewarm()
    jobs = [(t, opts(seed=i, seconds=1.0 + 0.5 * i)) for i, t in enumerate(TEXTS)]
    with _decode_stream(False):
        one = together(synth, jobs)
    streams: list[bool] = []
    codec = synth.codec
    real = codec.decode_window_stack

    def recorded(windows, dtype=None):
        streams.append(torch.cuda.current_stream() != torch.cuda.default_stream())
        return real(windows, dtype)

    codec.decode_window_stack = recorded
    try:
        with _decode_stream(True):
            apart = together(synth, jobs)
    finally:
        del codec.decode_window_stack
    assert streams and all(streams)
    for a, b in zip(one, apart):
        assert not isinstance(b, Exception), b
        np.testing.assert_allclose(b.audio, a.audio, atol=2e-2)  # windows batched otherwise: fp16 rows


@CUDA
def test_on_cuda_a_decode_job_waits_for_its_lines_sampling_on_the_decode_stream(irodori_home):
    """A latent made on the default stream behind a long launch: the decode stream's job reads it
    whole (it waited for the event after it), and its memory is kept for the decode stream."""
    from irodori_speaker.engine.hardware.owner import DEVICE

    with _decode_stream(True):
        big = torch.randn(4096, 4096, device="cuda")
        latent = torch.zeros(1, 64, 32, device="cuda")
        for _ in range(20):  # keep the default stream busy for a while
            big = big @ big / 64.0
        latent.fill_(1.0)
        ready = DEVICE.ready_mark(latent)
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            DEVICE.consume(latent, ready)
            seen = latent.sum()
        side.synchronize()
        assert seen.item() == latent.numel()


def test_the_codecs_graphs_are_captured_for_the_decode_stream(monkeypatch):
    """A window's graph asks for the decode stream's capture stream (`cuda_graphs.capture`), so its
    cuBLAS workspace is not the sampler's graphs' (they replay at the same time)."""
    from irodori_speaker.engine.codec import graphs

    asked = []

    def recorded(fn, static, pool, *, warm=None, replay="default"):
        asked.append(replay)
        return None, fn(*static)

    monkeypatch.setattr(graphs, "capture", recorded)
    window = graphs.capture_graph(lambda z: z * 2, torch.ones(1, 2, 3), None, ())
    assert asked == ["decode"]
    assert torch.equal(window.static_out, torch.full((1, 2, 3), 2.0))


def _replay_side_by_side(rounds: int = 64) -> tuple[int, int]:
    """Two graphs of a long-K GEMM (cuBLAS splits K, with partial sums in its workspace), the
    second captured for the decode stream, replayed at the same time on the default and a second
    stream `rounds` times: how many of each one's results differ from its replay alone."""
    from irodori_speaker.engine.cuda_graphs import capture

    gen = torch.Generator(device="cuda").manual_seed(0)
    x = [torch.randn(16, 16384, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2)]
    w = [torch.randn(16384, 1024, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2)]
    ga, out_a = capture(lambda v: v @ w[0], [x[0]], torch.cuda.graph_pool_handle())
    gb, out_b = capture(lambda v: v @ w[1], [x[1]], torch.cuda.graph_pool_handle(), replay="decode")
    ga.replay()
    gb.replay()
    alone = [out_a.clone(), out_b.clone()]
    got = [torch.empty(rounds, *out_a.shape, device="cuda", dtype=out_a.dtype) for _ in range(2)]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for i in range(rounds):
        ga.replay()
        got[0][i].copy_(out_a)
        with torch.cuda.stream(side):
            gb.replay()
            got[1][i].copy_(out_b)
    torch.cuda.current_stream().wait_stream(side)
    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + 30
    while not done.query():  # a hang fails here instead of blocking the suite for ever
        assert time.monotonic() < deadline, "the side-by-side replays did not finish in 30 s"
        time.sleep(0.01)
    return tuple(int((g != a).flatten(1).any(1).sum()) for g, a in zip(got, alone))


@CUDA
def test_on_cuda_graphs_for_the_decode_stream_are_captured_apart_and_replay_beside_the_defaults():
    """The codec's graphs get a capture stream (so a cuBLAS workspace) of their own, and graphs
    captured on either replay on the default and a second stream at once, each as it does alone.
    (Captured on one stream, this GEMM pair gave no difference either on an H100, thirtieth
    session: what stalled needed the model's own kernels, measured by concurrency.py (e).)"""
    from irodori_speaker.engine.cuda_graphs import warmup_stream

    assert warmup_stream("decode") != warmup_stream()
    assert warmup_stream("decode") is warmup_stream("decode")  # one a device: one workspace
    assert _replay_side_by_side() == (0, 0)
