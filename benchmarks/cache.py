"""Time to first audio: phrase cache hit vs miss, at the cache API and through the Speaker.

    python benchmarks/cache.py                          # tiny-random on CPU (offline)
    python benchmarks/cache.py --model v2 --backend cuda --lines 5

API level, per line:
  miss, whole     synthesize() until the whole line is there (what prebuild / a non-streaming
                  Speaker waits for)
  miss, streamed  stream() until its first chunk
  hit             PhraseCache.lookup(): key, index row, read + sha256 check, decode
  store           PhraseCache.put() after a miss (write, fsync, rename, index row)
Speaker level: enqueue -> first sample heard (Speaker metrics, NullOutput paced at 10x real
time), plain synthesizer (miss) vs the same synthesizer through the cache (hit).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import tempfile
import time

import numpy as np

LINES = [
    "いらっしゃい！ゆっくりしていってね。",
    "スーパーチャットありがとう！",
    "メンバー登録ありがとう！",
    "みんな、こんばんは！",
    "今日も配信を始めるよ。",
    "ちょっとお茶を飲むね。",
    "コメント、どんどん書いてね。",
    "それじゃあ、またね！",
    "おつかれさまでした！",
    "次のゲームに行ってみよう。",
]


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q))


def row(name: str, xs: list[float]) -> str:
    ms = [1000 * x for x in xs]
    return (
        f"{name:<28} {len(ms):>4} {statistics.median(ms):>10.2f} {pct(ms, 90):>10.2f} "
        f"{min(ms):>10.2f} {max(ms):>10.2f}"
    )


def api_level(synth, cache, lines, options, repeat: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"miss, whole": [], "miss, streamed": [], "hit": [], "store": []}
    for _ in range(repeat):
        cache.clear()
        for text in lines:
            t0 = time.perf_counter()
            res = synth.synthesize(text, None, options)
            out["miss, whole"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            stream = synth.stream(text, None, options)
            next(stream)
            out["miss, streamed"].append(time.perf_counter() - t0)
            stream.close()
            t0 = time.perf_counter()
            cache.store(synth, text, None, options, res.audio, res.record)
            out["store"].append(time.perf_counter() - t0)
        for text in lines:
            t0 = time.perf_counter()
            line = cache.lookup(synth, text, None, options)
            out["hit"].append(time.perf_counter() - t0)
            assert line is not None
    return out


def speaker_level(synth, cache, lines, options) -> dict[str, list[float]]:
    from irodori_speaker.outputs import NullOutput
    from irodori_speaker.speaker import Speaker

    async def ttfa(s) -> list[float]:
        got = []
        async with Speaker(s, output=NullOutput(speed=10.0), options=options, prewarm=False) as sp:
            for text in lines:  # one at a time: nothing queued ahead, nothing prefetched
                h = await sp.say(text)
                got.append(h.timings["playback_started"] - h.timings["enqueued"])
        return got

    return {
        "Speaker, miss (streaming)": asyncio.run(ttfa(synth)),
        "Speaker, hit": asyncio.run(ttfa(cache.wrap(synth))),
    }


def main() -> None:
    import torch

    from irodori_speaker.cache import PhraseCache
    from irodori_speaker.options import SynthesisOptions
    from irodori_speaker.synthesis.loading import load_synthesizer

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="model source (default: tiny-random)")
    p.add_argument("--backend", default="cpu", choices=["auto", "cuda", "mps", "cpu"])
    p.add_argument("--lines", type=int, default=len(LINES), help="how many lines (<= 10)")
    p.add_argument("--repeat", type=int, default=3, help="rounds of the API-level measurement")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--audio-format", default="f32", choices=["f32", "flac"])
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    synth = load_synthesizer(args.model, backend=args.backend, tiny_random=args.model is None)
    options = SynthesisOptions(seed=0)
    lines = LINES[: args.lines]
    synth.prewarm()
    with tempfile.TemporaryDirectory() as d, PhraseCache(d, audio_format=args.audio_format) as cache:
        api = api_level(synth, cache, lines, options, args.repeat)
        spk = speaker_level(synth, cache, lines, options)
        audio_s = statistics.mean(cache.lookup(synth, t, None, options).duration for t in lines)
    model = args.model or "tiny-random"
    rendered = synth.resolve_options(options)  # what the lines ran with: the preset resolved once
    print(
        f"phrase cache, time to first audio: {model} on {synth.device} "
        f"({torch.get_num_threads()} threads), {rendered.steps} steps {rendered.schedule}, "
        f"{len(lines)} lines of {audio_s:.2f} s mean, {args.audio_format} entries; "
        f"{platform.node()} {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
    )
    print(f"{'path':<28} {'n':>4} {'median ms':>10} {'p90 ms':>10} {'min ms':>10} {'max ms':>10}")
    for name, xs in {**api, **spk}.items():
        print(row(name, xs))
    miss, hit = statistics.median(api["miss, whole"]), statistics.median(api["hit"])
    print(f"hit vs whole-line miss: {miss / hit:.0f}x faster to the audio")


if __name__ == "__main__":
    main()
