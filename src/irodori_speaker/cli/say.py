"""`say`: one line to a file and/or the speakers."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..errors import InputError
from .common import (
    EXIT_OK,
    add_cache_flags,
    add_model_flags,
    add_output_flags,
    add_reading_flags,
    add_sampling_flags,
    add_voice_flags,
    build_options,
    describe_device,
    load_from_args,
    log,
    open_cache,
    play_audio,
    read_tag_map,
    show_progress,
    sub_parser,
    voice_and_checks,
)
from .messages import Progress, extra_hint, phases_of


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


def check_text(text: str, options: Any, *, tag_map: bool = False) -> None:
    """What the synthesizer would refuse of the text itself (empty, too long, a pause over the
    limit), before the model loads; hints in the command line's words. With a tag map a tag
    may become words, so only the length is checked here."""
    from ..synthesis.plan import spoken_parts
    from ..text.split import MAX_LINE_CHARS, check_line_text

    if isinstance(text, str) and len(text) > MAX_LINE_CHARS:
        raise InputError(
            f"a line of {len(text)} characters is longer than the {MAX_LINE_CHARS} one line may have",
            hint="split the text into several lines, one `say` each "
            "(or speak a long text from Python with Speaker.say_stream)",
        )
    check_line_text(text)
    if not tag_map:
        spoken_parts(text, options)


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
    check_text(text, options, tag_map=bool(args.tag_map))
    tag_map = read_tag_map(args)
    captions = [f for f in (args.srt, args.vtt, args.caption_file) if f]
    for f in captions:
        check_writable(f, make_parent=True)
    if captions:
        from ..text.length import mora_method

        if mora_method() != "openjtalk":
            raise InputError(
                "--srt / --vtt / --caption-file need pyopenjtalk for the timing",
                hint=extra_hint("ja"),
            )
    use_cache = args.cache or args.cache_dir is not None
    cache = open_cache(args.cache_dir) if use_cache else None
    phases = phases_of(args)
    try:
        synth = load_from_args(args)
        if tag_map:  # a mapped tag in the line picks its voice / caption / options
            from ..synthesis.voices import tagged_line

            text, voice, tagged = tagged_line(tag_map, text, voice, options)
            options = tagged or options
        hit = False
        progress = Progress(
            "synthesising", enabled=show_progress(args), counts=False
        )  # steps: no unit to show
        try:
            with phases.phase("synthesis"):
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
    log.info("synthesis: %.2f s for %.2f s of audio", phases.parts["synthesis"], rec.audio_seconds)
    for w in rec.warnings:
        if w != synth.note:  # the tiny-random notice: logged once, at load
            log.warning("%s", w)
    if args.output:
        with phases.phase("writing"):
            write_sound_file(args.output, audio, rate)
    line_cues = write_captions(args, rec, audio, rate) if captions else []
    played = ""
    if args.play:
        follow = CaptionFollower(args.caption_file, line_cues) if args.caption_file else None
        try:
            info = play_audio(audio, rate, args.output_device, args.hostapi)
        finally:
            if follow is not None:
                follow.stop()
        played = f", played on {describe_device(info)}"
    dest = f" -> {args.output}" if args.output else ""
    log.info("wall: %s", phases.summary())
    if hit:
        print(f"{rec.audio_seconds:.2f} s of audio from the phrase cache, seed {rec.seed}{dest}{played}")
        return EXIT_OK
    total = rec.compute_seconds
    rtf = total / rec.audio_seconds if rec.audio_seconds else float("nan")
    print(
        f"{rec.audio_seconds:.2f} s of audio in {total:.2f} s (RTF {rtf:.3f}), seed {rec.seed}{dest}{played}"
    )
    return EXIT_OK


def write_captions(args: argparse.Namespace, rec: Any, audio: Any, rate: int) -> list[Any]:
    """--srt / --vtt (the line's cues) and --caption-file (its whole text, or cue by cue while
    --play plays it); returns the cues."""
    from ..timing.captions import cues, srt, webvtt, write_text_atomic
    from ..timing.estimate import estimate_timing, speech_span

    timing = estimate_timing(rec.text, len(audio) / rate, speech=speech_span(audio, rate), source=rec.source)
    line_cues = cues(timing) if timing is not None else []
    if args.srt:
        write_text_atomic(args.srt, srt(line_cues))
    if args.vtt:
        write_text_atomic(args.vtt, webvtt(line_cues))
    if args.caption_file and not args.play:
        write_text_atomic(args.caption_file, rec.source or rec.text)  # as written
    return line_cues


class CaptionFollower:
    """Writes each cue into the caption file when its time comes (a timer thread started with
    the playback; the file is emptied when it stops)."""

    def __init__(self, path: str, line_cues: list[Any]) -> None:
        import threading

        from ..timing.captions import CaptionFile

        self.file = CaptionFile(path)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(line_cues,), daemon=True)
        self._thread.start()

    def _run(self, line_cues: list[Any]) -> None:
        import time

        t0 = time.monotonic()
        for c in line_cues:
            if self._stop.wait(max(0.0, c.start - (time.monotonic() - t0))):
                return
            self.file.show(c.text)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)
        self.file.clear()


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
    add_reading_flags(p)
    g = p.add_argument_group("captions (estimated timing; needs pyopenjtalk)")
    g.add_argument("--srt", metavar="FILE.srt", help="write the line's captions as SubRip subtitles")
    g.add_argument("--vtt", metavar="FILE.vtt", help="write the line's captions as WebVTT subtitles")
    g.add_argument(
        "--caption-file",
        metavar="FILE.txt",
        help="a text file for an OBS text source: the caption heard now with --play, else the line",
    )
    add_cache_flags(p, switch=True)
    p.set_defaults(func=cmd_say)
