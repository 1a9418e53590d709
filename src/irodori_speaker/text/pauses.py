"""Pause markup in the text: split a line into speech and exact silences.

Two spellings, anywhere in a line (case-insensitive, spaces allowed inside):

    こんにちは<break time="500ms"/>今日は      SSML-like: time in ms or s ("1s", "1.5s")
    こんにちは[pause:0.5]今日は                 seconds, or with a unit ("[pause:500ms]")

`split_pauses` turns a line into text pieces and `Pause`s; the synthesizer renders the
pieces and joins them with exactly round(seconds * SAMPLE_RATE) zero samples. The markup never
reaches the model. Something that starts like markup but is not valid (`<break time="x"/>`,
`[pause:]`, a pause over `MAX_PAUSE_S`) is an `InputError` naming it, not text read aloud.

Unclosed markup (``こんにちは[pause:0.5テスト``, an LLM stream cut inside ``<break time="5``):
the opener and what can still be read as its argument are dropped, everywhere (speech,
captions, the stream segmenter, `pause_markup=False`): the line says ``こんにちはテスト``, with no
pause (nothing says where it would end) and no error (chat and LLM text break markup by
accident; reading ``[ポーズ:0.5`` aloud is worse than nothing).

Pauses are bounded: one markup (or several in a row, which add up) over `MAX_PAUSE_S` (10 s)
is an `InputError`, not clamped: a bot that asks for 15 s gets told, instead of a shorter pause
it did not ask for. Longer silences are `pre_silence` / `post_silence` (up to 60 s).

With the option `pause_markup=False` (chat text: a viewer must not be able to put 10 s of
silence on the stream) the synthesizer calls `strip_markup` instead: every markup, valid or
not, is taken out of the text and neither paused at nor read (read as text it would be
spelt out, ブレイクタイム..., which is worse than nothing and still lets chat steer the voice).

`partial_markup_start` serves the LLM stream segmenter: where an unfinished markup may begin
at the end of a chunk, so it waits for the rest instead of cutting it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InputError

__all__ = [
    "MAX_PAUSE_S",
    "Pause",
    "canonical",
    "markup_spans",
    "partial_markup_start",
    "split_pauses",
    "strip_markup",
]

MAX_PAUSE_S = 10.0
_HINT = (
    'write <break time="500ms"/>, <break time="1s"/> or [pause:0.5] (seconds, at most 10 in a row; '
    "longer: pre_silence / post_silence)"
)

# Anything that announces itself as pause markup: closed (validated by _BREAK / _PAUSE), else
# unclosed: the opener and the part of its argument that can be read as one (dropped).
_NUM = r"(?:\d+(?:\.\d*)?|\.\d+)"
_UNIT = r"(?:ms|s)(?![A-Za-z])"
_CLOSED = r"<\s*break\b[^<>]*>|\[\s*pause\s*:[^\[\]]*\]"
_UNCLOSED = (
    rf"<\s*break(?![A-Za-z0-9_])(?:\s*time\s*(?:=\s*(?:[\"']\s*)?(?:{_NUM}\s*(?:{_UNIT})?\s*[\"']?\s*/?)?)?)?"
    rf"|\[\s*pause\s*:\s*(?:{_NUM}\s*(?:{_UNIT})?)?"
)
_CANDIDATE = re.compile(f"(?P<closed>{_CLOSED})|{_UNCLOSED}", re.IGNORECASE)
_BREAK = re.compile(
    r"<\s*break\s+time\s*=\s*(?P<q>[\"']?)\s*(?P<num>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>ms|s)\s*(?P=q)\s*/?\s*>",
    re.IGNORECASE,
)
_PAUSE = re.compile(r"\[\s*pause\s*:\s*(?P<num>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>ms|s)?\s*\]", re.IGNORECASE)
# the longest prefix that can still become markup: "<", "<br", "<break time=\"1", "[pa", ...
_PREFIXES = ("<break", "[pause")


@dataclass(frozen=True)
class Pause:
    """A silence of `seconds` in a line."""

    seconds: float


def _seconds(markup: str) -> float:
    m = _BREAK.fullmatch(markup) or _PAUSE.fullmatch(markup)
    if m is None:
        raise InputError(f"cannot read the pause markup {markup[:40]!r}", hint=_HINT)
    value = float(m.group("num"))
    if (m.group("unit") or "s").lower() == "ms":
        value /= 1000.0
    if value > MAX_PAUSE_S:
        raise InputError(f"pause {markup[:40]!r} is longer than {MAX_PAUSE_S:g} s", hint=_HINT)
    return value


def markup_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every pause markup (valid or not, closed or not) in `text`."""
    return [m.span() for m in _CANDIDATE.finditer(text)]


def split_pauses(text: str) -> list[str | Pause]:
    """`text` as text pieces and Pauses in order (no markup: `[text]`). Adjacent pauses add up;
    text pieces are kept as they are (possibly only whitespace: the caller decides)."""
    out: list[str | Pause] = []
    pos = 0
    for m in _CANDIDATE.finditer(text):
        if m.start() > pos:
            if out and isinstance(out[-1], str):  # the text around dropped unclosed markup
                out[-1] += text[pos : m.start()]
            else:
                out.append(text[pos : m.start()])
        pos = m.end()
        if m["closed"] is None:  # unclosed: dropped, no pause
            continue
        seconds = _seconds(m.group(0))
        if out and isinstance(out[-1], Pause):
            seconds += out[-1].seconds
            if seconds > MAX_PAUSE_S + 1e-9:
                raise InputError(
                    f"pauses in a row add up to {seconds:g} s, over {MAX_PAUSE_S:g} s", hint=_HINT
                )
            out[-1] = Pause(seconds)
        else:
            out.append(Pause(seconds))
    if out and isinstance(out[-1], str):
        out[-1] += text[pos:]
    elif pos < len(text) or not out:
        out.append(text[pos:])
    return out


def strip_markup(text: str) -> str:
    """`text` with every pause markup (valid or not, closed or not) taken out: no pause,
    nothing read."""
    return _CANDIDATE.sub("", text)


def canonical(seconds: float) -> str:
    """The one spelling of a pause in identities (the phrase-cache key): '<break time="500ms"/>'."""
    return f'<break time="{round(seconds * 1000, 3):g}ms"/>'


def partial_markup_start(text: str) -> int | None:
    """Index where an unfinished pause markup may start at the end of `text`, else None.

    "…です<bre" -> the index of "<"; "…[pause:0." -> the index of "["; a complete markup,
    or a "<" / "[" that cannot begin one ("<b>" , "[happy"), gives None."""
    for opener in ("<", "["):
        i = text.rfind(opener)
        if i < 0:
            continue
        tail = text[i:]
        if (">" if opener == "<" else "]") in tail:
            continue
        squeezed = re.sub(r"\s+", "", tail).lower()
        prefix = _PREFIXES[0] if opener == "<" else _PREFIXES[1]
        could_be = prefix.startswith(squeezed) or squeezed.startswith(prefix)
        if could_be and len(tail) <= 64:  # longer is not markup waiting to finish
            return i
    return None
