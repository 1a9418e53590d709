"""The user dictionary's words: one `DictWord`, its validation, and VOICEVOX's UserDictWord.

Every field is checked where a word comes in (`DictWord.make`: added, imported, or read back
from the file, `word_from_row`), so a row another tool wrote by hand cannot break a line: it is
reported and skipped (text/userdict.py).
"""

from __future__ import annotations

import unicodedata
import uuid as uuidlib
from dataclasses import dataclass
from typing import Any

from irodori_speaker.errors import InputError
from irodori_speaker.text.normalize import normalize_text
from irodori_speaker.text.prosody import kana_to_moras, to_katakana

__all__ = ["MAX_READING_CHARS", "MAX_SURFACE_CHARS", "WORD_TYPES", "DictWord", "WordClass", "word_from_row"]

MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = 0, 10, 5
MAX_SURFACE_CHARS = 100  # also bounds the matcher's walk from each character (dict_match.py)
MAX_READING_CHARS = 200
# what no one can see: a surface of only these is refused (it would match invisibly)
_INVISIBLE = frozenset(("Cc", "Cf", "Cn", "Co", "Cs", "Mn", "Me", "Zl", "Zp", "Zs"))


@dataclass(frozen=True)
class WordClass:
    """A word class as naist-jdic (OpenJTalk's dictionary) spells it."""

    part_of_speech: str
    detail_1: str
    detail_2: str
    detail_3: str
    context_id: int  # naist-jdic's left/right context id of this class


WORD_TYPES: dict[str, WordClass] = {
    "PROPER_NOUN": WordClass("名詞", "固有名詞", "一般", "*", 1348),
    "COMMON_NOUN": WordClass("名詞", "一般", "*", "*", 1345),
    "VERB": WordClass("動詞", "自立", "*", "*", 642),
    "ADJECTIVE": WordClass("形容詞", "自立", "*", "*", 20),
    "SUFFIX": WordClass("名詞", "接尾", "一般", "*", 1358),
}


def _check_text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InputError(f"{name} must be a string, got {type(value).__name__}")
    if any(c in value for c in "\n\r\x00"):
        raise InputError(f"{name} {value[:30]!r} contains a line break or NUL")
    return value


def normalize_surface(surface: str) -> str:
    surface = normalize_text(_check_text("surface", surface)).strip()
    if not surface:
        raise InputError("surface is empty (after normalisation)", hint="give the word as it is written")
    if len(surface) > MAX_SURFACE_CHARS:
        raise InputError(f"surface is longer than {MAX_SURFACE_CHARS} characters")
    if all(unicodedata.category(c) in _INVISIBLE for c in surface):
        raise InputError(
            f"surface {surface!r} has no visible character", hint="give the word as it is written"
        )
    return surface


def normalize_reading(pronunciation: str) -> str:
    """Katakana (hiragana accepted and converted); raises InputError on anything else."""
    reading = to_katakana(normalize_text(_check_text("pronunciation", pronunciation)).strip())
    if not reading:
        raise InputError("pronunciation is empty", hint="give the reading in katakana, e.g. ブイチューバー")
    if len(reading) > MAX_READING_CHARS:
        raise InputError(f"pronunciation is longer than {MAX_READING_CHARS} characters")
    kana_to_moras(reading)  # validates
    return reading


@dataclass(frozen=True)
class DictWord:
    """One word. `surface` and `pronunciation` are stored normalised (see the module doc)."""

    uuid: str
    surface: str
    pronunciation: str
    accent_type: int = 0
    word_type: str = "PROPER_NOUN"
    priority: int = DEFAULT_PRIORITY

    @property
    def mora_count(self) -> int:
        return len(kana_to_moras(self.pronunciation))

    @classmethod
    def make(
        cls,
        surface: str,
        pronunciation: str,
        accent_type: int = 0,
        word_type: str | None = None,
        priority: int | None = None,
        uuid: str | None = None,
    ) -> DictWord:
        """A validated word (InputError with a hint on bad fields)."""
        word_type = word_type or "PROPER_NOUN"
        if not isinstance(word_type, str) or word_type not in WORD_TYPES:
            raise InputError(f"word_type {word_type!r} is not one of {', '.join(WORD_TYPES)}")
        priority = DEFAULT_PRIORITY if priority is None else priority
        if not _is_int(priority) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise InputError(f"priority must be an integer {MIN_PRIORITY}-{MAX_PRIORITY}, got {priority!r}")
        word = cls(
            uuid or str(uuidlib.uuid4()),
            normalize_surface(surface),
            normalize_reading(pronunciation),
            accent_type,
            word_type,
            priority,
        )
        if not _is_int(accent_type) or not 0 <= accent_type <= word.mora_count:
            raise InputError(
                f"accent_type must be 0-{word.mora_count} for {word.pronunciation} "
                f"({word.mora_count} moras), got {accent_type!r}",
                hint="0 is flat; n means the pitch falls after the n-th mora",
            )
        return word

    # ---- VOICEVOX's UserDictWord -------------------------------------------------------------
    def to_voicevox(self) -> dict[str, Any]:
        wc = WORD_TYPES[self.word_type]
        return {
            "surface": _zenkaku(self.surface),
            "priority": self.priority,
            "context_id": wc.context_id,
            "part_of_speech": wc.part_of_speech,
            "part_of_speech_detail_1": wc.detail_1,
            "part_of_speech_detail_2": wc.detail_2,
            "part_of_speech_detail_3": wc.detail_3,
            "inflectional_type": "*",
            "inflectional_form": "*",
            "stem": "*",
            "yomi": self.pronunciation,
            "pronunciation": self.pronunciation,
            "accent_type": self.accent_type,
            "mora_count": self.mora_count,
            "accent_associative_rule": "*",
        }

    @classmethod
    def from_voicevox(cls, uuid: str, data: Any) -> DictWord:
        if not isinstance(data, dict):
            raise InputError(f"word {uuid}: expected an object, got {type(data).__name__}")
        missing = [k for k in ("surface", "pronunciation", "accent_type") if k not in data]
        if missing:
            raise InputError(f"word {uuid}: missing {', '.join(missing)}")
        return cls.make(
            data["surface"],
            data["pronunciation"],
            data["accent_type"],
            _word_type_of(data),
            data.get("priority", DEFAULT_PRIORITY),
            uuid=_check_uuid(uuid),
        )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is not priority 1


def word_from_row(row: tuple) -> DictWord | str:
    """A stored row (uuid, surface, pronunciation, accent_type, word_type, priority) as a word,
    checked as `DictWord.make` checks a new one; else why it is not one."""
    uuid, surface, pronunciation, accent_type, word_type, priority = row
    try:
        if not isinstance(uuid, str) or not uuid:
            raise InputError(f"uuid {uuid!r} is not a string")
        return DictWord.make(surface, pronunciation, accent_type, word_type, priority, uuid=uuid)
    except InputError as e:
        return str(e)


def _check_uuid(value: str) -> str:
    try:
        return str(uuidlib.UUID(str(value)))
    except ValueError as e:
        raise InputError(f"{value!r} is not a word UUID") from e


def _word_type_of(data: dict) -> str:
    cid = data.get("context_id")
    for name, wc in WORD_TYPES.items():
        if cid == wc.context_id:
            return name
    parts = (data.get("part_of_speech"), data.get("part_of_speech_detail_1"))
    for name, wc in WORD_TYPES.items():
        if parts == (wc.part_of_speech, wc.detail_1):
            return name
    return "PROPER_NOUN"


def _zenkaku(text: str) -> str:
    """ASCII -> full width, as OpenJTalk sees text (and VOICEVOX stores surfaces)."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else ("\u3000" if c == " " else c) for c in text)


def priority_cost(priority: int) -> int:
    """MeCab word cost for a priority: lower cost wins. 5 -> 2500 beats most system entries."""
    return 6000 - 700 * priority
