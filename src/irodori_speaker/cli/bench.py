"""`bench`: the news5 speed benchmark on this machine."""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..engine.sources import DEFAULT_MODEL
from ..errors import InputError
from .common import (
    EXIT_OK,
    add_model_flags,
    add_sampling_flags,
    add_voice_flags,
    build_options,
    load_from_args,
    sub_parser,
    voice_and_checks,
)

# The news5 sentences (benchmarks/data/news5.json), so the benchmark runs from an installed package.
NEWS5 = (
    "次のニュースだよっ！",
    "今日の東京は朝から青空が広がり、日中の最高気温は二十五度近くまで上がる見込みです。",
    "政府は新しい経済対策を発表し、子育て世帯への給付金や電気料金の補助を来月から全国で順次始めると明らかにしました。",
    "大型の台風が週末にかけて沖縄地方に接近する予報です。",
    "プロ野球では地元チームが九回裏に逆転サヨナラ勝ちしました。",
)


def bench_sentences(path: str | None) -> tuple[list[str], str]:
    if path is None:
        return list(NEWS5), "news5 (built in)"
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read benchmark sentences {path}: {e}") from e
    sentences = doc.get("sentences") if isinstance(doc, dict) else doc
    if not isinstance(sentences, list) or not all(isinstance(s, str) and s.strip() for s in sentences):
        raise InputError(f"{path}: expected {{'sentences': [text, ...]}} or a list of texts")
    name = doc.get("name", Path(path).stem) if isinstance(doc, dict) else Path(path).stem
    return sentences, str(name)


def run_bench(
    synth: Any,
    sentences: Sequence[str],
    voice: Any,
    options: Any,
    repeat: int = 1,
    on_row: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Per sentence: generation time, audio seconds, RTF and time to first audio (streamed).

    With `repeat` > 1 the times are medians over the repeats. `on_row` sees each row as
    soon as it is measured.
    """
    rows = []
    for i, text in enumerate(sentences, 1):
        gens, firsts, audio_s = [], [], 0.0
        for _ in range(repeat):
            t0 = time.perf_counter()
            stream = synth.stream(text, voice, options)
            first = None
            samples = 0
            try:
                for chunk in stream:
                    if first is None:
                        first = time.perf_counter() - t0
                    samples += len(chunk)
            finally:
                stream.close()
            gens.append(time.perf_counter() - t0)
            firsts.append(first if first is not None else gens[-1])
            audio_s = samples / synth.sample_rate
        gen = statistics.median(gens)
        rows.append(
            {
                "index": i,
                "chars": len(text),
                "audio_s": audio_s,
                "gen_s": gen,
                "rtf": gen / audio_s if audio_s else math.inf,
                "ttfa_s": statistics.median(firsts),
                "text": text,
            }
        )
        if on_row is not None:
            on_row(rows[-1])
    return rows


def bench_totals(rows: Sequence[dict]) -> dict:
    gen = sum(r["gen_s"] for r in rows)
    audio = sum(r["audio_s"] for r in rows)
    return {
        "chars": sum(r["chars"] for r in rows),
        "audio_s": audio,
        "gen_s": gen,
        "rtf": gen / audio if audio else math.inf,
        "ttfa_s": statistics.mean(r["ttfa_s"] for r in rows) if rows else math.nan,
    }


def _device_name(synth: Any) -> str:
    import torch

    dev = getattr(synth, "device", None)
    if dev is not None and getattr(dev, "type", "") == "cuda":
        return f"{dev} ({torch.cuda.get_device_name(dev)})"
    if dev is not None and getattr(dev, "type", "") == "cpu":
        return f"cpu ({torch.get_num_threads()} threads)"
    return str(dev)


def cmd_bench(args: argparse.Namespace) -> int:
    import platform

    import torch

    if args.repeat < 1 or args.warmup < 0:
        raise InputError("--repeat must be >= 1 and --warmup >= 0")
    sentences, name = bench_sentences(args.sentences)
    voice = voice_and_checks(args)
    synth = load_from_args(args)
    options = build_options(args)
    if options.seed is None:
        import dataclasses

        options = dataclasses.replace(options, seed=0)
    for _ in range(args.warmup):
        synth.prewarm(voice)
    preset = synth.preset
    options = synth.resolve_options(options)  # the preset's steps and schedule filled in, once
    steps, schedule = options.steps, options.schedule
    if synth.config.meanflow:  # a MeanFlow file reads no schedule
        schedule = "meanflow"
    model_fp = (synth.fingerprints.get("model") or "?")[:12]
    header = {
        "benchmark": name,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "device": _device_name(synth),
        "preset": preset.name,
        "dtype": str(preset.dtype).replace("torch.", ""),
        "int4": preset.int4,
        "fp8": preset.fp8,
        "codec_int4": preset.codec_int4,
        "codec_device": preset.codec_device or preset.device,
        "model": args.model
        or (
            f"tiny-random {args.tiny_kind}"
            if args.tiny_kind
            else "tiny-random"
            if args.tiny_random
            else f"default ({DEFAULT_MODEL})"
        ),
        "family": synth.config.family,
        "model_sha256": model_fp,
        "steps": steps,
        "schedule": schedule,
        "seed": options.seed,
        "repeat": args.repeat,
        "warmup": args.warmup,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
    }
    print(
        f"{name} on {header['device']}, {header['dtype']}, {steps} steps {schedule}, seed {options.seed}; "
        f"model {header['model']} ({header['family']}) [{model_fp}]; {header['date']}"
    )
    print(f"{'#':>3} {'chars':>5} {'audio s':>8} {'gen s':>7} {'RTF':>6} {'TTFA s':>7}  text")

    def show(r: dict) -> None:
        text = r["text"] if len(r["text"]) <= 24 else r["text"][:23] + "…"
        print(
            f"{r['index']:>3} {r['chars']:>5} {r['audio_s']:>8.2f} {r['gen_s']:>7.3f} "
            f"{r['rtf']:>6.3f} {r['ttfa_s']:>7.3f}  {text}",
            flush=True,
        )

    rows = run_bench(synth, sentences, voice, options, args.repeat, on_row=show)
    totals = bench_totals(rows)
    t = totals
    print(
        f"{'all':>3} {t['chars']:>5} {t['audio_s']:>8.2f} {t['gen_s']:>7.3f} {t['rtf']:>6.3f} "
        f"{t['ttfa_s']:>7.3f}  (RTF = total generation / total audio; TTFA mean)"
    )
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps({**header, "rows": rows, "totals": totals}, ensure_ascii=False, indent=2), "utf-8"
        )
        print(f"wrote {out}")
    return EXIT_OK


def register(sub: Any) -> None:
    p = sub_parser(
        sub,
        "bench",
        "the news5 speed benchmark on this machine",
        "Read the five news5 sentences (or --sentences FILE) and print, per sentence, the\n"
        "generation time, the audio seconds, RTF (generation / audio) and time to first\n"
        "audio (streamed decode), plus totals. The model is prewarmed first (--warmup).\n\n"
        "  irodori-speaker bench --backend cuda\n"
        "  irodori-speaker bench --tiny-random --backend cpu    # offline check",
    )
    p.add_argument("--sentences", help="a JSON file {'sentences': [...]} (default: the built-in news5)")
    p.add_argument("--repeat", type=int, default=1, help="runs per sentence; times are medians (default 1)")
    p.add_argument("--warmup", type=int, default=1, help="prewarm runs before timing (default 1)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    add_model_flags(p)
    add_voice_flags(p)
    add_sampling_flags(p, seed_help="noise seed (default: 0, so runs compare)")
    p.set_defaults(func=cmd_bench)
