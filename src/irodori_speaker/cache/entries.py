"""What the phrase cache hands out: a cached line, stats, a verify report, an entry's info,
and the SynthesisRecord <-> JSON of its index rows."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..audio.lipsync import Envelope
from ..options import SynthesisRecord, SynthesisResult


@dataclass(frozen=True)
class CachedLine:
    """A rendered line from the cache: its audio, record and lip-sync levels."""

    key: str
    text: str  # the normalised text spoken
    audio: np.ndarray  # float32 mono
    sample_rate: int
    record: SynthesisRecord
    levels: np.ndarray  # mouth-open level per 1/levels_hz s (audio.lipsync.mouth_levels)
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
    read_only: bool = False  # opened read-only: nothing is stored or counted

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
