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

A cache on a read-only file system (a prebuilt one shipped in a container image) opens
read-only (`read_only`, detected, or asked for): hits are served, nothing is stored, counted,
dropped or evicted, and opening it logs one line saying so.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..audio.lipsync import mouth_levels
from ..audio.signal import SAMPLE_RATE
from ..cancel import CancelToken
from ..errors import CacheError, InputError
from ..options import SynthesisOptions, SynthesisRecord
from ..options.memory import format_bytes
from .entries import CachedLine, CacheStats, EntryInfo, VerifyReport, record_from_json, record_to_json
from .files import (
    AUDIO_FORMATS,
    AudioFiles,
    decode_audio,
    default_cache_dir,
    encode_audio,
    parse_size,
)
from .index import INDEX_NAME, Index
from .keys import canonical_json, identity_key, line_identity
from .policy import CachedRender, CachedSynthesizer
from .rows import load_row, parse_row, show
from .verify import verify

log = logging.getLogger("irodori_speaker.cache")

DEFAULT_MAX_BYTES = 2 * 1024**3
LIPSYNC_HZ = 50.0
TMP_GRACE_S = 3600.0  # temp files older than this are leftovers of a crashed writer
ORPHAN_GRACE_S = 300.0  # audio files without a row are removed by verify() after this age
_READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)


def _cannot_write(directory: Path) -> bool:
    """An existing cache this process cannot change: its folder (or index) not writable."""
    index = directory / INDEX_NAME
    if not index.is_file():
        return False
    return not os.access(directory, os.W_OK) or not os.access(index, os.W_OK)


class PhraseCache:
    """A crash-safe, multi-process disk cache of rendered lines with an LRU size limit.

    `directory`: where it lives (default `default_cache_dir()`). `max_bytes`: audio size
    limit (None: the limit last stored in this cache, else `DEFAULT_MAX_BYTES`); puts evict
    the least recently used entries until under it. `audio_format`: "f32" (exact) or
    "flac" (24-bit, smaller) for new entries; both are read. `timeout_s`: how long a
    write waits for another process's write.

    It composes the sqlite index (`index.Index`) and the audio files (`files.AudioFiles`);
    rendering on a miss is `policy.CachedRender`, which `render`, `store` and `wrap` use.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        max_bytes: int | str | None = None,
        audio_format: str = "f32",
        lipsync_hz: float = LIPSYNC_HZ,
        timeout_s: float = 10.0,
        read_only: bool | None = None,
    ) -> None:
        if audio_format not in AUDIO_FORMATS:
            raise InputError(f"audio_format must be one of {AUDIO_FORMATS}, got {audio_format!r}")
        if not lipsync_hz > 0:
            raise InputError(f"lipsync_hz must be > 0, got {lipsync_hz!r}")
        self.directory = Path(directory).expanduser() if directory is not None else default_cache_dir()
        self.audio_format = audio_format
        self.lipsync_hz = float(lipsync_hz)
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._session = {"hits": 0, "misses": 0}
        self._warned: set[Any] = set()  # keys of damaged rows already logged
        self._files = AudioFiles(self.directory)
        self.read_only = _cannot_write(self.directory) if read_only is None else bool(read_only)
        if not self.read_only:
            try:
                self._files.create()
            except OSError as e:
                if not (self.directory / INDEX_NAME).is_file() or e.errno not in _READ_ONLY_ERRNOS:
                    raise CacheError(f"cannot create the phrase cache at {self.directory}: {e}") from e
                self.read_only = True
        self._index = Index(self.directory, self.timeout_s, read_only=self.read_only)
        self.index_path = self._index.path
        stored = self._index.meta("max_bytes")
        if max_bytes is None:
            self.max_bytes = int(stored) if stored else DEFAULT_MAX_BYTES
        else:
            self.max_bytes = parse_size(max_bytes)
            if stored != str(self.max_bytes) and not self.read_only:
                self._index.set_meta("max_bytes", str(self.max_bytes))
        if self.read_only:
            log.warning("phrase cache %s is read-only: serving its lines, storing nothing", self.directory)
        else:
            self._files.sweep_temp(TMP_GRACE_S)

    def __enter__(self) -> PhraseCache:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        ro = ", read_only=True" if self.read_only else ""
        return f"PhraseCache({str(self.directory)!r}, max_bytes={self.max_bytes}{ro})"

    def close(self) -> None:
        """Close every connection (any thread's). Further use raises CacheError."""
        self._index.close()

    # ---- lines: keys, lookup, render ----------------------------------------------------------
    def identity(
        self, synth: Any, text: str, voice: Any = None, options: SynthesisOptions | None = None
    ) -> dict:
        """What the key of this line covers (see `line_identity`)."""
        return line_identity(synth, text, voice, options)

    def key(self, synth: Any, text: str, voice: Any = None, options: SynthesisOptions | None = None) -> str:
        return identity_key(self.identity(synth, text, voice, options))

    def lookup(
        self, synth: Any, text: str, voice: Any = None, options: SynthesisOptions | None = None
    ) -> CachedLine | None:
        """The stored line for (text, voice, options) on `synth`'s model, or None. No model work.

        A `seed=None` line is looked up under `DEFAULT_SEED`.
        """
        return self.get(self.key(synth, text, voice, options))

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
        kwargs = {"progress": progress} if progress is not None else {}
        cached = CachedRender(self, synth, store="all", source=source, strict=not self.read_only)
        rendered = cached.render(text, voice, options, cancel=cancel, **kwargs)
        if rendered.line is None:  # read-only: a miss is rendered and handed back, not stored
            res = rendered.result
            audio = np.ascontiguousarray(res.audio, dtype=np.float32)
            slot = cached.slot(text, voice, options)
            levels = mouth_levels(audio, res.sample_rate, hz=self.lipsync_hz).astype(np.float32)
            line = CachedLine(
                slot.key, res.record.text, audio, int(res.sample_rate), res.record, levels,
                self.lipsync_hz, time.time(), source, slot.identity,
            )  # fmt: skip
            return line, False
        return rendered.line, rendered.hit

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
        cached = CachedRender(self, synth, store="all", source=source, strict=True)
        line = cached.store(cached.slot(text, voice, options), audio, record)
        assert line is not None  # strict: a line that is not stored raises
        return line

    def wrap(self, synth: Any, *, store: str = "prebuilt") -> CachedSynthesizer:
        """`synth` answering from this cache first (a SynthesizerLike; see `CachedSynthesizer`)."""
        return CachedSynthesizer(synth, self, store=store)

    # ---- entries by key -----------------------------------------------------------------------
    def get(self, key: str) -> CachedLine | None:
        """The entry `key`, verified against its checksum; None (a miss) if absent or damaged."""
        line = self._read(key)
        name = "hits" if line is not None else "misses"
        with self._lock:
            self._session[name] += 1
        self._index.count(name, key if line is not None else None)
        return line

    def contains(self, key: str, *, verify: bool = False) -> bool:
        """Is `key` stored? `verify=True` also checks its audio (dropping it if damaged).

        Does not count as a hit or miss, nor refresh its LRU position.
        """
        if verify:
            return self._read(key) is not None
        row = self._index.row(key)
        if row is None:
            return False
        why = parse_row(row)
        if isinstance(why, str):  # a rotted row is not an entry: drop it so it is rendered again
            self._drop(row[0], row[1], why)
            return False
        return True

    def _read(self, key: str) -> CachedLine | None:
        row = self._index.row(key)
        if row is None:
            return None
        loaded = load_row(row, self._files)
        if isinstance(loaded, str):
            self._drop(row[0], row[1], loaded)
            return None
        entry, audio = loaded
        return entry.line(audio)

    def _drop(self, key: Any, rel: Any, why: str) -> None:
        """Delete the row (key, rel) and its audio file. The values are compared as sqlite holds
        them, so a row with a damaged column is found too; its file is only removed when the
        row named a file of this cache."""
        if key not in self._warned:  # once: a row that cannot be deleted (read-only) stays quiet
            self._warned.add(key)
            verb = "skipping" if self.read_only else "dropping"
            log.warning("phrase cache: %s entry %s: %s", verb, show(key)[:18], why)
        if self.read_only:  # served as a miss, left as it is
            return
        try:
            gone = self._index.delete(key, rel)
        except CacheError as e:
            log.warning("phrase cache: could not drop %s: %s", show(key)[:18], e)
            return
        if gone:  # the row named exactly this file, so nothing else refers to it
            self._files.unlink(rel)

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
        if not isinstance(key, str) or not re.fullmatch(r"[0-9a-f]{16,128}", key):
            raise InputError(f"cache keys are lowercase hex digests, got {key!r}")
        if self.read_only:
            raise self._index._refuse("store a line")
        x = np.asarray(audio)
        if x.ndim != 1 or x.size == 0:
            raise InputError(f"cached audio must be non-empty mono (samples,), got shape {x.shape}")
        x = np.ascontiguousarray(x, dtype=np.float32)
        if not np.isfinite(x).all():
            raise InputError("audio with NaN or inf is not cached")
        data = encode_audio(x, sample_rate, self.audio_format)
        if len(data) > self.max_bytes:
            raise CacheError(
                f"a {format_bytes(len(data))} line does not fit the cache limit of "
                f"{format_bytes(self.max_bytes)}",
                hint="raise --max-bytes",
            )
        stored_audio = x if self.audio_format == "f32" else decode_audio(data, self.audio_format)
        sha = hashlib.sha256(data).hexdigest()
        levels = mouth_levels(stored_audio, sample_rate, hz=self.lipsync_hz).astype("<f4")
        if text is None:
            text = (identity or {}).get("line", {}).get("text") or (record.text if record else "")
        rel = f"audio/{key[:2]}/{key}.{sha[:12]}.{self.audio_format}"
        self._files.write(rel, data)
        now = time.time()
        rec_json = record_to_json(record)
        ident_json = canonical_json(identity or {})
        values = (
            key, rel, self.audio_format, len(data), sha, int(sample_rate), len(stored_audio), text,
            ident_json, rec_json, levels.tobytes(), self.lipsync_hz, source, now, now,
        )  # fmt: skip
        try:
            old, evicted = self._index.insert(values, self.max_bytes)
        except BaseException:
            if self._index.file_of(key) != rel:  # unless the row that is still there names it
                self._files.unlink(rel)
            raise
        for f in [*evicted, *([old] if old and old != rel else [])]:
            self._files.unlink(f)
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

    # ---- maintenance --------------------------------------------------------------------------
    def stats(self) -> CacheStats:
        n, total, seconds, counters = self._index.totals()
        with self._lock:
            session = dict(self._session)
        return CacheStats(
            directory=str(self.directory),
            entries=n,
            bytes=total,
            max_bytes=self.max_bytes,
            audio_seconds=seconds,
            session_hits=session["hits"],
            session_misses=session["misses"],
            read_only=self.read_only,
            **counters,
        )

    def entries(self, limit: int | None = None, order: str = "last_used") -> list[EntryInfo]:
        """Entries, most recently used first (`order`: last_used, hits, bytes or created)."""
        return self._index.entries(limit, order)

    def remove(self, key: str) -> bool:
        """Remove the entry `key` (its row and audio file); False when there was none."""
        row = self._index.row(key)
        if row is None:
            return False
        gone = self._index.delete(row[0], row[1], dropped=False)
        if gone:
            self._files.unlink(row[1])
        return bool(gone)

    def evict(self, max_bytes: int | str | None = None) -> int:
        """Evict LRU entries until under `max_bytes` (default: the limit); returns how many."""
        limit = self.max_bytes if max_bytes is None else parse_size(max_bytes)
        files = self._index.evict(limit)
        for f in files:
            self._files.unlink(f)
        return len(files)

    def verify(
        self,
        *,
        repair: bool = True,
        grace_s: float = ORPHAN_GRACE_S,
        on_entry: Callable[[int, int], None] | None = None,
    ) -> VerifyReport:
        """Check every entry's audio against its checksum; with `repair`, drop the bad ones and
        remove orphan audio files and stale temp files older than `grace_s`."""
        repair = repair and not self.read_only  # read-only: report only
        return verify(self._index, self._files, self._drop, repair=repair, grace_s=grace_s, on_entry=on_entry)

    def clear(self) -> tuple[int, int]:
        """Remove every entry (and reset the counters). Returns (entries, bytes) removed."""
        rows = self._index.clear()
        for rel, _ in rows:
            self._files.unlink(rel)
        self._files.sweep_temp(TMP_GRACE_S)
        with self._lock:
            self._session = {"hits": 0, "misses": 0}
        return len(rows), int(sum(b for _, b in rows))
