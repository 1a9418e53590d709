"""What the commands share: exit codes, the progress display, common flags, loading, playback."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import AudioError, CacheError

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class Progress:
    """A one-line progress display on a terminal (stderr); silent when stderr is not a tty.

    Called as `progress(done, total)` (the sampler's steps), optionally with `eta` seconds
    (else estimated from the elapsed time) and a short `note`.
    """

    def __init__(self, label: str, enabled: bool | None = None) -> None:
        self.label = label
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.t0 = time.perf_counter()
        self._shown = False

    def __call__(self, done: int, total: int, eta: float | None = None, note: str = "") -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.t0
        if eta is None:
            eta = elapsed / done * (total - done) if done else 0.0
        width = 24
        fill = int(width * done / max(total, 1))
        bar = "#" * fill + "-" * (width - fill)
        tail = f"  {note[:30]}" if note else ""
        sys.stderr.write(
            f"\r{self.label} [{bar}] {done}/{total}  {elapsed:5.1f}s  eta {eta:4.1f}s{tail}\x1b[K"
        )
        sys.stderr.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self._shown = False


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


def add_sampling_flags(p: argparse.ArgumentParser, seed_help: str | None = None) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--steps", type=int, help="sampler steps (default: the backend preset's, 8)")
    g.add_argument("--schedule", choices=["linear", "sway"], help="time schedule (default: sway)")
    g.add_argument(
        "--seed",
        type=int,
        help=seed_help or "noise seed: the same seed gives the same audio (default: random)",
    )
    g.add_argument("--seconds", type=float, help="utterance length (default: predicted or estimated)")
    g.add_argument("--no-tail-trim", action="store_true", help="keep the trailing near-silence")


def add_cache_flags(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    from ..cache import default_cache_dir

    g = p.add_argument_group("phrase cache")
    if optional:
        g.add_argument(
            "--cache",
            nargs="?",
            const="",
            metavar="DIR",
            help=f"look the line up in the phrase cache first and store it after (DIR default: "
            f"{default_cache_dir()}; $IRODORI_CACHE moves it). A cached line uses seed 0 unless --seed",
        )
    else:
        g.add_argument(
            "--cache",
            metavar="DIR",
            help=f"phrase cache directory (default: {default_cache_dir()}; $IRODORI_CACHE moves it)",
        )


def add_output_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sound output")
    g.add_argument(
        "--output-device",
        metavar="NAME",
        help="sound device: a unique part of its name as `irodori-speaker devices` lists it "
        "(default: the system's default output)",
    )
    g.add_argument("--hostapi", help="host API of the device when a name is offered by several (e.g. WASAPI)")


def build_voice(args: argparse.Namespace):
    from ..voices import Voice

    if args.voice:
        path = Path(args.voice)
        if path.suffix == ".safetensors":
            return Voice.from_latent(path, caption=args.caption)
        return Voice.from_wav(path, caption=args.caption)
    if args.caption:
        return Voice.designed(args.caption)
    return None


def build_options(args: argparse.Namespace):
    from ..synthesizer import SynthesisOptions

    return SynthesisOptions(
        steps=args.steps,
        schedule=args.schedule,
        seed=args.seed,
        seconds=args.seconds,
        tail_trim=not args.no_tail_trim,
    )


def load_from_args(args: argparse.Namespace):
    from ..synthesizer import load_synthesizer

    return load_synthesizer(
        args.model,
        codec=args.codec,
        tokenizer=args.tokenizer,
        backend=args.backend,
        device=args.device,
        dtype=args.dtype,
        tiny_random=args.tiny_random or False,
    )


def open_cache(directory: str | None, *, must_exist: bool = False, **kwargs: Any):
    from ..cache import INDEX_NAME, PhraseCache, default_cache_dir

    path = Path(directory).expanduser() if directory else default_cache_dir()
    if must_exist and not (path / INDEX_NAME).is_file():
        raise CacheError(
            f"there is no phrase cache at {path}",
            hint="fill one with `irodori-speaker prebuild phrases.txt --cache DIR`",
        )
    return PhraseCache(path, **kwargs)


def play_audio(audio: Any, sample_rate: int, device: str | None = None, hostapi: str | None = None) -> str:
    """Play float32 mono audio on a sound device (by name, as `devices` lists it) and wait.

    Returns the device's name. Raises AudioError when there is no device or it fails.
    """
    import numpy as np

    from ..outputs import Block, SoundDeviceOutput, Track
    from ..playback import resample

    out = SoundDeviceOutput(device, hostapi=hostapi)
    out.open()
    try:
        x = resample(np.ascontiguousarray(audio, dtype=np.float32).reshape(-1), sample_rate, out.sample_rate)
        track = Track(0)
        out.push(Block(track, x, last=True))
        limit = time.monotonic() + len(x) / out.sample_rate + out.latency + 3.0
        while not track.done:
            err = out.check()
            if err is not None:
                raise err if isinstance(err, AudioError) else AudioError(f"playback failed: {err}")
            if time.monotonic() > limit:
                raise AudioError(f"output {out.name!r} stopped consuming audio (no clock?)")
            time.sleep(0.02)
        time.sleep(out.latency)  # the last block is handed over, not yet heard
        info = out.device_info or {}
        return f"{info.get('name', out.name)} ({info.get('hostapi', '?')})"
    finally:
        out.close()


def sub_parser(sub: Any, name: str, help: str, description: str) -> argparse.ArgumentParser:
    return sub.add_parser(
        name,
        help=help,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
