"""Caption lag: when the overlay shows each word against the word's time on the playback clock.

A real Speaker (tiny-random model on the CPU, NullOutput at real-time speed) served by
`EventsServer`; headless Chromium (Debian's chromium + chromium-driver, Selenium) shows
`/overlay`, and the page logs for every word the moment it put it on screen and its lag
(shown - the word event's time, mapped onto the page clock by the feed's ping/pong). Rows:

- "prefetched": lines queued back to back, each rendered while the one before plays (a bot
  that talks on): its timing exists before it is heard;
- "streamed, first": a line alone, playing from its first chunk while the rest is rendered: the
  Speaker announces its words when the line's timing exists (at the end of its synthesis), so
  its early words are late by the rest of the synthesis; "page part" is what the page adds to
  when the Speaker delivered the event;
- "feed, 16 Speakers": 16 Speakers speaking at once, a `websockets` client per feed: receipt
  minus the word's time (no browser), and "feed part": receipt minus when the Speaker delivered
  the word event (what the feed and the socket add).

Run: ``python benchmarks/caption_lag.py`` (``--lines N`` per row).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import tempfile
import threading
import time
from typing import Any

import numpy as np

SENTENCES = [
    "今日はいい天気ですね、みんなで散歩に行きましょう。",
    "それでは次のお便りを読んでいきます。",
    "コメントありがとう、とても嬉しいです！",
    "今夜は新しいゲームに挑戦してみようと思います。",
    "こんにちは、おげんきですか",
]


def pct(values: list[float]) -> str:
    if not values:
        return "-"
    a = np.abs(np.asarray(values))
    return f"{np.percentile(a, 50):6.1f} {np.percentile(a, 95):6.1f} {a.max():6.1f}"


def browser() -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(arg)
    return webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver")))


def overlay_rows(synth: Any, n: int) -> dict[str, list[float]]:
    from irodori_speaker.outputs import NullOutput
    from irodori_speaker.server.events_server import EventsServer
    from irodori_speaker.speaker import Speaker

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    run = lambda coro: asyncio.run_coroutine_threadsafe(coro, loop).result(300)  # noqa: E731
    received: dict[int, float] = {}
    words: list[Any] = []
    speaker = Speaker(synth, output=NullOutput(speed=1.0), pause_s=0.2, events_server=EventsServer(port=0))

    def got(ev: Any) -> None:
        received[id(ev)] = time.monotonic()
        words.append(ev)

    async def open_() -> None:
        await speaker.open()
        speaker.on("word", got)

    run(open_())
    driver = browser()
    rows: dict[str, list[float]] = {"prefetched": [], "streamed, first": [], "streamed, page part": []}
    try:
        driver.get(speaker.events_server.url + "/overlay?hold=100&fade=50")
        deadline = time.monotonic() + 30
        while not driver.execute_script("return window.__irodori && window.__irodori.feed.bestRtt < 1e9"):
            if time.monotonic() > deadline:
                raise RuntimeError("the overlay did not connect")
            time.sleep(0.05)

        async def enqueue(texts: list[str]) -> list[Any]:
            return [speaker.enqueue(t) for t in texts]

        async def wait(handles: list[Any]) -> None:
            for h in handles:
                await h

        for i in range(n):  # a line alone (streamed), then two back to back (the second prefetched)
            alone = run(enqueue([SENTENCES[i % len(SENTENCES)]]))
            run(wait(alone))
            time.sleep(0.5)
            pair = run(enqueue([SENTENCES[(i + 1) % len(SENTENCES)], SENTENCES[(i + 2) % len(SENTENCES)]]))
            run(wait(pair))
            time.sleep(0.5)
            log = driver.execute_script("return window.__irodori.log")
            for h, row in ((alone[0], "streamed, first"), (pair[1], "prefetched")):
                mine = [e for e in log if e["id"] == h.id]
                rows[row] += [e["lag"] for e in mine]
                if row == "streamed, first":
                    evs = {(w.utterance_id, w.index): w for w in words}
                    for e in mine:
                        w = evs.get((h.id, e["index"]))
                        if w is not None:  # on screen minus when it could first be shown
                            ready = max(e["t"], received[id(w)])
                            rows["streamed, page part"].append((e["t"] + e["lag"] / 1000 - ready) * 1000)
    finally:
        driver.quit()
        run(speaker.aclose())
        loop.call_soon_threadsafe(loop.stop)
    return rows


def feed_rows(synth: Any, speakers: int) -> tuple[list[float], list[float]]:
    import websockets

    from irodori_speaker.outputs import NullOutput
    from irodori_speaker.server.events_server import EventsServer
    from irodori_speaker.speaker import Speaker

    async def body() -> tuple[list[float], list[float]]:
        ss = [
            Speaker(synth, output=NullOutput(speed=1.0), events_server=EventsServer(port=0))
            for _ in range(speakers)
        ]
        delivered: dict[tuple[int, int, int], float] = {}
        for k, s in enumerate(ss):
            await s.open()
            s.on(
                "word", lambda ev, k=k: delivered.setdefault((k, ev.utterance_id, ev.index), time.monotonic())
            )
        lags: list[float] = []
        feed_part: list[float] = []

        async def follow(k: int, s: Any) -> None:
            url = s.events_server.url.replace("http://", "ws://") + "/feed"
            async with websockets.connect(url) as ws:
                await ws.recv()
                hs = [s.enqueue(t) for t in SENTENCES[:2]]
                done = 0
                while done < len(hs):
                    msg = json.loads(await ws.recv())
                    if msg["type"] == "word":
                        now = time.monotonic()
                        lags.append((now - msg["t"]) * 1000)
                        feed_part.append((now - delivered[(k, msg["id"], msg["index"])]) * 1000)
                    done += msg["type"] == "line_finished"

        try:
            await asyncio.gather(*(follow(k, s) for k, s in enumerate(ss)))
        finally:
            await asyncio.gather(*(s.aclose() for s in ss))
        return lags, feed_part

    return asyncio.run(body())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=5, help="lines per row (default 5)")
    ap.add_argument("--speakers", type=int, default=16, help="Speakers of the feed row (default 16)")
    args = ap.parse_args()
    os.environ.setdefault("IRODORI_CACHE", tempfile.mkdtemp(prefix="caption-lag-"))
    from irodori_speaker.synthesis.loading import load_synthesizer

    synth = load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False)
    rows = overlay_rows(synth, args.lines)
    lags, feed_part = feed_rows(synth, args.speakers)
    rows[f"feed, {args.speakers} Speakers"] = lags
    rows["feed part (vs delivery)"] = feed_part
    print(f"caption lag, ms (|lag|; tiny-random on the CPU, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores)")  # fmt: skip
    print(f"{'row':24s} {'words':>5s} {'p50':>6s} {'p95':>6s} {'max':>6s}")
    for name, values in rows.items():
        print(f"{name:24s} {len(values):5d} {pct(values)}")


if __name__ == "__main__":
    main()
