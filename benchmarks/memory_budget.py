"""The GPU memory budget (issue 27, `--max-gpu-memory`): what each budget allows and the peak it holds.

For each budget, in its own process (the allocator's cap holds for the process): load news5's random
full-size files with `load_synthesizer(max_gpu_memory=..., max_batch=16)`, prewarm (every graph the
budget allows), then render `max batch` 10 s lines at once from as many threads (sampled as one
batch) and one 30 s line. Reported: the batch size, graph length and decode chunk the budget
allowed, what the model holds, `torch.cuda.max_memory_allocated` / `max_memory_reserved` over the
whole run (prewarm included), and the error of a line the budget refused (`OverBudgetError`). The
CUDA context (outside the allocator, ~0.5 GiB) is in its own column: nvidia-smi shows it on top.

    python benchmarks/memory_budget.py                          # budgets none,16GiB,8GiB,4GiB,3GiB (CUDA)
    python benchmarks/memory_budget.py --budgets 6GiB,0.05 --int4 --family v4.1-mf
    python benchmarks/memory_budget.py --tiny --budgets 1GiB,256MiB,64MiB   # the tiny model (fast)

Results go to $OUT/memory_budget.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

MiB = 2**20


def run_one(budget: str, tiny: bool, int4: bool, lines_s: float, family: str = "v2") -> dict:
    """One budget, in this process: load, prewarm, a batch of lines, one 30 s line."""
    from irodori_speaker.options.memory import OverBudgetError
    from irodori_speaker.synthesis.loading import load_synthesizer

    torch.zeros(1, device="cuda")
    free, total = torch.cuda.mem_get_info()
    out: dict = {"budget": budget, "gpu": torch.cuda.get_device_name(), "context_mib": (total - free) / MiB}
    given = None if budget == "none" else budget
    t0 = time.perf_counter()
    try:
        if tiny:
            synth = load_synthesizer(tiny_random=True, backend="cuda", max_gpu_memory=given, max_batch=16)
        else:
            import news5

            from irodori_speaker.engine.checkpoint import config_from_metadata, read_header

            files = news5.prepare_files(int4=int4, families={family})
            kind = "int4" if int4 else "dit"
            dit = files[kind if family == "v2" else f"{kind}:{family}"]
            cfg, _ = config_from_metadata(read_header(dit)[0], str(dit))
            synth = load_synthesizer(
                dit,
                codec=files["codec"],
                tokenizer=news5.ApproxTokenizer(cfg.text_token_vocab),
                backend="cuda",
                voice_cache_dir=False,
                max_gpu_memory=given,
                max_batch=16,
                int4=int4 or None,
            )
    except OverBudgetError as e:
        return {**out, "error": str(e)}
    out["resident_mib"] = torch.cuda.memory_allocated() / MiB
    out["max_batch"] = synth.preset.max_batch
    out["prewarm_seconds"] = synth.preset.prewarm_seconds
    out["decode_chunk_frames"] = synth.preset.decode_chunk_frames
    out["budget_bytes"] = synth.preset.max_gpu_memory
    errors: list[str] = []

    def line(seconds: float, seed: int) -> None:
        try:
            synth.synthesize("本日のニュースをお伝えします。" * 3, options={"seconds": seconds, "seed": seed})
        except OverBudgetError as e:
            errors.append(str(e))

    try:
        synth.prewarm()
    except OverBudgetError as e:
        errors.append(f"prewarm: {e}")
    threads = [threading.Thread(target=line, args=(lines_s, i)) for i in range(synth.preset.max_batch)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    line(30.0, 99)
    torch.cuda.synchronize()
    out["peak_allocated_mib"] = torch.cuda.max_memory_allocated() / MiB
    out["peak_reserved_mib"] = torch.cuda.max_memory_reserved() / MiB
    out["errors"] = errors
    out["seconds"] = time.perf_counter() - t0
    return out


def child(budget: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", budget, "--lines-s", str(args.lines_s)]
    cmd += ["--tiny"] * args.tiny + ["--int4"] * args.int4 + ["--family", args.family]
    env = {k: v for k, v in os.environ.items() if k != "IRODORI_MAX_GPU_MEMORY"}
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"budget": budget, "error": f"timed out after {args.timeout:.0f} s"}
    found = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if not found:
        return {"budget": budget, "error": f"exit {proc.returncode}, no result"}
    return json.loads(found[-1][len("RESULT ") :])


def cell(value, fmt: str = ".0f") -> str:
    return "-" if value is None else format(value, fmt)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budgets", default="none,16GiB,8GiB,4GiB,3GiB")
    ap.add_argument(
        "--tiny", action="store_true", help="the tiny-random model instead of the full-size files"
    )
    ap.add_argument("--int4", action="store_true", help="the int4 DiT (RTN file)")
    ap.add_argument("--family", default="v2", help="news5's random files: v2, v4.1-mf or v4-large")
    ap.add_argument("--lines-s", type=float, default=10.0, help="length of the batched lines (s)")
    ap.add_argument("--timeout", type=float, default=300.0, help="per budget (s)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        result = run_one(args.one, args.tiny, args.int4, args.lines_s, args.family)
        print("RESULT " + json.dumps(result), flush=True)
        return
    if not torch.cuda.is_available():
        sys.exit("memory_budget.py needs a CUDA device (the budget caps CUDA memory only)")
    if not args.tiny:
        import news5

        news5.prepare_files(int4=args.int4, families={args.family})  # made once, outside the children
    model = "tiny-random" if args.tiny else f"full-size {args.family} ({'int4' if args.int4 else 'bf16'})"
    print(f"GPU memory budget, {model}: {args.lines_s:g} s lines batched, then one 30 s line (MiB)")
    cols = [
        "budget",
        "max batch",
        "graphs up to (s)",
        "decode chunk",
        "model",
        "peak allocated",
        "peak reserved",
    ]
    cols.append("within")
    print("| " + " | ".join([*cols, "context", "refused"]) + " |")
    print("|" + "---|" * 10)
    rows = []
    for budget in args.budgets.split(","):
        r = child(budget.strip(), args)
        rows.append(r)
        limit = r.get("budget_bytes")
        peak = r.get("peak_reserved_mib")
        within = "-" if not limit or peak is None else str(peak * MiB <= limit)
        refused = r.get("error") or "; ".join(r.get("errors", [])) or "none"
        print(
            f"| {r['budget']} | {cell(r.get('max_batch'), 'd')} | {cell(r.get('prewarm_seconds'), 'g')} | "
            f"{cell(r.get('decode_chunk_frames'), 'd')} | "
            f"{cell(r.get('resident_mib'))} | {cell(r.get('peak_allocated_mib'))} | {cell(peak)} | "
            f"{within} | {cell(r.get('context_mib'))} | {refused[:120]} |",
            flush=True,
        )
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "memory_budget.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
