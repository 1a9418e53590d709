"""The server reads text like every other path (issue 16): the readings pass in audio_query's
moras, and `serve --no-read-numbers` etc. set it for every request."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import start_server

pytest.importorskip("pyopenjtalk")


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
        assert plain.stop() == 0
