"""The phrase cache's sqlite index: its schema and the checks every row read back goes through."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..options import SynthesisRecord
from .entries import record_from_json
from .files import AUDIO_FORMATS

#: Version of the index layout (tables); a newer index is refused, not rewritten.
SCHEMA_VERSION = 1
INDEX_NAME = "index.sqlite3"

_COUNTERS = ("hits", "misses", "stores", "evictions", "dropped")


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
