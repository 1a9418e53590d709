"""One thread owns the device (engine/hardware/owner.py) whenever lines meet there.

The real tiny model, lines from several threads as several Speakers or the server's streams send
them. Hooks on every module of the DiT and the codec record the thread that runs them and whether
it holds the model lock: every op holds it, lines that meet run on the owner, and a line alone
(the owner idle) runs on its own thread as before. Jobs keep their errors to their callers, a
cancelled job never runs, copies to the host land whole and in order, and the owner's threads end
with the work.
"""

from __future__ import annotations

import threading
import time
import traceback

import numpy as np
import pytest
import torch

from irodori_speaker.cancel import CancelToken
from irodori_speaker.engine.hardware.host_copy import HostCopy
from irodori_speaker.engine.hardware.lock import MODEL_LOCK
from irodori_speaker.engine.hardware.owner import DEVICE, DeviceOwner
from irodori_speaker.errors import Cancelled
from owner_threads import irodori_threads, queue_then_release
from test_batching import TEXTS, opts, together


def _load(backend: str, tiny_random: object = True, **kw):
    from irodori_speaker.synthesis.loading import load_synthesizer

    return load_synthesizer(tiny_random=tiny_random, backend=backend, voice_cache_dir=False, **kw)


@pytest.fixture(scope="module")
def synth(irodori_home):
    return _load("cpu", max_batch=8, step_batching=True)


def _record_threads(synth) -> tuple[set, list]:
    """(thread name, holds the model lock) of every module call of the DiT and the codec."""
    seen: set[tuple[str, bool]] = set()

    def note(*_):
        seen.add((threading.current_thread().name, MODEL_LOCK.held_by_me()))

    hooks = [m.register_forward_pre_hook(note) for root in (synth.model, synth.codec) for m in root.modules()]
    return seen, hooks


def _through_owner(owner: DeviceOwner, fns: list) -> list:
    """Each fn submitted from its own thread while the model lock is held here (so none runs
    inline), then the lock let go: the owner runs them all."""
    return queue_then_release(owner, [lambda o, fn=fn: o.run(fn) for fn in fns])


def test_lines_that_meet_run_on_the_owner_and_a_line_alone_on_its_own_thread(synth):
    seen, hooks = _record_threads(synth)
    try:
        alone = synth.synthesize(TEXTS[0], options=opts(seed=1, steps=3))
        streamed = list(synth.stream(TEXTS[1], options=opts(seed=2, steps=3)))
        lone = set(seen)
        seen.clear()
        jobs = [(TEXTS[i], opts(seed=i, steps=3 + i % 2)) for i in range(4)]
        results = together(synth, jobs)
    finally:
        for h in hooks:
            h.remove()
    assert len(alone.audio) and streamed
    assert lone == {("MainThread", True)}, lone
    assert all(not isinstance(r, Exception) for r in results), results
    assert ("irodori-device", True) in seen, seen
    assert all(held for _, held in seen), seen  # every op with the lock, whoever ran it
    assert synth._batcher.peak_lines >= 2
    assert not irodori_threads()


def test_a_failing_job_fails_its_caller_only():
    owner = DeviceOwner()

    def bad():
        raise ValueError("this job's own fault")

    with pytest.raises(ValueError, match="own fault"):
        owner.run(bad)
    assert owner.run(lambda: 41 + 1) == 42  # inline, the owner idle
    failed, ok = _through_owner(owner, [lambda: _catch(bad), lambda: 41 + 1])
    assert isinstance(failed, ValueError) and ok == 42  # the owner went on after the failure
    assert owner.jobs_run == 2


def _catch(fn):
    try:
        fn()
    except ValueError as e:
        return e


def test_who_runs_a_job():
    owner = DeviceOwner()
    me = threading.current_thread().name
    name = lambda: threading.current_thread().name  # noqa: E731
    with MODEL_LOCK:  # the caller holds the lock: inline
        assert owner.run(name) == me
    assert owner.run(name) == me  # the owner idle and the lock free: inline, as a line alone
    assert _through_owner(owner, [name, name]) == ["irodori-device"] * 2  # lines that meet


def test_a_host_copy_on_the_cpu_is_there_at_once():
    t = torch.arange(6.0)
    copy = DEVICE.run(lambda: DEVICE.to_host(t * 2))
    np.testing.assert_array_equal(copy.wait().numpy(), np.arange(6.0) * 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (copies that land later)")
def test_host_copies_land_in_order_and_whole_on_cuda():
    a = torch.randn(2048, 2048, device="cuda")

    def job(i: int):
        b = a
        for _ in range(8):  # queued work ahead of the copy: the copy must wait for it
            b = torch.tanh(b @ a) * 0.5
        return DEVICE.to_host(b[i].clone()), b[i]

    pairs = _through_owner(DEVICE, [lambda i=i: job(i) for i in range(4)])
    assert any(copy.pending for copy, _ in pairs)  # the owner did not wait for the GPU
    for copy, dev in pairs:
        np.testing.assert_allclose(copy.wait().numpy(), dev.cpu().numpy())
    assert not irodori_threads()


@pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two CUDA devices (a model on cuda:1; run on nvidia-h100-x2)"
)
def test_host_copies_of_a_second_device_land_whole():
    """The copy's event is recorded on its tensor's device, not the owner thread's current one
    (cuda:0), where it would be done at once and the host would read the copy before it landed."""
    a = torch.randn(2048, 2048, device="cuda:1")

    def job(i: int):
        b = a
        for _ in range(8):
            b = torch.tanh(b @ a) * 0.5
        return DEVICE.to_host(b[i].clone()), b[i]

    pairs = _through_owner(DEVICE, [lambda i=i: job(i) for i in range(4)])
    for copy, dev in pairs:
        np.testing.assert_allclose(copy.wait().numpy(), dev.cpu().numpy())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_lines_stepped_together_on_cuda_sound_as_alone(irodori_home):
    synth = _load("cuda", max_batch=8, step_batching=True)
    synth.prewarm()
    jobs = [(TEXTS[i], opts(seed=i + 1, steps=4)) for i in range(4)]
    alone = [synth.synthesize(t, options=o) for t, o in jobs]
    # the starts and steps replay CUDA graphs (no module is called): their calls are watched
    seen: set[tuple[str, bool]] = set()
    batcher = synth._step_batcher()
    for name in ("start_many", "step"):
        plain = getattr(batcher, name)

        def watched(*args, plain=plain, **kw):
            seen.add((threading.current_thread().name, MODEL_LOCK.held_by_me()))
            return plain(*args, **kw)

        setattr(batcher, name, watched)
    results = together(synth, jobs)
    for a, b in zip(alone, results):
        assert not isinstance(b, Exception), b
        assert len(a.audio) == len(b.audio)
        np.testing.assert_allclose(b.audio, a.audio, atol=2e-2)  # bf16: rows of another GEMM size
    assert ("irodori-device", True) in seen and all(held for _, held in seen), seen
    assert max(r.record.extra["sample_batch"] for r in results) >= 2


_HOST_READS = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "masked_select", "equal", "unique"}


def _our_callers() -> str:
    """The innermost lines of the package on the stack that led here, innermost first."""
    ours = [f for f in traceback.extract_stack() if "irodori_speaker" in f.filename]
    return " < ".join(f"{f.filename.rsplit('irodori_speaker')[1]}:{f.lineno}" for f in ours[:-5:-1])


def _reference_voice(synth, folder, caption: str | None = None):
    """A voice of a saved random reference latent (and `caption`)."""
    from irodori_speaker import Voice
    from irodori_speaker.synthesis.voices import save_latent, with_caption

    path = folder / "ref.safetensors"
    save_latent(torch.randn(24, synth.config.latent_dim, generator=torch.Generator().manual_seed(3)), path)
    voice = Voice.from_latent(path)
    return voice if caption is None else with_caption(voice, caption)


def _warm_lines(backend: str, step_batching: bool, folder):
    """A prewarmed synthesizer whose four lines (in a reference voice) met on the owner once
    (every shape seen), those lines and their voice, to meet again under watch."""
    synth = _load(backend, max_batch=8, step_batching=step_batching)
    voice = _reference_voice(synth, folder)
    synth.prewarm(voice)
    jobs = [(TEXTS[i], opts(seed=i + 1, steps=4)) for i in range(4)]
    together(synth, jobs, voice=voice)
    return synth, jobs, voice


@pytest.mark.parametrize("step_batching", [False, True], ids=["line-batches", "steps"])
def test_lines_that_meet_read_no_tensor_value_on_the_owner_thread(
    irodori_home, monkeypatch, tmp_path, step_batching
):
    """The CPU half of the CUDA sync check below, for CI: every op the owner's rounds dispatch is
    watched, with every tensor treated as a device one (`may_read` says no), and none may read a
    value to the host (`.item()`, `int(t)`, a 0-d tensor as an index, a boolean mask's nonzero): on
    CUDA each is a sync that drains the GPU while the owner waits. (A copy from pageable host
    memory to the GPU, the other kind of sync, shows only on CUDA.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    from irodori_speaker.engine import encoders

    synth, jobs, voice = _warm_lines("cpu", step_batching, tmp_path)
    reads: set[str] = set()

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._overloadpacket.__name__ in _HOST_READS:
                reads.add(f"{func} at {_our_callers()}")
            return func(*args, **(kwargs or {}))

    plain = DEVICE._round

    def watched() -> None:
        with Watch():
            plain()

    monkeypatch.setattr(encoders, "_on_host", lambda t: False)
    monkeypatch.setattr(DEVICE, "_round", watched)
    batches = DEVICE.batches_run
    results = together(synth, jobs, voice=voice)
    assert all(not isinstance(r, Exception) for r in results), results
    assert DEVICE.batches_run > batches  # they met on the owner (jobs of several lines as one)
    assert not reads, sorted(reads)


@pytest.mark.parametrize("kind", ["v2", "v2-voicedesign"])
def test_a_voice_already_heard_costs_its_line_no_tensor_op(irodori_home, tmp_path, kind):
    """A line in a kept voice finds its states by host work alone (content key, caption text):
    no latent re-read and uploaded, no caption tokenised into tensors. On CUDA each line's upload
    of its reference latent from pageable memory drained the GPU in the encoders' job on the owner
    (the sync test above missed it: its lines had no voice)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    synth = _load("cpu", tiny_random=kind)
    voice = _reference_voice(synth, tmp_path, caption="明るい声で")
    first = synth.voices.states(voice)
    ops: list[str] = []

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Watch():
        again = synth.voices.states(voice)
        by_path = synth.voices.states(str(voice.latent)) if kind == "v2" else again
    assert again is first and not ops, ops
    assert by_path is first  # the same file given as a path is the same voice
    if kind == "v2-voicedesign":  # another caption is another voice
        other = synth.voices.states(_reference_voice(synth, tmp_path, caption="低い声で"))
        assert other is not first


def test_a_lines_voice_key_is_made_on_its_own_thread_not_the_owners(irodori_home, tmp_path, monkeypatch):
    """The key a voice's states are kept by (its reference file's hash: a path resolved and
    stat'ed; its caption's text) is host work each line makes on its own thread: in the encoders'
    job on the device owner it was 5 % of the owner's time at 64 streams (H100). Lines that meet
    on the owner make theirs before their jobs; the owner finds the kept states by it."""
    synth, jobs, voice = _warm_lines("cpu", False, tmp_path)
    made: list[str] = []
    plain = synth.voices.reference_key

    def watched(*args, **kwargs):
        made.append(threading.current_thread().name)
        return plain(*args, **kwargs)

    monkeypatch.setattr(synth.voices, "reference_key", watched)
    batches = DEVICE.batches_run
    results = together(synth, jobs, voice=voice)
    assert all(not isinstance(r, Exception) for r in results), results
    assert DEVICE.batches_run > batches  # they met on the owner
    assert len(made) == len(jobs) and "irodori-device" not in made, made


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (its sync debug mode)")
@pytest.mark.parametrize("step_batching", [False, True], ids=["line-batches", "steps"])
def test_lines_that_meet_on_cuda_sync_nothing_on_the_owner_thread(irodori_home, tmp_path, step_batching):
    """CUDA's sync debug mode names every synchronising call; none may come from the owner thread
    while lines meet there (their decode windows batched, the v4.1-MF predictor included), in a
    reference voice (its latent was uploaded from pageable memory in every line's encoders' job
    until the fifteenth session)."""
    import warnings

    synth, jobs, voice = _warm_lines("cuda", step_batching, tmp_path)  # every shape once
    syncs: set[str] = set()
    shown = warnings.showwarning

    def note(message, category, filename, lineno, *rest):
        if "synchroniz" in str(message) and threading.current_thread().name == "irodori-device":
            syncs.add(f"{_our_callers()} ({filename.rsplit('/', 1)[-1]}:{lineno})")

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = note
            results = together(synth, jobs, voice=voice)
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = shown
    assert all(not isinstance(r, Exception) for r in results), results
    assert not syncs, sorted(syncs)


def test_the_duration_predictor_runs_only_when_its_length_is_used(irodori_home, monkeypatch):
    """Asked seconds: no predictor forward (and no host read of it); otherwise one per piece."""
    mf = _load("cpu", tiny_random="v4.1-mf")
    calls: list[int] = []
    real = mf.model.predict_log_frames
    monkeypatch.setattr(mf.model, "predict_log_frames", lambda *a, **k: calls.append(1) or real(*a, **k))
    fixed = mf.synthesize("長さを決めた行です。", options=opts(seconds=1.0, steps=2))
    assert not calls and fixed.record.extra.get("duration_source") is None
    predicted = mf.synthesize("長さを予測する行です。", options=opts(steps=2))
    assert calls == [1] and predicted.record.extra["duration_source"] == "predictor"


class _BrokenStepper:
    """A stepper whose iteration raises past its own handling (a bug), holding one line."""

    def __init__(self) -> None:
        self.failed: list[BaseException] = []
        self.lines = 1

    def has_work(self) -> bool:
        return self.lines > 0

    def iterate(self) -> None:
        raise RuntimeError("a bug in a step")

    def fail(self, error: BaseException) -> None:
        self.failed.append(error)
        self.lines = 0


def test_a_step_that_raises_fails_its_own_lines_and_the_owner_goes_on():
    owner = DeviceOwner()
    broken = _BrokenStepper()
    owner.wake(broken)
    # the owner went on: a job after it runs, on the owner (the stepper's lines were failed)
    name = lambda: threading.current_thread().name  # noqa: E731
    assert _through_owner(owner, [name]) == ["irodori-device"]
    assert len(broken.failed) == 1 and "a bug in a step" in str(broken.failed[0])
    assert not owner._steppers


def test_a_broken_owner_fails_its_queued_jobs_instead_of_leaving_them_waiting(monkeypatch):
    owner = DeviceOwner()

    def broken_round() -> None:
        raise RuntimeError("the owner's own bug")

    monkeypatch.setattr(owner, "_round", broken_round)
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            owner.run(lambda: 1)
        except RuntimeError as e:
            errors.append(e)

    with MODEL_LOCK:  # the job is queued (not run inline), then the owner fails its round
        t = threading.Thread(target=caller)
        t.start()
        while not owner.queued():
            threading.Event().wait(0.002)
    t.join(10)
    assert not t.is_alive() and len(errors) == 1 and "own bug" in str(errors[0])
    assert owner._thread is None and not owner.queued()
    monkeypatch.undo()
    assert _through_owner(owner, [lambda: "again"]) == ["again"]  # a new owner thread serves


def test_a_host_copy_whose_wait_failed_raises_in_its_line():
    from irodori_speaker.engine.hardware.owner import HostCopy

    class FailingEvent:
        def synchronize(self):
            raise RuntimeError("an illegal memory access was encountered")

    owner = DeviceOwner()
    copy = HostCopy(torch.zeros(3), FailingEvent())
    owner._copies.add(copy, 0)
    waiter = owner._copies._waiters[0]
    with pytest.raises(RuntimeError, match="illegal memory access"):
        copy.wait()
    waiter.join(2)


def test_the_device_is_never_busy_on_the_cpu():
    owner = DeviceOwner()
    owner.track_busy = True
    _through_owner(owner, [lambda: torch.randn(64, 64) @ torch.randn(64, 64)] * 2)
    assert not owner.backlog_above(0)  # a CPU job's work is done when it returns: no admission wait


def _backlog(owner: DeviceOwner) -> int:
    """How many launches `backlog_above` says the device holds (it is monotone in its argument)."""
    return sum(owner.backlog_above(n) for n in range(16))


def test_the_backlog_counts_the_owners_launches_the_device_has_not_finished():
    """Marks stand in for CUDA events (the only mock here: a CPU's work is done when it returns):
    the device holds more than n launches while the (n + 1)-th newest is unfinished, and finished
    marks are let go as launches go on."""

    class Mark:
        def __init__(self) -> None:
            self.done = False

        def query(self) -> bool:
            return self.done

    marks: list[Mark] = []
    owner = DeviceOwner()
    owner._mark = lambda: marks.append(Mark()) or marks[-1]
    assert _backlog(owner) == 0  # nothing tracked yet
    owner.track_busy = True
    _through_owner(owner, [lambda: None] * 3)
    assert len(marks) == 3 and _backlog(owner) == 3
    assert owner.backlog_above(2) and not owner.backlog_above(3)
    marks[0].done = True
    assert _backlog(owner) == 2
    marks[1].done = marks[2].done = True
    assert _backlog(owner) == 0
    _through_owner(owner, [lambda: None])
    assert _backlog(owner) == 1
    assert list(owner._marks) == [marks[3]]  # the finished ones were let go


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (work still running after its launch)")
def test_the_backlog_counts_the_owners_launches_still_running_on_cuda():
    a = torch.randn(4096, 4096, device="cuda")
    owner = DeviceOwner()
    owner.track_busy = True

    def job():
        b = a
        for _ in range(40):  # tens of ms of queued work
            b = torch.tanh(b @ a) * 0.01
        return b

    out = _through_owner(owner, [job, job])
    assert _backlog(owner) == 2  # both launched, the first still running (~0.1 s of fp32 GEMMs)
    out[-1].sum().item()  # wait for it
    assert _backlog(owner) == 0


def test_jobs_of_one_kind_queued_together_run_as_one_call():
    owner = DeviceOwner()
    calls: list[list] = []

    def many(items):
        calls.append(list(items))
        return [x * 10 for x in items]

    def submit(x, key="a", limit=3):
        return lambda o: o.run_batched(key, x, many, limit=limit)

    out = queue_then_release(owner, [submit(1), submit(2), submit(3, "b"), submit(4), submit(5), submit(6)])
    assert out == [10, 20, 30, 40, 50, 60]
    # key "a": 1, 2, 4 (the limit), then 5, 6; key "b" alone
    assert sorted(map(sorted, calls)) == [[1, 2, 4], [3], [5, 6]], calls
    assert owner.batches_run == 2 and owner.jobs_run == 6
    assert owner.run_batched("a", 7, many) == 70 and calls[-1] == [7]  # alone: inline, one item


def test_take_says_how_many_of_the_jobs_that_could_meet_go_in_one_call():
    """Decode windows where graphs fill a call up to its bucket: three queued windows go as two
    and then one (`engine.batch.lines_to_take`), not as four rows one of them a filler."""
    from irodori_speaker.engine.batch import lines_to_take

    owner = DeviceOwner()
    calls: list[list] = []

    def many(items):
        calls.append(list(items))
        return [x * 10 for x in items]

    def submit(x):
        return lambda o: o.run_batched("w", x, many, limit=4, take=lines_to_take)

    assert queue_then_release(owner, [submit(1), submit(2), submit(3)]) == [10, 20, 30]
    assert sorted(map(len, calls)) == [1, 2] and owner.jobs_run == 3


def test_a_batch_that_raises_runs_its_jobs_alone_so_only_the_bad_one_fails():
    owner = DeviceOwner()
    sizes: list[int] = []

    def many(items):
        sizes.append(len(items))
        if "bad" in items:
            raise ValueError("bad input")
        return [s.upper() for s in items]

    out = queue_then_release(owner, [lambda o, s=s: o.run_batched("k", s, many) for s in ("a", "bad", "c")])
    assert out[0] == "A" and out[2] == "C" and isinstance(out[1], ValueError), out
    assert sizes == [3, 1, 1, 1]


def test_a_cancelled_job_leaves_its_batch_unrun():
    owner = DeviceOwner()
    seen: list[list] = []
    token = CancelToken()

    def many(items):
        seen.append(list(items))
        return items

    calls = [lambda o: o.run_batched("k", 1, many, token), lambda o: o.run_batched("k", 2, many)]
    out = queue_then_release(owner, calls, before_release=token.cancel)  # cancelled while queued
    assert isinstance(out[0], Cancelled) and out[1] == 2
    assert seen and all(1 not in items for items in seen)


def test_normal_jobs_run_by_when_due_and_urgent_ones_first():
    """Due: the later of a job's deadline and its arrival (no stepper here: nothing is held back,
    only ordered)."""
    from irodori_speaker.engine.hardware.owner import URGENT

    owner = DeviceOwner()
    order: list[str] = []
    now = __import__("time").monotonic()

    def job(name, **kw):
        return lambda o: o.run(lambda: order.append(name), **kw)

    queue_then_release(
        owner,
        [
            job("late", deadline=now + 30),
            job("early", deadline=now + 20),
            job("urgent", priority=URGENT),
            job("arrived"),  # due when it arrived: before both deadlines
        ],
    )
    assert order == ["urgent", "arrived", "early", "late"], order


class _Lines:
    """A stepper with `steps` steps of work, recording when each ran."""

    def __init__(self, steps: int) -> None:
        self.left = steps
        self.times: list[float] = []

    def has_work(self) -> bool:
        return self.left > 0

    def iterate(self) -> None:
        import time

        self.left -= 1
        self.times.append(time.monotonic())
        time.sleep(0.01)

    def fail(self, error: BaseException) -> None:
        self.left = 0


def test_while_lines_step_a_job_far_from_its_deadline_waits_and_one_due_does_not():
    import time

    owner = DeviceOwner()
    lines = _Lines(steps=40)  # ~0.4 s of steps
    ran: dict[str, float] = {}
    with MODEL_LOCK:
        owner.wake(lines)
        start = time.monotonic()
        t_far = threading.Thread(
            target=lambda: owner.run(lambda: ran.setdefault("far", time.monotonic()), deadline=start + 0.2)
        )
        t_now = threading.Thread(target=lambda: owner.run(lambda: ran.setdefault("now", time.monotonic())))
        t_far.start()
        t_now.start()
        while owner.queued() < 2:
            threading.Event().wait(0.002)
    t_far.join(5)
    t_now.join(5)
    assert set(ran) == {"far", "now"}
    steps_before = lambda t: sum(s < t for s in lines.times)  # noqa: E731
    assert steps_before(ran["now"]) <= 1  # due: in the first round
    assert ran["far"] >= start + 0.2 - 0.05 and steps_before(ran["far"]) >= 5  # waited for its time
    assert lines.left == 0 or ran["far"] < lines.times[-1]  # not held back till the steps ended


@pytest.mark.parametrize("step_batching", [False, True], ids=["line-batches", "steps"])
def test_the_owner_decides_nothing_from_device_values(irodori_home, monkeypatch, step_batching):
    """A read of a device tensor's values on the owner thread waits for every launch before it
    (the GPU drains). With the CPU's tensors taken for device ones (`encoders._on_host`: a stand-in
    for a GPU, which this machine lacks), lines that meet on the owner branch on no tensor's value
    (`__bool__` / `item`) there, and sound as alone: the general forms the owner takes instead of a
    shortcut (masks kept, empty rows handled) give the same numbers. Allowed: `sampler._any`, one
    read per voice mask, remembered (the plan's guidance groups depend on it)."""
    import traceback

    from irodori_speaker.engine import encoders

    synth = _load("cpu", max_batch=8, step_batching=step_batching)
    jobs = [(TEXTS[i], opts(seed=i, steps=3)) for i in range(4)]
    alone = [synth.synthesize(t, options=o) for t, o in jobs]
    reads: list[str] = []

    def spy(name):
        real = getattr(torch.Tensor, name)

        def read(self, *a, **k):
            if threading.current_thread().name == "irodori-device":
                stack = traceback.extract_stack(limit=8)
                if not any(f.name == "_any" for f in stack):
                    reads.append(f"{name} at {stack[-2].filename}:{stack[-2].lineno} ({stack[-2].name})")
            return real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, read)

    monkeypatch.setattr(encoders, "_on_host", lambda t: False)
    for name in ("__bool__", "item"):
        spy(name)
    met = together(synth, jobs)
    monkeypatch.undo()
    assert all(not isinstance(r, Exception) for r in met), met
    assert reads == [], reads
    for a, b in zip(alone, met):
        np.testing.assert_allclose(b.audio, a.audio, atol=1e-5)


def test_no_device_reads_keeps_the_general_form_with_the_same_result(monkeypatch):
    from irodori_speaker.engine import encoders
    from irodori_speaker.engine.encoders import attend_safe, key_mask, may_read, no_device_reads

    monkeypatch.setattr(encoders, "_on_host", lambda t: False)  # a device tensor (no GPU here)
    mask = torch.ones(2, 5, dtype=torch.bool)
    q = k = v = torch.randn(2, 1, 5, 4)
    assert may_read(mask) and key_mask(mask) is None  # a read allowed: the shortcut
    shortcut = attend_safe(q, k, v, key_mask(mask))
    with no_device_reads():
        assert not may_read(mask)
        kept = key_mask(mask)
        assert kept is not None and kept.shape == (2, 1, 1, 5)
        general = attend_safe(q, k, v, kept)
    assert may_read(mask)  # the block left, reads allowed again
    torch.testing.assert_close(general, shortcut)


def test_a_lines_lane_moves_its_jobs_ahead_or_behind():
    from irodori_speaker.engine.hardware.owner import URGENT
    from irodori_speaker.lanes import HIGH_LANE, LOW_LANE, line_lane

    owner = DeviceOwner()
    order: list[str] = []

    def job(name, lane=None, **kw):
        def call(o):
            if lane is None:
                return o.run(lambda: order.append(name), **kw)
            with line_lane(lane):
                return o.run(lambda: order.append(name), **kw)

        return call

    queue_then_release(
        owner,
        [
            job("normal"),
            job("low first audio", LOW_LANE, priority=URGENT),
            job("normal first audio", priority=URGENT),
            job("high later work", HIGH_LANE),
            job("high first audio", HIGH_LANE, priority=URGENT),
        ],
    )
    # a high line's first-audio work before every other URGENT job; its other work keeps its place
    # (NORMAL, by arrival); a low line's first audio is NORMAL
    assert order == ["high first audio", "normal first audio", "normal", "low first audio", "high later work"]


@pytest.mark.parametrize("step_batching", [False, True], ids=["line-batches", "step-batching"])
def test_the_tail_trim_rides_on_the_job_that_made_the_latent(irodori_home, monkeypatch, step_batching):
    """Each line's tail-trim frame is made in the sampling job (alone, a line batch or the step that
    finished it) and read from the host: no job of its own on the device owner, one queue wait
    less before a line's first audio. The trimmed audio is the same either way (a quiet tail cut
    at the same frame, tests/test_synthesizer.py)."""
    import sys

    import irodori_speaker.synthesis.synthesizer as synthesizer

    synth = _load("cpu", max_batch=8, step_batching=step_batching)
    where: list[str] = []
    plain = synthesizer.trim_frame

    def traced(latent):
        names, frame = set(), sys._getframe(1)
        while frame is not None:
            names.add(frame.f_code.co_name)
            frame = frame.f_back
        where.append("with the latent" if names & {"_sample_batch", "_step_lines"} else "a job of its own")
        return plain(latent)

    monkeypatch.setattr(synthesizer, "trim_frame", traced)
    jobs = [(text, opts(seed=i, steps=3, seconds=1.0)) for i, text in enumerate(TEXTS)]
    results = together(synth, jobs)
    assert not [r for r in results if isinstance(r, Exception)], results
    alone = synth.synthesize(TEXTS[0], options=opts(seed=9, steps=3, seconds=1.0))
    assert len(alone.audio) > 0
    assert where == ["with the latent"] * (len(TEXTS) + 1)  # every line, each once, none on its own
    assert max(r.record.extra.get("sample_batch", 1) for r in results) > 1  # the lines did meet


def _half_second_of_gpu_sleep() -> int:
    """`torch.cuda._sleep` cycles that keep the GPU busy for at least 0.5 s."""

    def sleep_ms(cycles: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    # the fastest of three: an idle GPU's clock is low (345 MHz on the H100) until work wakes it;
    # timed once at that clock, the sleep came out short (the copy landed before the wait began)
    return int(20_000_000 * 500 / min(sleep_ms(20_000_000) for _ in range(3)))


def _assert_waited(spin: bool, wall: float, cpu: float) -> None:
    """A wait of most of the GPU's sleep: spinning holds a core, blocking leaves it near idle."""
    assert wall > 0.2, wall  # the GPU still had most of its sleep ahead
    if spin:
        assert cpu > 0.5 * wall, (cpu, wall)
    else:
        assert cpu < 0.2 * wall, (cpu, wall)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a copy that lands later)")
@pytest.mark.parametrize("spin", [False, True])
def test_the_copy_waiter_sleeps_while_its_copy_is_on_its_way_on_cuda(spin):
    """The waiter blocks in the driver while the GPU works towards its copy (a blocking-sync
    event): the process stays near idle. CUDA's default spin (`spin_copies`, the A/B's "+s")
    held a core for as long: the case that shows this check can tell them apart."""
    x = torch.ones(4, device="cuda")
    cycles = _half_second_of_gpu_sleep()
    owner = DeviceOwner()
    owner.spin_copies = spin

    def job():
        torch.cuda._sleep(cycles)
        return owner.to_host(x * 2)

    (copy,) = _through_owner(owner, [job])
    assert copy.pending
    wall0, cpu0 = time.perf_counter(), time.process_time()
    np.testing.assert_array_equal(copy.wait().numpy(), np.full(4, 2.0, np.float32))
    _assert_waited(spin, time.perf_counter() - wall0, time.process_time() - cpu0)


def test_a_line_alone_copies_with_its_own_spin_setting_not_the_waiters(monkeypatch):
    """The inline copy (a line alone) spins by default (`spin_inline`: a blocking wake cost one
    stream 6-13 % of its rate), the waiter's copies block (`spin_copies` off): two settings, each
    read where its copy is made. `copy_now` is a stand-in that records its setting (no CUDA on
    the CI machine); the CUDA tests below measure what each setting does."""
    import irodori_speaker.engine.hardware.owner as owner_mod

    asked: list[bool] = []

    def copy_now(tensor, spin):
        asked.append(spin)
        return tensor.cpu()

    monkeypatch.setattr(owner_mod, "copy_now", copy_now)
    owner = DeviceOwner()
    assert owner.spin_inline and not owner.spin_copies
    owner.to_host(torch.ones(2))
    owner.spin_inline, owner.spin_copies = False, True
    owner.to_host_rows(torch.ones(2, 2), [(0, 2), (0, 1)])
    assert asked == [True, False]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (a copy that lands later)")
@pytest.mark.parametrize("spin", [False, True])
def test_a_line_alones_inline_copy_spins_or_sleeps_as_set_on_cuda(spin):
    """A line alone copies inline (no owner thread, no waiter): `.cpu()` spins in the driver
    (`spin_inline`, the preset's: a blocking wake cost one stream 6-13 % of its rate); off, a
    blocking event leaves the core idle. The copy has landed when `to_host` returns."""
    x = torch.ones(4, device="cuda")
    cycles = _half_second_of_gpu_sleep()
    owner = DeviceOwner()
    assert owner.spin_inline and not owner.spin_copies  # the defaults the A/B chose
    owner.spin_inline = spin
    torch.cuda._sleep(cycles)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    rows = owner.to_host_rows((x * 2).view(2, 2), [(0, 2), (1, 2)])
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    assert not any(r.pending for r in rows) and owner._thread is None  # inline: no owner thread
    np.testing.assert_array_equal(rows[0].wait().numpy(), np.full(2, 2.0, np.float32))
    np.testing.assert_array_equal(rows[1].wait().numpy(), np.full(1, 2.0, np.float32))
    _assert_waited(spin, wall, cpu)


class _CountingToken(CancelToken):
    """A token that counts how often a waiter looks at it: a polling wait looks every few ms."""

    __slots__ = ("looks",)

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0

    @property
    def cancelled(self) -> bool:
        self.looks += 1
        return super().cancelled

    def raise_if_cancelled(self) -> None:
        self.looks += 1
        super().raise_if_cancelled()


def test_a_job_cancelled_before_it_starts_never_runs_and_its_caller_sleeps_till_then():
    """The cancel takes the queued job out. No polling: the caller looks at its token when it
    queues and when woken (it looked every 10 ms before, each look a thread wake and the GIL: 2-4 %
    of 64 streams' rate on the CPU)."""
    owner = DeviceOwner()
    token = _CountingToken()
    out: list = []

    def caller():
        try:
            out.append(owner.run(lambda: "ran", token))
        except Cancelled as e:
            out.append(e)

    with MODEL_LOCK:  # the owner cannot start a round while the lock is held here
        t = threading.Thread(target=caller)
        t.start()
        while not owner.queued():
            threading.Event().wait(0.002)
        threading.Event().wait(0.3)  # 30 looks' worth of polling
        looks = token.looks
        token.cancel("stopped")
        t.join(5)
        assert not t.is_alive()  # the cancel took the job out with the lock still held here
    assert looks <= 3, looks
    assert len(out) == 1 and isinstance(out[0], Cancelled) and str(out[0]) == "stopped"
    assert owner.run(lambda: "next") == "next"


def test_a_copys_waiter_sleeps_until_the_copy_lands_or_a_cancel():
    token = _CountingToken()
    copy = HostCopy(torch.arange(3.0), event=object())  # on its way (its event: the waiter's)
    got: list = []
    t = threading.Thread(target=lambda: got.append(copy.wait(token)))
    t.start()
    threading.Event().wait(0.3)
    assert copy.pending and t.is_alive() and not got
    copy._land()
    t.join(5)
    assert len(got) == 1 and torch.equal(got[0], torch.arange(3.0))
    assert token.looks <= 3, token.looks

    stop, errors = CancelToken(), []
    other = HostCopy(torch.zeros(1), event=object())

    def waiter():
        try:
            other.wait(stop)
        except Cancelled as e:
            errors.append(e)

    t = threading.Thread(target=waiter)
    t.start()
    threading.Event().wait(0.05)
    stop.cancel()
    t.join(5)
    assert not t.is_alive() and len(errors) == 1 and other.pending  # woken, the copy still out


def test_a_cancel_wakes_each_waiter_in_a_waking_block_once():
    token, calls = CancelToken(), []
    with token.waking(lambda: calls.append("left")):
        pass

    def broken():
        raise RuntimeError("a waker that raises")

    with token.waking(broken), token.waking(lambda: calls.append("inside")):
        token.cancel()
        token.cancel()
    assert calls == ["inside"]  # the one that left before was not called; the raise did not stop it
    with token.waking(lambda: calls.append("late")):  # after the cancel: the caller checks
        assert token.cancelled
    assert calls == ["inside"]
