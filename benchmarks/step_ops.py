"""Host work of one step-batched step: the top-level torch ops the owner thread dispatches.

On the H200 the step path is bound by the device owner's host time (RESULTS.md, eighth session),
so the ops a step dispatches per line are what to cut. N lines (tiny random model on the CPU,
v2, 8 sway steps, lines of different lengths) start on `engine.steps.StepBatcher` (counted: the
lines arriving together, with `start_many` where the tree has it, else one `start` each; the
schedule's modulation table made before, as the first line of a schedule makes it once for the
process), then steps are counted under torch.profiler: the first step (contexts packed) and a
steady one. Where the tree has step graphs (engine/step_graphs.py), a column counts the steady
step through them, the forward counted as the one op its CUDA graph replay is (on the CPU the bucket's static
buffers run eagerly inside one profiler range; the copies into them are counted); where it has
start graphs (engine/start_graphs.py), the last column counts the starts through them the same
way. Runs against an older tree too:

    python benchmarks/step_ops.py --lines 1,4,16
    PYTHONPATH=<old tree>/src python benchmarks/step_ops.py --lines 1,4,16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

try:  # the tree on PYTHONPATH (an older one, for a side-by-side), else this repository's
    import irodori_speaker
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    import irodori_speaker

from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.engine.fast import FastDiT
from irodori_speaker.engine.sampler import SamplerConfig, draw_noise
from irodori_speaker.engine.steps import StepBatcher
from irodori_speaker.engine.tiny import tiny_random_files


def top_level_ops(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.cpu_parent is None)


def count(model, n: int, buckets: bool = False) -> tuple[int, int, int]:
    torch.manual_seed(0)
    batcher = StepBatcher(FastDiT(model, fused=False))
    if buckets:
        batcher.prewarm_graphs(max_rows=3 * n, top_frames=192, length=128, capture=False, frame_bucket=16)
    joining = []
    for i in range(n):
        ids = torch.randint(3, 200, (1, 10 + i))
        with torch.inference_mode():
            conds = model.encode_conditions(
                ids, torch.ones_like(ids, dtype=torch.bool), torch.randn(1, 20, model.cfg.latent_dim), None
            )
        noise = draw_noise(i, 1, 40 + 8 * i, model.cfg.latent_dim)
        joining.append((conds, noise, SamplerConfig(steps=8, schedule="sway")))
    if hasattr(batcher.fast, "plan_table"):  # the schedule's modulation table: made once, kept
        from irodori_speaker.engine.sampler import plan_for

        batcher.fast.plan_table(plan_for(model, joining[0][0], joining[0][2]))
    if buckets and hasattr(batcher, "prewarm_starts"):  # the starts' graphs (engine/start_graphs.py)
        batcher.prewarm_starts(joining[0][0], joining[0][2], capture=False)
    lines: list = []
    if hasattr(batcher, "start_many"):  # this tree: the lines arriving together start in one call
        from irodori_speaker.engine.steps import Joining

        start = top_level_ops(lambda: lines.extend(batcher.start_many([Joining(*j) for j in joining])))
    else:
        start = top_level_ops(lambda: lines.extend(batcher.start(*j) for j in joining))
    first = top_level_ops(lambda: batcher.step(lines))
    steady = top_level_ops(lambda: batcher.step(lines))
    return start, first, steady


def as_one_replay() -> None:
    """Run each bucket's forward (and, where the tree has them, each start bucket's context
    writes) inside one profiler range: one top-level op, as its replay."""
    from irodori_speaker.engine.step_graphs import StepGraph

    kinds = [StepGraph]
    try:
        from irodori_speaker.engine.start_graphs import StartGraph

        kinds.append(StartGraph)
    except ImportError:  # an older tree: starts run eagerly
        pass
    for kind in kinds:
        if getattr(kind.run, "one_replay", False):
            continue
        eager = kind.run

        def run(self, eager=eager):
            with torch.profiler.record_function("graph replay"):
                return eager(self)

        run.one_replay = True  # type: ignore[attr-defined]
        kind.run = run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", default="1,4,16", help="lines stepped together (comma-separated)")
    args = ap.parse_args()
    model = load_checkpoint(tiny_random_files("v2").model).model
    print(f"# {Path(irodori_speaker.__file__).parent.parent}; torch {torch.__version__}")
    graphs = hasattr(StepBatcher, "prewarm_graphs")
    head = "| lines | ops, their starts | ops, first step | ops, steady step | steady ops a line |"
    print(f"{head} steady, graphed | starts, graphed |")
    print("|---|---|---|---|---|---|---|")
    for n in [int(x) for x in args.lines.split(",")]:
        start, first, steady = count(model, n)
        graphed = graphed_start = "-"
        if graphs:
            as_one_replay()
            start_g, _, steady_g = count(model, n, buckets=True)
            graphed = str(steady_g)
            graphed_start = str(start_g) if hasattr(StepBatcher, "prewarm_starts") else "-"
        print(f"| {n} | {start} | {first} | {steady} | {steady / n:.1f} | {graphed} | {graphed_start} |")


if __name__ == "__main__":
    main()
