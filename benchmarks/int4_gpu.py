"""W4A16 GEMM on the DiT shapes: our Triton kernel (measured choice), its scratch + cuBLAS path, cuBLAS on
the dequantised fp16/bf16 weight, and the seed's kernel (PyPI ``onecomp-runtime``) when importable.

    python benchmarks/int4_gpu.py            # every shape, M in {25, 75, 150, 450, 750, 2250}, fp16 + bf16
    python benchmarks/int4_gpu.py --quick    # bf16 only, M in {25, 150, 450, 2250}
    python benchmarks/int4_gpu.py --graph    # time inside CUDA graphs (GPU time only, no launch overhead)
    python benchmarks/int4_gpu.py --smoke    # CPU, M=25: reference int4, emulated FP8 (checks the script)

FP8 columns (issue 27): ``fp8`` is `engine.quant.fp8.Fp8Linear` as the model runs it (per-token e4m3
activations quantised in the call, then ``torch._scaled_mm`` with row-wise scales, bf16 out) on the
same weights; ``fp8 mm`` the ``_scaled_mm`` alone on pre-quantised inputs (what a fused quantiser
could reach). Both need compute capability 8.9+ ("n/a" elsewhere); their error is FP8's own (a few
percent against the fp32 reference), checked against its own bound (``FP8_TOL``).

Every method is checked against the fp32 dequantised reference before it is timed (relative L2 error;
a method over tolerance is reported and not timed). Timing: ``triton.testing.do_bench`` median (or
``do_bench_cudagraph``), each timed call running the GEMM over R rotations of weights and inputs sized to
exceed the L2 twice, as in a forward pass where every layer's weights come from HBM; per-GEMM time is that
over R. Prints a table; writes JSON to ``--json`` or ``$OUT/int4_gpu.json`` when $OUT is set.

``onecomp-runtime`` (its ``onecomp_runtime.layers.FusedInt4Linear(in, out, qweight, scales, qzeros, bias,
groupsize=32)``, GPTQ-v1, K padded to 256 inside) is optional: its column reads "n/a" when not importable.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from irodori_speaker.engine.kernels.triton_common import HAS_TRITON
from irodori_speaker.engine.kernels.tuning import tuning_allowed
from irodori_speaker.engine.quant.formats import pack_gptq
from irodori_speaker.engine.quant.fp8 import Fp8Linear, fp8_gemm_device, quantize_act_fp8, quantize_weight_fp8
from irodori_speaker.engine.quant.w4a16_chooser import (
    candidate_configs,
    choose_impl,
    clear_choices,
    w4a16_linear,
)
from irodori_speaker.engine.quant.w4a16_dequant import w4a16_scratch
from irodori_speaker.engine.quant.w4a16_kernel import default_config, w4a16_kernel

SHAPES = [  # (label, K, N)
    ("attn 1280x1280", 1280, 1280),
    ("mlp up 1280->3680", 1280, 3680),
    ("mlp down 3680->1280", 3680, 1280),
    ("qkvg fused 1280->5120", 1280, 5120),
    ("w1w3 fused 1280->7360", 1280, 7360),
]
MS = [25, 75, 150, 450, 750, 2250]
QUICK_MS = [25, 150, 450, 2250]
TOL = {torch.float16: 2e-3, torch.bfloat16: 6e-3}
FP8_TOL = 0.06  # e4m3 weights and activations: ~3 % relative on random data
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def peak_memory(fn: Callable[[], object], device: str | torch.device = "cuda") -> tuple[object, int]:
    """Hook for end-to-end rows: run `fn`, return (its result, peak bytes allocated during it)."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    return out, torch.cuda.max_memory_allocated(device) - base


def onecomp_layer_factory():
    """A constructor (qweight, scales, qzeros, K, N) -> callable, or None with the reason."""
    try:
        from onecomp_runtime.layers import FusedInt4Linear
    except Exception as e:  # not installed, or its import failed
        return None, f"onecomp-runtime not importable ({type(e).__name__}: {e})"

    def make(qweight, scales, qzeros, k, n):
        return FusedInt4Linear(k, n, qweight, scales, qzeros, None, groupsize=32)

    return make, "onecomp_runtime.layers.FusedInt4Linear"


def _random_layer(k: int, n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)
    z = torch.full((n, k // 32), 8)
    s = torch.rand(n, k // 32, generator=g) * 0.02 + 0.002
    return pack_gptq(q, z, s)


def _rel(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float() - ref).norm() / ref.norm())


def _time(fn: Callable[[], object], graph: bool, rep_ms: int, smoke: bool = False) -> float:
    if smoke:  # CPU: a few calls by the wall clock (the smoke run checks the script, not speed)
        fn()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        return (time.perf_counter() - t0) / 3 * 1000.0
    import triton

    fn()
    torch.cuda.synchronize()
    if graph:
        return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))
    return float(triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median"))


def _methods(xs, qw, sc, w16, oc, cfg, f8, smoke) -> dict[str, Callable[[int], torch.Tensor]]:
    out: dict[str, Callable[[int], torch.Tensor]] = {
        "cublas": lambda i: F.linear(xs[i], w16[i]),
        "int4": lambda i: w4a16_linear(xs[i], qw[i], sc[i], None),
    }
    if not smoke:  # the Triton paths: CUDA only
        out["kernel"] = lambda i: w4a16_kernel(xs[i], qw[i], sc[i], None, config=cfg)
        out["scratch"] = lambda i: w4a16_scratch(xs[i], qw[i], sc[i], None)
    if oc is not None:
        out["onecomp"] = lambda i: oc[i](xs[i])
    if f8 is not None:
        out["fp8"] = lambda i: f8[i](xs[i])
        if f8[0].uses_scaled_mm(xs[0].device):
            xq = [quantize_act_fp8(x) for x in xs]
            out["fp8 mm"] = lambda i: torch._scaled_mm(
                xq[i][0], f8[i].qweight.t(), scale_a=xq[i][1], scale_b=f8[i].scale_b, out_dtype=torch.bfloat16
            )
    return out


def _tol(name: str, dtype: torch.dtype) -> float:
    return FP8_TOL if name.startswith("fp8") else TOL[dtype]


def _print_row(row: dict, dtype: torch.dtype) -> None:
    us = row["us"]

    def cell(name: str) -> str:
        v = us.get(name)
        if v is not None:
            return f"{v:8.1f}"
        return f"{'n/a' if name not in row['rel_err'] else 'FAIL':>8s}"

    best = us.get("int4")
    xc = f"{us['cublas'] / best:8.2f}" if best and "cublas" in us else f"{'-':>8s}"
    xo = f"{us['onecomp'] / best:7.2f}" if best and "onecomp" in us else f"{'-':>7s}"
    f8 = us.get("fp8")
    xf = f"{us['cublas'] / f8:7.2f}" if f8 and "cublas" in us else f"{'-':>7s}"
    xfi = f"{best / f8:7.2f}" if f8 and best else f"{'-':>7s}"
    errs = ",".join(f"{k}={v:.1e}" for k, v in row["rel_err"].items() if isinstance(v, float))
    print(
        f"{row['dtype']:8s} {row['shape']:22s} {row['M']:5d} {cell('cublas')} {cell('int4')} "
        f"{cell('kernel')} {cell('scratch')} {cell('onecomp')} {xc} {xo} "
        f"{cell('fp8')} {cell('fp8 mm')} {xf} {xfi}  {row['choice']} / {errs}"
    )
    bad = {k: v for k, v in row["rel_err"].items() if not isinstance(v, float) or v > _tol(k, dtype)}
    if bad:
        print(f"      !! over tolerance or failed: {bad}")


def _bench_shape(dtype, label, k, n, ms, args, l2, onecomp) -> list[dict]:
    dev = torch.device("cpu" if args.smoke else "cuda")
    int4_bytes = k * n // 2 + (k // 32) * n * 2
    reps = 1 if args.smoke else max(2, min(args.max_rot, math.ceil(2 * l2 / int4_bytes)))
    layers = [_random_layer(k, n, seed=i) for i in range(reps)]
    qw = [p.qweight.to(dev) for p in layers]
    sc = [p.scales.to(dev) for p in layers]
    w16 = [p.dequantize(torch.float32).to(dev, dtype) for p in layers]  # [N, K]
    w32_0 = layers[0].dequantize(torch.float32).to(dev)
    oc = [onecomp(qw[i], sc[i], p.qzeros.to(dev), k, n) for i, p in enumerate(layers)] if onecomp else None
    # FP8 of the same (int4-valued) weights: where the device has FP8 tensor cores, or emulated (--smoke)
    f8 = None
    if args.smoke or fp8_gemm_device(dev):
        f8 = [Fp8Linear(*quantize_weight_fp8(w)) for w in w16]
    rows = []
    for m in ms:
        xs = [torch.randn(m, k, device=dev).to(dtype) for _ in range(reps)]
        ref = xs[0].float() @ w32_0.t()
        if args.retune:
            clear_choices()
        if args.smoke:
            choice, cfg = None, None
        else:
            with tuning_allowed():  # the chooser's warm-up pick for this bucket, as prewarm makes it
                choice = choose_impl(xs[0], qw[0], sc[0], None)
            cfg = choice.config or default_config(m, n, k)
        row = {
            "dtype": str(dtype).split(".")[-1],
            "shape": label,
            "K": k,
            "N": n,
            "M": m,
            "rotations": reps,
            "choice": "reference"
            if choice is None
            else "scratch"
            if choice.impl == "scratch"
            else cfg.name(),
            "candidates_ms": {} if choice is None else dict(choice.timings),
            "us": {},
            "rel_err": {},
        }
        for name, fn in _methods(xs, qw, sc, w16, oc, cfg, f8, args.smoke).items():
            try:
                err = _rel(fn(0), ref)
            except Exception as e:
                row["rel_err"][name] = f"error: {type(e).__name__}: {str(e)[:600]}"
                continue
            row["rel_err"][name] = err
            if err > _tol(name, dtype):
                continue  # wrong results are not timed

            def all_rot(fn=fn, reps=reps):
                for i in range(reps):
                    fn(i)

            row["us"][name] = 1000.0 * _time(all_rot, args.graph, args.rep_ms, args.smoke) / reps
        _print_row(row, dtype)
        rows.append(row)
    return rows


def _compile_tasks(dtypes, shapes, ms) -> list[tuple]:
    """One task per distinct compiled variant: (dtype, K, N, M, config)."""
    seen, tasks = set(), []
    for dtype in dtypes:
        for _, k, n in shapes:
            for m in ms:
                for cfg in candidate_configs(m, n, k):
                    key = (str(dtype), k % cfg.bk == 0, cfg.bm, cfg.bn, cfg.bk, cfg.num_warps, cfg.num_stages,
                           cfg.swap, cfg.gather, cfg.split_k > 1)  # fmt: skip
                    if key not in seen:
                        seen.add(key)
                        tasks.append((str(dtype).split(".")[-1], k, n, m, cfg))
    return tasks


def _compile_worker(chunk: list[tuple]) -> int:
    """Run each task once on small random data so Triton's on-disk cache holds the binaries."""
    done = 0
    for dtype_name, k, n, m, cfg in chunk:
        dtype = getattr(torch, dtype_name)
        p = _random_layer(k, n, seed=0)
        x = torch.randn(m, k, device="cuda").to(dtype)
        try:
            w4a16_kernel(x, p.qweight.cuda(), p.scales.cuda(), None, config=cfg)
            done += 1
        except Exception:
            pass  # the chooser skips tiles that do not fit; so does the benchmark
    torch.cuda.synchronize()
    return done


def precompile(dtypes, shapes, ms, jobs: int) -> None:
    """Compile every candidate tile in `jobs` processes first (Triton compiles one kernel at a time)."""
    import multiprocessing as mp

    tasks = _compile_tasks(dtypes, shapes, ms)
    t0 = time.perf_counter()
    chunks = [tasks[i::jobs] for i in range(jobs)]
    with mp.get_context("spawn").Pool(jobs) as pool:
        done = sum(pool.map(_compile_worker, [c for c in chunks if c]))
    print(
        f"# precompiled {done}/{len(tasks)} kernel variants in {time.perf_counter() - t0:.1f} s ({jobs} jobs)"
    )


def run(args: argparse.Namespace) -> dict:
    if args.smoke:
        name, sms, l2 = f"CPU smoke ({platform.processor() or platform.machine()})", 0, 0
    else:
        props = torch.cuda.get_device_properties(0)
        name, sms = props.name, props.multi_processor_count
        l2 = getattr(props, "L2_cache_size", 50 * 2**20)
    dtypes = [DTYPES[d] for d in args.dtypes.split(",")]
    ms = [25] if args.smoke else QUICK_MS if args.quick else MS
    shapes = [s for s in SHAPES if not args.shapes or any(tag in s[0] for tag in args.shapes.split(","))]
    onecomp, onecomp_note = (None, "not on the CPU") if args.smoke else onecomp_layer_factory()
    timing = (
        "perf_counter, mean of 3"
        if args.smoke
        else "do_bench_cudagraph median"
        if args.graph
        else "do_bench median"
    )
    if args.jobs > 1 and not args.smoke:
        precompile(dtypes, shapes, ms, args.jobs)
    print(f"# {name}, {sms} SMs, L2 {l2 / 2**20:.0f} MiB, torch {torch.__version__}")
    print(f"# onecomp column: {onecomp_note}; timing: {timing}; times in us per GEMM")
    head = (
        f"{'dtype':8s} {'shape':22s} {'M':>5s} {'cuBLAS':>8s} {'int4':>8s} {'kernel':>8s} {'scratch':>8s} "
        f"{'onecomp':>8s} {'x cuBLAS':>8s} {'x onec':>7s} {'fp8':>8s} {'fp8 mm':>8s} {'8xcuBL':>7s} "
        f"{'8xint4':>7s}  choice / rel.err"
    )
    print(head)
    print("-" * len(head))
    rows = []
    for dtype in dtypes:
        for label, k, n in shapes:
            rows += _bench_shape(dtype, label, k, n, ms, args, l2, onecomp)
            if not args.smoke:
                torch.cuda.empty_cache()
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": name,
        "sms": sms,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__ if HAS_TRITON else None,
        "python": platform.python_version(),
        "timing": timing,
        "onecomp": onecomp_note,
        "command": " ".join(sys.argv),
        "rows": rows,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="bf16 only, M in {25, 150, 450, 2250}")
    ap.add_argument("--dtypes", default=None, help="comma list of fp16,bf16 (default both; --quick: bf16)")
    ap.add_argument("--shapes", default="", help="comma list of label substrings (e.g. 'attn,down')")
    ap.add_argument("--graph", action="store_true", help="time with CUDA graphs (do_bench_cudagraph)")
    ap.add_argument("--rep-ms", type=int, default=60, help="do_bench rep time per measurement")
    ap.add_argument("--max-rot", type=int, default=64, help="cap on weight/input rotations")
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="parallel precompile")
    ap.add_argument("--retune", action="store_true", help="forget cached choices before every row")
    ap.add_argument("--smoke", action="store_true", help="CPU: M=25, reference int4 and emulated FP8 only")
    ap.add_argument("--json", default=None, help="write results here (default $OUT/int4_gpu.json if $OUT)")
    args = ap.parse_args()
    if args.dtypes is None:
        args.dtypes = "bf16" if args.quick or args.smoke else "fp16,bf16"
    if not args.smoke and not torch.cuda.is_available():
        print("int4_gpu.py needs an NVIDIA GPU (or --smoke)", file=sys.stderr)
        return 1
    if not args.smoke and not HAS_TRITON:
        print("int4_gpu.py needs triton", file=sys.stderr)
        return 1
    t0 = time.perf_counter()
    result = run(args)
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    out = args.json or (str(Path(os.environ["OUT"]) / "int4_gpu.json") if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(json.dumps(result, indent=1))
        print(f"# wrote {out}")
    print(f"# wall {result['wall_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
