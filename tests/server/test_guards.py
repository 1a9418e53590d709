"""Cancellation on disconnect, the queue limit, CORS, Host, API key, body limit, metrics."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from server_helpers import httpx, start_server

# one xdist worker runs this module, so its module-scoped servers starts once (tests/server/conftest.py)
pytestmark = pytest.mark.xdist_group(__name__)

LONG = "今日はいい天気ですね、散歩に行きましょう。" * 20  # many pieces at speed 0.25


def wait_until(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """A server whose lines take long (many sampler steps), one at a time, and whose queue holds
    one line."""
    home = tmp_path_factory.mktemp("slow")
    srv = start_server(home, "--steps", "64", "--max-queue", "1", "--streams", "1", "--no-cache")
    yield srv
    assert srv.stop() == 130


def speech(url, **kw):
    body = {"model": "tts-1", "voice": "alloy", "input": LONG, "response_format": "pcm", "speed": 0.25, **kw}
    return httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=120)


def test_a_client_that_goes_away_cancels_its_line_between_sampler_steps(slow):
    with speech(slow.url) as r:
        assert r.status_code == 200
        next(r.iter_bytes())  # the first chunk arrived: the line is mid-synthesis
    # the connection is closed: the sampler stops at its next step and the worker is free
    assert wait_until(lambda: slow.metric("irodori_cancelled_total") == 1)
    steps = slow.metric("irodori_sampler_steps_total")
    time.sleep(1.0)
    assert slow.metric("irodori_sampler_steps_total") == steps  # no step ran after the cancel
    total_steps_of_the_line = 64 * 20  # 20+ pieces x 64 steps, had it run to the end
    assert steps < total_steps_of_the_line / 2
    # and the next request is served at once
    r = httpx.post(
        slow.url + "/v1/audio/speech",
        json={"model": "m", "voice": "alloy", "input": "あ", "response_format": "wav"},
        timeout=60,
    )
    assert r.status_code == 200


@pytest.mark.parametrize("route", ["/synthesis", "/cancellable_synthesis"])
def test_a_voicevox_client_that_times_out_cancels_too(slow, route):
    q = httpx.post(slow.url + "/audio_query", params={"text": LONG[:200], "speaker": 0}).json()
    q["speedScale"] = 0.25
    before = slow.metric("irodori_cancelled_total")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(slow.url + route, params={"speaker": 0}, json=q, timeout=1.0)
    assert wait_until(lambda: slow.metric("irodori_cancelled_total") == before + 1)


def test_cancellable_synthesis_gives_the_synthesis_wav(slow):
    q = httpx.post(slow.url + "/audio_query", params={"text": "こんにちは", "speaker": 0}).json()
    plain = httpx.post(slow.url + "/synthesis", params={"speaker": 0}, json=q, timeout=120)
    cancellable = httpx.post(slow.url + "/cancellable_synthesis", params={"speaker": 0}, json=q, timeout=120)
    assert plain.status_code == cancellable.status_code == 200
    assert cancellable.headers["content-type"] == "audio/wav"
    assert cancellable.content == plain.content  # the same seeded line, the same WAV


def test_queue_limit_answers_503_with_retry_after(slow):
    results = []

    def go():
        with speech(slow.url) as r:
            results.append(r.status_code)
            for _ in r.iter_bytes():
                if len(results) >= 3:
                    break

    first = threading.Thread(target=go)
    first.start()
    assert wait_until(lambda: len(results) == 1)  # the first line runs
    second = threading.Thread(target=go)
    second.start()  # waits in the queue (its one place)
    time.sleep(1.0)
    rejected = slow.metric("irodori_rejected_total")
    r = httpx.post(
        slow.url + "/v1/audio/speech", json={"model": "m", "voice": "alloy", "input": "あ"}, timeout=30
    )
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["message"].startswith("the synthesis queue is full")
    q = httpx.post(slow.url + "/audio_query", params={"text": "あ", "speaker": 0}).json()
    r = httpx.post(slow.url + "/synthesis", params={"speaker": 0}, json=q, timeout=30)  # VOICEVOX's shape
    assert (
        r.status_code == 503 and int(r.headers["retry-after"]) >= 1 and "queue is full" in r.json()["detail"]
    )
    # every rejection is counted, by its reason
    assert slow.metric("irodori_rejected_total") == rejected + 2
    assert 'irodori_rejected_total{reason="queue_full"}' in httpx.get(slow.url + "/metrics").text
    results.extend([0, 0])  # let the streams go
    first.join(60)
    second.join(60)


def test_cors_like_voicevox(server):
    ok = httpx.get(server.url + "/version", headers={"Origin": "http://localhost:3000"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "http://localhost:3000"
    app = httpx.get(server.url + "/version", headers={"Origin": "app://."})
    assert app.status_code == 200
    evil = httpx.post(
        server.url + "/audio_query",
        params={"text": "あ", "speaker": 0},
        headers={"Origin": "https://evil.example"},
    )
    assert evil.status_code == 403 and "not allowed" in evil.text
    pre = httpx.options(
        server.url + "/synthesis",
        headers={"Origin": "http://127.0.0.1:8080", "Access-Control-Request-Method": "POST"},
    )
    assert pre.status_code == 200


def test_dns_rebinding_host_is_refused(server):
    r = httpx.get(server.url + "/speakers", headers={"Host": "attacker.example:50021"})
    assert r.status_code == 403


def test_body_limit(server):
    r = httpx.post(
        server.url + "/synthesis",
        params={"speaker": 0},
        content=b"x" * 1_100_000,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 413


def test_metrics_in_prometheus_text_format(server):
    httpx.get(server.url + "/version")
    text = httpx.get(server.url + "/metrics").text
    for name in (
        "irodori_queue_length",
        "irodori_time_to_first_byte_seconds_bucket",
        "irodori_errors_total",
        "irodori_real_time_factor_bucket",
        "irodori_requests_total",
    ):
        assert name in text
    assert server.metric("irodori_requests_total") >= 1


def test_a_repeated_seeded_line_is_served_from_the_phrase_cache(server):
    """The server's cache path end to end (in process: test_service_cache.py): the second
    request of a line is a hit (counted), with the same audio, and no sampler step."""
    body = {"model": "tts-1", "voice": "alloy", "input": "キャッシュの確認です", "response_format": "pcm"}
    hits = server.metric("irodori_cache_hits_total")
    first = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)
    steps = server.metric("irodori_sampler_steps_total")
    again = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)
    assert first.status_code == again.status_code == 200
    assert again.content == first.content and len(first.content) > 0
    assert server.metric("irodori_cache_hits_total") == hits + 1
    assert server.metric("irodori_sampler_steps_total") == steps


def test_api_key_and_beyond_localhost(tmp_path):
    import subprocess
    import sys

    # beyond localhost without a key: refused before the model loads
    r = subprocess.run(
        [sys.executable, "-m", "irodori_speaker.cli", "serve", "--tiny-random", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "needs an API key" in r.stderr
    # the key from a file: nobody reads it in `ps` (the command line of the process)
    key_file = tmp_path / "key"
    key_file.write_text("s3cret\n")
    srv = start_server(tmp_path, "--api-key-file", str(key_file), "--no-prewarm")
    try:
        assert b"s3cret" not in Path(f"/proc/{srv.proc.pid}/cmdline").read_bytes()
        assert httpx.get(srv.url + "/version").status_code == 200  # the liveness probe stays open
        assert httpx.get(srv.url + "/speakers").status_code == 401
        assert httpx.get(srv.url + "/speakers", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(srv.url + "/speakers", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        import openai

        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret")
        assert (
            len(c.audio.speech.create(model="m", voice="alloy", input="あ", response_format="pcm").content)
            > 0
        )
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=srv.url + "/v1", api_key="nope").models.list()
    finally:
        assert srv.stop() == 130
