"""VOICEVOX engine API against a real server, first through `voicevox-client` (PyPI), then
route by route with httpx: shapes, AudioQuery fields honoured, errors."""

from __future__ import annotations

import asyncio
import io
import zipfile

import numpy as np
import pytest
from server_helpers import httpx, wav_info

vvclient = pytest.importorskip("vvclient")
from irodori_speaker.server import schemas as S  # noqa: E402

# one xdist worker runs this module, so its module-scoped server starts once (tests/server/conftest.py)
pytestmark = pytest.mark.xdist_group(__name__)

TEXT = "こんにちは、今日はいい天気ですね。"


def expected_samples(synth, text, speed=1.0):
    from irodori_speaker.options import SynthesisOptions

    return synth.synthesize(text, None, SynthesisOptions(seed=0, duration_scale=1.0 / speed)).record.samples


def test_voicevox_client_audio_query_and_synthesis(server, synth):
    async def run():
        async with vvclient.Client(server.url) as client:
            query = await client.create_audio_query(TEXT, speaker=0)
            return await query.synthesis(speaker=0)

    data = asyncio.run(run())
    audio, rate = wav_info(data)
    assert rate == 48_000 and audio.shape[1] == 1
    # 0.1 s before and after (prePhonemeLength / postPhonemeLength) around exactly what the
    # synthesizer renders for this text with the server's seed
    assert len(audio) == 2 * 4800 + expected_samples(synth, TEXT)
    assert np.abs(audio[:4800]).max() == 0 and np.abs(audio[4800:-4800]).max() > 0


@pytest.mark.filterwarnings("ignore:'audioop' is deprecated:DeprecationWarning")  # inside aiavatar
def test_aiavatar_voicevox_synthesizer(server, synth):
    """AIAvatarKit's own VOICEVOX speech synthesizer (PyPI `aiavatar`, headless: httpx only)."""
    voicevox = pytest.importorskip("aiavatar.sts.tts.voicevox")

    async def run(speaker: int, style: dict | None = None, rate: int | None = None) -> bytes:
        tts = voicevox.VoicevoxSpeechSynthesizer(
            base_url=server.url, speaker=speaker, style_mapper={"joy": "7"}, sample_rate=rate, timeout=60
        )
        try:
            return await tts.synthesize(TEXT, style_info=style)
        finally:
            await tts.close()

    plain, rate = wav_info(asyncio.run(run(0)))
    assert rate == 48_000 and len(plain) == 2 * 4800 + expected_samples(synth, TEXT)
    # its style mapper turns "[face:joy]" into style id 7, the configured reference voice
    styled, _ = wav_info(asyncio.run(run(0, {"styled_text": "[face:joy]" + TEXT})))
    assert styled.shape[0] > 0
    assert styled.shape != plain.shape or not np.array_equal(styled, plain)
    # its postprocessor resamples what the server sent
    low, rate = wav_info(asyncio.run(run(0, rate=16_000)))
    assert rate == 16_000 and abs(len(low) - len(plain) / 3) <= 2


def test_query_fields_are_honoured(server, synth):
    q = httpx.post(server.url + "/audio_query", params={"text": TEXT, "speaker": 0}).json()
    assert q["kana"] == TEXT and q["outputSamplingRate"] == 48_000
    assert q["accent_phrases"][0]["pause_mora"]["vowel"] == "pau"
    q.update(
        speedScale=2.0,
        outputSamplingRate=24_000,
        outputStereo=True,
        prePhonemeLength=0.5,
        postPhonemeLength=0.0,
        volumeScale=0.5,
    )
    r = httpx.post(server.url + "/synthesis", params={"speaker": 0}, json=q, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "audio/wav"
    audio, rate = wav_info(r.content)
    assert rate == 24_000 and audio.shape[1] == 2 and np.array_equal(audio[:, 0], audio[:, 1])
    fast = expected_samples(synth, TEXT, speed=2.0)
    assert fast < 0.7 * expected_samples(synth, TEXT)  # speedScale 2 asks the model for half the length
    # pre-silence is divided by speedScale, as VOICEVOX does: 0.25 s at 24 kHz (exact zeros
    # at 48 kHz; the resampler's filter rings a bit of the onset back into it: an LSB or two)
    assert len(audio) == pytest.approx(6000 + fast / 2, abs=4)
    assert np.abs(audio[: 6000 - 480]).max() <= 2 / 32768
    assert np.abs(audio[:3000]).max() == 0
    q["volumeScale"] = 0.0
    silent, _ = wav_info(
        httpx.post(server.url + "/synthesis", params={"speaker": 0}, json=q, timeout=60).content
    )
    assert np.abs(silent).max() == 0


def test_intonation_scale_is_the_intonation_option(server, synth):
    """intonationScale 1.5 is intonation=1.5: the same audio as the synthesizer gives with it."""
    pytest.importorskip("pyworld")
    from irodori_speaker.options import SynthesisOptions

    q = httpx.post(server.url + "/audio_query", params={"text": "テスト", "speaker": 0}).json()
    q.update(intonationScale=1.5, prePhonemeLength=0.0, postPhonemeLength=0.0)
    r = httpx.post(server.url + "/synthesis", params={"speaker": 0}, json=q, timeout=60)
    assert r.status_code == 200
    audio, _ = wav_info(r.content)
    want = synth.synthesize("テスト", None, SynthesisOptions(seed=0, intonation=1.5)).audio
    plain = synth.synthesize("テスト", None, SynthesisOptions(seed=0)).audio
    assert len(audio) == len(want) == len(plain) and not np.array_equal(want, plain)
    assert np.abs(audio[:, 0] - np.clip(want, -1, 1)).max() < 2 / 32767  # 16-bit WAV rounding
    # beyond the option's range (VOICEVOX sets none): clamped, and the Warning header says so
    r = httpx.post(server.url + "/synthesis", params={"speaker": 0}, json={**q, "intonationScale": 2.5})
    assert r.status_code == 200 and "intonationScale 2.5 clamped to 2" in r.headers["warning"]


def test_pitch_scale_is_the_pitch_option(server, synth):
    """pitchScale 0.1 -> +6.58 semitones (controls.pitch_from_voicevox): the same audio as the
    synthesizer gives with that pitch; out of the option's range it is clamped, with a Warning
    header naming pitchScale (vv-synth's slider goes to 0.3)."""
    pytest.importorskip("pyworld")
    from irodori_speaker.audio.controls import pitch_from_voicevox
    from irodori_speaker.options import SynthesisOptions

    q = httpx.post(server.url + "/audio_query", params={"text": "テスト", "speaker": 0}).json()
    q.update(pitchScale=0.1, prePhonemeLength=0.0, postPhonemeLength=0.0)
    r = httpx.post(server.url + "/synthesis", params={"speaker": 0}, json=q, timeout=60)
    assert r.status_code == 200
    audio, _ = wav_info(r.content)
    want = synth.synthesize("テスト", None, SynthesisOptions(seed=0, pitch=pitch_from_voicevox(0.1))).audio
    assert pitch_from_voicevox(0.1) == pytest.approx(6.58, abs=0.01)
    assert len(audio) == len(want)
    assert np.abs(audio[:, 0] - np.clip(want, -1, 1)).max() < 2 / 32767  # 16-bit WAV rounding
    # pitchScale's range is the pitch option's through pitch_from_voicevox (schemas.QUERY_RANGES)
    r = httpx.post(server.url + "/synthesis", params={"speaker": 0}, json={**q, "pitchScale": 0.5})
    assert r.status_code == 200 and r.headers["warning"].startswith('299 irodori-speaker "pitchScale 0.5')
    top = S.QUERY_RANGES["pitchScale"][1]
    clamped, _ = wav_info(r.content)
    at_top = httpx.post(server.url + "/synthesis", params={"speaker": 0}, json={**q, "pitchScale": top})
    assert at_top.status_code == 200 and "warning" not in at_top.headers  # the edge itself is no error
    assert np.array_equal(wav_info(at_top.content)[0], clamped)
    r = httpx.post(server.url + "/synthesis", params={"speaker": 0}, json={**q, "pitchScale": "high"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "pitchScale"]


def test_pause_length_splits_at_pauses_with_exact_silence(server):
    q = httpx.post(server.url + "/audio_query", params={"text": TEXT, "speaker": 0}).json()
    q.update(pauseLength=1.0, prePhonemeLength=0.0, postPhonemeLength=0.0)
    audio, rate = wav_info(
        httpx.post(server.url + "/synthesis", params={"speaker": 0}, json=q, timeout=60).content
    )
    silent = np.abs(audio[:, 0]) == 0
    runs, run = [], 0
    for s in silent:
        run = run + 1 if s else 0
        runs.append(run)
    assert max(runs) >= rate * 1.0  # one second of digital silence between the two pieces


def test_speakers_info_manifest_devices(server):
    speakers = httpx.get(server.url + "/speakers").json()
    assert [s["name"] for s in speakers] == ["いろどり", "テスト"]
    assert speakers[1]["styles"] == [{"name": "リファレンス", "id": 7, "type": "talk"}]
    info = httpx.get(
        server.url + "/speaker_info", params={"speaker_uuid": speakers[1]["speaker_uuid"]}
    ).json()
    assert info["policy"] == "test voice" and info["style_infos"][0]["id"] == 7
    missing = httpx.get(server.url + "/speaker_info", params={"speaker_uuid": "nope"})
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]  # as VOICEVOX answers
    manifest = httpx.get(server.url + "/engine_manifest").json()
    assert manifest["default_sampling_rate"] == 48_000
    from irodori_speaker.audio.controls import pitch_available

    assert manifest["supported_features"]["adjust_pitch_scale"] is pitch_available()
    assert httpx.get(server.url + "/supported_devices").json()["cpu"] is True
    assert httpx.get(server.url + "/version").json() == httpx.get(server.url + "/core_versions").json()[0]


def test_initialize_speaker(server):
    assert httpx.get(server.url + "/is_initialized_speaker", params={"speaker": 7}).json() is False
    r = httpx.post(server.url + "/initialize_speaker", params={"speaker": 7}, timeout=60)
    assert r.status_code == 204
    assert httpx.get(server.url + "/is_initialized_speaker", params={"speaker": 7}).json() is True
    # an unknown id is the default voice (every VOICEVOX client has its own default id)
    assert (
        httpx.post(server.url + "/initialize_speaker", params={"speaker": 99}, timeout=60).status_code == 204
    )


def test_reference_voice_style_synthesises(server):
    q = httpx.post(server.url + "/audio_query", params={"text": "テスト", "speaker": 7}).json()
    r = httpx.post(server.url + "/synthesis", params={"speaker": 7}, json=q, timeout=60)
    assert r.status_code == 200 and len(wav_info(r.content)[0]) > 9600


def test_accent_phrases_text_and_kana(server):
    phrases = httpx.post(server.url + "/accent_phrases", params={"text": "本当ですか？", "speaker": 0}).json()
    assert phrases[0]["is_interrogative"] is True
    kana = httpx.post(
        server.url + "/accent_phrases", params={"text": "ホ'ントオ/デ_スカ'？", "speaker": 0, "is_kana": True}
    ).json()
    assert [m["text"] for m in kana[1]["moras"]] == ["デ", "ス", "カ"] and kana[1]["moras"][1]["vowel"] == "U"
    bad = httpx.post(
        server.url + "/accent_phrases", params={"text": "ホントオ", "speaker": 0, "is_kana": True}
    )
    assert bad.status_code == 400 and bad.json()["detail"]["error_name"] == "ACCENT_NOTFOUND"
    data = httpx.post(server.url + "/mora_data", params={"speaker": 0}, json=phrases).json()
    assert data == phrases  # our estimates are deterministic


def test_multi_synthesis_zip(server):
    queries = [
        httpx.post(server.url + "/audio_query", params={"text": t, "speaker": 0}).json()
        for t in ("あ", "いい")
    ]
    r = httpx.post(server.url + "/multi_synthesis", params={"speaker": 0}, json=queries, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(r.content)) as zf:
        assert zf.namelist() == ["001.wav", "002.wav"]
        assert all(wav_info(zf.read(n))[1] == 48_000 for n in zf.namelist())
    queries[1]["outputSamplingRate"] = 24_000
    assert httpx.post(server.url + "/multi_synthesis", params={"speaker": 0}, json=queries).status_code == 422


def test_symbols_only_text_gives_the_silences(server):
    q = httpx.post(server.url + "/audio_query", params={"text": "、", "speaker": 0}).json()
    assert q["accent_phrases"] == []
    audio, _ = wav_info(httpx.post(server.url + "/synthesis", params={"speaker": 0}, json=q).content)
    assert len(audio) == 9600 and np.abs(audio).max() == 0


def test_user_dictionary_routes_and_persistence(server):
    from irodori_speaker.text.userdict import UserDictionary

    r = httpx.post(
        server.url + "/user_dict_word",
        params={
            "surface": "VTuber",
            "pronunciation": "ブイチューバー",
            "accent_type": 1,
            "word_type": "PROPER_NOUN",
        },
    )
    assert r.status_code == 200
    uuid = r.json()
    words = httpx.get(server.url + "/user_dict").json()
    assert words[uuid]["surface"] == "ＶＴｕｂｅｒ" and words[uuid]["mora_count"] == 6
    q = httpx.post(server.url + "/audio_query", params={"text": "VTuber", "speaker": 0}).json()
    assert [m["text"] for m in q["accent_phrases"][0]["moras"]] == ["ブ", "イ", "チュ", "ウ", "バ", "ア"]
    assert q["accent_phrases"][0]["accent"] == 1  # the dictionary's accent type reached pyopenjtalk
    r = httpx.put(
        server.url + f"/user_dict_word/{uuid}",
        params={"surface": "VTuber", "pronunciation": "ブイ", "accent_type": 0, "priority": 8},
    )
    assert r.status_code == 204
    # persisted in the sqlite file the server was given
    (word,) = UserDictionary(server.home / "user_dict.sqlite3").words()
    assert (word.pronunciation, word.priority) == ("ブイ", 8)
    bad = httpx.post(
        server.url + "/user_dict_word", params={"surface": "x", "pronunciation": "abc", "accent_type": 0}
    )
    assert bad.status_code == 422 and "katakana" in bad.text
    imported = {
        "0b4f8c3c-0000-4000-8000-000000000002": {
            **words[uuid],
            "surface": "草",
            "pronunciation": "ワラ",
            "yomi": "ワラ",
            "accent_type": 1,
            "mora_count": 2,
        }
    }
    assert (
        httpx.post(server.url + "/import_user_dict", params={"override": True}, json=imported).status_code
        == 204
    )
    assert len(httpx.get(server.url + "/user_dict").json()) == 2
    for key in (uuid, "0b4f8c3c-0000-4000-8000-000000000002"):
        assert httpx.delete(server.url + f"/user_dict_word/{key}").status_code == 204
    assert httpx.get(server.url + "/user_dict").json() == {}
    assert httpx.delete(server.url + f"/user_dict_word/{uuid}").status_code == 422


def test_validation_errors_are_422_with_a_message(server):
    r = httpx.post(server.url + "/audio_query", params={"text": "あ" * 1001, "speaker": 0})
    assert r.status_code == 422 and "longer than 1000" in r.json()["detail"]
    r = httpx.post(server.url + "/synthesis", params={"speaker": 0}, json={"accent_phrases": []})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][0] == "body"
    r = httpx.post(
        server.url + "/synthesis",
        params={"speaker": 0},
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422
