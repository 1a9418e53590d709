"""normalize_text against a hand-written table (spec section 6, in its order)."""

from __future__ import annotations

import pytest

from irodori_speaker.errors import InputError
from irodori_speaker.text.normalize import normalize_or_raise, normalize_text, strip_enclosing_brackets

DASHES = ["\u02d7", *[chr(c) for c in range(0x2010, 0x2016)], "\u2043", "\u2212", "\u23af", "\u23e4"]
DASHES += ["\u2500", "\u2501", "\u2e3a", "\u2e3b"]

CASES = [
    # deletions: tab, "[n]", full-width space (deleted, not turned into a space by NFKC)
    ("a\tb", "ab"),
    ("こんにちは[n]世界", "こんにちは世界"),
    ("こん\u3000にちは", "こんにちは"),
    ("a\\[n\\]b", "ab"),  # the reference's literal regex spelling
    # mappings
    ("本当？", "本当?"),
    ("すごい！", "すごい!"),
    ("？！", "?!"),
    ("好き♥", "好き♡"),
    ("好き♡", "好き♡"),
    ("●◯〇", "○○○"),
    # deleted symbols
    ("a;b▼c♀♂《》≪≫①②③④⑤⑥d", "abcd"),
    ("⑦番", "7番"),  # not in the list: NFKC makes it a digit
    ("a；b", "a;b"),  # full-width ; survives the deletion, then NFKC makes it ';'
    # wave dashes become the long-vowel mark (NFKC would have made ～ a '~')
    ("ね～", "ねー"),
    ("ね〜", "ねー"),
    ("a~b", "a~b"),
    # ellipses
    ("え…", "え…"),
    ("え……", "え……"),
    ("え………", "え……"),
    ("え…………", "え……"),
    ("えっと...", "えっと…"),
    ("えっと..", "えっと…"),
    ("え....", "え…."),  # "..." first, then ".." finds nothing
    ("え.....", "え……"),
    # whole-text brackets, repeatedly
    ("「こんにちは」", "こんにちは"),
    ("「『（こんにちは）』」", "こんにちは"),
    ("【速報】", "速報"),
    ("(笑)", "笑"),
    ("（テスト）", "テスト"),
    ("「「二重」」", "二重"),
    # partial or non-enclosing brackets stay
    ("「こんにちは」と言った", "「こんにちは」と言った"),
    ("彼は「うん」", "彼は「うん」"),
    ("「a」と「b」", "「a」と「b」"),
    ("「こんにちは』", "「こんにちは』"),
    ("「a「b」", "「a「b」"),
    # stripping happens before NFKC: mixed widths do not match, then NFKC unifies them
    ("（テスト)", "(テスト)"),
    ("［タグ］です", "[タグ]です"),
    # NFKC
    ("ＡＢＣ１２３", "ABC123"),
    ("ｶﾀｶﾅ", "カタカナ"),
    ("㍻", "平成"),
    # emoji and tags pass through
    ("今日もがんばろう😊", "今日もがんばろう😊"),
    ("👨\u200d👩\u200d👧", "👨\u200d👩\u200d👧"),
    ("[happy]こんにちは", "[happy]こんにちは"),
    ("ふつうの文です。", "ふつうの文です。"),
    ("", ""),
]


@pytest.mark.parametrize(("raw", "expected"), CASES)
def test_normalize_table(raw: str, expected: str) -> None:
    assert normalize_text(raw) == expected


@pytest.mark.parametrize("dash", DASHES)
def test_dash_and_box_characters_are_deleted(dash: str) -> None:
    assert normalize_text(f"a{dash}b") == "ab"


def test_order_enclosing_brackets_after_deletions() -> None:
    # The tab and the deleted ▼ go first, so the brackets then enclose the whole text.
    assert normalize_text("\t「こんにちは」▼") == "こんにちは"


def test_strip_enclosing_brackets_directly() -> None:
    assert strip_enclosing_brackets("(a)(b)") == "(a)(b)"
    assert strip_enclosing_brackets("((a)(b))") == "(a)(b)"
    assert strip_enclosing_brackets("「」") == ""


@pytest.mark.parametrize("raw", ["", "   ", "\u3000", "\n\t "])
def test_or_raise_rejects_blank_input(raw: str) -> None:
    with pytest.raises(InputError, match="empty or only whitespace"):
        normalize_or_raise(raw)


@pytest.mark.parametrize("raw", ["▼▼", "「」", "①②", "（\u3000）", "\t[n]"])
def test_or_raise_rejects_text_empty_after_normalisation(raw: str) -> None:
    with pytest.raises(InputError, match="after normalisation"):
        normalize_or_raise(raw)


def test_or_raise_returns_normalised_text() -> None:
    assert normalize_or_raise("「本当？」") == "本当?"


def test_non_str_is_an_input_error() -> None:
    with pytest.raises(InputError):
        normalize_text(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(InputError):
        normalize_or_raise(None)  # type: ignore[arg-type]
