"""Load on the real speech server: N concurrent clients, none lost.

Starts `irodori-speaker serve --tiny-random --backend cpu` on a loopback port (the same
start as tests/server), then fires N requests at once with one httpx AsyncClient: half
VOICEVOX pairs (POST /audio_query, then POST /synthesis), half OpenAI
POST /v1/audio/speech (response_format=pcm, read as a stream). Every request must end
as 200 with decodable audio, or as 503 with a Retry-After header (the queue limit,
--max-queue); anything else (another status, a transport error, empty audio) is lost
and the exit status is 1. Texts differ per request and the phrase cache is off, so
every request is a synthesis.

    python benchmarks/server_load.py                      # 200 requests, the server's default queue
    python benchmarks/server_load.py --max-queue 256      # room for all of them: no 503
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import soundfile as sf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "server"))
from server_helpers import start_server  # the tests' real-server start


@dataclass
class Outcome:
    kind: str  # "voicevox" | "openai"
    status: int | None  # None: a transport error
    ttfb_s: float = 0.0
    total_s: float = 0.0
    audio_ok: bool = False
    retry_after: bool = False
    error: str = ""


def _text(i: int) -> str:
    return f"負荷試験の{i}番目の行です。"


async def voicevox(client: httpx.AsyncClient, i: int) -> Outcome:
    t0 = time.perf_counter()
    q = await client.post("/audio_query", params={"text": _text(i), "speaker": 0})
    if q.status_code != 200:
        return _refused("voicevox", q, t0)
    async with client.stream("POST", "/synthesis", params={"speaker": 0}, json=q.json()) as r:
        if r.status_code != 200:
            await r.aread()
            return _refused("voicevox", r, t0)
        body, ttfb = await _read(r, t0)
    total = time.perf_counter() - t0
    try:
        audio, _ = sf.read(io.BytesIO(body))
        ok = len(audio) > 0
    except Exception as e:  # any decode failure is a lost request
        return Outcome("voicevox", 200, ttfb, total, error=f"bad wav: {e}")
    return Outcome("voicevox", 200, ttfb, total, audio_ok=ok)


async def openai(client: httpx.AsyncClient, i: int) -> Outcome:
    t0 = time.perf_counter()
    payload = {"model": "tts-1", "voice": "alloy", "input": _text(i), "response_format": "pcm"}
    async with client.stream("POST", "/v1/audio/speech", json=payload) as r:
        if r.status_code != 200:
            await r.aread()
            return _refused("openai", r, t0)
        body, ttfb = await _read(r, t0)
    # pcm: 16-bit mono samples, so a whole response is a non-empty even number of bytes
    ok = len(body) > 0 and len(body) % 2 == 0
    return Outcome("openai", 200, ttfb, time.perf_counter() - t0, audio_ok=ok)


async def _read(r: httpx.Response, t0: float) -> tuple[bytes, float]:
    parts, ttfb = [], 0.0
    async for part in r.aiter_bytes():
        if part and not parts:
            ttfb = time.perf_counter() - t0
        parts.append(part)
    return b"".join(parts), ttfb


def _refused(kind: str, r: httpx.Response, t0: float) -> Outcome:
    dt = time.perf_counter() - t0
    return Outcome(kind, r.status_code, dt, dt, retry_after="retry-after" in r.headers, error=r.text[:200])


async def one(client: httpx.AsyncClient, i: int) -> Outcome:
    kind = "voicevox" if i % 2 == 0 else "openai"
    try:
        return await (voicevox if kind == "voicevox" else openai)(client, i)
    except httpx.HTTPError as e:
        return Outcome(kind, None, error=f"{type(e).__name__}: {e}")


async def fire(url: str, n: int, timeout_s: float) -> tuple[list[Outcome], float]:
    limits = httpx.Limits(max_connections=n + 8, max_keepalive_connections=n + 8)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout_s) as client:
        t0 = time.perf_counter()
        outcomes = await asyncio.gather(*(one(client, i) for i in range(n)))
        return list(outcomes), time.perf_counter() - t0


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def report(outcomes: list[Outcome], wall_s: float, rss_mib: float) -> tuple[str, int]:
    rows, lost = [], 0
    header = "| client | requests | ok | 503 (Retry-After) | lost | TTFB p50 / p99 s | total p50 / p99 s |"
    rows += [header, "|---|---|---|---|---|---|---|"]
    for kind in ("voicevox", "openai", "all"):
        group = [o for o in outcomes if kind in ("all", o.kind)]
        ok = [o for o in group if o.status == 200 and o.audio_ok]
        busy = [o for o in group if o.status == 503 and o.retry_after]
        bad = len(group) - len(ok) - len(busy)
        if kind == "all":
            lost = bad
        ttfb, total = [o.ttfb_s for o in ok], [o.total_s for o in ok]
        rows.append(
            f"| {kind} | {len(group)} | {len(ok)} | {len(busy)} | {bad} "
            f"| {pct(ttfb, 50):.2f} / {pct(ttfb, 99):.2f} | {pct(total, 50):.2f} / {pct(total, 99):.2f} |"
        )
    rows.append("")
    rows.append(f"wall {wall_s:.1f} s for all requests; server peak RSS (VmHWM) {rss_mib:.0f} MiB")
    for o in [o for o in outcomes if not (o.status == 200 and o.audio_ok) and not o.retry_after][:5]:
        rows.append(f"lost: {o.kind} status={o.status} {o.error}")
    return "\n".join(rows), lost


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--requests", type=int, default=200)
    ap.add_argument("--max-queue", type=int, help="the server's --max-queue (default: its own, 64)")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, s")
    args = ap.parse_args()
    extra = ["--no-cache"] + (["--max-queue", str(args.max_queue)] if args.max_queue else [])
    with tempfile.TemporaryDirectory(prefix="irodori-load-") as home:
        server = start_server(Path(home), *extra)
        try:
            outcomes, wall = asyncio.run(fire(server.url, args.requests, args.timeout))
            rss = peak_rss_mib(server.proc.pid)
        finally:
            code = server.stop()
    table, lost = report(outcomes, wall, rss)
    print(f"server_load: {args.requests} concurrent requests, serve {' '.join(extra)}")
    print(table)
    if code != 0:
        print(f"server exit status {code} (expected 0: a graceful stop)")
    return 1 if lost or code != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
