"""Captions (issue 16, "Timing"): cues, SRT / WebVTT, the OBS caption file, and `say --srt`."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys

import pytest

from irodori_speaker.captions import cues, srt, webvtt
from irodori_speaker.timing import estimate_timing

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
        "やったね配信は15時30分から、" in body and "みんな来てね。" in body and body.startswith("1\n00:00:00")
    )
    assert (tmp_path / "a.vtt").read_text(encoding="utf-8").startswith("WEBVTT\n\n00:00:")
    assert (tmp_path / "cap.txt").read_text(encoding="utf-8") == "やったね配信は15時30分から、みんな来てね。"
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
    from irodori_speaker import captions
    from irodori_speaker.text.split import CLAUSE_CHARS, SENTENCE_END_CHARS

    assert captions._BREAKS == CLAUSE_CHARS | SENTENCE_END_CHARS
