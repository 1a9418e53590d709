"""A minimal AITuber loop: chat lines in lanes, an LLM answer streamed in, lip sync, interrupt.

    python examples/speaker_basic.py --tiny-random --out speaker_basic.wav --speed 4   # offline, noise
    python examples/speaker_basic.py --output-device "CABLE Input"                    # the real model

What it shows, in order, with a line printed for each:

- three lines queued at once in three lanes: the high one is spoken first, then normal, then low;
- an LLM-style token stream (`say_stream`): speech starts with its first sentence;
- a long line cut while it plays (`interrupt()`): it fades out, and the event says how much
  of it was heard;
- lip-sync levels (`mouth` events, ~50 Hz), counted: send `ev.level` to your avatar.

The model options are the command line's (`--tiny-random`, `--model`, `--backend`, ...). The
audio goes to `--output-device` (a sound card, by name) and/or to the `--out` file, written at
`--speed` times real time (1 = like a sound card: the mouth events follow its clock).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from irodori_speaker.cli import add_model_flags, load_from_args
from irodori_speaker.errors import IrodoriError
from irodori_speaker.outputs import FileOutput, SoundDeviceOutput
from irodori_speaker.speaker import Speaker


async def fake_llm(answer: str, speed: float):
    """Stands in for an LLM token stream."""
    for ch in answer:
        await asyncio.sleep(0.02 / speed)
        yield ch


async def run(args: argparse.Namespace) -> int:
    synth = load_from_args(args)
    outputs: list = []
    if args.output_device or not args.out:  # neither given: the system's default sound device
        outputs.append(SoundDeviceOutput(args.output_device, hostapi=args.hostapi))
    if args.out:
        outputs.append(FileOutput(args.out, speed=args.speed))
    async with Speaker(synth, output=outputs, ttl={"normal": 30, "low": 10}) as s:
        playing = {}  # utterance id -> asyncio.Event set when it starts playing
        t0 = time.monotonic()  # event times are time.monotonic()

        @s.on("playback_started")
        def started(ev):
            print(f"[{ev.time - t0:5.2f} s] speaking #{ev.utterance_id}: {ev.text}", flush=True)
            if ev.utterance_id in playing:
                playing[ev.utterance_id].set()

        @s.on("playback_interrupted")
        def cut(ev):
            print(f"  cut after {ev.played_fraction:.0%}: heard {ev.heard_text!r}", flush=True)

        mouth = {"frames": 0, "open": 0}

        def on_mouth(ev) -> None:  # send ev.level (0..1) to the avatar's mouth here
            mouth["frames"] += 1
            mouth["open"] += ev.level > 0.05

        s.on("mouth", on_mouth)

        # Lanes: queued together, spoken high -> normal -> low.
        lines = [
            s.enqueue("雑談です。今日はいい天気ですね。", priority="low"),
            s.enqueue("コメントありがとう！", priority="normal"),
            s.enqueue("スーパーチャットありがとうございます！", priority="high"),
        ]
        await asyncio.gather(*lines)
        answer = "それでは、今日のニュースをお伝えします。東京は晴れ、最高気温は二十五度です。"
        await s.say_stream(fake_llm(answer, args.speed))

        # Interrupt: once the long line has played about a second, cut it.
        long = s.enqueue("この長い話は途中で止められます。" * 3)
        playing[long.id] = asyncio.Event()
        await playing[long.id].wait()
        await asyncio.sleep(1.0 / args.speed)
        s.interrupt()  # fades out within ~10 ms + the output latency, drops what is queued
        await long

        m = s.metrics()
        print(
            f"played {m.lines_played}, interrupted {m.lines_interrupted}; time to first audio p50 "
            f"{m.time_to_first_audio.p50:.2f} s, RTF p50 {m.rtf.p50:.2f}, underruns {m.underruns}; "
            f"lip-sync frames {mouth['frames']} ({mouth['open']} with the mouth open)"
        )
    if args.out:
        print(f"wrote {args.out}")
    return 0 if m.lines_failed == 0 else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_flags(p)
    p.add_argument("--output-device", help="sound device name (a unique part of it), e.g. 'CABLE Input'")
    p.add_argument("--hostapi", help="host API of the device, e.g. WASAPI")
    p.add_argument("--out", help="also write what is played to this file (.wav, .flac, .ogg, .opus, .mp3)")
    p.add_argument("--speed", type=float, default=1.0, help="pace of --out and the fake LLM (default 1)")
    args = p.parse_args(argv)
    if not args.speed > 0:
        p.error("--speed must be > 0")
    try:
        return asyncio.run(run(args))
    except IrodoriError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
