"""What a new user runs after set-up, start to end, timed: torch's threads against ours, quiet and busy.

    .venv/bin/python benchmarks/first_hour.py                 # every step once per cell
    .venv/bin/python benchmarks/first_hour.py --loads busy --steps run-line,snippet

The steps, offline, as README.md and docs/getting-started.md write them: the README's run line,
the README's Python snippet (Voice.sample(), tiny_random=True), `say --voice sample`, and the
three examples with `--tiny-random --out`. Each step is a fresh process, as a user's. The threads
come from IRODORI_THREADS: torch's default (the old default) or ours (half the usable CPUs);
"busy" is one spinning process per CPU (benchmarks/threads_under_load.py). Set-up itself
(scripts/setup.sh) needs the network and is not run here.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from threads_under_load import ROOT, busy_processes, clean_env, torch_default_threads

from irodori_speaker.engine.hardware.cpu_features import default_threads

PY = sys.executable


def steps(work: Path) -> dict[str, list[str]]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    snippet = re.search(r"```python\n(.*?)```", readme, re.S)
    assert snippet is not None
    (work / "snippet.py").write_text(snippet.group(1), encoding="utf-8")
    cli = [PY, "-m", "irodori_speaker.cli"]
    ex = ROOT / "examples"
    return {
        "run-line": [*cli, "say", "--tiny-random", "こんにちは", "-o", "hello.wav"],
        "snippet": [PY, "snippet.py"],
        "voice-sample": [
            *cli,
            "say",
            "サンプルの声で話します。",
            "--voice",
            "sample",
            "--tiny-random",
            "-o",
            "s.wav",
        ],
        "speaker_basic": [
            PY,
            str(ex / "speaker_basic.py"),
            "--tiny-random",
            "--out",
            "basic.wav",
            "--speed",
            "4",
        ],
        "livestream_bot": [
            *[PY, str(ex / "livestream_bot.py"), "--tiny-random", "--out", "bot.wav"],
            *["--duration", "20", "--speed", "4"],
        ],
        "news_reader": [PY, str(ex / "news_reader.py"), "--tiny-random", "--out", "news.wav"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loads", default="quiet,busy")
    ap.add_argument("--steps", help="comma-separated step names (default: all)")
    ap.add_argument("--busy", type=int, default=None, help="spinning processes (default: one per CPU)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="first-hour-") as tmp:
        work = Path(tmp)
        env = clean_env(work)
        old, new = torch_default_threads(env), default_threads()
        todo = steps(work)
        names = args.steps.split(",") if args.steps else list(todo)
        subprocess.run(todo["run-line"], env=env, cwd=work, capture_output=True)  # tiny files built once
        print(f"# first_hour  {time.strftime('%Y-%m-%d %H:%M')}  threads: torch {old}, ours {new}")
        cols = [
            (load, label, n) for load in args.loads.split(",") for label, n in (("old", old), ("new", new))
        ]
        print(f"{'step':<16}" + "".join(f"{f'{load} {label} ({n})':>18}" for load, label, n in cols))
        rows: dict[str, list[str]] = {name: [] for name in names}
        totals = [0.0] * len(cols)
        for load in args.loads.split(","):
            hogs = busy_processes(args.busy or os.cpu_count() or 1) if load == "busy" else []
            try:
                time.sleep(1.0 if hogs else 0.0)
                for label, n in (("old", old), ("new", new)):
                    col = cols.index((load, label, n))
                    for name in names:
                        t0 = time.perf_counter()
                        r = subprocess.run(
                            todo[name], env={**env, "IRODORI_THREADS": str(n)}, cwd=work, capture_output=True
                        )
                        wall = time.perf_counter() - t0
                        totals[col] += wall
                        rows[name].append(f"{wall:.1f} s" if r.returncode == 0 else f"rc {r.returncode}")
            finally:
                for h in hogs:
                    h.kill()
                for h in hogs:
                    h.wait()
        for name in names:
            print(f"{name:<16}" + "".join(f"{cell:>18}" for cell in rows[name]))
        print(f"{'all':<16}" + "".join(f"{f'{t:.1f} s':>18}" for t in totals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
