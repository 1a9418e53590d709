"""The codec's decode, variant against variant in one run: layout, windows, graphs, precision.

Full-size DACVAE with random weights (built by the product's `codec_from_state_dict`), the five
news5 line lengths (37, 190, 252, 118, 118 latent frames = 28.6 s of audio), each line streamed as
the Synthesizer streams it (a short first window, then `--chunks` frames a window). Per variant:
total decode ms of the five lines, ms to the first chunk of the first line, and the largest error
(and the SNR) of the joined audio against a one-pass fp32 eager decode of the same line.

  python benchmarks/codec_speed.py                      # CUDA: fp16 eager / channels-last, graphs
  python benchmarks/codec_speed.py --device cpu --threads 16 --lines 1
  python benchmarks/codec_speed.py --compile            # adds torch.compile variants (slow start)

Variants: `bcT` the (B, C, T) decoder as the reference lays it out; `cl` the channels-last decoder
(`engine/codec/fast.py`); `+graph` windows replayed from CUDA graphs (prewarmed first);
`compile` torch.compile of the (B, C, T) decoder.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import news5  # device_ms: the benchmarks' one timer

from irodori_speaker.engine.codec import (
    FULL_CODEC_KWARGS,
    codec_from_state_dict,
    random_codec_state_dict,
    stream_window_lengths,
)

NEWS5_FRAMES = [37, 190, 252, 118, 118]
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_line(
    codec, latent: torch.Tensor, chunk: int | None, first: int | None, growth: float | None = None
) -> tuple[torch.Tensor, float]:
    """The joined audio of one streamed line, and the ms until its first chunk was on the host."""
    t0 = time.perf_counter()
    first_ms = 0.0
    if chunk is None:
        audio = codec.decode(latent)
        sync(latent.device)
        return audio, (time.perf_counter() - t0) * 1e3
    parts = []
    for i, part in enumerate(codec.decode_stream(latent, chunk, first_chunk_frames=first, growth=growth)):
        parts.append(part.float().cpu())  # the Synthesizer hands each chunk to the host
        if i == 0:
            first_ms = (time.perf_counter() - t0) * 1e3
    return torch.cat(parts, -1), first_ms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--dtypes", default=None, help="comma list of fp32,fp16,bf16 (default: fp16 on CUDA, fp32 on CPU)"
    )
    ap.add_argument(
        "--chunks", default="50,100", help="middle window sizes in frames (comma list; 0: one pass)"
    )
    ap.add_argument("--first", type=int, default=8, help="first window's frames")
    ap.add_argument(
        "--growth", default="", help="comma list of chunk growth factors after the first (0: none), as rows"
    )
    ap.add_argument("--lines", type=int, default=5, help="how many news5 lines")
    ap.add_argument("--repeat", type=int, default=3, help="timed passes (the best is kept)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--compile", action="store_true", help="add torch.compile variants")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument(
        "--cudnn-benchmark",
        action="store_true",
        help="add +bench variants: cuDNN times its algorithms per conv shape (cudnn.benchmark)",
    )
    ap.add_argument(
        "--profile-windows",
        default="",
        help="comma list of window frames: the top CUDA kernels of one fp16 decode of each, per variant",
    )
    ap.add_argument(
        "--conv-table",
        default="",
        help="comma list of window frames: every conv of the fp16 channels-last decoder, cuDNN against "
        "its one-GEMM form, us per call (CUDA)",
    )
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    dtypes = (args.dtypes or ("fp16" if cuda else "fp32")).split(",")
    chunks = [int(c) or None for c in args.chunks.split(",")]
    growths = [float(g) or None for g in args.growth.split(",")] if args.growth else [None]
    frames = NEWS5_FRAMES[: args.lines]
    state = random_codec_state_dict(FULL_CODEC_KWARGS, seed=0, watermark=False)
    gen = torch.Generator().manual_seed(1)
    latents = [torch.randn(1, n, 32, generator=gen).to(device) for n in frames]

    ref_codec = codec_from_state_dict(state, FULL_CODEC_KWARGS, device=device, dtype=torch.float32)
    with torch.no_grad():
        refs = [ref_codec.decode(z).float().cpu() for z in latents]
    del ref_codec
    if cuda:
        torch.cuda.empty_cache()

    name = torch.cuda.get_device_name(device) if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(f"# codec decode, {device.type} ({name}), torch {torch.__version__}")
    print(f"# {len(frames)} lines, {sum(frames) / 25:.2f} s of audio; first window {args.first} frames")
    print()
    print("| variant | dtype | window | total ms | first chunk ms | RTF | max abs err | SNR dB | peak MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for dname in dtypes:
        dtype = DTYPES[dname]
        variants = [("bcT", False, False, False), ("cl", True, False, False)]
        if cuda and not args.no_graphs:
            variants += [("bcT+graph", False, True, False), ("cl+graph", True, True, False)]
        if args.compile:
            variants += [("compile", False, cuda and not args.no_graphs, True)]
        if args.cudnn_benchmark and cuda:
            variants += [(v + "+bench", cl, g, c) for v, cl, g, c in variants if not c]
        for vname, channels_last, graphs, compiled in variants:
            torch.backends.cudnn.benchmark = vname.endswith("+bench")
            codec = codec_from_state_dict(state, FULL_CODEC_KWARGS, device=device, dtype=dtype)
            if channels_last:
                codec.use_channels_last(True)
            if compiled:
                try:
                    codec.decoder = torch.compile(codec.decoder, dynamic=False)
                except Exception as e:
                    print(f"| {vname} | {dname} | - | compile failed: {type(e).__name__}: {e} | | | | |")
                    continue
            for chunk, growth in [(c, g) for c in chunks for g in (growths if c else [None])]:
                if graphs:
                    codec.use_graphs(True, capture_on_use=1, max_graphs=16, max_frames=512)
                    if chunk is not None:
                        codec.prewarm_graphs(
                            stream_window_lengths(chunk, first_chunk_frames=args.first, growth=growth)
                        )
                if cuda:
                    torch.cuda.reset_peak_memory_stats(device)
                try:
                    with torch.no_grad():
                        for z in latents:  # warm-up: cuDNN choices, lazy graph captures, compiles
                            decode_line(codec, z, chunk, args.first, growth)
                        best, first_ms, err = float("inf"), 0.0, 0.0
                        for _ in range(args.repeat):
                            sync(device)
                            t0 = time.perf_counter()
                            outs = []
                            for i, z in enumerate(latents):
                                audio, ms = decode_line(codec, z, chunk, args.first, growth)
                                outs.append(audio)
                                if i == 0:
                                    f_ms = ms
                            sync(device)
                            total = (time.perf_counter() - t0) * 1e3
                            if total < best:
                                best, first_ms = total, f_ms
                        err = max(float((o.float().cpu() - r).abs().max()) for o, r in zip(outs, refs))
                        noise = sum(float(((o.float().cpu() - r) ** 2).sum()) for o, r in zip(outs, refs))
                        signal = sum(float((r**2).sum()) for r in refs)
                        snr = 10 * math.log10(signal / noise) if noise > 0 else float("inf")
                except Exception as e:
                    print(f"| {vname} | {dname} | {chunk} | failed: {type(e).__name__}: {str(e)[:100]} |||||")
                    continue
                peak = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else float("nan")
                audio_s = sum(frames) / 25
                window = "one pass" if chunk is None else f"{args.first}/{chunk}"
                window += f" x{growth:g}" if growth else ""
                print(
                    f"| {vname} | {dname} | {window} | {best:.1f} | {first_ms:.2f} "
                    f"| {best / 1e3 / audio_s:.4f} | {err:.2e} | {snr:.1f} | {peak:.0f} |",
                    flush=True,
                )
            del codec
            if cuda:
                torch.cuda.empty_cache()
    torch.backends.cudnn.benchmark = False
    for n in [int(w) for w in args.profile_windows.split(",") if w]:
        profile_window(state, device, n)
    if args.conv_table:
        conv_table(state, device, [int(w) for w in args.conv_table.split(",")])


def conv_table(state: dict, device: torch.device, windows: list[int]) -> None:
    """Each conv of the channels-last fp16 decoder at each window: cuDNN, and its one-GEMM form."""
    from dataclasses import replace

    from irodori_speaker.engine.codec import fast

    codec = codec_from_state_dict(state, FULL_CODEC_KWARGS, device=device, dtype=torch.float16)
    codec.use_channels_last(True)
    cl = codec._channels_last
    seen: list[tuple[fast._Conv, torch.Tensor]] = []
    original = fast._Conv.__call__

    def record(self, x):
        seen.append((self, x))
        return original(self, x)

    print("\n| window | conv | Cin>Cout | K | stride/dil | T in | cuDNN us | GEMM us | GEMM / cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|")
    for frames in windows:
        seen.clear()
        fast._Conv.__call__ = record  # type: ignore[method-assign]
        try:
            with torch.no_grad():
                cl(torch.randn(1, frames, 32, device=device, dtype=cl.in_proj.weight.dtype))
        finally:
            fast._Conv.__call__ = original  # type: ignore[method-assign]
        total = {"cudnn": 0.0, "best": 0.0, "now": 0.0}
        for i, (conv, x) in enumerate(seen):
            direct = replace(conv, as_gemm=False)
            gemm = replace(conv, as_gemm=conv.gemm_able())
            with torch.no_grad():
                t_direct = 1e3 * news5.device_ms("cuda", direct, x)
                t_gemm = 1e3 * news5.device_ms("cuda", gemm, x) if gemm.as_gemm else float("nan")
            kind = "up" if conv.transposed else ("k1" if conv.kernel == 1 else "conv")
            step = conv.stride if conv.transposed else conv.dilation
            cin, cout = conv.weight.shape[:2]  # (Cin, Cout, K) transposed, else (Cout, Cin, K)
            if not conv.transposed:
                cin, cout = cout, cin
            total["cudnn"] += t_direct
            total["best"] += min(t_direct, t_gemm) if t_gemm == t_gemm else t_direct
            total["now"] += t_gemm if conv.as_gemm else t_direct
            print(
                f"| {frames} | {i} {kind} | {cin}>{cout} | {conv.kernel} | {step} | {x.shape[1]} "
                f"| {t_direct:.1f} | {t_gemm:.1f} | {t_gemm / t_direct:.2f} |"
            )
        print(
            f"| {frames} | all | | | | | {total['cudnn']:.1f} | best {total['best']:.1f} | "
            f"now {total['now']:.1f} |"
        )
    del codec


def profile_window(state: dict, device: torch.device, frames: int) -> None:
    """Top CUDA kernels of one eager fp16 decode of a `frames` window: bcT / cl, cudnn.benchmark off / on."""
    from torch.profiler import ProfilerActivity, profile

    z = torch.randn(1, frames, 32, device=device, dtype=torch.float16)
    for cl in (False, True):
        for bench in (False, True):
            torch.backends.cudnn.benchmark = bench
            codec = codec_from_state_dict(state, FULL_CODEC_KWARGS, device=device, dtype=torch.float16)
            codec.use_channels_last(cl)
            with torch.no_grad():
                for _ in range(2):
                    codec.decode(z)
                sync(device)
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    codec.decode(z)
                    sync(device)
            events = prof.key_averages()
            total = sum(e.self_device_time_total for e in events) / 1e3
            layout = "cl" if cl else "bcT"
            print(f"\n## window {frames} frames, {layout}, benchmark={bench}: {total:.2f} ms of kernels")
            print(events.table(sort_by="device_time_total", row_limit=12, max_name_column_width=70))
            del codec
    torch.backends.cudnn.benchmark = False


if __name__ == "__main__":
    main()
