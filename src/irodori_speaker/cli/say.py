"""`say`: one line to a file and/or the speakers."""

from __future__ import annotations

import argparse
import sys
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
    describe_device,
    load_from_args,
    log,
    open_cache,
    play_audio,
    show_progress,
    sub_parser,
    voice_and_checks,
)


def read_text(text: str) -> str:
    """TEXT as given, or standard input for "-"; UTF-8, else Shift_JIS (cp932), else an error."""
    if text == "-":
        text = decode_text(sys.stdin.buffer.read(), "standard input")
        if not text.strip():
            raise InputError(
                "no text on standard input", hint="echo 'こんにちは' | irodori-speaker say - -o a.wav"
            )
    elif any("\udc80" <= c <= "\udcff" for c in text):  # argv bytes that were not UTF-8
        text = decode_text(text.encode("utf-8", "surrogateescape"), "TEXT")
    return text


def decode_text(raw: bytes, what: str) -> str:
    """Text from bytes: UTF-8 (a BOM allowed); else cp932, which Japanese Windows consoles and
    older text files use (said in the log); else a clear error rather than a traceback."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    try:
        text = raw.decode("cp932")
    except UnicodeDecodeError:
        raise InputError(
            f"{what} is neither UTF-8 nor Shift_JIS text",
            hint="save the text as UTF-8 (or pass it with `say -` from a UTF-8 file)",
        ) from None
    log.warning("%s was not UTF-8; read it as Shift_JIS (cp932)", what)
    return text


def cmd_say(args: argparse.Namespace) -> int:
    from ..outputs import check_writable, file_format, find_output_device, write_sound_file

    if not args.output and not args.play:
        raise InputError("say needs -o FILE or --play", hint="irodori-speaker say 'こんにちは' -o hello.wav")
    # Everything cheap first: a mistake here costs no model load.
    text = read_text(args.text)
    if args.output:
        file_format(args.output)
        check_writable(args.output, make_parent=True)
    if args.play:
        find_output_device(args.output_device, args.hostapi)
    voice = voice_and_checks(args)
    options = build_options(args)  # a bad --speed / --loudness costs no model load
    use_cache = args.cache or args.cache_dir is not None
    cache = open_cache(args.cache_dir) if use_cache else None
    try:
        synth = load_from_args(args)
        hit = False
        progress = Progress(
            "synthesising", enabled=show_progress(args), counts=False
        )  # steps: no unit to show
        try:
            if cache is not None:
                line, hit = cache.render(synth, text, voice, options, progress=progress, source="say")
                audio, rec, rate = line.audio, line.record, line.sample_rate
            else:
                result = synth.synthesize(text, voice, options, progress=progress)
                audio, rec, rate = result.audio, result.record, result.sample_rate
        finally:
            progress.close()
    finally:
        if cache is not None:
            cache.close()
    for w in rec.warnings:
        log.warning("%s", w)
    if args.output:
        write_sound_file(args.output, audio, rate)
    played = ""
    if args.play:
        played = f", played on {describe_device(play_audio(audio, rate, args.output_device, args.hostapi))}"
    dest = f" -> {args.output}" if args.output else ""
    if hit:
        print(f"{rec.audio_seconds:.2f} s of audio from the phrase cache, seed {rec.seed}{dest}{played}")
        return EXIT_OK
    total = rec.compute_seconds
    rtf = total / rec.audio_seconds if rec.audio_seconds else float("nan")
    print(
        f"{rec.audio_seconds:.2f} s of audio in {total:.2f} s (RTF {rtf:.3f}), seed {rec.seed}{dest}{played}"
    )
    return EXIT_OK


def register(sub: Any) -> None:
    p = sub_parser(
        sub,
        "say",
        "synthesise one line to a sound file or the speakers",
        "Synthesise TEXT to a 48 kHz sound file (-o) and/or play it (--play).\n\n"
        "  irodori-speaker say 'こんにちは' -o hello.wav\n"
        "  echo 'こんにちは' | irodori-speaker say - -o hello.flac\n"
        "  irodori-speaker say 'こんにちは' --play --output-device 'Speakers'",
    )
    p.add_argument("text", help="the Japanese text to speak; - reads it from standard input")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the audio here (48 kHz); the extension picks the format: "
        ".wav (16-bit), .flac, .ogg (Vorbis), .opus, .mp3",
    )
    p.add_argument("--play", action="store_true", help="play through the default (or --output-device) device")
    add_output_flags(p)
    add_model_flags(p)
    add_voice_flags(p)
    add_sampling_flags(p)
    add_cache_flags(p, switch=True)
    p.set_defaults(func=cmd_say)
