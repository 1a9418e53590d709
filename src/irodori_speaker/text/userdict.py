"""The user dictionary: surface form -> reading, applied to the text before tokenisation.

    d = UserDictionary()      # $IRODORI_DICT, else ~/.local/share/irodori-speaker/user_dict.sqlite3
    d.add("VTuber", "ブイチューバー", accent_type=4)
    d.apply("VTuberの配信")   # -> "ブイチューバーの配信"

One dictionary for the whole product: the Synthesizer applies it to every line (after the
reference normalisation, so Speaker, CLI, prebuild and server all get it, and the phrase
cache keys the text after it); the VOICEVOX routes of the server edit it; `irodori-speaker
dict` edits it from the shell. It is a sqlite file (a real file, safe to edit from several
processes: every change is one transaction, readers see the last committed state).

Matching: surfaces are normalised the way the text is (NFKC, ...), so "ＶＴｕｂｅｒ" and
"VTuber" are one word. Where matches overlap, the higher priority wins; among equal
priorities the longer surface, then the earlier one. Priority is 0-10 (VOICEVOX's scale,
default 5). The word class and accent type do not change the text; they go into the
pyopenjtalk dictionary built from the same words (`openjtalk_dictionary`), so the accent
phrases of the VOICEVOX AudioQuery carry the accent the user gave.

Import/export speak VOICEVOX's user-dictionary JSON ({uuid: UserDictWord}), the format
of its `GET /user_dict` and of the VOICEVOX editor's export.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import sqlite3
import tempfile
import threading
import time
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from irodori_speaker.errors import InputError, IrodoriError
from irodori_speaker.text.normalize import normalize_text
from irodori_speaker.text.prosody import kana_to_moras, to_katakana

from . import prosody
from .length import _load_pyopenjtalk

__all__ = [
    "WORD_TYPES",
    "DictWord",
    "UserDictionary",
    "default_user_dict_path",
    "resolve_user_dict",
]

MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = 0, 10, 5
MAX_SURFACE_CHARS = 100


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


class UserDictError(IrodoriError):
    """The user dictionary file cannot be opened or written."""


def default_user_dict_path() -> Path:
    """`$IRODORI_DICT`, else `$XDG_DATA_HOME/irodori-speaker/user_dict.sqlite3` (~/.local/share)."""
    env = os.environ.get("IRODORI_DICT")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return Path(base) / "irodori-speaker" / "user_dict.sqlite3"


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
    return surface


def normalize_reading(pronunciation: str) -> str:
    """Katakana (hiragana accepted and converted); raises InputError on anything else."""
    reading = to_katakana(normalize_text(_check_text("pronunciation", pronunciation)).strip())
    if not reading:
        raise InputError("pronunciation is empty", hint="give the reading in katakana, e.g. ブイチューバー")
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
        if word_type not in WORD_TYPES:
            raise InputError(f"word_type {word_type!r} is not one of {', '.join(WORD_TYPES)}")
        priority = DEFAULT_PRIORITY if priority is None else priority
        if not isinstance(priority, int) or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise InputError(f"priority must be an integer {MIN_PRIORITY}-{MAX_PRIORITY}, got {priority!r}")
        word = cls(
            uuid or str(uuidlib.uuid4()),
            normalize_surface(surface),
            normalize_reading(pronunciation),
            accent_type,
            word_type,
            priority,
        )
        if not isinstance(accent_type, int) or not 0 <= accent_type <= word.mora_count:
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


_SCHEMA = """
CREATE TABLE IF NOT EXISTS words (
    uuid TEXT PRIMARY KEY,
    surface TEXT NOT NULL,
    pronunciation TEXT NOT NULL,
    accent_type INTEGER NOT NULL,
    word_type TEXT NOT NULL,
    priority INTEGER NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class UserDictionary:
    """The user dictionary in a sqlite file. Thread-safe; several processes may share the file.

    A dictionary whose file does not exist reads as empty and creates the file on the first
    change. `path=None` opens the default file.
    """

    def __init__(self, path: str | os.PathLike | None = None) -> None:
        self.path = Path(path) if path is not None else default_user_dict_path()
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._words: list[DictWord] = []
        self._index: dict[str, list[DictWord]] = {}
        self._openjtalk: tuple[tuple[int, int] | None, str | None] = (None, None)
        self._openjtalk_dir: Path | None = None

    def __repr__(self) -> str:
        return f"UserDictionary({str(self.path)!r})"

    # ---- storage ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        if write:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        except sqlite3.Error as e:
            raise UserDictError(f"cannot open the user dictionary {self.path}: {e}") from e
        try:
            if write:
                conn.executescript(_SCHEMA)
                conn.execute("BEGIN IMMEDIATE")
            yield conn
            if write:
                conn.execute(
                    "INSERT INTO meta VALUES ('generation', '1') ON CONFLICT(name) "
                    "DO UPDATE SET value = CAST(value AS INTEGER) + 1"
                )
                conn.execute("COMMIT")
        except sqlite3.Error as e:
            if write and conn.in_transaction:
                conn.execute("ROLLBACK")
            raise UserDictError(f"user dictionary {self.path}: {e}") from e
        except BaseException:
            if write and conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _load(self) -> list[DictWord]:
        """The words, re-read when the file changed (one stat per call otherwise)."""
        stamp = self._file_stamp()
        with self._lock:
            if stamp == self._stamp and (stamp is not None or not self._words):
                return self._words
            words: list[DictWord] = []
            if stamp is not None:
                with self._connect() as conn:
                    try:
                        rows = conn.execute(
                            "SELECT uuid, surface, pronunciation, accent_type, word_type, priority "
                            "FROM words ORDER BY updated"
                        ).fetchall()
                    except sqlite3.OperationalError:  # an empty file (created, no table yet)
                        rows = []
                words = [DictWord(*row) for row in rows]
            index: dict[str, list[DictWord]] = {}
            for w in words:
                index.setdefault(w.surface[0], []).append(w)
            self._words, self._index, self._stamp = words, index, stamp
            return words

    # ---- editing ----------------------------------------------------------------------------
    def words(self) -> list[DictWord]:
        """Every word, oldest first."""
        return list(self._load())

    def get(self, uuid: str) -> DictWord:
        for w in self._load():
            if w.uuid == uuid:
                return w
        raise InputError(f"no word with UUID {uuid} in the user dictionary")

    def __len__(self) -> int:
        return len(self._load())

    def _put(self, conn: sqlite3.Connection, word: DictWord) -> None:
        self._stamp = None  # our own change: re-read even if the file's mtime did not tick
        conn.execute(
            "INSERT OR REPLACE INTO words VALUES (?, ?, ?, ?, ?, ?, ?)",
            (*dataclasses.astuple(word), time.time()),
        )

    def add(
        self,
        surface: str,
        pronunciation: str,
        accent_type: int = 0,
        word_type: str | None = None,
        priority: int | None = None,
    ) -> DictWord:
        """Add a word; returns it (with its new UUID)."""
        word = DictWord.make(surface, pronunciation, accent_type, word_type, priority)
        with self._connect(write=True) as conn:
            self._put(conn, word)
        return word

    def update(
        self,
        uuid: str,
        surface: str,
        pronunciation: str,
        accent_type: int = 0,
        word_type: str | None = None,
        priority: int | None = None,
    ) -> DictWord:
        """Rewrite an existing word (InputError when there is none with this UUID)."""
        uuid = _check_uuid(uuid)
        word = DictWord.make(surface, pronunciation, accent_type, word_type, priority, uuid=uuid)
        with self._connect(write=True) as conn:
            if conn.execute("SELECT 1 FROM words WHERE uuid = ?", (uuid,)).fetchone() is None:
                raise InputError(f"no word with UUID {uuid} in the user dictionary")
            self._put(conn, word)
        return word

    def remove(self, uuid: str) -> None:
        """Delete a word (InputError when there is none with this UUID)."""
        with self._connect(write=True) as conn:
            self._stamp = None
            if conn.execute("DELETE FROM words WHERE uuid = ?", (str(uuid),)).rowcount == 0:
                raise InputError(f"no word with UUID {uuid} in the user dictionary")

    def import_voicevox(self, data: dict[str, Any] | str | os.PathLike, *, override: bool = True) -> int:
        """Import VOICEVOX user-dictionary JSON (a dict, or a path to a .json file).

        Every word is validated before anything is written. `override`: a word whose UUID is
        already here replaces it; else it is kept and the imported one skipped. Returns how
        many words were written.
        """
        if not isinstance(data, dict):
            try:
                data = json.loads(Path(data).read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise InputError(f"cannot read a VOICEVOX user dictionary from {data}: {e}") from e
            if not isinstance(data, dict):
                raise InputError("a VOICEVOX user dictionary is a JSON object {uuid: word}")
        words = [DictWord.from_voicevox(k, v) for k, v in data.items()]
        written = 0
        with self._connect(write=True) as conn:
            for w in words:
                exists = conn.execute("SELECT 1 FROM words WHERE uuid = ?", (w.uuid,)).fetchone()
                if exists and not override:
                    continue
                self._put(conn, w)
                written += 1
        return written

    def export_voicevox(self) -> dict[str, dict[str, Any]]:
        """The dictionary as VOICEVOX user-dictionary JSON ({uuid: UserDictWord})."""
        return {w.uuid: w.to_voicevox() for w in self._load()}

    def clear(self) -> int:
        with self._connect(write=True) as conn:
            self._stamp = None
            return int(conn.execute("DELETE FROM words").rowcount)

    # ---- use --------------------------------------------------------------------------------
    def apply(self, text: str) -> str:
        """`text` (already normalised) with every matched surface replaced by its reading."""
        words = self._load()
        if not words or not text:
            return text
        index = self._index
        matches: list[tuple[int, int, DictWord]] = []  # (start, end, word)
        for i, ch in enumerate(text):
            for w in index.get(ch, ()):
                if text.startswith(w.surface, i):
                    matches.append((i, i + len(w.surface), w))
        if not matches:
            return text
        # priority first, then the longer surface, then the earlier start, then the newest word
        order = sorted(
            range(len(matches)),
            key=lambda k: (-matches[k][2].priority, -(matches[k][1] - matches[k][0]), matches[k][0], -k),
        )
        taken = [False] * len(text)
        chosen: list[tuple[int, int, DictWord]] = []
        for k in order:
            start, end, w = matches[k]
            if not any(taken[start:end]):
                taken[start:end] = [True] * (end - start)
                chosen.append((start, end, w))
        chosen.sort(key=lambda m: m[0])
        out, pos = [], 0
        for start, end, w in chosen:
            out.append(text[pos:start])
            out.append(w.pronunciation)
            pos = end
        out.append(text[pos:])
        return "".join(out)

    def fingerprint(self) -> str:
        """Changes whenever a word that could change a reading does (for cache keys and logs)."""

        h = hashlib.sha256()
        for w in sorted(self._load(), key=lambda w: w.uuid):
            h.update(f"{w.surface}\0{w.pronunciation}\0{w.priority}\0{w.accent_type}\n".encode())
        return h.hexdigest()[:16]

    def openjtalk_dictionary(self) -> str | None:
        """Install the words into pyopenjtalk's global dictionary (their readings as surfaces,
        with the accent type and priority), rebuilt when the file changed; None when empty.

        The text pyopenjtalk sees comes after `apply`, so it meets the readings, and the
        accent phrases get the user's accent type.
        """

        words = self._load()
        stamp = self._stamp
        with self._lock:
            if self._openjtalk[0] == stamp and stamp is not None:
                return self._openjtalk[1]
        pyopenjtalk = _load_pyopenjtalk()
        if pyopenjtalk is None:
            return None

        if not words:
            with prosody._lock:
                pyopenjtalk.unset_user_dict()
            result = None
        else:
            directory = Path(tempfile.mkdtemp(prefix="irodori-openjtalk-"))
            csv_path, dic_path = directory / "user.csv", directory / "user.dic"
            rows = []
            for w in words:
                wc = WORD_TYPES[w.word_type]
                kana = w.pronunciation
                rows.append(
                    f"{_zenkaku(kana)},{wc.context_id},{wc.context_id},{priority_cost(w.priority)},"
                    f"{wc.part_of_speech},{wc.detail_1},{wc.detail_2},{wc.detail_3},*,*,{kana},{kana},"
                    f"{kana},{w.accent_type}/{w.mora_count},*"
                )
            csv_path.write_text("\n".join(rows) + "\n", encoding="utf-8")
            with prosody._lock, _quiet_fd(1):
                pyopenjtalk.mecab_dict_index(str(csv_path), str(dic_path))
                pyopenjtalk.update_global_jtalk_with_user_dict(str(dic_path))
            result = str(dic_path)
        prosody._accent_phrases_cached.cache_clear()
        with self._lock:
            old, self._openjtalk_dir = self._openjtalk_dir, None if result is None else Path(result).parent
            self._openjtalk = (stamp, result)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return result


@contextlib.contextmanager
def _quiet_fd(fd: int) -> Iterator[None]:
    """Silence a C library's prints on `fd` (mecab-dict-index reports progress on stdout)."""
    try:
        saved = os.dup(fd)
    except OSError:
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def resolve_user_dict(value: UserDictionary | str | os.PathLike | bool | None) -> UserDictionary | None:
    """None or True: the default dictionary; False: none; a path or a UserDictionary: that one."""
    if value is False:
        return None
    if value is None or value is True:
        return UserDictionary()
    if isinstance(value, UserDictionary):
        return value
    if isinstance(value, (str, os.PathLike)):
        return UserDictionary(value)
    raise InputError(
        f"user_dict must be a UserDictionary, a path, True/False or None, got {type(value).__name__}"
    )
