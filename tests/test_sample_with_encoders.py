"""A line whose length is known before its encoders is sampled in their job (the preset's
`sample_with_encoders`, `SampleBatcher.sample_now`): the lines encoded in one call sample as one
batch straight after it, with no round trip to their threads between.

The synthesizer part runs the real tiny model on the CPU from several threads, as the server's
streams do (its lines ask seconds, or leave the length to the duration predictor, which must be
read first and so takes the usual way). `SampleBatcher.sample_now`'s own rules run with a run
function that records its batches.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from irodori_speaker.cancel import CancelToken
from irodori_speaker.errors import Cancelled
from irodori_speaker.synthesis.batching import SampleBatcher, SampleRequest
from test_batching import TEXTS, opts
from test_text_batching import together  # every line queued at its encoders before any call runs


def _load(kind: str):
    from irodori_speaker.synthesis.loading import load_synthesizer

    return load_synthesizer(
        tiny_random=kind, backend="cpu", voice_cache_dir=False, max_batch=8, max_padding=100.0,
        step_batching=False, sample_with_encoders=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def synth(irodori_home):
    """The default family (v4.1-MF): a duration predictor, which a line of asked seconds skips."""
    return _load("v4.1-mf")


@pytest.fixture
def leads(synth, monkeypatch):
    """The sampling jobs a line's own thread led (`SampleBatcher._lead`), counted."""
    batcher = synth._batcher
    seen: list[int] = []
    lead = batcher._lead

    def counted(req):
        seen.append(1)
        return lead(req)

    monkeypatch.setattr(batcher, "_lead", counted)
    batcher.batches.clear()
    return seen


def test_lines_of_asked_seconds_sample_in_their_encoders_job_and_sound_as_alone(synth, leads):
    jobs = [(t, opts(seed=i, seconds=1.0 + 0.25 * i)) for i, t in enumerate(TEXTS)]
    batcher = synth._batcher
    alone = _alone(synth, jobs)
    assert "sampled_with_encoders" not in alone[0].record.extra
    assert batcher.batches == {1: len(TEXTS)} and len(leads) == len(TEXTS)
    batched = together(synth, jobs)
    for a, b in zip(alone, batched):
        assert b.record.extra["sampled_with_encoders"] is True
        assert b.record.extra["sample_batch"] == len(TEXTS)
        assert len(a.audio) == len(b.audio)  # each line keeps its own length
        np.testing.assert_allclose(b.audio, a.audio, atol=1e-5)
    # one batch of all four, led by no line's thread: the encoders' job sampled it
    assert batcher.batches == {1: len(TEXTS), len(TEXTS): 1} and len(leads) == len(TEXTS)
    assert batcher._waiting == [] and batcher._preparing == 0


def _alone(synth, jobs):
    """Each line alone, the usual way (each line's thread leads its own sampling)."""
    synth._batcher.with_encoders = False
    try:
        return [synth.synthesize(t, options=o) for t, o in jobs]
    finally:
        synth._batcher.with_encoders = True


def test_a_line_the_predictor_gives_its_length_samples_beside_lines_of_asked_seconds(synth, leads):
    """On the CPU the predictor's length is on the host when the encoders' job ends: such lines
    sample in that job with the lines of asked seconds, as one batch."""
    jobs = [(t, opts(seed=i, seconds=1.5 if i % 2 else None)) for i, t in enumerate(TEXTS)]
    alone = _alone(synth, jobs)
    before = len(leads)
    batched = together(synth, jobs)
    for i, (a, b) in enumerate(zip(alone, batched)):
        assert b.record.extra["sampled_with_encoders"] is True
        assert b.record.extra["sample_batch"] == len(TEXTS)
        assert b.record.extra.get("duration_source", "seconds") == ("seconds" if i % 2 else "predictor")
        np.testing.assert_allclose(b.audio, a.audio, atol=1e-5)
    assert len(leads) == before


@pytest.fixture
def pending_lengths(monkeypatch):
    """`hold()`: from then on the predictor's lengths are still on their way to the host when the
    encoders' job ends (what CUDA gives; on the CPU they are there at once): encoding.py's copies
    are kept pending until the test lands them (`HostCopy._land`, what the owner's copy waiter
    does). Returns the list the copies go to."""
    from irodori_speaker.engine.hardware.owner import DEVICE, HostCopy
    from irodori_speaker.synthesis import encoding

    copies: list = []

    class Pending:
        def to_host(self, tensor):
            copy = HostCopy(tensor.cpu(), event=object())  # pending until landed
            copies.append(copy)
            return copy

        def __getattr__(self, name):
            return getattr(DEVICE, name)

    def hold() -> list:
        monkeypatch.setattr(encoding, "DEVICE", Pending())
        return copies

    return hold


def _owner_answers(within_s: float = 5.0) -> bool:
    """The device owner runs a job now (it is not blocked inside another)."""
    from irodori_speaker.engine.hardware.owner import DEVICE

    done = threading.Event()
    threading.Thread(target=lambda: DEVICE.run(done.set), daemon=True).start()
    return done.wait(within_s)


def _land_later(copies: list, n: int, seen: dict, batcher) -> threading.Thread:
    """Once `n` copies are pending (and a little after), note what was sampled and whether the owner
    is free meanwhile, then land them."""

    def land():
        deadline = time.monotonic() + 30
        while len(copies) < n and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.2)
        seen["batches"] = dict(batcher.batches)
        seen["owner_free"] = _owner_answers()
        for copy in copies:
            copy._land()

    thread = threading.Thread(target=land)
    thread.start()
    return thread


def test_predictor_lines_sample_in_a_job_of_their_own_once_their_lengths_land(synth, leads, pending_lengths):
    jobs = [(t, opts(seed=i)) for i, t in enumerate(TEXTS[:3])]
    alone = _alone(synth, jobs)
    batcher, before, seen = synth._batcher, len(leads), {}
    sizes = dict(batcher.batches)
    lander = _land_later(pending_lengths(), len(jobs), seen, batcher)
    batched = together(synth, jobs)
    lander.join()
    assert seen["batches"] == sizes  # nothing sampled while the lengths were on their way,
    assert seen["owner_free"]  # and the owner not blocked waiting for them: free for other lines
    for a, b in zip(alone, batched):
        assert b.record.extra["sampled_with_encoders"] is True
        assert b.record.extra["sample_batch"] == len(jobs)
        assert b.record.extra["duration_source"] == "predictor"
        np.testing.assert_allclose(b.audio, a.audio, atol=1e-5)
    assert len(leads) == before and batcher.batches[len(jobs)] == sizes.get(len(jobs), 0) + 1
    assert batcher._waiting == [] and batcher._preparing == 0


def test_a_line_cancelled_while_its_length_is_on_its_way_ends_and_the_others_sample(
    synth, leads, pending_lengths
):
    from irodori_speaker.synthesis.encoding import EncodeItem

    jobs = [(t, opts(seed=i)) for i, t in enumerate(TEXTS[:3])]
    alone = _alone(synth, jobs)
    token = CancelToken()
    waits = EncodeItem.wait_made

    def wait_made(item, cancel=None):  # the first line's token is set while it waits for its length
        if cancel is token:
            token.cancel()
        return waits(item, cancel)

    original = synth.synthesize
    results: list = []

    def synthesize(text, voice=None, options=None, **kw):
        return original(text, voice, options=options, cancel=token if text == TEXTS[0] else None, **kw)

    batcher, seen = synth._batcher, {}
    sizes = dict(batcher.batches)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(EncodeItem, "wait_made", wait_made)
        mp.setattr(synth, "synthesize", synthesize)
        lander = _land_later(pending_lengths(), len(jobs), seen, batcher)
        results = together(synth, jobs)
        lander.join()
    assert isinstance(results[0], Cancelled)
    for a, b in zip(alone[1:], results[1:]):
        assert b.record.extra["sample_batch"] == 2  # the cancelled line's rows were never sampled
        np.testing.assert_allclose(b.audio, a.audio, atol=1e-5)
    assert batcher.batches[2] == sizes.get(2, 0) + 1
    assert batcher._waiting == [] and batcher._preparing == 0


def test_a_v2_line_samples_in_its_encoders_job_with_its_text_estimate(irodori_home):
    """v2 has no predictor: its text estimate is known before the encoders (benchmarks' mode (e))."""
    synth = _load("v2")
    jobs = [(t, opts(seed=i)) for i, t in enumerate(TEXTS[:3])]
    alone = [synth.synthesize(t, options=o) for t, o in jobs]
    for a, b in zip(alone, together(synth, jobs)):
        assert b.record.extra["duration_source"] == "text estimate"
        assert b.record.extra["sampled_with_encoders"] and b.record.extra["sample_batch"] == 3
        np.testing.assert_allclose(b.audio, a.audio, atol=1e-5)


def test_the_option_is_off_by_default_and_the_usual_way_is_taken(irodori_home):
    from irodori_speaker.engine.hardware.presets import base_preset
    from irodori_speaker.synthesis.loading import load_synthesizer

    assert not any(base_preset(n).sample_with_encoders for n in ("cuda", "mps", "cpu"))
    synth = load_synthesizer(
        tiny_random=True, backend="cpu", voice_cache_dir=False, max_batch=8, step_batching=False
    )
    out = synth.synthesize(TEXTS[0], options=opts(seconds=1.0))
    assert "sampled_with_encoders" not in out.record.extra


# ---- SampleBatcher.sample_now's rules --------------------------------------------------------------


def _recording(batches: list[list[int]], fail_above: int = 0):
    def run(reqs, cancel, progress):
        if fail_above and len(reqs) > fail_above:
            raise RuntimeError("out of memory (on purpose)")
        batches.append([r.conds for r in reqs])
        return [f"latent {r.conds}" for r in reqs]

    return run


def _req(i: int, key="k", length: int = 10, cancel=None) -> SampleRequest:
    return SampleRequest(conds=i, noise=None, cfg=None, key=key, length=length, cancel=cancel)


def test_sample_now_batches_the_call_by_key_and_takes_lines_waiting_beside_it():
    batches: list[list[int]] = []
    batcher = SampleBatcher(_recording(batches), max_batch=8, with_encoders=True)
    waiting = _req(9)
    batcher._waiting.append(waiting)  # a line of the usual way, waiting for its lead job
    reqs = [_req(0), _req(1, key="other"), _req(2)]
    batcher.sample_now(reqs)
    assert sorted(map(sorted, batches)) == [[0, 2, 9], [1]]
    for r in [*reqs, waiting]:
        assert r.taken and r.done and r.error is None and r.result == f"latent {r.conds}"
    assert (reqs[0].batch_size, reqs[1].batch_size, waiting.batch_size) == (3, 1, 3)
    assert batcher._waiting == [] and batcher.batches == {3: 1, 1: 1}


def test_sample_now_leaves_a_cancelled_line_to_its_thread():
    """A line cancelled by the time its encoders finished is not sampled: it stays untaken and
    out of the waiting list, and its own thread ends it with `Cancelled`."""
    batches: list[list[int]] = []
    batcher = SampleBatcher(_recording(batches), max_batch=8, with_encoders=True)
    token = CancelToken()
    token.cancel()
    gone, kept = _req(0, cancel=token), _req(1)
    batcher.sample_now([gone, kept])
    assert batches == [[1]] and kept.done and not gone.taken and not gone.done
    assert batcher._waiting == []
    with pytest.raises(Cancelled):
        batcher.sample(lambda: gone, token)
    assert batcher._waiting == [] and batches == [[1]]


def test_sample_now_retries_a_failed_batch_line_by_line_and_the_thread_raises_its_own_error():
    batches: list[list[int]] = []
    batcher = SampleBatcher(_recording(batches, fail_above=1), max_batch=8, with_encoders=True)
    reqs = [_req(0), _req(1)]
    batcher.sample_now(reqs)
    assert batches == [[0], [1]] and all(r.done and r.error is None for r in reqs)
    assert [batcher.sample(lambda r=r: r)[1] for r in reqs] == ["latent 0", "latent 1"]
    assert batches == [[0], [1]]  # the threads found their lines sampled: nothing ran again


@pytest.mark.skipif(
    not __import__("torch").cuda.is_available(),
    reason="the CUDA preset's graphed sampler and its batch buckets run only on CUDA (run on the H200)",
)
def test_on_cuda_lines_sampled_in_their_encoders_job_sound_as_alone(irodori_home):
    """The CUDA preset (graphed sampler, batches cut to their buckets, the hold before the
    encoders) with the option on: lines of asked seconds started together sound as alone."""
    from irodori_speaker.synthesis.loading import load_synthesizer

    synth = load_synthesizer(
        tiny_random="v4.1-mf", backend="cuda", voice_cache_dir=False, max_batch=8, sample_with_encoders=True
    )
    synth.prewarm()
    jobs = [(t, opts(seed=i, seconds=1.5)) for i, t in enumerate(TEXTS)]
    alone = [synth.synthesize(t, options=o) for t, o in jobs]
    batched = together(synth, jobs)
    assert any(b.record.extra["sample_batch"] > 1 for b in batched)
    for a, b in zip(alone, batched):
        assert b.record.extra["sampled_with_encoders"] is True
        np.testing.assert_allclose(b.audio, a.audio, atol=2e-2)  # bf16: rows of another GEMM size


# ---- the owner's continuations (engine/hardware/owner.py) -------------------------------------------


def test_a_copys_continuation_runs_once_when_it_lands_or_at_once_if_it_has():
    from irodori_speaker.engine.hardware.owner import HostCopy

    calls: list[str] = []
    copy = HostCopy(np.zeros(1), event=object())
    copy.then(lambda: calls.append("first"))
    assert copy.pending and calls == []
    copy._land()
    assert calls == ["first"] and not copy.pending
    copy.then(lambda: calls.append("after"))
    copy._land()  # a second landing calls nothing again
    assert calls == ["first", "after"]


def test_a_posted_job_runs_on_the_owner_and_its_error_goes_to_fail():
    from irodori_speaker.engine.hardware.owner import DEVICE

    ran, failed = threading.Event(), []
    threads: list[str] = []

    def job():
        threads.append(threading.current_thread().name)
        ran.set()

    DEVICE.post(job, failed.append)
    assert ran.wait(10) and threads == ["irodori-device"] and failed == []
    errors: list[BaseException] = []
    got = threading.Event()
    DEVICE.post(lambda: 1 / 0, lambda e: (errors.append(e), got.set()))
    assert got.wait(10) and isinstance(errors[0], ZeroDivisionError)
