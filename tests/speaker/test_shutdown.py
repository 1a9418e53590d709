"""Issue 12: closing a Speaker is bounded in every state, on every Python we support.

The hang this guards against: closing (aclose, leaving `async with` by an exception or a task
cancellation) while the first line was still synthesising and nothing played left the scheduler
task "cancelling" forever on Python 3.10 / 3.11 (`asyncio.wait_for` swallowed the cancel). Each
case closes within SHUTDOWN_BOUND (asserted with `asyncio.wait_for`, not by timing), leaves no
worker thread and frees the model lock; then the process's next Speaker on the same synthesizer
speaks a normal line (`speaks_after`). The fake synthesizer checks its cancel token between
steps, like the real sampler.
"""

from __future__ import annotations

import asyncio

import pytest
from speaker_fakes import FakeSynth

from hostile import real_audio
from irodori_speaker.engine.hardware.lock import MODEL_LOCK
from irodori_speaker.outputs import NullOutput
from irodori_speaker.speaker import Speaker, UtteranceState
from owner_threads import irodori_threads

SHUTDOWN_BOUND = 2.0


def _slow_fake() -> FakeSynth:
    return FakeSynth(steps=2000, step_s=0.005)  # a line that would synthesise for 10 s


async def _until(pred, step: float = 0.005) -> None:
    while not pred():
        await asyncio.sleep(step)


def _clean() -> bool:
    got = MODEL_LOCK.acquire(blocking=False)
    if got:
        MODEL_LOCK.release()
    return got and not irodori_threads()


def speaks_after(run, *fakes: FakeSynth) -> None:
    """A closed Speaker cannot speak again: the next Speaker on the same synthesizer does, a
    normal line (the close left no lock held, no thread, nothing wedged in the synthesizer)."""
    for fake in fakes:
        fake.steps = 4  # a normal line, not the 10 s one

        async def body(fake=fake):
            async with Speaker(fake, output=NullOutput(speed=float("inf"))) as s:
                return await s.say("閉じた後の普通の台詞")

        h = run(body())
        assert h.state == UtteranceState.PLAYED, (h.state, h.error)
        real_audio(h.audio)


async def _synthesising(s: Speaker, fake: FakeSynth):
    h = s.enqueue("合成中のまま閉じる")
    await _until(lambda: bool(fake.calls) and h.state == UtteranceState.SYNTHESIZING)
    return h


@pytest.mark.parametrize("state", ["idle", "queued", "synthesising", "playing"])
def test_aclose_is_bounded_in_every_state(run, state: str) -> None:
    fake = _slow_fake() if state != "playing" else FakeSynth(seconds_per_char=0.2)

    async def body():
        s = Speaker(fake, output=NullOutput(speed=1.0))
        await s.open()
        handles = []
        if state == "queued":
            handles = [await _synthesising(s, fake), s.enqueue("並んでいる")]
        elif state == "synthesising":
            handles = [await _synthesising(s, fake)]
        elif state == "playing":
            h = s.enqueue("これはとても長い台詞なので途中で止めることになります")
            await _until(lambda: h.state == UtteranceState.PLAYING)
            handles = [h]
        await asyncio.wait_for(s.aclose(), SHUTDOWN_BOUND)
        return [h.state for h in handles]

    states = run(body())
    assert all(st.terminal for st in states), states
    assert _clean()
    speaks_after(run, fake)


def test_leaving_async_with_by_an_exception_mid_synthesis_is_bounded(run) -> None:
    fake = _slow_fake()

    async def body():
        with pytest.raises(RuntimeError, match="the bot crashed"):
            async with Speaker(fake, output=NullOutput(speed=1.0)) as s:
                await _synthesising(s, fake)
                raise RuntimeError("the bot crashed")
        return s

    run(body(), timeout=SHUTDOWN_BOUND + 5)
    assert _clean()
    speaks_after(run, fake)


def test_cancelling_the_task_that_owns_the_speaker_mid_synthesis_is_bounded(run) -> None:
    fake = _slow_fake()

    async def owner(ready: asyncio.Event) -> None:
        async with Speaker(fake, output=NullOutput(speed=1.0)) as s:
            await _synthesising(s, fake)
            ready.set()
            await asyncio.sleep(3600)

    async def body():
        ready = asyncio.Event()
        task = asyncio.create_task(owner(ready))
        await ready.wait()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=SHUTDOWN_BOUND)
        assert task in done and task.cancelled()

    run(body())
    assert _clean()
    speaks_after(run, fake)


def test_two_speakers_closed_together_mid_line(run) -> None:
    a, b = _slow_fake(), _slow_fake()

    async def body():
        s1 = Speaker(a, output=NullOutput(speed=1.0))
        s2 = Speaker(b, output=NullOutput(speed=1.0))
        await s1.open()
        await s2.open()
        await _synthesising(s1, a)
        s2.enqueue("二つ目は錠を待っている")
        await asyncio.wait_for(asyncio.gather(s1.aclose(), s2.aclose()), SHUTDOWN_BOUND)

    run(body())
    assert _clean()
    speaks_after(run, a, b)


def test_a_second_concurrent_aclose_waits_for_the_same_close(run) -> None:
    fake = _slow_fake()

    async def body():
        s = Speaker(fake, output=NullOutput(speed=1.0))
        await s.open()
        await _synthesising(s, fake)
        first = asyncio.create_task(s.aclose())
        await asyncio.sleep(0)  # the first close has started
        await asyncio.wait_for(s.aclose(), SHUTDOWN_BOUND)
        released = _clean()  # the second aclose() returned only once everything was released
        await first
        return released

    assert run(body())
    speaks_after(run, fake)
