"""Latent frames a line's stream windows decode, against the frames they give (host arithmetic).

Under many streams the GPU is the bound and the decode windows are most of a line's GPU time
(RESULTS.md, fifteenth session: 73 % at 16 rows, and a window's cost grows with its frames), so
the frames decoded beyond the line's own are GPU time spent twice. Each window carries 8 frames
of context a side (`RECEPTIVE_FIELD_FRAMES`), and with graphs a line's last window is stretched
left to the middle windows' length to replay their graph (`codec.streaming.chunk_windows`).

Per window configuration (chunk frames, first chunk, growth, and the preset's
`stream_tail_windows`: shorter lengths the last window may take): the window lengths, the frames
decoded for the lines, their ratio to the lines' frames, and the windows. The last rows are a
plan not built: after the first window, windows chosen among a few graphed lengths (`--lengths`)
by a small search for the fewest decoded frames, the last one the shortest that covers the rest.

    python benchmarks/decode_frames.py
    python benchmarks/decode_frames.py --frames 37,190,252,118,118 --lengths 40,66,116,216
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

try:
    import irodori_speaker  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from irodori_speaker.engine.codec.streaming import RECEPTIVE_FIELD_FRAMES, chunk_windows

C = RECEPTIVE_FIELD_FRAMES
# news5's five lines as the H100 run's records gave them (concurrency.py's header, fifteenth
# session); pass --frames for others
NEWS5_FRAMES = "37,190,252,118,118"


def decoded(
    frames: int, chunk: int, first: int | None, growth: float | None, tails: tuple[int, ...] = ()
) -> tuple[int, int, set[int]]:
    """(frames decoded, windows, window lengths) of one line streamed with these arguments."""
    windows = chunk_windows(frames, chunk, C, first, growth=growth, stretch_last=True, tail_lengths=tails)
    lengths = {hi - lo for lo, _, _, hi in windows}
    return sum(hi - lo for lo, _, _, hi in windows), len(windows), lengths


def planned(frames: int, first: int, lengths: tuple[int, ...]) -> int:
    """Frames decoded when, after a first window of `first` frames (+ context), the rest is cut
    into windows of the given lengths with the fewest frames decoded: a middle window of length L
    gives L - 2C frames, the last one (the line's end: no right context) up to L - C."""

    @functools.cache
    def rest(r: int) -> int:
        if r <= 0:
            return 0
        best = min((L for L in lengths if r <= L - C), default=None)
        for L in lengths:
            if L - 2 * C > 0 and r > L - 2 * C:
                total = L + rest(r - (L - 2 * C))
                best = total if best is None else min(best, total)
        assert best is not None, "a window length must exceed twice the context"
        return best

    if frames <= first:  # one window, the whole line
        return frames
    return first + C + rest(frames - first)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", default=NEWS5_FRAMES, help="the lines' latent frames (comma-separated)")
    ap.add_argument(
        "--configs",
        default="50:8:-,50:8:-:40,50:8:3,100:8:3,150:8:3,200:8:3",
        help="chunk:first:growth[:tail+tail...] per row ('-': no growth; tails: the preset's "
        "stream_tail_windows); the first is the CUDA preset's",
    )
    ap.add_argument("--lengths", default="40,66,116,216", help="window lengths of the plan's rows")
    args = ap.parse_args()
    lines = [int(x) for x in args.frames.split(",")]
    total = sum(lines)
    print(f"# {len(lines)} lines of {lines} latent frames ({total}); context {C} frames a side")
    print("| windows | window lengths | frames decoded | x the lines' frames | windows |")
    print("|---|---|---|---|---|")
    for config in args.configs.split(","):
        chunk, first, growth, *rest = config.split(":")
        g = None if growth == "-" else float(growth)
        tails = tuple(int(x) for x in rest[0].split("+")) if rest else ()
        rows = [decoded(n, int(chunk), int(first), g, tails) for n in lines]
        frames = sum(r[0] for r in rows)
        lengths = sorted(set().union(*(r[2] for r in rows)))
        name = f"chunks {chunk}, first {first}" + (f", growth {growth}" if g else "")
        name += f", tail windows {list(tails)}" if tails else ""
        print(f"| {name} | {lengths} | {frames} | {frames / total:.2f} | {sum(r[1] for r in rows)} |")
    lengths = tuple(int(x) for x in args.lengths.split(","))
    for first in sorted({int(c.split(":")[1]) for c in args.configs.split(",")}):
        frames = sum(planned(n, first, lengths) for n in lines)
        name = f"plan (not built): first {first}, then of {list(lengths)}"
        print(f"| {name} | - | {frames} | {frames / total:.2f} | - |")


if __name__ == "__main__":
    main()
