"""`PhraseCache.verify`: every entry's audio against its checksum; orphan and temp files."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .entries import VerifyReport
from .files import AudioFiles
from .index import Index
from .rows import load_row, show

#: drop(key, file, why): remove a damaged entry (its row and its file).
DropFn = Callable[[Any, Any, str], None]


def verify(
    index: Index,
    files: AudioFiles,
    drop: DropFn,
    *,
    repair: bool,
    grace_s: float,
    on_entry: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """Check every row of `index` and the file it names; with `repair`, `drop` the bad ones and
    remove orphan audio files and stale temp files older than `grace_s`. See `PhraseCache.verify`."""
    report = VerifyReport(repaired=repair)
    rowids = index.rowids()
    for i, rowid in enumerate(rowids):
        row = index.row_at(rowid)
        report.checked += 1
        if row is None:  # gone meanwhile (another process evicted it)
            pass
        elif isinstance(why := load_row(row, files), str):
            key, text = row[0], row[7]
            report.bad.append((str(key), text if isinstance(text, str) else show(text), why))
            if repair:
                drop(key, row[1], why)
        else:
            report.ok += 1
        if on_entry is not None:
            on_entry(i + 1, len(rowids))
    if repair:
        report.temp_removed = files.sweep_temp(grace_s)
        report.orphans_removed = files.sweep_orphans(index.files(), grace_s)
    return report
