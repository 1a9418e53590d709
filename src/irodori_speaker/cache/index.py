"""The phrase cache's sqlite index: `Index` owns the file (`DIR/index.sqlite3`, WAL mode), its
schema, its counters and meta values, and every query the cache makes.

One connection per thread; every write is one transaction (BEGIN IMMEDIATE). A destroyed
index (a disk fault, a stray write) is moved aside and rebuilt; the audio files it listed
become orphans that `verify()` removes.

`read_only=True` (a prebuilt cache shipped on a read-only file system): opened with sqlite's
`mode=ro`, plus `immutable=1` when the folder cannot be written (sqlite could not even make
its lock files there; the file must then not change while it is open, which a read-only
file system guarantees). Reads work; counting hits is skipped; every other write is a
`CacheError` saying "read-only".
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import CacheError, InputError
from .entries import EntryInfo
from .rows import ROW, is_real

log = logging.getLogger("irodori_speaker.cache")

#: Version of the index layout (tables); a newer index is refused, not rewritten.
SCHEMA_VERSION = 1
INDEX_NAME = "index.sqlite3"

#: The lifetime counters kept in the index (all processes).
COUNTERS = ("hits", "misses", "stores", "evictions", "dropped")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,
    file TEXT NOT NULL,
    format TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    sample_rate INTEGER NOT NULL,
    samples INTEGER NOT NULL,
    text TEXT NOT NULL,
    identity TEXT NOT NULL,
    record TEXT NOT NULL,
    levels BLOB NOT NULL,
    levels_hz REAL NOT NULL,
    source TEXT NOT NULL,
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    hits INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS entries_last_used ON entries(last_used);
"""

ENTRY_ORDERS = ("last_used", "hits", "bytes", "created")


class Index:
    """The index of the cache at `directory`. `timeout_s`: how long a write waits for another
    process's write. Thread-safe. Raises `CacheError` for an index it cannot read or write."""

    def __init__(self, directory: Path, timeout_s: float, *, read_only: bool = False) -> None:
        self.directory = directory
        self.path = directory / INDEX_NAME
        self.timeout_s = timeout_s
        self.read_only = read_only
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        self._open()

    # ---- connections and schema ---------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise CacheError("this PhraseCache is closed")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(
                    self._target(),
                    timeout=self.timeout_s,
                    isolation_level=None,
                    check_same_thread=False,
                    uri=self.read_only,
                )
                if not self.read_only:
                    conn.execute("PRAGMA synchronous=NORMAL")  # WAL: the index stays consistent on a crash
            except sqlite3.Error as e:
                raise CacheError(f"cannot open the cache index {self.path}: {e}") from e
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def _target(self) -> str | Path:
        if not self.read_only:
            return self.path
        uri = self.path.resolve().as_uri() + "?mode=ro"
        return uri + ("" if os.access(self.directory, os.W_OK) else "&immutable=1")

    def _refuse(self, what: str) -> CacheError:
        return CacheError(
            f"cannot {what}: the phrase cache at {self.directory} is read-only",
            hint="copy it to a writable place (or mount it read-write) to change it",
        )

    def _open_read_only(self) -> None:
        if not self.path.is_file():
            raise CacheError(
                f"cannot open the phrase cache at {self.directory}: it is read-only and has no index",
                hint="fill it where it can be written (`irodori-speaker prebuild`), then ship it",
            )
        try:
            row = self._conn().execute("SELECT value FROM meta WHERE name='schema'").fetchone()
        except sqlite3.Error as e:
            raise CacheError(f"cannot open the cache index {self.path} (read-only): {e}") from e
        if row is not None and int(row[0]) > SCHEMA_VERSION:
            raise CacheError(
                f"the phrase cache at {self.directory} was written by a newer irodori-speaker "
                f"(index schema {row[0]}, this one reads {SCHEMA_VERSION})",
                hint="upgrade, or use another --cache-dir directory",
            )

    def _open(self) -> None:
        if self.read_only:
            self._open_read_only()
            return
        try:
            self._init_schema()
        except (sqlite3.DatabaseError, CacheError) as err:
            e = err.__cause__ if isinstance(err, CacheError) and err.__cause__ is not None else err
            if "not a database" not in str(e) and "malformed" not in str(e):
                if isinstance(err, CacheError):
                    raise
                raise CacheError(f"cannot open the cache index {self.path}: {e}") from e
            # A destroyed index (disk fault, a stray write): keep it aside and start afresh; the
            # audio files it listed become orphans that verify() removes.
            self.close()
            self._closed = False
            aside = self.path.with_name(f"{INDEX_NAME}.corrupt-{int(time.time())}")
            log.warning("phrase cache index %s is corrupt (%s); moved to %s", self.path, e, aside)
            with contextlib.suppress(OSError):
                os.replace(self.path, aside)
            for suffix in ("-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.unlink(str(self.path) + suffix)
            try:
                self._init_schema()
            except sqlite3.Error as e2:
                raise CacheError(f"cannot rebuild the cache index {self.path}: {e2}") from e2

    def _init_schema(self) -> None:
        conn = self._conn()
        deadline = time.monotonic() + self.timeout_s
        while True:  # switching to WAL needs a moment without other writers
            try:
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        if str(mode).lower() != "wal":
            log.warning("phrase cache %s: sqlite WAL mode unavailable (%s)", self.directory, mode)
        with self._write(conn):
            for stmt in _SCHEMA.strip().split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            row = conn.execute("SELECT value FROM meta WHERE name='schema'").fetchone()
            if row is None:
                conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise CacheError(
                    f"the phrase cache at {self.directory} was written by a newer irodori-speaker "
                    f"(index schema {row[0]}, this one reads {SCHEMA_VERSION})",
                    hint="upgrade, or use another --cache-dir directory",
                )
            for name in COUNTERS:
                conn.execute("INSERT OR IGNORE INTO counters VALUES (?, 0)", (name,))

    @contextlib.contextmanager
    def _write(self, conn: sqlite3.Connection) -> Iterator[None]:
        """One write transaction (BEGIN IMMEDIATE: takes the write lock up front, waits timeout_s)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        try:
            return self._conn().execute(sql, args).fetchall()
        except sqlite3.Error as e:
            raise CacheError(f"cannot read the cache index: {e}") from e

    def close(self) -> None:
        """Close every connection (any thread's). Further use raises CacheError."""
        with self._lock:
            conns, self._conns = self._conns, []
            self._closed = True
        for c in conns:
            with contextlib.suppress(sqlite3.Error):
                c.close()
        self._local = threading.local()

    # ---- meta and counters --------------------------------------------------------------------
    def meta(self, name: str) -> str | None:
        row = self._conn().execute("SELECT value FROM meta WHERE name=?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, name: str, value: str) -> None:
        if self.read_only:
            raise self._refuse("store settings")
        conn = self._conn()
        try:
            with self._write(conn):
                conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (name, value))
        except sqlite3.Error as e:
            raise CacheError(f"cannot write the cache index: {e}") from e

    def count(self, name: str, key: str | None) -> None:
        """Add one to the counter `name`; with `key`, mark that entry used (LRU clock, hits).
        Bookkeeping: a write that cannot be made at once is skipped, never waited for (and
        never tried on a read-only index)."""
        if self.read_only:
            return
        conn = self._conn()
        try:
            # Bookkeeping must never hold up a hit: wait at most 250 ms for another writer.
            conn.execute("PRAGMA busy_timeout=250")
            with self._write(conn):
                conn.execute("UPDATE counters SET value=value+1 WHERE name=?", (name,))
                if key is not None:
                    conn.execute(
                        "UPDATE entries SET last_used=?, hits=hits+1 WHERE key=?", (time.time(), key)
                    )
        except sqlite3.Error as e:
            log.debug("phrase cache: %s not counted (%s)", name, e)
        finally:
            with contextlib.suppress(sqlite3.Error):
                conn.execute(f"PRAGMA busy_timeout={int(self.timeout_s * 1000)}")

    def totals(self) -> tuple[int, int, float, dict[str, int]]:
        """(entries, audio bytes, audio seconds, the lifetime counters)."""
        n, total, seconds = self._query(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0), "
            "COALESCE(SUM(CAST(samples AS REAL) / sample_rate), 0) FROM entries"
        )[0]
        counters = dict(self._query("SELECT name, value FROM counters"))
        return int(n), int(total), float(seconds), {k: int(counters.get(k, 0)) for k in COUNTERS}

    # ---- entries ------------------------------------------------------------------------------
    def row(self, key: str) -> tuple | None:
        """The entry `key`'s columns (`rows.COLUMNS`), unchecked; None if absent."""
        rows = self._query(f"SELECT {ROW} FROM entries WHERE key=?", (key,))
        return rows[0] if rows else None

    def rowids(self) -> list[int]:
        return [r[0] for r in self._query("SELECT rowid FROM entries")]

    def row_at(self, rowid: int) -> tuple | None:
        rows = self._query(f"SELECT {ROW} FROM entries WHERE rowid=?", (rowid,))
        return rows[0] if rows else None

    def files(self) -> set[Any]:
        """The audio files the rows name."""
        return {r[0] for r in self._query("SELECT file FROM entries")}

    def file_of(self, key: str) -> Any:
        """The file the entry `key` names; None if absent or unreadable (a check after a failure)."""
        try:
            row = self._conn().execute("SELECT file FROM entries WHERE key=?", (key,)).fetchone()
        except (sqlite3.Error, CacheError):
            return None
        return None if row is None else row[0]

    def entries(self, limit: int | None = None, order: str = "last_used") -> list[EntryInfo]:
        """Entries, highest `order` first. A damaged row is left out rather than shown with a
        column of the wrong type (see verify)."""
        if order not in ENTRY_ORDERS:
            raise InputError(f"order must be last_used, hits, bytes or created, got {order!r}")
        sql = (
            "SELECT key, text, CAST(samples AS REAL) / sample_rate, bytes, hits, created, last_used, source "
            f"FROM entries ORDER BY {order} DESC"
        )
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        kinds = (str, str, float, int, int, float, float, str)
        return [
            EntryInfo(*r)
            for r in self._query(sql)
            if all(
                is_real(v) if k is float else isinstance(v, k) and not isinstance(v, bool)
                for k, v in zip(kinds, r)
            )
        ]

    def insert(self, values: tuple, limit: int) -> tuple[Any, list[str]]:
        """Store a row (`values` in `rows.COLUMNS` order, then last_used), replacing the key's
        old one, and evict LRU rows until the total is under `limit`. Returns (the file the old
        row named or None, the evicted rows' files): the caller removes those files."""
        if self.read_only:
            raise self._refuse("store a line")
        conn = self._conn()
        try:
            with self._write(conn):
                row = conn.execute("SELECT file FROM entries WHERE key=?", (values[0],)).fetchone()
                conn.execute(
                    f"INSERT OR REPLACE INTO entries ({ROW}, last_used, hits) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,0)",
                    values,
                )
                conn.execute("UPDATE counters SET value=value+1 WHERE name='stores'")
                evicted = self._evict_locked(conn, keep=values[0], limit=limit)
        except sqlite3.Error as e:
            raise CacheError(f"cannot write the cache index {self.path}: {e}") from e
        return (None if row is None else row[0]), evicted

    def delete(self, key: Any, file: Any, *, dropped: bool = True) -> bool:
        """Delete the row (key, file), counted as dropped (a damaged entry) unless `dropped` is
        False (a user's removal); False if it is gone already. The values are compared as sqlite
        holds them, so a row with a damaged column is found too."""
        if self.read_only:
            raise self._refuse("drop an entry")
        conn = self._conn()
        try:
            with self._write(conn):
                gone = conn.execute("DELETE FROM entries WHERE key=? AND file=?", (key, file)).rowcount > 0
                if gone and dropped:
                    conn.execute("UPDATE counters SET value=value+1 WHERE name='dropped'")
        except sqlite3.Error as e:
            raise CacheError(f"cannot write the cache index: {e}") from e
        return gone

    def evict(self, limit: int) -> list[str]:
        """Delete LRU rows until the total is under `limit`; returns their files."""
        if self.read_only:
            raise self._refuse("evict entries")
        conn = self._conn()
        try:
            with self._write(conn):
                return self._evict_locked(conn, keep="", limit=limit)
        except sqlite3.Error as e:
            raise CacheError(f"cannot write the cache index: {e}") from e

    def _evict_locked(self, conn: sqlite3.Connection, keep: str, limit: int) -> list[str]:
        total = conn.execute("SELECT COALESCE(SUM(bytes), 0) FROM entries").fetchone()[0]
        files: list[str] = []
        while total > limit:
            victims = conn.execute(
                "SELECT key, file, CAST(bytes AS INTEGER) FROM entries WHERE key != ? "
                "ORDER BY last_used ASC LIMIT 64",
                (keep,),
            ).fetchall()
            if not victims:
                break
            for key, rel, nbytes in victims:
                if total <= limit:
                    break
                conn.execute("DELETE FROM entries WHERE key=?", (key,))
                conn.execute("UPDATE counters SET value=value+1 WHERE name='evictions'")
                files.append(rel)
                total -= nbytes
        return files

    def clear(self) -> list[tuple[Any, int]]:
        """Delete every row and reset the counters; returns the rows' (file, bytes)."""
        if self.read_only:
            raise self._refuse("clear it")
        conn = self._conn()
        try:
            with self._write(conn):
                rows = conn.execute("SELECT file, CAST(bytes AS INTEGER) FROM entries").fetchall()
                conn.execute("DELETE FROM entries")
                conn.execute("UPDATE counters SET value=0")
        except sqlite3.Error as e:
            raise CacheError(f"cannot write the cache index: {e}") from e
        return rows
