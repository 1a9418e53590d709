"""Captions (issue 16, "Timing"): cues, SRT / WebVTT, the OBS caption file, and `say --srt`."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys

import pytest

from irodori_speaker.timing.captions import cues, srt, webvtt
from irodori_speaker.timing.estimate import estimate_timing

pytest.importorskip("pyopenjtalk")

TEXT = "今日はとてもいい天気ですね。明日も晴れるといいな、楽しみだよ!"


def test_cues_cut_at_punctuation_and_keep_it():
    tm = estimate_timing(TEXT, 6.0, speech=(0.2, 5.8))
    cs = cues(tm)
    assert [c.text for c in cs] == ["今日はとてもいい天気ですね。", "明日も晴れるといいな、", "楽しみだよ!"]
    assert cs[0].start == pytest.approx(0.2) and cs[-1].end == pytest.approx(5.8)
    assert all(a.end <= b.start for a, b in itertools.pairwise(cs))
    short = cues(tm, max_chars=6)
    assert all(len(c.text) <= 8 for c in short) and "".join(c.text for c in short) == TEXT


def test_srt_and_webvtt_are_well_formed():
    tm = estimate_timing(TEXT, 6.0)
    cs = cues(tm, offset=3661.5)
    s = srt(cs)
    assert s.startswith("1\n01:01:01,500 --> ")
    assert re.fullmatch(r"(\d+\n\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}\n[^\n]+\n\n?)+", s)
    v = webvtt(cs)
    assert v.startswith("WEBVTT\n\n01:01:01.500 --> ")
    assert len(re.findall(r"\d\d:\d\d:\d\d\.\d{3} --> \d\d:\d\d:\d\d\.\d{3}", v)) == len(cs)


def test_say_writes_srt_vtt_and_the_caption_file(tmp_path):
    tags = tmp_path / "tags.json"
    tags.write_text(json.dumps({"happy": {"text": "やったね"}}), encoding="utf-8")
    env = dict(
        os.environ, IRODORI_CACHE=str(tmp_path / "c"), HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf")
    )
    args = ["say", "[happy]配信は15:30から、みんな来てね。", "-o", str(tmp_path / "a.wav"), "--tiny-random"]
    args += ["--seed", "1", "--srt", str(tmp_path / "a.srt"), "--vtt", str(tmp_path / "a.vtt")]
    args += ["--caption-file", str(tmp_path / "cap.txt"), "--tag-map", str(tags)]
    r = subprocess.run(
        [sys.executable, "-m", "irodori_speaker.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    body = (tmp_path / "a.srt").read_text(encoding="utf-8")
    assert (
        "やったね配信は15:30から、" in body and "みんな来てね。" in body and body.startswith("1\n00:00:00")
    )  # as written: the timing is of 15時30分, the caption shows 15:30
    assert (tmp_path / "a.vtt").read_text(encoding="utf-8").startswith("WEBVTT\n\n00:00:")
    assert (tmp_path / "cap.txt").read_text(encoding="utf-8") == "やったね配信は15:30から、みんな来てね。"
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "irodori_speaker.cli",
            "say",
            "はい",
            "-o",
            str(tmp_path / "b.wav"),
            "--tiny-random",
            "--tag-map",
            str(tmp_path / "missing.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 1 and "--tag-map" in bad.stderr and "Traceback" not in bad.stderr


def test_the_break_characters_are_the_splitters():
    from irodori_speaker.text.split import CLAUSE_CHARS, SENTENCE_END_CHARS
    from irodori_speaker.timing import captions

    assert captions._BREAKS == CLAUSE_CHARS | SENTENCE_END_CHARS


# ---- captions show the line as written (issue 16) ----------------------------------------------

LINE = (
    '[happy]VTuberの配信で草www、推しは15:30から<break time="500ms"/>'
    "詳しくはhttps://example.com/live を見てね。"
)


@pytest.fixture
def dict_synth(synth, tmp_path):
    from irodori_speaker.text.userdict import UserDictionary

    old = synth.user_dict
    synth.user_dict = UserDictionary(tmp_path / "d.sqlite3")
    synth.user_dict.add("推し", "オシ")
    try:
        yield synth
    finally:
        synth.user_dict = old


def test_words_and_cues_show_the_original_spelling_with_the_reading_kept(dict_synth):
    res = dict_synth.synthesize(LINE, options={"seed": 0})
    rec = res.record
    assert rec.text == "ブイチューバーの配信で草ワラワラ、オシは15時30分から詳しくはユーアールエル を見てね。"
    assert rec.source == "VTuberの配信で草www、推しは15:30から詳しくはhttps://example.com/live を見てね。"
    tm = estimate_timing(rec.text, len(res.audio) / 48_000, source=rec.source)
    words = {w.text: w for w in tm.words if w.text}
    assert words["VTuber"].spoken.startswith("ブイ") and words["VTuber"].reading.startswith("ブイ")
    assert "www" in words and words["www"].spoken.startswith("ワラ")  # ワラ|ワラ: shown once
    assert any(w.text.startswith("推し") and "オシ" in w.reading for w in tm.words)
    assert "".join(c.text for c in cues(tm)) == rec.source.replace(" ", "")  # cues are stripped
    for c in cues(tm):  # tags and pause markup never in a caption, the readings neither
        assert "[" not in c.text and "break" not in c.text and "ブイチューバー" not in c.text
    text = srt(cues(tm))
    assert "VTuberの配信で草www、" in text and "15:30" in text and "https://example.com/live" in text
    assert "15時30分" not in text and "ワラワラ" not in text
    # the timing is still of what the model read: same words and times as without the source
    plain = estimate_timing(rec.text, len(res.audio) / 48_000)
    assert [(w.start, w.end, w.reading) for w in plain.words] == [
        (w.start, w.end, w.reading) for w in tm.words
    ]
    assert [w.text for w in plain.words] == [w.spoken for w in tm.words]


def test_kept_tags_are_shown_and_a_split_rewrite_is_shown_once():
    from irodori_speaker.timing.source_spans import SourceMap

    m = SourceMap.align("VTuberの配信、15:30", "ブイチューバーの配信、15時30分")
    assert m.source_text(0, 2) == "VTuber" and m.source_text(2, 7) == ""  # ブイ|チューバー: once
    assert m.source_text(0, len(m.spoken)) == m.source
    assert m.source_text(11, 14) == "15:" and m.source_text(14, 17) == "30"


def test_a_long_line_is_aligned_sentence_by_sentence_as_the_whole_line_would_be():
    import difflib

    from irodori_speaker.timing.source_spans import SourceMap

    source = "VTuberの配信でwww。15:30から！[happy]またね？" * 40
    spoken = "ブイチューバーの配信でワラワラ。15時30分から！またね？" * 40
    m = SourceMap.align(source, spoken)
    whole = SourceMap(
        source, spoken, tuple(difflib.SequenceMatcher(None, source, spoken, autojunk=False).get_opcodes())
    )
    assert len(m.opcodes) > 40  # it did align piece by piece
    assert m.source_text(0, len(spoken)) == whole.source_text(0, len(spoken)) == source.replace("[happy]", "")
    for start in range(0, len(spoken), 7):
        assert m.source_text(start, start + 7) == whole.source_text(start, start + 7), start


def test_speaker_word_events_and_the_caption_file_show_the_original(synth, tmp_path):
    import asyncio

    from irodori_speaker.speaker import Speaker
    from irodori_speaker.timing.captions import CaptionFile

    seen_words: list[str] = []
    shown: list[str] = []

    async def body():
        async with Speaker(synth, output="null", prewarm=False, seed=1, timing=True) as s:
            cap = CaptionFile(tmp_path / "cap.txt", keep_last=True)
            cap.attach(s)
            real_show = cap.show

            def spy(text):
                shown.append(text)
                real_show(text)

            cap.show = spy  # type: ignore[method-assign]
            s.on("word", lambda e: seen_words.append(e.text))
            await s.say("[happy]VTuberの配信は15:30から[pause:0.2]だよ。")

    asyncio.run(asyncio.wait_for(body(), 120))
    assert "VTuber" in seen_words and "ブイチューバー" not in "".join(seen_words)
    joined = "".join(shown)
    assert "VTuberの配信は15:30から" in joined and "[" not in joined and "pause" not in joined
