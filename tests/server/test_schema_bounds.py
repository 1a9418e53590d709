"""The server's request fields that map onto synthesis options take their ranges from the
options' specs (options/synthesis.py), in the fields' own units: no range is written twice.
OpenAI's `speed` refuses beyond its range; an AudioQuery's scales are clamped into theirs
(`schemas.QUERY_RANGES`, with a Warning header: test_voicevox_routes.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from irodori_speaker.audio.controls import gain_of, pitch_from_voicevox, volume_from_scale
from irodori_speaker.options import API_SPEED, SynthesisOptions, option_specs
from irodori_speaker.server import schemas as S

SPECS = option_specs(SynthesisOptions)


def bounds(model, name: str) -> tuple[float, float]:
    """(minimum, maximum) of a field as the OpenAPI document shows it."""
    prop = model.model_json_schema()["properties"][name]
    return prop["minimum"], prop["maximum"]


def test_speed_fields_take_the_api_speed_range():
    assert bounds(S.SpeechRequest, "speed") == S.QUERY_RANGES["speedScale"] == (API_SPEED.lo, API_SPEED.hi)


def test_the_api_speed_range_is_reachable_through_speed_and_duration_scale():
    """Beyond the speed option's range the rest goes on duration_scale (server/state.py): the
    API's whole range stays within what the two options allow."""
    speed, stretch = SPECS["speed"].check, SPECS["duration_scale"].check
    assert speed.lo is not None and speed.hi is not None and stretch.lo is not None and stretch.hi is not None
    assert API_SPEED.lo is not None and API_SPEED.hi is not None
    assert API_SPEED.lo <= speed.lo <= speed.hi <= API_SPEED.hi
    assert stretch.lo <= speed.lo / API_SPEED.lo <= stretch.hi
    assert stretch.lo <= API_SPEED.hi / speed.hi <= stretch.hi


def test_voicevox_scales_map_onto_the_options_ranges():
    intonation, pitch, volume = (SPECS[n].check for n in ("intonation", "pitch", "volume"))
    ranges = S.QUERY_RANGES
    assert ranges["intonationScale"] == (intonation.lo, intonation.hi)
    lo, hi = ranges["pitchScale"]
    assert (pitch_from_voicevox(lo), pitch_from_voicevox(hi)) == pytest.approx((pitch.lo, pitch.hi))
    lo, hi = ranges["volumeScale"]
    assert lo == gain_of(volume.lo) == 0.0  # silence
    assert volume_from_scale(hi) == pytest.approx(volume.hi)
    for field, option in (("prePhonemeLength", "pre_silence"), ("postPhonemeLength", "post_silence")):
        assert ranges[field] == (SPECS[option].check.lo, SPECS[option].check.hi)


def test_an_audio_query_refuses_only_what_means_nothing():
    """VOICEVOX sets no bound on its scales: the schema refuses a speed of 0, a negative length
    or volume, and NaN, each named; anything else is taken (and clamped when planned)."""
    base = {"accent_phrases": [], "speedScale": 1, "pitchScale": 0, "intonationScale": 1}
    base |= {"volumeScale": 1, "prePhonemeLength": 0.1, "postPhonemeLength": 0.1}
    base |= {"outputSamplingRate": 48000, "outputStereo": False}
    S.AudioQuery(**{**base, "speedScale": 9.0, "pitchScale": 0.9, "intonationScale": 5.0})
    from pydantic import ValidationError

    for field, value in (("speedScale", 0.0), ("volumeScale", -1.0), ("prePhonemeLength", -0.1)):
        with pytest.raises(ValidationError, match=field):
            S.AudioQuery(**{**base, field: value})
    with pytest.raises(ValidationError, match="pitchScale"):
        S.AudioQuery(**{**base, "pitchScale": float("nan")})


def test_the_studios_speed_refuses_0_as_the_audio_querys_does():
    """`AppState.options` divides by the speed: the studio's 0 was a ZeroDivisionError, a 500
    (test_schemathesis.py found it); its body refuses 0 and below, and takes what the options
    reach through duration_scale."""
    from pydantic import ValidationError

    from irodori_speaker.server.studio import SpeakBody

    for bad in (0, -1.0):
        with pytest.raises(ValidationError, match="speed"):
            SpeakBody(text="あ", speed=bad)
    assert SpeakBody(text="あ", speed=0.1).speed == 0.1
