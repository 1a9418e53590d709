"""Where one stream's host time goes: news5 lines streamed one after another under cProfile.

The product's own loop (`Synthesizer.stream`, chunks consumed as they come) in the main thread,
mode (e) on CUDA (news5's random full-size files): the wall time a line with and without the
profiler, then the functions by their own time and by cumulative time. Time spent in
`torch.cuda.synchronize`, `Tensor.cpu` / `.item` / `.to` (copies wait for the GPU's queue) is the
host waiting for the GPU; what is left is the
host's own work a line (tokenising, options, planning, launches).

    python benchmarks/host_profile.py                 # 10 lines, mode e
    python benchmarks/host_profile.py --lines 20 --mode d
    python benchmarks/host_profile.py --smoke --mode f --lines 2   # tiny model, any CPU
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import news5  # noqa: E402

from irodori_speaker.options import SynthesisOptions  # noqa: E402

# the host blocked on the device: on CUDA a copy between host and device waits for the queue ahead of it
WAITS = ("_cuda_synchronize", "method 'cpu'", "method 'item'", "method 'to'")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default=None, help="news5 mode (default: e on CUDA, f elsewhere)")
    ap.add_argument("--lines", type=int, default=10, help="lines to profile (news5 sentences, cycled)")
    ap.add_argument("--top", type=int, default=25, help="functions to list")
    ap.add_argument("--smoke", action="store_true", help="tiny-random files: a quick check on any CPU")
    ap.add_argument("--int4-impl", default="scratch", choices=["auto", "kernel", "scratch"])
    args = ap.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    key = args.mode or ("e" if device == "cuda" else "f")
    mode = news5.modes_for(device)[key]
    files = news5.prepare_files(int4=mode.int4, smoke=args.smoke, families={mode.family})
    sentences = json.loads(news5.NEWS5_JSON.read_text())["sentences"]
    synth, voice = news5.build(mode, files, args.int4_impl)
    if mode.fast:
        synth.prewarm(voice)

    def lines(seed: int) -> float:
        news5.sync(device)
        t0 = time.perf_counter()
        for i in range(args.lines):
            for _ in synth.stream(sentences[i % len(sentences)], voice, SynthesisOptions(seed=seed + i)):
                pass
        news5.sync(device)
        return 1e3 * (time.perf_counter() - t0) / args.lines

    lines(0)  # warm-up: every sentence's buckets
    plain = lines(100)
    prof = cProfile.Profile()
    prof.enable()
    profiled = lines(200)
    prof.disable()
    stats = pstats.Stats(prof)
    rows = stats.stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tottime, cumtime, callers)}
    total = sum(v[2] for v in rows.values())
    waits = WAITS if device == "cuda" else ()
    waiting = sum(v[2] for k, v in rows.items() if any(w in k[2] for w in waits))
    print(f"# host profile: mode ({key}) {mode.desc}; device {device}; {args.lines} lines")
    print(
        f"wall ms a line: {plain:.2f} plain, {profiled:.2f} under cProfile; of the profiled "
        f"{1e3 * total / args.lines:.2f} ms a line, {1e3 * waiting / args.lines:.2f} ms waiting "
        f"for the device, {1e3 * (total - waiting) / args.lines:.2f} ms the host's own work"
    )
    for order in ("tottime", "cumulative"):
        print(f"\n## by {order}")
        stats.sort_stats(order).print_stats(args.top)


if __name__ == "__main__":
    main()
