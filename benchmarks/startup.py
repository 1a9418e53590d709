"""A `say` as a user runs it, whole process, for two source trees side by side in one run.

Each tree's `src/` is put on PYTHONPATH in turn (A, B, A, B, ...) under one venv and one warm
`IRODORI_CACHE`, and `irodori-speaker -q say --tiny-random --seed 1 TEXT -o OUT` runs to the end:
what a user waits for from the command to the file, imports and model load included. Per tree the
medians of wall time, CPU time (user + system of the child, from its own rusage) and peak resident
memory, the wall ratio pair by pair; whether the tree's model load imports torch._dynamo beside it.

    git archive 9a7ca34 src | tar -x -C /tmp/before
    python benchmarks/startup.py --a /tmp/before/src --b src --runs 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TEXT = "こんにちは"
DYNAMO_PROBE = (
    "import sys; from irodori_speaker.synthesis.loading import load_synthesizer; "
    "load_synthesizer(tiny_random=True, backend='cpu', voice_cache_dir=False); "
    "print('torch._dynamo' in sys.modules)"
)


def run_once(src: str, env: dict[str, str], out: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, peak MiB) of one `say` with `src` on PYTHONPATH (the child's own rusage)."""
    cmd = [sys.executable, "-m", "irodori_speaker.cli", "-q", "say", "--tiny-random", "--seed", "1", TEXT]
    t0 = time.perf_counter()
    proc = subprocess.Popen([*cmd, "-o", str(out)], env={**env, "PYTHONPATH": src})
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"say with {src} exited {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def imports_dynamo(src: str, env: dict[str, str]) -> bool:
    got = subprocess.run(
        [sys.executable, "-c", DYNAMO_PROBE],
        env={**env, "PYTHONPATH": src},
        capture_output=True,
        text=True,
        check=True,
    )
    return got.stdout.split()[-1] == "True"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="the first tree's src/ folder")
    ap.add_argument("--b", required=True, help="the second tree's src/ folder")
    ap.add_argument("--runs", type=int, default=8, help="counted runs of each (after one warm-up each)")
    args = ap.parse_args()
    trees = {"A": str(Path(args.a).resolve()), "B": str(Path(args.b).resolve())}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "IRODORI_CACHE": os.path.join(tmp, "home")}
        times: dict[str, list[tuple[float, float, float]]] = {k: [] for k in trees}
        for k, src in trees.items():  # warm-up: the tiny files are built, the page cache is warm
            run_once(src, env, Path(tmp) / f"{k}.wav")
        for _ in range(args.runs):
            for k, src in trees.items():
                times[k].append(run_once(src, env, Path(tmp) / f"{k}.wav"))
        dynamo = {k: imports_dynamo(src, env) for k, src in trees.items()}
    print(f"`say --tiny-random` whole process, {args.runs} runs each in turn, medians\n")
    print("| tree | src | wall s | CPU s | peak MiB | imports torch._dynamo |")
    print("|---|---|---|---|---|---|")
    med = {}
    for k, src in trees.items():
        wall, cpu, peak = (statistics.median(x) for x in zip(*times[k]))
        med[k] = (wall, cpu)
        print(f"| {k} | {src} | {wall:.2f} | {cpu:.2f} | {peak:.0f} | {dynamo[k]} |")
    ratios = [b[0] / a[0] for a, b in zip(times["A"], times["B"])]
    cpu_ratio = med["B"][1] / med["A"][1]
    print(f"\nB / A wall, pair by pair: median {statistics.median(ratios):.2f} "
          f"({min(ratios):.2f}-{max(ratios):.2f}); CPU medians B / A {cpu_ratio:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
