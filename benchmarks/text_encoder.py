"""The v4 text backbone (ModernBERT-ja-310m's shape, random weights) eager against fused, graphed.

A text-encoder call is on the path to every v4 line's first audio, and at 16 streams it was nearly
as dear for one line as for eight (2.67 against 3.03 ms on an H100, RESULTS.md "Twenty-second
session"). Per rows x tokens (`--shapes`): the backbone's forward as the model runs it
(`ModernBert.forward`) and with its layers' elementwise work fused (`fast_text.FastModernBert`),
each captured in a CUDA graph and replayed (the product's path), device ms (CUDA events, medians,
side by side in one run); the kernels one call launches (torch.profiler); and the largest
difference between the two outputs. The rows' last quarter of tokens is padding, as a batch's
shorter lines are.

    python benchmarks/text_encoder.py
    python benchmarks/text_encoder.py --shapes 1x64,8x64,16x96 --dtype bf16 --reps 50
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import news5  # device_ms: the benchmarks' one timer

from irodori_speaker.engine.backbone_config import BackboneConfig, parse_backbone_config
from irodori_speaker.engine.cuda_graphs import capture
from irodori_speaker.engine.fast_text import FastModernBert
from irodori_speaker.engine.text_backbone import ModernBert

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def released_backbone(dtype: torch.dtype) -> ModernBert:
    """ModernBERT-ja-310m's shape (its config from the v4.1-Small-MF manifest), random weights."""
    with gzip.open(news5.MF_MANIFEST, "rt", encoding="utf-8") as f:
        cfg = parse_backbone_config(json.load(f)["text_encoder_config"])
    assert isinstance(cfg, BackboneConfig)
    torch.manual_seed(0)
    return ModernBert(cfg).to("cuda", dtype).eval()


def kernels_a_call(fn, *args) -> int:
    """CUDA kernels launched by one call of `fn(*args)` (eager, under torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args)
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="1x64,2x64,4x64,8x64,16x64,1x128,8x128")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    assert torch.cuda.is_available(), "a CUDA benchmark"
    dtype = DTYPES[args.dtype]
    model = released_backbone(dtype)
    fast = FastModernBert(model)
    cfg = model.cfg
    print(torch.cuda.get_device_name(), "torch", torch.__version__, args.dtype)
    print(
        f"backbone: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, {cfg.num_attention_heads} heads"
    )
    print("| rows x tokens | eager ms | fused ms | eager / fused | kernels eager / fused | max diff |")
    print("|---|---|---|---|---|---|")
    pool = torch.cuda.graph_pool_handle()
    with torch.inference_mode():
        for shape in args.shapes.split(","):
            rows, tokens = (int(v) for v in shape.split("x"))
            ids = torch.randint(7, cfg.vocab_size, (rows, tokens), device="cuda")
            mask = torch.ones(rows, tokens, dtype=torch.bool, device="cuda")
            mask[1:, tokens - tokens // 4 :] = False  # every row but the first padded
            times, outs, counts = [], [], []
            for fn in (model, fast):
                counts.append(kernels_a_call(fn, ids, mask))
                graph, out = capture(fn, [ids, mask], pool)
                times.append(news5.device_ms("cuda", graph.replay, reps=args.reps))
                outs.append(out.float().clone())
            assert fast.on, "the fused kernels fell back to the eager forward"
            diff = (outs[0] - outs[1]).abs().max().item()
            print(
                f"| {rows} x {tokens} | {times[0]:.3f} | {times[1]:.3f} | {times[0] / times[1]:.2f}x | "
                f"{counts[0]} / {counts[1]} | {diff:.2e} |"
            )


if __name__ == "__main__":
    main()
