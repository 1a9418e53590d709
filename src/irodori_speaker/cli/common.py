"""What the commands share: exit codes, the progress display, common flags, loading, playback."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any

from ..engine.sources import DEFAULT_MODEL, MODELS
from ..errors import AudioError, CacheError, InputError
from ..options import OptionSpec, SynthesisOptions, option_specs
from ..options.memory import budget_from
from .messages import phases_of

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

log = logging.getLogger("irodori_speaker.cli")

#: The kinds of --tiny-kind (engine.tiny.TINY_CONFIGS; a test keeps the two equal). Listed here so
#: building the parser does not import torch.
TINY_KINDS = ("v2", "v3", "v2-voicedesign", "v4", "v4.1-mf", "v4-large")
#: engine.tiny: what --tiny-random builds (DEFAULT_KIND, moved by $IRODORI_TINY_KIND), and the kinds
#: without a caption branch (--caption refused before the model loads). A test keeps them equal.
TINY_DEFAULT, TINY_KIND_ENV, TINY_NO_CAPTION = "v4.1-mf", "IRODORI_TINY_KIND", ("v2", "v3")


# ---- shared flags ---------------------------------------------------------------------------


def add_model_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        help="DiT checkpoint: a path, hf://org/repo/file, a repo id, or an alias "
        f"({', '.join(MODELS)}). Default: {DEFAULT_MODEL} ({MODELS[DEFAULT_MODEL]})",
    )
    g.add_argument("--codec", help="DACVAE codec: weights.pth, our converted .safetensors, or a repo id")
    g.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="text tokenizer: a v4 release's tokenizer/ folder, or tokenizer.json for v2 / v3 "
        "(default: the folder beside the model, else the model's tokenizer repo)",
    )
    g.add_argument(
        "--tiny-random",
        action="store_true",
        help="a small random model in the real formats, of the default model's family "
        "(offline; the output is NOISE)",
    )
    g.add_argument(
        "--tiny-kind",
        metavar="KIND",
        help=f"which tiny-random model (implies --tiny-random): {', '.join(TINY_KINDS)} "
        "(default: the default model's family)",
    )
    g.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="torch CPU threads (default: $IRODORI_THREADS, else half the CPUs this process may use, "
        "leaving the rest to OBS, a game or an LLM; -v logs the choice)",
    )
    g.add_argument(
        "--max-gpu-memory",
        metavar="SIZE",
        help="GPU memory budget, e.g. 3GiB, 3000MB or 0.25 of the card (default: $IRODORI_MAX_GPU_MEMORY, "
        "else none): on CUDA the allocator, batch size and graphs stay within it; not applicable on "
        "the CPU and MPS",
    )
    g.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "cuda", "mps", "cpu"],
        help="device backend preset (default: auto = cuda, else mps, else cpu)",
    )
    g.add_argument("--device", help="torch device override, e.g. cuda:1")
    g.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], help="model precision override")
    g.add_argument(
        "--int4",
        action="store_true",
        help="run the DiT on int4 weights (int4 files load as stored; a float file is quantised "
        "with RTN at load)",
    )
    g.add_argument(
        "--fp8",
        action="store_true",
        help="the DiT's linears as W8A8 FP8 (e4m3) on FP8 tensor cores: NVIDIA compute capability "
        "8.9+ (RTX 40-series, H100/H200); refused elsewhere and with --int4",
    )
    g.add_argument(
        "--codec-int4",
        action="store_true",
        help="the codec's decoder convolutions as RTN int4: the least memory, a slower decode",
    )
    g.add_argument(
        "--codec-device", help="where the codec runs (default: the model's device), e.g. cpu to spare the GPU"
    )


#: `--voice sample`: the sample voice in the package (synthesis.voices.SAMPLE_VOICE, Voice.sample()).
SAMPLE_VOICE_FILE = Path(__file__).resolve().parents[1] / "data" / "sample_voice.opus"


def add_voice_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("voice")
    g.add_argument(
        "--voice",
        action="append",
        help="reference voice: an audio file, or a saved latent (.safetensors); give it several "
        "times for one voice from several clips (joined in order up to the model's cap: 120 s on v4); "
        "`sample`: the 4 s sample voice shipped in the package (CC0)",
    )
    g.add_argument(
        "--caption", help="voice description for VoiceDesign and v4 models, v4-large too (with --voice on v4)"
    )


# ---- option flags: generated from the options' specs (options/synthesis.py) -----------------

#: The synthesis options each flag group sets, in the order `--help` shows them.
SAMPLING_OPTIONS = ("steps", "schedule", "seed", "seconds", "tail_trim")
CONTROL_OPTIONS = ("speed", "pitch", "intonation", "loudness", "volume", "pre_silence", "post_silence")
READING_OPTIONS = ("tags", "urls", "laughter", "read_numbers", "read_english", "pause_markup")
FLAG_OPTIONS = SAMPLING_OPTIONS + CONTROL_OPTIONS + READING_OPTIONS


def option_flag(name: str) -> str:
    """The command line flag of option `name`: --pre-silence; --no-tail-trim for an option on by default."""
    spec = option_specs(SynthesisOptions)[name]
    flag = name.replace("_", "-")
    return f"--no-{flag}" if spec.check.kind is bool and spec.default is True else f"--{flag}"


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def option_help(name: str, doc: str | None = None, default: Any = None) -> str:
    """The flag's help: the option's doc (or `doc`), its allowed values and its default."""
    spec = option_specs(SynthesisOptions)[name]
    default = spec.default if default is None else default
    if spec.check.kind is bool:
        return f"{'turn off' if default else 'turn on'}: {doc or spec.doc}"
    text = f"{doc or spec.doc} ({spec.check.allowed(nullable=False)}"
    return text + (f"; default {_shown(default)})" if default is not None else ")")


class _CheckedOption(argparse.Action):
    """Stores the flag's value once its option's `Check` accepts it; else an InputError (one
    line and a hint, exit status 1) before anything else runs."""

    def __init__(self, *args: Any, option: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.option = option

    def __call__(self, parser: Any, namespace: argparse.Namespace, value: Any, flag: Any = None) -> None:
        spec = option_specs(SynthesisOptions)[self.option]
        check = dataclasses.replace(spec.check, nullable=False)
        setattr(namespace, self.dest, check(self.option, value, hint=f"{flag}: {spec.doc}"))


def add_option_flag(g: Any, name: str, *, doc: str | None = None, default: Any = None) -> None:
    """The flag of synthesis option `name` (see `option_flag`), made from its spec: the type,
    the choices, the range check (`_CheckedOption`) and the help with range and default.
    `args.<name>` is the checked value, or `default` (None: the flag was not given)."""
    spec: OptionSpec = option_specs(SynthesisOptions)[name]
    check, flag = spec.check, option_flag(name)
    help = option_help(name, doc, default).replace("%", "%%")
    if check.kind is bool:
        g.add_argument(
            flag, dest=name, action="store_const", const=not spec.default, default=default, help=help
        )
        return
    kind = str if check.parse is not None else check.kind
    metavar = check.unit.upper() if check.unit else None
    g.add_argument(
        flag,
        dest=name,
        type=kind,
        choices=list(check.choices) or None,
        metavar=metavar,
        default=default,
        action=_CheckedOption,
        option=name,
        help=help,
    )


def add_sampling_flags(p: argparse.ArgumentParser, seed_help: str | None = None) -> None:
    g = p.add_argument_group("sampling")
    for name in SAMPLING_OPTIONS:
        add_option_flag(g, name, doc=seed_help if name == "seed" else None)
    add_control_flags(p)


def add_control_flags(p: argparse.ArgumentParser) -> None:
    """The voice controls (docs/voices.md): speed, pitch, loudness, volume, silences."""
    g = p.add_argument_group("voice controls")
    for name in CONTROL_OPTIONS:
        add_option_flag(g, name)


def add_reading_flags(p: argparse.ArgumentParser, *, tag_map: bool = True) -> None:
    """The readings pass (text/readings.py, docs/text-and-readings.md): each on by default."""
    g = p.add_argument_group("readings")
    for name in READING_OPTIONS:
        add_option_flag(g, name)
    if tag_map:
        g.add_argument(
            "--tag-map",
            metavar="FILE.json",
            help='tag -> voice/caption/options/text, e.g. {"happy": {"voice": "h.wav"}}',
        )


def read_tag_map(args: argparse.Namespace) -> Any:
    """The --tag-map file as a TagMap (None without the flag); a bad file is an InputError."""
    path = getattr(args, "tag_map", None)
    if not path:
        return None
    import json

    from ..text.tags import TagMap

    try:
        mapping = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(
            f"--tag-map {path}: {e}", hint='a JSON object, e.g. {"happy": {"voice": "h.wav"}}'
        ) from None
    return TagMap(mapping)


def add_cache_flags(p: argparse.ArgumentParser, *, switch: bool = False, inner: bool = False) -> None:
    """--cache-dir DIR; with `switch`, also the --cache flag that turns the cache on (say); `inner`:
    on a subcommand whose group takes it too (`cache --cache-dir D stats` = `cache stats --cache-dir D`)."""
    from ..cache import default_cache_dir

    g = p.add_argument_group("phrase cache")
    if switch:
        g.add_argument(
            "--cache",
            action="store_true",
            help="look the line up in the phrase cache first and store it after "
            "(a cached line uses seed 0 unless --seed)",
        )
    g.add_argument(
        "--cache-dir",
        metavar="DIR",
        default=argparse.SUPPRESS if inner else None,
        help=f"phrase cache directory{' (implies --cache)' if switch else ''} "
        f"(default: {default_cache_dir()}; $IRODORI_CACHE moves it)",
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
    """The voice the flags name; a reference file that is missing or no audio fails here, cheaply
    (torch loads with the Voice class: only when there is a voice, so -v times torch's import)."""
    given = [args.voice] if isinstance(args.voice, str) else list(args.voice or [])
    clips = []
    if given:
        for value in given:
            path = Path(value)
            if value == "sample" and not path.exists():  # the voice shipped in the package
                path = SAMPLE_VOICE_FILE
            if not path.is_file():
                raise AudioError(
                    f"reference voice {path} does not exist",
                    hint="give a recording (WAV, FLAC, OGG, MP3) or a saved .safetensors latent",
                )
            if path.suffix != ".safetensors":
                check_audio_file(path)
            clips.append(path)
    if not given and not args.caption:
        return None
    with phases_of(args).phase("torch import"):
        from ..synthesis.voices import Voice

    if given:
        return Voice.from_clips(clips, caption=args.caption)
    return Voice.designed(args.caption)


def check_audio_file(path: Path) -> None:
    import soundfile as sf

    try:
        sf.info(str(path))
    except (OSError, RuntimeError) as e:  # LibsndfileError is a RuntimeError
        raise AudioError(
            f"reference voice {path} is not a sound file we can read",
            hint="give a WAV, FLAC, OGG or MP3 recording (or a saved .safetensors latent)",
        ) from e


def check_caption(args: argparse.Namespace, synth: Any) -> None:
    """--caption on a model without a caption branch would be silently ignored: refuse it."""
    if getattr(args, "caption", None) and not synth.config.caption_enabled:
        raise caption_error()


def caption_error() -> InputError:
    return InputError(
        "--caption needs a VoiceDesign or v4 model; this model has no caption branch",
        hint="use --model v3-voicedesign, v4.1-mf or v4-large (offline: --tiny-kind v2-voicedesign, v4 "
        "or v4-large), "
        "or leave --caption out",
    )


def build_options(args: argparse.Namespace) -> SynthesisOptions:
    """The SynthesisOptions the option flags set (an option whose flag was not given keeps its default)."""
    return SynthesisOptions(**_given(args, FLAG_OPTIONS))


def build_readings(args: argparse.Namespace) -> dict[str, Any]:
    """The readings options the flags set (the others keep their defaults)."""
    return _given(args, READING_OPTIONS)


def _given(args: argparse.Namespace, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def tiny_kind(args: argparse.Namespace) -> str | bool:
    """The tiny-random kind the flags ask for (True: the default kind), or False for a real model.
    A model file named beside it would be ignored: refused."""
    kind: str | bool = bool(args.tiny_random)
    if args.tiny_kind:
        if args.tiny_kind not in TINY_KINDS:
            raise InputError(
                f"unknown --tiny-kind {args.tiny_kind!r}", hint=f"one of {', '.join(TINY_KINDS)}"
            )
        kind = str(args.tiny_kind)
    named = [f for f in ("model", "codec", "tokenizer") if getattr(args, f, None)]
    if kind and named:
        flag = "--tiny-kind" if args.tiny_kind else "--tiny-random"
        raise InputError(
            f"{flag} builds its own random model: --{named[0]} {getattr(args, named[0])} would be ignored",
            hint=f"drop {flag} to load --{named[0]}, or drop --{named[0]}",
        )
    return kind


def check_threads(args: argparse.Namespace) -> None:
    threads = getattr(args, "threads", None)
    if threads is not None and threads < 1:
        raise InputError(
            f"--threads must be at least 1, got {threads}",
            hint="leave it out for the default (half the CPUs this process may use)",
        )


def check_gpu_memory(args: argparse.Namespace) -> None:
    """A bad --max-gpu-memory (or $IRODORI_MAX_GPU_MEMORY): one line, before torch loads."""
    budget_from(getattr(args, "max_gpu_memory", None), where="--max-gpu-memory")


def voice_and_checks(args: argparse.Namespace):
    """The cheap checks every synthesising command makes before loading a model; its voice."""
    kind = tiny_kind(args)
    if kind is True:
        kind = os.environ.get(TINY_KIND_ENV, "").strip() or TINY_DEFAULT
    if kind in TINY_NO_CAPTION and getattr(args, "caption", None):
        raise caption_error()
    check_threads(args)
    check_gpu_memory(args)
    return build_voice(args)


def load_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """`load_synthesizer` keyword arguments from the common model flags (preset fields only when given);
    a bad --max-gpu-memory (or $IRODORI_MAX_GPU_MEMORY) is refused here, before any model loads."""
    check_gpu_memory(args)
    return {
        "model": args.model,
        "codec": args.codec,
        "tokenizer": args.tokenizer,
        "backend": args.backend,
        "device": args.device,
        "dtype": args.dtype,
        "tiny_random": tiny_kind(args),
        "int4": args.int4 or None,  # None: the preset's
        "fp8": args.fp8 or None,
        "codec_int4": args.codec_int4 or None,
        "codec_device": args.codec_device,
        "threads": getattr(args, "threads", None),
        "max_gpu_memory": getattr(args, "max_gpu_memory", None),
    }


def load_from_args(args: argparse.Namespace):
    """The synthesizer the model flags ask for (--caption is checked against it); -v logs how long
    torch's import and the model load took."""
    kind = tiny_kind(args)
    check_threads(args)
    check_gpu_memory(args)
    phases = phases_of(args)
    with phases.phase("torch import"):
        import torch  # noqa: F401  (timed on its own: ~1.5 s of a first line on a small CPU)

        from ..synthesis.loading import load_synthesizer
    log.info("torch import: %.2f s", phases.parts["torch import"])  # with the voice's, if one was given
    with phases.phase("model load"):
        synth = load_synthesizer(**load_kwargs(args))
    what = args.model or (
        f"tiny-random {synth.config.family}" if kind else f"the default model ({DEFAULT_MODEL})"
    )
    log.info(
        "model load: %.2f s (%s on %s, preset %s, %s CPU threads)",
        phases.parts["model load"],
        what,
        synth.device,
        synth.preset.name,
        synth.preset.threads,
    )
    check_caption(args, synth)
    return synth


def open_cache(directory: str | None, *, must_exist: bool = False, **kwargs: Any):
    from ..cache import INDEX_NAME, PhraseCache, default_cache_dir

    path = Path(directory).expanduser() if directory else default_cache_dir()
    if must_exist and not (path / INDEX_NAME).is_file():
        raise CacheError(
            f"there is no phrase cache at {path}",
            hint="fill one with `irodori-speaker prebuild phrases.txt --cache-dir DIR`",
        )
    return PhraseCache(path, **kwargs)


def play_audio(
    audio: Any, sample_rate: int, device: str | None = None, hostapi: str | None = None
) -> dict[str, Any]:
    """Play float32 mono audio on a sound device (by name, as `devices` lists it) and wait.

    Returns the device it played on ({"name", "hostapi"}). Raises AudioError when there is no
    device or it fails.
    """
    import numpy as np

    from ..audio.signal import resample
    from ..outputs import Block, SoundDeviceOutput, Track

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
        return {"name": info.get("name", out.name), "hostapi": info.get("hostapi", "?")}
    finally:
        out.close()


def describe_device(info: dict[str, Any]) -> str:
    return f"{info['name']} ({info['hostapi']})"


def add_log_flags(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    """-q / -v, on the top-level parser and on every command (so both positions work)."""
    default = 0 if top else argparse.SUPPRESS
    g = p.add_argument_group("messages")
    g.add_argument("-q", "--quiet", action="count", default=default, help="errors only, no progress bar")
    g.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default,
        help="log what happens (-v: info, -vv: debug) on stderr",
    )


def sub_parser(sub: Any, name: str, help: str, description: str) -> argparse.ArgumentParser:
    p = sub.add_parser(
        name,
        help=help,
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_flags(p)
    return p


def show_progress(args: argparse.Namespace) -> bool | None:
    """False when -q asked for quiet; None lets the bar decide (on only on a terminal)."""
    return False if getattr(args, "quiet", 0) else None
