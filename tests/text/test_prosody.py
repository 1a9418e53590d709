"""Accent phrases from pyopenjtalk: structure, readings, estimated lengths, the mora table."""

from __future__ import annotations

import pytest

from irodori_speaker.errors import InputError
from irodori_speaker.text.length import MORAE_PER_SECOND, PAUSE_S, count_morae
from irodori_speaker.text.prosody import (
    accent_phrases,
    accent_pitches,
    kana_to_moras,
    mora_kana,
    phrases_reading,
    phrases_seconds,
)

pytest.importorskip("pyopenjtalk")


def test_phrases_of_a_sentence_with_a_pause():
    phrases = accent_phrases("こんにちは、音声合成の世界へようこそ！")
    assert phrases_reading(phrases) == "コンニチワ、オンセエゴオセエノセカイエヨオコソ"
    assert [p.pause_mora is not None for p in phrases] == [True, False, False, False]
    first = phrases[0]
    assert [m.text for m in first.moras] == ["コ", "ン", "ニ", "チ", "ワ"]
    assert (first.moras[0].consonant, first.moras[0].vowel) == ("k", "o")
    assert first.moras[1].consonant is None and first.moras[1].vowel == "N"
    assert 1 <= first.accent <= len(first.moras)


def test_mora_count_and_lengths_agree_with_the_length_estimate():
    text = "今日はいい天気ですね、散歩に行きましょう。"
    phrases = accent_phrases(text)
    morae = sum(len(p.moras) for p in phrases)
    assert morae == count_morae(text, method="openjtalk")
    pauses = sum(p.pause_mora is not None for p in phrases)
    assert pauses == 1  # the final 。 ends the line: no pause mora after it
    assert phrases_seconds(phrases) == pytest.approx(morae / MORAE_PER_SECOND + pauses * PAUSE_S)


def test_question_and_unvoiced_vowels():
    (phrase,) = accent_phrases("本当ですか？")
    assert phrase.is_interrogative
    su = phrase.moras[5]
    assert (su.text, su.vowel, su.pitch) == ("ス", "U", 0.0)  # devoiced: pitch 0 as VOICEVOX
    assert phrases_reading([phrase]) == "ホントオデスカ？"


def test_accent_pattern_pitches():
    assert accent_pitches(4, 1) == [True, False, False, False]  # atamadaka
    assert accent_pitches(4, 2) == [False, True, False, False]
    assert accent_pitches(4, 4) == [False, True, True, True]  # odaka / flat within the phrase
    (p,) = accent_phrases("箸")  # ha'shi: accent on the first mora
    assert p.accent == 1 and p.moras[0].pitch > p.moras[1].pitch


def test_empty_and_symbol_only_text():
    assert accent_phrases("") == []
    assert accent_phrases("、") == []


def test_results_are_copies():
    a = accent_phrases("テスト")
    a[0].moras[0].vowel_length = 9.0
    assert accent_phrases("テスト")[0].moras[0].vowel_length != 9.0


def test_kana_table_round_trip():
    moras = kana_to_moras("きゃりーぱみゅぱみゅ")
    assert [m[0] for m in moras] == ["キャ", "リ", "ー", "パ", "ミュ", "パ", "ミュ"]
    assert moras[2] == ("ー", "", "i")
    for text, consonant, vowel in kana_to_moras("ヴァイオリンとティーカップ、".rstrip("、")):
        if text != "ー":
            assert mora_kana(consonant, vowel) == ("ト" if text == "と" else text)
    assert mora_kana(None, "cl") == "ッ" and mora_kana("s", "U") == "ス"
    with pytest.raises(InputError, match="katakana"):
        kana_to_moras("漢字")
    with pytest.raises(InputError):
        kana_to_moras("ーア")


def test_every_openjtalk_mora_of_a_long_text_has_a_kana():
    text = "ヴィジュアル系のファンがディズニーランドでフュージョン料理とチェリーパイを食べた。" * 3
    phrases = accent_phrases(text)
    assert sum(len(p.moras) for p in phrases) == count_morae(text, method="openjtalk")
