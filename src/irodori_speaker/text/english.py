"""Latin words to katakana, and chat laughter (``www``), so that the model reads them as a
Japanese speaker would.

Irodori was trained on Japanese text; a Latin word reaches it as letters it reads badly or
spells out. Each Latin word (a run of letters, ``'`` inside allowed) is replaced by a
katakana reading from the first source that has one, in this order (chosen by measurement on
262 stream words and names, `benchmarks/english_readings.py`, numbers in
docs/text-and-readings.md):

1. an acronym (all capitals, at most 4 letters): pyopenjtalk's dictionary when it knows it
   as a word (``OK`` オーケイ, ``PC`` ピーシー), else the letter names (``GG`` ジージー);
2. pyopenjtalk's own dictionary, when it reads the word as one noun (``iPhone`` アイフォン,
   ``YouTube`` ユーチューブ); words it does not know it spells letter by letter, and those
   go on to:
3. capitals before a word (``VTuber``): the capitals spelt, the rest read (ブイ + チューバー);
4. `e2k` (the ``english`` extra, numpy only): a small neural model that reads any spelling
   (~15 ms a word on one CPU core; readings are cached).

`alkana` (a dictionary of English pronunciations) was measured too and is not used: it reads
as an English speaker says the word (グレイト, ゲイム, ストゥリーム), not as the loanword
Japanese writes (グレート, ゲーム, ストリーム), and misses 15 % of the list.

A source that is not installed is skipped; with none, Latin words stay as they are. Laughter:
a run of ``w`` (``www``, NFKC has already made ``ｗ`` ``w``) after Japanese text or on its own
is chat laughter, read as ワラ (one ``w``) or ワラワラ (more), or dropped (``laughter="drop"``).
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from typing import Any, Final

from irodori_speaker.text.length import _load_pyopenjtalk

__all__ = ["LETTER_NAMES", "english_backends", "read_english", "read_laughter", "word_reading"]

LETTER_NAMES: Final = dict(zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ", (
    "エー", "ビー", "シー", "ディー", "イー", "エフ", "ジー", "エイチ", "アイ", "ジェー",
    "ケー", "エル", "エム", "エヌ", "オー", "ピー", "キュー", "アール", "エス", "ティー",
    "ユー", "ブイ", "ダブリュー", "エックス", "ワイ", "ゼット",
), strict=True))  # fmt: skip
_WORD: Final = re.compile(r"[A-Za-z]+(?:['’][A-Za-z]+)*")
# Laughter: w-runs not inside a Latin word (after Japanese text, a space, punctuation, the start)
_LAUGH: Final = re.compile(r"(?<![A-Za-z])w+(?![A-Za-z]|\.[A-Za-z])")
_CAPS_HEAD: Final = re.compile(r"^[A-Z]{1,3}(?=[A-Z][a-z]{2,})")
_KATAKANA: Final = re.compile(r"^[\u30a0-\u30ffー]+$")

_lock = threading.Lock()
_backends: dict[str, Any] = {}


def _e2k() -> Any:
    with _lock:
        if "e2k" not in _backends:
            try:
                import e2k  # type: ignore[import-untyped,unused-ignore]

                _backends["e2k"] = e2k.C2K()
            except Exception:
                _backends["e2k"] = None
        return _backends["e2k"]


def english_backends() -> list[str]:
    """The reading sources installed here, in the order they are asked."""
    out = ["openjtalk"] if _load_pyopenjtalk() is not None else []
    return out + (["e2k"] if _e2k() is not None else [])


def openjtalk_word(word: str) -> str | None:
    """pyopenjtalk's reading of `word` when its dictionary has it as one word, else None."""
    pj = _load_pyopenjtalk()
    if pj is None:
        return None
    nodes = pj.run_frontend(word)
    if len(nodes) != 1 or nodes[0]["pos"] in ("フィラー", "記号"):
        return None  # spelt letter by letter: pyopenjtalk does not know it
    pron = nodes[0]["pron"].replace("’", "")
    return pron if _KATAKANA.match(pron) else None


def e2k_word(word: str) -> str | None:
    model = _e2k()
    if model is None:
        return None
    kana = model(word.lower())
    return kana if kana and _KATAKANA.match(kana) else None


def spell(word: str) -> str:
    return "".join(LETTER_NAMES[c] for c in word.upper() if c in LETTER_NAMES)


# Bounds for hostile chat (a wall of random words): e2k costs ~15 ms a new word.
MAX_WORD_LETTERS: Final = 32
MAX_NEW_WORDS: Final = 64  # per text; words already read (cached) are free

_CACHE_SIZE: Final = 4096
_cache: OrderedDict[str, str | None] = OrderedDict()


def word_reading(word: str) -> str | None:
    """The katakana reading of one Latin word (see the module doc), None when no source is
    installed. Readings are kept (the last 4,096 words)."""
    with _lock:
        if word in _cache:
            _cache.move_to_end(word)
            return _cache[word]
    out = _read_word(word)
    with _lock:
        _cache[word] = out
        if len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return out


def _read_word(word: str) -> str | None:
    if word.isupper() and len(word) <= 4:
        return openjtalk_word(word) or spell(word)
    known = openjtalk_word(word)
    if known:
        return known
    head = _CAPS_HEAD.match(word)  # "VTuber": the capitals spelt, the word after them read
    if head:
        rest = _read_word(word[head.end() :])
        return None if rest is None else spell(head[0]) + rest
    return e2k_word(word)


def read_english(text: str) -> str:
    """`text` with every Latin word replaced by its katakana reading (where a source has one)."""
    if not any("A" <= c <= "z" for c in text):
        return text

    budget = [MAX_NEW_WORDS]

    def one(m: re.Match[str]) -> str:
        word = m[0].replace("’", "'")
        if (len(word) == 1 and word.islower()) or len(word) > MAX_WORD_LETTERS:
            return m[0]  # a lone small letter is a symbol ("x", "a案"); a 5,000-letter "word" is spam
        if word not in _cache:
            if budget[0] <= 0:
                return m[0]
            budget[0] -= 1
        return word_reading(word) or m[0]

    return _WORD.sub(one, text)


def read_laughter(text: str, mode: str = "read") -> str:
    """Chat laughter ``w`` / ``www`` -> ワラ / ワラワラ (``mode="read"``) or nothing (``"drop"``)."""
    if "w" not in text:
        return text

    def one(m: re.Match[str]) -> str:
        start = m.start()
        before = text[start - 1] if start else ""
        run = m[0]
        if before and before.isascii() and before.isalnum():
            return run
        if len(run) == 1 and not before:  # a lone "w" at the start is a letter, not a laugh
            return run
        if mode == "drop":
            return ""
        return "ワラ" if len(run) == 1 else "ワラワラ"

    return _LAUGH.sub(one, text)
