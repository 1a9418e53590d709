"""The CPU preset's tricks, each alone and combined, side by side in ONE run, with their error.

Full-size v2 DiT (500M) and full-size codec with random weights, built and loaded through the
product's loaders as benchmarks/news5.py does (its files are shared: /tmp/irodori-news5), then
news5 sentence 1 (and 2 with `--sentences 1,2`) streamed through a `Synthesizer` as the product
does (8 sway steps, text trimmed, fast path, the codec's 8-frame first chunk then 25-frame
chunks: news5's mode (f); the preset rows stream the windows the preset picks, `preset-w25` the
same picks with the 25-frame windows). Each row swaps one thing:

- DiT: fp32 / bf16 weights and activations / int8 linears (`engine.quant.int8`, W8A8 per row) on fp32 or
  bf16 activations / torch.ao's deprecated `quantize_dynamic` (for comparison only);
- codec: fp32 / bf16 with Snake through fp32 (as before) / bf16 with Snake in bf16 / bf16 on the
  channels-last decoder (`codec_channels_last`, engine/codec/fast.py, its torch epilogue on the CPU);
- combined: what the CPU preset picks on this CPU, at several `torch.set_num_threads` settings;
- torch.compile (inductor, C++ codegen; needs a compiler) of the preset's decoder, if it works.

Per row: DiT ms (text encoder + sampling), codec ms (streamed decode), wall ms and RTF of the
line, and the error against the all-fp32 row: the final latent (relative L2 and max abs), the
conditional velocity at t = 1 (one step from the line's noise, guidance off; relative L2), and the
audio (SNR dB over the common length, max abs). Each row is
warmed up once, then the fastest of `--repeat` runs is shown.

    python benchmarks/cpu_preset.py                           # v2, sentence 1 (~1-2 min on 16 cores)
    python benchmarks/cpu_preset.py --sentences 1,2 --threads 16,8
    python benchmarks/cpu_preset.py --family v4.1-mf
    python benchmarks/cpu_preset.py --threads 1 --repeat 1 --no-compile   # a small check, 2 cores

Weights are random: speed and numerical error, not audio quality. Errors of random weights are a
guide only (trained weights have outliers that int8 in particular is sensitive to).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import math
import os
import platform
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import news5  # noqa: E402  (the shared random full-size files and the approximate tokenizer)

from irodori_speaker.engine.hardware.cpu_features import (  # noqa: E402
    cgroup_cpu_limit,
    choose_threads,
    cpu_features,
    usable_cpus,
)
from irodori_speaker.engine.hardware.cpu_tricks import apply_int8_linears  # noqa: E402
from irodori_speaker.engine.hardware.presets import cpu_preset_fields, select_preset  # noqa: E402
from irodori_speaker.options import SynthesisOptions  # noqa: E402
from irodori_speaker.synthesis.loading import load_codec_for, load_dit  # noqa: E402
from irodori_speaker.synthesis.synthesizer import Synthesizer  # noqa: E402
from irodori_speaker.synthesis.voices import Voice, VoiceCache  # noqa: E402
from irodori_speaker.text.length import estimate_seconds  # noqa: E402

F32, BF16 = torch.float32, torch.bfloat16


@dataclass
class Row:
    key: str
    what: str
    dit: str  # key of the DiT variant
    codec: str  # key of the codec variant
    threads: int
    snake_fp32: bool = False  # Snake through fp32 for bf16 input, as before issue 17
    windows: tuple[int, float | None] = (25, None)  # stream_chunk_frames, stream_chunk_growth
    result: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _snr_db(a: torch.Tensor, ref: torch.Tensor) -> float:
    n = min(a.numel(), ref.numel())
    a, ref = a[:n].double(), ref[:n].double()
    noise = (a - ref).pow(2).sum()
    return float("inf") if noise == 0 else float(10 * torch.log10(ref.pow(2).sum() / noise))


class Lines:
    """The sentences, their options (as news5's CPU modes), the voice and the tokenizer."""

    def __init__(self, family: str, files: dict[str, Path], sentences: list[str], seed: int) -> None:
        self.family = family
        self.sentences = sentences
        self.voice = Voice.from_latent(files["ref"])
        base = SynthesisOptions(seed=seed)
        self.options = []
        for text in sentences:
            if family == "v2":
                self.options.append(base)
            else:  # MeanFlow 4 steps; v2's seconds estimate (a random duration predictor is arbitrary)
                self.options.append(base.replace(steps=4, seconds=estimate_seconds(text)))


def make_synth(model, codec, inference, tokenizer, preset) -> Synthesizer:
    return Synthesizer(model, codec, tokenizer, inference=inference, preset=preset, voice_cache=VoiceCache())


def run_line(synth: Synthesizer, text: str, voice: Voice, opts: SynthesisOptions) -> dict[str, Any]:
    """One streamed line: times, the latent (captured from sample_latent), the audio, the sampler inputs."""
    captured: dict[str, Any] = {}
    inner = synth.sample_latent

    def capture(conds, noise, cfg, **kw):
        out = inner(conds, noise, cfg, **kw)
        captured.update(latent=out.detach().float().cpu().clone(), conds=conds, noise=noise, cfg=cfg)
        return out

    synth.sample_latent = capture  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        stream = synth.stream(text, voice, opts)
        chunks, first = [], None
        for chunk in stream:
            if first is None:
                first = time.perf_counter() - t0
            chunks.append(torch.from_numpy(chunk.copy()))
        wall = time.perf_counter() - t0
    finally:
        del synth.sample_latent
    rec = stream.record
    audio = torch.cat(chunks) if chunks else torch.zeros(0)
    return {
        "wall_s": wall,
        "ttfa_s": first or wall,
        "dit_s": rec.timings.get("duration", 0.0) + rec.timings.get("sampling", 0.0),
        "codec_s": rec.timings.get("decode", 0.0),
        "audio_s": len(audio) / 48_000,
        "audio": audio,
        **captured,
    }


def one_step_velocity(synth: Synthesizer, captured: dict[str, Any]) -> torch.Tensor:
    """The conditional velocity at t = 1 on the captured noise: one step, guidance off (x1 - x0)."""
    cfg = captured["cfg"].replace(steps=1, cfg_scale_text=0.0, cfg_scale_speaker=0.0, cfg_scale_caption=0.0)
    with torch.inference_mode():
        x0 = synth.sample_latent(captured["conds"], captured["noise"], cfg)
    return (captured["noise"].float() - x0.float()).cpu()


def measure(row: Row, synth: Synthesizer, lines: Lines, repeat: int) -> dict[str, Any]:
    per_line = []
    for text, opts in zip(lines.sentences, lines.options):
        run_line(synth, text, lines.voice, opts)  # warm-up (oneDNN primitives, the voice's states)
        runs = [run_line(synth, text, lines.voice, opts) for _ in range(max(1, repeat))]
        best = min(runs, key=lambda r: r["wall_s"])
        best["velocity"] = (
            one_step_velocity(synth, best) if row.key in VELOCITY_ROWS or row.dit != "fp32" else None
        )
        per_line.append(best)
    return {"lines": per_line}


#: Rows whose one-step velocity is computed although their DiT is fp32 (the reference itself).
VELOCITY_ROWS = {"ref"}


def error_columns(res: dict[str, Any], ref: dict[str, Any]) -> dict[str, float]:
    """Errors of each line against the reference row's, the worst over the lines."""
    out = {"latent_rel": 0.0, "latent_max": 0.0, "vel_rel": math.nan, "snr_db": math.inf, "audio_max": 0.0}
    for mine, base in zip(res["lines"], ref["lines"]):
        a, b = mine["latent"], base["latent"]
        if a.shape == b.shape:
            out["latent_rel"] = max(out["latent_rel"], _rel(a, b))
            out["latent_max"] = max(out["latent_max"], float((a - b).abs().max()))
        if mine.get("velocity") is not None and base.get("velocity") is not None:
            v = _rel(mine["velocity"], base["velocity"])
            out["vel_rel"] = v if math.isnan(out["vel_rel"]) else max(out["vel_rel"], v)
        n = min(len(mine["audio"]), len(base["audio"]))
        if n:
            out["snr_db"] = min(out["snr_db"], _snr_db(mine["audio"], base["audio"]))
            out["audio_max"] = max(
                out["audio_max"], float((mine["audio"][:n] - base["audio"][:n]).abs().max())
            )
    return out


def totals(res: dict[str, Any]) -> dict[str, float]:
    lines = res["lines"]
    audio = sum(r["audio_s"] for r in lines)
    wall = sum(r["wall_s"] for r in lines)
    return {
        "dit_ms": 1e3 * sum(r["dit_s"] for r in lines),
        "codec_ms": 1e3 * sum(r["codec_s"] for r in lines),
        "wall_ms": 1e3 * wall,
        "ttfa_ms": 1e3 * lines[0]["ttfa_s"],
        "audio_s": audio,
        "rtf": wall / audio if audio else math.nan,
    }


def ao_dynamic_int8(model: torch.nn.Module) -> torch.nn.Module:
    """torch.ao's quantize_dynamic (deprecated since torch 2.10) on the same linears, for comparison."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from irodori_speaker.engine.quant.int8 import BLOCK_LINEARS

    spec = {
        f"blocks.{i}.{name}": per_channel_dynamic_qconfig
        for i in range(len(model.blocks))  # type: ignore[arg-type]
        for name in BLOCK_LINEARS
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)


@contextlib.contextmanager
def snake_through_fp32():
    """Snake as it was before issue 17 for bf16 input: widened to fp32 tensors, then rounded back."""
    from irodori_speaker.engine.codec import Snake

    current = Snake._eager

    def fp32(self, x):
        if x.dtype != torch.bfloat16:
            return current(self, x)
        return current(self, x.float()).to(x.dtype)

    Snake._eager = fp32  # type: ignore[method-assign]
    try:
        yield
    finally:
        Snake._eager = current  # type: ignore[method-assign]


def compile_decoder(codec: torch.nn.Module) -> float:
    """torch.compile the codec's decoder in place (inductor, dynamic lengths, weights frozen)."""
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    codec.decoder = torch.compile(codec.decoder, dynamic=True)  # type: ignore[assignment]
    t0 = time.perf_counter()
    with torch.inference_mode():  # compile now, on a window of the stream's main length
        codec.decoder(torch.zeros(1, codec.config.latent_dim, 41, dtype=codec.dtype))
    return time.perf_counter() - t0


def encode_error(codec_path: Path, seconds: float = 2.0) -> dict[str, float]:
    """Relative error of the bf16 codec's encoder (voice references) against fp32 on a voice-like signal."""
    t = torch.arange(int(seconds * 48_000)) / 48_000
    wave = 0.1 * torch.sin(2 * math.pi * 180 * t) * (1 + 0.5 * torch.sin(2 * math.pi * 3 * t))
    out = {}
    with torch.inference_mode():
        lat = {}
        for dt in (F32, BF16):
            codec = load_codec_for(codec_path, select_preset("cpu", codec_dtype=dt))
            lat[dt] = codec.encode(wave[None, None].to(dt)).float()
            del codec
        out["bf16"] = _rel(lat[BF16], lat[F32])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="v2", choices=news5.FAMILIES)
    ap.add_argument("--sentences", default="1", help="news5 sentence numbers, e.g. 1,2")
    ap.add_argument(
        "--repeat", type=int, default=3, help="timed runs per row after one warm-up (fastest shown)"
    )
    ap.add_argument(
        "--threads",
        default=None,
        help="torch thread counts: the first for every row, all for the preset's rows "
        "(default: the preset's, torch's default, the usable CPUs and half of them)",
    )
    ap.add_argument("--rows", default=None, help="only these row keys (comma-separated; 'ref' is always run)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile row")
    ap.add_argument(
        "--compile-budget", type=float, default=150.0, help="skip compile if the run is past this (s)"
    )
    ap.add_argument("--no-encode", action="store_true", help="skip the bf16 encoder error check")
    ap.add_argument("--smoke", action="store_true", help="tiny random models (checks the script only)")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    t_start = time.perf_counter()

    feats = cpu_features()
    default_threads = torch.get_num_threads()
    usable = usable_cpus()
    picks = cpu_preset_fields(feats)
    # the trick rows run at the preset's threads; the sweep adds torch's default, the usable CPUs, half
    t_main = choose_threads()[0]
    thread_list = (
        [int(t) for t in args.threads.split(",")]
        if args.threads
        else sorted({t_main, default_threads, usable, max(1, usable // 2)}, reverse=True)
    )
    if args.threads:
        t_main = thread_list[0]
    torch.set_num_threads(t_main)
    print(f"# cpu_preset  {platform.machine()}  torch {torch.__version__}  {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"CPU: {feats.summary()}")
    try:
        affinity: int | str = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = "?"
    print(
        f"torch cpu capability {torch.backends.cpu.get_cpu_capability()}; CPUs: os.cpu_count "
        f"{os.cpu_count()}, affinity {affinity}, cgroup limit {cgroup_cpu_limit()}, usable {usable}; "
        f"torch default threads {default_threads}; rows run at {t_main}"
    )
    print(f"the CPU preset picks here: {_fmt_picks(picks)}", flush=True)

    files = news5.prepare_files(int4=False, smoke=args.smoke, families={args.family})
    suffix = "" if args.family == "v2" else f":{args.family}"
    dit_path, codec_path = files["dit" + suffix], files["codec"]
    all_sentences = json.loads(news5.NEWS5_JSON.read_text())["sentences"]
    sentences = [all_sentences[int(i) - 1] for i in args.sentences.split(",")]
    lines = Lines(args.family, files, sentences, args.seed)

    base = select_preset("cpu", dtype=F32, codec_dtype=F32, int8_linears=False, codec_channels_last=False)
    t0 = time.perf_counter()
    loaded32 = load_dit(dit_path, base)
    dits: dict[str, Any] = {"fp32": loaded32.model}
    inference = loaded32.inference
    dits["bf16"] = load_dit(dit_path, dataclasses.replace(base, dtype=BF16)).model
    cfg = loaded32.config
    tokenizer = news5.ApproxTokenizer(cfg.text_token_vocab)
    codecs: dict[str, Any] = {
        "fp32": load_codec_for(codec_path, base),
        "bf16": load_codec_for(codec_path, dataclasses.replace(base, codec_dtype=BF16)),
    }
    print(f"loaded in {time.perf_counter() - t0:.1f} s", flush=True)

    def dit(key: str):
        if key not in dits:
            src, trick = key.split("+", 1) if "+" in key else ("fp32", key)
            model = copy.deepcopy(dits[src if src in dits else "fp32"])
            if trick == "int8":
                apply_int8_linears(model)
            elif trick == "ao-int8":
                ao_dynamic_int8(model)
            dits[key] = model
        return dits[key]

    def codec(key: str):
        if key not in codecs:
            dtype_key = key.split("+")[0]
            c = copy.deepcopy(codecs[dtype_key])
            # the channels-last decoder (engine/codec/fast.py)
            if "cl" in key.split("+") and not c.use_channels_last(True):
                raise RuntimeError("use_channels_last refused this codec")
            codecs[key] = c
        return codecs[key]

    pick_dit = ("bf16" if picks["dtype"] == BF16 else "fp32") + ("+int8" if picks["int8_linears"] else "")
    pick_dit = pick_dit.replace("fp32+int8", "int8")
    pick_codec = "bf16" if picks["codec_dtype"] == BF16 else "fp32"
    pick_codec += "+cl" if picks["codec_channels_last"] else ""
    rows = [
        Row("ref", "all fp32 (the CPU preset before issue 17)", "fp32", "fp32", t_main),
        Row("d-bf16", "DiT bf16", "bf16", "fp32", t_main),
        Row("d-int8", "DiT int8 linears, fp32 activations", "int8", "fp32", t_main),
        Row("d-bf16-int8", "DiT int8 linears, bf16 activations", "bf16+int8", "fp32", t_main),
        Row("d-ao", "DiT torch.ao quantize_dynamic (deprecated), for comparison", "ao-int8", "fp32", t_main),
        Row("c-bf16-rt", "codec bf16, Snake through fp32 (as before)", "fp32", "bf16", t_main, True),
        Row("c-bf16", "codec bf16 (Snake in bf16)", "fp32", "bf16", t_main),
        Row("c-bf16-cl", "codec bf16 + channels-last decoder", "fp32", "bf16+cl", t_main),
        Row("all-bf16", "DiT bf16 + codec bf16 channels-last", "bf16", "bf16+cl", t_main),
        Row("all-int8", "DiT bf16 int8 linears + codec bf16 channels-last", "bf16+int8", "bf16+cl", t_main),
    ]
    if default_threads != t_main:
        what = f"all fp32 at torch's default {default_threads} threads (the CPU preset before, exactly)"
        rows.insert(1, Row("ref-default", what, "fp32", "fp32", default_threads))
    pick_windows = (picks["stream_chunk_frames"], picks["stream_chunk_growth"])
    for n in thread_list:
        what = f"the preset's picks, {n} threads, windows {_fmt_windows(pick_windows)}"
        rows.append(Row(f"preset-t{n}", what, pick_dit, pick_codec, n, windows=pick_windows))
    if pick_windows != (25, None):
        what = "the preset's picks with the windows before (8 then 25 frames)"
        rows.append(Row("preset-w25", what, pick_dit, pick_codec, t_main))
    if args.rows:
        wanted = {"ref", *args.rows.split(",")}
        rows = [r for r in rows if r.key in wanted]

    preset = dataclasses.replace(base)
    for row in rows:
        print(f"running {row.key}: {row.what}", flush=True)
        try:
            torch.set_num_threads(row.threads)
            synth = make_synth(dit(row.dit), codec(row.codec), inference, tokenizer, windowed(preset, row))
            with snake_through_fp32() if row.snake_fp32 else contextlib.nullcontext():
                row.result = measure(row, synth, lines, args.repeat)
            t = totals(row.result)
            print(f"  DiT {t['dit_ms']:.0f} ms, codec {t['codec_ms']:.0f} ms, RTF {t['rtf']:.3f}", flush=True)
        except Exception as e:  # one broken trick must not cost the others' numbers
            traceback.print_exc()
            row.error = f"{type(e).__name__}: {e}"
    torch.set_num_threads(t_main)

    if not args.no_compile:
        elapsed = time.perf_counter() - t_start
        row = Row(
            "compile", "the preset's picks, codec decoder under torch.compile", pick_dit, pick_codec, t_main
        )
        if elapsed > args.compile_budget:
            row.error = (
                f"skipped: the run is at {elapsed:.0f} s, past --compile-budget {args.compile_budget:.0f} s"
            )
        else:
            print(f"running {row.key}: {row.what}", flush=True)
            try:
                c = copy.deepcopy(codecs["bf16" if pick_codec.startswith("bf16") else "fp32"])
                if "+cl" in pick_codec:
                    c.use_channels_last()
                spent = compile_decoder(c)
                row.what += f" (compiled in {spent:.0f} s)"
                row.windows = pick_windows
                synth = make_synth(dit(row.dit), c, inference, tokenizer, windowed(preset, row))
                row.result = measure(row, synth, lines, args.repeat)
            except Exception as e:
                row.error = (
                    f"skipped: torch.compile failed here: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
                )
        rows.append(row)
    else:
        rows.append(
            Row(
                "compile",
                "torch.compile of the decoder",
                pick_dit,
                pick_codec,
                t_main,
                error="skipped: --no-compile",
            )
        )

    enc = None
    if not args.no_encode:
        try:
            enc = encode_error(codec_path)
        except Exception as e:
            print(f"encode check failed: {e}")

    ref = next(r for r in rows if r.key == "ref")
    print(
        f"\n# cpu_preset  {feats.model or platform.processor()}  torch {torch.__version__}  "
        f"{time.strftime('%Y-%m-%d %H:%M')}  family {args.family}  sentences {args.sentences}"
    )
    print(f"CPU flags: {feats.summary()}; the preset picks: {_fmt_picks(picks)}")
    print(
        "\n| row | what | DiT | codec | threads | DiT ms | codec ms | line ms | TTFA ms | audio s | RTF "
        "| x ref | latent rel | latent max | velocity rel | audio SNR dB | audio max |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ref_t = totals(ref.result) if ref.result else None
    summary = []
    for row in rows:
        if not row.result:
            print(f"| {row.key} | {row.what} | {row.dit} | {row.codec} | {row.threads} | {row.error} |")
            summary.append({"key": row.key, "what": row.what, "error": row.error})
            continue
        t = totals(row.result)
        e = error_columns(row.result, ref.result) if row is not ref else {}
        speed = ref_t["wall_ms"] / t["wall_ms"] if ref_t else math.nan
        cells = [
            row.key, row.what, row.dit, row.codec, str(row.threads),
            f"{t['dit_ms']:.0f}", f"{t['codec_ms']:.0f}", f"{t['wall_ms']:.0f}", f"{t['ttfa_ms']:.0f}",
            f"{t['audio_s']:.2f}", f"{t['rtf']:.3f}", f"{speed:.2f}",
            _e(e.get("latent_rel")), _e(e.get("latent_max")), _e(e.get("vel_rel")),
            f"{e['snr_db']:.1f}" if e else "-", _e(e.get("audio_max")),
        ]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
        summary.append({"key": row.key, "what": row.what, "dit": row.dit, "codec": row.codec,
                        "threads": row.threads, **t, **e})  # fmt: skip
    if enc:
        print(
            "\ncodec encoder (voice references) bf16 vs fp32, 2 s voice-like signal: "
            f"latent rel {enc['bf16']:.1e}"
        )
    print(f"\ntotal run time {time.perf_counter() - t_start:.0f} s")
    out = os.environ.get("OUT")
    if out:
        Path(out, "cpu_preset.json").write_text(
            json.dumps({"flags": sorted(feats.flags & _SHOWN), "rows": summary}, indent=1)
        )


_SHOWN = {"amx_bf16", "amx_int8", "amx_tile", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx512f", "avx2"}


def _e(v: float | None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.1e}"


def windowed(preset: Any, row: Row) -> Any:
    """`preset` streaming in `row`'s windows."""
    chunk, growth = row.windows
    return dataclasses.replace(preset, stream_chunk_frames=chunk, stream_chunk_growth=growth)


def _fmt_windows(windows: tuple[int, float | None]) -> str:
    chunk, growth = windows
    return f"8 then {chunk}" if growth is None else f"8, x{growth:g} up to {chunk}"


def _fmt_picks(picks: dict[str, Any]) -> str:
    return ", ".join(f"{k}={str(v).replace('torch.', '')}" for k, v in picks.items())


if __name__ == "__main__":
    main()
