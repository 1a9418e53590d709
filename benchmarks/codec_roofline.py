"""Where a stream window's decode goes, op by op, against the GPU's roofline.

Full-size DACVAE with random weights, fp16, the channels-last decoder the CUDA preset runs
(`codec/fast.py`). A batch of `--rows` windows of `--frames` frames goes through the decoder's
ops one at a time (eager, each timed with CUDA events, medians of `--reps`); per op kind and
stage: device ms, the bytes it must move at least (inputs, outputs and weights once each) and its
FLOPs, the bandwidth and FLOP rate it reached, and its roofline floor max(bytes / peak bandwidth,
FLOPs / peak FLOP rate). The last lines: the whole graphed window (the product's path) against the
sum of the ops, and the floor of a decoder whose residual units were one kernel each (a unit reads
its input and residual once and writes h and s once: the fusion `docs/status.md` discusses).

    python benchmarks/codec_roofline.py                      # 16 windows of 66 frames
    python benchmarks/codec_roofline.py --rows 1 --peak-tbs 4.8 --peak-tflops 989   # H200 peaks
    python benchmarks/codec_roofline.py --src=OLD/src          # an older tree's decoder, same script
    python benchmarks/codec_roofline.py --shapes 1x16,4x66,16x66 [--no-phases] [--exact-sin] [--unfused-units]
    python benchmarks/codec_roofline.py --shapes 1x66,4x66,16x66 --crop 8,8   # whole vs cropped windows

`--shapes`: only the graphed window per rows x frames (ms, ms a window), the A/B table of a change;
`--no-phases`: dilated convs as themselves, not in phases (`_Conv.phases`); `--exact-sin`: Snake's
sine in the codec kernels from libdevice's `sinf`, not the GPU's approximation (`codec.kernels.APPROX_SIN`);
`--unfused-units`: the 96-channel residual units as their four ops, not one kernel each
(`codec.fast.FUSED_UNIT_WIDTH`). The op-by-op table always runs the units unfused.

Peaks default to an H100 SXM's (3.35 TB/s HBM3, 989 TFLOP/s dense fp16 with fp32 accumulation).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

# --src=PATH: decode with another tree's engine (a side-by-side run against an older commit)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, next((a[6:] for a in sys.argv if a.startswith("--src=")), sys.path[0]))

from irodori_speaker.engine.codec import FULL_CODEC_KWARGS, codec_from_state_dict, random_codec_state_dict
from irodori_speaker.engine.codec.fast import ChannelsLastDecoder, _Conv, _head, epilogue_torch
from irodori_speaker.engine.fused import fused_available

try:
    from irodori_speaker.engine.codec import kernels as codec_kernels
except ImportError:  # a --src tree from before the codec's kernels had a module of their own
    from irodori_speaker.engine import fused as codec_kernels  # type: ignore[no-redef]
conv_epilogue = codec_kernels.conv_epilogue

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


class Ledger:
    """Per (kind, stage): ms, bytes, FLOPs, calls."""

    def __init__(self, reps: int, cpu: bool = False) -> None:
        self.reps = reps
        self.cpu = cpu  # the host clock (`--shapes --device cpu`), else CUDA events
        self.rows: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])

    def run(self, kind: str, stage: str, fn, nbytes: float, flops: float):
        out = fn()  # the result the next op reads
        times = []
        for _ in range(self.reps):
            if self.cpu:
                t0 = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t0))
                continue
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        row = self.rows[(kind, stage)]
        for i, v in enumerate((statistics.median(times), nbytes, flops, 1)):
            row[i] += v
        return out


def conv_cost(conv: _Conv, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(bytes, FLOPs) of a conv: x read, y written, weights read once; 2 x MACs."""
    w = conv.weight
    nbytes = (x.numel() + y.numel() + w.numel()) * x.element_size()
    if conv.transposed:  # each output sums kernel / stride = 2 taps of Cin
        macs = y.numel() * w.shape[0] * 2
    else:
        macs = y.numel() * w.shape[1] * conv.kernel
    return nbytes, 2.0 * macs


def decode(d: ChannelsLastDecoder, z: torch.Tensor, ledger: Ledger) -> tuple[torch.Tensor, float]:
    """`ChannelsLastDecoder._run` op by op into `ledger`; returns the audio and the fused-unit floor bytes."""
    es = z.element_size()
    epilogue = conv_epilogue if fused_available(z.device) else epilogue_torch  # as the decoder picks
    stage = "in"
    x = ledger.run(
        "conv k1", stage, lambda: d.in_proj(z.contiguous()), *conv_cost(d.in_proj, z, d.in_proj(z))
    )
    x, _ = ledger.run("epilogue", stage, lambda: epilogue(x, d.in_proj.bias, None, None, True),
                      2 * x.numel() * es, 0.0)  # fmt: skip
    y = d.first(x)
    y = ledger.run("conv k7 (gemm)", stage, lambda: d.first(x), *conv_cost(d.first, x, y))
    _, s = ledger.run("epilogue", stage, lambda: epilogue(y, d.first.bias, None, d.first_alpha, False),
                      2 * y.numel() * es, 0.0)  # fmt: skip
    # the fused floor: in_proj, the first conv and the head as they are; each unit one kernel
    fused_bytes = sum(r[1] for r in ledger.rows.values())
    n_stage = 0
    for conv, residual, alpha, keep in d.steps:
        if conv.transposed:
            n_stage += 1
        stage = f"{n_stage}: {conv.weight.shape[1] if conv.transposed else conv.weight.shape[0]} ch"
        kind = (
            "conv T"
            if conv.transposed
            else f"conv k{conv.kernel}" + (f" d{conv.dilation}" if conv.kernel > 1 else "")
        )
        if s.is_cuda and not conv.transposed and getattr(conv, "phases", lambda t: 1)(s.shape[1]) > 1:
            kind += " (phases)"  # `_Conv.phases` (an older tree has none)
        elif conv.as_gemm:
            kind += " (gemm)"
        y = conv(s)
        nbytes, flops = conv_cost(conv, s, y)
        y = ledger.run(kind, stage, lambda conv=conv, s=s: conv(s), nbytes, flops)
        passes = 2 + (1 if residual else 0) + (1 if keep else 0) - (0 if alpha is not None else 1)
        h, s = ledger.run(
            "epilogue", stage,
            lambda y=y, conv=conv, residual=residual, alpha=alpha, keep=keep, x=x: epilogue(
                y, conv.bias, x if residual else None, alpha, keep
            ),
            passes * y.numel() * es, 0.0,
        )  # fmt: skip
        if conv.transposed:
            fused_bytes += nbytes + passes * y.numel() * es  # the conv and its epilogue as today
        elif residual:  # a unit's end: the unit read s and h, wrote h and s (+ its weights)
            fused_bytes += 4 * y.numel() * es + conv.weight.numel() * es
        else:
            fused_bytes += conv.weight.numel() * es
        if keep:
            x = h
    assert s is not None
    head_bytes, head_flops = (
        s.numel() * es + s.shape[0] * s.shape[1] * 4,
        2.0 * s.numel() * d.head_weight.shape[-1],
    )
    out = ledger.run(
        "head", "head", lambda: _head(s, d.head_weight, d.head_bias, d.head_padding), head_bytes, head_flops
    )
    return out, fused_bytes + head_bytes


def shape_table(codec, shapes: list, args: argparse.Namespace) -> None:
    """The graphed window (the product's path) per (rows, frames): device ms, ms a window."""
    import irodori_speaker

    codec.use_graphs(True, capture_on_use=None, max_graphs=2 * len(shapes))
    flags = (" (no phases)" if args.no_phases else "") + (" (units unfused)" if args.unfused_units else "")
    sine = "approximate" if getattr(codec_kernels, "APPROX_SIN", False) else "exact"
    print(f"engine {Path(irodori_speaker.__file__).parent}{flags}, {sine} sine")
    left, right = (int(x) for x in args.crop.split(",")) if args.crop else (0, 0)
    if args.crop:  # the window keeping [left, frames - right): whole, then cropped (its own graph)
        print(f"windows keeping [{left}, frames - {right}): decoded whole, then cropped (`crop_spans`)")
        print("| rows x frames | whole ms | cropped ms | whole / cropped | cropped ms a window |")
        print("|---|---|---|---|---|")
    else:
        print("| rows x frames | graphed ms | ms a window |")
        print("|---|---|---|")
    hop = codec.hop_length
    for rows, frames in shapes:
        z = torch.randn(rows, codec.latent_channels, frames, device=codec.device).to(codec.dtype)
        times = []
        for crop in (False, True) if args.crop else (False,):
            if args.crop:  # an older tree (--src) has no crops: leave it be
                codec.crop_windows = crop
                codec.prewarm_graphs([frames], batch=rows, crop=(left, right))
            else:
                codec.prewarm_graphs([frames], batch=rows)
            a, b = (left * hop, (frames - right) * hop) if args.crop else (0, frames * hop)
            ledger = Ledger(args.reps, cpu=args.device == "cpu")
            with torch.inference_mode():
                ledger.run("w", "", lambda z=z, a=a, b=b: codec._decode_window(z, a, b), 0.0, 0.0)
            times.append(ledger.rows[("w", "")][0])
        if args.crop:
            whole, cropped = times
            each = cropped / rows
            print(f"| {rows} x {frames} | {whole:.3f} | {cropped:.3f} | {whole / cropped:.2f} | {each:.3f} |")
        else:
            print(f"| {rows} x {frames} | {times[0]:.3f} | {times[0] / rows:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--frames", type=int, default=66)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--dtype", choices=list(DTYPES), default="fp16")
    ap.add_argument("--src", default=None, help="=PATH: another tree's src/ (give it as --src=PATH)")
    ap.add_argument("--peak-tbs", type=float, default=3.35, help="HBM TB/s")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense fp16 TFLOP/s")
    ap.add_argument("--shapes", default=None, help="ROWSxFRAMES,...: only the graphed window's ms per shape")
    ap.add_argument("--no-phases", action="store_true", help="dilated convs not in phases (_Conv.phases)")
    ap.add_argument("--unfused-units", action="store_true", help="no residual unit in one kernel")
    crop_help = "L,R: with --shapes, windows keeping [L, frames - R), whole against cropped"
    ap.add_argument("--crop", help=crop_help)
    ap.add_argument("--exact-sin", action="store_true", help="the exact sine (APPROX_SIN off)")
    ap.add_argument("--device", default="cuda", help="cpu: --shapes only, eager (no graphs), the host clock")
    args = ap.parse_args()
    assert (args.device == "cuda" and torch.cuda.is_available()) or args.shapes, "a CUDA benchmark"
    if args.no_phases:
        _Conv.phases = lambda self, T: 1  # type: ignore[method-assign]
    if args.exact_sin:
        if not hasattr(codec_kernels, "APPROX_SIN"):
            sys.exit("--exact-sin: this tree's engine has only the exact sine")
        codec_kernels.APPROX_SIN = False
    state = random_codec_state_dict(FULL_CODEC_KWARGS, seed=0, watermark=False)
    codec = codec_from_state_dict(state, FULL_CODEC_KWARGS, device=args.device).to(DTYPES[args.dtype])
    assert codec.use_channels_last(True) and codec._channels_last is not None
    if args.unfused_units:
        codec._channels_last.fuse_units = False
    if args.shapes:
        shape_table(codec, [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")], args)
        return
    d = codec._channels_last
    z = torch.randn(args.rows, codec.latent_channels, args.frames, device="cuda").to(codec.dtype)
    ledger = Ledger(args.reps)
    bw, fl = args.peak_tbs * 1e12, args.peak_tflops * 1e12
    with torch.inference_mode():
        audio, fused_bytes = decode(d, z.transpose(1, 2), ledger)
        want = codec._decode_frames(z)
        assert (audio - want).abs().max().item() < 1e-2
        codec.use_graphs(True, capture_on_use=None, max_graphs=1)
        codec.prewarm_graphs([args.frames], batch=args.rows)
        samples = args.frames * codec.hop_length
        graphed = Ledger(args.reps)
        graphed.run("graphed", "", lambda: codec._decode_window(z, 0, samples), 0.0, 0.0)
        graphed_ms = graphed.rows[("graphed", "")][0]
    name = torch.cuda.get_device_name() + (f" (engine from {args.src})" if args.src else "")
    name += ", exact sine" if not getattr(codec_kernels, "APPROX_SIN", False) else ", approximate sine"
    import irodori_speaker

    print(f"engine: {Path(irodori_speaker.__file__).parent}")
    print(f"{name}, {args.rows} windows of {args.frames} frames, {args.dtype}, channels-last")
    print(f"peaks {args.peak_tbs} TB/s, {args.peak_tflops} TFLOP/s\n")
    print("| op | stage | calls | ms | share | GB | GFLOP | TB/s | TFLOP/s | floor ms | ms / floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    total = sum(r[0] for r in ledger.rows.values())
    floor_all = 0.0
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (kind, stage), (ms, nbytes, flops, calls) in ledger.rows.items():
        floor = max(nbytes / bw, flops / fl) * 1e3
        floor_all += floor
        by_kind[kind][0] += ms
        by_kind[kind][1] += floor
        print(f"| {kind} | {stage} | {calls:.0f} | {ms:.3f} | {ms / total:.1%} | {nbytes / 1e9:.3f} "
              f"| {flops / 1e9:.1f} | {nbytes / ms / 1e9:.2f} | {flops / ms / 1e9:.0f} | {floor:.3f} "
              f"| {ms / floor:.1f}x |")  # fmt: skip
    print("\n| op kind | ms | share | floor ms | ms / floor |")
    print("|---|---|---|---|---|")
    for kind, (ms, floor) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"| {kind} | {ms:.3f} | {ms / total:.1%} | {floor:.3f} | {ms / floor:.1f}x |")
    flops_all = sum(r[2] for r in ledger.rows.values())
    fused_floor = max(fused_bytes / bw, flops_all / fl) * 1e3
    print(f"\nsum of the ops {total:.3f} ms; the graphed window (the product's path) {graphed_ms:.3f} ms;")
    print(f"floor of these ops {floor_all:.3f} ms (they take {total / floor_all:.1f}x it); with each")
    gb, gflop = fused_bytes / 1e9, flops_all / 1e9
    print(f"residual unit one kernel {fused_floor:.3f} ms ({gb:.3f} GB, {gflop:.0f} GFLOP)")


if __name__ == "__main__":
    main()
