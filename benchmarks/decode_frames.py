"""Latent frames a line's stream windows decode, against the frames they give (host arithmetic).

Under many streams the GPU is the bound and the decode windows are most of a line's GPU time
(RESULTS.md, fifteenth session: 73 % at 16 rows, and a window's cost grows with its frames), so
the frames decoded beyond the line's own are GPU time spent twice. Each window carries 8 frames
of context a side (`RECEPTIVE_FIELD_FRAMES`), and with graphs a line's last window is stretched
left to the middle windows' length to replay their graph (`codec.streaming.chunk_windows`).

Per window configuration (chunk frames, first chunk, growth, and the preset's
`stream_tail_windows`: shorter lengths the last window may take): the window lengths, the frames
decoded for the lines, their ratio to the lines' frames, and the windows. The last rows are the
preset's window plan (`stream_window_plan`, `chunk_windows`' `plan_lengths`), per first chunk of
the rows above: after the first window, windows of a few graphed lengths (`--lengths`) with the
fewest frames decoded. Every row goes through the product's `chunk_windows`. The last columns: the
frames the last (24 kHz) block carries with the windows cropped as their graphs are (each window's
`window_crop`, then `ChannelsLastDecoder.crop_spans`: the deeper blocks decode only what the kept
samples depend on; those blocks are most of a window's GPU time), and their ratio to the lines'.

    python benchmarks/decode_frames.py
    python benchmarks/decode_frames.py --frames 37,190,252,118,118 --lengths 40,66,116,216
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import irodori_speaker  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from irodori_speaker.engine.codec import TINY_CODEC_KWARGS, codec_from_state_dict, random_codec_state_dict
from irodori_speaker.engine.codec.streaming import RECEPTIVE_FIELD_FRAMES, chunk_windows, window_crop

C = RECEPTIVE_FIELD_FRAMES
# news5's five lines as the H100 run's records gave them (concurrency.py's header, fifteenth
# session); pass --frames for others
NEWS5_FRAMES = "37,190,252,118,118"


def last_block_frames(decoder, window: tuple[int, int, int, int]) -> float:
    """The frames of `window` the decoder's last block carries, cropped as the window's graph is."""
    lo, _, _, hi = window
    hop = 1920
    left, right = window_crop(window, C)
    spans = decoder.crop_spans(left * hop, (hi - lo - right) * hop)
    a, b = spans[max(spans)]  # the last block's input, 960 samples a frame (24 kHz)
    return (min(b, (hi - lo) * 960) - max(a, 0)) / 960


def decoded(
    frames: int,
    chunk: int,
    first: int | None,
    growth: float | None,
    tails: tuple[int, ...] = (),
    plan: tuple[int, ...] = (),
    decoder=None,
) -> tuple[int, int, set[int], float]:
    """(frames decoded, windows, window lengths, frames the last block carries cropped) of one
    line streamed with these arguments (with graphs: `stretch_last`)."""
    windows = chunk_windows(
        frames, chunk, C, first, growth=growth, stretch_last=True, tail_lengths=tails, plan_lengths=plan
    )
    lengths = {hi - lo for lo, _, _, hi in windows}
    cropped = sum(last_block_frames(decoder, w) for w in windows) if decoder is not None else float("nan")
    return sum(hi - lo for lo, _, _, hi in windows), len(windows), lengths, cropped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", default=NEWS5_FRAMES, help="the lines' latent frames (comma-separated)")
    ap.add_argument(
        "--configs",
        default="50:8:-,50:8:-:40,50:8:3,100:8:3,150:8:3,200:8:3",
        help="chunk:first:growth[:tail+tail...] per row ('-': no growth; tails: the preset's "
        "stream_tail_windows); the first is the CUDA preset's",
    )
    ap.add_argument(
        "--lengths", default="40,66,116,216", help="the window plan's lengths (stream_window_plan)"
    )
    args = ap.parse_args()
    lines = [int(x) for x in args.frames.split(",")]
    total = sum(lines)
    print(f"# {len(lines)} lines of {lines} latent frames ({total}); context {C} frames a side")
    codec = codec_from_state_dict(
        random_codec_state_dict(TINY_CODEC_KWARGS, seed=0, watermark=False), TINY_CODEC_KWARGS
    )  # the released decoder's rates and kernels (its widths do not change a span)
    assert codec.use_channels_last(True)
    dec = codec._channels_last
    print(
        "| windows | window lengths | frames decoded | x the lines' frames | windows "
        "| last block's frames, cropped | x the lines' frames |"
    )
    print("|---|---|---|---|---|---|---|")
    plan = tuple(int(x) for x in args.lengths.split(","))
    rows = []
    for config in args.configs.split(","):
        chunk, first, growth, *rest = config.split(":")
        g = None if growth == "-" else float(growth)
        tails = tuple(int(x) for x in rest[0].split("+")) if rest else ()
        name = f"chunks {chunk}, first {first}" + (f", growth {growth}" if g else "")
        name += f", tail windows {list(tails)}" if tails else ""
        rows.append((name, [decoded(n, int(chunk), int(first), g, tails, decoder=dec) for n in lines]))
    for first in sorted({int(c.split(":")[1]) for c in args.configs.split(",")}):
        name = f"window plan {list(plan)}, first {first}"
        rows.append((name, [decoded(n, first, first, None, plan=plan, decoder=dec) for n in lines]))
    for name, windows in rows:
        frames = sum(r[0] for r in windows)
        lengths = sorted(set().union(*(r[2] for r in windows)))
        cropped = sum(r[3] for r in windows)
        print(
            f"| {name} | {lengths} | {frames} | {frames / total:.2f} | {sum(r[1] for r in windows)} "
            f"| {cropped:.0f} | {cropped / total:.2f} |"
        )


if __name__ == "__main__":
    main()
