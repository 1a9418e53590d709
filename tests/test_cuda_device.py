"""A model on a second GPU: the work that follows the calling thread's current CUDA device (Triton
launches, CUDA graphs, the current stream) runs on the model's (engine/hardware/cuda_device.py).

Here (no GPU) a fake stands in for switching the current device: it records which device each
piece of work saw, per thread as CUDA's is. The real case, a Synthesizer on cuda:1, is the last
test, skipped without two GPUs (run it on nvidia-h100-x2)."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
import torch

from irodori_speaker.engine.hardware import cuda_device, owner
from irodori_speaker.engine.hardware.owner import DeviceOwner
from owner_threads import queue_then_release

_current = threading.local()  # the fake: each thread's current device, 0 unless switched


def _device() -> int:
    return getattr(_current, "index", 0)


@contextlib.contextmanager
def _switch(index):
    if index is None:
        yield
        return
    before, _current.index = _device(), int(index)
    try:
        yield
    finally:
        _current.index = before


@pytest.fixture
def fake_devices(monkeypatch):
    """CUDA in use with a per-thread current device (switched by on_cuda_device's stand-in)."""

    def on_device(device):
        if device is None or (isinstance(device, torch.device) and device.type != "cuda"):
            return contextlib.nullcontext()
        return _switch(device.index if isinstance(device, torch.device) else device)

    monkeypatch.setattr(cuda_device, "on_cuda_device", on_device)
    monkeypatch.setattr(owner, "on_cuda_device", on_device)
    monkeypatch.setattr(owner, "current_cuda_device", _device)


def test_a_stream_runs_each_step_on_its_device_and_closes_there(fake_devices):
    seen, closed = [], []

    def steps():
        try:
            for i in range(3):
                seen.append(_device())
                yield i
        finally:
            closed.append(_device())

    stream = cuda_device.steps_on_device(torch.device("cuda", 1), steps())
    assert next(stream) == 0 and _device() == 0  # between steps the thread's own device is back
    got = []
    thread = threading.Thread(target=lambda: got.append(next(stream)))  # resumed elsewhere
    thread.start()
    thread.join()
    stream.close()  # dropped after two of its three steps
    assert got == [1] and seen == [1, 1] and closed == [1]


def test_a_cpu_stream_is_not_wrapped():
    steps = iter([1, 2])
    assert cuda_device.steps_on_device(torch.device("cpu"), steps) is steps
    assert cuda_device.steps_on_device(None, steps) is steps


def test_the_owner_runs_each_job_on_the_device_it_was_asked_for_on(fake_devices):
    dev = DeviceOwner()

    def ask(index):
        def call(o):
            with _switch(index):  # the line's thread, inside its Synthesizer's device
                return o.run(lambda: (threading.current_thread().name, _device()))

        return call

    results = queue_then_release(dev, [ask(1), ask(0), ask(1)])
    assert results == [("irodori-device", 1), ("irodori-device", 0), ("irodori-device", 1)], results


def test_the_owner_steps_lines_on_the_device_they_were_handed_over_on(fake_devices):
    dev = DeviceOwner()
    done, seen = threading.Event(), []

    class Stepper:
        def has_work(self):
            return not done.is_set()

        def iterate(self):
            seen.append((threading.current_thread().name, _device()))
            done.set()

        def fail(self, error):
            raise AssertionError(error)

    stepper = Stepper()
    with _switch(1):
        dev.wake(stepper)
    assert done.wait(5)
    assert seen == [("irodori-device", 1)]


@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two CUDA devices (a model on cuda:1; run on nvidia-h100-x2)"
)
def test_a_synthesizer_on_the_second_gpu_sounds_as_on_the_first(irodori_home):
    """The CUDA preset (fused kernels, graphs, the owner) on cuda:1: lines alone and lines that
    meet give the audio the same model gives on cuda:0, and nothing was made on cuda:0."""
    from irodori_speaker.synthesis.loading import load_synthesizer
    from test_batching import TEXTS, opts, together

    def load(device):
        return load_synthesizer(
            tiny_random=True, backend="cuda", device=device, voice_cache_dir=False, max_batch=4
        )

    first, second = load("cuda:0"), load("cuda:1")
    for s in (first, second):
        s.prewarm()
    jobs = [(TEXTS[i], opts(seed=i + 1, steps=3)) for i in range(3)]
    want = [first.synthesize(t, options=o).audio for t, o in jobs]
    torch.cuda.reset_peak_memory_stats(0)
    before = torch.cuda.memory_allocated(0)
    alone = [second.synthesize(t, options=o).audio for t, o in jobs]
    met = together(second, jobs)
    for a, b, c in zip(want, alone, met, strict=True):
        np.testing.assert_allclose(b, a, atol=2e-3)
        np.testing.assert_allclose(c.audio, a, atol=2e-3)
    assert torch.cuda.max_memory_allocated(0) == before  # cuda:1's lines made nothing on cuda:0
