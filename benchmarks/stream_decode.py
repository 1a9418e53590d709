"""A line's streamed decode: windows with 8 frames of context a side against the stateful stream.

Both cut the line into the same chunks (the preset's first chunk, chunk frames and growth,
`codec.stream_windows`). The windows decode each chunk with its context and drop the context's
audio; the stateful stream (`engine/codec/stateful.py`) keeps each conv's left context and
pushes the frames each chunk needs, so the line's frames are decoded once. Full-size codec
(random weights, the real shapes) on the channels-last decoder, in the device's codec dtype (bf16
on a CPU with native bf16, as the CPU preset; fp16 on CUDA, eager: no graphs). Each line runs both
ways in turn, `--repeat` times; the table gives the medians of wall and process CPU time (on a
shared machine `--threads 1`'s CPU time is the steadier measure), their ratios, the frames the
windows decoded and the largest difference between the two audios.

    python benchmarks/stream_decode.py                        # news5's lines, the CPU preset's chunks
    python benchmarks/stream_decode.py --frames 37,118 --chunk 25 --first 8 --growth 0 --repeat 5
    python benchmarks/stream_decode.py --fp32 --chunk 25 --growth 0   # a CPU without native bf16
    python benchmarks/stream_decode.py --fp32 --chunk 25 --growth 0 --first 0   # its whole lines
    python benchmarks/stream_decode.py --frames 37,118 --repeat 3 --profile 20   # where the time goes

`--fp32`: the codec in fp32, as the CPU preset runs it where bf16 is not native; before the
eighteenth session that preset decoded windows on the (B, C, T) decoder (channels-last measured no
faster in fp32), so the windows column runs on that decoder and the stateful column on the
channels-last one (a copy of the same weights), the preset's path since.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

try:
    import irodori_speaker  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

import torch

from irodori_speaker.engine.codec import FULL_CODEC_KWARGS, codec_from_state_dict, random_codec_state_dict
from irodori_speaker.engine.codec.stateful import LineStream
from irodori_speaker.engine.codec.streaming import decode_windows
from irodori_speaker.engine.hardware.presets import cpu_preset_fields

NEWS5_FRAMES = "37,190,252,118,118"  # news5's lines (decode_frames.py)


def windowed(codec, z: torch.Tensor, windows, stream: LineStream | None = None) -> torch.Tensor:
    """The line's chunks as the codec walks them: each window decoded, or from `stream`."""
    samples = stream.samples if stream is not None else None
    pieces = decode_windows(codec._decode_window, z, windows, codec.hop_length, None, samples)
    return torch.cat(list(pieces), -1)


def stateful(codec, z: torch.Tensor, windows) -> torch.Tensor:
    """The same chunks from the product's stateful stream (`LineStream`, one a line)."""
    return windowed(codec, z, windows, LineStream(codec._channels_last, z.transpose(1, 2), codec.hop_length))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", default=NEWS5_FRAMES)
    ap.add_argument("--chunk", type=int, default=None, help="chunk frames (default: the preset's)")
    ap.add_argument("--first", type=int, default=8, help="first chunk frames (0: none)")
    ap.add_argument("--growth", type=float, default=None, help="0: none (default: the preset's)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fp32", action="store_true", help="fp32 codec, windows on the (B, C, T) decoder")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after the table: the first line once each way under torch.profiler, its N costliest ops",
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    cuda = torch.cuda.is_available()
    fields = cpu_preset_fields()
    dtype = torch.float32 if args.fp32 else torch.float16 if cuda else fields["codec_dtype"]
    chunk = args.chunk or (50 if cuda else fields["stream_chunk_frames"])
    growth = fields["stream_chunk_growth"] if args.growth is None and not cuda else (args.growth or None)
    device = "cuda" if cuda else "cpu"
    state = random_codec_state_dict(FULL_CODEC_KWARGS, seed=0, watermark=False)
    codec = codec_from_state_dict(state, FULL_CODEC_KWARGS, device=device, dtype=dtype)
    assert codec.use_channels_last()
    windows_codec = codec
    if args.fp32:
        windows_codec = codec_from_state_dict(state, FULL_CODEC_KWARGS, device=device, dtype=dtype)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    layout = "(B, C, T) decoder" if args.fp32 else "channels-last decoder"
    print(f"device {device}, codec {dtype}, threads {torch.get_num_threads()}, windows on the {layout}, ")
    print(f"chunks first {args.first}, then {chunk} (growth {growth}), {args.repeat} runs each way,", end="")
    print(" medians\n")
    print("| line frames | chunks | windows: frames decoded | windows ms | stateful ms | windows / stateful |"
          " CPU ms: windows / stateful (ratio) | max abs diff |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    total = [0.0, 0.0, 0.0, 0.0]
    with torch.inference_mode():
        for frames in (int(f) for f in args.frames.split(",")):
            lat = torch.randn(1, frames, 32, generator=torch.Generator().manual_seed(frames))
            first = args.first or None
            windows = codec.stream_windows(frames, chunk, first_chunk_frames=first, growth=growth)
            z = codec.decoder_input(lat)
            runs = (
                lambda z=z, w=windows: windowed(windows_codec, z, w),
                lambda z=z, w=windows: stateful(codec, z, w),
            )
            outs = [run() for run in runs]  # first-call costs
            times: list[list[tuple[float, float]]] = [[], []]
            for _ in range(args.repeat):
                for i, run in enumerate(runs):  # in turn: a busy spell of the machine hits both
                    sync()
                    t0, c0 = time.perf_counter(), time.process_time()
                    outs[i] = run()
                    sync()
                    times[i].append((time.perf_counter() - t0, time.process_time() - c0))
            (mw, cw), (ms, cs) = ([statistics.median(x) * 1e3 for x in zip(*t)] for t in times)
            total = [a + b for a, b in zip(total, (mw, ms, cw, cs))]
            decoded = sum(hi - lo for lo, _, _, hi in windows)
            diff = (outs[0] - outs[1]).abs().max().item()
            print(f"| {frames} | {len(windows)} | {decoded} ({decoded / frames:.2f}x) | {mw:.1f} | {ms:.1f} "
                  f"| {mw / ms:.2f} | {cw:.0f} / {cs:.0f} ({cw / cs:.2f}) | {diff:.2e} |")  # fmt: skip
    mw, ms, cw, cs = total
    print(f"| all |  |  | {mw:.1f} | {ms:.1f} | {mw / ms:.2f} | {cw:.0f} / {cs:.0f} ({cw / cs:.2f}) |  |")
    if args.profile:
        frames = int(args.frames.split(",")[0])
        lat = torch.randn(1, frames, 32, generator=torch.Generator().manual_seed(frames))
        windows = codec.stream_windows(frames, chunk, first_chunk_frames=args.first or None, growth=growth)
        z = codec.decoder_input(lat)
        for name, run in (
            ("windows", lambda: windowed(windows_codec, z, windows)),
            ("stateful", lambda: stateful(codec, z, windows)),
        ):
            profile(name, run, args.profile, cuda)


def profile(name: str, run, top: int, cuda: bool) -> None:
    """One run of `run` under torch.profiler: its `top` costliest ops (device time on a GPU: why an
    eager stream is slow there, docs/status.md), and how many kernels and ops it launched."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    with torch.inference_mode():
        run()  # first-call costs (cuDNN's algorithm search) outside the profile
        with torch_profile(activities=activities) as prof:
            run()
            if cuda:
                torch.cuda.synchronize()
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    print(f"\n{name}: {sum(e.count for e in events)} op calls")
    print(events.table(sort_by=key, row_limit=top))


if __name__ == "__main__":
    main()
