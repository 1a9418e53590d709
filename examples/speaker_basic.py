"""A minimal AITuber loop: chat lines in lanes, an LLM answer streamed in, lip sync, interrupt.

    python examples/speaker_basic.py                 # tiny random model (noise), to out/speaker_basic.wav
    python examples/speaker_basic.py --device "CABLE Input" --model Aratako/Irodori-TTS-500M-v2

With --device the audio goes to that sound device (a substring of its name) and
to the WAV file at once.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from irodori_speaker.outputs import FileOutput, SoundDeviceOutput
from irodori_speaker.speaker import Speaker


async def fake_llm(answer: str):
    """Stands in for an LLM token stream."""
    for ch in answer:
        await asyncio.sleep(0.02)
        yield ch


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", help="output device name (substring), e.g. 'CABLE Input'")
    ap.add_argument("--hostapi", help="host API, e.g. WASAPI")
    ap.add_argument("--model", help="model source; default: the tiny random model")
    ap.add_argument("--out", default="out/speaker_basic.wav")
    args = ap.parse_args()

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    outputs = [FileOutput(args.out)]
    if args.device:
        outputs.insert(0, SoundDeviceOutput(args.device, hostapi=args.hostapi))
    load = {"model": args.model} if args.model else {"tiny_random": True}

    async with Speaker(output=outputs, ttl={"normal": 30, "low": 10}, **load) as s:

        @s.on("playback_started")
        def started(ev):
            print(f"[{ev.time:.2f}] speaking #{ev.utterance_id}: {ev.text}")

        @s.on("playback_interrupted")
        def cut(ev):
            print(f"  cut after {ev.played_fraction:.0%}: heard {ev.heard_text!r}")

        mouth = {"n": 0}
        s.on("mouth", lambda ev: mouth.__setitem__("n", mouth["n"] + 1))  # send ev.level to the avatar

        s.enqueue("雑談です。今日はいい天気ですね。", priority="low")
        s.enqueue("コメントありがとう！", priority="normal")
        s.enqueue("スーパーチャットありがとうございます！", priority="high")
        await s.say_stream(
            fake_llm("それでは、今日のニュースをお伝えします。東京は晴れ、最高気温は二十五度です。")
        )

        long = s.enqueue("この長い話は途中で止められます。" * 3)
        await asyncio.sleep(1.0)
        s.interrupt()  # fades out within ~10 ms + the output latency, drops what is queued
        await long

        m = s.metrics()
        print(
            f"played {m.lines_played}, time to first audio p50 {m.time_to_first_audio.p50:.2f} s, "
            f"RTF p50 {m.rtf.p50:.2f}, underruns {m.underruns}, lip-sync frames {mouth['n']}"
        )


if __name__ == "__main__":
    asyncio.run(main())
