"""The device owner's queue depth (engine/hardware/owner.py, preset field `owner_queue_depth`).

With a depth, the owner waits for the device once that many of its launches are unfinished there,
so the jobs that arrive meanwhile queue on the host: jobs of one kind then run as one call and an
URGENT job goes ahead of NORMAL ones. There is no GPU here: `_GpuQueue` stands in for CUDA's
events (a mark per launch that finishes when the test says), the owner itself is the real one.
The CUDA test at the end runs the real events (skipped here).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from irodori_speaker.engine.hardware.lock import MODEL_LOCK
from irodori_speaker.engine.hardware.owner import URGENT, DeviceOwner
from irodori_speaker.errors import BackendError


class _Mark:
    def __init__(self, done: bool, broken: bool = False) -> None:
        self.done = threading.Event()
        self.waited = threading.Event()  # the owner waits (or waited) for it
        self.broken = broken
        if done:
            self.done.set()

    def query(self) -> bool:
        return self.done.is_set()

    def synchronize(self) -> None:
        self.waited.set()
        assert self.done.wait(20), "a mark never finished"
        if self.broken:
            raise RuntimeError("device error (stand-in)")


class _GpuQueue:
    """Stands in for the GPU's queue: the owner's launches stay unfinished until `finish()`;
    after `finish(all_later=True)` every later launch finishes at once."""

    def __init__(self, broken: bool = False) -> None:
        self.marks: list[_Mark] = []
        self.instant = False
        self.broken = broken

    def mark(self) -> _Mark:
        m = _Mark(self.instant, self.broken)
        self.marks.append(m)
        return m

    def finish(self, all_later: bool = False) -> None:
        self.instant = self.instant or all_later
        for m in self.marks:
            m.done.set()


def _owner(depth: int, gpu: _GpuQueue) -> DeviceOwner:
    owner = DeviceOwner(queue_depth=depth)
    owner._mark = gpu.mark
    return owner


def _in_thread(fn) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    return t, out


def _first_launch(owner: DeviceOwner) -> None:
    """One job run by the owner thread (queued while the lock is held here, so not inline)."""
    with MODEL_LOCK:
        t, _ = _in_thread(lambda: owner.run(lambda: "first"))
        while owner.queued() < 1:
            threading.Event().wait(0.002)
    t.join(20)


def _wait_queued(owner: DeviceOwner, n: int) -> None:
    for _ in range(10_000):
        if owner.queued() >= n:
            return
        threading.Event().wait(0.002)
    raise AssertionError(f"{owner.queued()} jobs queued, not {n}")


def test_jobs_arriving_while_the_device_is_full_meet_in_one_call():
    """Depth 1: the first launch is unfinished, so the owner waits; three windows of one kind
    arrive meanwhile and run as one call once the device has room (without the bound each would
    have been launched, alone, the moment it came)."""
    gpu = _GpuQueue()
    owner = _owner(1, gpu)
    calls: list[list] = []

    def many(items):
        calls.append(list(items))
        return [x * 10 for x in items]

    _first_launch(owner)
    assert len(gpu.marks) == 1 and not gpu.marks[0].query()
    threads = [_in_thread(lambda x=x: owner.run_batched("w", x, many, limit=4)) for x in (1, 2, 3)]
    _wait_queued(owner, 3)  # the owner holds them: it waits for the device
    # (finishing before the owner began to wait would let it through unheld: a CI failure under load)
    assert gpu.marks[0].waited.wait(20)
    assert calls == []
    gpu.finish(all_later=True)
    for t, _ in threads:
        t.join(20)
    assert [out for _, out in threads] == [[10], [20], [30]]
    assert calls == [[1, 2, 3]], calls
    assert owner.depth_waits >= 1 and owner.depth_wait_s > 0


def test_an_urgent_job_arriving_while_the_device_is_full_goes_first():
    gpu = _GpuQueue()
    owner = _owner(1, gpu)
    order: list[str] = []
    _first_launch(owner)
    normal = _in_thread(lambda: owner.run(lambda: order.append("later window")))
    _wait_queued(owner, 1)
    urgent = _in_thread(lambda: owner.run(lambda: order.append("first audio"), priority=URGENT))
    _wait_queued(owner, 2)
    gpu.finish(all_later=True)
    for t, _ in (normal, urgent):
        t.join(20)
    assert order == ["first audio", "later window"], order


def test_depth_two_lets_two_launches_through_before_waiting():
    gpu = _GpuQueue()
    owner = _owner(2, gpu)
    _first_launch(owner)
    second = _in_thread(lambda: owner.run(lambda: "second"))
    second[0].join(20)
    assert second[1] == ["second"] and len(gpu.marks) == 2  # room for two: no wait yet
    ran: list[int] = []
    third = _in_thread(lambda: owner.run(lambda: ran.append(3)))
    assert gpu.marks[0].waited.wait(10)  # two unfinished: the owner waits for the older ...
    assert ran == [] and len(gpu.marks) == 2  # ... before it launches the third
    gpu.finish(all_later=True)
    third[0].join(20)
    assert ran == [3]


def test_a_job_that_launched_nothing_takes_no_place_in_the_depth():
    """A line sampled meanwhile in another line's batch finds its own job empty
    (synthesis/batching.py): were it marked, the owner would wait with the GPU one job short."""
    gpu = _GpuQueue()
    owner = _owner(2, gpu)
    _first_launch(owner)
    empty = _in_thread(lambda: owner.run(owner.launched_nothing))
    empty[0].join(20)
    assert len(gpu.marks) == 1
    third = _in_thread(lambda: owner.run(lambda: "third"))
    third[0].join(10)
    try:
        assert third[1] == ["third"] and not gpu.marks[0].waited.is_set()
    finally:
        gpu.finish(all_later=True)


def test_without_a_depth_the_owner_marks_and_waits_for_nothing():
    gpu = _GpuQueue()
    owner = _owner(0, gpu)
    _first_launch(owner)
    t, out = _in_thread(lambda: owner.run(lambda: "next"))
    t.join(20)
    assert out == ["next"] and gpu.marks == [] and owner.depth_waits == 0


def test_a_launch_that_fails_on_the_device_does_not_stop_the_owner():
    gpu = _GpuQueue(broken=True)
    owner = _owner(1, gpu)
    _first_launch(owner)
    t, out = _in_thread(lambda: owner.run(lambda: "still served"))
    assert gpu.marks[0].waited.wait(10)
    gpu.finish(all_later=True)
    t.join(20)
    assert out == ["still served"]


@pytest.mark.parametrize("bad", [-1, True, 1.5, "2"])
def test_a_bad_queue_depth_is_refused_before_any_model(bad):
    from irodori_speaker.engine.hardware.presets import select_preset

    with pytest.raises(BackendError, match="owner_queue_depth"):
        select_preset("cpu", owner_queue_depth=bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the owner's real events)")
def test_lines_meeting_on_cuda_with_a_queue_depth_sound_as_alone(irodori_home):
    from irodori_speaker.engine.hardware.owner import DEVICE
    from irodori_speaker.synthesis.loading import load_synthesizer
    from test_batching import TEXTS, opts, together

    synth = load_synthesizer(
        tiny_random=True, backend="cuda", voice_cache_dir=False, max_batch=8, owner_queue_depth=1
    )
    assert DEVICE.queue_depth == 1
    try:
        synth.prewarm()
        jobs = [(TEXTS[i % len(TEXTS)], opts(seed=i + 1, steps=4)) for i in range(8)]
        alone = [synth.synthesize(t, options=o) for t, o in jobs]
        waits = DEVICE.depth_waits
        results = together(synth, jobs)
        for a, b in zip(alone, results):
            assert not isinstance(b, Exception), b
            assert len(a.audio) == len(b.audio)
            np.testing.assert_allclose(b.audio, a.audio, atol=2e-2)  # bf16: rows of another GEMM size
        assert DEVICE.depth_waits > waits  # the owner did wait for the device
    finally:
        DEVICE.queue_depth = 0
