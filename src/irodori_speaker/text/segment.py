"""Cutting an LLM token stream into speakable segments as soon as each one is complete.

`StreamSegmenter.feed` takes chunks of any size and returns the segments that are
complete; the result never depends on how the stream was chunked (a decision that needs
a character that has not arrived yet waits for it). Rules, in the order they apply:

1. Markdown is cleaned first: fenced code blocks (```...```) are dropped entirely (a
   line break stands in for them); inline backticks, ``*``, ``**``, ``__``, ``~~`` are
   removed (a stage direction such as ``*laughs*`` is kept for the readings pass);
   headings (``#``), bullets (``-``/``+``/``*``/``•``), numbered-list markers
   (``1.``), block quotes (``>``) and horizontal rules at a line start are removed;
   links ``[text](url)`` become ``text``. Other brackets, e.g. emotion tags ``[happy]``,
   are kept as text.
2. A segment ends after a sentence ender of `SENTENCE_END_CHARS` (。．.!?！？…‥ and
   newline); the whole run of enders, closing brackets/quotes, emoji and whitespace that
   follows stays with it ("本当！？」😊" is one ending).
3. It ends after a clause mark (``、，,`` ...) once it has at least `min_chars` characters,
   or `first_min_chars` for the first segment of a turn, so the first audio starts sooner.
4. A run longer than `max_chars` without such marks is hard-cut (never inside a word,
   number, URL or emoji sequence; see `irodori_speaker.text.split`), unless the run itself
   passes `overshoot_limit` (1.5 x `max_chars`): then it is cut anyway, a number at a
   digit-group boundary (`digit_group_cut`), anything else between graphemes.
5. Never split: "." / "," between digits ("3.5" arriving as "3." then "5"), URLs
   (``http(s)://`` up to whitespace or a non-ASCII character), emoji sequences.
6. Segments are whitespace-stripped. One with nothing to say (only punctuation) is
   dropped; one that is only emoji and/or tags is carried to the front of the next
   segment. Bracketed tags like ``[happy]`` at a segment start are part of that segment's
   text (they do not count towards `min_chars`); the Speaker may interpret them.
7. Pause markup (``<break time="500ms"/>``, ``[pause:0.5]``, `irodori_speaker.text.pauses`)
   is never cut: an unfinished one at the end of a chunk waits for the rest (also through
   a stall flush), a segment is never cut inside one, and a pause with nothing to say yet
   is carried to the front of the next segment.

Character counts are non-whitespace characters. Nothing here is time-based: the caller
runs the stall timer and calls ``flush(final=False)`` when the stream stalls.
"""

from __future__ import annotations

from irodori_speaker.errors import InputError
from irodori_speaker.text.pauses import markup_spans, partial_markup_start
from irodori_speaker.text.split import (
    DEFAULT_MAX_CHARS,
    WAIT,
    _Wait,
    classify,
    forced_cut,
    hard_cut,
    is_emoji_part,
    is_speakable,
    leading_tag_ends,
    overshoot_limit,
    run_end,
    strip_leading_punctuation,
    url_mask,
)
from irodori_speaker.text.tags import STAGE_WORDS_EN

__all__ = ["StreamSegmenter"]

_DIGITS = "0123456789"


class _MarkdownFilter:
    """Streaming markdown cleaner (rule 1); output for a prefix is a prefix of the full output."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.raw = ""  # input not yet decided on
        self.in_code = False
        self.line_start = True

    def push(self, chunk: str, final: bool) -> str:
        r = self.raw + chunk
        n = len(r)
        out: list[str] = []
        i = 0
        while i < n:
            if self.in_code:
                j = r.find("```", i)
                if j < 0:
                    # Keep a trailing "`" or "``" that may begin the closing fence.
                    keep = 0
                    if not final:
                        while keep < 2 and n - keep - 1 >= i and r[n - keep - 1] == "`":
                            keep += 1
                    i = n - keep
                    break
                i = j + 3
                self.in_code = False
                self.line_start = False
                out.append("\n")
                continue
            if self.line_start:
                marker = _line_marker(r, i, final)
                if isinstance(marker, _Wait):
                    break
                drop, fence = marker
                i += drop
                self.line_start = False
                if fence:
                    self.in_code = True
                    out.append("\n")
                continue
            c = r[i]
            if c == "\n":
                out.append(c)
                self.line_start = True
                i += 1
            elif c == "*":
                stage = _stage_direction(r, i, final)
                if isinstance(stage, _Wait):
                    break
                if stage:  # "*laughs*" stays whole: the readings pass strips or maps it (text/tags.py)
                    out.append(r[i : i + stage])
                    i += stage
                else:
                    i += 1  # an emphasis marker
            elif c == "\r":
                i += 1
            elif c == "`":
                if r.startswith("```", i):
                    self.in_code = True
                    out.append("\n")
                    i += 3
                elif not final and r[i:] in ("`", "``"):
                    break
                else:
                    i += 1  # inline-code marker
            elif c in "_~":
                if i + 1 >= n and not final:
                    break
                if i + 1 < n and r[i + 1] == c:
                    i += 2
                else:
                    out.append(c)
                    i += 1
            elif c == "[":
                link = _link(r, i, final)
                if isinstance(link, _Wait):
                    break
                if link is None:
                    out.append(c)
                    i += 1
                else:
                    text, consumed = link
                    out.append(text)
                    i += consumed
            else:
                out.append(c)
                i += 1
        self.raw = r[i:]  # empty when final: nothing waits then
        return "".join(out)


def _stage_direction(r: str, i: int, final: bool) -> int | _Wait:
    """Length of a stage direction ``*laughs*`` at ``r[i]`` (English action words of
    `STAGE_WORDS_EN`, at most 32 characters), 0 if it is not one; WAIT while undecided."""
    n = len(r)
    for k in range(i + 1, min(n, i + 34)):
        ch = r[k]
        if ch == "*":
            words = r[i + 1 : k].lower().split()
            return k + 1 - i if words and all(w in STAGE_WORDS_EN for w in words) else 0
        if not (ch.isascii() and (ch.isalpha() or ch == " ")):
            return 0
    return WAIT if not final and n < i + 34 else 0


def _skip(r: str, k: int, chars: str) -> int:
    while k < len(r) and r[k] in chars:
        k += 1
    return k


def _drop_to_text(r: str, k: int, i: int, final: bool) -> tuple[int, bool] | _Wait:
    """Drop the marker and the spaces after it; wait while more spaces may follow."""
    m = _skip(r, k, " \t")
    if m >= len(r) and not final:
        return WAIT
    return (m - i, False)


def _line_marker(r: str, i: int, final: bool) -> tuple[int, bool] | _Wait:
    """How many characters of line-start markup to drop at ``r[i]``, and whether a fence opens."""
    n = len(r)
    j = _skip(r, i, " \t")
    if j >= n:
        return WAIT if not final else (j - i, False)
    c = r[j]
    if c == "`":
        if r.startswith("```", j):
            return (j + 3 - i, True)
        if not final and r[j:] in ("`", "``"):
            return WAIT
        return (j - i, False)
    if c == "#":
        k = _skip(r, j, "#")
        if k >= n:
            return WAIT if not final else (k - i, False)
        if r[k] == " " and k - j <= 6:
            return _drop_to_text(r, k, i, final)
        return (j - i, False)  # "#hashtag"
    if c in "-*_+•":
        if j + 1 >= n:
            return WAIT if not final else (j - i, False)
        nxt = r[j + 1]
        if nxt == " " and c != "_":
            # A bullet, unless the line is a horizontal rule such as "- - -".
            k = _skip(r, j, c + " ")
            if k >= n and not final:
                return WAIT
            if (k >= n or r[k] == "\n") and r[j:k].count(c) >= 3:
                return (k - i, False)
            return _drop_to_text(r, j + 1, i, final)
        if nxt == c and c in "-*_":
            k = _skip(r, j, c + " ")
            if k >= n:
                return WAIT if not final else (k - i, False)
            if r[k] == "\n" and r[j:k].count(c) >= 3:
                return (k - i, False)
        return (j - i, False)
    if c == ">":
        return _drop_to_text(r, j + 1, i, final)
    if c in _DIGITS:
        k = _skip(r, j, _DIGITS)
        if k >= n:
            return WAIT if not final else (j - i, False)
        if r[k] in ".)" and k - j <= 3:
            if k + 1 >= n:
                return WAIT if not final else (j - i, False)
            if r[k + 1] == " ":
                return _drop_to_text(r, k + 1, i, final)
        return (j - i, False)
    return (j - i, False)


def _link(r: str, i: int, final: bool) -> tuple[str, int] | _Wait | None:
    """``[text](url)`` at ``r[i]`` -> (text, length); None if it is not a link."""
    n = len(r)
    close = -1
    for k in range(i + 1, min(n, i + 80)):
        if r[k] == "]":
            close = k
            break
        if r[k] in "[\n":
            return None
    if close < 0:
        return WAIT if (not final and n < i + 80) else None
    if close + 1 >= n:
        return WAIT if not final else None
    if r[close + 1] != "(":
        return None
    for k in range(close + 2, min(n, close + 2 + 512)):
        if r[k] == ")":
            return (r[i + 1 : close], k + 1 - i)
        if r[k].isspace():
            return None
    return WAIT if (not final and n < close + 2 + 512) else None


class StreamSegmenter:
    """Turns a stream of text chunks into speakable segments (see the module doc)."""

    def __init__(
        self,
        *,
        min_chars: int = 10,
        first_min_chars: int = 5,
        max_chars: int = DEFAULT_MAX_CHARS,
    ) -> None:
        if min_chars < 1 or first_min_chars < 1:
            raise InputError(
                f"min_chars and first_min_chars must be >= 1, got {min_chars} and {first_min_chars}"
            )
        if max_chars < max(min_chars, first_min_chars, 8):
            raise InputError(f"max_chars {max_chars} must be >= 8 and >= min_chars/first_min_chars")
        self.min_chars = min_chars
        self.first_min_chars = first_min_chars
        self.max_chars = max_chars
        self._filter = _MarkdownFilter()
        self.reset()

    def reset(self) -> None:
        """Forget everything: the next segment is the first of a new turn."""
        self._filter.reset()
        self._buf = ""  # cleaned text not yet emitted
        self._carry = ""  # emoji/tags waiting for the next segment
        self._emitted = False

    @property
    def pending(self) -> str:
        """Text received but not emitted yet (cleaned where already decided)."""
        return self._carry + self._buf + ("" if self._filter.in_code else self._filter.raw)

    def feed(self, chunk: str) -> list[str]:
        """Add a chunk of the stream; return the segments it completed."""
        if not isinstance(chunk, str):
            raise InputError(f"chunk must be a str, got {type(chunk).__name__}")
        self._buf += self._filter.push(chunk, final=False)
        return self._drain(final=False, hold=True)

    def flush(self, *, final: bool = True) -> list[str]:
        """Return everything pending as segments.

        ``final=True`` (end of the stream): also reset, so the next turn starts afresh.
        ``final=False`` (a stall): keep the state (an open code block stays open, the
        first-segment rule stays used up).
        """
        self._buf += self._filter.push("", final=True)
        out = self._drain(final=True, hold=not final)
        if final or not markup_spans(self._carry):
            self._carry = ""  # emoji or tags with nothing left to say (a pause waits out a stall)
        if final:
            self.reset()
        return out

    def _drain(self, final: bool, hold: bool = False) -> list[str]:
        out: list[str] = []
        held = ""  # with `hold`, an unfinished pause markup at the end waits for its rest
        start = partial_markup_start(self._buf) if hold else None
        if start is not None:
            self._buf, held = self._buf[:start], self._buf[start:]
        while self._buf:
            cut = self._next_cut(self._buf, final)
            if cut is None:
                if not final:
                    break
                cut = len(self._buf)
            elif isinstance(cut, _Wait):
                break
            seg, self._buf = self._buf[:cut], self._buf[cut:]
            self._emit(seg, out)
        self._buf += held
        return out

    def _emit(self, seg: str, out: list[str]) -> None:
        text = (self._carry + strip_leading_punctuation(seg)).strip()
        self._carry = ""
        if not text:
            return
        spans = markup_spans(text)
        words = text
        for a, b in reversed(spans):
            words = words[:a] + " " + words[b:]
        if is_speakable(words):
            out.append(text)
            self._emitted = True
        elif spans or any(is_emoji_part(ch) for ch in text) or leading_tag_ends(text):
            self._carry = text  # a pause with nothing to say yet goes with the next segment
        # else: only punctuation, nothing to say: dropped

    def _next_cut(self, s: str, final: bool) -> int | _Wait | None:
        """Where the first segment of `s` ends; `WAIT` if not decidable yet; None if no end."""
        mask = url_mask(s, final)
        threshold = self.min_chars if self._emitted else self.first_min_chars
        tag_ends = leading_tag_ends(s)
        # nonws[k]: non-whitespace characters in s[:k]
        nonws = [0] * (len(s) + 1)
        for k, ch in enumerate(s):
            nonws[k + 1] = nonws[k] + (not ch.isspace())
        inside = [False] * len(s)  # never cut within a pause markup (text/pauses.py)
        for a, b in markup_spans(s):
            inside[a : b - 1] = [True] * (b - 1 - a)
        t = 0  # tags complete within s[:i+1] do not count
        limit, over = overshoot_limit(self.max_chars), None
        for i in range(len(s)):
            while t < len(tag_ends) and tag_ends[t] <= i + 1:
                t += 1
            if inside[i]:
                continue
            size = nonws[i + 1] - (nonws[tag_ends[t - 1]] if t else 0)
            kind = classify(s, i, final, mask)
            if isinstance(kind, _Wait):
                return WAIT
            if kind == "sentence":
                return run_end(s, i, "sentence", final)
            if kind == "clause" and size >= threshold:
                return run_end(s, i, "clause", final)
            if size > self.max_chars:
                over = i if over is None else over
                cut = hard_cut(s, i, final)
                if cut is not None:
                    return cut
                if size > limit:  # an unbreakable run (a long number, "ｗ" x 300): cut it anyway
                    return forced_cut(s, over)
        return None
