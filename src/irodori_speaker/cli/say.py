"""`say`: one line to a file and/or the speakers."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..errors import InputError
from .common import (
    EXIT_OK,
    Progress,
    add_cache_flags,
    add_model_flags,
    add_output_flags,
    add_sampling_flags,
    add_voice_flags,
    build_options,
    build_voice,
    load_from_args,
    open_cache,
    play_audio,
    sub_parser,
)


def cmd_say(args: argparse.Namespace) -> int:
    import soundfile as sf

    if not args.output and not args.play:
        raise InputError("say needs -o FILE or --play", hint="irodori-speaker say 'こんにちは' -o hello.wav")
    synth = load_from_args(args)
    voice = build_voice(args)
    options = build_options(args)
    hit = False
    progress = Progress("synthesising")
    try:
        if args.cache is not None:
            with open_cache(args.cache or None) as cache:
                line, hit = cache.render(synth, args.text, voice, options, progress=progress, source="say")
            audio, rec, rate = line.audio, line.record, line.sample_rate
        else:
            result = synth.synthesize(args.text, voice, options, progress=progress)
            audio, rec, rate = result.audio, result.record, result.sample_rate
    finally:
        progress.close()
    for w in rec.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        sf.write(str(out), audio, rate, subtype="PCM_16")
    if args.play:
        play_audio(audio, rate, device=args.output_device, hostapi=args.hostapi)
    dest = f" -> {args.output}" if args.output else ""
    if hit:
        print(f"{rec.audio_seconds:.2f} s of audio from the phrase cache, seed {rec.seed}{dest}")
        return EXIT_OK
    total = rec.compute_seconds
    rtf = total / rec.audio_seconds if rec.audio_seconds else float("nan")
    print(f"{rec.audio_seconds:.2f} s of audio in {total:.2f} s (RTF {rtf:.3f}), seed {rec.seed}{dest}")
    return EXIT_OK


def register(sub: Any) -> None:
    p = sub_parser(
        sub,
        "say",
        "synthesise one line to a WAV file or the speakers",
        "Synthesise TEXT to a 48 kHz WAV file (-o) and/or play it (--play).\n\n"
        "  irodori-speaker say 'こんにちは' -o hello.wav\n"
        "  irodori-speaker say 'こんにちは' --play --output-device 'Speakers'",
    )
    p.add_argument("text", help="the Japanese text to speak")
    p.add_argument("-o", "--output", help="write a 16-bit 48 kHz WAV file here")
    p.add_argument("--play", action="store_true", help="play through the default (or --output-device) device")
    add_output_flags(p)
    add_model_flags(p)
    add_voice_flags(p)
    add_sampling_flags(p)
    add_cache_flags(p, optional=True)
    p.set_defaults(func=cmd_say)
