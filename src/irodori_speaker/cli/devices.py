"""`devices`: the sound outputs by stable name, and a test tone."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import AudioError, InputError
from ..options.memory import budget_from, format_bytes
from .common import EXIT_ERROR, EXIT_OK, describe_device, play_audio, sub_parser


def tone(seconds: float = 1.0, frequency: float = 440.0, rate: int | None = None, level: float = 0.2):
    """A sine test tone with 20 ms raised-cosine edges (no click); `rate` defaults to SAMPLE_RATE."""
    import numpy as np

    from ..audio.signal import SAMPLE_RATE

    rate = SAMPLE_RATE if rate is None else rate

    n = max(1, round(seconds * rate))
    t = np.arange(n) / rate
    x = (level * np.sin(2 * np.pi * frequency * t)).astype(np.float32)
    edge = min(n // 2, round(0.02 * rate))
    if edge:
        ramp = (0.5 - 0.5 * np.cos(np.linspace(0, np.pi, edge))).astype(np.float32)
        x[:edge] *= ramp
        x[-edge:] *= ramp[::-1]
    return x


def gpu_memory_lines(args: argparse.Namespace) -> list[str]:
    """The GPU memory budget (--max-gpu-memory, else $IRODORI_MAX_GPU_MEMORY) and what it allows on
    each CUDA device: the max batch for --model / --tiny-random, estimated from the files' headers
    (the startup log gives the figure measured at load). Empty without a budget (torch not loaded)."""
    budget, source = budget_from(args.max_gpu_memory, where="--max-gpu-memory")
    if budget is None:
        return []
    import torch

    from ..engine.hardware.presets import base_preset

    head = f"GPU memory budget: {budget.describe()} ({source})"
    files = _model_files(args)
    preset = base_preset("cuda")
    if not torch.cuda.is_available():
        lines = [f"{head}: not applicable here (no CUDA device; the budget caps CUDA memory only)"]
        if files is not None and budget.bytes is not None:
            plan = _plan(files, budget.bytes, budget.bytes, preset)
            lines.append(f"  on a CUDA device it would allow max batch {plan.max_batch} for {files[2]}")
        return lines
    lines = [head]
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        limit = budget.resolve(props.total_memory)
        line = f"  cuda:{i} {props.name}: {format_bytes(limit)} of {format_bytes(props.total_memory)}"
        if files is not None:
            plan = _plan(files, limit, props.total_memory, preset)
            line += (
                f"; allows max batch {plan.max_batch} for {files[2]} (model ~{format_bytes(plan.resident)}, "
                f"~{format_bytes(plan.per_line)} per line; an estimate from the files)"
            )
        else:
            line += "; the max batch it allows: give --model or --tiny-random (or see the startup log)"
        lines.append(line)
    return lines


def _plan(files: tuple[Any, Any, str, Any], budget: int, total: int, preset: Any) -> Any:
    from ..engine.codec.config import CodecConfig
    from ..engine.hardware.memory import plan_from_files

    codec = CodecConfig.from_kwargs(files[3]) if files[3] is not None else None
    return plan_from_files(files[0], files[1], budget, total, preset, codec)


def _model_files(args: argparse.Namespace) -> tuple[Any, Any, str, Any] | None:
    """(model file, codec file, name, codec kwargs or None: the released codec's) for --model /
    --tiny-random, else None."""
    if args.tiny_random:
        from ..engine.codec.config import TINY_CODEC_KWARGS
        from ..engine.tiny import tiny_random_files

        tiny = tiny_random_files()
        return tiny.model, tiny.codec, "the tiny-random model", TINY_CODEC_KWARGS
    if args.model:
        from ..engine.sources import CODEC_REPO, resolve_files

        model, codec, _ = resolve_files(args.model, CODEC_REPO, None, want_tokenizer=False)
        return model, codec, args.model, None
    return None


def cmd_devices(args: argparse.Namespace) -> int:
    from ..audio.signal import SAMPLE_RATE
    from ..outputs import find_output_device, list_output_devices

    for line in gpu_memory_lines(args):  # a bad budget is refused before anything plays
        print(line, file=sys.stderr if args.json else sys.stdout)  # --json: stdout holds the JSON only
    devices = list_output_devices()
    try:
        default = find_output_device(None)
    except AudioError:
        default = None
    if args.tone is not None:
        if not (0 < args.seconds <= 30):
            raise InputError(f"--seconds must be in (0, 30], got {args.seconds}")
        name = args.tone or None
        played = play_audio(
            tone(args.seconds, args.frequency), SAMPLE_RATE, device=name, hostapi=args.hostapi
        )
        if args.json:
            doc = {"played": True, **played, "seconds": args.seconds, "frequency": args.frequency}
            print(json.dumps(doc, ensure_ascii=False, indent=2))
        else:
            print(f"played a {args.seconds:g} s {args.frequency:g} Hz tone on {describe_device(played)}")
        return EXIT_OK
    if args.json:
        for d in devices:
            d["default"] = default is not None and d["index"] == default["index"]
        print(json.dumps(devices, ensure_ascii=False, indent=2))
        return EXIT_OK
    if not devices:
        print("no output devices (PortAudio sees none)")
        return EXIT_ERROR
    names = [d["name"] for d in devices]
    for d in devices:
        mark = "*" if default is not None and d["index"] == default["index"] else " "
        shared = names.count(d["name"]) > 1
        api = f" --hostapi {d['hostapi']!r}" if shared else ""
        print(
            f"{mark} {d['name']!r} ({d['hostapi']}){api}  "
            f"{d['channels']} ch, {d['samplerate']:.0f} Hz  [index {d['index']}, may change]"
        )
    print("* = default. Choose one by name: --output-device NAME, or Speaker(output=NAME).")
    return EXIT_OK


def register(sub: Any) -> None:
    p = sub_parser(
        sub,
        "devices",
        "list sound outputs (stable names) or play a test tone",
        "List the sound output devices PortAudio sees, by the names --output-device and\n"
        "Speaker(output=...) take (indexes change when devices come and go; names do not).\n\n"
        "  irodori-speaker devices\n"
        "  irodori-speaker devices --tone              # on the default device\n"
        "  irodori-speaker devices --tone 'Speakers'   # on a named one\n"
        "  irodori-speaker devices --max-gpu-memory 3GiB --tiny-random   # what a GPU budget allows",
    )
    p.add_argument(
        "--tone",
        nargs="?",
        const="",
        metavar="NAME",
        help="play a test tone on device NAME (default: the default device)",
    )
    p.add_argument("--hostapi", help="host API of the device when a name is offered by several")
    p.add_argument("--seconds", type=float, default=1.0, help="tone length (default 1 s)")
    p.add_argument("--frequency", type=float, default=440.0, help="tone frequency in Hz (default 440)")
    p.add_argument(
        "--json", action="store_true", help="print the list (or, with --tone, what played) as JSON"
    )
    g = p.add_argument_group("GPU memory")
    g.add_argument(
        "--max-gpu-memory",
        metavar="SIZE",
        help="show this GPU memory budget (e.g. 3GiB, 0.25 of the card; default: $IRODORI_MAX_GPU_MEMORY) "
        "and the batch size it allows",
    )
    g.add_argument("--model", help="the model the budget's max batch is estimated for (its header is read)")
    g.add_argument("--tiny-random", action="store_true", help="estimate it for the tiny-random model")
    p.set_defaults(func=cmd_devices)
