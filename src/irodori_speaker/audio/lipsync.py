"""Mouth-open levels from audio: windowed RMS on a dB scale, mapped to [0, 1].

`mouth_levels()` renders a whole line at a frame rate (50 Hz by default).
`Envelope` is the incremental form the Speaker uses while a line streams in:
it grows with each chunk and answers "how open is the mouth at t seconds into
the line", so the level can be read at the moment the sound card plays it.
The dB mapping (floor -> 0, ceil -> 1) follows loudness as heard, so quiet
syllables still move the mouth; a release time keeps it from flickering shut
between morae.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import InputError

FLOOR_DB = -50.0
CEIL_DB = -18.0


def level_from_rms(rms: float, floor_db: float = FLOOR_DB, ceil_db: float = CEIL_DB) -> float:
    """Map an RMS amplitude (full scale 1.0) to a mouth-open level in [0, 1]."""
    if rms <= 0.0:
        return 0.0
    db = 20.0 * math.log10(rms)
    return min(1.0, max(0.0, (db - floor_db) / (ceil_db - floor_db)))


def mouth_levels(
    audio: np.ndarray,
    sample_rate: int,
    hz: float = 50.0,
    floor_db: float = FLOOR_DB,
    ceil_db: float = CEIL_DB,
) -> np.ndarray:
    """One level per 1/hz frame of `audio` (the last frame may be partial), no smoothing."""
    if hz <= 0 or sample_rate <= 0:
        raise InputError(f"hz and sample_rate must be positive, got {hz}, {sample_rate}")
    if ceil_db <= floor_db:
        raise InputError(f"ceil_db ({ceil_db}) must be above floor_db ({floor_db})")
    x = np.asarray(audio, dtype=np.float64).reshape(-1)
    frame = max(1, round(sample_rate / hz))
    n = math.ceil(len(x) / frame)
    out = np.zeros(n, dtype=np.float32)
    for i in range(n):
        seg = x[i * frame : (i + 1) * frame]
        out[i] = level_from_rms(float(np.sqrt(np.mean(seg * seg))), floor_db, ceil_db)
    return out


class Envelope:
    """A line's audio as it arrives, with the mouth level at any time into it."""

    def __init__(
        self,
        sample_rate: int,
        hz: float = 50.0,
        release_s: float = 0.08,
        floor_db: float = FLOOR_DB,
        ceil_db: float = CEIL_DB,
    ) -> None:
        self.sample_rate = sample_rate
        self.window = max(1, round(sample_rate / hz))
        self.frame_s = 1.0 / hz
        self.release_s = release_s
        self.floor_db = floor_db
        self.ceil_db = ceil_db
        self._buf = np.zeros(0, dtype=np.float32)
        self._n = 0
        self._last = 0.0
        self._last_t: float | None = None

    @property
    def samples(self) -> int:
        return self._n

    def append(self, chunk: np.ndarray) -> None:
        need = self._n + len(chunk)
        if need > len(self._buf):
            grown = np.zeros(max(need, 2 * len(self._buf), self.sample_rate), dtype=np.float32)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        self._buf[self._n : need] = chunk
        self._n = need

    def raw_level(self, t: float) -> float:
        """Level of the window centred on `t` seconds into the line (0 outside the audio)."""
        centre = round(t * self.sample_rate)
        lo = max(0, centre - self.window // 2)
        hi = min(self._n, lo + self.window)
        if hi <= lo:
            return 0.0
        seg = self._buf[lo:hi]
        return level_from_rms(float(np.sqrt(np.dot(seg, seg) / len(seg))), self.floor_db, self.ceil_db)

    def level(self, t: float) -> float:
        """Smoothed level at `t`: opens at once, closes with the release time constant."""
        raw = self.raw_level(t)
        if self._last_t is not None and t > self._last_t and self.release_s > 0:
            decayed = self._last * math.exp(-(t - self._last_t) / self.release_s)
            raw = max(raw, decayed)
        self._last, self._last_t = raw, t
        return raw
