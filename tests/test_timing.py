"""timing/estimate.py: word and mora estimates, the voiced span, and their distance from HTS's own timing."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from irodori_speaker.timing import estimate as timing

pj = pytest.importorskip("pyopenjtalk")


def test_words_and_moras_fill_the_voiced_span_in_order():
    tm = timing.estimate_timing("今日は、いい天気ですね。", 3.0, speech=(0.5, 2.5))
    assert [w.text for w in tm.words] == ["今日", "は", "いい", "天気", "です", "ね"]
    assert "".join(m.kana for m in tm.moras) == "キョーワイイテンキデスネ"
    assert tm.moras[0].start == pytest.approx(0.5) and tm.moras[-1].end == pytest.approx(2.5)
    starts = [m.start for m in tm.moras]
    assert starts == sorted(starts)
    gap = tm.words[2].start - tm.words[1].end  # the 、 is a pause between は and いい
    assert gap > 0.1
    assert tm.text[tm.words[3].char_start : tm.words[3].char_end] == "天気"


def test_visemes_follow_the_vowels_and_close_for_n_pauses_and_lips():
    tm = timing.estimate_timing("ママ、こんにちは", 2.0)
    shapes = [v for _, v in tm.visemes()]
    assert shapes[:4] == ["closed", "a", "closed", "a"]  # マ マ: lips shut before each a
    assert "closed" in shapes[4:] and shapes[-1] == "closed"
    times = [t for t, _ in tm.visemes()]
    assert times == sorted(times)


def test_no_reading_no_timing():
    assert timing.estimate_timing("   ", 1.0) is None
    assert timing.estimate_timing("こんにちは", 0.0) is None


def test_the_speech_span_is_found_in_streamed_chunks():
    sr = 48_000
    x = np.zeros(sr * 2, dtype=np.float32)
    x[int(0.3 * sr) : int(1.5 * sr)] = 0.3 * np.sin(np.arange(int(1.2 * sr)) * 0.05)
    span = timing.SpeechSpan(sr)
    for chunk in np.array_split(x, 7):
        span.add(chunk)
    start, end = span.span()
    assert start == pytest.approx(0.3, abs=0.011) and end == pytest.approx(1.5, abs=0.011)
    assert timing.speech_span(x, sr) == (start, end)


def test_the_estimate_is_within_100_ms_of_hts_speech_on_average():
    """Truth: pyopenjtalk's HTS voice, whose per-label durations are recovered by synthesising
    one label at a time (benchmarks/timing_accuracy.py measures 55 sentences)."""
    with contextlib.redirect_stdout(io.StringIO()):
        engine = pj.HTSEngine(pj.DEFAULT_HTS_VOICE)
    errors = []
    for text in ("今日はいい天気ですね。", "明日の配信は夜九時から、よろしくね！"):
        labels = pj.extract_fullcontext(text)
        fs = engine.get_sampling_frequency()
        secs = [len(engine.synthesize([lab])) / fs for lab in labels]
        phones = [lab.split("-")[1].split("+")[0] for lab in labels]
        total = sum(secs)
        tm = timing.estimate_timing(text, total, speech=(secs[0], total - secs[-1]))
        t, c_start, truth = 0.0, None, []
        for p, d in zip(phones, secs, strict=True):
            if p in ("sil", "pau"):
                c_start = None
            elif p.lower() in timing.VOWELS or p in ("N", "cl"):
                truth.append(c_start if c_start is not None else t)
                c_start = None
            elif c_start is None:
                c_start = t
            t += d
        assert len(truth) == len(tm.moras)
        errors += [abs(m.start - s) for m, s in zip(tm.moras, truth, strict=True)]
    assert np.mean(errors) < 0.1, np.mean(errors)
