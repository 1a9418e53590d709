"""The examples, run as a user runs them (a subprocess, offline, the tiny-random model), showing
what their docstrings promise; the VTube Studio path against a mock VTS websocket server."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import soundfile as sf

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.py"))
TINY = ["--tiny-random", "--backend", "cpu", "--steps", "2"]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("irodori-home")


def run(script: Path, args, home: Path, timeout: float = 240):
    env = dict(os.environ, IRODORI_CACHE=str(home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, str(script), *map(str, args)],
        env=env, capture_output=True, text=True, timeout=timeout, cwd=home,
    )  # fmt: skip


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.name)
def test_every_example_takes_the_command_lines_model_options(script, home):
    r = run(script, ["--help"], home)
    assert r.returncode == 0, r.stderr
    for flag in (
        "--tiny-random",
        "--tiny-kind",
        "--model",
        "--codec",
        "--tokenizer",
        "--backend",
        "--device",
    ):
        assert flag in r.stdout, (script.name, flag)


def test_speaker_basic_shows_lanes_streaming_interrupt_and_lip_sync(home, tmp_path):
    wav = tmp_path / "basic.wav"
    args = ["--tiny-random", "--backend", "cpu", "--out", wav, "--speed", "4"]
    r = run(REPO / "examples" / "speaker_basic.py", args, home)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    spoken = re.findall(r"speaking #\d+: (.*)", r.stdout)
    # lanes: queued low, normal, high at once; spoken high first
    assert spoken[:3] == [
        "スーパーチャットありがとうございます！",
        "コメントありがとう！",
        "雑談です。今日はいい天気ですね。",
    ]
    assert spoken[3:6] == [
        "それでは、",
        "今日のニュースをお伝えします。",
        "東京は晴れ、最高気温は二十五度です。",
    ]
    cut = re.search(r"cut after (\d+)%: heard '(.*)'", r.stdout)
    assert cut, r.stdout  # the long line was playing when interrupted
    assert 0 < int(cut.group(1)) < 100 and "この長い話は" in cut.group(2)
    frames = re.search(r"lip-sync frames (\d+) \((\d+) with the mouth open\)", r.stdout)
    assert frames and int(frames.group(1)) > 50 and int(frames.group(2)) > 0, r.stdout
    assert "interrupted 1" in r.stdout
    assert sf.info(str(wav)).samplerate == 48_000


def test_news_reader_reads_the_five_sentences_back_to_back(home, tmp_path):
    wav = tmp_path / "news.wav"
    r = run(REPO / "examples" / "news_reader.py", [*TINY, "--seconds", "0.5", "--out", wav], home)
    assert r.returncode == 0, r.stderr
    assert "5 sentences" in r.stdout and r.stdout.count(" playing at ") == 5
    audio, sr = sf.read(str(wav), dtype="float32")
    assert sr == 48_000
    assert len(audio) == pytest.approx(5 * 0.5 * sr + 4 * 0.4 * sr, abs=0.05 * sr)  # lines + pauses


BOT = ["--out", "bot.wav", "--duration", "20", "--speed", "8", "--quiet-mouth"]


def test_livestream_bot_runs_end_to_end_offline_to_a_file(home, tmp_path):
    args = [*TINY, *BOT, "--cache-dir", tmp_path / "cache"]
    r = run(REPO / "examples" / "livestream_bot.py", args, tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    out = r.stdout
    assert "stock lines: 4 phrases: 4 rendered" in out
    assert "chat <" in out and "[  high] スーパーチャットありがとう！" in out
    assert "[ reply]" in out and "segments:" in out  # an LLM-style reply was streamed
    done = re.search(r"done: (\d+) lines played.*?(\d+) failed; (\d+) mouth events; cache (\d+) hits", out)
    assert done, out[-1500:]
    played, failed, mouth, hits = map(int, done.groups())
    assert played >= 3 and failed == 0 and mouth > 0 and hits >= 1  # stock lines served from the cache
    info = sf.info(str(tmp_path / "bot.wav"))
    assert info.samplerate == 48_000 and info.duration > 2.0


class MockVTubeStudio:
    """A stand-in for VTube Studio's plugin API on 127.0.0.1 (the real app cannot run here: it is
    a desktop program with a GPU-rendered avatar). Speaks the public API's authentication and
    parameter-injection messages, and records connections, requests and how each one ended."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[dict] = []
        self.close_codes: list[int | None] = []
        self.port = 0
        self._ready = threading.Event()
        self._open = 0  # connections not yet ended (counted on the mock's own loop)
        self._idle = threading.Event()  # none open: every request sent has been read
        self._idle.set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Future | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _handler(self, ws) -> None:
        from websockets.exceptions import ConnectionClosed

        self.connections += 1
        self._open += 1
        self._idle.clear()
        try:
            async for raw in ws:
                msg = json.loads(raw)
                self.requests.append(msg)
                kind = msg["messageType"]
                data: dict = {}
                if kind == "AuthenticationTokenRequest":
                    data = {"authenticationToken": "mock-token"}
                elif kind == "AuthenticationRequest":
                    data = {
                        "authenticated": msg["data"].get("authenticationToken") == "mock-token",
                        "reason": "",
                    }
                reply = {**{k: msg[k] for k in ("apiName", "apiVersion", "requestID")}, "data": data}
                # The client may close while this mock is behind on a busy machine: an answer
                # then fails, but the requests it sent before closing are still queued here and
                # must be read (stopping at the first failed answer lost the bot's last one).
                with contextlib.suppress(ConnectionClosed):
                    await ws.send(json.dumps({**reply, "messageType": kind.replace("Request", "Response")}))
        except ConnectionClosed:
            pass  # closed without a close frame
        finally:
            await ws.wait_closed()
            self.close_codes.append(ws.close_code)
            self._open -= 1
            if self._open == 0:
                self._idle.set()

    async def _serve(self) -> None:
        from websockets.asyncio.server import serve

        self._loop = asyncio.get_running_loop()
        self._stop = self._loop.create_future()
        async with serve(self._handler, "127.0.0.1", 0) as server:
            self.port = next(iter(server.sockets)).getsockname()[1]
            self._ready.set()
            await self._stop

    def __enter__(self) -> MockVTubeStudio:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        assert self._loop is not None and self._stop is not None
        self._idle.wait(10)  # a client that closed is read to its close frame before the server stops
        self._loop.call_soon_threadsafe(self._stop.set_result, None)
        self._thread.join(10)

    def injected(self) -> list[float]:
        return [
            r["data"]["parameterValues"][0]["value"]
            for r in self.requests
            if r["messageType"] == "InjectParameterDataRequest"
        ]


def test_livestream_bot_vts_uses_one_connection_and_closes_it(home, tmp_path):
    pytest.importorskip("websockets", reason="the 'vts' / 'dev' extra (websockets) is not installed")
    cache = tmp_path / "cache"
    with MockVTubeStudio() as vts:
        args = [*TINY, *BOT, "--cache-dir", cache, "--vts", "--vts-url", f"ws://127.0.0.1:{vts.port}"]
        r = run(REPO / "examples" / "livestream_bot.py", args, tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert f"VTube Studio: driving MouthOpen at ws://127.0.0.1:{vts.port}" in r.stdout
    assert vts.connections == 1  # it used to open a second session and never close the first
    assert vts.close_codes == [1000]  # closed by the bot, cleanly, before it exited
    kinds = [q["messageType"] for q in vts.requests]
    assert kinds[:2] == ["AuthenticationTokenRequest", "AuthenticationRequest"]
    values = vts.injected()
    assert len(values) > 10 and max(values) > 0.05  # the mouth moved with the speech
    assert values[-1] == 0.0  # and was left closed
    assert (cache / "vts_token").read_text() == "mock-token"  # the next run skips the prompt


def test_vts_messages_follow_the_public_api():
    spec = importlib.util.spec_from_file_location("livestream_bot", REPO / "examples" / "livestream_bot.py")
    bot = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bot  # dataclasses look their module up
    try:
        spec.loader.exec_module(bot)
    finally:
        del sys.modules[spec.name]
    msg = bot.vts_inject("MouthOpen", 1.7)
    assert msg["apiName"] == "VTubeStudioPublicAPI" and msg["apiVersion"] == "1.0"
    assert msg["messageType"] == "InjectParameterDataRequest" and 1 <= len(msg["requestID"]) <= 64
    assert msg["data"]["parameterValues"] == [{"id": "MouthOpen", "value": 1.0}]  # clamped to [0, 1]
    assert msg["data"]["mode"] == "set"
    json.dumps(msg)


def test_livestream_bot_drives_vts_by_visemes(home, tmp_path):
    """--visemes: VTube Studio's MouthOpen and MouthSmile follow the viseme events (the VTS side
    is MockVTubeStudio: the real app cannot run here)."""
    pytest.importorskip("websockets", reason="the 'vts' / 'dev' extra (websockets) is not installed")
    pytest.importorskip("pyopenjtalk", reason="visemes come from pyopenjtalk's reading")
    spec = importlib.util.spec_from_file_location("livestream_bot", REPO / "examples" / "livestream_bot.py")
    bot = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bot
    try:
        spec.loader.exec_module(bot)
    finally:
        del sys.modules[spec.name]
    cache = tmp_path / "cache"
    with MockVTubeStudio() as vts:
        args = [
            *TINY,
            *BOT,
            "--cache-dir",
            cache,
            "--vts",
            "--vts-url",
            f"ws://127.0.0.1:{vts.port}",
            "--visemes",
        ]
        r = run(REPO / "examples" / "livestream_bot.py", args, tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    shapes = [
        {p["id"]: p["value"] for p in q["data"]["parameterValues"]}
        for q in vts.requests
        if q["messageType"] == "InjectParameterDataRequest"
    ]
    both = [s for s in shapes if set(s) == {"MouthOpen", "MouthSmile"}]
    assert len(both) > 20  # one per viseme change of every line played
    seen = {(s["MouthOpen"], s["MouthSmile"]) for s in both}
    expected = set(bot.VISEME_SHAPES.values())
    assert seen <= expected and len(seen) >= 4  # several vowels, and closed
    assert both[-1] == {"MouthOpen": 0.0, "MouthSmile": 0.5}  # left closed
