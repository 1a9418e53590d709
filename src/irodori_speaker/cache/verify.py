"""`PhraseCache.verify`: every entry's audio against its checksum; orphan and temp files."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..errors import CacheError
from .entries import VerifyReport
from .index import _ROW, _show

if TYPE_CHECKING:
    from .store import PhraseCache


def verify(
    cache: PhraseCache,
    *,
    repair: bool,
    grace_s: float,
    on_entry: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """See `PhraseCache.verify`."""
    report = VerifyReport(repaired=repair)
    try:
        rowids = [r[0] for r in cache._conn().execute("SELECT rowid FROM entries").fetchall()]
    except sqlite3.Error as e:
        raise CacheError(f"cannot read the cache index: {e}") from e
    for i, rowid in enumerate(rowids):
        try:
            row = cache._conn().execute(f"SELECT {_ROW} FROM entries WHERE rowid=?", (rowid,)).fetchone()
        except sqlite3.Error as e:
            raise CacheError(f"cannot read the cache index: {e}") from e
        report.checked += 1
        if row is None:  # gone meanwhile (another process evicted it)
            pass
        elif isinstance(why := cache._load(row), str):
            key, text = row[0], row[7]
            report.bad.append((str(key), text if isinstance(text, str) else _show(text), why))
            if repair:
                cache._drop(key, row[1], why)
        else:
            report.ok += 1
        if on_entry is not None:
            on_entry(i + 1, len(rowids))
    if repair:
        report.temp_removed = cache._sweep_temp(grace_s)
        report.orphans_removed = _sweep_orphans(cache, grace_s)
    return report


def _sweep_orphans(cache: PhraseCache, grace_s: float) -> int:
    # A writer renames its file into place a moment before it commits the row, so only
    # files older than grace_s count as orphans.
    try:
        known = {r[0] for r in cache._conn().execute("SELECT file FROM entries")}
    except sqlite3.Error as e:
        raise CacheError(f"cannot read the cache index: {e}") from e
    removed = 0
    now = time.time()
    audio = cache.directory / "audio"
    for p in audio.rglob("*"):
        if not p.is_file():
            continue
        rel = p.relative_to(cache.directory).as_posix()
        if rel in known:
            continue
        with contextlib.suppress(OSError):
            if now - p.stat().st_mtime > grace_s:
                p.unlink()
                removed += 1
    return removed
