"""The README's first line with torch's default threads and ours, on a quiet and on a busy machine.

    .venv/bin/python benchmarks/threads_under_load.py              # 3 runs per cell
    .venv/bin/python benchmarks/threads_under_load.py --repeat 5 --busy 4

A streaming PC is shared: OBS encodes, a game or an LLM runs. Torch's default is a thread per
core, and its OpenMP threads wait for each other whenever another program holds a core. Each cell
runs the README's run line as a new user does (`irodori-speaker say --tiny-random "こんにちは" -o
hello.wav`, a fresh process, offline, the tiny files already built), with `-v` so the command
itself says where its wall time went, and `--threads N`: torch's default (the old default,
`torch.get_num_threads()` in a fresh process) and ours (half the usable CPUs, cpu_features.py).
"busy" starts one spinning process per CPU (`--busy N` another count) for the whole cell: an
artificial competing load at the same priority as the line. The table gives the median wall
seconds (min-max) and the median of each phase.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from irodori_speaker.engine.hardware.cpu_features import default_threads, usable_cpus  # noqa: E402

TEXT = "こんにちは"
PHASES = ("python and imports", "torch import", "model load", "synthesis")


def clean_env(home: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_NUM_THREADS", "IRODORI_THREADS", "MKL_NUM_THREADS")
    }
    env.pop("IRODORI_TINY_KIND", None)  # the product's default kind
    env.update(IRODORI_CACHE=str(home / "cache"), HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT / "src"))
    return env


def torch_default_threads(env: dict[str, str]) -> int:
    code = "import torch; print(torch.get_num_threads())"
    return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)


def first_line(threads: int, env: dict[str, str], work: Path) -> tuple[float, dict[str, float]]:
    argv = [
        sys.executable,
        "-m",
        "irodori_speaker.cli",
        "-v",
        "say",
        "--tiny-random",
        TEXT,
        "-o",
        "hello.wav",
    ]
    t0 = time.perf_counter()
    r = subprocess.run([*argv, "--threads", str(threads)], env=env, cwd=work, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"the line failed:\n{r.stderr}")
    line = next(x for x in r.stderr.splitlines() if x.startswith("info: wall: "))
    parts = {name: float(s) for name, s in re.findall(r"([a-z][a-z ]+?) (\d+\.\d+) s", line.split(":", 2)[2])}
    return wall, parts


def busy_processes(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell (default 3; the median is shown)")
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="spinning processes under load")
    ap.add_argument("--loads", default="quiet,busy", help="which loads, in order (default quiet,busy)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="threads-") as tmp:
        home = Path(tmp)
        env = clean_env(home)
        old = torch_default_threads(env)
        new = default_threads()
        first_line(new, env, home)  # builds the tiny files once: no cell pays for it
        print(
            f"# threads_under_load  {time.strftime('%Y-%m-%d %H:%M')}  CPUs: os.cpu_count {os.cpu_count()}, "
            f"usable {usable_cpus()}; torch default threads {old}, ours {new}; busy = {args.busy} spinning "
            f"processes; {args.repeat} runs per cell"
        )
        print(
            f'# the README\'s run line: irodori-speaker say --tiny-random "{TEXT}" -o hello.wav (-v phases)'
        )
        head = f"{'load':<6} {'threads':<14} {'wall s (min-max)':>20} " + " ".join(f"{p:>18}" for p in PHASES)
        print(head)
        print("-" * len(head))
        for load in args.loads.split(","):
            hogs = busy_processes(args.busy) if load == "busy" else []
            try:
                time.sleep(1.0 if hogs else 0.0)
                for label, n in ((f"old ({old}, torch)", old), (f"new ({new}, ours)", new)):
                    walls, parts = [], []
                    for _ in range(args.repeat):
                        wall, got = first_line(n, env, home)
                        walls.append(wall)
                        parts.append(got)
                    med = statistics.median(walls)
                    cells = " ".join(
                        f"{statistics.median(p.get(name, float('nan')) for p in parts):>18.2f}"
                        for name in PHASES
                    )
                    spread = f"{med:.2f} ({min(walls):.2f}-{max(walls):.2f})"
                    print(f"{load:<6} {label:<14} {spread:>20} {cells}", flush=True)
            finally:
                for h in hogs:
                    h.kill()
                for h in hogs:
                    h.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
