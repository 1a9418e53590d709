"""GPU memory and disk size of the DiT at fp32 / bf16 / int4, alone and with the codec (issue: int4).

Each configuration is loaded by `load_synthesizer` with our CUDA preset (`select_preset("cuda")`: the
fast path, CUDA graphs on, 8 sway steps, default guidance, streamed codec decode) and streams one 10 s
line (no tail trim) with a 10 s reference voice through `Synthesizer.stream`, as users run it (the
text-encoder graph and the voice-state cache included). Each configuration runs in its own Python
process, so allocator caches, graph pools, Triton modules and cuBLAS workspaces of one configuration
cannot leak into the next.

    python benchmarks/memory_gpu.py                       # every row and codec column (CUDA)
    python benchmarks/memory_gpu.py --rows int4 --codecs none,int4
    python benchmarks/memory_gpu.py --smoke               # tiny model on the CPU: checks the script
    python benchmarks/memory_gpu.py --family v4-large --rows bf16,int4   # v4-Large (13 GB fp32 file)

`--family v4-large` measures the issue-31 goal: v4-Large end to end in <= 4 GB with our int4 and
the fp16 codec (row int4, column fp16; its T5Gemma 2 token table packed, docs/int4.md).

Rows: fp32 and bf16 DiT weights, and int4 (our RTN int4 file, W4A16 with bf16 activations).
Columns: the size of the DiT file (bf16: a file saved from the model loaded in bf16); the peak of
`torch.cuda.max_memory_allocated` from a clean state over loading the DiT (and the codec),
encoding the conditions, sampling the line and (with a codec) a streamed decode of it, and what
stays allocated once loading is done. Codec columns, as preset fields: fp16 on the GPU, int4 on
the GPU (`codec_int4=True`: packed on the CPU and then moved, so the peak is not the fp16 codec's),
and fp32 on the CPU (`codec_device="cpu"`); "DiT only" keeps the codec on the CPU and stops after
the first decoded window. Reserved-memory peaks, the warm footprint (reserved after the line
with `empty_cache`, graph pools included) and the memory outside the allocator (CUDA context,
kernel modules) are in the second table and the JSON.

The files are news5's random full-size files (`news5.prepare_files`); the weights are random, so
this measures memory, not quality. Memory is in MiB (2**20 bytes), as the seed's "MB" (its FP32
file, 1888 "MB", is 1888 MiB). With `--smoke` the CUDA figures are nan; the weight sizes are real.
Results go to $OUT/memory_gpu.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import news5  # noqa: E402  (the random full-size files and the approximate tokenizer)

from irodori_speaker.engine.checkpoint import (  # noqa: E402
    config_from_metadata,
    load_checkpoint,
    read_header,
    save_checkpoint,
)
from irodori_speaker.engine.hardware.presets import Preset, base_preset, select_preset  # noqa: E402
from irodori_speaker.options import SynthesisOptions  # noqa: E402
from irodori_speaker.synthesis.loading import load_synthesizer  # noqa: E402
from irodori_speaker.synthesis.voices import Voice  # noqa: E402

ROWS = {"fp32": torch.float32, "bf16": torch.bfloat16, "int4": torch.bfloat16}  # DiT activations
CODECS = {
    "none": "DiT only",
    "fp16": "+ codec fp16 (GPU)",
    "int4": "+ codec int4 (GPU)",
    "cpu": "+ codec on CPU (fp32)",
}
NAN = float("nan")
MiB = 2**20

# The seed's published figures (RTX PRO 4000 Blackwell, 6 RF steps), from the README of
# kizuna-intelligence/Irodori-TTS-Lite. MB there are MiB: its FP32 file, 1888 MB, is our fp32 file's 1888 MiB.
SEED = {
    "fp32": {"disk": 1888, "none": 1917},
    "bf16": {},
    "int4": {"disk": 279, "none": 552, "fp16": 1513, "int4": 989, "cpu": 989},
}
SEED_NOTE = (
    "seed: RTX PRO 4000 Blackwell, 6 RF steps (source: the README of kizuna-intelligence/Irodori-TTS-Lite). "
    "It also lists: disk BF16 944 MB; DiT-only FP16 978.7 MB, "
    "max_memory_reserved FP32 1992 / FP16 1004 / INT4 568 MB; end to end, codec on the GPU, FP32 "
    "2867.7 / BF16 1990.6 MB. Its tools/measure_peak_memory.py fixes the line at 3 s and its documented "
    "commands pass --no-ref: a shorter line and no reference voice, against our 10 s line, 10 s "
    "reference and 8 steps."
)


# ---------------------------------------------------------------------------------------------
# One configuration (runs in a child process: `--one ROW+CODEC`)
# ---------------------------------------------------------------------------------------------


def preset_for(dtype: torch.dtype, smoke: bool) -> Preset:
    """The CUDA preset at the row's DiT dtype; `smoke`: the same preset moved to the CPU (no graphs)."""
    if smoke:
        return base_preset("cuda").with_overrides(device="cpu", dtype=dtype, cuda_graphs=False)
    return select_preset("cuda", dtype=dtype)


def tensor_mib(modules: list[torch.nn.Module]) -> float:
    """Bytes held by the modules' parameters and buffers, each storage counted once (fused views share)."""
    seen: dict[int, int] = {}
    for module in modules:
        for t in [*module.parameters(), *module.buffers()]:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values()) / MiB


def memory(cuda: bool) -> dict[str, float]:
    """Allocator readings now, in MiB (nan without CUDA); peaks since the last reset."""
    if not cuda:
        return {"allocated": NAN, "reserved": NAN, "peak_allocated": NAN, "peak_reserved": NAN}
    torch.cuda.synchronize()
    return {
        "allocated": torch.cuda.memory_allocated() / MiB,
        "reserved": torch.cuda.memory_reserved() / MiB,
        "peak_allocated": torch.cuda.max_memory_allocated() / MiB,
        "peak_reserved": torch.cuda.max_memory_reserved() / MiB,
    }


def outside_allocator_mib(cuda: bool) -> float:
    """Device memory this process uses beyond the caching allocator: CUDA context, loaded modules."""
    if not cuda:
        return NAN
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / MiB


# How each codec column is loaded: preset fields of the product (load_synthesizer), nothing by hand.
CODEC_PRESETS: dict[str, dict] = {
    "none": {"codec_device": "cpu", "codec_dtype": torch.float32},  # off the GPU, and never decoded
    "fp16": {},  # the CUDA preset's codec
    "int4": {"codec_int4": True},  # packed on the CPU, then moved: the GPU never holds the fp16 codec
    "cpu": {"codec_device": "cpu", "codec_dtype": torch.float32},
}


def line_text() -> str:
    """The longest news5 sentence (the line is sampled at a fixed length; the text sets the conditions)."""
    sentences = json.loads(news5.NEWS5_JSON.read_text())["sentences"]
    return max(sentences, key=len)


def _key(kind: str, family: str) -> str:
    """news5.prepare_files' key of a family's file ("dit", "int4", "dit:v4-large", ...)."""
    return kind if family == "v2" else f"{kind}:{family}"


def run_one(name: str, smoke: bool, seconds: float, int4_impl: str, seed: int, family: str = "v2") -> dict:
    """Load (load_synthesizer), then stream one line as users do; memory at every stage."""
    row, codec_kind = name.split("+")
    if codec_kind not in CODEC_PRESETS:
        raise ValueError(f"unknown codec column {codec_kind!r}; use one of {', '.join(CODECS)}")
    dtype = ROWS[row]
    preset = preset_for(dtype, smoke)
    device = preset.device
    cuda = device == "cuda"
    files = news5.prepare_files(int4=row == "int4", smoke=smoke, families={family})
    dit = files[_key("int4" if row == "int4" else "dit", family)]
    out: dict = {"name": name, "row": row, "codec": codec_kind, "device": device, "dtype": str(dtype)}
    out["family"] = family
    if cuda:  # create the context, read what it costs, then start from a clean allocator
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        out["gpu"] = torch.cuda.get_device_name()
        out["context_mib"] = outside_allocator_mib(cuda)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    out["baseline"] = memory(cuda)

    t0 = time.perf_counter()
    cfg, _ = config_from_metadata(read_header(dit)[0], str(dit))
    tokenizer = news5.ApproxTokenizer(cfg.text_token_vocab)
    synth = load_synthesizer(
        dit,
        codec=files["codec"],
        tokenizer=tokenizer,
        preset=preset,
        voice_cache_dir=False,
        int4=row == "int4",
        **CODEC_PRESETS[codec_kind],
    )
    if row == "int4" and int4_impl != "auto":
        from irodori_speaker.engine.quant.layers import Int4Linear

        for module in synth.model.modules():
            if isinstance(module, Int4Linear):
                module.impl = int4_impl
    fast = synth.fast_sampler  # built as the synthesizer builds it: fused projections (resident form)
    out["fast_path"] = fast is not None
    out["cuda_graphs"] = bool(fast is not None and fast.use_graphs)
    out["after_load"] = memory(cuda)  # peaks here: the load's
    out["load_s"] = time.perf_counter() - t0
    modules = [synth.model] + ([m for b in fast.fast.blocks for m in (b.qkvg, b.w13)] if fast else [])
    out["dit_weights_mib"] = tensor_mib(modules)
    out["codec_weights_mib"] = NAN if codec_kind == "none" else tensor_mib([synth.codec])
    if cuda:
        torch.cuda.reset_peak_memory_stats()  # from here: the run's peak (resident weights included)

    text = line_text()
    voice = Voice.from_latent(files["ref"])
    # the line as the preset streams it: conditions, the whole sampling loop (first line: graph capture
    # + replay), then the decode windows; the whole sampled length is decoded (no tail trim)
    opts = SynthesisOptions(seed=seed, seconds=seconds, tail_trim=False)
    stream = synth.stream(text, voice, opts)
    samples = len(next(stream))  # the first chunk: sampling done, one window decoded
    out["after_sampling"] = memory(cuda)
    if codec_kind != "none":  # DiT only: the codec (on the CPU) decodes no more
        samples += sum(len(part) for part in stream)  # handed over as numpy, as users get them
    stream.close()
    record = stream.record
    out["after_decode"] = memory(cuda)
    out["sampling_s"] = record.timings.get("sampling", NAN)
    out["decode_s"] = record.timings.get("decode", NAN) if codec_kind != "none" else NAN
    out["outside_allocator_end_mib"] = outside_allocator_mib(cuda)
    if cuda:  # what a warm synthesizer keeps: weights, graphs and their pools, static buffers
        torch.cuda.empty_cache()
        out["warm_reserved_mib"] = torch.cuda.memory_reserved() / MiB
    else:
        out["warm_reserved_mib"] = NAN
    out.update(
        text_chars=len(text),
        text_tokens=len(tokenizer.encode(text)),
        ref_frames=int(synth.reference_latent(voice).shape[1]),
        frames=record.frames,
        steps=record.steps,
        schedule=record.schedule,
        guidance=opts.guidance,
        audio_s=samples / 48_000,
        graphs_captured=0 if fast is None else fast.captures,
    )
    load, run = out["after_load"], out["after_decode"]
    out["peak_allocated_mib"] = max(load["peak_allocated"], run["peak_allocated"])
    out["peak_reserved_mib"] = max(load["peak_reserved"], run["peak_reserved"])
    return out


# ---------------------------------------------------------------------------------------------
# The driver: files, disk sizes, one child per configuration, the tables
# ---------------------------------------------------------------------------------------------


def disk_mib(files: dict[str, Path], family: str = "v2") -> dict[str, float]:
    """Size of the DiT file per row; bf16: a file saved from the fp32 one loaded in bf16."""
    dit, int4 = files[_key("dit", family)], files[_key("int4", family)]
    sizes = {"fp32": dit.stat().st_size / MiB, "int4": int4.stat().st_size / MiB}
    loaded = load_checkpoint(dit, dtype=torch.bfloat16, device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bf16.safetensors"
        save_checkpoint(loaded.model, path, inference=loaded.inference)
        sizes["bf16"] = path.stat().st_size / MiB
    sizes["codec_fp32"] = files["codec"].stat().st_size / MiB
    return sizes


def child(args: list[str], timeout: float) -> dict:
    """Run this script with `args` in a fresh process; its last `RESULT {json}` line, or the error."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *args]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not results:
        return {"error": f"exit status {proc.returncode}", "stdout_tail": proc.stdout[-2000:]}
    return json.loads(results[-1][len("RESULT ") :])


def cell(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "–"
    return "nan" if isinstance(value, float) and math.isnan(value) else f"{value:.{digits}f}"


def print_tables(
    results: dict[str, dict],
    disk: dict[str, float],
    rows: list[str],
    codecs: list[str],
    seed_rows: bool = True,
) -> None:
    """The tables; `seed_rows`: the seed's v2 figures beside ours (v2 only: it ran no other family)."""

    def peak(row: str, codec: str) -> float | None:
        r = results.get(f"{row}+{codec}")
        return None if r is None or "error" in r else r["peak_allocated_mib"]

    def after_load(row: str) -> float | None:
        r = results.get(f"{row}+none")
        return None if r is None or "error" in r else r["after_load"]["allocated"]

    cols = [c for c in codecs if c != "none"]
    head = [
        "mode",
        "disk MiB",
        "DiT only: peak",
        "DiT only: after load",
        *[f"{CODECS[c]}: peak" for c in cols],
    ]
    print("\n| " + " | ".join(head) + " |")
    print("|---" * len(head) + "|")
    for row in rows:
        label = "int4 (W4A16, bf16 act.)" if row == "int4" else row
        ours = [label, cell(disk.get(row), 1), cell(peak(row, "none")), cell(after_load(row))]
        print("| " + " | ".join(ours + [cell(peak(row, c)) for c in cols]) + " |")
        if not seed_rows:
            continue
        seed = SEED[row]
        theirs = [f"{row} (seed)", cell(seed.get("disk")), cell(seed.get("none")), "–"]
        print("| " + " | ".join(theirs + [cell(seed.get(c)) for c in cols]) + " |")
    print(
        "\nPeaks are torch.cuda.max_memory_allocated over load + conditions + sampling (+ decode), in MiB, "
        "from a clean allocator in a fresh process. They do not include the CUDA context (nor kernel "
        "modules, Triton binaries): that memory is outside PyTorch's allocator; see 'context' below."
    )
    if seed_rows:
        print(SEED_NOTE)

    print(
        "\n| config | weights MiB (DiT / codec) | load peak | run peak | peak reserved | warm reserved "
        "| context | outside allocator at end | load s | sampling s | decode s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        if "error" in r:
            print(f"| {name} | error: {r['error']} |||||||||")
            continue
        print(
            f"| {name} | {cell(r['dit_weights_mib'], 1)} / {cell(r['codec_weights_mib'], 1)} "
            f"| {cell(r['after_load']['peak_allocated'])} | {cell(r['after_decode']['peak_allocated'])} "
            f"| {cell(r['peak_reserved_mib'])} | {cell(r['warm_reserved_mib'])} "
            f"| {cell(r.get('context_mib', NAN))} | {cell(r['outside_allocator_end_mib'])} "
            f"| {r['load_s']:.1f} | {r['sampling_s']:.2f} | {r['decode_s']:.2f} |"
        )
    print(
        "\nload peak: max_memory_allocated while loading (e.g. a bf16 load casts on the GPU, tensor by "
        "tensor); run peak: after a reset, over conditions + sampling + decode (resident weights "
        "included); peak reserved: max_memory_reserved over both. warm reserved: memory_reserved after "
        "the line and empty_cache() with the synthesizer alive (weights, captured CUDA graphs and their "
        "private pool, static buffers): what a warm speaker holds. context: device memory in use after "
        "CUDA init beyond the allocator (mem_get_info); outside allocator at end: the same after the "
        "run (context + loaded kernels). The device needs roughly peak reserved + outside allocator."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="fp32,bf16,int4", help="DiT rows, of fp32, bf16, int4")
    ap.add_argument("--codecs", default="none,fp16,int4,cpu", help="columns, of none, fp16, int4, cpu")
    ap.add_argument("--seconds", type=float, default=10.0, help="length of the sampled line")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument(
        "--int4-impl",
        default="auto",
        choices=["auto", "kernel", "scratch"],
        help="Int4Linear path: auto = the preset's measured per-shape choice",
    )
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds per configuration")
    ap.add_argument("--smoke", action="store_true", help="tiny random model on the CPU (CUDA figures nan)")
    ap.add_argument("--family", default="v2", choices=news5.FAMILIES, help="which release's configuration")
    ap.add_argument("--one", metavar="ROW+CODEC", help=argparse.SUPPRESS)  # child: one configuration
    ap.add_argument("--prepare", action="store_true", help=argparse.SUPPRESS)  # child: make the files
    args = ap.parse_args()
    if args.smoke:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the CPU path, even on a machine with a GPU
    if args.prepare:
        news5.prepare_files(int4=True, smoke=args.smoke, families={args.family})
        return
    if args.one:
        result = run_one(args.one, args.smoke, args.seconds, args.int4_impl, args.seed, args.family)
        print("RESULT " + json.dumps(result), flush=True)
        return

    rows = [r for r in args.rows.split(",") if r]
    codecs = [c for c in args.codecs.split(",") if c]
    bad = sorted(set(rows) - set(ROWS)) + sorted(set(codecs) - set(CODECS))
    if bad:
        ap.error(f"unknown row(s)/codec(s) {bad}")
    common = ["--seconds", str(args.seconds), "--seed", str(args.seed), "--int4-impl", args.int4_impl]
    common += ["--smoke"] if args.smoke else []
    common += ["--family", args.family]
    t_start = time.perf_counter()
    # The files are made in a child too: this process never creates a CUDA context of its own.
    if subprocess.run([sys.executable, str(Path(__file__).resolve()), "--prepare", *common]).returncode:
        sys.exit("preparing the files failed")
    files = news5.prepare_files(int4=True, smoke=args.smoke, families={args.family})  # only the paths now
    disk = disk_mib(files, args.family)
    print(f"disk MiB: {json.dumps({k: round(v, 1) for k, v in disk.items()})}", flush=True)

    results: dict[str, dict] = {}
    summary = {
        "torch": torch.__version__,
        "smoke": args.smoke,
        "family": args.family,
        "seconds": args.seconds,
        "disk_mib": disk,
        "results": results,
        "int4_tuning_run": None,
        "seed": SEED,
        "seed_note": SEED_NOTE,
    }
    if "int4" in rows and args.int4_impl == "auto" and not args.smoke:
        # The auto path measures kernel vs scratch per shape on first use. A throw-away run fills a
        # tune file, so the measured int4 rows show the steady choice, not the measurement's buffers.
        os.environ.setdefault("IRODORI_INT4_TUNE_CACHE", str(news5.WORK / "full/int4_tune.json"))
        summary["int4_tuning_run"] = tune = child(["--one", "int4+none", *common], args.timeout)
        print(f"int4 tuning run: peak {cell(tune.get('peak_allocated_mib'))} MiB", flush=True)
    for row in rows:
        for codec in codecs:
            name = f"{row}+{codec}"
            print(f"running {name}", flush=True)
            results[name] = r = child(["--one", name, *common], args.timeout)
            if "error" in r:
                print(f"  {name}: {r['error']}\n{r.get('stdout_tail', '')}", flush=True)
            else:
                print(f"  {name}: peak {cell(r['peak_allocated_mib'])} MiB", flush=True)
            write_json(summary)  # after every configuration: a run cut short keeps what it measured

    first = next((r for r in results.values() if "error" not in r), {})
    summary["gpu"] = gpu = first.get("gpu", "CPU (smoke)" if args.smoke else "?")
    preset = base_preset("cuda")
    # the steps the lines were rendered with (each child's record of its resolved options); the
    # preset's only when no configuration ran
    steps, schedule = first.get("steps", preset.steps), first.get("schedule", preset.schedule)
    print(
        f"\n# memory_gpu  {gpu}  torch {torch.__version__}  {time.strftime('%Y-%m-%d %H:%M')}  "
        f"{args.seconds:g} s line, {steps} {schedule} steps, 10 s reference, "
        "CUDA preset (fast path, CUDA graphs)"
    )
    print_tables(results, disk, rows, codecs, seed_rows=args.family == "v2")
    print(f"\ntotal {time.perf_counter() - t_start:.0f} s")
    write_json(summary)


def write_json(summary: dict) -> None:
    """$OUT/memory_gpu.json when OUT is set (NaN where a figure does not exist, e.g. CUDA on the CPU)."""
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, "memory_gpu.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
