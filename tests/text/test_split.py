"""split_for_synthesis: sentence, then clause, then hard cuts; protected runs stay whole."""

from __future__ import annotations

import re

import pytest

from irodori_speaker.errors import InputError
from irodori_speaker.text.split import (
    CLAUSE_CHARS,
    CLOSING_CHARS,
    DEFAULT_MAX_CHARS,
    SENTENCE_END_CHARS,
    is_emoji_part,
    measure,
    overshoot_limit,
    split_for_synthesis,
)

NEWS = (
    "今日の東京は朝から青空が広がり、日中の最高気温は二十五度近くまで上がる見込みです。"
    "政府は新しい経済対策を発表し、子育て世帯への給付金や電気料金の補助を来月から全国で順次始めると明らかにしました。"
    "大型の台風が週末にかけて沖縄地方に接近する予報です。"
    "プロ野球では地元チームが九回裏に逆転サヨナラ勝ちしました。"
)
PROTECTED = [
    "3.14",
    "1,000",
    "１，０００",
    "2.5",
    "https://example.com/a.b?c=1,2&d=3.5",
    "👨\u200d👩\u200d👧\u200d👦",
    "😊😊😊",
]
WITH_PROTECTED = (
    "円周率は3.14で、人口は1,000人、全角だと１，０００人です。倍率は2.5倍、"
    "詳しくは https://example.com/a.b?c=1,2&d=3.5 を見てください。家族👨\u200d👩\u200d👧\u200d👦で、"
    "楽しかったです😊😊😊ね。"
)


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_short_text_is_one_piece() -> None:
    assert split_for_synthesis("  こんにちは。元気？  ") == ["こんにちは。元気？"]
    assert split_for_synthesis("") == []
    assert split_for_synthesis(" \n ") == []


@pytest.mark.parametrize("max_chars", [8, 12, 20, 40, DEFAULT_MAX_CHARS])
@pytest.mark.parametrize("merge", [True, False])
def test_pieces_fit_and_keep_all_text(max_chars: int, merge: bool) -> None:
    pieces = split_for_synthesis(NEWS * 2, max_chars=max_chars, merge=merge)
    assert _squash("".join(pieces)) == _squash(NEWS * 2)
    assert all(measure(p) <= max_chars for p in pieces), pieces


def test_sentences_first_when_they_fit() -> None:
    pieces = split_for_synthesis(NEWS, max_chars=50, merge=False)
    assert pieces == [
        "今日の東京は朝から青空が広がり、日中の最高気温は二十五度近くまで上がる見込みです。",
        "政府は新しい経済対策を発表し、",
        "子育て世帯への給付金や電気料金の補助を来月から全国で順次始めると明らかにしました。",
        "大型の台風が週末にかけて沖縄地方に接近する予報です。",
        "プロ野球では地元チームが九回裏に逆転サヨナラ勝ちしました。",
    ]


def test_merge_packs_sentences_up_to_the_budget() -> None:
    pieces = split_for_synthesis(NEWS, max_chars=90)
    assert pieces == [
        "今日の東京は朝から青空が広がり、日中の最高気温は二十五度近くまで上がる見込みです。",
        "政府は新しい経済対策を発表し、子育て世帯への給付金や電気料金の補助を来月から全国で順次始めると明らかにしました。"
        "大型の台風が週末にかけて沖縄地方に接近する予報です。",
        "プロ野球では地元チームが九回裏に逆転サヨナラ勝ちしました。",
    ]  # greedy: 41 | 56 + 26 = 82 | 29 (82 + 29 > 90)


@pytest.mark.parametrize("max_chars", [8, 10, 12, 16, 24])
@pytest.mark.parametrize("merge", [True, False])
def test_numbers_urls_and_emoji_are_never_cut(max_chars: int, merge: bool) -> None:
    pieces = split_for_synthesis(WITH_PROTECTED, max_chars=max_chars, merge=merge)
    assert _squash("".join(pieces)) == _squash(WITH_PROTECTED)
    for token in PROTECTED:
        if measure(token) <= overshoot_limit(max_chars):  # longer runs are cut (test below)
            assert any(token in p for p in pieces), (token, pieces)
    assert all(measure(p) <= overshoot_limit(max_chars) for p in pieces), pieces


def test_closing_brackets_stay_with_their_sentence() -> None:
    text = "「本当に？」と聞いた。彼は「うん！」と答えた。『すごい……』。そうですね！！"
    pieces = split_for_synthesis(text, max_chars=8, merge=False)
    assert _squash("".join(pieces)) == _squash(text)
    for p in pieces:
        assert p[0] not in CLOSING_CHARS, pieces
    assert "「本当に？」" in pieces
    assert "そうですね！！" in pieces


def test_clause_split_only_for_long_sentences() -> None:
    text = "はい、そうです。" + "東京、大阪、名古屋、福岡、札幌、仙台、広島の七都市で開催されます。"
    pieces = split_for_synthesis(text, max_chars=16, merge=False)
    assert pieces[0] == "はい、そうです。"  # fits: its comma is not used
    assert all(p.endswith(("、", "。")) for p in pieces)


def test_hard_cut_respects_kana_and_brackets() -> None:
    text = "ちょっとまってくださいねいまからゲームのせっていをかえますのでしょうしょうおまちください" * 2
    pieces = split_for_synthesis(text, max_chars=15)
    assert "".join(pieces) == text
    assert all(measure(p) <= 15 for p in pieces)
    for p in pieces[1:]:
        assert p[0] not in "ぁぃぅぇぉっゃゅょゎァィゥェォッャュョヮーー", pieces


def test_unbreakable_run_is_kept_whole_up_to_the_overshoot_limit() -> None:
    url = "https://example.com/" + "a" * 60  # 80 characters
    pieces = split_for_synthesis(f"これを見て{url}ね", max_chars=60)  # limit 90
    assert any(url in p for p in pieces)
    # past the limit it is cut between characters: bounded pieces, nothing lost
    pieces = split_for_synthesis(f"これを見て{url}ね", max_chars=20)
    assert "".join(pieces) == f"これを見て{url}ね"
    assert all(measure(p) <= overshoot_limit(20) for p in pieces), pieces


@pytest.mark.parametrize(
    "text",
    [
        "a" * 5000,
        "ｗ" * 300,
        "🎉" * 70 + "すごい" + "🎉" * 70,
        "1" * 1000,
        "👨\u200d👩\u200d👧" * 60,
        "🇯🇵" * 100,
    ],
)
def test_unbreakable_runs_are_cut_into_bounded_pieces(text: str) -> None:
    pieces = split_for_synthesis(text)
    assert pieces and all(measure(p) <= overshoot_limit(DEFAULT_MAX_CHARS) for p in pieces), pieces
    assert len(pieces) <= measure(text) // DEFAULT_MAX_CHARS + 2
    for p in pieces:  # never inside a grapheme: no piece starts with a joiner or half a flag
        assert p[0] != "\u200d" and p[-1] != "\u200d"
        assert sum(0x1F1E6 <= ord(c) <= 0x1F1FF for c in p) % 2 == 0


def test_an_emoji_flood_is_not_read_out_but_text_with_nothing_else_is_kept() -> None:
    pieces = split_for_synthesis("すごい" + "🎉" * 500 + "ね。")
    # each speakable neighbour absorbs the flood up to the overshoot limit; the rest is dropped
    assert len(pieces) <= 3 and sum(p.count("🎉") for p in pieces) <= 2 * overshoot_limit(DEFAULT_MAX_CHARS)
    assert all(measure(p) <= overshoot_limit(DEFAULT_MAX_CHARS) for p in pieces), pieces
    assert pieces[0].startswith("すごい") and any("ね。" in p for p in pieces)
    only = split_for_synthesis("🎉" * 500)
    assert len(only) == 1 and only[0] == "🎉" * len(only[0])
    assert 0 < len(only[0]) <= overshoot_limit(DEFAULT_MAX_CHARS)


def test_unspeakable_sentences_join_a_neighbour() -> None:
    text = "……。" + "今日はいい天気ですね。" * 3 + "😊！"
    pieces = split_for_synthesis(text, max_chars=12, merge=False)
    assert pieces[0].startswith("……。今日は")
    assert pieces[-1].endswith("😊！")
    assert all(any(ch.isalnum() for ch in p) for p in pieces)


def test_bad_arguments() -> None:
    with pytest.raises(InputError):
        split_for_synthesis("はい", max_chars=7)
    with pytest.raises(InputError):
        split_for_synthesis(None)  # type: ignore[arg-type]


def test_shared_character_sets() -> None:
    assert {"。", "．", "!", "?", "！", "？", "…", "\n"} <= SENTENCE_END_CHARS
    assert {"、", "，", ","} <= CLAUSE_CHARS
    assert {"」", "』", "）", ")"} <= CLOSING_CHARS
    assert all(is_emoji_part(c) for c in "😊♡♪✨❤🇯\u200d\ufe0f")
    assert not any(is_emoji_part(c) for c in "あア亜Aa1。")
