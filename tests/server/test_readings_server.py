"""The server reads text like every other path (issue 16): the readings pass in audio_query's
moras, and `serve --no-read-numbers` etc. set it for every request."""

from __future__ import annotations

import sys

import httpx
import pytest
from server_helpers import start_server

pytest.importorskip("pyopenjtalk")
# one xdist worker runs this module, so its module-scoped server starts once (tests/server/conftest.py)
pytestmark = pytest.mark.xdist_group(__name__)


def moras(url: str, text: str) -> str:
    q = httpx.post(url + "/audio_query", params={"text": text, "speaker": 0}, timeout=120).json()
    return "".join(m["text"] for p in q["accent_phrases"] for m in p["moras"])


def test_audio_query_reads_times_and_strips_tags_and_serve_flags_switch_them(server, tmp_path):
    assert moras(server.url, "[happy]配信は15:30から") == "ハイシンワジュウゴジサンジュップンカラ"
    plain = start_server(tmp_path / "plain", "--no-read-numbers", "--tags", "keep")
    try:
        said = moras(plain.url, "配信は15:30から")
        assert "ジュウゴジ" not in said and said.startswith("ハイシンワジュウゴ")
        r = httpx.post(plain.url + "/audio_query", params={"text": "[happy]はい", "speaker": 0}, timeout=120)
        assert r.status_code == 200 and moras(plain.url, "[happy]はい") != "ハイ"  # the tag is read
    finally:
        assert plain.stop() == 130


# ---- the readings options per request (issue 16) ------------------------------------------------

openai = pytest.importorskip("openai")

MARKED = "はい[pause:2]どうぞ"


def pcm_seconds(client, text: str, **extra) -> float:
    r = client.audio.speech.create(
        model="tts-1", voice="alloy", input=text, response_format="pcm", extra_body=extra or None
    )
    return len(r.content) / 2 / 24_000


def test_openai_sdk_extra_body_sets_the_readings_of_one_request(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused-on-localhost")
    plain = pcm_seconds(client, "はいどうぞ")
    paused = pcm_seconds(client, MARKED)
    assert paused >= plain + 2.0  # the default: 2 s of silence between two pieces
    assert pcm_seconds(client, MARKED, pause_markup=False) == pytest.approx(plain, abs=0.001)
    assert pcm_seconds(client, MARKED) == pytest.approx(paused, abs=0.001)  # the next request: default again
    # a tag: stripped by default, read with tags=keep (a longer line)
    assert pcm_seconds(client, "[happy]はいどうぞ") == pytest.approx(plain, abs=0.001)
    assert pcm_seconds(client, "[happy]はいどうぞ", tags="keep") > plain + 0.1
    for bad, named in (({"tags": "loud"}, "option tags"), ({"read_english": "maybe"}, "read_english")):
        with pytest.raises(openai.BadRequestError) as e:  # OpenAI's 400
            pcm_seconds(client, "はい", **bad)
        assert named in str(e.value), e.value
    assert pcm_seconds(client, "はいどうぞ") == pytest.approx(plain, abs=0.001)  # still serving


def test_voicevox_query_parameters_set_the_readings_of_one_request(server):
    default = moras(server.url, "VTuberの配信は15:30から")
    r = httpx.post(
        server.url + "/audio_query",
        params={"text": "VTuberの配信は15:30から", "speaker": 0, "read_numbers": "false"},
        timeout=120,
    )
    assert r.status_code == 200
    said = "".join(m["text"] for p in r.json()["accent_phrases"] for m in p["moras"])
    assert "ジュウゴジ" in default and "ジュウゴジ" not in said and said != default
    # /synthesis: the client's markup taken out with pause_markup=false, the default pauses
    q = httpx.post(server.url + "/audio_query", params={"text": MARKED, "speaker": 0}, timeout=120).json()
    q.update(prePhonemeLength=0.0, postPhonemeLength=0.0)
    paused = httpx.post(server.url + "/synthesis", params={"speaker": 0}, json=q, timeout=120)
    off = httpx.post(
        server.url + "/synthesis", params={"speaker": 0, "pause_markup": "false"}, json=q, timeout=120
    )
    assert paused.status_code == off.status_code == 200
    assert len(paused.content) >= len(off.content) + 2 * 48_000 * 2  # 2 s of 16-bit samples more
    plain = httpx.post(
        server.url + "/audio_query", params={"text": "はいどうぞ", "speaker": 0}, timeout=120
    ).json()
    plain.update(prePhonemeLength=0.0, postPhonemeLength=0.0)
    same = httpx.post(server.url + "/synthesis", params={"speaker": 0}, json=plain, timeout=120)
    assert same.content == off.content
    for bad, named in (({"tags": "loud"}, "tags"), ({"read_numbers": "maybe"}, "read_numbers")):
        for route in ("/audio_query", "/synthesis"):
            r = httpx.post(
                server.url + route, params={"text": "はい", "speaker": 0, **bad}, json=q, timeout=60
            )
            assert r.status_code == 422 and named in r.text, (route, r.text)


def test_the_voice_config_sets_the_servers_readings_defaults(tmp_path):
    home = tmp_path / "cfg"
    home.mkdir()
    cfg = home / "voices.toml"
    cfg.write_text(
        '[[speakers]]\nname = "いろどり"\nstyles = [{ name = "ノーマル", id = 0 }]\n'
        '[readings]\npause_markup = false\ntags = "keep"\n',
        encoding="utf-8",
    )
    cmd = [sys.executable, "-m", "irodori_speaker.cli", "serve", "--tiny-random", "--backend", "cpu"]
    srv = start_server(home, cmd=[*cmd, "--voices", str(cfg)])
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused-on-localhost")
        plain = pcm_seconds(client, "はいどうぞ")
        assert pcm_seconds(client, MARKED) == pytest.approx(plain, abs=0.001)  # the config's default
        assert pcm_seconds(client, MARKED, pause_markup=True) >= plain + 2.0
        assert moras(srv.url, "[happy]はい") != "ハイ"  # tags = "keep": the tag is read
    finally:
        assert srv.stop() == 130
    cfg.write_text('[[speakers]]\nname = "x"\n[readings]\npause_markup = "sometimes"\n', encoding="utf-8")
    from irodori_speaker.errors import InputError
    from irodori_speaker.server.config import load_voice_book

    with pytest.raises(InputError, match=r"option pause_markup"):
        load_voice_book(cfg)
    cfg.write_text('[[speakers]]\nname = "x"\n[readings]\nspeed = 2\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"unknown readings option 'speed'"):
        load_voice_book(cfg)
