"""Load on the real speech server: N concurrent clients, none lost.

Starts `irodori-speaker serve --tiny-random --backend cpu` on a loopback port (the same
start as tests/server), then fires N requests at once with one httpx AsyncClient: half
VOICEVOX pairs (POST /audio_query, then POST /synthesis), half OpenAI
POST /v1/audio/speech (response_format=pcm, read as a stream). Every request must end
as 200 with decodable audio; a 503 with a Retry-After header (the queue limit,
--max-queue) is a rejection, and anything else (another status, a transport error, empty
audio) is lost. At the server's default settings a 200-request burst queues whole: the
exit status is 1 if any request was rejected or lost (with --max-queue given, only if
lost). Texts differ per request and the phrase cache is off, so every request is a
synthesis; /metrics' irodori_rejected_total is read at the end and must agree.

The VOICEVOX pair needs the server's `/audio_query`, which makes its accent phrases with
pyopenjtalk (the `ja` extra). One `/audio_query` is asked before the burst: where the server
answers that it lacks pyopenjtalk (the H200 image: its dictionary is too large to carry), the
burst is OpenAI requests only, with a printed note, rather than 100 lost requests.
`--json PATH` writes the table's figures (benchmarks/concurrency.py runs this as its server
stage and keeps them with its own rows).

`--full` (a GPU): the server runs the full-size 500M model instead (random weights, as
benchmarks/news5.py makes them, its approximate tokenizer and 10 s reference voice) on the
CUDA preset, int4 weights by default (`--full bf16`: bf16 weights), and the texts are the
news5 sentences in turn.

    python benchmarks/server_load.py                      # 200 requests at the server's defaults
    python benchmarks/server_load.py --max-queue 16       # a small queue: 503s with Retry-After
    python benchmarks/server_load.py --full int4          # on the H200, at the defaults too
    python benchmarks/server_load.py -n 100 --gil-profile /tmp/gil.txt   # who holds the GIL, by part
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import httpx
import soundfile as sf

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent / "tests" / "server"))
import spy_profile  # noqa: E402
from server_helpers import start_server  # noqa: E402  (the tests' real-server start)

from irodori_speaker.cli.common import EXIT_INTERRUPTED  # noqa: E402  (serve's graceful Ctrl-C)


@dataclass
class Outcome:
    kind: str  # "voicevox" | "openai"
    status: int | None  # None: a transport error
    ttfb_s: float = 0.0
    total_s: float = 0.0
    audio_ok: bool = False
    retry_after: bool = False
    error: str = ""


TEXTS: list[str] = []  # --full: the news5 sentences


def _text(i: int) -> str:
    if TEXTS:  # a number in front keeps every request a distinct line
        return f"{i}番、{TEXTS[i % len(TEXTS)]}"
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


ROUTES = ["voicevox", "openai"]


async def one(client: httpx.AsyncClient, i: int) -> Outcome:
    kind = ROUTES[i % len(ROUTES)]
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


def summary(outcomes: list[Outcome]) -> dict[str, dict]:
    """Per route and "all": requests, ok, rejected (503 with Retry-After), lost, and the p50 / p95
    seconds to the first byte and to the end of the answer (over the answered requests)."""
    out = {}
    for kind in (*ROUTES, "all"):
        group = [o for o in outcomes if kind in ("all", o.kind)]
        ok = [o for o in group if o.status == 200 and o.audio_ok]
        busy = [o for o in group if o.status == 503 and o.retry_after]
        ttfb, total = [o.ttfb_s for o in ok], [o.total_s for o in ok]
        out[kind] = {
            "requests": len(group),
            "ok": len(ok),
            "rejected": len(busy),
            "lost": len(group) - len(ok) - len(busy),
            "ttfb_p50_s": pct(ttfb, 50),
            "ttfb_p95_s": pct(ttfb, 95),
            "total_p50_s": pct(total, 50),
            "total_p95_s": pct(total, 95),
        }
    return out


def report(outcomes: list[Outcome], wall_s: float, rss_mib: float) -> tuple[str, int, int]:
    rows = ["| client | requests | ok | rejected (503) | lost | TTFB p50 / p95 s | total p50 / p95 s |"]
    rows.append("|---|---|---|---|---|---|---|")
    groups = summary(outcomes)
    for kind, g in groups.items():
        ttfb, total = (
            f"{g['ttfb_p50_s']:.2f} / {g['ttfb_p95_s']:.2f}",
            f"{g['total_p50_s']:.2f} / {g['total_p95_s']:.2f}",
        )
        rows.append(
            f"| {kind} | {g['requests']} | {g['ok']} | {g['rejected']} | {g['lost']} | {ttfb} | {total} |"
        )
    rows.append("")
    rows.append(f"wall {wall_s:.1f} s for all requests; server peak RSS (VmHWM) {rss_mib:.0f} MiB")
    for o in [o for o in outcomes if not (o.status == 200 and o.audio_ok) and not o.retry_after][:5]:
        rows.append(f"lost: {o.kind} status={o.status} {o.error}")
    return "\n".join(rows), groups["all"]["lost"], groups["all"]["rejected"]


def voicevox_note(url: str) -> str | None:
    """None when the server's /audio_query answers; else why the VOICEVOX pair is left out (the
    server lacks pyopenjtalk). Any other failure is left to the burst to show as lost requests."""
    r = httpx.post(url + "/audio_query", params={"text": _text(0), "speaker": 0}, timeout=120.0)
    if r.status_code != 200 and "pyopenjtalk" in r.text:
        detail = " ".join(r.text.split())[:160]
        return f"VOICEVOX pairs left out: /audio_query needs pyopenjtalk ({r.status_code}: {detail})"
    return None


def serve_full(weights: str, argv: list[str]) -> int:
    """The server process of `--full`: news5's random full-size model on the CUDA preset."""
    import news5  # benchmarks/news5.py: the same files, tokenizer and voice as its modes

    from irodori_speaker.cli import build_parser
    from irodori_speaker.cli.serve import settings_from_args
    from irodori_speaker.server import ServerParts
    from irodori_speaker.server.config import load_voice_book
    from irodori_speaker.server.run import serve

    if weights == "smoke":  # the same path on the CPU with news5's tiny files (checks this script)
        mode = news5.modes_for("cpu")["f"]
    else:
        mode = news5.modes_for("cuda")["e" if weights == "int4" else "d"]
    files = news5.prepare_files(int4=mode.int4, smoke=weights == "smoke")
    synth, _ = news5.build(mode, files)
    home = Path(tempfile.mkdtemp(prefix="irodori-load-voices-"))
    (home / "voices.toml").write_text(
        f'[[speakers]]\nname = "news"\n  [[speakers.styles]]\n  name = "ref10s"\n  id = 0\n'
        f'  latent = "{files["ref"]}"\n  aliases = ["alloy"]\n',
        encoding="utf-8",
    )
    args = build_parser().parse_args(["serve", *argv])
    try:
        serve(settings_from_args(args), ServerParts(synth, load_voice_book(str(home / "voices.toml"))))
    except KeyboardInterrupt:  # as the CLI: uvicorn re-raises Ctrl-C after its graceful stop
        return EXIT_INTERRUPTED
    return 0


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-full":  # the server process of --full
        return serve_full(sys.argv[2], sys.argv[3:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--requests", type=int, default=200)
    ap.add_argument("--max-queue", type=int, help="the server's --max-queue (default: its own, 512)")
    ap.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, s")
    ap.add_argument(
        "--full",
        choices=["int4", "bf16", "smoke"],
        help="the full-size model on CUDA (a GPU); smoke: news5's tiny files on the CPU, same path",
    )
    routes_help = (
        "both: VOICEVOX pairs and OpenAI requests in turn (OpenAI only, with a note, where the "
        "server lacks pyopenjtalk); openai: only POST /v1/audio/speech"
    )
    ap.add_argument("--routes", choices=["both", "openai"], default="both", help=routes_help)
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument(
        "--gil-profile",
        type=Path,
        metavar="RAW",
        help="sample the server's GIL holder with py-spy during the burst (raw stacks to RAW) and "
        "print its time by part (benchmarks/spy_profile.py)",
    )
    args = ap.parse_args()
    extra = ["--no-cache"] + (["--max-queue", str(args.max_queue)] if args.max_queue else [])
    if args.routes == "openai":
        ROUTES.remove("voicevox")
    cmd = None
    if args.full:
        TEXTS.extend(json.loads((BENCH / "data" / "news5.json").read_text(encoding="utf-8"))["sentences"])
        cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-full", args.full]
    with tempfile.TemporaryDirectory(prefix="irodori-load-") as home:
        server = start_server(Path(home), *extra, cmd=cmd, wait_s=900.0)
        try:
            note = voicevox_note(server.url) if "voicevox" in ROUTES else None
            if note:
                ROUTES.remove("voicevox")
            with (
                spy_profile.recording(server.proc.pid, args.gil_profile)
                if args.gil_profile
                else nullcontext()
            ):
                outcomes, wall = asyncio.run(fire(server.url, args.requests, args.timeout))
            rss = peak_rss_mib(server.proc.pid)
            counted = server.metric("irodori_rejected_total")
        finally:
            code = server.stop()
        table, lost, rejected = report(outcomes, wall, rss)
        log_tail = server.log.read_text(errors="replace")[-4000:]
    model = {
        None: "tiny-random, CPU",
        "smoke": "news5's tiny files, CPU preset",
    }.get(args.full, f"full-size random 500M, CUDA preset, {args.full} weights")
    print(f"server_load: {args.requests} concurrent requests, {model}, serve {' '.join(extra)}")
    if note:
        print(f"note: {note}")
    print(table)
    print(f"rejections counted in /metrics (irodori_rejected_total): {counted:.0f}")
    if args.gil_profile:
        print(spy_profile.gil_table(args.gil_profile, args.requests))
    failed = lost or code != EXIT_INTERRUPTED or counted < rejected or (rejected and not args.max_queue)
    if code != EXIT_INTERRUPTED:
        print(f"server exit status {code} (expected {EXIT_INTERRUPTED}: serve's graceful stop on Ctrl-C)")
    if rejected and not args.max_queue:
        print(f"{rejected} rejected at the default settings (expected 0: the burst queues)")
    if failed:
        print("server log (tail):\n" + log_tail)
    if args.json:
        figures = {
            "requests": args.requests,
            "model": model,
            "serve_args": extra,
            "routes": list(ROUTES),
            "note": note,
            "groups": summary(outcomes),
            "wall_s": wall,
            "server_peak_rss_mib": rss,
            "rejected_in_metrics": counted,
            "server_exit": code,
            "ok": not failed,
        }
        args.json.write_text(json.dumps(figures, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
