"""Each dilated conv of the decoder as itself against in phases (`_Conv.phases`), on this machine.

On CUDA the decoder runs its dilated convs in phases (cuDNN's dilation-1 / -3 kernels: a 16-row
66-frame window 1.17x faster with the flat epilogue, RESULTS.md nineteenth session); on the CPU it
does not. This times one conv of each width and dilation at the length of a stateful push (the CPU
preset's path: `--frames` frames and the conv's carry) or of a window, both ways in turn, medians.

    python benchmarks/phase_convs.py --threads 1               # the CPU, fp32
    python benchmarks/phase_convs.py --threads 1 --dtype bf16
    python benchmarks/phase_convs.py --device cuda --dtype fp16 --rows 16 --frames 66
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from irodori_speaker.engine.codec.fast import _Conv

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
STAGES = ((768, 12), (384, 120), (192, 960), (96, 1920))  # (channels, samples a latent frame)


def time_both(conv: _Conv, x: torch.Tensor, p: int, reps: int, sync) -> tuple[float, float]:
    """Median ms of the conv as itself and in `p` phases, run in turn (a busy spell hits both)."""
    itself = dataclasses.replace(conv)
    itself.phases = lambda T: 1  # type: ignore[method-assign]  # as itself on CUDA too
    runs = (lambda: itself(x), lambda: conv.phase_conv(x, p))
    times: list[list[float]] = [[], []]
    with torch.no_grad():
        for run in runs:
            run()
        for _ in range(reps):
            for i, run in enumerate(runs):
                sync()
                t0 = time.perf_counter()
                run()
                sync()
                times[i].append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--frames", type=int, default=25, help="frames a push / window (the CPU chunk: 25)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype, dev = DTYPES[args.dtype], torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    print(f"{dev} {args.dtype}, {args.rows} rows of {args.frames} frames and the conv's carry,", end="")
    print(f" torch threads {torch.get_num_threads()}, medians of {args.reps}\n")
    print("| channels | dilation | samples T | phases P | as itself ms | in phases ms | itself / phases |")
    print("|---|---|---|---|---|---|---|")
    torch.manual_seed(0)
    for channels, rate in STAGES:
        for d in (3, 9):
            conv = _Conv.of(nn.Conv1d(channels, channels, 7, dilation=d, padding=3 * d).to(dev, dtype))
            T = args.frames * rate + 6 * d
            p = conv.phases(T)
            x = torch.randn(args.rows, T, channels, device=dev, dtype=dtype)
            a, b = time_both(conv, x, p, args.reps, sync)
            print(f"| {channels} | {d} | {T} | {p} | {a:.2f} | {b:.2f} | {a / b:.2f}x |")


if __name__ == "__main__":
    main()
