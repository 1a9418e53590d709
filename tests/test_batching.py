"""Lines waiting for the sampler at the same time are sampled as one batch (synthesis/batching.py).

The Synthesizer part runs the real tiny model on the CPU from several threads, as several
Speakers or the server's streams do; the model lock is held while the threads start so that
their lines really wait together. `SampleBatcher`'s own rules (a failed batch retried line by
line) are checked with a run function that fails on purpose.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from irodori_speaker.cancel import CancelToken
from irodori_speaker.engine.hardware.lock import MODEL_LOCK
from irodori_speaker.engine.hardware.presets import base_preset, select_preset
from irodori_speaker.errors import Cancelled
from irodori_speaker.options import SynthesisOptions
from irodori_speaker.synthesis.batching import SampleBatcher, SampleRequest

TEXTS = [
    "こんにちは、今日もよろしくお願いします。",
    "ニュースの時間です。",
    "明日は晴れるでしょう。",
    "ありがとう！",
]


@pytest.fixture(scope="module")
def synth(irodori_home):
    """The tiny-random synthesizer with whole-line batching on (`step_batching=False`: the step
    scheduler has its own tests, test_stepping.py), any padding allowed (the padding bound has its
    own test below)."""
    from irodori_speaker.synthesis.loading import load_synthesizer

    return load_synthesizer(
        tiny_random=True,
        backend="cpu",
        voice_cache_dir=False,
        max_batch=8,
        max_padding=100.0,
        step_batching=False,
    )


def opts(**kw) -> SynthesisOptions:
    return SynthesisOptions(**{"seed": 5, "steps": 4, **kw})


def together(synth, jobs, *, tokens=None, progress=None, voice=None):
    """Run `jobs` [(text, options)] from one thread each (in `voice`), all waiting before any
    starts. Returns each job's result or the exception it raised."""
    results: list = [None] * len(jobs)
    tokens = tokens or [None] * len(jobs)

    def work(i):
        text, o = jobs[i]
        try:
            results[i] = synth.synthesize(
                text, voice, options=o, cancel=tokens[i], progress=(progress or {}).get(i)
            )
        except Exception as e:
            results[i] = e

    batcher = synth._batcher
    with MODEL_LOCK:  # every line reaches its encoders and waits there
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while batcher._preparing < len(jobs) and time.monotonic() < deadline:
            time.sleep(0.005)
        assert batcher._preparing == len(jobs)
    for t in threads:
        t.join(120)
    return results


def test_only_graphed_sampling_cuts_batches_to_their_bucket(synth):
    """Only CUDA graphs fill a batch up to its bucket, so only then is a batch cut to one: the
    CPU's batcher keeps every waiting line (the rule itself: the tests below)."""
    assert synth._batcher.fill_buckets is False and not synth._graphed()


def test_lines_waiting_together_are_sampled_as_one_batch_and_sound_as_alone(synth):
    alone = [synth.synthesize(t, options=opts(seed=i)) for i, t in enumerate(TEXTS)]
    assert all(r.record.extra["sample_batch"] == 1 for r in alone)
    batched = together(synth, [(t, opts(seed=i)) for i, t in enumerate(TEXTS)])
    for a, b in zip(alone, batched):
        assert b.record.extra["sample_batch"] == len(TEXTS)
        assert len(a.audio) == len(b.audio)  # each line keeps its own length
        np.testing.assert_allclose(b.audio, a.audio, atol=1e-5)


def test_only_lines_with_the_same_plan_share_a_batch(synth):
    jobs = [
        (TEXTS[0], opts(steps=4)),
        (TEXTS[1], opts(steps=6)),
        (TEXTS[2], opts(steps=4)),
        (TEXTS[3], opts(steps=6)),
    ]
    results = together(synth, jobs)
    assert [r.record.extra["sample_batch"] for r in results] == [2, 2, 2, 2]
    for (text, o), r in zip(jobs, results):
        np.testing.assert_allclose(r.audio, synth.synthesize(text, options=o).audio, atol=1e-5)


def test_a_line_cancelled_in_a_batch_stops_alone(synth):
    tokens = [CancelToken() for _ in TEXTS]

    def cancel_line_2(done, total):
        if done >= 1:  # during the batch's sampling
            tokens[2].cancel("the viewer left")

    jobs = [(t, opts(seed=i)) for i, t in enumerate(TEXTS)]
    results = together(synth, jobs, tokens=tokens, progress={0: cancel_line_2})
    assert isinstance(results[2], Cancelled)
    for i in (0, 1, 3):
        assert results[i].record.extra["sample_batch"] == len(TEXTS)
        np.testing.assert_allclose(
            results[i].audio, synth.synthesize(*jobs[i][:1], options=jobs[i][1]).audio, atol=1e-5
        )


def test_a_line_alone_is_not_held_back(synth):
    # nobody else encodes: it samples at once, alone (no batch, no wait for `gather_s`)
    synth._batcher.gather_s = 60.0
    try:
        r = synth.synthesize("ひとりです。", options=opts())
    finally:
        synth._batcher.gather_s = 0.25
    assert r.record.extra["sample_batch"] == 1
    assert r.record.timings["sampling"] < 30  # not the 60 s gather bound (a guard, not a timing)


def test_max_batch_one_samples_one_after_another(synth):
    batcher = synth._batcher
    batcher.max_batch, before = 1, batcher.max_batch
    try:
        results = together(synth, [(t, opts(seed=i)) for i, t in enumerate(TEXTS[:3])])
    finally:
        batcher.max_batch = before
    assert [r.record.extra["sample_batch"] for r in results] == [1, 1, 1]


def test_batching_is_opt_in_until_measured_a_win():
    # CPU: a batch of 4 news5 lines was 0.60x serial; CUDA: not yet timed (docs/backends.md)
    assert {base_preset(n).max_batch for n in ("cuda", "mps", "cpu")} == {1}
    assert select_preset("cpu", max_batch=4).max_batch == 4


# ---- SampleBatcher's rules, with a run function that fails on purpose ----------------------------


def _batcher_run_in_threads(batcher, keys, lengths=None):
    out: list = [None] * len(keys)
    lengths = lengths or [1] * len(keys)

    def work(i):
        def prepare():
            return SampleRequest(conds=i, noise=None, cfg=None, key=keys[i], length=lengths[i])

        try:
            out[i] = batcher.sample(prepare)
        except Exception as e:
            out[i] = e

    with MODEL_LOCK:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(keys))]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while len(batcher._waiting) < len(keys) and time.monotonic() < deadline:
            time.sleep(0.005)
    for t in threads:
        t.join(10)
    return out


def test_a_failed_batch_is_retried_line_by_line():
    calls: list[int] = []

    def run(reqs, cancel, progress):
        calls.append(len(reqs))
        if len(reqs) > 1:
            raise RuntimeError("CUDA out of memory")  # as a too-large batch would
        if reqs[0].conds == 1:
            raise ValueError("this line is bad on its own")
        return [reqs[0].conds * 10]

    batcher = SampleBatcher(run, max_batch=8)
    out = _batcher_run_in_threads(batcher, ["k"] * 3)
    assert calls[0] == 3 and sorted(calls[1:]) == [1, 1, 1]
    assert [o[1] for o in (out[0], out[2])] == [0, 20]
    assert isinstance(out[1], ValueError)  # only the bad line fails


def test_lines_of_other_keys_wait_for_their_own_batch():
    sizes: list[int] = []

    def run(reqs, cancel, progress):
        sizes.append(len(reqs))
        return [r.conds for r in reqs]

    batcher = SampleBatcher(run, max_batch=2)
    out = _batcher_run_in_threads(batcher, ["a", "b", "a", "a", "b"])
    assert [o[1] for o in out] == [0, 1, 2, 3, 4]
    assert sorted(sizes) == [1, 2, 2]  # a: 2 + 1 (max_batch 2), b: 2


def test_a_line_far_shorter_than_the_rest_waits_for_its_own_batch():
    batches: list[list[int]] = []

    def run(reqs, cancel, progress):
        batches.append(sorted(r.length for r in reqs))
        return [r.conds for r in reqs]

    batcher = SampleBatcher(run, max_batch=8, max_padding=0.25)
    out = _batcher_run_in_threads(batcher, ["k"] * 5, lengths=[100, 95, 90, 10, 12])
    assert [o[1] for o in out] == [0, 1, 2, 3, 4]
    # the long lines go together, the short ones together: no batch pads more than it computes
    assert sorted(batches) == [[10, 12], [90, 95, 100]]


def test_a_batch_mostly_fillers_is_cut_to_the_bucket_below():
    """With graphs the sampler fills a batch up to its bucket: ten lines would be sampled as 16
    rows, 6 of them fillers; they go as 8 and then 2 (both buckets, no filler)."""
    from irodori_speaker.engine.batch import lines_to_take

    assert [lines_to_take(n) for n in range(1, 18)] == [
        1,
        2,
        2,
        4,
        4,
        4,
        7,
        8,
        8,
        8,
        8,
        8,
        13,
        14,
        15,
        16,
        16,
    ]
    for fill, want in ((True, [2, 8]), (False, [10])):
        sizes: list[int] = []

        def run(reqs, cancel, progress, sizes=sizes):
            sizes.append(len(reqs))
            return [r.conds for r in reqs]

        batcher = SampleBatcher(run, max_batch=16, fill_buckets=fill)
        out = _batcher_run_in_threads(batcher, ["k"] * 10)
        assert [o[1] for o in out] == list(range(10))  # every line its own result
        assert sorted(sizes) == want


# ---- admission (`SampleBatcher.admit_s`) ----------------------------------------------------
# On the CPU a job's work is done when it returns, so the device is never busy there
# (`DeviceOwner.backlog_above` False); these tests stand in a busy GPU, its backlog of launches, by
# patching it: the only mock here.


@pytest.fixture
def busy_device(monkeypatch):
    from irodori_speaker.engine.hardware.owner import DEVICE

    state = {"backlog": 3}
    monkeypatch.setattr(DEVICE, "backlog_above", lambda n: state["backlog"] > n)
    return state


def _in_flight(batcher, arrive_after: list[float], tokens=None):
    """One thread per line, each in flight (`line()`) from the start; line i asks for its sampling
    after `arrive_after[i]` s. Returns each line's (request, result) or exception."""
    n = len(arrive_after)
    out: list = [None] * n
    tokens = tokens or [None] * n
    inside = threading.Barrier(n)

    def work(i):
        with batcher.line():
            inside.wait()
            time.sleep(arrive_after[i])

            def prepare():
                return SampleRequest(conds=i, noise=None, cfg=None, key="k", cancel=tokens[i])

            try:
                out[i] = batcher.sample(prepare, cancel=tokens[i])
            except Exception as e:
                out[i] = e

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    return out


def _sizes_run(sizes: list[int]):
    def run(reqs, cancel, progress):
        sizes.append(len(reqs))
        return [r.conds for r in reqs]

    return run


def test_a_line_waits_for_a_line_in_flight_while_the_device_is_busy(busy_device):
    sizes: list[int] = []
    batcher = SampleBatcher(_sizes_run(sizes), max_batch=8, admit_s=20.0)
    out = _in_flight(batcher, [0.0, 0.3])
    assert [o[1] for o in out] == [0, 1]
    assert sizes == [2] and batcher.batches == {2: 1}  # the first waited for the second
    assert batcher._flying == 0


def test_without_admission_lines_in_flight_sample_apart(busy_device):
    sizes: list[int] = []
    batcher = SampleBatcher(_sizes_run(sizes), max_batch=8)  # admit_s 0: the default
    out = _in_flight(batcher, [0.0, 0.3])
    assert [o[1] for o in out] == [0, 1]
    assert sizes == [1, 1]


def test_admission_ends_when_the_device_goes_idle(busy_device):
    """A line that waits starts as soon as the device has nothing left to run: a batch later, not
    a GPU left idle."""
    sizes: list[int] = []
    batcher = SampleBatcher(_sizes_run(sizes), max_batch=8, admit_s=60.0)
    threading.Timer(0.2, lambda: busy_device.update(backlog=0)).start()
    out = _in_flight(batcher, [0.0, 5.0])  # the second arrives long after the device went idle
    assert [o[1] for o in out] == [0, 1]
    assert sizes == [1, 1]


def test_admission_with_a_backlog_ends_when_the_device_holds_that_few_launches(busy_device):
    """With `admit_backlog` 1 a line waits while the device holds more than one of the owner's
    launches, and starts once it holds one, though a line is still in flight: its batch would only
    have queued behind them. With 0 the same line waits on while one runs."""
    for backlog, want in ((1, [1, 1]), (0, [2])):
        sizes: list[int] = []
        busy_device.update(backlog=3)
        batcher = SampleBatcher(_sizes_run(sizes), max_batch=8, admit_s=60.0, admit_backlog=backlog)
        threading.Timer(0.2, lambda: busy_device.update(backlog=1)).start()
        out = _in_flight(batcher, [0.0, 1.5])  # the second arrives long after the backlog fell to 1
        assert [o[1] for o in out] == [0, 1]
        assert sizes == want, backlog


def test_admission_before_the_encoders_lets_the_held_lines_encode_together(busy_device):
    """With `admit_encoders` a line waits before its encoders (its `prepare`), not after: held
    while the device's backlog is above `admit_backlog`, the first two lines are let go together
    when it falls and run their encoders together (not the first at once), then sample as one
    batch; the third, in flight all along, arrives later and samples alone."""
    sizes: list[int] = []
    prepared: dict[int, float] = {}
    batcher = SampleBatcher(
        _sizes_run(sizes), max_batch=8, admit_s=60.0, admit_backlog=1, admit_encoders=True
    )
    prepare_of = batcher._prepare

    def timed(prepare, counted=False):  # when each line's encoders start
        def run():
            prepared[len(prepared)] = time.monotonic() - t0
            return prepare()

        return prepare_of(run, counted)

    batcher._prepare = timed  # type: ignore[method-assign]
    t0 = time.monotonic()
    threading.Timer(0.4, lambda: busy_device.update(backlog=1)).start()
    out = _in_flight(batcher, [0.0, 0.1, 1.5])
    assert [o[1] for o in out] == [0, 1, 2]
    assert sizes == [2, 1]
    assert prepared[0] >= 0.4 and prepared[1] >= 0.4  # both held until the backlog fell
    assert abs(prepared[0] - prepared[1]) < 0.05  # and let go together


def test_admission_before_the_encoders_ends_when_every_line_in_flight_is_held(busy_device):
    sizes: list[int] = []
    batcher = SampleBatcher(_sizes_run(sizes), max_batch=8, admit_s=60.0, admit_encoders=True)
    out = _in_flight(batcher, [0.0, 0.2, 0.4])  # the backlog never falls: the third lets all go
    assert [o[1] for o in out] == [0, 1, 2]
    assert sizes == [3] and batcher._held == 0


def test_lines_held_before_their_encoders_are_counted_once_however_they_interleave(busy_device):
    """Many lines held and let go in many rounds while the backlog flips: every line samples, and
    afterwards nothing is left counted as held or encoding (a line let go counted again by the next
    round would leave every later line waiting out `gather_s`)."""
    import random

    rng = random.Random(7)
    sizes: list[int] = []
    batcher = SampleBatcher(
        _sizes_run(sizes), max_batch=4, admit_s=0.05, admit_backlog=1, admit_encoders=True
    )
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            busy_device.update(backlog=rng.choice((0, 1, 3, 3)))
            time.sleep(0.001)

    flipper = threading.Thread(target=flip)
    flipper.start()
    try:
        for _ in range(3):
            out = _in_flight(batcher, [rng.random() * 0.02 for _ in range(12)])
            assert [o[1] for o in out] == list(range(12))
            assert batcher._preparing == 0 and batcher._held == 0
    finally:
        stop.set()
        flipper.join()
    assert sum(sizes) == 36


def test_lines_held_before_their_encoders_in_a_synthesizer_sound_as_alone(irodori_home, busy_device):
    """Through a real synthesizer (tiny model, the CPU; the busy GPU stood in): four lines started
    together, held before their encoders, each give the audio they give alone, and afterwards
    nothing is left counted as held, encoding or in flight."""
    from irodori_speaker.synthesis.loading import load_synthesizer

    synth = load_synthesizer(
        tiny_random=True, backend="cpu", voice_cache_dir=False, max_batch=8, max_padding=100.0,
        step_batching=False, sample_admit_s=0.05, sample_admit_backlog=1, sample_admit_encoders=True,
    )  # fmt: skip
    batcher = synth._batcher
    assert batcher.admit_encoders and batcher.admit_backlog == 1
    busy_device.update(backlog=0)
    alone = [synth.synthesize(t, options=opts(seed=i)) for i, t in enumerate(TEXTS)]
    busy_device.update(backlog=3)
    results: list = [None] * len(TEXTS)
    start = threading.Barrier(len(TEXTS))

    def work(i):
        start.wait()
        results[i] = synth.synthesize(TEXTS[i], options=opts(seed=i))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(TEXTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for a, b in zip(alone, results):
        np.testing.assert_allclose(b.audio, a.audio, atol=1e-5)
    assert (batcher._held, batcher._preparing, batcher._flying, batcher._waiting) == (0, 0, 0, [])
    assert sum(size * n for size, n in batcher.batches.items()) == 2 * len(TEXTS)


def test_a_line_cancelled_while_held_before_its_encoders_ends_at_once(busy_device):
    """A line held before its encoders sees its token there: it ends with `Cancelled` long before
    the line it waits for arrives, leaves nothing counted, and the other line samples alone."""
    sizes: list[int] = []
    batcher = SampleBatcher(_sizes_run(sizes), max_batch=8, admit_s=60.0, admit_encoders=True)
    token = CancelToken()
    ended: list[float] = []
    sample = batcher.sample

    def timed(prepare, cancel=None, sample=sample):
        try:
            return sample(prepare, cancel)
        finally:
            if cancel is token:
                ended.append(time.monotonic() - t0)

    batcher.sample = timed  # type: ignore[method-assign]
    t0 = time.monotonic()
    threading.Timer(0.2, token.cancel).start()
    out = _in_flight(batcher, [0.0, 1.5], tokens=[token, None])
    assert isinstance(out[0], Cancelled) and ended[0] < 1.0  # not when the second line came
    assert out[1][1] == 1 and sizes == [1]
    assert (batcher._held, batcher._preparing, batcher._waiting) == (0, 0, [])


def test_admission_is_bounded_by_admit_s(busy_device):
    sizes: list[int] = []
    batcher = SampleBatcher(_sizes_run(sizes), max_batch=8, admit_s=0.2)
    out = _in_flight(batcher, [0.0, 3.0])  # far later than admit_s
    assert [o[1] for o in out] == [0, 1]
    assert sizes == [1, 1]


def test_a_line_alone_in_flight_does_not_wait(busy_device):
    sizes: list[int] = []
    batcher = SampleBatcher(_sizes_run(sizes), max_batch=8, admit_s=60.0)
    out = _in_flight(batcher, [0.0])  # would hang the join for a minute if it waited
    assert out[0][1] == 0 and sizes == [1]


def test_a_full_batch_starts_without_waiting_out_admit_s(busy_device):
    sizes: list[int] = []
    batcher = SampleBatcher(_sizes_run(sizes), max_batch=2, admit_s=60.0)
    out = _in_flight(batcher, [0.0, 0.2, 0.2])  # three in flight, a batch holds two
    assert [o[1] for o in out] == [0, 1, 2]
    assert sorted(sizes) == [1, 2]


def test_admission_tops_up_only_batches_smaller_than_admit_up_to(busy_device):
    """With `admit_up_to` 2, a line that finds another already waiting starts at once, though a
    third is still in flight; without it, the two wait for the third."""
    for up_to, want in ((2, [2, 1]), (0, [3])):
        sizes: list[int] = []
        batcher = SampleBatcher(_sizes_run(sizes), max_batch=8, admit_s=60.0, admit_up_to=up_to)
        out = _in_flight(batcher, [0.0, 0.1, 1.0])
        assert [o[1] for o in out] == [0, 1, 2]
        assert sizes == want, up_to


@pytest.mark.parametrize("before_encoders", [False, True])
def test_a_high_lane_line_never_waits_for_admission(busy_device, before_encoders):
    """An interruption's line (the high lane) samples at once though another is in flight; the same
    line on the normal lane waits for it (after its encoders, or before them)."""
    from irodori_speaker.lanes import HIGH_LANE, NORMAL_LANE, line_lane

    for lane, want in ((HIGH_LANE, [1, 1]), (NORMAL_LANE, [2])):
        sizes: list[int] = []
        batcher = SampleBatcher(
            _sizes_run(sizes), max_batch=8, admit_s=60.0, admit_up_to=4, admit_encoders=before_encoders
        )
        sample = batcher.sample

        def first_in_lane(prepare, cancel=None, sample=sample, lane=lane):  # the first to arrive: in `lane`
            if prepare().conds == 0:
                with line_lane(lane):
                    return sample(prepare, cancel)
            return sample(prepare, cancel)

        batcher.sample = first_in_lane  # type: ignore[method-assign]
        out = _in_flight(batcher, [0.0, 0.5])
        assert [o[1] for o in out] == [0, 1]
        assert sizes == want, lane


def test_a_line_cancelled_while_admitted_leaves_and_the_other_goes_on(busy_device):
    sizes: list[int] = []
    batcher = SampleBatcher(_sizes_run(sizes), max_batch=8, admit_s=60.0)
    token = CancelToken()
    threading.Timer(0.3, token.cancel).start()
    out = _in_flight(batcher, [0.0, 1.0], tokens=[token, None])
    assert isinstance(out[0], Cancelled)
    assert out[1][1] == 1 and sizes == [1]
    assert batcher._waiting == []


def test_the_synthesizer_counts_its_pieces_in_flight_and_takes_the_presets_admission(irodori_home):
    from irodori_speaker.synthesis.loading import load_synthesizer

    synth = load_synthesizer(
        tiny_random=True, backend="cpu", voice_cache_dir=False, max_batch=4, step_batching=False,
        sample_admit_s=0.005, sample_admit_up_to=4, sample_admit_backlog=2,
    )  # fmt: skip
    assert synth._batcher.admit_s == 0.005 and synth._batcher.admit_up_to == 4
    assert synth._batcher.admit_backlog == 2
    seen: list[int] = []
    stream = synth.stream(TEXTS[0], None, opts())
    next(iter(stream))
    seen.append(synth._batcher._flying)
    stream.close()  # a stream dropped mid-line leaves nothing counted
    synth.synthesize(TEXTS[1], None, options=opts())
    assert seen == [1] and synth._batcher._flying == 0
