"""When each mora and word of a line is heard: estimates for captions and lip sync.

The model gives no alignment, so the timing is estimated from the text: pyopenjtalk's reading
of the spoken text (`g2p_mapping`: morphemes with their phonemes and character spans), one
mean duration per phoneme (fitted to pyopenjtalk's own HTS voice, `PHONEME_SECONDS`), and
the line's real length: the estimate is stretched onto the voiced part of the audio the line
actually has (after tail trim; `speech_span` finds it). The Speaker turns these times into
events on the playback clock ("word", "viseme", "line_timing"); `captions.py` writes SRT,
WebVTT and an OBS caption file from them. How far this is from the truth is measured in
`benchmarks/timing_accuracy.py` (docs/text-and-readings.md, "Timing").

Words and captions show the line as written: given the `source` (`SynthesisRecord.source`),
each word's `text` is the source characters its spoken characters came from
(`source_spans.SourceMap`: "VTuber" for ブイチューバー, "15:30" for 15時30分), its `spoken`
the spoken surface and `reading` the kana; a rewritten run split over two words goes to the
first (the second's `text` is ""). Without a source, `text` is the spoken surface.

Without pyopenjtalk (the ``ja`` extra) `estimate_timing` returns None: nothing is guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Final

import numpy as np

from ..errors import InputError
from ..text.length import _load_pyopenjtalk
from .source_spans import SourceMap

__all__ = [
    "PHONEME_SECONDS",
    "VISEMES",
    "LineTiming",
    "Mora",
    "SpeechSpan",
    "Word",
    "estimate_timing",
    "speech_span",
]

# Mean phoneme durations of pyopenjtalk's HTS voice (mei_normal) on the 50 sentences of
# benchmarks/duration_estimate.py, from the voice's own per-label durations
# (`python benchmarks/timing_accuracy.py --fit`, 2026-12-03). Only ratios matter: the line
# is stretched to its real length.
PHONEME_SECONDS: Final[dict[str, float]] = {
    "a": 0.0835, "i": 0.0739, "u": 0.0678, "e": 0.093, "o": 0.0817, "N": 0.0506, "cl": 0.0791,
    "pau": 0.4138, "b": 0.0485, "ch": 0.1019, "d": 0.041, "f": 0.0914, "g": 0.0511, "gy": 0.08,
    "h": 0.0839, "j": 0.0675, "k": 0.0794, "ky": 0.0894, "m": 0.0541, "n": 0.0472, "p": 0.06,
    "py": 0.055, "r": 0.0312, "ry": 0.03, "s": 0.1039, "sh": 0.0984, "t": 0.0607, "ts": 0.1023,
    "w": 0.0422, "y": 0.0546, "z": 0.075,
}  # fmt: skip
CONSONANT_SECONDS: Final = 0.066  # a consonant not in the table (their mean)
FINAL_LENGTHENING: Final = 1.79  # a vowel before a pause or the end of the line is this much longer
VOWELS: Final = frozenset("aiueo")
VISEMES: Final = ("a", "i", "u", "e", "o", "closed")
_LIP_CLOSING: Final = frozenset(("m", "my", "b", "by", "p", "py"))  # lips shut before the vowel
_SMALL: Final = frozenset("ァィゥェォャュョヮヵヶ")


@dataclass(frozen=True)
class Mora:
    """One mora: its kana, its vowel ("a".."o", "N", "cl"), when it starts and ends (seconds
    into the line's audio), and the consonant's share of it (lips shut for m/b/p)."""

    kana: str
    vowel: str
    start: float
    end: float
    consonant: str = ""
    vowel_start: float = 0.0  # where the vowel begins (after the consonant)


@dataclass(frozen=True)
class Word:
    """A word (a morpheme with something to say): its text as written (see the module doc),
    reading, span in the spoken text and spoken surface, and when it is heard (seconds into
    the line's audio)."""

    text: str
    reading: str
    start: float
    end: float
    char_start: int
    char_end: int
    spoken: str = ""  # the spoken text's characters char_start:char_end


@dataclass(frozen=True)
class LineTiming:
    """Estimated timing of one line; times are seconds from the line's first sample. `text` is
    the spoken text (the char spans index it), `source` its alignment to the line as written."""

    text: str
    duration: float
    words: tuple[Word, ...]
    moras: tuple[Mora, ...]
    source: SourceMap | None = None

    def shown(self, start: int, end: int) -> str:
        """What captions show for the spoken characters start:end (the source's, when known)."""
        return self.text[start:end] if self.source is None else self.source.source_text(start, end)

    def visemes(self) -> list[tuple[float, str]]:
        """(time, viseme) changes: あいうえお as "a".."o", and "closed" for ん, っ, pauses,
        lips shut before m/b/p and the end of the line. Consecutive repeats are merged."""
        out: list[tuple[float, str]] = []

        def put(t: float, v: str) -> None:
            if not out or out[-1][1] != v:
                out.append((round(t, 4), v))

        prev_end = 0.0
        for m in self.moras:
            if m.start - prev_end > 0.03:
                put(prev_end, "closed")  # a pause between moras
            if m.vowel in VOWELS:
                if m.consonant in _LIP_CLOSING:
                    put(m.start, "closed")
                put(m.vowel_start if m.consonant in _LIP_CLOSING else m.start, m.vowel)
            else:  # ん and っ: mouth (nearly) shut
                put(m.start, "closed")
            prev_end = m.end
        put(prev_end, "closed")
        return out

    def shifted(self, offset: float) -> LineTiming:
        """The same timing `offset` seconds later (e.g. onto a clock)."""
        return replace(
            self,
            words=tuple(replace(w, start=w.start + offset, end=w.end + offset) for w in self.words),
            moras=tuple(
                replace(m, start=m.start + offset, end=m.end + offset, vowel_start=m.vowel_start + offset)
                for m in self.moras
            ),
        )


class SpeechSpan:
    """Where the voice is in a line's audio, fed chunk by chunk (10 ms RMS frames kept)."""

    def __init__(self, sample_rate: int, frame_s: float = 0.01, below_peak_db: float = 35.0) -> None:
        self.sample_rate = sample_rate
        self.frame = max(1, round(sample_rate * frame_s))
        self.below_peak_db = below_peak_db
        self._rms: list[float] = []
        self._rest = np.zeros(0, dtype=np.float32)
        self.samples = 0

    def add(self, chunk: np.ndarray) -> None:
        x = np.concatenate([self._rest, np.asarray(chunk, dtype=np.float32).reshape(-1)])
        self.samples += len(chunk)
        n = len(x) // self.frame
        if n:
            frames = x[: n * self.frame].reshape(n, self.frame).astype(np.float64)
            self._rms.extend(np.sqrt(np.mean(frames * frames, axis=1)).tolist())
        self._rest = x[n * self.frame :]

    def span(self) -> tuple[float, float]:
        """(start, end) seconds of the voiced part: frames within `below_peak_db` of the peak."""
        total = self.samples / self.sample_rate
        rms = np.asarray(self._rms)
        if len(rms) == 0 or rms.max() <= 0:
            return 0.0, total
        loud = np.flatnonzero(rms >= rms.max() * 10 ** (-self.below_peak_db / 20))
        frame_s = self.frame / self.sample_rate
        return float(loud[0] * frame_s), min(total, float((loud[-1] + 1) * frame_s))


def speech_span(audio: np.ndarray, sample_rate: int) -> tuple[float, float]:
    """(start, end) seconds of the voiced part of `audio` (see `SpeechSpan`)."""
    s = SpeechSpan(sample_rate)
    s.add(audio)
    return s.span()


def _mora_kana(pron: str) -> list[str]:
    out: list[str] = []
    for ch in pron:
        if ch in _SMALL and out:
            out[-1] += ch
        elif "\u30a0" <= ch <= "\u30ff" or ch == "ー":
            out.append(ch)
    return out


def _phoneme_seconds(p: str) -> float:
    low = p.lower()
    key = low if low in VOWELS else p
    return PHONEME_SECONDS.get(key, PHONEME_SECONDS.get("C", CONSONANT_SECONDS))


def estimate_timing(
    text: str, duration: float, *, speech: tuple[float, float] | None = None, source: str | None = None
) -> LineTiming | None:
    """The timing of `text` (the spoken text, `SynthesisRecord.text`) spoken in `duration`
    seconds of audio, the voice filling `speech` = (start, end) of it (default: all of it);
    `source` (`SynthesisRecord.source`): the line as written, which words and captions show.
    None when pyopenjtalk is not installed or the text has nothing to read."""

    values = (duration, *(speech or ()))
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise InputError(
            f"estimate_timing needs finite seconds, got duration={duration!r}, speech={speech!r}",
            hint="pass the audio's length: len(audio) / sample_rate",
        )
    pj = _load_pyopenjtalk()
    if pj is None or not text.strip() or not duration > 0:
        return None
    units: list[tuple[str, float, int]] = []  # (phoneme, seconds, index of its morpheme)
    entries = pj.g2p_mapping(text)
    for k, e in enumerate(entries):
        for p in e["phonemes"]:
            units.append((p, _phoneme_seconds(p), k))
    while units and units[-1][0] == "pau":  # the final 。 is the line's end, not a pause in it
        units.pop()
    while units and units[0][0] == "pau":
        units.pop(0)
    for j, (p, secs, k) in enumerate(units):  # phrase-final lengthening
        if p.lower() in VOWELS and (j + 1 == len(units) or units[j + 1][0] == "pau"):
            units[j] = (p, secs * FINAL_LENGTHENING, k)
    if not units:
        return None
    start, end = speech if speech is not None else (0.0, duration)
    start, end = max(0.0, start), min(duration, end)
    if not end > start:
        start, end = 0.0, duration
    scale = (end - start) / sum(u[1] for u in units)
    t = start
    moras: list[Mora] = []
    words: dict[int, list[float]] = {}
    mora_of_word: dict[int, list[Mora]] = {}
    consonant, c_start = "", None
    for p, secs, k in units:
        d = secs * scale
        if p == "pau":
            consonant, c_start = "", None
            t += d
            continue
        low = p.lower()
        if low in VOWELS or p in ("N", "cl"):
            m_start = c_start if c_start is not None else t
            mora = Mora("", low if low in VOWELS else p, m_start, t + d, consonant, t)
            moras.append(mora)
            mora_of_word.setdefault(k, []).append(mora)
            span = words.setdefault(k, [m_start, t + d])
            span[1] = t + d
            consonant, c_start = "", None
        else:
            if c_start is None:
                c_start = t
            consonant = low
        t += d
    smap = SourceMap.align(source, text) if source and source != text else None
    out_words = []
    named: list[Mora] = []
    for k, (w_start, w_end) in sorted(words.items()):
        e = entries[k]
        ms = mora_of_word[k]
        kana = _mora_kana(e["pron"])
        if len(kana) == len(ms):
            ms = [replace(m, kana=s) for m, s in zip(ms, kana, strict=True)]
        named.extend(ms)
        a, b = e["char_span"]
        shown = text[a:b] if smap is None else smap.source_text(a, b)
        out_words.append(Word(shown, e["pron"].replace("’", ""), w_start, w_end, a, b, text[a:b]))
    return LineTiming(text, duration, tuple(out_words), tuple(named), smap)
