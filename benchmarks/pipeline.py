"""Speaker pipeline benchmark: gaps between lines and time to first audio, news5 set.

A fake synthesizer stands in for the model with a realistic cost: each line
lasts `chars * sec_per_char` seconds of audio and takes `rtf` times that to
make: sampling first (nothing to hear yet), then chunked decode taking
`--decode-share` of it (one chunk per second of audio; with streaming decode
each chunk is playable as soon as it is out). Playback goes to a virtual-time
null sink. Everything runs `--speed` times faster than real time and is
reported back in real-time seconds.

    python benchmarks/pipeline.py [--speed 8] [--rtf 0.434 0.8] [--decode-share 0.3] [--pause 0.3]

Columns: first audio = enqueue of line 1 -> its first sample heard; gap = the
silence between two lines beyond the configured pause (mean and max over the
4 transitions); total = first enqueue -> last sample heard.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import platform
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from irodori_speaker.cancel import CancelToken, check  # noqa: E402
from irodori_speaker.options import (  # noqa: E402
    AudioStream,
    SamplerDefaults,
    SynthesisOptions,
    SynthesisRecord,
    SynthesisResult,
)
from irodori_speaker.outputs import NullOutput  # noqa: E402
from irodori_speaker.speaker import Speaker  # noqa: E402

SR = 48_000


class CostModelSynth:
    """Sleeps like a model of the given RTF (scaled by `speed`), in steps and decode chunks."""

    sample_rate = SR

    def __init__(self, rtf: float, sec_per_char: float, speed: float, decode_share: float, steps: int = 8):
        self.rtf, self.sec_per_char, self.speed, self.steps = rtf, sec_per_char, speed, steps
        self.decode_share = decode_share

    def _plan(self, text: str) -> tuple[np.ndarray, float, int, float]:
        seconds = len(text) * self.sec_per_char
        audio = (0.1 * np.sin(np.arange(round(seconds * SR)) * (2 * np.pi * 220 / SR))).astype(np.float32)
        compute = self.rtf * seconds / self.speed
        chunks = max(1, math.ceil(seconds))
        sampling = compute * (1 - self.decode_share)
        return audio, sampling / self.steps, chunks, compute * self.decode_share / chunks

    def _sample(self, step_s: float, cancel: CancelToken | None) -> None:
        for _ in range(self.steps):
            check(cancel)
            time.sleep(step_s)

    def synthesize(
        self, text: str, voice: Any = None, options: SynthesisOptions | None = None, cancel: Any = None
    ) -> SynthesisResult:
        audio, step_s, chunks, chunk_s = self._plan(text)
        self._sample(step_s, cancel)
        for _ in range(chunks):
            check(cancel)
            time.sleep(chunk_s)
        return SynthesisResult(audio, SynthesisRecord(text=text, samples=len(audio)))

    def stream(
        self, text: str, voice: Any = None, options: SynthesisOptions | None = None, cancel: Any = None
    ) -> AudioStream:
        audio, step_s, chunks, chunk_s = self._plan(text)
        record = SynthesisRecord(text=text, frames=round(len(audio) / SR * 25))

        def gen() -> Iterator[np.ndarray]:
            self._sample(step_s, cancel)
            bounds = np.linspace(0, len(audio), chunks + 1).round().astype(int)
            for i in range(chunks):
                check(cancel)
                time.sleep(chunk_s)
                yield audio[bounds[i] : bounds[i + 1]]
            record.samples = len(audio)

        return AudioStream(gen(), record)

    def prewarm(self, voice: Any = None) -> float:
        return 0.0

    def resolve_options(self, options: Any = None) -> SynthesisOptions:
        return SynthesisOptions.coerce(options).resolve(SamplerDefaults(8, "sway", -1.0))

    def render_identity(self, text: str, voice: Any = None, options: Any = None) -> dict:
        return {"text": text, "voice": repr(voice), "options": self.resolve_options(options).audio_identity()}


async def one_run(
    lines: list[str], rtf: float, prefetch: bool, streaming: bool, args: argparse.Namespace
) -> dict[str, float]:
    speed, pause = args.speed, args.pause
    synth = CostModelSynth(rtf, args.sec_per_char, speed, args.decode_share)
    out = NullOutput(speed=speed)
    events: list[Any] = []
    async with Speaker(
        synth,
        output=out,
        pause_s=pause,
        streaming=streaming,
        lookahead_lines=2 if prefetch else 0,
        schedule_ahead_s=0.5,
    ) as s:
        s.on(["playback_started", "playback_finished", "underrun"], events.append)
        t0 = time.monotonic()
        hs = [s.enqueue(t) for t in lines]
        for h in hs:
            await h
        await asyncio.sleep(0)
        m = s.metrics()
    start = {e.utterance_id: e.time for e in events if e.kind == "playback_started"}
    end = {e.utterance_id: e.time for e in events if e.kind == "playback_finished"}
    # stream seconds of the sink = wall seconds * speed
    gaps = [(start[b.id] - end[a.id]) * speed - pause for a, b in itertools.pairwise(hs)]
    return {
        "first_audio": (start[hs[0].id] - t0) * speed,
        "gap_mean": float(np.mean(gaps)),
        "gap_max": float(np.max(gaps)),
        "underruns": float(m.underruns),
        "total": (end[hs[-1].id] - t0) * speed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default=str(ROOT / "benchmarks" / "data" / "news5.json"))
    ap.add_argument("--speed", type=float, default=8.0, help="run this many times faster than real time")
    ap.add_argument("--rtf", type=float, nargs="+", default=[0.434, 0.8])
    ap.add_argument("--pause", type=float, default=0.3)
    ap.add_argument("--sec-per-char", type=float, default=0.15, help="audio seconds per character")
    ap.add_argument(
        "--decode-share", type=float, default=0.3, help="share of a line's compute spent decoding"
    )
    args = ap.parse_args()
    data = json.loads(Path(args.set).read_text(encoding="utf-8"))
    lines = data["sentences"]
    audio = sum(len(t) for t in lines) * args.sec_per_char
    print(
        f"# {data['name']}: {len(lines)} lines, {sum(len(t) for t in lines)} chars, {audio:.1f} s of audio "
        f"({args.sec_per_char} s/char); decode {args.decode_share:.0%} of compute; pause {args.pause} s; "
        f"x{args.speed} virtual time; "
        f"{platform.processor() or platform.machine()}, Python {platform.python_version()}"
    )
    cols = ["RTF", "prefetch", "streaming decode", "first audio (s)", "gap mean (s)", "gap max (s)"]
    print("| " + " | ".join([*cols, "underruns", "total (s)"]) + " |")
    print("|---|---|---|---|---|---|---|---|")
    for rtf in args.rtf:
        for prefetch in (False, True):
            for streaming in (False, True):
                r = asyncio.run(one_run(lines, rtf, prefetch, streaming, args))
                print(
                    f"| {rtf} | {'yes' if prefetch else 'no'} | {'yes' if streaming else 'no'} "
                    f"| {r['first_audio']:.2f} | {r['gap_mean']:.2f} | {r['gap_max']:.2f} "
                    f"| {r['underruns']:.0f} | {r['total']:.1f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
