"""Emotion tags mapped per line by the Speaker (issue 16): the voice, caption and options of the
line that carries the tag, in say() and in say_stream() with the tag split over two chunks."""

from __future__ import annotations

import pytest
from speaker_fakes import FakeSynth

from irodori_speaker.errors import InputError
from irodori_speaker.outputs import NullOutput
from irodori_speaker.speaker import Speaker
from irodori_speaker.synthesis.voices import Voice

TAGS = {
    "happy": {"voice": "happy.wav", "options": {"seed": 7}},  # made in the test's folder (autouse)
    "sad": {"caption": "悲しげな声"},
    "笑": {"text": "ふふっ"},
}


@pytest.fixture(autouse=True)
def _tag_voice_file(tmp_path, monkeypatch):
    """The tag map's voice file exists (checked when the Speaker is built; the fake reads no audio)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "happy.wav").write_bytes(b"")


def test_a_mapped_tag_picks_voice_caption_options_and_words(run, tmp_path):
    fake = FakeSynth()
    base = tmp_path / "base.wav"
    base.write_bytes(b"")  # the fake synthesizer reads no audio; Voice checks the file exists

    async def body():
        async with Speaker(fake, output=NullOutput(speed=float("inf")), tags=TAGS, voice=base) as s:
            await s.say("[happy]やったー！")
            await s.say("[sad]ざんねん。")
            await s.say("それは（笑）面白い")
            await s.say("[angry]こら！")  # not mapped: the line as it is (the synthesizer strips it)

    run(body())
    calls = [c for c in fake.calls if c.kind != "prewarm"]
    assert [c.text for c in calls] == ["やったー！", "ざんねん。", "それはふふっ面白い", "[angry]こら！"]
    assert calls[0].voice == "happy.wav" and calls[0].options.seed == 7
    assert calls[1].voice == Voice.from_path(base, caption="悲しげな声")
    assert calls[2].voice == base and calls[3].voice == base


def test_a_tag_split_over_two_llm_chunks_still_maps(run):
    fake = FakeSynth()

    async def body():
        async with Speaker(fake, output=NullOutput(speed=float("inf")), tags=TAGS) as s:
            return await s.say_stream(["[ha", "ppy]今日は", "いい天気！[s", "ad]でも雨。"])

    hs = run(body())
    calls = [c for c in fake.calls if c.kind != "prewarm"]
    assert [c.text for c in calls] == ["今日はいい天気！", "でも雨。"]
    assert calls[0].voice == "happy.wav" and calls[0].options.seed == 7
    assert calls[1].voice == Voice.designed("悲しげな声")
    assert len(hs) == 2


def test_a_bad_tag_map_fails_at_construction():
    with pytest.raises(InputError, match="tags"):
        Speaker(FakeSynth(), output="null", tags={"happy": "happy.wav"})
