"""Issue 12: property-based tests of the text front end (hypothesis). For any text, however
hostile (chat spam, control characters, lone surrogates, RTL and zero-width marks, emoji, mixed
scripts, markup, literal special tokens): normalise, split, segment and tokenise raise nothing
but an IrodoriError, and the number and size of the pieces they make are bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from irodori_speaker.errors import IrodoriError
from irodori_speaker.text.normalize import normalize_text
from irodori_speaker.text.segment import StreamSegmenter
from irodori_speaker.text.split import measure, overshoot_limit, split_for_synthesis
from irodori_speaker.text.tokenizer import LLM_JP3_SPECIAL_TOKENS, TextTokenizer, build_tiny_tokenizer

# Modest: the whole module stays within a few seconds on a loaded 2-core machine.
SETTINGS = settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

SPECIAL = [
    "\x00",
    "\u200b",
    "\u200d",
    "\u200e",
    "\u200f",
    "\u202e",
    "\ufeff",
    "\ud800",
    "\udfff",
    "\r\n",
    "\t",
]
PIECES = [
    "。", "、", "！", "？", "……", "ｗ", "w", "草", "🎉", "👨\u200d👩\u200d👧", "🇯🇵", "😂", "http://a.jp/x",
    "**", "# ", "- ", "[a](http://b)", "<b>", "&amp;", "「", "」", "（", "）", "1", "２", "ｶﾀｶﾅ", "abc ",
    "مرحبا", "שלום", "한국어", "中文", "é", "\u0301", *LLM_JP3_SPECIAL_TOKENS[:4], *SPECIAL,
]  # fmt: skip
hostile_text = st.one_of(
    st.text(max_size=300),
    st.lists(st.sampled_from(PIECES), max_size=120).map("".join),
    st.tuples(st.sampled_from(PIECES), st.integers(1, 400)).map(lambda t: t[0] * t[1]),
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> TextTokenizer:
    path: Path = build_tiny_tokenizer(300, tmp_path_factory.mktemp("tok") / "tokenizer.json")
    return TextTokenizer.from_file(path, expected_vocab_size=300)


@SETTINGS
@given(text=hostile_text)
def test_normalise_returns_text_or_an_irodori_error(text: str) -> None:
    try:
        out = normalize_text(text)
    except IrodoriError:
        return
    assert isinstance(out, str)
    assert len(out) <= 4 * len(text) + 16  # bounded growth
    out.encode("utf-8")  # no lone surrogate survives


@SETTINGS
@given(text=hostile_text, max_chars=st.integers(8, 120))
def test_split_gives_a_bounded_number_of_bounded_pieces(text: str, max_chars: int) -> None:
    try:
        pieces = split_for_synthesis(text, max_chars=max_chars)
    except IrodoriError:
        return
    assert len(pieces) <= measure(text) // 4 + 2
    assert all(p.strip() and measure(p) <= overshoot_limit(max_chars) for p in pieces)
    assert sum(len(p) for p in pieces) <= len(text)


@settings(SETTINGS, max_examples=25)  # each example feeds several chunks: the slowest property
@given(chunks=st.lists(hostile_text, max_size=5), max_chars=st.integers(8, 120))
def test_the_stream_segmenter_gives_bounded_segments(chunks: list[str], max_chars: int) -> None:
    seg = StreamSegmenter(max_chars=max_chars, min_chars=min(8, max_chars), first_min_chars=1)
    out: list[str] = []
    try:
        for c in chunks:
            out += seg.feed(c)
        out += seg.flush()
    except IrodoriError:
        return
    total = sum(len(c) for c in chunks)
    assert len(out) <= total // 4 + 2
    assert all(isinstance(s, str) and s.strip() for s in out)
    assert sum(len(s) for s in out) <= total
    # each segment becomes bounded pieces in the synthesizer (split_for_synthesis, above)
    assert all(len(split_for_synthesis(s, max_chars=max_chars)) <= measure(s) // 4 + 2 for s in out)


def test_the_stream_segmenter_keeps_segments_within_max_chars() -> None:
    """A digit run past max_chars was kept whole (a 440-digit segment at max_chars=10)."""
    seg = StreamSegmenter(max_chars=10)
    out = seg.feed("1" * 40) + seg.feed("1" * 400) + seg.flush()
    assert all(measure(s) <= overshoot_limit(10) for s in out), [len(s) for s in out]
    assert "".join(out) == "1" * 440


@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_a_long_number_is_cut_at_digit_group_boundaries_whatever_the_chunking(chunk: int) -> None:
    text = "残高は" + "1234" * 30 + "円です。"
    seg = StreamSegmenter(max_chars=20)
    out = [s for k in range(0, len(text), chunk) for s in seg.feed(text[k : k + chunk])] + seg.flush()
    assert "".join(out) == text
    assert all(measure(s) <= overshoot_limit(20) for s in out), out
    digits = [s.strip("残高は円です。") for s in out]
    assert all(len(d) % 4 == 0 for d in digits[:-1]), digits  # whole groups of four


def test_a_separated_number_is_cut_after_a_separator() -> None:
    from irodori_speaker.text.split import digit_group_cut

    s = "1,000,000,000"
    assert digit_group_cut(s, 10) == 10  # "1,000,000," + "000"
    assert digit_group_cut("あ12345678", 8) == 5  # after four digits of the run
    assert digit_group_cut("あいう", 2) is None


@SETTINGS
@given(text=hostile_text, max_len=st.integers(2, 256))
def test_tokenise_is_bounded_and_never_yields_special_ids(
    tokenizer: TextTokenizer, text: str, max_len: int
) -> None:
    try:
        ids = tokenizer.encode(text, max_len=max_len)
    except IrodoriError:
        return
    assert 1 <= len(ids) <= max_len
    assert not (set(ids[1:]) & tokenizer.special_ids)  # user text never becomes a control token
    assert all(0 <= i < tokenizer.vocab_size for i in ids)


@SETTINGS
@given(value=st.one_of(st.none(), st.integers(), st.floats(), st.binary(max_size=8), st.lists(st.integers())))
def test_non_text_is_an_irodori_error_everywhere(tokenizer: TextTokenizer, value) -> None:
    for fn in (split_for_synthesis, tokenizer.encode, lambda v: StreamSegmenter().feed(v)):
        with pytest.raises(IrodoriError):
            fn(value)
