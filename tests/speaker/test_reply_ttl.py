"""A streamed reply under a time-to-live plays whole or expires whole, never loses its middle
(issue 29; docs/speaker.md "A streamed reply plays whole or not at all")."""

from __future__ import annotations

import asyncio

from speaker_fakes import EventLog, FakeSynth

from irodori_speaker.outputs import NullOutput
from irodori_speaker.speaker import Speaker, UtteranceState
from irodori_speaker.speaker.lines import Reply

# five sentences of ~0.6 s each at 0.02 s a character: the reply plays ~3 s, its TTL is 1 s
SENTENCES = [f"これは返事の{n}番目の文で、少し長めに話しています。" for n in "一二三四五"]


def test_a_reply_that_started_playing_plays_to_its_end(run):
    fake = FakeSynth(seconds_per_char=0.02)

    async def body():
        async with Speaker(fake, output=NullOutput(speed=1.0), ttl={"normal": 1.0}, pause_s=0.05) as s:
            log = EventLog(s)
            handles = await s.say_stream(SENTENCES)
            return log, handles

    log, handles = run(body())
    assert len(handles) >= 4
    # before: the later segments `expired` once they had waited their lane's TTL behind the others
    assert [h.state for h in handles] == [UtteranceState.PLAYED] * len(handles)
    assert not [e for e in log.events if e.kind == "skipped"]


def test_a_reply_that_never_started_expires_whole_with_its_late_segments(run):
    fake = FakeSynth(seconds_per_char=0.02)
    long_line = "スーパーチャットありがとう！" * 4  # ~1.1 s of a high line before the reply may start

    async def body():
        async with Speaker(fake, output=NullOutput(speed=1.0), ttl={"normal": 0.2}, pause_s=0.05) as s:
            log = EventLog(s)
            high = s.enqueue(long_line, priority="high")
            early = s.feed("".join(SENTENCES[:3]))
            await asyncio.sleep(0.5)  # past the reply's TTL, still inside the high line
            late = s.feed(SENTENCES[3]) + s.end_feed()  # fed after the reply expired
            await high
            await asyncio.gather(*early, *late)
            return log, high, early, late

    log, high, early, late = run(body())
    assert high.state == UtteranceState.PLAYED
    assert early and late
    assert {h.state for h in [*early, *late]} == {UtteranceState.EXPIRED}
    assert {log.one("skipped", h.id).reason for h in [*early, *late]} == {"expired"}
    assert not [e for e in log.events if e.kind == "playback_started" and e.utterance_id != high.id]


def test_say_stream_returns_every_handle_expired_when_the_reply_was_dropped(run):
    fake = FakeSynth(seconds_per_char=0.02)

    async def body():
        async with Speaker(fake, output=NullOutput(speed=1.0), pause_s=0.05) as s:
            high = s.enqueue("スーパーチャットありがとう！" * 4, priority="high")
            handles = await s.say_stream(SENTENCES[:3], ttl=0.2)
            await high
            return handles

    handles = run(body())
    assert handles and all(h.state == UtteranceState.EXPIRED for h in handles)


def test_the_reply_keeps_its_first_deadline_until_it_is_on_its_way():
    reply = Reply()
    assert reply.deadline(10.0) == 10.0
    assert reply.deadline(99.0) == 10.0  # later segments share the first one's
    reply.expire()
    assert reply.expired
    other = Reply()
    other.deadline(10.0)
    other.on_its_way()
    other.expire()  # too late: a reply on its way never expires
    assert not other.expired and other.deadline(5.0) is None
