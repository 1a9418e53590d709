"""The readings pass: what a line says after the reference normalisation and the user dictionary.

`apply_readings(text, options)` runs, in this order (each switchable by its option of
`SynthesisOptions`, stage "text"; docs/text-and-readings.md):

1. `tags` ("strip"): emotion and stage tags removed (`text/tags.py`);
2. `urls` ("word"): every ``http(s)://`` URL (and a bare ``www.`` host) said as the word
   "URL" (ユーアールエル), or its host name (``"domain"``: ``example.com`` ->
   エグザンプルドットコム), or dropped (``"drop"``), or left (``"keep"``: read letter by
   letter, ~10 s for a long link);
3. `laughter` ("read"): chat laughter ``www`` -> ワラワラ (`text/english.py`);
4. `read_numbers` (True): dates, times, units, currency, signs (`text/numbers.py`);
5. `read_english` (True): Latin words to katakana (`text/english.py`; needs pyopenjtalk
   and/or the ``english`` extra, else words stay as they are).

The caller (`Synthesizer.spoken_text`) runs the reference normalisation again on the result,
so what the model reads is always a fixed point of the normalisation it was trained with.
"""

from __future__ import annotations

import re
from typing import Any, Final

from irodori_speaker.errors import InputError
from irodori_speaker.text.english import read_english, read_laughter
from irodori_speaker.text.numbers import read_numbers
from irodori_speaker.text.pauses import Pause, split_pauses, strip_markup
from irodori_speaker.text.tags import strip_tags

__all__ = ["URL_WORD", "apply_readings", "nothing_to_say", "read_urls", "url_spans"]

URL_WORD: Final = "URL"
_URL: Final = re.compile(r"(?:https?://|(?<![\w.])www\.)[!-~]+", re.IGNORECASE)
_URL_TRAILING: Final = ".,!?:;)]}>'\""
_HOST: Final = re.compile(r"^(?:https?://)?(?:www\.)?([^/:?#]+)", re.IGNORECASE)


def _host_words(url: str) -> str:
    m = _HOST.match(url)
    host = m[1] if m else url
    return "ドット".join(p for p in host.split(".") if p)


def url_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every URL `read_urls` would read in `text`."""
    if "://" not in text and "www." not in text.lower():
        return []
    return [m.span() for m in _URL.finditer(text)]


def read_urls(text: str, mode: str = "word") -> str:
    """URLs in `text` said as "URL" (`mode="word"`), by host name ("domain"), dropped ("drop")."""
    if mode == "keep" or ("://" not in text and "www." not in text.lower()):
        return text

    def one(m: re.Match[str]) -> str:
        url = m[0]
        tail = ""
        while url and url[-1] in _URL_TRAILING:
            url, tail = url[:-1], url[-1] + tail
        if mode == "drop":
            said = ""
        elif mode == "domain":
            said = _host_words(url)
        else:
            said = URL_WORD
        return said + tail

    out = _URL.sub(one, text)
    return re.sub(r"[ \t]{2,}", " ", out).strip()


def apply_readings(text: str, options: Any = None) -> str:
    """`text` with tags, URLs, laughter, numbers and Latin words rewritten as `options` say
    (a `SynthesisOptions`; None: the defaults)."""
    tags = getattr(options, "tags", "strip")
    urls = getattr(options, "urls", "word")
    laughter = getattr(options, "laughter", "read")
    if tags == "strip":
        text = strip_tags(text)
    text = read_urls(text, urls)
    if laughter != "keep":
        text = read_laughter(text, laughter)
    if getattr(options, "read_numbers", True):
        text = read_numbers(text)
    if getattr(options, "read_english", True):
        text = read_english(text)
    return text


def nothing_to_say(text: str, options: Any = None) -> bool:
    """Does `text` say nothing once `options` take out its tags, pause markup and URLs? (A line
    of only `[happy]`, or of `[pause:1]` with `pause_markup=False`: the Speaker skips it as it
    skips an empty line.) A line of valid pauses with `pause_markup` on is silence, not nothing."""
    if getattr(options, "pause_markup", True):
        try:
            parts = split_pauses(text)
        except InputError:  # bad markup: the synthesizer's error to report
            return False
        if any(isinstance(p, Pause) for p in parts):
            return False
        text = "".join(p for p in parts if isinstance(p, str))  # less unclosed markup
    else:
        text = strip_markup(text)
    if getattr(options, "tags", "strip") == "strip":
        text = strip_tags(text)
    return not read_urls(text, getattr(options, "urls", "word")).strip()
