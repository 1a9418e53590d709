"""Splitting long text into utterances the model can speak well (<= ~15 s each).

The character classes and boundary rules here are the single definition shared with the
stream segmenter (`irodori_speaker.text.segment`):

- a *sentence* boundary is a character of `SENTENCE_END_CHARS` (or a newline); the run
  of enders, closing brackets/quotes, emoji and whitespace after it stays with the
  sentence ("！？」😊 " all belong to the sentence before);
- a *clause* boundary is a character of `CLAUSE_CHARS`;
- "." / "．" / "," / "，" between two digits ("3.14", "1,000") is part of a number, an
  ASCII "." followed by an ASCII letter or digit ("Node.js", "v1.2") is not an ender,
  and nothing inside a URL (``http(s)://`` up to whitespace or a non-ASCII character;
  trailing ASCII punctuation is not part of it) is a boundary;
- a hard cut never falls inside a run of ASCII non-space characters (words, numbers,
  URLs), between digits, inside an emoji sequence, before punctuation, a closing bracket,
  small kana or "ー", or after an opening bracket;
- such an unbreakable run is kept whole while its piece stays within `overshoot_limit`
  (1.5 x the budget); a longer one (a 5,000-letter "word", "ｗ" x 300, an emoji flood) is
  cut between characters (`forced_cut`: never inside a grapheme when it can be helped), so
  every piece is bounded and the number of pieces is at most the number of characters.

The functions take ``final``: with ``final=False`` (a stream whose end is unknown) they
return `WAIT` when the answer depends on characters that have not arrived yet, so a
decision, once made, never changes as more text arrives.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final, Literal

from irodori_speaker.errors import InputError

__all__ = [
    "CLAUSE_CHARS",
    "CLOSING_CHARS",
    "DEFAULT_MAX_CHARS",
    "MAX_LINE_CHARS",
    "NUMBER_SEPARATORS",
    "OPENING_CHARS",
    "SENTENCE_END_CHARS",
    "check_line_text",
    "forced_cut",
    "is_emoji_part",
    "is_speakable",
    "measure",
    "overshoot_limit",
    "split_for_synthesis",
    "strip_leading_punctuation",
]

# Sentence enders ("." and "．" only when not inside a number; ASCII "." also not before an
# ASCII letter/digit). Ellipses end a sentence too; runs like "！？" or "……" stay together.
SENTENCE_END_CHARS: Final[frozenset[str]] = frozenset("。．.!?！？…‥\n")
CLAUSE_CHARS: Final[frozenset[str]] = frozenset("、，,､；;")
CLOSING_CHARS: Final[frozenset[str]] = frozenset("」』）)】］]｝}〉》〕〗〙〛〟\"'”’»›")
OPENING_CHARS: Final[frozenset[str]] = frozenset("「『（(【［[｛{〈《〔〖〘〚〝“‘«‹")
NUMBER_SEPARATORS: Final[frozenset[str]] = frozenset(".．,，")

# ~15 s of speech per utterance (Irodori garbles past ~20 s; the model's cap is 30 s).
# Measured with benchmarks/duration_estimate.py (docs/text.md): sentences of 30+ characters
# run at ~6.0 non-whitespace chars/s of speech, so 15 s holds ~90 characters, and the
# default length estimate reaches 15 s at ~88 characters.
DEFAULT_MAX_CHARS: Final[int] = 90

#: The longest text one line may have (about ten minutes of speech): a chat message beyond it is
#: refused before any work rather than read for an hour (longer text: split it, or say_stream).
MAX_LINE_CHARS: Final[int] = 5_000


def check_line_text(text: object) -> str:
    """`text` if it is a str a line may speak; else an `InputError` (not a str, too long)."""
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got {type(text).__name__}")
    if len(text) > MAX_LINE_CHARS:
        raise InputError(
            f"a line of {len(text)} characters is longer than the {MAX_LINE_CHARS} one line may have",
            hint="split long text into lines yourself, or feed it through say_stream()",
        )
    return text


# Kana that end a sentence in chat ("楽しかったね", "いくよ", "でした", "やったっ"): an emoji after
# one closes the sentence even when hiragana follows.
_FINAL_KANA: Final[frozenset[str]] = frozenset("ねよなわぞぜさかたすうっー")
_LEADING_DROP: Final[frozenset[str]] = (CLAUSE_CHARS | SENTENCE_END_CHARS | CLOSING_CHARS) - frozenset("…‥")
_SMALL_KANA: Final[frozenset[str]] = frozenset("ぁぃぅぇぉっゃゅょゎァィゥェォッャュョヮヵヶーｰ")
#: A URL longer than this is not protected as one (it is text, cut like any unbreakable run).
MAX_URL_CHARS: Final[int] = 2048
_URL_RE: Final[re.Pattern[str]] = re.compile(
    r"https?://[!-~]{0,%s}(?![!-~])" % MAX_URL_CHARS,  # noqa: UP031 (braces are regex syntax here)
    re.IGNORECASE,
)
_URL_TRAILING: Final[frozenset[str]] = frozenset(".,!?:;)]}>'\"")
# Bracketed tags such as "[happy]": no spaces or boundary characters inside.
_TAG_BODY = r"[^\[\]\s、。，,.!?！？…‥]{1,32}"
_LEADING_TAGS_RE: Final[re.Pattern[str]] = re.compile(r"^\s*(?:\[" + _TAG_BODY + r"\]\s*)+")
_TAG_RE: Final[re.Pattern[str]] = re.compile(r"\s*\[" + _TAG_BODY + r"\]")


class _Wait:
    """Sentinel: the decision needs characters that have not arrived yet."""

    def __repr__(self) -> str:
        return "WAIT"


WAIT: Final = _Wait()

Kind = Literal["sentence", "clause"]


def is_emoji_part(ch: str) -> bool:
    """True for emoji and the characters that glue emoji sequences (ZWJ, VS16, skin tones...)."""
    o = ord(ch)
    return (
        0x1F000 <= o <= 0x1FAFF  # pictographs, emoticons, flags, skin tones
        or 0x2600 <= o <= 0x27BF  # misc symbols and dingbats (incl. ♡ ♪ ★ ✨ ❤)
        or 0x2B00 <= o <= 0x2BFF  # arrows/stars (⭐ ⬆)
        or 0x2300 <= o <= 0x23FF  # technical (⌚ ⏰ ⏩)
        or 0xE0020 <= o <= 0xE007F  # tag sequences
        or o in (0x200D, 0xFE0E, 0xFE0F, 0x20E3, 0x00A9, 0x00AE, 0x203C, 0x2049, 0x2122, 0x3030, 0x303D)
    )


def _is_glue(ch: str) -> bool:
    """Characters that can never start a piece: joiners, variation selectors, combining marks."""
    o = ord(ch)
    return (
        o in (0x200D, 0xFE0E, 0xFE0F, 0x20E3, 0x3099, 0x309A)
        or 0x1F3FB <= o <= 0x1F3FF
        or 0xE0020 <= o <= 0xE007F
        or unicodedata.combining(ch) != 0
    )


def is_speakable(text: str) -> bool:
    """True when `text` has something to say (a letter, kana, kanji or digit), tags aside."""
    return any(ch.isalnum() for ch in strip_leading_tags(text))


def strip_leading_tags(text: str) -> str:
    """`text` without the bracketed tags (e.g. ``[happy]``) at its start."""
    return _LEADING_TAGS_RE.sub("", text, count=1)


def leading_tag_ends(s: str) -> list[int]:
    """Index just after each of the consecutive bracketed tags at the start of `s`."""
    ends = []
    pos = 0
    while (m := _TAG_RE.match(s, pos)) is not None:
        pos = m.end()
        ends.append(pos)
    return ends


def url_spans(s: str) -> list[tuple[int, int]]:
    """(start, end) of each complete URL in `s`, trailing ASCII punctuation left out."""
    spans = []
    for m in _URL_RE.finditer(s):
        start, end = m.span()
        while end > start and s[end - 1] in _URL_TRAILING:
            end -= 1
        spans.append((start, end))
    return spans


def url_mask(s: str, final: bool) -> list[bool | None]:
    """Per character: inside a URL (True), not (False), or not known yet (None).

    Trailing ASCII punctuation is not part of a URL, so while a URL runs to the end of
    an unfinished stream, the punctuation at its end is undecided.
    """
    mask: list[bool | None] = [False] * len(s)
    for m in _URL_RE.finditer(s):
        start, end = m.span()
        t = end
        while t > start and s[t - 1] in _URL_TRAILING:
            t -= 1
        for k in range(start, t):
            mask[k] = True
        if end == len(s) and not final:
            for k in range(t, end):
                mask[k] = None
    return mask


def classify(s: str, i: int, final: bool, mask: list[bool | None]) -> Kind | _Wait | None:
    """Is ``s[i]`` a sentence or clause boundary? `WAIT` if that depends on what follows."""
    c = s[i]
    if mask[i] is None:
        return WAIT
    if mask[i]:
        return None
    known_next = i + 1 < len(s)
    if c in NUMBER_SEPARATORS and i > 0 and s[i - 1].isdecimal():
        if not known_next:
            if not final:
                return WAIT
        elif s[i + 1].isdecimal():
            return None
    if c == ".":
        if not known_next:
            if not final:
                return WAIT
        elif s[i + 1].isascii() and s[i + 1].isalnum():
            return None
    if c in SENTENCE_END_CHARS:
        return "sentence"
    if c in CLAUSE_CHARS:
        return "clause"
    if _is_pictograph(c) and not (i > 0 and is_emoji_part(s[i - 1])):
        return _emoji_boundary(s, i, final)
    return None


def _is_pictograph(ch: str) -> bool:
    """Emoji that can close a sentence in chat text (not joiners, skin tones, keycaps, (c))."""
    o = ord(ch)
    return (
        (0x1F000 <= o <= 0x1FAFF and not 0x1F3FB <= o <= 0x1F3FF)
        or 0x2600 <= o <= 0x27BF
        or 0x2B00 <= o <= 0x2BFF
    )


def _emoji_boundary(s: str, i: int, final: bool) -> Kind | _Wait | None:
    """An emoji run starting at ``s[i]`` ends a sentence ("楽しかった😊明日も") unless what
    follows continues it: hiragana ("🍣が好き") unless the emoji follows a sentence-final kana
    ("楽しかったね😊また" ends), or punctuation/closers (they end it)."""
    j = i + 1
    while j < len(s) and is_emoji_part(s[j]):
        j += 1
    if j >= len(s):
        return "sentence" if final else WAIT
    nxt = s[j]
    if nxt in SENTENCE_END_CHARS or nxt in CLAUSE_CHARS or nxt in CLOSING_CHARS:
        return None
    if _script(nxt) == "hiragana" and not (i > 0 and s[i - 1] in _FINAL_KANA):
        return None  # "🍣が好き": the emoji is a word of the sentence
    return "sentence"  # "楽しかったね😊また明日": after a sentence-final ending it closes it


def strip_leading_punctuation(text: str) -> str:
    """`text` without the clause marks, enders (ellipses aside) and closers at its start: what a
    stall flush left behind belongs to the segment before and is not said again (issue 12)."""
    k = 0
    while k < len(text) and (text[k] in _LEADING_DROP or text[k].isspace()):
        k += 1
    return text[k:]


def run_end(s: str, i: int, kind: Kind, final: bool) -> int | _Wait:
    """End of the boundary run that starts at ``s[i]`` (enders, closers, emoji, spaces)."""
    j = i + 1
    n = len(s)
    while j < n:
        c = s[j]
        if kind == "sentence":
            ok = c in SENTENCE_END_CHARS or c in CLOSING_CHARS or is_emoji_part(c) or c.isspace()
        else:
            ok = c in CLAUSE_CHARS or c in CLOSING_CHARS or c.isspace() or _is_glue(c)
        if not ok:
            break
        j += 1
    if j >= n and not final:
        return WAIT
    return j


def _ascii_word(ch: str) -> bool:
    return ch.isascii() and not ch.isspace()


def cut_allowed(s: str, p: int, final: bool) -> bool | _Wait:
    """May a hard cut fall between ``s[p-1]`` and ``s[p]``? (0 < p < len(s))"""
    a, b = s[p - 1], s[p]
    if _ascii_word(a) and _ascii_word(b):
        return False
    if a.isdecimal() and b.isdecimal():
        return False
    if is_emoji_part(a) and is_emoji_part(b):
        return False
    if _is_glue(b) or b in CLOSING_CHARS or b in _SMALL_KANA or a in OPENING_CHARS:
        return False
    if b in SENTENCE_END_CHARS or b in CLAUSE_CHARS:  # punctuation belongs to the text before it
        return False
    # "3．" + "5" / "3" + "，5": separators between digits belong to the number.
    if a in NUMBER_SEPARATORS and b.isdecimal() and p >= 2 and s[p - 2].isdecimal():
        return False
    if a.isdecimal() and b in NUMBER_SEPARATORS:
        if p + 1 >= len(s):
            return True if final else WAIT
        if s[p + 1].isdecimal():
            return False
    return True


def _script(ch: str) -> str:
    o = ord(ch)
    if 0x3041 <= o <= 0x309F:
        return "hiragana"
    if 0x30A0 <= o <= 0x30FF:
        return "katakana"
    if 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF:
        return "kanji"
    return "other"


def hard_cut(s: str, i: int, final: bool) -> int | _Wait | None:
    """Best hard-cut position ``p`` in ``(0, i]`` (the piece is ``s[:p]``), or None if none.

    Preference, looking back from `i` over the second half of the piece: after whitespace
    or punctuation, then where hiragana meets kanji/katakana (a likely word start), else
    the last allowed position.
    """
    best = script_change = None
    for p in range(min(i, len(s) - 1), 0, -1):
        ok = cut_allowed(s, p, final)
        if isinstance(ok, _Wait):
            return WAIT
        if not ok:
            continue
        if best is None:
            best = p
        if p * 2 < i:
            break
        prev = s[p - 1]
        if prev.isspace() or unicodedata.category(prev).startswith("P"):
            return p
        if script_change is None and _script(prev) == "hiragana" and _script(s[p]) in ("kanji", "katakana"):
            script_change = p
    return script_change if script_change is not None else best


def _sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of each sentence of `text`, boundary runs included."""
    spans = []
    mask = url_mask(text, True)
    start = 0
    i = 0
    n = len(text)
    while i < n:
        kind = classify(text, i, True, mask)
        if kind == "sentence":
            end = run_end(text, i, "sentence", True)
            assert isinstance(end, int)
            spans.append((start, end))
            start = i = end
            continue
        i += 1
    if start < n:
        spans.append((start, n))
    return spans


def _clause_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    s = text[start:end]
    mask = url_mask(s, True)
    spans = []
    a = 0
    i = 0
    while i < len(s):
        if classify(s, i, True, mask) == "clause":
            e = run_end(s, i, "clause", True)
            assert isinstance(e, int)
            spans.append((start + a, start + e))
            a = i = e
            continue
        i += 1
    if a < len(s):
        spans.append((start + a, end))
    return spans


def measure(text: str) -> int:
    """The length budgets count non-whitespace characters."""
    return sum(1 for ch in text if not ch.isspace())


def _measure(text: str, span: tuple[int, int]) -> int:
    return measure(text[span[0] : span[1]])


def overshoot_limit(max_chars: int) -> int:
    """How far past `max_chars` a piece may run to keep an unbreakable run whole (1.5x)."""
    return max_chars + max_chars // 2


#: A digit run too long to keep whole is cut after a multiple of this many of its digits (the
#: Japanese grouping: 万, 億, 兆), so each piece still reads as a number.
DIGIT_GROUP: Final[int] = 4


def digit_group_cut(s: str, i: int) -> int | None:
    """The last cut ``p`` in the second half of ``(0, i]`` that falls inside a number at a group
    boundary: after a separator ("1,000," + "000") or after a multiple of `DIGIT_GROUP` digits
    of the run; None if ``s[i-1:i+1]`` is not inside a number or no such place exists."""
    if i < 1 or not (s[i].isdecimal() or s[i] in NUMBER_SEPARATORS):
        return None
    if not (s[i - 1].isdecimal() or (s[i - 1] in NUMBER_SEPARATORS and i >= 2 and s[i - 2].isdecimal())):
        return None
    for p in range(i, max(1, (i + 1) // 2) - 1, -1):
        a, b = s[p - 1], s[p]
        if not b.isdecimal():
            continue
        if a in NUMBER_SEPARATORS and p >= 2 and s[p - 2].isdecimal():
            return p
        if not a.isdecimal():
            return None  # the number starts within the window: no boundary further back
        k = 0  # digits of the run before p
        while k < p and s[p - 1 - k].isdecimal():
            k += 1
        if k % DIGIT_GROUP == 0:
            return p
    return None


def forced_cut(s: str, i: int) -> int:
    """A cut ``p`` in ``(0, i]`` for when no allowed cut exists: inside a long number, at a
    digit-group boundary (`digit_group_cut`); else the last one in the second half that splits
    no grapheme (a joiner, variation selector, skin tone or combining mark stays with the
    character before it; a flag's two letters stay together), else ``i``."""
    group = digit_group_cut(s, i)
    if group is not None:
        return group
    for p in range(i, max(1, (i + 1) // 2) - 1, -1):
        a, b = s[p - 1], s[p]
        if _is_glue(b) or a == "\u200d":
            continue
        if _is_regional(a) and _is_regional(b) and _regional_run(s, p) % 2:
            continue
        return p
    return i


def _is_regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def _regional_run(s: str, p: int) -> int:
    """How many regional indicators end at ``s[p-1]`` (odd: ``s[p]`` completes a flag)."""
    n = 0
    while p - n - 1 >= 0 and _is_regional(s[p - n - 1]) and n < 64:
        n += 1
    return n


def _hard_spans(text: str, start: int, end: int, max_chars: int) -> list[tuple[int, int]]:
    """Cut text[start:end] into pieces of at most `max_chars` (an unbreakable run: at most
    `overshoot_limit(max_chars)`). Linear in the text: each piece looks at a window of it."""
    limit = overshoot_limit(max_chars)
    spans = []
    while True:
        # the window: up to the character that puts the piece over `limit` (+2 to look ahead)
        count, over, stop = 0, None, end
        for k in range(start, end):
            count += not text[k].isspace()
            if count > max_chars and over is None:
                over = k - start
            if count > limit:
                stop = min(end, k + 3)
                break
        if over is None:
            break
        s = text[start:stop]
        cut = hard_cut(s, over, True)
        if cut is None:  # nothing allowed up to the budget: the first allowed cut within the limit
            seen = measure(s[: over + 1])
            for p in range(over + 1, len(s)):
                if seen > limit:
                    break
                if cut_allowed(s, p, True) is True:
                    cut = p
                    break
                seen += not s[p].isspace()
        if not isinstance(cut, int):
            cut = forced_cut(s, over)
        spans.append((start, start + cut))
        start += cut
    spans.append((start, end))
    return spans


def _pack(text: str, spans: list[tuple[int, int]], max_chars: int) -> list[tuple[int, int]]:
    """Merge consecutive spans while the merged text stays within `max_chars`."""
    out: list[tuple[int, int]] = []
    for span in spans:
        if out and out[-1][1] == span[0] and _measure(text, (out[-1][0], span[1])) <= max_chars:
            out[-1] = (out[-1][0], span[1])
        else:
            out.append(span)
    return out


def _attach_unspeakable(text: str, spans: list[tuple[int, int]], limit: int) -> list[tuple[int, int]]:
    """Fold pieces with nothing to say ("……", "！", an emoji) into a neighbour while the
    result stays within `limit`; what does not fit is dropped (an emoji flood is not read
    out), unless the text has nothing to say at all (then its first such run is kept)."""

    def joins(head: tuple[int, int] | None, b_start: int, b_end: int) -> bool:
        return head is not None and head[1] == b_start and _measure(text, (head[0], b_end)) <= limit

    out: list[tuple[int, int]] = []
    pending: tuple[int, int] | None = None  # unspeakable text waiting for the next piece
    alone: tuple[int, int] | None = None  # the first such run, for text with nothing to say
    for a, b in spans:
        if is_speakable(text[a:b]):
            if pending is not None and joins(pending, a, b):
                a = pending[0]
            pending = None
            out.append((a, b))
            continue
        if out and joins(out[-1], a, b):
            out[-1] = (out[-1][0], b)
        elif joins(pending, a, b):
            assert pending is not None
            pending = (pending[0], b)
        else:
            pending = (a, b)
        if not out and pending is not None and (alone is None or alone[0] == pending[0]):
            alone = pending
    return out or ([alone] if alone is not None else [])


def split_for_synthesis(text: str, *, max_chars: int = DEFAULT_MAX_CHARS, merge: bool = True) -> list[str]:
    """Split `text` into pieces of at most `max_chars` non-whitespace characters.

    Sentence boundaries first; a sentence still too long is split at clause boundaries;
    a clause still too long is hard-cut (see the module doc for where cuts may fall). A
    piece may exceed `max_chars`, up to `overshoot_limit(max_chars)`, to keep an
    unbreakable run (a long URL, a number) whole or to absorb a neighbour with nothing to
    say, such as "……" or an emoji; unbreakable runs longer than that are cut between
    characters, and unspeakable runs that fit nowhere are dropped. With `merge`,
    consecutive pieces are joined back while they fit, so each utterance is as long as the
    budget allows (fewer model calls, steadier prosody). Text that fits is returned as one
    piece; empty text gives ``[]``. Linear in the length of `text`.
    """
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got {type(text).__name__}")
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 8:
        raise InputError(f"max_chars must be an integer >= 8, got {max_chars!r}")
    if not text.strip():
        return []
    if measure(text) <= max_chars:
        return [text.strip()]
    pieces: list[tuple[int, int]] = []
    for span in _sentence_spans(text):
        if _measure(text, span) <= max_chars:
            pieces.append(span)
            continue
        for clause in _pack(text, _clause_spans(text, *span), max_chars):
            if _measure(text, clause) <= max_chars:
                pieces.append(clause)
            else:
                pieces.extend(_hard_spans(text, *clause, max_chars))
    # Punctuation or emoji left on their own join a neighbour, up to the overshoot limit.
    pieces = _attach_unspeakable(text, pieces, overshoot_limit(max_chars))
    if merge:
        pieces = _pack(text, pieces, max_chars)
    return [t for t in (text[a:b].strip() for a, b in pieces) if t]
