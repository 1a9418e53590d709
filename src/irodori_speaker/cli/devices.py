"""`devices`: the sound outputs by stable name, and a test tone."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import AudioError, InputError
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


def cmd_devices(args: argparse.Namespace) -> int:
    from ..audio.signal import SAMPLE_RATE
    from ..outputs import find_output_device, list_output_devices

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
        "  irodori-speaker devices --tone 'Speakers'   # on a named one",
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
    p.set_defaults(func=cmd_devices)
