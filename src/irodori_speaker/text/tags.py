"""Emotion and stage tags in LLM text: found, stripped, or mapped to a voice / caption / options.

LLM front ends write stage directions into the text they send to TTS: AITuberKit's emotion
tags ``[neutral] [happy] [sad] [angry] [relaxed] [surprised]`` at a sentence start, and
chat-style directions ``（笑）`` or ``*laughs*``. Read to the model they become words
("ハッピー", "ラフス"). Three forms are recognised (`find_tags`):

- a bracket tag ``[name]``: ASCII letters, digits, ``_`` and ``-`` (no ``:``, so the pause
  markup ``[pause:0.5]`` of `text/pauses` is never touched, and no spaces);
- a parenthesised stage word ``(笑)`` / ``（笑）`` from `STAGE_WORDS_JA` (笑, 泣, 汗, 爆笑 ...);
- an asterisk action ``*laughs*`` whose words are in `STAGE_WORDS_EN` (laughs, sighs,
  giggles, clears throat ...); other ``*text*`` is markdown emphasis, not a tag.

`strip_tags` removes them all (the synthesizer does this for every line unless the
`tags` option is ``"keep"``). `TagMap` maps tag names to what a streamer wants instead: a
voice, a voice caption (VoiceDesign models), option overrides, or words to say in place
(``{"笑": {"text": "ふふっ"}}``); the Speaker and the CLI apply it per line
(`synthesis.voices.tagged_line`: a voice and its caption are the synthesis side's), the first
mapped tag of the line choosing (AITuberKit writes one emotion per sentence, and `say_stream`
speaks sentence by sentence).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from irodori_speaker.errors import InputError

from ..options import SynthesisOptions

__all__ = [
    "EMOTIONS",
    "STAGE_WORDS_EN",
    "STAGE_WORDS_JA",
    "Tag",
    "TagAction",
    "TagMap",
    "find_tags",
    "strip_tags",
]

EMOTIONS: Final = ("neutral", "happy", "sad", "angry", "relaxed", "surprised")
STAGE_WORDS_JA: Final = frozenset((
    "笑", "爆笑", "苦笑", "微笑", "失笑", "泣", "泣き", "涙", "汗", "汗汗", "怒", "照", "照れ",
    "震", "震え", "嘘", "真顔", "白目", "ドヤ顔", "小声", "咳払い", "ため息", "溜息", "拍手", "震え声",
))  # fmt: skip
STAGE_WORDS_EN: Final = frozenset((
    "laugh", "laughs", "laughing", "giggle", "giggles", "giggling", "chuckle", "chuckles",
    "chuckling", "snicker", "snickers", "sigh", "sighs", "sighing", "smile", "smiles",
    "smiling", "grin", "grins", "wink", "winks", "nod", "nods", "cry", "cries", "crying",
    "sob", "sobs", "sniff", "sniffs", "gasp", "gasps", "cough", "coughs", "yawn", "yawns",
    "blush", "blushes", "pout", "pouts", "shrug", "shrugs", "clap", "claps", "hums", "hum",
    "whisper", "whispers", "whispering", "gulp", "gulps", "clears", "throat", "clearing",
))  # fmt: skip

_BRACKET: Final = r"\[(?P<b>[A-Za-z][A-Za-z0-9_\-]{0,31})\](?!\()"
_PAREN: Final = r"[(（](?P<p>[^()（）\s]{1,6})[)）]"
_STAR: Final = r"\*(?P<s>[A-Za-z][A-Za-z ]{0,30}[A-Za-z]|[A-Za-z])\*"
_TAG_RE: Final = re.compile(f"{_BRACKET}|{_PAREN}|{_STAR}")


@dataclass(frozen=True)
class Tag:
    """One tag found in a text: its name (lower-case for Latin ones) and where it is."""

    name: str
    start: int
    end: int
    form: str  # "bracket", "paren" or "star"


def find_tags(text: str) -> list[Tag]:
    """Every emotion / stage tag in `text`, in order."""
    if not any(c in text for c in "[(（*"):
        return []
    out = []
    for m in _TAG_RE.finditer(text):
        if m["b"] is not None:
            out.append(Tag(m["b"].lower(), m.start(), m.end(), "bracket"))
        elif m["p"] is not None:
            if m["p"] in STAGE_WORDS_JA:
                out.append(Tag(m["p"], m.start(), m.end(), "paren"))
        elif all(w in STAGE_WORDS_EN for w in m["s"].lower().split()):
            out.append(Tag(m["s"].lower(), m.start(), m.end(), "star"))
    return out


def _carriable(name: Any) -> bool:
    """Whether a line can carry the tag `name` in one of the forms `find_tags` reads."""
    if not isinstance(name, str) or not name:
        return False
    return any(
        [tag.name for tag in find_tags(form.format(name))] == [name.lower() if form != "({})" else name]
        for form in ("[{}]", "({})", "*{}*")
    )


def _replace(text: str, tags: list[Tag], words: Mapping[str, str]) -> str:
    parts, pos = [], 0
    for t in tags:
        parts.append(text[pos : t.start])
        parts.append(words.get(t.name, ""))
        pos = t.end
    parts.append(text[pos:])
    out = "".join(parts)
    return re.sub(r"[ \t]{2,}", " ", out).strip() if tags else out


def strip_tags(text: str) -> str:
    """`text` without its emotion and stage tags (spaces left around them collapsed)."""
    return _replace(text, find_tags(text), {})


@dataclass(frozen=True)
class TagAction:
    """What a tag does to its line: a voice, a caption, option overrides, words said instead."""

    voice: Any = None  # a Voice or a path; None: the line's own
    caption: str | None = None  # a VoiceDesign caption for the line's voice
    options: Mapping[str, Any] = field(default_factory=dict)  # SynthesisOptions fields by name
    text: str = ""  # said in place of the tag

    @classmethod
    def coerce(cls, name: str, value: Any) -> TagAction:
        if isinstance(value, TagAction):
            return value
        if not isinstance(value, Mapping):
            raise InputError(
                f"tags[{name!r}] must be a mapping, got {type(value).__name__}",
                hint="e.g. tags={'happy': {'voice': 'happy.wav', 'options': {'seed': 3}}}",
            )
        known = {"voice", "caption", "options", "text"}
        unknown = sorted(set(value) - known)
        if unknown:
            raise InputError(
                f"tags[{name!r}]: unknown key {unknown[0]!r}", hint=f"known: {', '.join(sorted(known))}"
            )

        options = dict(value.get("options") or {})
        SynthesisOptions().replace(**options)  # each value checked now, by its option
        voice = value.get("voice")
        if isinstance(voice, (str, os.PathLike)) and not os.path.isfile(voice):
            raise InputError(
                f"tags[{name!r}]['voice']: no such file {os.fspath(voice)!r}",
                hint="a recording (.wav, .flac, ...) or a saved voice, checked when the Speaker is built",
            )
        if voice is not None and isinstance(voice, (bytes, int, float, bool)):
            raise InputError(f"tags[{name!r}]['voice'] must be a Voice or a path, got {type(voice).__name__}")
        caption, text = value.get("caption"), value.get("text", "")
        if caption is not None and not isinstance(caption, str):
            raise InputError(f"tags[{name!r}]['caption'] must be a str")
        if not isinstance(text, str):
            raise InputError(f"tags[{name!r}]['text'] must be a str")
        return cls(voice, caption, options, text)


@dataclass(frozen=True)
class LineTags:
    """A line after `TagMap.apply`: its text and what its first mapped tag asks for."""

    text: str
    tag: str | None = None
    action: TagAction | None = None


class TagMap:
    """Tag name -> `TagAction`. Names are matched lower-case (``"Happy"`` is ``"happy"``)."""

    def __init__(self, mapping: Mapping[str, Any] | None = None) -> None:
        if mapping is not None and not isinstance(mapping, Mapping):
            raise InputError(f"tags must be a mapping of tag names, got {type(mapping).__name__}")
        for name in mapping or {}:
            if not _carriable(name):
                raise InputError(
                    f"tags: {name!r} is not a tag a line can carry",
                    hint="a Latin name such as 'happy' ([happy] in a line: up to 32 letters, digits, - or _),"
                    " a stage word such as '笑' ((笑) in a line) or 'laughs' (*laughs*)",
                )
        self.actions = {str(k).lower(): TagAction.coerce(str(k), v) for k, v in (mapping or {}).items()}

    @classmethod
    def coerce(cls, value: Any) -> TagMap | None:
        if value is None or isinstance(value, TagMap):
            return value
        return cls(value)

    def __bool__(self) -> bool:
        return bool(self.actions)

    def apply(self, text: str) -> LineTags:
        """`text` with each mapped tag replaced by its words (unmapped ones are left for the
        synthesizer to strip), and the action of the first mapped tag."""
        tags = [t for t in find_tags(text) if t.name in self.actions]
        if not tags:
            return LineTags(text)
        words = {name: a.text for name, a in self.actions.items()}
        first = tags[0].name
        return LineTags(_replace(text, tags, words), first, self.actions[first])
