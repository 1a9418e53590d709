"""One sampler thread steps every concurrent line (synthesis/stepping.py), through the Synthesizer.

The real tiny model on the CPU, lines from several threads as several Speakers or the server's
streams send them; the model lock is held while the threads start, so their lines really arrive
together. Each line must sound as it does alone, whatever its plan; a cancelled line leaves at the
next step; a line alone keeps its own path; no device-owner thread outlives the lines. Fakes check
the scheduler's own rules: lines start at the step boundary, only as many as the pool holds, the
rest waiting in lane then arrival order; a refused start fails its line alone; a cancelled waiting
line never starts.
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


def test_lines_that_arrive_together_start_together_and_sound_as_alone(synth, monkeypatch):
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


def test_lines_a_fixed_pool_cannot_hold_wait_unstarted_and_sound_as_alone(irodori_home):
    """Step graphs' back-pressure through the Synthesizer: the step batcher's pool fixed at one
    line's rows (as prewarm fixes it on CUDA; here its buckets run eagerly), four lines arriving
    together: the start job holds what fits, the others wait un-started and start as lines leave;
    the pool never grows and each line sounds as it does alone."""
    from irodori_speaker.engine.hardware.memory import guidance_rows
    from irodori_speaker.synthesis.loading import load_synthesizer

    synth = load_synthesizer(
        tiny_random=True, backend="cpu", voice_cache_dir=False, max_batch=8, step_batching=True
    )
    rows = guidance_rows(synth.config)
    batcher = synth._step_batcher()
    batcher.prewarm_graphs(max_rows=rows, top_frames=256, length=256, capture=False, frame_bucket=16)
    generation = batcher.pool.generation
    jobs = [(t, opts(seed=i + 3)) for i, t in enumerate(TEXTS)]
    alone = [synth.synthesize(t, options=o) for t, o in jobs]
    held: list[int] = []
    real = batcher.step

    def step(lines):
        held.append(batcher.pool.held)
        return real(lines)

    batcher.step = step
    results = together(synth, jobs)
    assert all(not isinstance(r, Exception) for r in results), results
    assert held and max(held) == 1  # one line at a time fits: the others waited, un-started
    assert batcher.pool.generation == generation and batcher.graphs.replays > 0
    for a, b in zip(alone, results):
        np.testing.assert_allclose(b.audio, a.audio, atol=1e-5)


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
    waiting = SampleRequest(None, None, None, None)  # handed over, not started yet: no line
    live = SampleRequest(None, None, None, None)
    live_line = type("Line", (), {"tag": live})()
    live.line = live_line
    sched._waiting.append(waiting)
    sched._live.append(live_line)
    boom = RuntimeError("the owner gave up")
    sched.fail(boom)
    assert waiting.done and live.done and waiting.error is boom and live.error is boom
    assert released == [live_line]  # the live line's context slots given back
    assert not sched.has_work()


class _Line:
    """A stepped line's stand-in for the scheduler's own rules: done after `steps` steps."""

    def __init__(self, req, steps: int) -> None:
        self.tag, self.left, self.cancel, self.error = req, steps, req.cancel, None

    def latent(self):
        return f"latent of lane {self.tag.lane}"


def _step(stepped: list[list], on_finish=None):
    """As engine.steps.StepBatcher.step: a cancelled line leaves with Cancelled; each stepped
    line's request is recorded in `stepped`; `on_finish(lines)` sees the lines that finished."""

    def step(lines):
        stepped.append([line.tag for line in lines])
        for line in lines:
            if line.cancel is not None and line.cancel.cancelled:
                line.error = Cancelled("cancelled")
            else:
                line.left -= 1
        finished = [line for line in lines if line.left <= 0 or line.error is not None]
        if on_finish is not None:
            on_finish(finished)
        return finished

    return step


def _requests(*lanes: int) -> list:
    from irodori_speaker.synthesis.batching import SampleRequest

    reqs = [SampleRequest(None, None, None, None) for _ in lanes]
    for req, lane in zip(reqs, lanes):
        req.lane = lane
    return reqs


def test_a_high_lane_line_enters_the_next_step_even_when_the_batch_is_full():
    stepped: list[list] = []
    steps = {}

    def start(reqs):  # every line fits: the pool is not what this test is about
        return [_Line(r, steps=steps[id(r)]) for r in reqs]

    sched = StepScheduler(start, _step(stepped), lambda reqs, c, p: [], 2, lambda lines: None)
    reqs = _requests(1, 1, 2, 0)  # normal, normal, low, then a high line arrives
    token = CancelToken()
    reqs[2].cancel = token
    for req in reqs[:3]:  # handed over, waiting for the owner to start them
        steps[id(req)] = 3
        sched._waiting.append(req)
    sched.iterate()
    assert [r.lane for r in stepped[-1]] == [1, 1]  # the batch full with the two normal lines
    assert all(r.line is not None for r in reqs[:3])  # all three started, the low one left out
    steps[id(reqs[3])] = 2
    sched._waiting.append(reqs[3])
    token.cancel()  # the low line, left out, is cancelled meanwhile
    sched.iterate()
    assert [r.lane for r in stepped[-1][:2]] == [0, 1]  # the high line steps at once
    assert reqs[2].done and isinstance(reqs[2].error, Cancelled)  # left out, cancelled: retired
    while sched.has_work():
        sched.iterate()
    assert all(r.done for r in reqs) and reqs[3].result == "latent of lane 0"
    assert max(len(s) for s in stepped if reqs[2] not in s) <= 2


class _Pool:
    """A step batcher's pool of `capacity` lines for the scheduler's fakes: `start` returns the
    lines of the prefix of the requests that fits, stepping or releasing a finished line frees
    its room."""

    def __init__(self, capacity: int, steps: int = 2) -> None:
        self.capacity, self.steps, self.live, self.most = capacity, steps, 0, 0
        self.calls: list[list] = []  # each start's requests
        self.started: list = []  # the requests started, in order

    def start(self, reqs):
        self.calls.append(list(reqs))
        fit = reqs[: max(0, self.capacity - self.live)]
        self.live += len(fit)
        self.most = max(self.most, self.live)
        self.started += fit
        return [_Line(r, steps=self.steps) for r in fit]

    def free(self, lines) -> None:
        self.live -= len(lines)


def test_only_the_lines_that_fit_start_and_the_rest_wait_in_lane_then_arrival_order():
    pool = _Pool(capacity=2)
    stepped: list[list] = []
    sched = StepScheduler(pool.start, _step(stepped, pool.free), lambda r, c, p: [], 8, pool.free)
    first = _requests(1, 2, 1, 0, 1)  # r0 normal, r1 low, r2 normal, r3 high, r4 normal
    sched._waiting += first
    sched.iterate()  # r3 and r0 fit; r2, r4 and r1 wait
    assert pool.started == [first[3], first[0]]
    assert sched._waiting == [first[2], first[4], first[1]]
    later = _requests(1, 0)  # r5 normal, r6 high arrive meanwhile
    sched._waiting += later
    sched.iterate()  # no room (asked again: new lines came); r3 and r0 finish
    assert pool.calls[-1] == [later[1], first[2], first[4], later[0], first[1]]
    assert pool.started == [first[3], first[0]] and pool.live == 0
    while sched.has_work():
        sched.iterate()
        assert pool.live <= 2 and all(len(s) <= 2 for s in stepped)
    assert pool.most == 2
    assert pool.started == [first[3], first[0], later[1], first[2], first[4], later[0], first[1]]
    assert all(r.done and r.error is None for r in first + later)


def test_a_start_that_finds_no_room_is_not_asked_again_until_a_line_leaves_or_arrives():
    pool = _Pool(capacity=1, steps=3)
    sched = StepScheduler(pool.start, _step([], pool.free), lambda r, c, p: [], 8, pool.free)
    sched._waiting += _requests(1, 1)
    sched.iterate()  # one starts, the other waits
    sched.iterate()
    assert len(pool.calls) == 1  # nothing left, nothing arrived: no room to look for
    sched._waiting += _requests(0)
    sched.iterate()
    assert len(pool.calls) == 2  # a new line: asked again (still no room)
    while sched.has_work():
        sched.iterate()
    assert len(pool.started) == 3 and pool.live == 0


def test_a_start_that_raises_starts_each_line_alone_and_only_the_bad_one_fails():
    pool = _Pool(capacity=2)
    reqs = _requests(1, 1, 1, 1)  # good, bad, good, good: the last one finds no room at first
    bad = reqs[1]
    boom = ValueError("this line's plan is refused")

    def start(group):
        if bad in group:
            raise boom
        return pool.start(group)

    sched = StepScheduler(start, _step([], pool.free), lambda r, c, p: [], 8, pool.free)
    sched._waiting += reqs
    sched.iterate()
    assert bad.done and bad.error is boom  # failed alone
    assert pool.started == [reqs[0], reqs[2]] and sched._waiting == [reqs[3]]  # no room yet
    while sched.has_work():
        sched.iterate()
    assert all(r.done and r.error is None for r in reqs if r is not bad)
    assert pool.started == [reqs[0], reqs[2], reqs[3]]


def test_a_cancelled_waiting_line_ends_with_cancelled_and_never_starts():
    pool = _Pool(capacity=1, steps=2)
    sched = StepScheduler(pool.start, _step([], pool.free), lambda r, c, p: [], 8, pool.free)
    reqs = _requests(1, 1, 1)
    reqs[0].cancel, reqs[2].cancel = CancelToken(), CancelToken()
    reqs[0].cancel.cancel("the viewer left before it started")
    sched._waiting += reqs
    sched.iterate()  # r0 ends at once; r1 starts; r2 waits for room
    assert reqs[0].done and isinstance(reqs[0].error, Cancelled)
    assert pool.started == [reqs[1]] and sched._waiting == [reqs[2]]
    reqs[2].cancel.cancel("the viewer left while it waited for room")
    asked = len(pool.calls)
    while sched.has_work():
        sched.iterate()
    assert isinstance(reqs[2].error, Cancelled) and reqs[1].error is None
    assert not any(reqs[0] in call for call in pool.calls)
    assert not any(reqs[2] in call for call in pool.calls[asked:])  # not asked once cancelled
    assert pool.started == [reqs[1]]  # neither cancelled line was ever started


def test_a_line_that_finds_no_room_with_nothing_live_is_left_waiting():
    """The start must make room then (the pool grows); if it does not, the iteration still ends."""
    calls: list = []

    def start(reqs):
        calls.append(reqs)
        return []

    sched = StepScheduler(start, lambda lines: [], lambda r, c, p: [], 8, lambda lines: None)
    reqs = _requests(1)
    sched._waiting += reqs
    sched.iterate()
    sched.iterate()
    assert sched._waiting == reqs and not reqs[0].done and len(calls) == 2  # asked each round
