"""The `irodori-speaker` command line: one entry point, one subcommand per job.

Errors print as one line (plus a hint when there is one) and exit with status 1;
usage errors exit with 2 (argparse).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from .errors import IrodoriError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class Progress:
    """A one-line progress display on a terminal (stderr); silent when stderr is not a tty."""

    def __init__(self, label: str, enabled: bool | None = None) -> None:
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.t0 = time.perf_counter()
        self._shown = False

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.t0
        eta = elapsed / done * (total - done) if done else 0.0
        width = 24
        fill = int(width * done / max(total, 1))
        bar = "#" * fill + "-" * (width - fill)
        sys.stderr.write(f"\r{self.label} [{bar}] {done}/{total}  {elapsed:5.1f}s  eta {eta:4.1f}s ")
        sys.stderr.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            sys.stderr.write("\n")
            sys.stderr.flush()


# ---- shared flags ---------------------------------------------------------------------------


def add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        help="DiT checkpoint: path, hf://org/repo/file, repo id, or alias "
        "(v2, v3, v2-voicedesign, v3-voicedesign, lite-int4). Default: v2",
    )
    g.add_argument("--codec", help="DACVAE codec: weights.pth, our converted .safetensors, or a repo id")
    g.add_argument("--tokenizer", help="tokenizer.json (default: the model's tokenizer repo)")
    g.add_argument(
        "--tiny-random",
        nargs="?",
        const="v2",
        metavar="KIND",
        help="use a small random model in the real formats (offline; output is NOISE). "
        "KIND: v2 (default), v3, v2-voicedesign",
    )
    g.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "cuda", "mps", "cpu"],
        help="device backend preset (default: auto = cuda, else mps, else cpu)",
    )
    g.add_argument("--device", help="torch device override, e.g. cuda:1")
    g.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help="model precision override")


def add_voice_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("voice")
    g.add_argument("--voice", help="reference voice: an audio file, or a saved latent (.safetensors)")
    g.add_argument("--caption", help="voice description for VoiceDesign models")


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--steps", type=int, help="sampler steps (default: the backend preset's, 8)")
    g.add_argument("--schedule", choices=["linear", "sway"], help="time schedule (default: sway)")
    g.add_argument("--seed", type=int, help="noise seed: the same seed gives the same audio")
    g.add_argument("--seconds", type=float, help="utterance length (default: predicted or estimated)")
    g.add_argument("--no-tail-trim", action="store_true", help="keep the trailing near-silence")


def build_voice(args: argparse.Namespace):
    from .voices import Voice

    if args.voice:
        path = Path(args.voice)
        if path.suffix == ".safetensors":
            return Voice.from_latent(path, caption=args.caption)
        return Voice.from_wav(path, caption=args.caption)
    if args.caption:
        return Voice.designed(args.caption)
    return None


def build_options(args: argparse.Namespace):
    from .synthesizer import SynthesisOptions

    return SynthesisOptions(
        steps=args.steps,
        schedule=args.schedule,
        seed=args.seed,
        seconds=args.seconds,
        tail_trim=not args.no_tail_trim,
    )


def load_from_args(args: argparse.Namespace):
    from .synthesizer import load_synthesizer

    return load_synthesizer(
        args.model,
        codec=args.codec,
        tokenizer=args.tokenizer,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        tiny_random=args.tiny_random or False,
    )


# ---- subcommands ------------------------------------------------------------------------------


def cmd_say(args: argparse.Namespace) -> int:
    import soundfile as sf

    if not args.output and not args.play:
        raise IrodoriError(
            "say needs -o FILE or --play", hint="irodori-speaker say 'こんにちは' -o hello.wav"
        )
    synth = load_from_args(args)
    voice = build_voice(args)
    progress = Progress("synthesising")
    try:
        result = synth.synthesize(args.text, voice, build_options(args), progress=progress)
    finally:
        progress.close()
    rec = result.record
    for w in rec.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        sf.write(str(out), result.audio, result.sample_rate, subtype="PCM_16")
    if args.play:
        from .playback import play_blocking

        play_blocking(result.audio, result.sample_rate, device=args.output_device)
    total = rec.compute_seconds
    rtf = total / rec.audio_seconds if rec.audio_seconds else float("nan")
    dest = f" -> {args.output}" if args.output else ""
    print(f"{rec.audio_seconds:.2f} s of audio in {total:.2f} s (RTF {rtf:.3f}), seed {rec.seed}{dest}")
    return EXIT_OK


def cmd_convert_codec(args: argparse.Namespace) -> int:
    from .engine.codec import convert_codec
    from .engine.sources import CODEC_REPO, resolve

    src = resolve(args.source or CODEC_REPO, "codec")
    out = convert_codec(src, args.output)
    print(f"wrote {out} (folded weights, loads without pickle)")
    return EXIT_OK


Command = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="irodori-speaker",
        description="Japanese speech for livestream bots, on our own PyTorch Irodori-TTS engine.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser(
        "say",
        help="synthesise one line to a WAV file or the speakers",
        description="Synthesise TEXT to a 48 kHz WAV file (-o) and/or play it (--play).",
    )
    p.add_argument("text", help="the Japanese text to speak")
    p.add_argument("-o", "--output", help="write a 16-bit 48 kHz WAV file here")
    p.add_argument("--play", action="store_true", help="play through the default (or --output-device) device")
    p.add_argument("--output-device", help="sound device name (substring, as `devices` lists it)")
    add_model_flags(p)
    add_voice_flags(p)
    add_sampling_flags(p)
    p.set_defaults(func=cmd_say)

    p = sub.add_parser(
        "convert-codec",
        help="convert the codec's weights.pth to a pickle-free safetensors file",
        description="One-time conversion of the DACVAE weights.pth (weight norm folded).",
    )
    p.add_argument("source", nargs="?", help="weights.pth path or repo id (default: the released codec repo)")
    p.add_argument("-o", "--output", required=True, help="destination .safetensors file")
    p.set_defaults(func=cmd_convert_codec)

    for extra in _EXTRA_COMMANDS:
        extra(sub)
    return parser


# Other modules register subcommands here (cache, prebuild, devices, bench, quantize).
_EXTRA_COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = []


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except IrodoriError as e:
        msg = super(IrodoriError, e).__str__()
        print(f"error: {msg}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
