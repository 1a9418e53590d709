"""Word, viseme and line-timing events on the playback clock (issue 16, "Timing")."""

from __future__ import annotations

import pytest
from speaker_fakes import EventLog, FakeSynth

from irodori_speaker.outputs import NullOutput
from irodori_speaker.speaker import Speaker
from irodori_speaker.timing.captions import CaptionFile

pytest.importorskip("pyopenjtalk")


def test_words_and_visemes_arrive_in_order_inside_the_heard_line(run):
    fake = FakeSynth(seconds_per_char=0.08)  # 10 characters: 0.8 s of audio

    async def body():
        async with Speaker(fake, output=NullOutput(speed=1.0), pause_s=0.0) as s:
            log = EventLog(s)
            utt = await s.say("今日はいい天気ですね")
            return log, utt

    log, utt = run(body())
    started = log.one("playback_started", utt.id).time
    finished = log.one("playback_finished", utt.id).time
    line = log.one("line_timing", utt.id)
    assert line.time == pytest.approx(started, abs=1e-6)
    assert [w.text for w in line.timing.words] == ["今日", "は", "いい", "天気", "です", "ね"]
    words = log.of("word", utt.id)
    assert [w.text for w in words] == ["今日", "は", "いい", "天気", "です", "ね"]
    assert [w.index for w in words] == list(range(6))
    times = [w.time for w in words]
    assert times == sorted(times) and started <= times[0] and times[-1] < finished
    for w, planned in zip(words, line.timing.words, strict=True):  # the events are the estimate
        assert w.time == pytest.approx(planned.start, abs=1e-6)
    visemes = log.of("viseme", utt.id)
    shapes = [v.viseme for v in visemes]
    assert set(shapes) <= {"a", "i", "u", "e", "o", "closed"}
    assert shapes[:2] == ["o", "a"] or shapes[0] == "o"  # キョ ー ワ ...: o first
    assert shapes[-1] == "closed" and "e" in shapes and "i" in shapes
    assert [v.time for v in visemes] == sorted(v.time for v in visemes)
    assert visemes[-1].time <= finished + 1e-6
    assert utt.timing is not None and utt.timing.duration == pytest.approx(0.8, abs=0.02)


def test_timing_off_sends_no_timing_events(run):
    async def body():
        async with Speaker(FakeSynth(), output=NullOutput(speed=4.0), timing=False) as s:
            log = EventLog(s)
            utt = await s.say("こんにちは")
            return log, utt

    log, utt = run(body())
    assert not log.of("word") and not log.of("viseme") and not log.of("line_timing")
    assert utt.timing is None


def test_the_caption_file_follows_a_speaker(run, tmp_path):
    path = tmp_path / "obs" / "caption.txt"
    seen: list[str] = []

    async def body():
        async with Speaker(FakeSynth(seconds_per_char=0.05), output=NullOutput(speed=1.0)) as s:
            cap = CaptionFile(path)
            cap.attach(s)
            s.on("word", lambda e: seen.append(path.read_text(encoding="utf-8")))
            await s.say("今日はとてもいい天気ですね。明日も晴れるといいな、楽しみだよ!")
            return cap

    cap = run(body())
    assert seen[0] == "今日はとてもいい天気ですね。" and seen[-1] == "楽しみだよ!"
    assert "明日も晴れるといいな、" in seen
    assert path.read_text(encoding="utf-8") == "" and cap.shown == ""  # cleared when the line ended


def test_a_streamed_line_announces_its_first_words_before_its_synthesis_ends(run, synth):
    """Issue 32: a streamed line's word times came from its whole audio, so a line that started
    at its first chunk announced its first words only when its synthesis ended (the overlay
    showed them late). A line of one piece now sends a first estimate with its first chunk: its
    length is known once its latent is sampled and trimmed; the whole-audio one replaces it."""
    import time

    from test_jitter import SlowStream

    slow = SlowStream(synth, 1.3)  # decode slower than real time: playback starts mid-synthesis
    opts = {"steps": 2, "seconds": 3.0, "seed": 2, "tail_trim": False}

    async def body():
        async with Speaker(slow, output=NullOutput(speed=1.0), options=opts, prewarm=False) as s:
            said: list[tuple[str, float]] = []
            s.on(["word", "synthesis_finished"], lambda e: said.append((e.kind, time.monotonic())))
            utt = await s.say("今日はいい天気ですね、散歩に行きましょう")
            return said, utt

    said, utt = run(body(), timeout=60)
    done = next(t for kind, t in said if kind == "synthesis_finished")
    words = [t for kind, t in said if kind == "word"]
    assert words and words[0] < done, "the first word waited for the end of synthesis"
    assert utt.timing is not None and len(utt.timing.words) == len(words)


class _ReanchoringOutput(NullOutput):
    """A clock that re-anchors as it plays: each later reading of the same sample's time comes out
    a rounding step earlier (the CI flake of 2026-12-06, made certain)."""

    def __init__(self) -> None:
        super().__init__(speed=1.0)
        self._calls = 0

    def time_at(self, pos: float) -> float:
        self._calls += 1
        return super().time_at(pos) - 1e-9 * self._calls


def test_no_word_or_viseme_is_stamped_before_its_line_started(run):
    async def body():
        async with Speaker(FakeSynth(seconds_per_char=0.08), output=_ReanchoringOutput(), pause_s=0.0) as s:
            log = EventLog(s)
            utt = await s.say("今日はいい天気ですね")
            return log, utt

    log, utt = run(body())
    started = log.one("playback_started", utt.id).time
    assert log.one("line_timing", utt.id).time == started
    stamps = [e.time for e in log.of("word", utt.id) + log.of("viseme", utt.id)]
    assert len(stamps) > 6 and min(stamps) >= started
