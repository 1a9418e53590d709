"""The phrase cache: rendered lines on disk, keyed by everything that changes their sound.

    cache = PhraseCache("~/.cache/irodori-speaker/phrases")
    line, hit = cache.render(synth, "いらっしゃい！", voice)   # renders once, then served from disk
    line = cache.lookup(synth, "いらっしゃい！", voice)        # CachedLine or None; never touches the model

Key: sha256 of the canonical JSON of `Synthesizer.render_identity(text, voice, options)`
(normalised text, voice content hash and caption, the resolved options that change the
sound, the model, codec and tokenizer content fingerprints, precision: each once) plus the
sample rate and `CACHE_FORMAT_VERSION`. Change any of them and the old entry is simply not found
(it ages out through the size limit). A line with no seed is cached under
`DEFAULT_SEED` (0): a random seed cannot be reproduced, so it cannot be cached.

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
import dataclasses
import hashlib
import io
import json
import logging
import math
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .cancel import check
from .errors import CacheError, InputError
from .types import AudioStream, SynthesisOptions, SynthesisRecord, SynthesisResult, SynthesizerLike

if TYPE_CHECKING:
    from .cancel import CancelToken
    from .lipsync import Envelope

log = logging.getLogger("irodori_speaker.cache")

#: Bump when the stored audio for the same identity would differ (a key component).
CACHE_FORMAT_VERSION = 1
#: Version of the index layout (tables); a newer index is refused, not rewritten.
SCHEMA_VERSION = 1
#: Seed used for cached lines whose options leave `seed=None`.
DEFAULT_SEED = 0
DEFAULT_MAX_BYTES = 2 * 1024**3
LIPSYNC_HZ = 50.0
AUDIO_FORMATS = ("f32", "flac")
#: What the Speaker stores on its own: nothing (only `prebuild` fills the cache), lines
#: marked `cache=True`, or every line.
STORE_POLICIES = ("prebuilt", "marked", "all")
INDEX_NAME = "index.sqlite3"
TMP_GRACE_S = 3600.0  # temp files older than this are leftovers of a crashed writer
ORPHAN_GRACE_S = 300.0  # audio files without a row are removed by verify() after this age

_COUNTERS = ("hits", "misses", "stores", "evictions", "dropped")


def default_cache_dir() -> Path:
    """`$IRODORI_CACHE/phrases`, else `$XDG_CACHE_HOME/irodori-speaker/phrases` (~/.cache)."""
    base = os.environ.get("IRODORI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "irodori-speaker"
    )
    return Path(base) / "phrases"


def canonical_json(obj: Any) -> str:
    """Sorted keys, no whitespace, no NaN: the same value always gives the same string."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise CacheError(f"a cache key component is not plain JSON: {e}") from e


def cache_options(options: SynthesisOptions | Mapping[str, Any] | None = None) -> SynthesisOptions:
    """`options` with the seed fixed: `DEFAULT_SEED` when it is None (the cache needs one)."""
    options = SynthesisOptions.coerce(options)
    return options if options.seed is not None else options.replace(seed=DEFAULT_SEED)


def line_identity(
    synth: Any,
    text: str,
    voice: Any = None,
    options: SynthesisOptions | None = None,
    *,
    format_version: int | None = None,
) -> dict:
    """Everything the key covers, as a JSON-able dict (the seed defaulted as the cache does)."""
    if not isinstance(synth, SynthesizerLike):
        raise CacheError(
            f"{type(synth).__name__} cannot be cached: it is not a synthesizer (no render_identity())",
            hint="use irodori_speaker.synthesizer.Synthesizer (load_synthesizer)",
        )
    return {
        "format": CACHE_FORMAT_VERSION if format_version is None else format_version,
        "line": synth.render_identity(text, voice, cache_options(options)),
        "sample_rate": int(synth.sample_rate),
    }


def identity_key(identity: dict) -> str:
    """sha256 (hex) of the identity's canonical JSON."""
    return hashlib.sha256(canonical_json(identity).encode("utf-8")).hexdigest()


def parse_size(text: str | int) -> int:
    """'500M', '2G', '1.5GiB', '800k', '123' (bytes) -> bytes. Units are powers of 1024."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", str(text), re.IGNORECASE)
        if not m:
            raise InputError(f"not a size: {text!r}", hint="e.g. 500M, 2G, 1.5GiB or a number of bytes")
        value = int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2).lower() or " "))
    if value <= 0:
        raise InputError(f"a cache size limit must be > 0 bytes, got {text!r}")
    return value


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# Data types
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CachedLine:
    """A rendered line from the cache: its audio, record and lip-sync levels."""

    key: str
    text: str  # the normalised text spoken
    audio: np.ndarray  # float32 mono
    sample_rate: int
    record: SynthesisRecord
    levels: np.ndarray  # mouth-open level per 1/levels_hz s (lipsync.mouth_levels)
    levels_hz: float
    created: float  # unix time it was stored
    source: str  # who stored it: "prebuild", "speaker", "render", ...
    identity: dict = field(default_factory=dict, repr=False)

    @property
    def duration(self) -> float:
        return len(self.audio) / self.sample_rate

    def result(self) -> SynthesisResult:
        """As the synthesizer would have returned it."""
        return SynthesisResult(self.audio, self.record, self.sample_rate)

    def envelope(self, hz: float | None = None, **kwargs: Any) -> Envelope:
        """A lip-sync `Envelope` holding the whole line (what the Speaker builds while it plays)."""
        from .lipsync import Envelope

        env = Envelope(self.sample_rate, hz=hz or self.levels_hz, **kwargs)
        env.append(self.audio)
        return env


@dataclass(frozen=True)
class CacheStats:
    directory: str
    entries: int
    bytes: int
    max_bytes: int
    audio_seconds: float
    hits: int  # lifetime counters, kept in the index (all processes)
    misses: int
    stores: int
    evictions: int
    dropped: int  # entries found corrupt, truncated or missing and removed
    session_hits: int = 0  # this PhraseCache object only
    session_misses: int = 0

    @property
    def hit_rate(self) -> float:
        n = self.hits + self.misses
        return self.hits / n if n else math.nan

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["hit_rate"] = None if math.isnan(self.hit_rate) else self.hit_rate
        return d


@dataclass
class VerifyReport:
    checked: int = 0
    ok: int = 0
    bad: list[tuple[str, str, str]] = field(default_factory=list)  # (key, text, why)
    orphans_removed: int = 0
    temp_removed: int = 0
    repaired: bool = True

    @property
    def clean(self) -> bool:
        return not self.bad


@dataclass(frozen=True)
class EntryInfo:
    key: str
    text: str
    seconds: float
    bytes: int
    hits: int
    created: float
    last_used: float
    source: str


# ---------------------------------------------------------------------------------------------
# Record <-> JSON
# ---------------------------------------------------------------------------------------------


def record_to_json(record: SynthesisRecord | None) -> str:
    if record is None:
        return "{}"
    d = dataclasses.asdict(record)
    d.get("extra", {}).pop("cache", None)
    return json.dumps(d, ensure_ascii=False, default=str)


def _field_types(cls: type) -> dict[str, type]:
    """Field name -> the type of its default (str, int, dict, list) for a dataclass of plain values."""
    out = {}
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[misc,operator]
        out[f.name] = type(default)
    return out


_RECORD_TYPES = _field_types(SynthesisRecord)


def record_from_json(text: str) -> SynthesisRecord:
    """The record stored as JSON; ValueError (naming the field) if it is not one."""
    d = json.loads(text or "{}")  # JSONDecodeError is a ValueError
    if not isinstance(d, dict):
        raise ValueError(f"the record is a JSON {type(d).__name__}, not an object")
    fields: dict[str, Any] = {}
    for name, kind in _RECORD_TYPES.items():
        if name not in d:
            continue
        value = d[name]
        if isinstance(value, bool) or not isinstance(value, kind):
            raise ValueError(f"record field {name!r} is {value!r:.40}, not a {kind.__name__}")
        fields[name] = value
    timings = fields.get("timings", {})
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in timings.values()):
        raise ValueError("record field 'timings' holds a value that is not a number")
    return SynthesisRecord(**fields)


# ---------------------------------------------------------------------------------------------
# Audio files
# ---------------------------------------------------------------------------------------------


def _encode(audio: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    if fmt == "f32":
        return np.ascontiguousarray(audio, dtype="<f4").tobytes()
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.clip(audio, -1.0, 1.0), sample_rate, format="FLAC", subtype="PCM_24")
    return buf.getvalue()


def _decode(data: bytes, fmt: str) -> np.ndarray:
    if fmt == "f32":
        if len(data) % 4:
            raise ValueError("raw float32 file size is not a multiple of 4")
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    if fmt == "flac":
        import soundfile as sf

        audio, _ = sf.read(io.BytesIO(data), dtype="float32", always_2d=False)
        return np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
    raise ValueError(f"unknown audio format {fmt!r}")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # Windows cannot open directories; rename there is durable enough
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------------------
# The cache
# ---------------------------------------------------------------------------------------------


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

_COLUMNS = (
    "key", "file", "format", "bytes", "sha256", "sample_rate", "samples", "text", "identity", "record",
    "levels", "levels_hz", "source", "created",
)  # fmt: skip
_ROW = ", ".join(_COLUMNS)


#: What an index row's `file` may name: a file under audio/ (never a path out of the cache).
_AUDIO_FILE = re.compile(r"audio/[0-9a-z]+/[0-9a-z]+\.[0-9a-z]+\.[0-9a-z]+")


@dataclass(frozen=True)
class _Entry:
    """One index row, every column checked for its type (see `_parse_row`)."""

    key: str
    file: str
    format: str
    bytes: int
    sha256: str
    sample_rate: int
    samples: int
    text: str
    identity: dict
    record: SynthesisRecord
    levels: np.ndarray
    levels_hz: float
    source: str
    created: float


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _parse_row(row: tuple) -> _Entry | str:
    """The row as an `_Entry`, or why it is damaged (a rotted byte, a column of the wrong type).

    sqlite keeps whatever a stray write put in a column, so nothing read back is trusted.
    """
    key, rel, fmt, nbytes, sha, rate, samples, text, ident, rec, levels, hz, source, created = row
    checks = (
        ("key", isinstance(key, str)),
        ("file", isinstance(rel, str) and _AUDIO_FILE.fullmatch(rel) is not None),
        ("format", fmt in AUDIO_FORMATS),
        ("bytes", _is_int(nbytes) and nbytes > 0),
        ("sha256", isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha) is not None),
        ("sample_rate", _is_int(rate) and rate > 0),
        ("samples", _is_int(samples) and samples > 0),
        ("text", isinstance(text, str)),
        ("levels", isinstance(levels, bytes) and len(levels) % 4 == 0),
        ("levels_hz", _is_real(hz) and hz > 0),
        ("source", isinstance(source, str)),
        ("created", _is_real(created)),
        ("identity", isinstance(ident, str)),
        ("record", isinstance(rec, str)),
    )
    for name, ok in checks:
        if not ok:
            return f"index row is damaged: column {name!r} holds {_show(row[_COLUMNS.index(name)])}"
    try:
        identity = json.loads(ident)
        if not isinstance(identity, dict):
            raise ValueError(f"it is a JSON {type(identity).__name__}, not an object")
    except ValueError as e:
        return f"index row is damaged: column 'identity' is not a JSON object ({e})"
    try:
        record = record_from_json(rec)
    except ValueError as e:
        return f"index row is damaged: column 'record' is not a synthesis record ({e})"
    return _Entry(
        key, rel, fmt, nbytes, sha, rate, samples, text, identity, record,
        np.frombuffer(levels, dtype="<f4").astype(np.float32), float(hz), source, float(created),
    )  # fmt: skip


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class PhraseCache:
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

    # ---- connections ------------------------------------------------------------------------
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
        opts = cache_options(options)
        key_seed = 0 if opts.seed is None else int(opts.seed)  # cache_options sets it; 0 is its default
        if record is not None and int(record.seed) != key_seed:
            raise InputError(
                f"audio rendered with seed {record.seed} cannot be stored under seed {key_seed}",
                hint="render with irodori_speaker.cache.cache_options(options)",
            )
        identity = self.identity(synth, text, voice, opts)
        rate = int(synth.sample_rate)
        return self.put(
            identity_key(identity), audio, record, sample_rate=rate, identity=identity, source=source
        )

    def put(
        self,
        key: str,
        audio: np.ndarray,
        record: SynthesisRecord | None = None,
        *,
        sample_rate: int = 48_000,
        identity: dict | None = None,
        text: str | None = None,
        source: str = "put",
    ) -> CachedLine:
        """Store `audio` under `key` atomically; evict LRU entries until under `max_bytes`."""
        from .lipsync import mouth_levels

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
        opts = cache_options(options)
        identity = self.identity(synth, text, voice, opts)
        key = identity_key(identity)
        line = self.get(key)
        if line is not None:
            return line, True
        kwargs = {"progress": progress} if progress is not None else {}
        result = synth.synthesize(text, voice, opts, cancel=cancel, **kwargs)
        line = self.put(
            key, result.audio, result.record, sample_rate=result.sample_rate, identity=identity, source=source
        )
        return line, False

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
        report = VerifyReport(repaired=repair)
        try:
            rowids = [r[0] for r in self._conn().execute("SELECT rowid FROM entries").fetchall()]
        except sqlite3.Error as e:
            raise CacheError(f"cannot read the cache index: {e}") from e
        for i, rowid in enumerate(rowids):
            try:
                row = self._conn().execute(f"SELECT {_ROW} FROM entries WHERE rowid=?", (rowid,)).fetchone()
            except sqlite3.Error as e:
                raise CacheError(f"cannot read the cache index: {e}") from e
            report.checked += 1
            if row is None:  # gone meanwhile (another process evicted it)
                pass
            elif isinstance(why := self._load(row), str):
                key, text = row[0], row[7]
                report.bad.append((str(key), text if isinstance(text, str) else _show(text), why))
                if repair:
                    self._drop(key, row[1], why)
            else:
                report.ok += 1
            if on_entry is not None:
                on_entry(i + 1, len(rowids))
        if repair:
            report.temp_removed = self._sweep_temp(grace_s)
            report.orphans_removed = self._sweep_orphans(grace_s)
        return report

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

    def _sweep_orphans(self, grace_s: float) -> int:
        # A writer renames its file into place a moment before it commits the row, so only
        # files older than grace_s count as orphans.
        try:
            known = {r[0] for r in self._conn().execute("SELECT file FROM entries")}
        except sqlite3.Error as e:
            raise CacheError(f"cannot read the cache index: {e}") from e
        removed = 0
        now = time.time()
        audio = self.directory / "audio"
        for p in audio.rglob("*"):
            if not p.is_file():
                continue
            rel = p.relative_to(self.directory).as_posix()
            if rel in known:
                continue
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
        return CachedSynthesizer(synth, self, store=store)


class CachedSynthesizer:
    """A `SynthesizerLike` that serves cache hits without calling the model.

    Every line is looked up (a `seed=None` line under `DEFAULT_SEED`). On a miss the wrapped
    synthesizer renders it with the caller's options; with `store="all"` the miss is rendered
    with the cache seed instead and stored. Use it to give any consumer of a synthesizer
    (the Speaker included) the cache; `Speaker(cache=...)` does the same before taking the
    model lock.
    """

    def __init__(self, synth: Any, cache: PhraseCache, *, store: str = "prebuilt") -> None:
        if store not in ("prebuilt", "all"):
            raise InputError(f"store must be 'prebuilt' or 'all', got {store!r}")
        self.synth = synth
        self.cache = cache
        self.store = store
        self.sample_rate = int(synth.sample_rate)

    def __getattr__(self, name: str) -> Any:  # preset, fingerprints, ...: the wrapped synthesizer's
        return getattr(self.synth, name)

    def resolve_options(
        self, options: SynthesisOptions | Mapping[str, Any] | None = None
    ) -> SynthesisOptions:
        return self.synth.resolve_options(options)

    def render_identity(self, text: str, voice: Any = None, options: SynthesisOptions | None = None) -> dict:
        return self.synth.render_identity(text, voice, options)

    def _lookup(self, text: str, voice: Any, options: Any) -> CachedLine | None:
        try:
            return self.cache.lookup(self.synth, text, voice, options)
        except CacheError as e:
            log.warning("phrase cache lookup failed (%s); rendering", e)
            return None

    def _store(self, text: str, voice: Any, options: Any, audio: np.ndarray, record: Any) -> None:
        try:
            self.cache.store(self.synth, text, voice, options, audio, record, source="speaker")
        except Exception as e:  # a full disk must not cost the line
            log.warning("phrase cache: could not store a line (%s)", e)

    def synthesize(
        self,
        text: str,
        voice: Any = None,
        options: SynthesisOptions | None = None,
        cancel: CancelToken | None = None,
        **kwargs: Any,
    ) -> SynthesisResult:
        hit = self._lookup(text, voice, options)
        if hit is not None:
            check(cancel)
            return hit.result()
        opts = cache_options(options) if self.store == "all" else options
        result = self.synth.synthesize(text, voice, opts, cancel=cancel, **kwargs)
        if self.store == "all":
            self._store(text, voice, opts, result.audio, result.record)
        return result

    def stream(
        self,
        text: str,
        voice: Any = None,
        options: SynthesisOptions | None = None,
        cancel: CancelToken | None = None,
        **kwargs: Any,
    ) -> AudioStream:
        hit = self._lookup(text, voice, options)
        if hit is not None:
            check(cancel)
            return AudioStream(iter([hit.audio]), hit.record)
        opts = cache_options(options) if self.store == "all" else options
        inner = self.synth.stream(text, voice, opts, cancel=cancel, **kwargs)
        if self.store != "all":
            return inner

        def chunks() -> Iterator[np.ndarray]:
            parts: list[np.ndarray] = []
            try:
                for x in inner:
                    parts.append(np.asarray(x, dtype=np.float32).reshape(-1))
                    yield x
                if parts:  # only a line that finished is stored, never a cancelled part
                    self._store(text, voice, opts, np.concatenate(parts), inner.record)
            finally:
                inner.close()

        return AudioStream(chunks(), inner.record)

    def prewarm(self, voice: Any = None) -> float:
        return float(self.synth.prewarm(voice))
