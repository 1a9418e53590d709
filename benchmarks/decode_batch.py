"""Stream windows of several lines decoded as one batch against one by one, in one run.

Full-size DACVAE with random weights; windows of the stream's middle length (`--frames`, default
the CUDA preset's 50-frame chunk plus 16 frames of context). Per batch size B: ms a window decoded
alone (B replays or eager calls), ms a window inside one batch of B (`DACVAE.decode_window_batch`),
and their ratio. On CUDA both sides replay prewarmed graphs (as the Synthesizer does with
`codec_graphs`); on the CPU both run eagerly.

  python benchmarks/decode_batch.py                         # CUDA, fp16, channels-last, graphs
  python benchmarks/decode_batch.py --device cpu --frames 41 --batches 2,4 --reps 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import news5  # device_ms: the benchmarks' one timer

from irodori_speaker.engine.codec import FULL_CODEC_KWARGS, codec_from_state_dict, random_codec_state_dict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default=None)
    ap.add_argument("--frames", type=int, default=66, help="window length in latent frames")
    ap.add_argument("--batches", default="2,4,8,16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = args.device == "cuda"
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[
        args.dtype or ("fp16" if cuda else "fp32")
    ]
    batches = [int(b) for b in args.batches.split(",")]
    codec = codec_from_state_dict(
        random_codec_state_dict(FULL_CODEC_KWARGS, seed=0), FULL_CODEC_KWARGS, device=args.device
    )
    codec = codec.to(dtype)
    codec.use_channels_last(cuda)
    if cuda:
        codec.use_graphs(True, capture_on_use=None, max_graphs=len(batches) + 1)
        codec.prewarm_graphs([args.frames])
        for b in batches:
            codec.prewarm_graphs([args.frames], batch=b)
    hop, n = codec.hop_length, args.frames
    gen = torch.Generator().manual_seed(0)
    print(f"{args.device} {dtype} window {n} frames, torch threads {torch.get_num_threads()}")
    print("| windows | alone ms / window | in one batch ms / window | batch vs alone |")
    print("|---|---|---|---|")
    for b in batches:
        z = torch.randn(b, codec.latent_channels, n, generator=gen).to(args.device, dtype)
        windows = [(z[i : i + 1], 8 * hop, (n - 8) * hop) for i in range(b)]

        def alone(windows: list = windows) -> None:
            for w in windows:
                codec.decode_window_batch([w])

        def batched(windows: list = windows) -> None:
            codec.decode_window_batch(windows)

        with torch.inference_mode():
            t_alone = news5.device_ms(args.device, alone, reps=args.reps) / b
            t_batch = news5.device_ms(args.device, batched, reps=args.reps) / b
        print(f"| {b} | {t_alone:.2f} | {t_batch:.2f} | {t_alone / t_batch:.2f}x |")


if __name__ == "__main__":
    main()
