"""interrupt / skip / clear / pause / resume, cancellation inside the model, and faults."""

from __future__ import annotations

import asyncio
import logging
import threading

import numpy as np
import pytest
from speaker_fakes import SR, EventLog, FakeSynth, amplitude, runs

from irodori_speaker.engine.hardware.lock import MODEL_LOCK
from irodori_speaker.errors import InputError
from irodori_speaker.outputs import NullOutput
from irodori_speaker.speaker import Speaker, UtteranceState
from owner_threads import irodori_threads

LONG = "これはとても長い台詞なので途中で止めることになります"  # 26 chars


def _lock_is_free() -> bool:
    got = MODEL_LOCK.acquire(blocking=False)
    if got:
        MODEL_LOCK.release()
    return got


async def _until(pred, step: float = 0.005) -> None:
    while not pred():
        await asyncio.sleep(step)


def test_interrupt_stops_within_a_few_blocks_with_a_fade(run):
    fake = FakeSynth(seconds_per_char=0.1)  # 2.6 s line
    out = NullOutput(speed=1.0, record=True, block_s=0.01, fade_s=0.01)
    amp = amplitude(LONG)

    async def body():
        async with Speaker(fake, output=out) as s:
            log = EventLog(s)
            h = s.enqueue(LONG)
            queued = s.enqueue("後ろに並んだ行")
            await _until(lambda: h.state == UtteranceState.PLAYING)
            await asyncio.sleep(0.3)
            at = out.position  # samples handed over before the request
            s.interrupt()
            await h
            await queued
            return log, h, queued, at

    log, h, queued, at = run(body())
    rec = out.recorded()[:, 0]
    line = np.flatnonzero(rec > 1e-6)
    after = line[line >= at]
    # at most the block being rendered when interrupt() was called, plus the 10 ms fade (+1 block slack)
    assert len(after) <= 3 * 480, len(after)
    tail = rec[after]
    assert np.all(np.diff(tail[-480:]) <= 1e-7), "the last 10 ms must only go down (a fade, no click)"
    assert tail[-1] < 0.05 * amp
    assert np.max(rec) <= amp + 1e-6
    assert h.state == UtteranceState.INTERRUPTED
    assert queued.state == UtteranceState.CANCELLED  # interrupt() also drops what was queued
    ev = log.one("playback_interrupted", h.id)
    # the fraction is what reached the output (fade included) over the line's length
    assert abs(ev.played_fraction - len(line) / fake.samples_for(LONG)) < 1e-3
    assert 0 < ev.played_fraction < 1 and h.played_fraction == ev.played_fraction
    assert LONG.startswith(ev.heard_text) and len(ev.heard_text) == round(ev.played_fraction * len(LONG))
    assert log.of("mouth")[-1].level == 0.0  # lip sync reset


def test_skip_goes_on_with_the_next_line(run):
    fake = FakeSynth(seconds_per_char=0.05)
    out = NullOutput(speed=2.0, record=True)

    async def body():
        async with Speaker(fake, output=out) as s:
            a = s.enqueue(LONG)
            b = s.enqueue("次の行はちゃんと読む")
            await _until(lambda: a.state == UtteranceState.PLAYING)
            assert s.skip() is a
            await asyncio.gather(a, b)
            return a, b

    a, b = run(body())
    assert a.state == UtteranceState.INTERRUPTED and b.state == UtteranceState.PLAYED
    vals = [v for v, _ in runs(out.recorded()) if v != 0.0]
    assert amplitude("次の行はちゃんと読む") in vals


def test_clear_cancels_the_synthesis_inside_the_model_between_steps(run):
    fake = FakeSynth(steps=400, step_s=0.005)  # 2 s of sampling if never cancelled

    async def body():
        async with Speaker(fake, output=NullOutput(speed=float("inf"))) as s:
            log = EventLog(s)
            h = s.enqueue("重い合成の行")
            await _until(lambda: bool(log.of("synthesis_started", h.id)))
            dropped = s.clear()
            await h
            assert dropped == [h]
            fake.steps = 2
            after = await s.say("次の行")  # the model is free again
            return log, h, after

    log, h, after = run(body())
    call = next(c for c in fake.calls if c.text == "重い合成の行")
    assert h.state == UtteranceState.CANCELLED
    assert log.one("skipped", h.id).reason == "cancelled"
    assert call.cancelled and call.steps_done < 400
    assert not log.of("synthesis_finished", h.id)
    assert after.state == UtteranceState.PLAYED
    assert _lock_is_free()


def test_clear_by_lane_keeps_the_other_lanes(run):
    fake = FakeSynth(seconds_per_char=0.02)

    async def body():
        async with Speaker(fake, output=NullOutput(speed=4.0)) as s:
            s.pause()
            hs = [
                s.enqueue("雑談一", priority="low"),
                s.enqueue("質問への答え"),
                s.enqueue("雑談二", priority="low"),
            ]
            dropped = s.clear("low")
            s.resume()
            await asyncio.gather(*hs)
            return hs, dropped

    (l1, n, l2), dropped = run(body())
    assert set(dropped) == {l1, l2}
    assert l1.state == l2.state == UtteranceState.CANCELLED and n.state == UtteranceState.PLAYED


def test_pause_holds_the_line_and_resume_continues_it(run):
    fake = FakeSynth(seconds_per_char=0.04)  # 1.04 s
    out = NullOutput(speed=1.0, record=True)
    amp = amplitude(LONG)

    async def body():
        async with Speaker(fake, output=out) as s:
            h = s.enqueue(LONG)
            await _until(lambda: h.state == UtteranceState.PLAYING)
            await asyncio.sleep(0.2)
            s.pause()
            assert s.paused
            await asyncio.sleep(0.3)
            mid = h.state
            s.resume()
            await h
            return h, mid

    h, mid = run(body())
    assert mid == UtteranceState.PLAYING and h.state == UtteranceState.PLAYED
    rec = out.recorded()[:, 0]
    loud = np.flatnonzero(rec > 1e-6)
    inner_gaps = np.diff(loud) - 1
    assert inner_gaps.max() >= 0.1 * SR  # a held silence inside the line
    # nothing was lost: the line's energy is its full length minus what the two fades removed
    n = fake.samples_for(LONG)
    assert abs(rec.sum() / amp - n) <= 480 + 2


def test_empty_and_whitespace_lines_are_skipped_with_an_event(run):
    async def body():
        async with Speaker(FakeSynth(), output="null") as s:
            log = EventLog(s)
            empty = s.enqueue("   \n ")
            ok = s.enqueue("ふつうの行")
            await asyncio.gather(empty, ok)
            return log, empty, ok

    log, empty, ok = run(body())
    assert empty.state == UtteranceState.SKIPPED
    assert log.one("skipped", empty.id).reason == "empty"
    assert ok.state == UtteranceState.PLAYED


def test_a_failing_line_ends_with_its_error_and_the_next_one_plays(run):
    fake = FakeSynth(fail=("壊れる行",))

    async def body():
        async with Speaker(fake, output=NullOutput(speed=float("inf")), streaming=False) as s:
            log = EventLog(s)
            bad = s.enqueue("壊れる行")
            good = s.enqueue("次は大丈夫")
            with pytest.raises(RuntimeError, match="fake failure"):
                await bad
            await good
            return log, bad, good, s.metrics()

    log, bad, good, m = run(body())
    assert bad.state == UtteranceState.FAILED and isinstance(bad.error, RuntimeError)
    assert isinstance(log.one("synthesis_failed", bad.id).error, RuntimeError)
    assert good.state == UtteranceState.PLAYED
    assert m.lines_failed == 1 and m.lines_played == 1


def test_a_stream_that_breaks_mid_line_fails_that_line_only(run):
    fake = FakeSynth(seconds_per_char=0.05, chunks=4, chunk_s=0.05, fail_after_chunks=2)

    async def body():
        async with Speaker(fake, output=NullOutput(speed=1.0)) as s:
            log = EventLog(s)
            bad = s.enqueue("途中で壊れるストリーム")
            with pytest.raises(RuntimeError, match="decode failure"):
                await bad
            fake.fail_after_chunks = None
            good = await s.say("次は最後まで")
            return log, bad, good

    log, bad, good = run(body())
    assert log.of("playback_started", bad.id)  # it had started from its first chunks
    assert bad.state == UtteranceState.FAILED
    assert good.state == UtteranceState.PLAYED


def test_cancelling_a_say_task_cancels_its_line_and_nothing_deadlocks(run):
    fake = FakeSynth(seconds_per_char=0.05)

    async def body():
        async with Speaker(fake, output=NullOutput(speed=1.0)) as s:
            task = asyncio.create_task(s.say(LONG))
            await _until(lambda: s.current is not None)
            h = s.current
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await h
            # and while a line is inside the model
            fake.steps, fake.step_s = 300, 0.005
            task = asyncio.create_task(s.say("合成中に取り消す"))
            await _until(lambda: len(fake.calls) >= 3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            fake.steps, fake.step_s = 2, 0.001
            after = await s.say("その後の行")
            return h, after

    h, after = run(body())
    assert h.state == UtteranceState.INTERRUPTED
    assert fake.calls[2].cancelled
    assert after.state == UtteranceState.PLAYED
    assert _lock_is_free()


def test_closing_mid_line_ends_everything_and_leaks_no_thread(run):
    fake = FakeSynth(seconds_per_char=0.1)

    async def body():
        s = Speaker(fake, output=NullOutput(speed=1.0))
        await s.open()
        log = EventLog(s)
        playing = s.enqueue(LONG)
        await _until(lambda: playing.state == UtteranceState.PLAYING)
        fake.steps, fake.step_s = 1000, 0.005
        in_model = s.enqueue("合成中のまま閉じる")
        queued = s.enqueue("まだ並んでいる")
        await _until(lambda: len(fake.calls) >= 3)
        await s.aclose()
        await asyncio.gather(playing, in_model, queued)
        with pytest.raises(InputError):
            s.enqueue("閉じた後")
        return log, playing, in_model, queued

    log, playing, in_model, queued = run(body())
    assert playing.state == UtteranceState.INTERRUPTED
    assert in_model.state == queued.state == UtteranceState.CANCELLED
    assert fake.calls[2].cancelled
    assert log.events[-1].kind == "closed"
    assert _lock_is_free()
    assert not irodori_threads()


def test_exit_drains_by_default_and_cancels_on_an_exception(run):
    fake = FakeSynth(seconds_per_char=0.01)

    async def drained():
        async with Speaker(fake, output=NullOutput(speed=4.0)) as s:
            hs = [s.enqueue(t) for t in ("一つ目", "二つ目", "三つ目")]
        return hs

    assert [h.state for h in run(drained())] == [UtteranceState.PLAYED] * 3

    async def failed():
        hs = []
        with pytest.raises(KeyError):
            async with Speaker(fake, output=NullOutput(speed=1.0)) as s:
                hs = [s.enqueue(t) for t in ("一つ目", "二つ目", "三つ目")]
                raise KeyError("boom")
        return hs

    states = [h.state for h in run(failed())]
    assert UtteranceState.PLAYED not in states[1:]
    assert all(st.terminal for st in states)


def test_exceptions_in_user_callbacks_never_disturb_the_pipeline(run, caplog):
    caplog.set_level(logging.ERROR, logger="irodori_speaker.speaker")

    async def body():
        async with Speaker(FakeSynth(), output=NullOutput(speed=float("inf"))) as s:

            def bad(ev):
                raise ValueError("user bug")

            async def bad_async(ev):
                raise ValueError("async user bug")

            s.on("playback_started", bad)
            s.on(["playback_finished", "queued"], bad_async)
            hs = [s.enqueue(t) for t in ("一行目", "二行目")]
            await asyncio.gather(*hs)
            await asyncio.sleep(0.01)
            return hs

    hs = run(body())
    assert all(h.state == UtteranceState.PLAYED for h in hs)
    assert "user bug" in caplog.text and "async user bug" in caplog.text


def test_bad_arguments_raise_input_error(run):
    with pytest.raises(InputError):
        Speaker(FakeSynth(), output=[])
    with pytest.raises(InputError):
        Speaker(FakeSynth(), lookahead_lines=-1)
    with pytest.raises(InputError):
        Speaker(FakeSynth(), model="x")  # a synthesizer and loading options

    async def body():
        async with Speaker(FakeSynth(), output="null") as s:
            with pytest.raises(InputError):
                s.enqueue(123)  # type: ignore[arg-type]
            with pytest.raises(InputError):
                s.enqueue("x", priority="urgent")
            with pytest.raises(InputError):
                s.enqueue("x", ttl=-1)
            with pytest.raises(InputError):
                s.on("no_such_event", print)

    run(body())
    with pytest.raises(InputError):
        Speaker(FakeSynth(), output="null").enqueue("not open")


def test_enqueue_threadsafe_from_a_chat_reader_thread(run):
    async def body():
        async with Speaker(FakeSynth(), output=NullOutput(speed=float("inf"))) as s:
            got = []
            t = threading.Thread(target=lambda: got.append(s.enqueue_threadsafe("別スレッドから").result(5)))
            t.start()
            while not got:
                await asyncio.sleep(0.01)
            t.join()
            with pytest.raises(InputError, match="event loop"):
                await asyncio.to_thread(s.enqueue, "直接は呼べない")
            return await got[0]

    assert run(body()).state == UtteranceState.PLAYED
