"""say_stream() / feed(): LLM token streams cut into segments as they arrive, with a stall flush."""

from __future__ import annotations

import asyncio

import pytest
from speaker_fakes import EventLog, FakeSynth

from irodori_speaker.outputs import NullOutput
from irodori_speaker.speaker import Speaker, UtteranceState


class SplitOnEnders:
    """A minimal stand-in with StreamSegmenter's API: a segment ends after 。！？."""

    def __init__(self) -> None:
        self.pending = ""
        self.flushes: list[bool] = []

    def feed(self, chunk: str) -> list[str]:
        self.pending += chunk
        out = []
        while True:
            cuts = [i for i, ch in enumerate(self.pending) if ch in "。！？"]
            if not cuts:
                return out
            out.append(self.pending[: cuts[0] + 1])
            self.pending = self.pending[cuts[0] + 1 :]

    def flush(self, *, final: bool = True) -> list[str]:
        self.flushes.append(final)
        out, self.pending = ([self.pending] if self.pending.strip() else []), ""
        return out


async def tokens(parts, stall_at=None, stall_s=0.0, marks=None):
    for i, p in enumerate(parts):
        if i == stall_at:
            await asyncio.sleep(stall_s)
            if marks is not None:
                marks.append(asyncio.get_running_loop().time())
        yield p


def test_say_stream_enqueues_each_segment_as_it_completes(run):
    fake = FakeSynth(seconds_per_char=0.01)
    made: list[SplitOnEnders] = []

    def factory():
        made.append(SplitOnEnders())
        return made[-1]

    parts = ["こんに", "ちは。今日", "は晴れ", "です！最後", "の文"]

    async def body():
        async with Speaker(fake, output=NullOutput(speed=4.0), segmenter=factory, stall_flush_s=5.0) as s:
            log = EventLog(s)
            started = asyncio.Event()
            s.on("synthesis_started", lambda e: started.set())

            async def llm():
                for i, p in enumerate(parts):
                    if i == 2:  # an LLM still generating: the first segment must be in the model by now
                        await asyncio.wait_for(started.wait(), 10)
                    yield p

            hs = await s.say_stream(llm())
            return log, hs

    log, hs = run(body())
    assert [h.text for h in hs] == ["こんにちは。", "今日は晴れです！", "最後の文"]
    assert all(h.state == UtteranceState.PLAYED for h in hs)
    assert log.index("synthesis_started", hs[0].id) < log.index("queued", hs[1].id)
    assert made[0].flushes == [True]  # the end of the stream, not a stall


def test_a_stalled_stream_is_flushed_by_the_timer(run):
    fake = FakeSynth(seconds_per_char=0.01)
    seg = SplitOnEnders()
    marks: list[float] = []
    parts = ["考え中の", "文の途中", "で止まる", "続き。"]

    async def body():
        async with Speaker(fake, output=NullOutput(speed=4.0), segmenter=lambda: seg, stall_flush_s=0.1) as s:
            log = EventLog(s)
            hs = await s.say_stream(tokens(parts, stall_at=3, stall_s=0.6, marks=marks))
            return log, hs

    log, hs = run(body())
    texts = [h.text for h in hs]
    assert texts[0] == "考え中の文の途中で止まる"  # flushed while the LLM was silent
    assert seg.flushes[0] is False  # a stall keeps the segmenter's turn state
    assert texts[1:] == ["続き。"]
    queued = log.one("queued", hs[0].id).time
    assert queued < marks[0]  # before the stream resumed


def test_feed_and_end_feed(run):
    fake = FakeSynth(seconds_per_char=0.01)

    async def body():
        async with Speaker(fake, output=NullOutput(speed=4.0), segmenter=SplitOnEnders) as s:
            a = s.feed("はい、")
            b = s.feed("わかりました。次")
            c = s.end_feed()
            await asyncio.gather(*a, *b, *c)
            return a, b, c

    a, b, c = run(body())
    assert a == [] and [h.text for h in b] == ["はい、わかりました。"] and [h.text for h in c] == ["次"]


def test_cancelling_say_stream_cancels_its_segments(run):
    fake = FakeSynth(seconds_per_char=0.1)

    async def forever():
        yield "最初の文はここまで。"
        await asyncio.sleep(60)
        yield "来ない"

    async def body():
        async with Speaker(fake, output=NullOutput(speed=1.0), segmenter=SplitOnEnders) as s:
            log = EventLog(s)
            task = asyncio.create_task(s.say_stream(forever()))
            while not log.of("playback_started"):
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await s.drain()
            return log

    log = run(body())
    assert log.of("playback_interrupted")


def test_with_the_project_segmenter(run):
    fake = FakeSynth(seconds_per_char=0.005)
    text = "こんにちは、今日もよろしくね！それでは、ニュースをお伝えします。"

    async def body():
        async with Speaker(fake, output=NullOutput(speed=float("inf"))) as s:
            return await s.say_stream(tokens(list(text)))

    hs = run(body())
    assert len(hs) >= 2
    assert "".join(h.text for h in hs).replace(" ", "") == text
    assert all(h.state == UtteranceState.PLAYED for h in hs)
