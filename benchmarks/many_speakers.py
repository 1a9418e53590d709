"""Many Speakers on one model: holes inside streamed lines, and when each line starts.

N Speakers share one synthesizer (the tiny random model on the CPU by default), each speaking
`--lines` streamed lines on a NullOutput paced at real time; an underrun there is a hole a
listener hears. Only names of the package root are used, so the same script runs against an older
tree (`PYTHONPATH=<old tree>/src python benchmarks/many_speakers.py`) for a side-by-side.

    python benchmarks/many_speakers.py --speakers 16,32 --lines 3 --repeat 3
    python benchmarks/many_speakers.py --max-batch 32                    # lines stepped together
    python benchmarks/many_speakers.py --max-batch 32 --batching line    # whole-line batches (old)
    python benchmarks/many_speakers.py --speakers 16 --high-every 4       # a high lane beside normal ones
    python benchmarks/many_speakers.py --full o --speakers 16,32 --lines 3  # GPU: news5's full-size (o)

`--full MODE` (a GPU): news5's random full-size model of that mode (benchmarks/news5.py: e is v2,
o v4.1-MF, int4 weights) at the CUDA preset's own max_batch, prewarmed with news5's voice; each
Speaker speaks news5's sentences in that voice (v4 lines asked for v2's seconds estimate, as
news5 does), not the tiny model's 2 s lines.

Columns: per lane (with --high-every), lines with a hole (of all lines, over the repeats), first
audio = enqueue of a Speaker's first line -> its playback start (p50 / p95 over Speakers and
repeats), wall of a repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import time

from irodori_speaker import NullOutput, Speaker, SynthesisOptions, load_synthesizer


def _tiny_texts(i: int, lines: int) -> list[tuple[str, dict]]:
    return [(f"話者{i}の{k}行目です", {}) for k in range(lines)]


async def _speaker(
    synth, opts, i: int, lines: int, holes: set[tuple[int, int]], priority: str, texts=_tiny_texts, voice=None
) -> float | None:
    output = NullOutput(speed=1.0)
    async with Speaker(synth, output=output, voice=voice, options=opts, prewarm=False) as s:
        s.on("underrun", lambda e: holes.add((i, e.utterance_id)))
        hs = [s.enqueue(text, priority=priority, **fields) for text, fields in texts(i, lines)]
        await asyncio.gather(*(h.wait() for h in hs))
        t = hs[0].timings
        return t["playback_started"] - t["enqueued"] if "playback_started" in t else None


def _lane(i: int, high_every: int) -> str:
    return "high" if high_every and i % high_every == 0 else "normal"


async def _round(
    synth, opts, speakers: int, lines: int, high_every: int, texts=_tiny_texts, voice=None
) -> dict[str, tuple]:
    """Per lane ("normal", and "high" with --high-every): holes, first audio times, and the wall."""
    holes: set[tuple[int, int]] = set()
    t0 = time.monotonic()
    lanes = [_lane(i, high_every) for i in range(speakers)]
    runs = (_speaker(synth, opts, i, lines, holes, lanes[i], texts, voice) for i in range(speakers))
    firsts = await asyncio.gather(*runs)
    wall = time.monotonic() - t0
    out = {}
    for lane in dict.fromkeys(lanes):
        mine = [i for i in range(speakers) if lanes[i] == lane]
        out[lane] = (
            sum(1 for i, _ in holes if lanes[i] == lane),
            [firsts[i] for i in mine if firsts[i] is not None],
            wall,
            len(mine),
        )
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speakers", default="16,32", help="comma-separated Speaker counts")
    ap.add_argument("--lines", type=int, default=3, help="lines per Speaker")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=2.0, help="audio per line")
    ap.add_argument("--backend", default="cpu", help="cpu or cuda (the tiny model either way)")
    ap.add_argument("--max-batch", type=int, default=None, help="lines sampled together (preset's if unset)")
    ap.add_argument(
        "--batching",
        choices=["step", "line"],
        default="step",
        help="with --max-batch > 1: step-level or whole-line",
    )
    ap.add_argument(
        "--high-every", type=int, default=0, help="every k-th Speaker speaks high-priority lines (0: none)"
    )
    ap.add_argument("--full", choices=["e", "o"], help="news5's full-size model of this mode (a GPU)")
    args = ap.parse_args()
    fields = {} if args.max_batch is None else {"max_batch": args.max_batch}
    if args.batching == "step" and args.max_batch is not None:  # an older tree has no such field
        fields["step_batching"] = True
    texts, voice = _tiny_texts, None
    if args.full:
        synth, voice, texts = _full(args.full, fields)
        opts = SynthesisOptions(seed=2)
        what = f"full-size random ({args.full}), news5's sentences"
    else:
        synth = load_synthesizer(tiny_random=True, backend=args.backend, voice_cache_dir=False, **fields)
        opts = SynthesisOptions(steps=args.steps, seconds=args.seconds, seed=2, tail_trim=False)
        what = f"tiny random model, {args.seconds} s lines"
    print(
        f"# {platform.processor() or platform.machine()}, {what}, backend {synth.device.type}, "
        f"max_batch {synth.preset.max_batch}, {type(synth._batcher).__name__}"
    )
    print("| speakers | lane | lines | lines with a hole | first audio p50 / p95 s | wall s (median) |")
    print("|---|---|---|---|---|---|")
    for n in (int(x) for x in args.speakers.split(",")):
        rows: dict[str, list] = {}
        for _ in range(args.repeat):
            by_lane = asyncio.run(_round(synth, opts, n, args.lines, args.high_every, texts, voice))
            for lane, (h, f, w, count) in by_lane.items():
                row = rows.setdefault(lane, [0, [], [], count])
                row[0] += h
                row[1] += f
                row[2].append(w)
        for lane, (holes, firsts, walls, count) in rows.items():
            total = count * args.lines * args.repeat
            print(
                f"| {n} | {lane} | {total} | {holes} | {statistics.median(firsts):.2f} / "
                f"{_pct(firsts, 0.95):.2f} | {statistics.median(walls):.1f} |"
            )


def _full(key: str, fields: dict):
    """news5's full-size random model of mode `key` on CUDA, prewarmed in its voice; the texts."""
    import json
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    import news5  # the shared random full-size files, modes and the approximate tokenizer

    mode = news5.modes_for("cuda")[key]
    files = news5.prepare_files(int4=mode.int4, families={mode.family})
    synth, voice = news5.build(mode, files, **fields)
    synth.prewarm(voice)
    sentences = json.loads(news5.NEWS5_JSON.read_text())["sentences"]

    def texts(i: int, lines: int) -> list[tuple[str, dict]]:
        picked = [sentences[(i + k) % len(sentences)] for k in range(lines)]
        # random v4 weights make the duration predictor's lengths arbitrary: v2's estimate, as news5
        extra = (lambda t: {}) if mode.family == "v2" else (lambda t: {"seconds": news5.estimate_seconds(t)})
        return [(t, extra(t)) for t in picked]

    return synth, voice, texts


if __name__ == "__main__":
    main()
