"""An AudioQuery on our model: what it asks the options pipeline for, and its moras re-estimated.

An AudioQuery is built from pyopenjtalk's accent phrases with estimated lengths. At
synthesis the model reads the query's `kana` (the original text, as AivisSpeech does)
when its moras are the ones that text gives, else the moras' own reading (a client that
edited readings is heard). Edited lengths scale the length the model is asked for by
(query's speech length / our estimate). The scales are the options pipeline's controls
(`plan_query`): speedScale -> speed, pitchScale -> pitch, intonationScale -> intonation,
volumeScale -> volume, pre/postPhonemeLength -> pre/post_silence; pauseLength /
pauseLengthScale become pause markup (`text/pauses.py`), so the line is split there into
pieces joined by exact silence.

A scale beyond its option's range (`schemas.QUERY_RANGES`; VOICEVOX sets no bound) is clamped
into it and named in `Plan.warnings` (the route's `Warning` header); AivisSpeech's
`tempoDynamicsScale` is ignored the same way. The audio a query asks for is capped in
proportion to the text limit (`QUERY_S_PER_CHAR` per `--max-text-chars`): a query cannot ask
for more than a text the server accepts gives.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

from ...audio.controls import pitch_from_voicevox, volume_from_scale
from ...errors import InputError
from ...options import SynthesisOptions, option_specs
from ...text import prosody
from ...text.length import MORAE_PER_SECOND, PAUSE_S
from ...text.pauses import MAX_PAUSE_S, canonical, strip_markup
from .. import schemas as S
from ..audio_out import PostProcess
from ..state import AppState

_PAUSE_SPLIT = re.compile(r"(?<=[、。，．,.!?！？…])")
_PITCH = option_specs(SynthesisOptions)["pitch"].check
QUERY_S_PER_CHAR = 0.25  # a text gives at most ~2 moras per character (numbers, kanji): 0.24 s
# the options a query's fields become, for errors that name the field the client sent
_FIELD_OF = {
    "pitch": "pitchScale",
    "intonation": "intonationScale",
    "volume": "volumeScale",
    "pre_silence": "prePhonemeLength",
    "post_silence": "postPhonemeLength",
    "duration_scale": "the moras' lengths",
    "speed": "speedScale",
}
log = logging.getLogger("irodori_speaker.server")
_said: set[str] = set()  # what has been logged once per process


@dataclasses.dataclass
class Plan:
    """What one AudioQuery asks for: the text (with pause markup where the query's pauses are
    exact), the SynthesisOptions (speed, pitch, volume, silences) and the output format."""

    text: str
    options: Any
    post: PostProcess
    warnings: list[str] = dataclasses.field(default_factory=list)

    def headers(self) -> dict[str, str]:
        return warning_headers(self.warnings)


def warning_headers(warnings: list[str]) -> dict[str, str]:
    """A `Warning` header (RFC 9111's 299, "miscellaneous persistent warning") when a value
    was clamped or ignored."""
    if not warnings:
        return {}
    text = "; ".join(warnings).replace('"', "'")
    return {"Warning": f'299 irodori-speaker "{text}"'}


def _clamp(q: S.AudioQuery, name: str, warnings: list[str]) -> float:
    value = float(getattr(q, name))
    lo, hi = S.QUERY_RANGES[name]
    kept = min(hi, max(lo, value))
    if kept != value:
        warnings.append(f"{name} {value:g} clamped to {kept:g} (our range {lo:g}..{hi:g})")
    return kept


def _once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.warning(message)


def _phrase_moras(phrases: list[Any]) -> list[tuple[tuple[str, ...], bool]]:
    return [(tuple(m.text for m in p.moras), p.pause_mora is not None) for p in phrases]


def plan_query(state: AppState, q: S.AudioQuery, readings: dict[str, Any] | None = None) -> Plan:
    """Map an AudioQuery onto the options pipeline (raises InputError on what we cannot honour).

    speedScale -> speed, pitchScale -> pitch (semitones, `audio.controls.pitch_from_voicevox`),
    intonationScale -> intonation (the same scale of log f0 about its median),
    volumeScale -> volume (dB), pre/postPhonemeLength (divided by speedScale, as VOICEVOX
    does) -> pre/post_silence, pauseLength / pauseLengthScale -> pause markup between the pieces.
    `readings`: the request's readings options (server/readings.py)."""
    warnings: list[str] = []
    speed = _clamp(q, "speedScale", warnings)
    if q.tempoDynamicsScale is not None and q.tempoDynamicsScale != 1.0:
        warnings.append(f"tempoDynamicsScale {q.tempoDynamicsScale:g} ignored (not supported)")
        _once("AivisSpeech's tempoDynamicsScale is not supported: ignored (a Warning header says so)")
    post = PostProcess(rate=q.outputSamplingRate, stereo=q.outputStereo)
    semitones = pitch_from_voicevox(_clamp(q, "pitchScale", warnings))
    controls = {
        # the conversion's rounding may step a hair past the option's bound at the range's edge
        "pitch": _PITCH.clamp(semitones),
        "intonation": _clamp(q, "intonationScale", warnings),  # the same scale: log f0 about its centre
        "volume": volume_from_scale(_clamp(q, "volumeScale", warnings)),
        "pre_silence": _clamp(q, "prePhonemeLength", warnings) / speed,
        "post_silence": _clamp(q, "postPhonemeLength", warnings) / speed,
    }
    readings = dict(readings or {})
    strip_client_markup = not state.options(**readings).pause_markup
    controls.update(readings, pause_markup=True)  # the plan spells the query's own pauses as markup
    moras = [m for p in q.accent_phrases for m in p.moras]
    if not moras:  # nothing to say: only the silences
        return Plan(canonical(0.0), _options(state, speed, controls), post, warnings)
    reading_groups: list[str] = []  # the query's reading, one entry per pause group
    silences: list[float] = []
    current = ""
    for p in q.accent_phrases:
        current += "".join(m.text for m in p.moras) + ("？" if p.is_interrogative else "")
        if p.pause_mora is not None:
            reading_groups.append(current + "、")
            length = q.pauseLength if q.pauseLength is not None else p.pause_mora.vowel_length
            silence = length * q.pauseLengthScale / speed
            if silence > MAX_PAUSE_S:  # (pause markup's own limit)
                warnings.append(f"a pause of {silence:g} s clamped to {MAX_PAUSE_S:g} s")
                silence = MAX_PAUSE_S
            silences.append(silence)
            current = ""
    if current:
        reading_groups.append(current)
    silences += [0.0] * (len(reading_groups) - len(silences))

    text = q.kana.strip() if q.kana else ""
    if strip_client_markup:  # the client's markup goes; the query's own pauses stay
        text = strip_markup(text)
    if len(text) > state.settings.max_text_chars:
        raise InputError(f"kana is longer than {state.settings.max_text_chars} characters")
    from_text = bool(text) and _same_moras(state, text, q.accent_phrases, readings)
    default_pauses = q.pauseLength is None and q.pauseLengthScale == 1.0
    default_pauses = default_pauses and all(
        p.pause_mora is None or abs(p.pause_mora.vowel_length - PAUSE_S) < 1e-6 for p in q.accent_phrases
    )
    if default_pauses:  # one piece: the model places its own pauses
        line = text if from_text else "".join(reading_groups)
    else:
        groups = [g for g in _PAUSE_SPLIT.split(text) if g.strip()] if from_text else []
        if len(groups) != len(reading_groups):
            groups = reading_groups  # the text's punctuation does not line up with the pauses
        line = "".join(g + (canonical(s) if s > 0 else "") for g, s in zip(groups, silences))
    speech_s = sum(m.seconds for m in moras)
    ratio = speech_s / (len(moras) / MORAE_PER_SECOND)
    if ratio <= 0:
        raise InputError("the query's mora lengths add up to zero")
    asked = (speech_s + sum(silences)) / speed + controls["pre_silence"] + controls["post_silence"]
    cap = state.settings.max_text_chars * QUERY_S_PER_CHAR
    if asked > cap:
        raise InputError(
            f"the query asks for {asked:.0f} s of audio; at most {cap:.0f} s "
            f"({QUERY_S_PER_CHAR} s per character of --max-text-chars {state.settings.max_text_chars})",
            hint="shorter moras / pauses, a higher speedScale, or split the text",
        )
    return Plan(line, _options(state, speed, controls, duration_scale=ratio), post, warnings)


def _options(state: AppState, speed: float, controls: dict[str, Any], **more: Any) -> Any:
    """The request's SynthesisOptions; an option's error names the query field it came from."""
    try:
        return state.options(speed=speed, **controls, **more)
    except InputError as e:
        for option, name in _FIELD_OF.items():
            if re.search(rf"\b{option}\b", str(e)):
                raise InputError(f"{name}: {e}") from None
        raise


def _same_moras(state: AppState, text: str, phrases: list[S.AccentPhrase], readings: dict[str, Any]) -> bool:
    try:
        reference = prosody.accent_phrases(state.spoken_text(text, **readings))
    except InputError:
        return False
    return _phrase_moras(reference) == _phrase_moras(phrases)


def re_estimate(phrases: list[S.AccentPhrase], lengths: bool, pitches: bool) -> list[S.AccentPhrase]:
    """The phrases with their moras' lengths and/or pitches estimated afresh (/mora_data & co)."""
    out = []
    for p in phrases:
        highs = prosody.accent_pitches(len(p.moras), p.accent)
        moras = []
        for m, high in zip(p.moras, highs):
            fresh = prosody.make_mora(m.text, m.consonant or "", m.vowel, high)
            update: dict[str, Any] = {}
            if lengths:
                update.update(consonant_length=fresh.consonant_length, vowel_length=fresh.vowel_length)
            if pitches:
                update["pitch"] = fresh.pitch
            moras.append(m.model_copy(update=update))
        pause = p.pause_mora
        if pause is not None and lengths:
            pause = pause.model_copy(update={"vowel_length": PAUSE_S})
        out.append(p.model_copy(update={"moras": moras, "pause_mora": pause}))
    return out
