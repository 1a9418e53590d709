"""OpenAI's speech API through the official `openai` SDK, every response_format, whole and streamed."""

from __future__ import annotations

import io

import pytest
from server_helpers import httpx

openai = pytest.importorskip("openai")
av = pytest.importorskip("av")
# one xdist worker runs this module, so its module-scoped server starts once (tests/server/conftest.py)
pytestmark = pytest.mark.xdist_group(__name__)

TEXT = "こんにちは、今日はいい天気ですね。散歩に行きましょう。"


def decoded_seconds(data: bytes, fmt: str) -> float:
    if fmt == "pcm":
        return len(data) / 2 / 24_000
    with av.open(io.BytesIO(data)) as c:
        frames = [f.to_ndarray() for f in c.decode(audio=0)]
        rate = c.streams.audio[0].rate
    return sum(f.shape[-1] for f in frames) / rate


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused-on-localhost")


@pytest.fixture(scope="module")
def reference_seconds(synth):
    from irodori_speaker.options import SynthesisOptions

    return synth.synthesize(TEXT, None, SynthesisOptions(seed=0)).record.samples / 48_000


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "aac", "flac", "pcm"])
def test_create_every_format(client, fmt, reference_seconds):
    r = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format=fmt)
    data = r.content
    if fmt == "wav":
        assert data[:4] == b"RIFF" and data[24:28] == (24_000).to_bytes(4, "little")
    # codecs pad the start/end a little (mp3, aac, opus frames)
    assert decoded_seconds(data, fmt) == pytest.approx(reference_seconds, abs=0.1)


@pytest.mark.parametrize("fmt", ["pcm", "wav", "mp3", "opus"])
def test_streaming_response_arrives_in_pieces(client, fmt):
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="nova", input=TEXT * 3, response_format=fmt, speed=0.5
    ) as r:
        assert r.headers["content-type"].startswith("audio/")
        parts = [p for p in r.iter_bytes() if p]
    # a multi-second line decodes in several chunks and each leaves when it is decoded
    assert len(parts) >= 3
    assert decoded_seconds(b"".join(parts), fmt) > 3.0


def test_speed_changes_the_length(client, reference_seconds):
    fast = client.audio.speech.create(
        model="tts-1", voice="alloy", input=TEXT, response_format="pcm", speed=2.0
    )
    assert decoded_seconds(fast.content, "pcm") < 0.7 * reference_seconds


def test_errors_are_400_in_openais_shape(client, server):
    """As OpenAI answers: 400, {"error": {"message", "type", "param", "code"}}; the SDK raises
    BadRequestError with the message, and the server serves the next request."""
    with pytest.raises(openai.BadRequestError, match="unknown voice") as e:
        client.audio.speech.create(model="tts-1", voice="nobody", input="テスト", response_format="wav")
    error = e.value.body
    assert error["param"] == "voice" and error["type"] == "invalid_request_error"
    assert "alloy" in error["message"] and "nova" in error["message"]  # the names it accepts
    with pytest.raises(openai.BadRequestError) as e:
        client.audio.speech.create(model="tts-1", voice="alloy", input="テスト", speed=9.0)
    assert e.value.body["param"] == "speed"
    with pytest.raises(openai.BadRequestError, match="empty"):
        client.audio.speech.create(model="tts-1", voice="alloy", input="\u3000\t")
    with pytest.raises(openai.BadRequestError, match="at most 4096") as e:
        client.audio.speech.create(model="tts-1", voice="alloy", input="あ" * 4097)
    assert e.value.body["param"] == "input"
    raw = httpx.post(server.url + "/v1/audio/speech", json={"model": "m", "voice": "alloy"})
    assert raw.status_code == 400 and set(raw.json()) == {"error"} and raw.json()["error"]["param"] == "input"
    r = client.audio.speech.create(model="tts-1", voice="alloy", input="テスト", response_format="pcm")
    assert len(r.content) > 0


def test_models(client, server):
    ids = [m.id for m in client.models.list().data]
    assert "tts-1" in ids and "irodori-speaker" in ids
    assert httpx.get(server.url + "/v1/models").json()["object"] == "list"


@pytest.mark.parametrize("fmt", ["pcm", "mp3"])
def test_stream_format_sse(client, fmt):
    """`stream_format="sse"` through the SDK: OpenAI's events, `speech.audio.delta` with base64
    audio as it is decoded, then one `speech.audio.done` with the usage; the deltas joined are
    the audio the plain request gives."""
    import base64
    import json

    text = TEXT + "もう少し続けます。"
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts", voice="alloy", input=text, response_format=fmt, stream_format="sse"
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: ") :]) for line in r.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done" and set(kinds[:-1]) == {"speech.audio.delta"}
    assert len(kinds) >= 3  # decoded in several chunks, each sent when it exists
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    usage = events[-1]["usage"]
    assert usage["input_tokens"] == len(text)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"] > len(text)
    plain = client.audio.speech.create(model="tts-1", voice="alloy", input=text, response_format=fmt)
    if fmt == "pcm":
        assert audio == plain.content
    else:
        assert decoded_seconds(audio, fmt) == pytest.approx(decoded_seconds(plain.content, fmt), abs=0.05)
