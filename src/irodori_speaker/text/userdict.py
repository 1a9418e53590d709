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
priorities the longer surface, then the earlier one (`dict_match.SurfaceMatcher`: a trie, linear
in the text). Tags (`[happy]`, `（笑）`), URLs and pause markup are recognised on the text first
and never rewritten: `happy` -> ハッピー leaves `[happy]` a tag. Priority is 0-10 (VOICEVOX's scale,
default 5). The word class and accent type do not change the text; they go into the
pyopenjtalk dictionary built from the same words (`openjtalk_dictionary`), so the accent
phrases of the VOICEVOX AudioQuery carry the accent the user gave.

Import/export speak VOICEVOX's user-dictionary JSON ({uuid: UserDictWord}), the format
of its `GET /user_dict` and of the VOICEVOX editor's export.

Every row is checked when read (`dict_words.word_from_row`): one that another tool or a hand
edit broke (an empty surface, a text priority, an unknown word type) is skipped with one
warning naming it, listed by `bad_rows()` (`dict list`) and removable (`dict remove`). Bounds:
`MAX_WORDS` words, `MAX_SURFACE_CHARS` / `MAX_READING_CHARS` per word, `MAX_IMPORT_BYTES` of
JSON; an import over a bound is refused whole, naming it, before anything is stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from irodori_speaker.errors import InputError, IrodoriError
from irodori_speaker.text.dict_match import SurfaceMatcher
from irodori_speaker.text.dict_words import (
    MAX_READING_CHARS,
    MAX_SURFACE_CHARS,
    WORD_TYPES,
    DictWord,
    _check_uuid,
    _zenkaku,
    priority_cost,
    word_from_row,
)
from irodori_speaker.text.pauses import markup_spans
from irodori_speaker.text.readings import url_spans
from irodori_speaker.text.tags import find_tags

from . import prosody
from .length import _load_pyopenjtalk

__all__ = [
    "MAX_IMPORT_BYTES",
    "MAX_READING_CHARS",
    "MAX_SURFACE_CHARS",
    "MAX_WORDS",
    "WORD_TYPES",
    "BadRow",
    "DictWord",
    "UserDictionary",
    "default_user_dict_path",
    "protected_spans",
    "resolve_user_dict",
]

log = logging.getLogger("irodori_speaker.text")

MAX_WORDS = 100_000
MAX_IMPORT_BYTES = 64 * 1024 * 1024


class UserDictError(IrodoriError):
    """The user dictionary file cannot be opened or written."""


def default_user_dict_path() -> Path:
    """`$IRODORI_DICT`, else `$XDG_DATA_HOME/irodori-speaker/user_dict.sqlite3` (~/.local/share)."""
    env = os.environ.get("IRODORI_DICT")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return Path(base) / "irodori-speaker" / "user_dict.sqlite3"


@dataclass(frozen=True)
class BadRow:
    """A stored row that is not a valid word: its rowid, uuid and surface as stored, and why."""

    rowid: int
    uuid: Any
    surface: Any
    why: str


def protected_spans(text: str) -> list[tuple[int, int]]:
    """Where the dictionary never rewrites: tags, URLs and pause markup (valid, broken or
    unclosed), as the readings pass and the pause splitter will recognise them."""
    spans = [(t.start, t.end) for t in find_tags(text)]
    return spans + url_spans(text) + markup_spans(text)


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
        self._bad: list[BadRow] = []
        self._warned: set[tuple[Any, str]] = set()
        self._matcher: SurfaceMatcher[str] = SurfaceMatcher(())
        self._openjtalk: tuple[tuple[int, int] | None, str | None] = (None, None)
        self._openjtalk_dir: Path | None = None

    def __repr__(self) -> str:
        return f"UserDictionary({str(self.path)!r})"

    # ---- storage ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _connect(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        if write:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:  # a regular file where a folder should be, a read-only place
                raise UserDictError(
                    f"cannot create the user dictionary {self.path}: {e.strerror or e}",
                    hint="give --file (or $IRODORI_DICT) a path in a folder you can write to",
                ) from e
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
        except (FileNotFoundError, NotADirectoryError):  # nothing there yet: an empty dictionary
            return None
        except OSError as e:
            raise UserDictError(f"cannot read the user dictionary {self.path}: {e.strerror or e}") from e
        return (st.st_mtime_ns, st.st_size)

    def _load(self) -> list[DictWord]:
        """The words, re-read when the file changed (one stat per call otherwise)."""
        stamp = self._file_stamp()
        with self._lock:
            if stamp == self._stamp and (stamp is not None or not self._words):
                return self._words
            rows: list[tuple] = []
            if stamp is not None:
                with self._connect() as conn:
                    try:
                        rows = conn.execute(
                            "SELECT rowid, uuid, surface, pronunciation, accent_type, word_type, priority "
                            "FROM words ORDER BY updated, rowid"
                        ).fetchall()
                    except sqlite3.OperationalError:  # an empty file (created, no table yet)
                        rows = []
            words: list[DictWord] = []
            bad: list[BadRow] = []
            for row in rows:
                word = word_from_row(row[1:])
                if isinstance(word, DictWord):
                    words.append(word)
                    continue
                bad.append(BadRow(row[0], row[1], row[2], word))
                if (row[1], word) not in self._warned:  # once per row and reason, not per line
                    self._warned.add((row[1], word))
                    log.warning(
                        "user dictionary %s: skipping the bad row %r (%s); `irodori-speaker dict "
                        "remove` removes it",
                        self.path,
                        row[1],
                        word,
                    )
            matcher = SurfaceMatcher((w.surface, w.priority, w.pronunciation) for w in words)
            self._words, self._bad, self._matcher, self._stamp = words, bad, matcher, stamp
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

    def bad_rows(self) -> list[BadRow]:
        """The stored rows that are not valid words (skipped by `apply`), oldest first."""
        self._load()
        return list(self._bad)

    def remove_row(self, rowid: int) -> None:
        """Delete a row by its rowid (a bad row whose uuid is not usable)."""
        with self._connect(write=True) as conn:
            self._stamp = None
            if conn.execute("DELETE FROM words WHERE rowid = ?", (int(rowid),)).rowcount == 0:
                raise InputError(f"no row {rowid} in the user dictionary")

    def _check_room(self, conn: sqlite3.Connection, new: int) -> None:
        """Refuse, before anything is stored, a change that would pass MAX_WORDS."""
        try:
            have = conn.execute("SELECT COUNT(*) FROM words").fetchone()[0]
        except sqlite3.OperationalError:
            have = 0
        if have + new > MAX_WORDS:
            raise InputError(
                f"the user dictionary would hold {have + new} words, over MAX_WORDS ({MAX_WORDS})",
                hint="remove words first (`irodori-speaker dict remove`), or import fewer",
            )

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
            self._check_room(conn, 1)
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
            data = _read_json(Path(data))
        if len(data) > MAX_WORDS:
            raise InputError(f"{len(data)} words to import, over MAX_WORDS ({MAX_WORDS})")
        words = [DictWord.from_voicevox(k, v) for k, v in data.items()]
        written = 0
        with self._connect(write=True) as conn:
            known = {r[0] for r in conn.execute("SELECT uuid FROM words")}
            self._check_room(conn, sum(w.uuid not in known for w in words))
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
        """`text` (already normalised) with every matched surface replaced by its reading; tags,
        URLs and pause markup are left as they are (`protected_spans`)."""
        self._load()
        matcher = self._matcher
        if not len(matcher) or not text:
            return text
        return matcher.replace(text, protected_spans(text))

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


def _read_json(path: Path) -> dict[str, Any]:
    """A VOICEVOX user-dictionary file: UTF-8 with or without a BOM (Windows Notepad writes one),
    at most MAX_IMPORT_BYTES, an object {uuid: word}."""
    try:
        size = path.stat().st_size
        if size > MAX_IMPORT_BYTES:
            raise InputError(
                f"{path} is {size} bytes, over MAX_IMPORT_BYTES ({MAX_IMPORT_BYTES})",
                hint="split the dictionary into several files",
            )
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise InputError(f"cannot read a VOICEVOX user dictionary from {path}: {why}") from e
    except RecursionError as e:
        raise InputError(
            f"cannot read a VOICEVOX user dictionary from {path}: JSON nested too deeply",
            hint="a VOICEVOX dictionary is a flat object {uuid: word}",
        ) from e
    if not isinstance(data, dict):
        raise InputError("a VOICEVOX user dictionary is a JSON object {uuid: word}")
    return data


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
