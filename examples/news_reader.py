"""A news reader: the news5 sentences read back to back, the next one rendered while one plays.

    python examples/news_reader.py --tiny-random --out news.wav      # offline, noise, to a file
    python examples/news_reader.py --voice anchor.wav                # the real model, speakers

The Speaker prefetches (`lookahead_lines`): while sentence N plays, sentence N+1 is
synthesised, so after the first one there is no wait between sentences as long as the
model is faster than real time. Per sentence it prints when synthesis finished, when
playback started, and the gap beyond the configured pause.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from irodori_speaker.cli import add_model_flags, load_from_args
from irodori_speaker.errors import IrodoriError
from irodori_speaker.options import SynthesisOptions
from irodori_speaker.speaker import Speaker

NEWS5 = [
    "次のニュースだよっ！",
    "今日の東京は朝から青空が広がり、日中の最高気温は二十五度近くまで上がる見込みです。",
    "政府は新しい経済対策を発表し、子育て世帯への給付金や電気料金の補助を来月から全国で順次始めると明らかにしました。",
    "大型の台風が週末にかけて沖縄地方に接近する予報です。",
    "プロ野球では地元チームが九回裏に逆転サヨナラ勝ちしました。",
]


def load_sentences(path: str | None) -> list[str]:
    if path is None:
        return NEWS5
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    return list(doc["sentences"] if isinstance(doc, dict) else doc)


async def read_news(args: argparse.Namespace) -> int:
    from irodori_speaker.outputs import FileOutput

    synth = load_from_args(args)
    sentences = load_sentences(args.sentences)
    output = FileOutput(args.out, speed=args.speed) if args.out else args.output_device
    options = SynthesisOptions(steps=args.steps, seed=args.seed, seconds=args.seconds)
    t0 = time.monotonic()
    async with Speaker(
        synth, output=output, voice=args.voice, options=options, lookahead_lines=2, pause_s=args.pause
    ) as s:
        ready: dict[int, float] = {}
        s.on("synthesis_finished", lambda e: ready.__setitem__(e.utterance_id, e.time))

        def started(e) -> None:
            synth_done = ready.get(e.utterance_id)
            if synth_done is None or e.time < synth_done:
                ahead = ", streaming while the rest is synthesised"
            else:
                ahead = f", ready {e.time - synth_done:5.2f} s before"
            print(f"  #{e.utterance_id} playing at {e.time - t0:6.2f} s{ahead}: {e.text[:24]}", flush=True)

        s.on("playback_started", started)
        handles = [s.enqueue(text) for text in sentences]  # all queued at once; prefetch does the rest
        await asyncio.gather(*handles)
        m = s.metrics()
    first = handles[0].timings.get("playback_started", float("nan")) - handles[0].timings["enqueued"]
    audio = sum(len(h.audio) for h in handles if h.audio is not None) / synth.sample_rate
    print(
        f"{len(handles)} sentences, {audio:.1f} s of audio in {time.monotonic() - t0:.1f} s; "
        f"RTF median {m.rtf.p50:.3f}; first audio after {first:.2f} s; "
        f"gaps beyond the pause: max {m.gap.max:.3f} s over {m.gap.count}"
    )
    if args.out:
        print(f"wrote {args.out}")
    return 0 if m.lines_failed == 0 else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_flags(p)  # the command line's: --tiny-random, --model, --backend, ...
    p.add_argument("--voice", help="reference voice file")
    p.add_argument("--sentences", help="a JSON file {'sentences': [...]} (default: news5)")
    p.add_argument("--steps", type=int, help="sampler steps (default: the preset's)")
    p.add_argument("--seed", type=int, default=0, help="noise seed")
    p.add_argument("--seconds", type=float, help="fixed length per sentence (default: estimated)")
    p.add_argument("--pause", type=float, default=0.4, help="pause between sentences in seconds")
    p.add_argument(
        "--out", help="write the reading to this file (.wav, .flac, .ogg, ...) instead of a sound device"
    )
    p.add_argument(
        "--speed", type=float, default=float("inf"), help="pace of --out (default: as fast as it can)"
    )
    p.add_argument("--output-device", help="sound device name (default: the system's default)")
    args = p.parse_args(argv)
    try:
        return asyncio.run(read_news(args))
    except IrodoriError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
