"""A livestream bot: chat in, speech out, a mouth that moves with it.

    # offline, on the tiny random model (noise), into a WAV file:
    python examples/livestream_bot.py --tiny-random --out bot.wav --duration 20
    # live: the real model, the default sound device, VTube Studio's mouth parameter:
    python examples/livestream_bot.py --voice aoi.wav --vts

What it shows:

- A pluggable chat source: anything that is an async iterator of `ChatMessage`.
  `SimulatedChat` plays a local script; a YouTube or Twitch client that yields
  `ChatMessage`s drops in (`Bot.run(source)`).
- Stock lines (opening, welcome, thanks) prebuilt into the phrase cache at start-up
  (`irodori_speaker.cache.prebuild`) and then served from it: no model work when they play.
- Comments read in priority lanes with a time-to-live: super chats first and never
  dropped, ordinary comments dropped once stale, idle talk only when nothing else waits.
- An LLM-style reply streamed through `Speaker.say_stream` (a fake token generator here):
  speech starts with the first sentence while the rest is still being "generated".
- The lip-sync events (`mouth`, ~50 Hz, timed to the sound card) driving a mouth
  parameter: printed, or sent to VTube Studio's plugin API (`--vts`; needs the optional
  `websockets` package: `pip install websockets`). With `--visemes` the mouth follows the
  `viseme` events instead (あいうえお + closed, from the estimated mora timing): VTube
  Studio's `MouthOpen` and `MouthSmile` take a shape per vowel (`VISEME_SHAPES`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from irodori_speaker.cache import PhraseCache
from irodori_speaker.cache.prebuild import prebuild
from irodori_speaker.cli import add_model_flags, load_from_args
from irodori_speaker.errors import IrodoriError
from irodori_speaker.options import SynthesisOptions
from irodori_speaker.speaker import Priority, Speaker

# ---------------------------------------------------------------------------------------------
# Chat
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatMessage:
    """One chat event, whatever the platform. `kind`: chat, superchat, member or question."""

    author: str
    text: str = ""
    kind: str = "chat"
    amount: str | None = None  # "¥500" for a super chat


SCRIPT: list[tuple[float, ChatMessage]] = [
    (1.0, ChatMessage("みかん", "こんばんは！", "chat")),
    (1.5, ChatMessage("たろう", kind="member")),
    (1.0, ChatMessage("ゆき", "今日は何するの？", "question")),
    (2.0, ChatMessage("けん", "初見です", "chat")),
    (0.5, ChatMessage("さくら", "いつも楽しみにしてます！", "superchat", "¥500")),
    (0.3, ChatMessage("りょう", "わこつ", "chat")),
    (0.3, ChatMessage("あおい", "声かわいい", "chat")),
    (3.0, ChatMessage("はると", "好きな食べ物は？", "question")),
    (2.5, ChatMessage("なな", kind="member")),
    (2.0, ChatMessage("そら", "おつかれさま", "chat")),
]


class SimulatedChat:
    """A local chat feed: `script` (delay, message) pairs, looped, `speed` times faster."""

    def __init__(self, script: Iterable[tuple[float, ChatMessage]] = SCRIPT, speed: float = 1.0) -> None:
        self.script = list(script)
        self.speed = speed

    async def __aiter__(self) -> AsyncIterator[ChatMessage]:
        while True:
            for delay, msg in self.script:
                await asyncio.sleep(delay / self.speed)
                yield msg


async def fake_llm(question: str, speed: float = 1.0) -> AsyncIterator[str]:
    """An LLM-style reply: a few characters per token, tokens arriving over time."""
    answers = {
        "何": "今日はね、みんなとお話ししながら、のんびりゲームをする予定だよ。最後まで見ていってね！",
        "食べ": "好きな食べ物はいちごだよ。甘くて、ちょっと酸っぱいところが好きなんだ。みんなは何が好き？",
    }
    reply = next(
        (a for k, a in answers.items() if k in question), "いい質問だね。うーん、ちょっと考えさせて！"
    )
    rng = random.Random(question)
    i = 0
    while i < len(reply):
        n = rng.randint(1, 3)
        await asyncio.sleep(rng.uniform(0.02, 0.08) / speed)
        yield reply[i : i + n]
        i += n


# ---------------------------------------------------------------------------------------------
# Mouth outputs
# ---------------------------------------------------------------------------------------------


# (MouthOpen, MouthSmile) per viseme: あ wide open, い spread, う rounded and small, え half
# open and spread, お open and rounded; closed with a neutral smile.
VISEME_SHAPES: dict[str, tuple[float, float]] = {
    "a": (1.0, 0.5),
    "i": (0.35, 1.0),
    "u": (0.3, 0.0),
    "e": (0.6, 0.8),
    "o": (0.75, 0.1),
    "closed": (0.0, 0.5),
}


class PrintMouth:
    """Prints the mouth level as a bar, at most `hz` lines a second (or the viseme)."""

    def __init__(self, hz: float = 8.0) -> None:
        self.period = 1.0 / hz
        self.last = 0.0
        self.count = 0

    async def send_shape(self, viseme: str) -> None:
        self.count += 1
        print(f"  viseme {viseme}", flush=True)

    async def send(self, level: float) -> None:
        self.count += 1
        now = time.monotonic()
        if now - self.last >= self.period or level == 0.0:
            self.last = now
            bar = "#" * round(level * 20)
            print(f"  mouth {level:4.2f} |{bar:<20}|", flush=True)

    async def close(self) -> None:
        pass


def vts_request(message_type: str, data: dict[str, Any], request_id: str | None = None) -> dict[str, Any]:
    """A VTube Studio public API request (see github.com/DenchiSoft/VTubeStudio)."""
    return {
        "apiName": "VTubeStudioPublicAPI",
        "apiVersion": "1.0",
        "requestID": request_id or uuid.uuid4().hex[:16],
        "messageType": message_type,
        "data": data,
    }


def vts_inject(parameter: str, value: float) -> dict[str, Any]:
    """InjectParameterDataRequest setting one (default or custom) tracking parameter."""
    return vts_inject_many({parameter: value})


def vts_inject_many(values: dict[str, float]) -> dict[str, Any]:
    """InjectParameterDataRequest setting several tracking parameters at once."""
    return vts_request(
        "InjectParameterDataRequest",
        {
            "faceFound": False,
            "mode": "set",
            "parameterValues": [{"id": k, "value": float(min(1.0, max(0.0, v)))} for k, v in values.items()],
        },
        "irodori-mouth",
    )


class VTubeStudioMouth:
    """Sets a VTube Studio parameter (default `MouthOpen`) from the mouth level.

    The first run asks VTube Studio for a plugin token (click "Allow" in VTube Studio) and
    keeps it in `token_file`. VTube Studio drops injected values not refreshed within 3 s,
    so the last value is re-sent every second.
    """

    PLUGIN: ClassVar[dict[str, str]] = {
        "pluginName": "irodori-speaker bot",
        "pluginDeveloper": "irodori-speaker",
    }

    def __init__(self, url: str, parameter: str = "MouthOpen", token_file: Path | None = None) -> None:
        self.url = url
        self.parameter = parameter
        self.token_file = token_file or Path(".vts_token")
        self.ws: Any = None
        self.value = 0.0
        self.values: dict[str, float] = {}  # the last shape (viseme mode), re-sent by the keepalive
        self.count = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._last_sent = 0.0

    async def _call(self, message_type: str, data: dict[str, Any]) -> dict[str, Any]:
        await self.ws.send(json.dumps(vts_request(message_type, data)))
        reply = json.loads(await asyncio.wait_for(self.ws.recv(), 60.0))
        if reply.get("messageType") == "APIError":
            raise RuntimeError(f"VTube Studio: {reply.get('data', {}).get('message', reply)}")
        return reply.get("data", {})

    async def open(self) -> None:
        import websockets  # optional: pip install websockets

        self.ws = await websockets.connect(self.url)
        token = self.token_file.read_text().strip() if self.token_file.is_file() else None
        if token is None:
            print("VTube Studio: allow the plugin in the VTube Studio window...", flush=True)
            token = (await self._call("AuthenticationTokenRequest", self.PLUGIN))["authenticationToken"]
            self.token_file.write_text(token)
        auth = await self._call("AuthenticationRequest", {**self.PLUGIN, "authenticationToken": token})
        if not auth.get("authenticated"):
            self.token_file.unlink(missing_ok=True)
            raise RuntimeError(f"VTube Studio refused the token ({auth.get('reason')}); run again")
        self._tasks = [asyncio.create_task(self._drain()), asyncio.create_task(self._keepalive())]
        print(f"VTube Studio: driving {self.parameter} at {self.url}", flush=True)

    async def _drain(self) -> None:  # answers to fire-and-forget injections
        with contextlib.suppress(Exception):
            async for _ in self.ws:
                pass

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if time.monotonic() - self._last_sent > 1.0:
                await self._inject_many(self.values or {self.parameter: self.value})

    async def _inject(self, value: float) -> None:
        await self._inject_many({self.parameter: value})

    async def _inject_many(self, values: dict[str, float]) -> None:
        self._last_sent = time.monotonic()
        with contextlib.suppress(Exception):
            await self.ws.send(json.dumps(vts_inject_many(values)))

    async def send(self, level: float) -> None:
        self.value = level
        self.count += 1
        await self._inject(level)

    async def send_shape(self, viseme: str) -> None:
        """A viseme as MouthOpen (this mouth's parameter) and MouthSmile."""
        opened, smile = VISEME_SHAPES.get(viseme, VISEME_SHAPES["closed"])
        self.values = {self.parameter: opened, "MouthSmile": smile}
        self.count += 1
        await self._inject_many(self.values)

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self.ws is not None:
            await self._inject_many({self.parameter: 0.0, **({"MouthSmile": 0.5} if self.values else {})})
            await self.ws.close()
            self.ws = None


# ---------------------------------------------------------------------------------------------
# The bot
# ---------------------------------------------------------------------------------------------

STOCK = {
    "opening": "みんな、こんばんは！今日も配信を始めるよ。",
    "welcome": "いらっしゃい！ゆっくりしていってね。",
    "member": "メンバー登録ありがとう！これからよろしくね。",
    "thanks": "スーパーチャットありがとう！",
}
IDLE = ["ちょっとお茶を飲むね。", "コメント、どんどん書いてね。", "今日はいい天気だったね。"]


class Bot:
    """Chat messages -> lines in the Speaker's lanes; mouth events -> the mouth output."""

    def __init__(
        self,
        speaker: Speaker,
        mouth: Any,
        *,
        speed: float = 1.0,
        idle_after_s: float = 6.0,
        visemes: bool = False,
    ) -> None:
        self.speaker = speaker
        self.mouth = mouth
        self.visemes = visemes  # drive the mouth from viseme events (あいうえお) instead of levels
        self.speed = speed
        self.idle_after_s = idle_after_s
        self.replying: asyncio.Task[Any] | None = None
        self.last_activity = time.monotonic()
        self.log: list[str] = []
        self._idle = 0

    def _say(self, text: str, priority: Priority | str, ttl: float | None = None, chat: bool = False) -> None:
        # a viewer's text: its pause markup is taken out (no one may stall the stream with 10 s)
        ttl = None if ttl is None else ttl / self.speed
        self.speaker.enqueue(text, priority=priority, ttl=ttl, pause_markup=not chat)
        print(f"[{priority!s:>6}] {text}", flush=True)

    def handle(self, msg: ChatMessage) -> None:
        self.last_activity = time.monotonic()
        print(f"chat <{msg.author}> {msg.kind} {msg.text}", flush=True)
        if msg.kind == "superchat":  # high lane, no TTL: it is read whatever else waits
            self._say(STOCK["thanks"], "high")
            self._say(f"{msg.author}さん、{msg.amount or ''}の{msg.text}", "high", chat=True)
        elif msg.kind == "member":
            self._say(STOCK["member"], "high", ttl=30)
            self._say(f"{msg.author}さん、ようこそ。", "high", ttl=30)
        elif msg.kind == "question" and self.replying is None:
            self.replying = asyncio.create_task(self.reply(msg))
        else:  # an ordinary comment goes stale if the bot is busy for too long
            self._say(f"{msg.author}さん、「{msg.text}」", "normal", ttl=15, chat=True)

    async def reply(self, msg: ChatMessage) -> None:
        print(f"[ reply] to {msg.author}: {msg.text}", flush=True)
        said: list[str] = []

        async def tokens() -> AsyncIterator[str]:
            async for tok in fake_llm(msg.text, self.speed):
                said.append(tok)
                yield tok

        try:
            handles = await self.speaker.say_stream(tokens(), priority="normal")
            print(f"[ reply] {len(handles)} segments: {''.join(said)}", flush=True)
        except IrodoriError as e:
            print(f"reply failed: {e}", flush=True)
        finally:
            self.replying = None

    def maybe_idle(self) -> None:
        quiet = time.monotonic() - self.last_activity > self.idle_after_s / self.speed
        if quiet and not self.speaker.queue and self.speaker.current is None:
            self._say(IDLE[self._idle % len(IDLE)], "low", ttl=5)
            self._idle += 1
            self.last_activity = time.monotonic()

    async def run(self, source: AsyncIterator[ChatMessage] | Any, duration: float | None) -> None:
        """Read `source` for `duration` seconds (scaled by speed; None: until it ends)."""
        if self.visemes:
            self.speaker.on("viseme", lambda ev: self.mouth.send_shape(ev.viseme))
        else:
            self.speaker.on("mouth", lambda ev: self.mouth.send(ev.level))
        self._say(STOCK["opening"], "high")
        deadline = None if duration is None else time.monotonic() + duration / self.speed
        it = aiter(source)
        pending: asyncio.Future[ChatMessage] | None = None
        try:
            while deadline is None or time.monotonic() < deadline:
                left = 0.5 if deadline is None else max(0.0, deadline - time.monotonic())
                if pending is None:  # one read in flight: a timeout must not cancel the source
                    pending = asyncio.ensure_future(anext(it))
                done, _ = await asyncio.wait({pending}, timeout=min(0.5, left))
                if not done:
                    self.maybe_idle()
                    continue
                task, pending = pending, None
                try:
                    msg = task.result()
                except StopAsyncIteration:
                    break
                self.handle(msg)
        finally:
            if pending is not None:
                pending.cancel()
                with contextlib.suppress(BaseException):
                    await pending
            with contextlib.suppress(Exception):
                await it.aclose()


async def amain(args: argparse.Namespace) -> int:
    from irodori_speaker.outputs import FileOutput

    synth = load_from_args(args)
    voice = args.voice
    options = SynthesisOptions(steps=args.steps, seed=args.seed)
    cache = PhraseCache(args.cache_dir)
    report = prebuild(synth, cache, STOCK.values(), voice=voice, options=options)
    print(f"stock lines: {report.summary()}", flush=True)
    output: Any = FileOutput(args.out, speed=args.speed) if args.out else args.output_device
    mouth: Any = PrintMouth(hz=8.0) if not args.quiet_mouth else _CountMouth()
    if args.vts:  # one connection for the whole run, closed on the way out whatever happens
        vts = VTubeStudioMouth(args.vts_url, args.vts_parameter, Path(args.cache_dir or ".") / "vts_token")
        try:
            await vts.open()
            mouth = vts
        except ImportError:
            print("VTube Studio needs the optional 'websockets' package (pip install websockets); printing")
        except Exception as e:
            await vts.close()
            print(f"VTube Studio is not reachable at {args.vts_url} ({e}); printing the mouth instead")
    try:
        async with Speaker(
            synth,
            cache=cache,  # stock lines play from the cache, without waiting for the model
            cache_store="prebuilt",  # only what prebuild rendered: chat replies are not stored
            output=output,
            voice=voice,
            options=options,
            ttl={"low": 5 / args.speed},
            max_queue=20,
        ) as speaker:
            bot = Bot(speaker, mouth, speed=args.speed, visemes=args.visemes)
            try:
                await bot.run(SimulatedChat(speed=args.speed), args.duration)
                if bot.replying is not None:  # let the answer being spoken finish
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(asyncio.shield(bot.replying), 30 / args.speed)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(speaker.drain(), args.drain_s)
            finally:
                if bot.replying is not None:
                    bot.replying.cancel()
                speaker.interrupt()
            m = speaker.metrics()
    finally:
        await mouth.close()
    stats = cache.stats()
    cache.close()
    ttfa = m.time_to_first_audio
    print(
        f"done: {m.lines_played} lines played, {m.lines_interrupted} interrupted, "
        f"{m.lines_skipped} skipped (expired/dropped), {m.lines_failed} failed; "
        f"{mouth.count} mouth events; cache {stats.session_hits} hits / {stats.session_misses} misses; "
        f"time to first audio median {_fmt(ttfa.p50)} s",
        flush=True,
    )
    if args.out:
        print(f"wrote {args.out}")
    return 0 if m.lines_failed == 0 else 1


class _CountMouth(PrintMouth):
    async def send(self, level: float) -> None:
        self.count += 1

    async def send_shape(self, viseme: str) -> None:
        self.count += 1


def _fmt(x: float) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_flags(p)  # the command line's: --tiny-random, --model, --backend, ...
    p.add_argument("--voice", help="reference voice file")
    p.add_argument("--steps", type=int, help="sampler steps (default: the preset's)")
    p.add_argument("--seed", type=int, default=0, help="seed of every line (stock lines are cached by it)")
    p.add_argument("--cache-dir", help="phrase cache directory (default: irodori-speaker's)")
    p.add_argument("--out", help="write what is played to this file (.wav, .flac, ...), not a sound device")
    p.add_argument("--output-device", help="sound device name (default: the system's default)")
    p.add_argument("--duration", type=float, default=None, help="stop reading chat after this many seconds")
    p.add_argument("--speed", type=float, default=1.0, help="run the simulated chat and a --out file faster")
    p.add_argument("--drain-s", type=float, default=60.0, help="at the end, wait this long for the queue")
    p.add_argument("--quiet-mouth", action="store_true", help="count mouth events instead of printing them")
    p.add_argument(
        "--visemes", action="store_true", help="move the mouth by visemes (あいうえお + closed), not levels"
    )
    p.add_argument("--vts", action="store_true", help="drive VTube Studio's mouth parameter")
    p.add_argument("--vts-url", default="ws://localhost:8001", help="VTube Studio API address")
    p.add_argument("--vts-parameter", default="MouthOpen", help="parameter to set (default MouthOpen)")
    args = p.parse_args(argv)
    if not args.speed > 0:
        p.error("--speed must be > 0")
    try:
        return asyncio.run(amain(args))
    except IrodoriError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
