"""The phrase cache's sqlite connections: one per thread, WAL mode, the schema, write transactions.

A destroyed index (a disk fault, a stray write) is moved aside and rebuilt; the audio files
it listed become orphans that `verify()` removes.
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

from ..errors import CacheError
from .index import _COUNTERS, _SCHEMA, INDEX_NAME, SCHEMA_VERSION

log = logging.getLogger("irodori_speaker.cache")


class IndexConnections:
    """The index of a cache at `directory` (the subclass sets the attributes below)."""

    directory: Path
    timeout_s: float
    _local: threading.local
    _conns: list[sqlite3.Connection]
    _lock: threading.Lock
    _closed: bool

    @property
    def index_path(self) -> Path:
        return self.directory / INDEX_NAME

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.index_path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL: the index stays consistent on a crash
        return conn

    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise CacheError("this PhraseCache is closed")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = self._connect()
            except sqlite3.Error as e:
                raise CacheError(f"cannot open the cache index {self.index_path}: {e}") from e
            self._local.conn = conn
            with self._lock:
                self._conns.append(conn)
        return conn

    def _open_index(self) -> None:
        try:
            self._init_schema()
        except (sqlite3.DatabaseError, CacheError) as err:
            e = err.__cause__ if isinstance(err, CacheError) and err.__cause__ is not None else err
            if "not a database" not in str(e) and "malformed" not in str(e):
                if isinstance(err, CacheError):
                    raise
                raise CacheError(f"cannot open the cache index {self.index_path}: {e}") from e
            # A destroyed index (disk fault, a stray write): keep it aside and start afresh; the
            # audio files it listed become orphans that verify() removes.
            self.close()
            self._closed = False
            aside = self.index_path.with_name(f"{INDEX_NAME}.corrupt-{int(time.time())}")
            log.warning("phrase cache index %s is corrupt (%s); moved to %s", self.index_path, e, aside)
            with contextlib.suppress(OSError):
                os.replace(self.index_path, aside)
            for suffix in ("-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.unlink(str(self.index_path) + suffix)
            try:
                self._init_schema()
            except sqlite3.Error as e2:
                raise CacheError(f"cannot rebuild the cache index {self.index_path}: {e2}") from e2

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
            for name in _COUNTERS:
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

    def _meta(self, name: str) -> str | None:
        row = self._conn().execute("SELECT value FROM meta WHERE name=?", (name,)).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, name: str, value: str) -> None:
        conn = self._conn()
        try:
            with self._write(conn):
                conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (name, value))
        except sqlite3.Error as e:
            raise CacheError(f"cannot write the cache index: {e}") from e

    def close(self) -> None:
        """Close every connection (any thread's). Further use raises CacheError."""
        with self._lock:
            conns, self._conns = self._conns, []
            self._closed = True
        for c in conns:
            with contextlib.suppress(sqlite3.Error):
                c.close()
        self._local = threading.local()
