"""Where a CUDA preset's memory goes between loading and the last line: per phase, and by the
code that allocated what is alive at the end (issue 17: (d)'s 2.3 GB peak after prewarm).

    python benchmarks/memory_phases.py                # modes d (v2 bf16), n (v4.1-MF bf16), o (int4)
    python benchmarks/memory_phases.py --modes d

For each news5 mode (benchmarks/news5.py, random full-size files): allocated and peak MiB after
loading, after `prewarm`, and after the five news5 lines; then, from the allocator's history
(`torch.cuda.memory._record_memory_history`), the live blocks at the end grouped by the first
frame in irodori_speaker that allocated them. GPU only.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import news5

from irodori_speaker.options import SynthesisOptions

MIB = 2**20


def now() -> tuple[float, float, float]:
    torch.cuda.synchronize()
    return (
        torch.cuda.memory_allocated() / MIB,
        torch.cuda.max_memory_allocated() / MIB,
        torch.cuda.memory_reserved() / MIB,
    )


def owner(frames: list[dict]) -> str:
    for f in frames:  # innermost first
        name = f.get("filename", "")
        if "irodori_speaker" in name:
            return f"{name.split('irodori_speaker/')[-1]}:{f.get('line')} {f.get('name')}"
    return "(outside irodori_speaker)"


def live_by_owner(snapshot: dict) -> list[tuple[str, float, int]]:
    sizes: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for seg in snapshot["segments"]:
        for blk in seg["blocks"]:
            if blk["state"] != "active_allocated":
                continue
            who = owner(blk.get("frames", []))
            sizes[who] += blk["size"] / MIB
            counts[who] += 1
    return sorted(((k, v, counts[k]) for k, v in sizes.items()), key=lambda r: -r[1])


def python_holders(min_mib: float = 1.0) -> list[tuple[str, float, int]]:
    """CUDA tensors reachable from Python (gc), grouped by shape and dtype: MiB and count.

    What the allocator's history calls live but no Python object holds is kept by C++ (a CUDA
    graph's pool, a cuBLAS workspace)."""
    sizes: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    seen: set[int] = set()
    for obj in gc.get_objects():
        try:
            if not (isinstance(obj, torch.Tensor) and obj.is_cuda):
                continue
            storage = obj.untyped_storage()
        except Exception:
            continue
        ptr = storage.data_ptr()
        if ptr in seen or storage.nbytes() < min_mib * MIB:
            continue
        seen.add(ptr)
        who = f"{tuple(obj.shape)} {obj.dtype}".replace("torch.", "")
        sizes[who] += storage.nbytes() / MIB
        counts[who] += 1
    return sorted(((k, v, counts[k]) for k, v in sizes.items()), key=lambda r: -r[1])


def run(key: str, files: dict, sentences: list[str], holders: bool = False) -> None:
    mode = news5.modes_for("cuda")[key]
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() / MIB
    torch.cuda.memory._record_memory_history(max_entries=200_000, stacks="python")
    synth, voice = news5.build(mode, files, "scratch")
    rows = [("loaded", *now())]
    synth.prewarm(voice)
    rows.append(("after prewarm", *now()))
    if holders:
        gc.collect()
        found = python_holders()
        total = sum(r[1] for r in found)
        print(f"\n({key}) CUDA storages >= 1 MiB reachable from Python after prewarm: {total:.0f} MiB")
        print("| shape dtype | MiB | count |")
        print("|---|---|---|")
        for who, mib, n in found[:20]:
            print(f"| {who} | {mib:.1f} | {n} |")
    opts = SynthesisOptions(seed=1234)
    for i, text in enumerate(sentences):
        o = opts if mode.family == "v2" else opts.replace(seconds=news5.estimate_seconds(text))
        for _ in synth.stream(text, voice, o):
            pass
        rows.append((f"after line {i + 1}", *now()))
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"\n({key}) {mode.desc}  [MiB above {base:.0f}]")
    print("| phase | allocated | peak so far | reserved |")
    print("|---|---|---|---|")
    for name, a, p, r in rows:
        print(f"| {name} | {a - base:.0f} | {p - base:.0f} | {r:.0f} |")
    print("\n| live at the end, allocated by | MiB | blocks |")
    print("|---|---|---|")
    for who, mib, n in live_by_owner(snap)[:15]:
        print(f"| {who} | {mib:.1f} | {n} |")
    report = getattr(synth, "prewarm_report", {})
    print("prewarm:", {k: v for k, v in report.items() if k != "voice"})
    del synth, voice
    gc.collect()
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="d,n,o")
    ap.add_argument(
        "--holders", action="store_true", help="also list the Python-held CUDA tensors after prewarm"
    )
    args = ap.parse_args()
    keys = args.modes.split(",")
    table = news5.modes_for("cuda")
    families = {table[k].family for k in keys}
    int4 = {table[k].family for k in keys if table[k].int4}
    files = news5.prepare_files(int4=int4, families=families)
    sentences = json.loads(news5.NEWS5_JSON.read_text())["sentences"]
    print(f"# memory_phases  {torch.cuda.get_device_name()}  {time.strftime('%Y-%m-%d %H:%M')}")
    for key in keys:
        run(key, files, sentences, args.holders)


if __name__ == "__main__":
    main()
