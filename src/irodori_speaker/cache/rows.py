"""The phrase cache's index rows read back: every column checked for its type, then the audio
file the row names checked against it (size, checksum, sample count)."""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..options import SynthesisRecord
from .entries import CachedLine, record_from_json
from .files import AUDIO_FILE, AUDIO_FORMATS, AudioFiles, decode_audio

COLUMNS = (
    "key", "file", "format", "bytes", "sha256", "sample_rate", "samples", "text", "identity", "record",
    "levels", "levels_hz", "source", "created",
)  # fmt: skip
#: The columns of a row, in `COLUMNS` order, for a SELECT or an INSERT.
ROW = ", ".join(COLUMNS)


@dataclass(frozen=True)
class Row:
    """One index row, every column checked for its type (see `parse_row`)."""

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

    def line(self, audio: np.ndarray) -> CachedLine:
        """The entry as a cache hit, with its checked `audio`."""
        record = self.record
        record.extra["cache"] = {"hit": True, "key": self.key, "created": self.created, "source": self.source}
        return CachedLine(
            key=self.key,
            text=self.text,
            audio=audio,
            sample_rate=self.sample_rate,
            record=record,
            levels=self.levels,
            levels_hz=self.levels_hz,
            created=self.created,
            source=self.source,
            identity=self.identity,
        )


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_real(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def show(value: Any) -> str:
    """A column's value for a message, at most 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_row(row: tuple) -> Row | str:
    """The row as a `Row`, or why it is damaged (a rotted byte, a column of the wrong type).

    sqlite keeps whatever a stray write put in a column, so nothing read back is trusted.
    """
    key, rel, fmt, nbytes, sha, rate, samples, text, ident, rec, levels, hz, source, created = row
    checks = (
        ("key", isinstance(key, str)),
        ("file", isinstance(rel, str) and AUDIO_FILE.fullmatch(rel) is not None),
        ("format", fmt in AUDIO_FORMATS),
        ("bytes", is_int(nbytes) and nbytes > 0),
        ("sha256", isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha) is not None),
        ("sample_rate", is_int(rate) and rate > 0),
        ("samples", is_int(samples) and samples > 0),
        ("text", isinstance(text, str)),
        ("levels", isinstance(levels, bytes) and len(levels) % 4 == 0),
        ("levels_hz", is_real(hz) and hz > 0),
        ("source", isinstance(source, str)),
        ("created", is_real(created)),
        ("identity", isinstance(ident, str)),
        ("record", isinstance(rec, str)),
    )
    for name, ok in checks:
        if not ok:
            return f"index row is damaged: column {name!r} holds {show(row[COLUMNS.index(name)])}"
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
    return Row(
        key, rel, fmt, nbytes, sha, rate, samples, text, identity, record,
        np.frombuffer(levels, dtype="<f4").astype(np.float32), float(hz), source, float(created),
    )  # fmt: skip


def load_row(row: tuple, files: AudioFiles) -> tuple[Row, np.ndarray] | str:
    """The row and its audio, checked (types, size, checksum, sample count); else why not."""
    entry = parse_row(row)
    if isinstance(entry, str):
        return entry
    try:
        data = files.path(entry.file).read_bytes()
    except FileNotFoundError:
        return "audio file missing"
    except OSError as e:
        return f"audio file unreadable: {e}"
    if len(data) != entry.bytes:
        return f"audio file is {len(data)} bytes, the index says {entry.bytes} (truncated?)"
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        return "audio checksum mismatch (corrupted)"
    try:
        audio = decode_audio(data, entry.format)
    except Exception as e:  # a file that hashes right but does not decode: still never play it
        return f"audio does not decode: {e}"
    if len(audio) != entry.samples:
        return f"audio has {len(audio)} samples, the index says {entry.samples}"
    if not np.isfinite(audio).all():
        return "audio contains NaN or inf"
    return entry, audio
