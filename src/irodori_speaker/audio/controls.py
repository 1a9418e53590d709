"""Voice controls on the audio -> output side: pitch, loudness, volume, peak limit, silences.

The synthesizer calls `process_piece` on each rendered piece (whole: pitch, intonation and
loudness need all of it) when `needs_whole_piece(options)`; when volume is the only control it
streams each piece chunk by chunk through a `PieceGain` (the gain and a limiter whose gain only
falls within the piece); and `silence` for the line's pre / post silence and the pauses of the
text's markup (`text/pauses.py`). Order per piece:

1. pitch (`pitch` semitones) and intonation (`intonation`, a scale of the f0 contour's
   deviation from its median): WORLD (pyworld) Harvest analysis, each voiced frame's log f0
   moved to median + (log f0 - median) * intonation + st/12, resynthesis at the same length;
   the spectral envelope is kept, so the timbre and the rate stay.
2. loudness (`loudness` LUFS): the piece is scaled to that integrated loudness
   (ITU-R BS.1770 via pyloudnorm, `audio.signal.loudness_lufs`); silence is left alone.
3. volume (`volume` dB) on top: a relative gain (-100 dB is silence).
4. peak limit: a piece whose peak would pass `PEAK_CEILING` is scaled down to it
   (`audio.signal.peak_limit`) and a note says by how much: never clipped, never silently quieter.
   Streamed (`PieceGain`), the limiter cannot know the piece's peak before it comes: its gain
   falls, within a chunk, to what each new peak needs and never rises again in that piece, so
   from the piece's peak on the audio is the whole-piece path's and before it at most the
   limited dB louder, never over the ceiling; the note is the same, once per piece.

The option values are parsed and checked by `types.SynthesisOptions` (the parsers of the
"-16 LUFS" / "+3 dB" strings live here); the VOICEVOX scales map onto them here too.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import re
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from ..errors import InputError
from .signal import loudness_lufs, peak_limit

log = logging.getLogger("irodori_speaker.audio.controls")

PEAK_CEILING = 10 ** (-1.0 / 20)  # -1 dBFS: room for the inter-sample peaks of a lossy encoder
MUTE_DB = -100.0  # volume at (or below) this is silence (VOICEVOX volumeScale 0)
WORLD_FRAME_MS = 5.0
PITCH_INSTALL_HINT = "pitch needs pyworld: pip install 'irodori-speaker[controls]' (or pip install pyworld)"
# VOICEVOX multiplies each mora's log f0 (ln Hz) by 2**pitchScale, so its shift in semitones
# depends on the voice; we take the shift it gives a voice whose f0 is this (docs/server.md).
VOICEVOX_REFERENCE_F0 = 200.0

_NUMBER_UNIT = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+))\s*([a-zA-Z]*)\s*")


def _number_with_unit(value: Any, units: tuple[str, ...]) -> Any:
    """'-16 LUFS' -> -16.0 when the unit is one of `units` (case-insensitive); others unchanged."""
    if not isinstance(value, str):
        return value
    m = _NUMBER_UNIT.fullmatch(value)
    if m is None or m.group(2).lower() not in units:
        return value  # the option's check reports it
    return float(m.group(1))


def parse_loudness(value: Any) -> Any:
    """A loudness target: a number (LUFS) or a string like '-16 LUFS' / '-16 LKFS' / '-16'."""
    return _number_with_unit(value, ("lufs", "lkfs", ""))


def parse_volume(value: Any) -> Any:
    """A volume: a number (dB) or a string like '+3 dB' / '-6dB' / '-6'."""
    return _number_with_unit(value, ("db", ""))


def volume_from_scale(scale: float) -> float:
    """A linear amplitude scale (VOICEVOX volumeScale, 1.0 = unchanged) -> volume in dB."""
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
        raise InputError(f"volume scale must be a number >= 0, got {scale!r}")
    return MUTE_DB if scale <= 10 ** (MUTE_DB / 20) else max(MUTE_DB, 20.0 * math.log10(scale))


def pitch_from_voicevox(pitch_scale: float) -> float:
    """VOICEVOX pitchScale -> semitones: ln f0 * (2**s - 1) in octaves at VOICEVOX_REFERENCE_F0."""
    return 12.0 * math.log(VOICEVOX_REFERENCE_F0) * (2.0**pitch_scale - 1.0) / math.log(2.0)


def voicevox_pitch_scale(semitones: float) -> float:
    """The VOICEVOX pitchScale that `pitch_from_voicevox` turns into `semitones` (its inverse)."""
    return math.log2(1.0 + semitones * math.log(2.0) / (12.0 * math.log(VOICEVOX_REFERENCE_F0)))


def gain_of(volume_db: float) -> float:
    """The linear gain of a volume in dB (0 at MUTE_DB and below)."""
    return 0.0 if volume_db <= MUTE_DB else 10.0 ** (volume_db / 20.0)


# ---------------------------------------------------------------------------------------------
# pitch (pyworld)
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def pitch_available() -> bool:
    """Whether pyworld can be imported (checked once, without importing it)."""
    return importlib.util.find_spec("pyworld") is not None


def require_pitch(name: str = "pitch") -> None:
    """InputError with the install hint when pitch or intonation is asked for without pyworld."""
    if not pitch_available():
        raise InputError(
            f"option {name} needs the pyworld package, which is not installed", hint=PITCH_INSTALL_HINT
        )


def _pyworld() -> Any:
    try:
        with warnings.catch_warnings():
            # pyworld <= 0.3.5 reads its own version through the deprecated pkg_resources
            warnings.simplefilter("ignore", UserWarning)
            import pyworld
    except ImportError as e:
        hint = PITCH_INSTALL_HINT
        if getattr(e, "name", None) == "pkg_resources":
            hint = "pyworld 0.3.5 needs pkg_resources: pip install 'setuptools<81' (or pyworld >= 0.3.6)"
        raise InputError(f"option pitch: pyworld cannot be imported ({e})", hint=hint) from e
    return pyworld


def pitch_shift(
    audio: np.ndarray, sr: int, semitones: float, analysis: str = "harvest", *, intonation: float = 1.0
) -> np.ndarray:
    """`audio` (float32 mono) with its f0 moved by `semitones` and its intonation scaled by
    `intonation`, same length, via WORLD.

    Harvest f0 (`analysis="dio"`: DIO + StoneMask, about half the cost but with more octave
    errors on TTS speech: benchmarks/pitch_shift.py), CheapTrick envelope, D4C aperiodicity,
    resynthesis with each voiced frame's f0 at median * (f0 / median) ** intonation *
    2**(semitones/12) (the median over the voiced frames, in log f0: 0 is a monotone at the
    median, 2 doubles every rise and fall); unvoiced frames stay unvoiced.
    """
    if (semitones == 0.0 and intonation == 1.0) or len(audio) == 0:
        return audio
    if analysis not in ("harvest", "dio"):
        raise InputError(f"pitch analysis must be 'harvest' or 'dio', got {analysis!r}")
    pw = _pyworld()
    x = np.ascontiguousarray(audio, dtype=np.float64)
    if analysis == "harvest":
        f0, t = pw.harvest(x, sr, frame_period=WORLD_FRAME_MS)
    else:
        f0, t = pw.dio(x, sr, frame_period=WORLD_FRAME_MS)
        f0 = pw.stonemask(x, f0, t, sr)
    sp = pw.cheaptrick(x, f0, t, sr)
    ap = pw.d4c(x, f0, t, sr)
    y = pw.synthesize(_scaled_f0(f0, semitones, intonation), sp, ap, sr, WORLD_FRAME_MS)
    out = np.zeros(len(x), dtype=np.float32)  # WORLD's length is whole frames: cut or pad to ours
    n = min(len(x), len(y))
    out[:n] = y[:n]
    return out


def _scaled_f0(f0: np.ndarray, semitones: float, intonation: float) -> np.ndarray:
    """The f0 track with its voiced frames' log f0 scaled about their median, then shifted."""
    out = f0 * 2.0 ** (semitones / 12.0)
    voiced = f0 > 0
    if intonation != 1.0 and voiced.any():
        log_f0 = np.log2(f0[voiced])
        median = float(np.median(log_f0))
        out[voiced] = 2.0 ** (median + (log_f0 - median) * intonation + semitones / 12.0)
    return out


# ---------------------------------------------------------------------------------------------
# one piece, and silence
# ---------------------------------------------------------------------------------------------


def needs_processing(options: Any) -> bool:
    """Whether `process_piece` changes anything for these options."""
    return needs_whole_piece(options) or options.volume != 0.0


def needs_whole_piece(options: Any) -> bool:
    """Whether a piece must be decoded whole before it is processed: pitch and intonation (one
    WORLD analysis of the piece) and loudness (an integrated LUFS of the piece). Volume alone
    does not: `PieceGain` applies it chunk by chunk."""
    return options.pitch != 0.0 or getattr(options, "intonation", 1.0) != 1.0 or options.loudness is not None


def _limited_note(peak: float, notes: list[str] | None) -> None:
    """Say that a piece whose peak would have been `peak` was limited to PEAK_CEILING."""
    note = (
        f"peak-limited by {20 * math.log10(peak / PEAK_CEILING):.1f} dB (its peak would have been "
        f"{20 * math.log10(peak):+.1f} dBFS): lower volume/loudness to keep the level asked for"
    )
    log.info("a piece was %s", note)
    if notes is not None:
        notes.append("audio " + note)


class PieceGain:
    """`volume` and the peak limit of one piece, applied chunk by chunk as it streams.

    The limiter's gain starts at 1 and only falls: a chunk whose peak (after the volume) would
    pass PEAK_CEILING lowers it, ramped from the chunk's start down to what that peak needs (and
    never above what any sample before it needs), and it stays there for the rest of the piece.
    No sample passes the ceiling; `finish()` notes the limit as `process_piece` does, once.
    """

    def __init__(self, options: Any, notes: list[str] | None = None) -> None:
        self.gain = gain_of(options.volume)
        self.notes = notes
        self.limit = 1.0  # the limiter's gain at the end of the last chunk
        self.peak = 0.0  # the piece's peak so far, after the volume and before the limiter

    def __call__(self, chunk: np.ndarray) -> np.ndarray:
        x = np.asarray(chunk, dtype=np.float32)
        if len(x) == 0:
            return x
        if self.gain != 1.0:  # the same float64 product as process_piece: equal sample for sample
            x = (x.astype(np.float64) * self.gain).astype(np.float32)
        level = np.abs(x).astype(np.float64)
        top = int(np.argmax(level))
        self.peak = max(self.peak, float(level[top]))
        if self.limit * level[top] <= PEAK_CEILING:
            return x if self.limit == 1.0 else (x.astype(np.float64) * self.limit).astype(np.float32)
        target = PEAK_CEILING / float(level[top])  # below self.limit: it only falls
        ramp = np.full(len(x), target)
        ramp[: top + 1] = np.linspace(self.limit, target, top + 1)
        with np.errstate(divide="ignore"):
            needed = np.minimum.accumulate(np.minimum(PEAK_CEILING / level, self.limit))
        self.limit = target
        return (x.astype(np.float64) * np.minimum(ramp, needed)).astype(np.float32)

    def finish(self) -> None:
        """The piece has ended: note the limit if it engaged."""
        if self.peak > PEAK_CEILING:
            _limited_note(self.peak, self.notes)

    def chunks(self, decoded: Iterable[tuple[np.ndarray, bool]]) -> Iterator[tuple[np.ndarray, bool]]:
        """(chunk, is_last) of the piece with the gain applied as they come, then `finish()`."""
        for chunk, is_last in decoded:
            yield self(chunk), is_last
        self.finish()


def process_piece(audio: np.ndarray, sr: int, options: Any, notes: list[str] | None = None) -> np.ndarray:
    """Pitch, loudness, volume and peak limit of one rendered piece (see the module doc).

    `notes` collects what the caller should tell the user (a peak-limited piece)."""

    x = np.asarray(audio, dtype=np.float32)
    if len(x) == 0:
        return x
    intonation = getattr(options, "intonation", 1.0)
    if options.pitch != 0.0 or intonation != 1.0:
        x = pitch_shift(x, sr, options.pitch, intonation=intonation)
    gain = gain_of(options.volume)
    if options.loudness is not None and gain > 0.0:
        measured = loudness_lufs(x, sr)
        if math.isfinite(measured):
            gain *= 10.0 ** ((options.loudness - measured) / 20.0)
    if gain != 1.0:
        x = (x.astype(np.float64) * gain).astype(np.float32)
    peak = float(np.max(np.abs(x)))
    if peak > PEAK_CEILING:
        x = peak_limit(x, PEAK_CEILING)
        _limited_note(peak, notes)
    return x


def silence(seconds: float, sr: int) -> np.ndarray:
    """Exactly round(seconds * sr) samples of digital silence."""
    return np.zeros(round(seconds * sr), dtype=np.float32)
