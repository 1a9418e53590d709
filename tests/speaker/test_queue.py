"""Queueing, prefetch, order, lookahead, lanes, TTL, and the shared model lock.

Timing is asserted through recorded events and the audio the null sink
"played", never through wall-clock durations.
"""

from __future__ import annotations

import asyncio
import itertools
import threading

import numpy as np
from speaker_fakes import SR, EventLog, FakeSynth, Recorder, amplitude, runs

from irodori_speaker.engine.hardware.lock import MODEL_LOCK
from irodori_speaker.outputs import NullOutput
from irodori_speaker.speaker import Speaker, UtteranceState

LINES = ["一行目のせりふです", "二行目はこちら", "三行目、おしまい"]


def _line_runs(recorded: np.ndarray) -> list[tuple[float, int]]:
    return [(v, n) for v, n in runs(recorded) if v != 0.0]


def test_lines_play_in_order_back_to_back_with_the_pause(run):
    fake = FakeSynth()
    out = NullOutput(speed=float("inf"), record=True)
    assert len({amplitude(t) for t in LINES}) == len(LINES)

    async def body():
        async with Speaker(fake, output=out, pause_s=0.1) as s:
            handles = [s.enqueue(t) for t in LINES]
            for h in handles:
                await h
            return handles

    handles = run(body())
    assert [h.state for h in handles] == [UtteranceState.PLAYED] * 3
    expected = []
    for i, t in enumerate(LINES):
        if i:
            expected.append(np.zeros(round(0.1 * SR), np.float32))
        expected.append(fake.audio_for(t))
    np.testing.assert_array_equal(out.recorded()[:, 0], np.concatenate(expected))
    for h, t in zip(handles, LINES):
        np.testing.assert_array_equal(h.audio, fake.audio_for(t))
        assert h.played_fraction == 1.0 and h.heard_text == t


def test_prefetch_synthesises_the_next_line_while_one_plays(run):
    # lines of 0.36 s play at real time; synthesis takes ~0.02 s
    fake = FakeSynth(seconds_per_char=0.04)
    out = NullOutput(speed=1.0, record=True)

    async def body():
        async with Speaker(fake, output=out, pause_s=0.05, streaming=False) as s:
            log = EventLog(s)
            hs = [s.enqueue(t) for t in LINES]
            for h in hs:
                await h
            return log, hs

    log, hs = run(body())
    a, b, c = (h.id for h in hs)
    # line 2's synthesis started and finished while line 1 was still being heard
    assert log.index("synthesis_started", b) < log.index("playback_finished", a)
    assert log.index("synthesis_finished", b) < log.index("playback_finished", a)
    assert log.index("synthesis_finished", c) < log.index("playback_finished", b)
    started = [log.one("playback_started", h.id).time for h in hs]
    finished = [log.one("playback_finished", h.id).time for h in hs]
    assert started == sorted(started) and all(f < s for f, s in zip(finished, started[1:]))
    # gapless: between the lines there is exactly the pause of silence, no more
    rs = _line_runs(out.recorded())
    assert [v for v, _ in rs] == [amplitude(t) for t in LINES]
    silences = [n for v, n in runs(out.recorded()) if v == 0.0][1:-1]
    assert silences == [round(0.05 * SR)] * 2


def test_without_prefetch_synthesis_waits_for_playback(run):
    fake = FakeSynth(seconds_per_char=0.01)
    out = NullOutput(speed=2.0)

    async def body():
        async with Speaker(fake, output=out, lookahead_lines=0, pause_s=0.0) as s:
            log = EventLog(s)
            hs = [s.enqueue(t) for t in LINES[:2]]
            for h in hs:
                await h
            return log, hs

    log, (a, b) = run(body())
    assert log.index("synthesis_started", b.id) > log.index("playback_finished", a.id)


def test_lookahead_is_bounded_in_lines_and_seconds(run):
    fake = FakeSynth(seconds_per_char=0.05)  # ~0.5 s per line
    out = NullOutput(speed=1.0)

    async def body(lines: int, seconds: float):
        async with Speaker(fake, output=out, lookahead_lines=lines, lookahead_s=seconds) as s:
            hs = [s.enqueue(f"チャットの行その{i:04d}") for i in range(1000)]
            await s.events("playback_started").__anext__()
            await asyncio.sleep(0.3)  # time for prefetching to fill the window
            synthesised = len(fake.calls) - 1  # minus prewarm
            ready = sum(h.state in (UtteranceState.READY, UtteranceState.SYNTHESIZING) for h in hs)
            s.interrupt()
            await asyncio.gather(*hs)
            return synthesised, ready, hs

    synthesised, ready, hs = run(body(2, 30.0))
    # the playing line + at most 2 ahead (one of which may already sit in the output)
    assert 2 <= synthesised <= 3, synthesised
    assert ready <= 2
    assert sum(h.state == UtteranceState.CANCELLED for h in hs) >= 997
    fake.calls.clear()
    synthesised, ready, _ = run(body(50, 0.9))  # seconds bound: < 0.9 s of ready audio ahead
    assert 2 <= synthesised <= 3, synthesised


def test_priority_lanes_play_high_first_fifo_within_a_lane(run):
    fake = FakeSynth(seconds_per_char=0.005)
    out = NullOutput(speed=float("inf"), record=True)
    texts = {
        "l1": "低い優先の雑談",
        "n1": "普通のチャット一",
        "h1": "スーパーチャット感謝",
        "n2": "普通のチャット二",
    }
    assert len({amplitude(t) for t in texts.values()}) == 4

    async def body():
        async with Speaker(fake, output=out, pause_s=0.0) as s:
            hs = [
                s.enqueue(texts["l1"], priority="low"),
                s.enqueue(texts["n1"]),
                s.enqueue(texts["h1"], priority="high"),
                s.enqueue(texts["n2"], priority="normal"),
            ]
            await asyncio.gather(*hs)

    run(body())
    order = [v for v, _ in _line_runs(out.recorded())]
    assert order == [amplitude(texts[k]) for k in ("h1", "n1", "n2", "l1")]
    assert fake.texts("stream")[:2] == [texts["h1"], texts["n1"]]  # synthesis follows play order


def test_high_priority_goes_next_while_a_line_plays(run):
    fake = FakeSynth(seconds_per_char=0.15)  # the first line lasts 1.35 s: far more than schedule_ahead_s
    out = NullOutput(speed=4.0, record=True)
    t0, t1, t2, th = "最初に話している行", "普通の次の行", "普通のその次", "至急の行です"

    async def body():
        async with Speaker(fake, output=out, pause_s=0.0) as s:
            log = EventLog(s)
            h0 = s.enqueue(t0)
            rest = [s.enqueue(t1), s.enqueue(t2)]
            while h0.state != UtteranceState.PLAYING:
                await asyncio.sleep(0.005)
            hh = s.enqueue(th, priority="high")
            await asyncio.gather(h0, hh, *rest)
            return log, [h0, hh, *rest]

    log, hs = run(body())
    starts = [log.one("playback_started", h.id).time for h in hs]
    assert starts == sorted(starts)  # t0, then the high line, then t1, t2


def test_ttl_drops_stale_lines_instead_of_reading_them_late(run):
    fake = FakeSynth(seconds_per_char=0.04)
    out = NullOutput(speed=1.0, record=True)

    async def body():
        async with Speaker(fake, output=out, ttl={"low": 0.15}) as s:
            log = EventLog(s)
            first = s.enqueue("長めに話している最初の行です")  # ~0.56 s
            stale = s.enqueue("古くなる雑談", priority="low")  # lane default ttl 0.15 s
            fresh = s.enqueue("期限付きだが間に合う", ttl=30.0)
            await asyncio.gather(first, stale, fresh)
            return log, first, stale, fresh

    log, first, stale, fresh = run(body())
    assert stale.state == UtteranceState.EXPIRED
    assert log.one("skipped", stale.id).reason == "expired"
    assert not log.of("playback_started", stale.id)
    assert first.state == fresh.state == UtteranceState.PLAYED
    assert amplitude("古くなる雑談") not in [v for v, _ in _line_runs(out.recorded())]


def test_max_queue_drops_the_oldest_waiting_line_of_the_lowest_lane(run):
    fake = FakeSynth(seconds_per_char=0.02)

    async def body():
        async with Speaker(fake, output=NullOutput(speed=4.0), max_queue=3) as s:
            log = EventLog(s)
            low = s.enqueue("雑談の行", priority="low")
            normal = [s.enqueue(f"チャット{i}") for i in range(3)]
            await asyncio.gather(low, *normal)
            return log, low, normal

    log, low, normal = run(body())
    assert low.state == UtteranceState.CANCELLED
    assert log.one("skipped", low.id).reason == "overflow"
    assert all(h.state == UtteranceState.PLAYED for h in normal)


def test_one_lock_serialises_the_model_work_of_two_speakers(run):
    shared = Recorder()
    fakes = [FakeSynth(steps=3, step_s=0.01, recorder=shared, name=n) for n in ("a", "b")]

    # control: the recorder does see overlap when nothing serialises the calls
    control = Recorder()
    threads = [
        threading.Thread(
            target=FakeSynth(steps=5, step_s=0.01, recorder=control, model_lock=False).synthesize, args=("x",)
        )
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert control.max_active == 2

    async def body():
        async with (
            Speaker(fakes[0], output=NullOutput(speed=float("inf"))) as s1,
            Speaker(fakes[1], output=NullOutput(speed=float("inf"))) as s2,
        ):
            hs = [s.enqueue(f"{n}の{i}行目") for i in range(4) for s, n in ((s1, "甲"), (s2, "乙"))]
            await asyncio.gather(*hs)
            return hs

    hs = run(body())
    assert all(h.state == UtteranceState.PLAYED for h in hs)
    assert shared.max_active == 1
    names = {n for n, _, _ in shared.intervals}
    assert names == {"a", "b"}
    spans = sorted((t0, t1) for _, t0, t1 in shared.intervals)
    assert all(prev[1] <= nxt[0] for prev, nxt in itertools.pairwise(spans))
    assert MODEL_LOCK.acquire(blocking=False)
    MODEL_LOCK.release()


def test_prewarm_runs_once_per_configured_voice_before_the_first_line(run):
    fake = FakeSynth()

    async def body():
        async with Speaker(fake, output="null", voice="alice", voices=["bob", "alice"]) as s:
            await s.say("こんにちは")

    run(body())
    kinds = [(c.kind, c.voice) for c in fake.calls]
    assert kinds[:2] == [("prewarm", "alice"), ("prewarm", "bob")]
    assert kinds[2] == ("stream", "alice")


def test_the_model_lock_is_free_between_the_steps_of_a_line_being_synthesised(run):
    # One lock level: the synthesizer holds the lock per step / chunk, the Speaker never for a
    # whole line, so other model work (another Speaker, the server, prebuild) runs in between.
    fake = FakeSynth(steps=400, step_s=0.005)  # a 2 s line

    async def body():
        async with Speaker(fake, output=NullOutput(speed=float("inf"))) as s:
            h = s.enqueue("長く合成される台詞")
            while not (fake.calls and fake.calls[-1].steps_done >= 3):
                await asyncio.sleep(0.005)
            loop = asyncio.get_running_loop()

            def take_the_lock() -> tuple[bool, int]:
                got = MODEL_LOCK.acquire(timeout=0.5)
                try:
                    return got, fake.calls[-1].steps_done
                finally:
                    if got:
                        MODEL_LOCK.release()

            got, steps_then = await loop.run_in_executor(None, take_the_lock)
            await h
            return got, steps_then, h.state

    got, steps_then, state = run(body(), timeout=60)
    assert got and steps_then < 400  # taken while the line was still being sampled
    assert state == UtteranceState.PLAYED
