"""One sampler thread steps every concurrent line (synthesis/stepping.py), through the Synthesizer.

The real tiny model on the CPU, lines from several threads as several Speakers or the server's
streams send them; the model lock is held while the threads start, so their lines really arrive
together. Each line must sound as it does alone, whatever its plan; a cancelled line leaves at the
next step; a line alone keeps its own path; no device-owner thread outlives the lines.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from irodori_speaker.cancel import CancelToken
from irodori_speaker.engine.hardware.owner import DEVICE
from irodori_speaker.errors import Cancelled
from irodori_speaker.synthesis.stepping import StepScheduler
from owner_threads import irodori_threads
from test_batching import TEXTS, opts, together


@pytest.fixture(scope="module")
def synth(irodori_home):
    from irodori_speaker.synthesis.loading import load_synthesizer

    s = load_synthesizer(
        tiny_random=True, backend="cpu", voice_cache_dir=False, max_batch=8, step_batching=True
    )
    assert isinstance(s._batcher, StepScheduler)
    return s


def _no_sampler_thread() -> bool:
    """The device owner's threads (which step the lines) have ended with the lines."""
    return not irodori_threads()


def test_concurrent_lines_of_different_plans_step_together_and_sound_as_alone(synth):
    jobs = [
        (TEXTS[0], opts(seed=1, steps=4)),
        (TEXTS[1], opts(seed=2, steps=6, schedule="sway")),
        (TEXTS[2], opts(seed=3, steps=3, guidance="alternating")),
        (TEXTS[3], opts(seed=4, steps=5, cfg_scale_text=0.0)),
    ]
    alone = [synth.synthesize(t, options=o) for t, o in jobs]
    assert all(r.record.extra["sample_batch"] == 1 for r in alone)
    before = dict(synth._batcher.batches)
    results = together(synth, jobs)
    for a, b in zip(alone, results):
        assert not isinstance(b, Exception), b
        assert len(a.audio) == len(b.audio)
        np.testing.assert_allclose(b.audio, a.audio, atol=1e-5)
    stepped = {n: c - before.get(n, 0) for n, c in synth._batcher.batches.items()}
    assert any(n >= 2 and c > 0 for n, c in stepped.items())  # lines really shared steps
    assert max(r.record.extra["sample_batch"] for r in results) >= 2
    assert _no_sampler_thread()


def _hold_the_owner_at_the_first_start(monkeypatch, lines: int) -> None:
    """When the first line hands its start to the device owner, the model lock is taken by a
    holder thread (so no round runs) until `lines` jobs are queued or a second has passed: the
    lines' starts meet on the owner however the threads are scheduled (a loaded CI machine)."""
    from irodori_speaker.engine.hardware.lock import MODEL_LOCK

    asked, held = threading.Event(), threading.Event()

    def holder() -> None:
        asked.wait(30)
        with MODEL_LOCK:
            held.set()
            deadline = time.monotonic() + 1.0
            while DEVICE.queued() < lines and time.monotonic() < deadline:
                time.sleep(0.002)

    threading.Thread(target=holder, daemon=True).start()
    real = DEVICE.run_batched

    def run_batched(key, *args, **kwargs):
        if key[1] == "start" and not held.is_set():
            asked.set()
            held.wait(30)
        return real(key, *args, **kwargs)

    monkeypatch.setattr(DEVICE, "run_batched", run_batched)


def test_lines_that_arrive_together_start_in_one_job_and_sound_as_alone(synth, monkeypatch):
    from irodori_speaker.engine.steps import StepBatcher

    jobs = [(t, opts(seed=i + 7)) for i, t in enumerate(TEXTS)]
    alone = [synth.synthesize(t, options=o) for t, o in jobs]
    sizes: list[int] = []
    real = StepBatcher.start_many

    def start_many(self, joining):
        sizes.append(len(joining))
        return real(self, joining)

    monkeypatch.setattr(StepBatcher, "start_many", start_many)
    _hold_the_owner_at_the_first_start(monkeypatch, len(jobs))
    results = together(synth, jobs)
    assert all(not isinstance(r, Exception) for r in results), results
    assert max(sizes) >= 2, sizes  # their starts (context K/V) in one job
    for a, b in zip(alone, results):
        np.testing.assert_allclose(b.audio, a.audio, atol=1e-5)


def test_a_cancelled_line_leaves_at_the_next_step_and_the_others_finish(synth):
    tokens = [CancelToken() for _ in TEXTS]

    def cancel_line_2(done, total):
        if done >= 1:
            tokens[2].cancel("the viewer left")

    jobs = [(t, opts(seed=i, steps=6)) for i, t in enumerate(TEXTS)]
    results = together(synth, jobs, tokens=tokens, progress={2: cancel_line_2})
    assert isinstance(results[2], Cancelled)
    assert synth._steps.pool.held == 0  # the cancelled line's context slots were given back too
    for i in (0, 1, 3):
        np.testing.assert_allclose(
            results[i].audio, synth.synthesize(jobs[i][0], options=jobs[i][1]).audio, atol=1e-5
        )
    assert _no_sampler_thread()


def test_more_lines_than_max_batch_wait_for_a_free_row(synth):
    sched = synth._batcher
    sched.max_batch, before = 2, sched.max_batch
    try:
        jobs = [(t, opts(seed=i)) for i, t in enumerate(TEXTS)]
        results = together(synth, jobs)
    finally:
        sched.max_batch = before
    assert all(not isinstance(r, Exception) for r in results)
    assert sched.peak_lines >= 2 and synth._steps.pool.held == 0
    for (t, o), r in zip(jobs, results):
        np.testing.assert_allclose(r.audio, synth.synthesize(t, options=o).audio, atol=1e-5)


def test_a_bad_line_fails_alone(synth):
    """A line whose plan is refused when it joins fails on its own; the others are served."""
    jobs = [(TEXTS[0], opts(seed=1)), (TEXTS[1], opts(seed=2, sway_coeff=5.0, schedule="sway"))]
    results = together(synth, jobs)
    assert not isinstance(results[0], Exception)
    assert isinstance(results[1], Exception) and "sway" in str(results[1])
    assert _no_sampler_thread()


def test_fail_ends_every_waiting_and_live_line_with_the_error():
    from irodori_speaker.synthesis.batching import SampleRequest

    released: list = []
    sched = StepScheduler(lambda reqs: [], lambda lines: [], lambda reqs, c, p: [], 4, released.extend)
    waiting = SampleRequest(None, None, None, None)
    live = SampleRequest(None, None, None, None)
    live_line = type("Line", (), {"tag": live})()
    waiting.line = type("Line", (), {"tag": waiting})()  # started, not yet stepped
    sched._waiting.append(waiting)
    sched._live.append(live_line)
    boom = RuntimeError("the owner gave up")
    sched.fail(boom)
    assert waiting.done and live.done and waiting.error is boom and live.error is boom
    assert released == [waiting.line, live_line]  # their context slots given back
    assert not sched.has_work()


class _Line:
    """A stepped line's stand-in for the scheduler's own rules: done after `steps` steps."""

    def __init__(self, req, steps: int) -> None:
        self.tag, self.left, self.cancel, self.error = req, steps, req.cancel, None

    def latent(self):
        return f"latent of lane {self.tag.lane}"


def test_a_high_lane_line_enters_the_next_step_even_when_the_batch_is_full():
    from irodori_speaker.synthesis.batching import SampleRequest

    stepped: list[list[int]] = []

    def step(lines):  # as engine.steps.StepBatcher.step: a cancelled line leaves with Cancelled
        stepped.append([line.tag.lane for line in lines])
        for line in lines:
            if line.cancel is not None and line.cancel.cancelled:
                line.error = Cancelled("cancelled")
            else:
                line.left -= 1
        return [line for line in lines if line.left <= 0 or line.error is not None]

    sched = StepScheduler(lambda reqs: [], step, lambda reqs, c, p: [], 2, lambda lines: None)
    reqs = [SampleRequest(None, None, None, None) for _ in range(4)]
    for req, lane in zip(reqs, (1, 1, 2, 0)):  # normal, normal, low, then a high line arrives
        req.lane = lane
    token = CancelToken()
    reqs[2].cancel = token
    for req in reqs[:3]:  # started (the owner's job did it) and waiting for a step
        req.line = _Line(req, steps=3)
        sched._waiting.append(req)
    sched.iterate()
    assert stepped[-1] == [1, 1]  # the batch full with the two normal lines
    reqs[3].line = _Line(reqs[3], steps=2)
    sched._waiting.append(reqs[3])
    token.cancel()  # the low line, left out, is cancelled meanwhile
    sched.iterate()
    assert stepped[-1][:2] == [0, 1]  # the high line steps at once; one normal line waits
    assert reqs[2].done and isinstance(reqs[2].error, Cancelled)  # left out, cancelled: retired
    while sched.has_work():
        sched.iterate()
    assert all(r.done for r in reqs) and reqs[3].result == "latent of lane 0"
    assert max(len(s) for s in stepped if 2 not in s) <= 2
