"""The phrase cache's store: rendered lines on disk under a sqlite index, with an LRU size limit.

Storage: `DIR/index.sqlite3` (WAL mode) holds one row per entry: the audio file's name,
size and sha256, the SynthesisRecord as JSON, the ~50 Hz lip-sync levels, and the LRU
clock. Audio lives beside it in `DIR/audio/` as raw little-endian float32 (exact, the
default) or 24-bit FLAC (about half the size). A write goes temp file -> fsync ->
rename -> fsync(dir) -> index row in one transaction, so a reader (in any process) sees
either no entry or a complete one; a reader that finds a file missing, truncated or not
matching its checksum drops the entry and reports a miss, so it is re-rendered, never
played. Several processes may read while one writes (sqlite serialises writers). Every
public method is thread-safe (one sqlite connection per thread).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..audio.signal import SAMPLE_RATE
from ..errors import CacheError, InputError
from ..options import SynthesisOptions, SynthesisRecord
from .connections import IndexConnections
from .entries import CachedLine, CacheStats, EntryInfo, VerifyReport, record_from_json, record_to_json
from .files import AUDIO_FORMATS, _decode, _encode, _fsync_dir, default_cache_dir, format_size, parse_size
from .index import (
    _AUDIO_FILE,
    _COUNTERS,
    _ROW,
    _Entry,
    _is_real,
    _parse_row,
    _show,
)
from .keys import canonical_json, identity_key, line_identity

if TYPE_CHECKING:
    from ..cancel import CancelToken
    from .policy import CachedSynthesizer

log = logging.getLogger("irodori_speaker.cache")

DEFAULT_MAX_BYTES = 2 * 1024**3
LIPSYNC_HZ = 50.0
TMP_GRACE_S = 3600.0  # temp files older than this are leftovers of a crashed writer
ORPHAN_GRACE_S = 300.0  # audio files without a row are removed by verify() after this age


class PhraseCache(IndexConnections):
    """A crash-safe, multi-process disk cache of rendered lines with an LRU size limit.

    `directory`: where it lives (default `default_cache_dir()`). `max_bytes`: audio size
    limit (None: the limit last stored in this cache, else `DEFAULT_MAX_BYTES`); puts evict
    the least recently used entries until under it. `audio_format`: "f32" (exact) or
    "flac" (24-bit, smaller) for new entries; both are read. `timeout_s`: how long a
    write waits for another process's write.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        max_bytes: int | str | None = None,
        audio_format: str = "f32",
        lipsync_hz: float = LIPSYNC_HZ,
        timeout_s: float = 10.0,
    ) -> None:
        if audio_format not in AUDIO_FORMATS:
            raise InputError(f"audio_format must be one of {AUDIO_FORMATS}, got {audio_format!r}")
        if not lipsync_hz > 0:
            raise InputError(f"lipsync_hz must be > 0, got {lipsync_hz!r}")
        self.directory = Path(directory).expanduser() if directory is not None else default_cache_dir()
        self.audio_format = audio_format
        self.lipsync_hz = float(lipsync_hz)
        self.timeout_s = float(timeout_s)
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._session = {"hits": 0, "misses": 0}
        self._warned: set[Any] = set()  # keys of damaged rows already logged
        self._closed = False
        try:
            (self.directory / "audio").mkdir(parents=True, exist_ok=True)
            (self.directory / "tmp").mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CacheError(f"cannot create the phrase cache at {self.directory}: {e}") from e
        self._open_index()
        if max_bytes is None:
            stored = self._meta("max_bytes")
            self.max_bytes = int(stored) if stored else DEFAULT_MAX_BYTES
        else:
            self.max_bytes = parse_size(max_bytes)
            if self._meta("max_bytes") != str(self.max_bytes):
                self._set_meta("max_bytes", str(self.max_bytes))
        self._sweep_temp(TMP_GRACE_S)

    def __enter__(self) -> PhraseCache:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"PhraseCache({str(self.directory)!r}, max_bytes={self.max_bytes})"

    # ---- keys ---------------------------------------------------------------------------------
    def identity(self, synth: Any, text: str, voice: Any = None, options: SynthesisOptions | None = None):
        """What the key of this line covers (see `line_identity`)."""
        return line_identity(synth, text, voice, options)

    def key(self, synth: Any, text: str, voice: Any = None, options: SynthesisOptions | None = None) -> str:
        return identity_key(self.identity(synth, text, voice, options))

    # ---- reading ------------------------------------------------------------------------------
    def lookup(
        self, synth: Any, text: str, voice: Any = None, options: SynthesisOptions | None = None
    ) -> CachedLine | None:
        """The stored line for (text, voice, options) on `synth`'s model, or None. No model work.

        A `seed=None` line is looked up under `DEFAULT_SEED`.
        """
        return self.get(self.key(synth, text, voice, options))

    def get(self, key: str) -> CachedLine | None:
        """The entry `key`, verified against its checksum; None (a miss) if absent or damaged."""
        line = self._read(key)
        self._count("hits" if line is not None else "misses", key if line is not None else None)
        return line

    def contains(self, key: str, *, verify: bool = False) -> bool:
        """Is `key` stored? `verify=True` also checks its audio (dropping it if damaged).

        Does not count as a hit or miss, nor refresh its LRU position.
        """
        if verify:
            return self._read(key) is not None
        row = self._row(key)
        if row is None:
            return False
        why = _parse_row(row)
        if isinstance(why, str):  # a rotted row is not an entry: drop it so it is rendered again
            self._drop(row[0], row[1], why)
            return False
        return True

    def _row(self, key: str) -> tuple | None:
        try:
            return self._conn().execute(f"SELECT {_ROW} FROM entries WHERE key=?", (key,)).fetchone()
        except sqlite3.Error as e:
            raise CacheError(f"cannot read the cache index: {e}") from e

    def _read(self, key: str) -> CachedLine | None:
        row = self._row(key)
        if row is None:
            return None
        loaded = self._load(row)
        if isinstance(loaded, str):
            self._drop(row[0], row[1], loaded)
            return None
        entry, audio = loaded
        record = entry.record
        record.extra["cache"] = {"hit": True, "key": key, "created": entry.created, "source": entry.source}
        return CachedLine(
            key=key,
            text=entry.text,
            audio=audio,
            sample_rate=entry.sample_rate,
            record=record,
            levels=entry.levels,
            levels_hz=entry.levels_hz,
            created=entry.created,
            source=entry.source,
            identity=entry.identity,
        )

    def _load(self, row: tuple) -> tuple[_Entry, np.ndarray] | str:
        """The row and its audio, checked (types, size, checksum, sample count); else why not."""
        entry = _parse_row(row)
        if isinstance(entry, str):
            return entry
        try:
            data = (self.directory / entry.file).read_bytes()
        except FileNotFoundError:
            return "audio file missing"
        except OSError as e:
            return f"audio file unreadable: {e}"
        if len(data) != entry.bytes:
            return f"audio file is {len(data)} bytes, the index says {entry.bytes} (truncated?)"
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            return "audio checksum mismatch (corrupted)"
        try:
            audio = _decode(data, entry.format)
        except Exception as e:  # a file that hashes right but does not decode: still never play it
            return f"audio does not decode: {e}"
        if len(audio) != entry.samples:
            return f"audio has {len(audio)} samples, the index says {entry.samples}"
        if not np.isfinite(audio).all():
            return "audio contains NaN or inf"
        return entry, audio

    def _drop(self, key: Any, rel: Any, why: str) -> None:
        """Delete the row (key, rel) and its audio file. The values are compared as sqlite holds
        them, so a row with a damaged column is found too; its file is only removed when the
        row named a file of this cache."""
        if key not in self._warned:  # once: a row that cannot be deleted (read-only) stays quiet
            self._warned.add(key)
            log.warning("phrase cache: dropping entry %s: %s", _show(key)[:18], why)
        conn = self._conn()
        try:
            with self._write(conn):
                cur = conn.execute("DELETE FROM entries WHERE key=? AND file=?", (key, rel))
                gone = cur.rowcount > 0
                if gone:
                    conn.execute("UPDATE counters SET value=value+1 WHERE name='dropped'")
        except sqlite3.Error as e:
            log.warning("phrase cache: could not drop %s: %s", key[:16], e)
            return
        if gone:  # the row named exactly this file, so nothing else refers to it
            self._unlink_audio(rel)

    def _count(self, name: str, key: str | None) -> None:
        with self._lock:
            self._session[name] += 1
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

    # ---- writing ------------------------------------------------------------------------------
    def store(
        self,
        synth: Any,
        text: str,
        voice: Any,
        options: SynthesisOptions | None,
        audio: np.ndarray,
        record: SynthesisRecord | None = None,
        *,
        source: str = "speaker",
    ) -> CachedLine:
        """Store audio that `synth` rendered for (text, voice, options) (seed defaulted to 0).

        `record.seed` must be the seed the key uses: audio rendered with another seed (e.g. a
        random one) would be served for the wrong key, so it is refused.
        """
        from .policy import CachedRender

        cached = CachedRender(self, synth, store="all", source=source, strict=True)
        line = cached.store(cached.slot(text, voice, options), audio, record)
        assert line is not None  # strict: a line that is not stored raises
        return line

    def put(
        self,
        key: str,
        audio: np.ndarray,
        record: SynthesisRecord | None = None,
        *,
        sample_rate: int = SAMPLE_RATE,
        identity: dict | None = None,
        text: str | None = None,
        source: str = "put",
    ) -> CachedLine:
        """Store `audio` under `key` atomically; evict LRU entries until under `max_bytes`."""
        from ..audio.lipsync import mouth_levels

        if not isinstance(key, str) or not re.fullmatch(r"[0-9a-f]{16,128}", key):
            raise InputError(f"cache keys are lowercase hex digests, got {key!r}")
        x = np.asarray(audio)
        if x.ndim != 1 or x.size == 0:
            raise InputError(f"cached audio must be non-empty mono (samples,), got shape {x.shape}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        if not np.isfinite(x).all():
            raise InputError("audio with NaN or inf is not cached")
        data = _encode(x, sample_rate, self.audio_format)
        if len(data) > self.max_bytes:
            raise CacheError(
                f"a {format_size(len(data))} line does not fit the cache limit of "
                f"{format_size(self.max_bytes)}",
                hint="raise --max-bytes",
            )
        stored_audio = x if self.audio_format == "f32" else _decode(data, self.audio_format)
        sha = hashlib.sha256(data).hexdigest()
        levels = mouth_levels(stored_audio, sample_rate, hz=self.lipsync_hz).astype("<f4")
        if text is None:
            text = (identity or {}).get("line", {}).get("text") or (record.text if record else "")
        rel = f"audio/{key[:2]}/{key}.{sha[:12]}.{self.audio_format}"
        self._write_file(rel, data)
        now = time.time()
        rec_json = record_to_json(record)
        ident_json = canonical_json(identity or {})
        conn = self._conn()
        old: str | None = None
        evicted: list[str] = []
        try:
            with self._write(conn):
                row = conn.execute("SELECT file FROM entries WHERE key=?", (key,)).fetchone()
                old = None if row is None else row[0]
                conn.execute(
                    f"INSERT OR REPLACE INTO entries ({_ROW}, last_used, hits) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,0)",
                    (
                        key,
                        rel,
                        self.audio_format,
                        len(data),
                        sha,
                        int(sample_rate),
                        len(stored_audio),
                        text,
                        ident_json,
                        rec_json,
                        levels.tobytes(),
                        self.lipsync_hz,
                        source,
                        now,
                        now,
                    ),
                )
                conn.execute("UPDATE counters SET value=value+1 WHERE name='stores'")
                evicted = self._evict_locked(conn, keep=key)
        except sqlite3.Error as e:
            if old != rel:
                self._unlink_audio(rel)
            raise CacheError(f"cannot write the cache index {self.index_path}: {e}") from e
        except BaseException:
            if old != rel:
                self._unlink_audio(rel)
            raise
        for f in [*evicted, *([old] if old and old != rel else [])]:
            self._unlink_audio(f)
        out_record = record_from_json(rec_json) if record is not None else SynthesisRecord(text=text)
        out_record.extra["cache"] = {"hit": False, "key": key, "created": now, "source": source}
        return CachedLine(
            key=key,
            text=text,
            audio=stored_audio,
            sample_rate=int(sample_rate),
            record=out_record,
            levels=levels.astype(np.float32),
            levels_hz=self.lipsync_hz,
            created=now,
            source=source,
            identity=identity or {},
        )

    def _unlink_audio(self, rel: Any) -> None:
        """Remove an audio file an index row named, only if it is one of this cache's (a damaged
        row must not delete something else)."""
        if isinstance(rel, str) and _AUDIO_FILE.fullmatch(rel):
            with contextlib.suppress(OSError):
                (self.directory / rel).unlink()

    def _write_file(self, rel: str, data: bytes) -> None:
        final = self.directory / rel
        tmp = self.directory / "tmp" / f"{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part"
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)  # atomic: a reader sees the whole file or none
            _fsync_dir(final.parent)
        except BaseException as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if isinstance(e, OSError):
                raise CacheError(f"cannot write {final}: {e}") from e
            raise

    def _evict_locked(self, conn: sqlite3.Connection, keep: str, limit: int | None = None) -> list[str]:
        limit = self.max_bytes if limit is None else limit
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

    def evict(self, max_bytes: int | str | None = None) -> int:
        """Evict LRU entries until under `max_bytes` (default: the limit); returns how many."""
        limit = self.max_bytes if max_bytes is None else parse_size(max_bytes)
        conn = self._conn()
        try:
            with self._write(conn):
                files = self._evict_locked(conn, keep="", limit=limit)
        except sqlite3.Error as e:
            raise CacheError(f"cannot write the cache index: {e}") from e
        for f in files:
            self._unlink_audio(f)
        return len(files)

    def render(
        self,
        synth: Any,
        text: str,
        voice: Any = None,
        options: SynthesisOptions | None = None,
        *,
        cancel: CancelToken | None = None,
        progress: Any = None,
        source: str = "render",
    ) -> tuple[CachedLine, bool]:
        """The cached line, rendering and storing it first on a miss. Returns (line, was_hit)."""
        from .policy import CachedRender

        kwargs = {"progress": progress} if progress is not None else {}
        cached = CachedRender(self, synth, store="all", source=source, strict=True)
        rendered = cached.render(text, voice, options, cancel=cancel, **kwargs)
        assert rendered.line is not None  # strict: a line that is not stored raises
        return rendered.line, rendered.hit

    # ---- maintenance --------------------------------------------------------------------------
    def stats(self) -> CacheStats:
        conn = self._conn()
        try:
            n, total, samples = conn.execute(
                "SELECT COUNT(*), COALESCE(SUM(bytes), 0), "
                "COALESCE(SUM(CAST(samples AS REAL) / sample_rate), 0) FROM entries"
            ).fetchone()
            counters = dict(conn.execute("SELECT name, value FROM counters").fetchall())
        except sqlite3.Error as e:
            raise CacheError(f"cannot read the cache index: {e}") from e
        with self._lock:
            session = dict(self._session)
        return CacheStats(
            directory=str(self.directory),
            entries=int(n),
            bytes=int(total),
            max_bytes=self.max_bytes,
            audio_seconds=float(samples),
            session_hits=session["hits"],
            session_misses=session["misses"],
            **{k: int(counters.get(k, 0)) for k in _COUNTERS},
        )

    def entries(self, limit: int | None = None, order: str = "last_used") -> list[EntryInfo]:
        """Entries, most recently used first (`order`: last_used, hits, bytes or created)."""
        if order not in ("last_used", "hits", "bytes", "created"):
            raise InputError(f"order must be last_used, hits, bytes or created, got {order!r}")
        sql = (
            "SELECT key, text, CAST(samples AS REAL) / sample_rate, bytes, hits, created, last_used, source "
            f"FROM entries ORDER BY {order} DESC"
        )
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        try:
            rows = self._conn().execute(sql).fetchall()
        except sqlite3.Error as e:
            raise CacheError(f"cannot read the cache index: {e}") from e
        # A damaged row (see verify) is left out rather than shown with a column of the wrong type.
        kinds = (str, str, float, int, int, float, float, str)
        return [
            EntryInfo(*r)
            for r in rows
            if all(
                _is_real(v) if k is float else isinstance(v, k) and not isinstance(v, bool)
                for k, v in zip(kinds, r)
            )
        ]

    def verify(
        self,
        *,
        repair: bool = True,
        grace_s: float = ORPHAN_GRACE_S,
        on_entry: Callable[[int, int], None] | None = None,
    ) -> VerifyReport:
        """Check every entry's audio against its checksum; with `repair`, drop the bad ones and
        remove orphan audio files and stale temp files older than `grace_s`."""
        from .verify import verify

        return verify(self, repair=repair, grace_s=grace_s, on_entry=on_entry)

    def _sweep_temp(self, grace_s: float) -> int:
        removed = 0
        now = time.time()
        with contextlib.suppress(OSError):
            for p in (self.directory / "tmp").iterdir():
                with contextlib.suppress(OSError):
                    if now - p.stat().st_mtime > grace_s:
                        p.unlink()
                        removed += 1
        return removed

    def clear(self) -> tuple[int, int]:
        """Remove every entry (and reset the counters). Returns (entries, bytes) removed."""
        conn = self._conn()
        try:
            with self._write(conn):
                rows = conn.execute("SELECT file, CAST(bytes AS INTEGER) FROM entries").fetchall()
                conn.execute("DELETE FROM entries")
                conn.execute("UPDATE counters SET value=0")
        except sqlite3.Error as e:
            raise CacheError(f"cannot write the cache index: {e}") from e
        for rel, _ in rows:
            self._unlink_audio(rel)
        self._sweep_temp(TMP_GRACE_S)
        with self._lock:
            self._session = {"hits": 0, "misses": 0}
        return len(rows), int(sum(b for _, b in rows))

    # ---- the Speaker side ---------------------------------------------------------------------
    def wrap(self, synth: Any, *, store: str = "prebuilt") -> CachedSynthesizer:
        """`synth` answering from this cache first (a SynthesizerLike; see `CachedSynthesizer`)."""
        from .policy import CachedSynthesizer

        return CachedSynthesizer(synth, self, store=store)
