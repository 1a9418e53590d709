"""The event feed with a plain `websockets` client (and httpx for SSE): the schema of every
message, the clock, interruptions, the guards, 16 Speakers at once, and `serve --play`."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
import websockets
from onscreen_helpers import LiveSpeaker
from server_helpers import start_server

from irodori_speaker.errors import InputError
from irodori_speaker.outputs import NullOutput
from irodori_speaker.server.events_server import EventsServer
from irodori_speaker.speaker import Speaker
from irodori_speaker.speaker.feed import MESSAGE_TYPES, SCHEMA_VERSION

pytest.importorskip("pyopenjtalk")  # word timing needs the ja extra

LETTER = "それでは次のお便りを読んでいきます、ペンネームはるかぜさん。"
LINE_KEYS = {"id", "text", "spoken", "voice", "lane", "queued_at", "started_at", "finished_at", "outcome",
             "heard_text", "audio_s"}  # fmt: skip
#: the keys each message type has (docs/overlay.md, "The feed's schema")
KEYS = {
    "hello": {"v", "type", "schema", "clock", "mouth_hz", "state"},
    "line_queued": {"v", "type", "t", "line", "position"},
    "line_synthesized": {"v", "type", "t", "id", "spoken", "audio_s"},
    "line_started": {"v", "type", "t", "line", "latency"},
    "line_timing": {"v", "type", "t", "id", "spoken", "kana_only", "duration", "words"},
    "word": {"v", "type", "t", "end", "id", "index", "text", "spoken", "reading", "moras"},
    "viseme": {"v", "type", "t", "id", "viseme"},
    "mouth": {"v", "type", "t", "id", "level"},
    "line_finished": {"v", "type", "t", "id", "outcome"},
    "pong": {"v", "type", "clock"},
    "closed": {"v", "type", "t"},
}


@pytest.fixture(scope="module")
def live(synth):
    live = LiveSpeaker(synth)
    yield live
    live.close()


def ws_url(http: str) -> str:
    return http.replace("http://", "ws://") + "/feed"


async def until_finished(ws, uid: int, timeout: float = 60.0) -> list[dict]:
    got = []
    while True:
        msg = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        got.append(msg)
        if msg["type"] == "line_finished" and msg["id"] == uid:
            return got


def check_schema(msg: dict) -> None:
    assert msg["v"] == SCHEMA_VERSION and msg["type"] in MESSAGE_TYPES, msg
    keys = KEYS[msg["type"]]
    assert keys <= set(msg), (msg["type"], keys - set(msg))
    if "line" in msg:
        assert set(msg["line"]) == LINE_KEYS


def test_every_message_follows_the_schema_and_the_speakers_own_events(live):
    async def body():
        async with websockets.connect(ws_url(live.url)) as ws:
            hello = json.loads(await ws.recv())
            check_schema(hello)
            assert hello["schema"] == 1 and set(hello["state"]) == {"speaker", "current", "queue", "recent"}
            sent = time.monotonic()
            await ws.send(json.dumps({"type": "ping", "sent": 42}))
            utt = live.call(lambda: live.speaker.enqueue("今日はいい天気ですね"))
            got = await until_finished(ws, utt.id)
            return hello, sent, utt, got

    hello, sent, utt, got = asyncio.run(body())
    for msg in got:
        check_schema(msg)
    pong = next(m for m in got if m["type"] == "pong")
    assert pong["sent"] == 42 and sent < pong["clock"] < time.monotonic()  # the same monotonic clock
    kinds = [m["type"] for m in got if m["type"] not in ("pong", "mouth", "viseme", "line_synthesized")]
    assert kinds[:3] == ["line_queued", "line_started", "line_timing"] and kinds[-1] == "line_finished"
    queued = next(m for m in got if m["type"] == "line_queued")["line"]
    assert queued["text"] == "今日はいい天気ですね" and queued["lane"] == "normal" and queued["voice"] is None
    timing = next(m for m in got if m["type"] == "line_timing")
    assert timing["spoken"] == "今日はいい天気ですね" and timing["kana_only"] is False
    words = [m for m in got if m["type"] == "word"]
    events = live.of("word", utt.id)
    assert [(w["text"], w["t"], w["reading"]) for w in words] == [(e.text, e.time, e.reading) for e in events]
    assert all(m["t"] >= w["t"] - 1e-6 for w in words for m in w["moras"][:1])
    visemes = [m for m in got if m["type"] == "viseme"]
    assert [v["viseme"] for v in visemes] == [e.viseme for e in live.of("viseme", utt.id)]
    mouth = [m for m in got if m["type"] == "mouth"]
    assert len(mouth) >= 2 and all(0.0 <= m["level"] <= 1.0 for m in mouth) and mouth[-1]["level"] == 0.0
    finished = got[-1]
    assert finished["outcome"] == "played" and finished["t"] == live.of("playback_finished", utt.id)[0].time
    assert hello["clock"] < finished["t"]


def test_an_interruption_ends_the_line_with_what_was_heard(live):
    async def body():
        async with websockets.connect(ws_url(live.url)) as ws:
            await ws.recv()
            utt = live.call(lambda: live.speaker.enqueue(LETTER))
            got = [json.loads(await ws.recv())]
            # two words heard (the first is announced as its line starts: its text may not be heard yet)
            while sum(m["type"] == "word" for m in got) < 2:
                got.append(json.loads(await ws.recv()))
            live.call(live.speaker.skip)
            return got + await until_finished(ws, utt.id)

    got = asyncio.run(body())
    end = got[-1]
    assert end["outcome"] == "interrupted" and 0 < end["played_fraction"] < 1 and end["heard_text"]
    planned = next(m for m in got if m["type"] == "line_timing")["words"]
    assert planned[-1]["text"] not in [m["text"] for m in got if m["type"] == "word"]


def test_the_sse_fallback_and_the_clock(live):
    with httpx.stream("GET", live.url + "/feed/sse", timeout=10) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        line = next(ln for ln in r.iter_lines() if ln.startswith("data: "))
        hello = json.loads(line[len("data: ") :])
    check_schema(hello)
    before = time.monotonic()
    clock = httpx.get(live.url + "/feed/clock").json()["clock"]
    assert before <= clock <= time.monotonic()


def test_the_guards_of_serve_hold_for_the_feed_and_the_pages(live):
    with pytest.raises(InputError, match="needs an API key"):
        EventsServer(host="0.0.0.0", port=0)

    async def body():
        async with EventsServer(live.speaker, port=0, api_key="s3cret") as events:
            url = events.url
            async with httpx.AsyncClient(base_url=url) as http:  # the server runs on this loop
                out = {"page": (await http.get("/overlay")).status_code}
                out["page+key"] = (await http.get("/overlay?key=s3cret")).status_code
                bearer = {"Authorization": "Bearer s3cret"}
                out["bearer"] = (await http.get("/feed/clock", headers=bearer)).status_code
            for name, target, extra in (
                ("ws", ws_url(url), {}),
                ("ws+key", ws_url(url) + "?key=s3cret", {}),
                ("ws+evil", ws_url(url) + "?key=s3cret", {"origin": "http://evil.example"}),
                ("ws+local", ws_url(url) + "?key=s3cret", {"origin": url}),
            ):
                try:
                    async with websockets.connect(target, **extra) as ws:
                        out[name] = json.loads(await ws.recv())["type"]
                except (websockets.InvalidStatus, websockets.ConnectionClosed) as e:
                    out[name] = type(e).__name__
            return out

    out = asyncio.run_coroutine_threadsafe(body(), live.loop).result(60)
    assert out == {"page": 401, "page+key": 200, "bearer": 200, "ws": "InvalidStatus", "ws+key": "hello",
                   "ws+evil": "InvalidStatus", "ws+local": "hello"}  # fmt: skip


@pytest.mark.slow
def test_16_speakers_feeds_at_once_lose_nothing_and_keep_order(synth):
    """16 Speakers playing at once, each followed by its own client: every word of every line
    arrives, in order, and no reader is ended for falling behind. The delivery lag (receipt minus
    the word's time) is what benchmarks/caption_lag.py reports."""
    lines = ["今日はいい天気ですね", "みんなで散歩に行きましょう"]

    async def body():
        speakers = [Speaker(synth, output=NullOutput(speed=1.0), events_server=EventsServer(port=0))
                    for _ in range(16)]  # fmt: skip
        words: list[list] = [[] for _ in speakers]
        for s, mine in zip(speakers, words):
            await s.open()
            s.on("word", mine.append)
        try:

            async def follow(s):
                async with websockets.connect(ws_url(s.events_server.url)) as ws:
                    await ws.recv()
                    handles = [s.enqueue(t) for t in lines]
                    got, done = [], 0
                    while done < len(handles):
                        msg = json.loads(await asyncio.wait_for(ws.recv(), 120))
                        if msg["type"] == "word":
                            got.append((msg["id"], msg["index"], msg["text"], msg["t"], time.monotonic()))
                        done += msg["type"] == "line_finished"
                    return got

            got = await asyncio.gather(*(follow(s) for s in speakers))
            lagged = [s.events_server.feed.lagged for s in speakers]
        finally:
            await asyncio.gather(*(s.aclose() for s in speakers))
        return got, words, lagged

    got, words, lagged = asyncio.run(body())
    assert lagged == [0] * 16
    for received, emitted in zip(got, words):
        assert [(g[0], g[1], g[2], g[3]) for g in received] == [(e.utterance_id, e.index, e.text, e.time)
                                                                for e in emitted]  # fmt: skip
        assert len(received) >= 8


def test_serve_plays_lines_itself_and_serves_the_pages(tmp_path):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "overlay.css").write_text("#caption { letter-spacing: 0.1em; }\n")
    srv = start_server(tmp_path / "srv", "--play", "null", "--overlay-dir", str(overlay), "--no-prewarm")
    try:
        page = httpx.get(srv.url + "/overlay")
        assert page.status_code == 200 and "feed.js" in page.text
        assert httpx.get(srv.url + "/overlay/user/overlay.css").text.startswith("#caption")
        assert httpx.get(srv.url + "/overlay/user/..%2Fsecret").status_code == 404
        for name in ("overlay.js", "feed.js", "studio.js", "overlay.css", "studio.css"):
            assert httpx.get(srv.url + "/static/" + name).status_code == 200
        assert httpx.get(srv.url + "/studio/api/info").json()["speaker"] is True

        async def body():
            async with websockets.connect(ws_url(srv.url)) as ws:
                await ws.recv()
                say = {"text": "配信を始めます", "voice": "7"}
                r = httpx.post(srv.url + "/studio/api/speaker/say", json=say)
                assert r.status_code == 200, r.text
                return await until_finished(ws, r.json()["id"])

        got = asyncio.run(body())
        assert got[-1]["outcome"] == "played"
        assert [m["text"] for m in got if m["type"] == "word"]
        assert next(m for m in got if m["type"] == "line_queued")["line"]["voice"] == "リファレンス"
    finally:
        assert srv.stop() == 130, srv.log.read_text()[-2000:]  # Ctrl-C
