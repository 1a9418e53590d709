"""The caption alignment (source_spans.SourceMap) on long lines: whole-line difflib against the
sentence-by-sentence alignment the product uses, side by side in one run (CPU).

    python benchmarks/caption_align.py
"""

from __future__ import annotations

import difflib
import platform
import time

from irodori_speaker.timing.source_spans import SourceMap

WRITTEN = "VTuberの配信でwwwって草、15:30から。"
SPOKEN = "ブイチューバーの配信でワラワラって草、15時30分から。"


def best_of(fn, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    print(f"# caption_align  {platform.processor() or platform.machine()}  {time.strftime('%Y-%m-%d %H:%M')}")
    print("| written chars | whole line ms | by sentence ms | ratio |")
    print("|---|---|---|---|")
    for n in (10, 40, 160):
        source, spoken = WRITTEN * n, SPOKEN * n
        whole = best_of(
            lambda a=source, b=spoken: difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
        )
        ours = best_of(lambda a=source, b=spoken: SourceMap.align(a, b))
        print(f"| {len(source)} | {1e3 * whole:.1f} | {1e3 * ours:.1f} | {whole / ours:.0f}x |")


if __name__ == "__main__":
    main()
