"""Irodori-TTS v4-Large on this CPU: the full-size model (3.29B parameters, random weights of the
released shapes) through one line's DiT work, as the CPU preset runs it (the fast path).

The release's config comes from the tensor manifest (tests/data/dit_v4_large/v4_large_keys.json.gz).
The model is built on the meta device, then given memory in `--dtype` (bf16: 6.6 GB; fp32: 13 GB)
and small random weights. Timed: the conditions (T5Gemma 2 text encoder over the text, the
speaker encoder over a reference, the caption), then sampling 8 sway steps with classifier-free
guidance (the preset's) and, with `--linear40`, upstream's 40 linear steps. The codec is not
included (it is the same as every other family's: benchmarks/codec_cpu.py). RTF = seconds of
work per second of audio (25 latent frames a second); above 1 is slower than real time.

    python benchmarks/large_cpu.py                        # bf16, 3 s of audio, 8 sway steps
    python benchmarks/large_cpu.py --dtype fp32 --frames 50 --threads 2
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import time
from pathlib import Path

import torch

from irodori_speaker.engine.backbone_config import parse_backbone_config
from irodori_speaker.engine.checkpoint import build_model
from irodori_speaker.engine.config import ModelConfig
from irodori_speaker.engine.fast import FastSampler
from irodori_speaker.engine.sampler import SamplerConfig, draw_noise

MANIFEST = Path(__file__).resolve().parents[1] / "tests" / "data" / "dit_v4_large" / "v4_large_keys.json.gz"
FRAMES_PER_SECOND = 25


def large_config() -> ModelConfig:
    with gzip.open(MANIFEST, "rt", encoding="utf-8") as f:
        m = json.load(f)
    return ModelConfig.from_dict(m["config"], text_backbone=parse_backbone_config(m["text_encoder_config"]))


def random_large(dtype: torch.dtype):
    """The full-size model with small random weights (norm offsets zero, as Gemma stores them)."""
    cfg = large_config()
    model = build_model(cfg, device="meta", dtype=dtype).to_empty(device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5, generator=gen)
            elif name.endswith("norm.weight") and "pretrained_text_backbone" in name:
                p.zero_()
            elif name.endswith("weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
        for b in model.buffers():
            if b.is_floating_point() and not torch.isfinite(b).all():
                b.zero_()
    return model.eval().requires_grad_(False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--frames", type=int, default=75, help="latent frames of the line (25 a second)")
    ap.add_argument("--text-tokens", type=int, default=40)
    ap.add_argument("--ref-seconds", type=float, default=10.0)
    ap.add_argument("--linear40", action="store_true", help="also upstream's 40 linear steps")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    t0 = time.perf_counter()
    model = random_large(dtype)
    built = time.perf_counter() - t0
    cfg = model.cfg
    vocab = cfg.text_token_vocab
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab - 1000, (1, args.text_tokens), generator=gen)
    ids[0, 0] = 2
    mask = torch.ones_like(ids, dtype=torch.bool)
    ref_frames = int(args.ref_seconds * FRAMES_PER_SECOND)
    ref = torch.randn(1, ref_frames, cfg.latent_dim, generator=gen).to(dtype)
    cap_ids = torch.randint(3, vocab - 1000, (1, 12), generator=gen)
    cap_ids[0, 0] = 2
    with torch.inference_mode():
        t0 = time.perf_counter()
        conds = model.encode_conditions(
            ids, mask, ref, None, cap_ids, torch.ones_like(cap_ids, dtype=torch.bool)
        )
        cond_s = time.perf_counter() - t0
    sampler = FastSampler(model, use_graphs=False)
    noise = draw_noise(0, 1, args.frames, cfg.latent_dim).to(dtype)
    rows = []
    cases = [("8 sway, CFG (the preset)", SamplerConfig(steps=8, schedule="sway"))]
    if args.linear40:
        cases.append(("40 linear, CFG (upstream)", SamplerConfig(steps=40, schedule="linear")))
    audio_s = args.frames / FRAMES_PER_SECOND
    for label, sc in cases:
        t0 = time.perf_counter()
        out = sampler.sample(conds, noise, sc)
        s = time.perf_counter() - t0
        assert torch.isfinite(out).all()
        rows.append((label, s, s / (sc.steps or 1), (s + cond_s) / audio_s))
    print(
        f"# v4-Large full size, random weights, {args.dtype}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}; built in {built:.0f} s"
    )
    print(
        f"# {args.text_tokens} text tokens, {args.ref_seconds:g} s reference, 12-token caption, "
        f"{args.frames} frames ({audio_s:g} s of audio); conditions {cond_s:.2f} s"
    )
    print(f"{'sampler':28s} {'total s':>8s} {'s/step':>8s} {'RTF (DiT)':>10s}")
    for label, s, per, rtf in rows:
        print(f"{label:28s} {s:8.1f} {per:8.2f} {rtf:10.1f}")


if __name__ == "__main__":
    main()
