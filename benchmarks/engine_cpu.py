"""Engine speed on this CPU: per sampler step and per utterance, tiny vs full 500M v2 (random weights).

Side by side in one run: 40 linear steps (upstream default) vs 8 sway steps (our preset),
and text padded to 256 tokens (the reference) vs trimmed to its real length.

    python benchmarks/engine_cpu.py            # tiny + full size (a few minutes on 2 cores)
    python benchmarks/engine_cpu.py --tiny     # tiny only
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from irodori_speaker.engine.checkpoint import build_model
from irodori_speaker.engine.config import ModelConfig
from irodori_speaker.engine.sampler import SamplerConfig, draw_noise, plan_sampling, sample

#: Tensor manifest of the released 500M v2 model (tests/data/README.md).
V2_MANIFEST = Path(__file__).resolve().parents[1] / "tests" / "data" / "dit" / "v2_500m_keys.json"


def full_v2_config() -> ModelConfig:
    manifest = json.loads(V2_MANIFEST.read_text())
    return ModelConfig.from_dict(manifest["config"])


def tiny_config() -> ModelConfig:
    from irodori_speaker.engine.tiny import TINY_CONFIGS

    return ModelConfig.from_dict(TINY_CONFIGS["v2"])


def make_inputs(cfg: ModelConfig, text_tokens: int, pad_to: int | None, ref_frames: int):
    L = pad_to or text_tokens
    ids = torch.randint(5, cfg.text_vocab_size, (1, L))
    mask = torch.zeros(1, L, dtype=torch.bool)
    mask[:, :text_tokens] = True
    ref = torch.randn(1, ref_frames, cfg.latent_dim)
    return ids, mask, ref, torch.ones(1, ref_frames, dtype=torch.bool)


def time_utterance(model, cfg, frames, steps, schedule, text_tokens, pad_to, ref_frames=250, fast=None):
    ids, mask, ref, ref_mask = make_inputs(cfg, text_tokens, pad_to, ref_frames)
    sc = SamplerConfig(steps=steps, schedule=schedule)
    guided = sum(s.group >= 0 for s in plan_sampling(sc, ("text", "speaker")).steps)
    t0 = time.perf_counter()
    with torch.inference_mode():
        conds = model.encode_conditions(ids, mask, ref, ref_mask)
        t1 = time.perf_counter()
        noise = draw_noise(0, 1, frames, cfg.latent_dim)
        if fast is None:
            sample(model, conds, noise, sc)
        else:
            fast.sample(conds, noise, sc)
    t2 = time.perf_counter()
    return {"encode_s": t1 - t0, "sample_s": t2 - t1, "per_step_s": (t2 - t1) / steps, "guided": guided}


def run(label, cfg, frames, cases):
    torch.manual_seed(0)
    model = build_model(cfg, device="cpu").eval()
    # warm-up (allocator, oneDNN primitive creation)
    time_utterance(model, cfg, min(frames, 25), 2, "sway", 16, None, 25)
    rows = []
    for steps, schedule, pad in cases:
        r = time_utterance(model, cfg, frames, steps, schedule, text_tokens=40, pad_to=pad)
        rows.append((label, frames, f"{steps} {schedule}", "256" if pad else "trim", r))
    # the fast path (fused projections, precomputed AdaLN, padded buckets; no CUDA graphs here)
    from irodori_speaker.engine.fast import FastSampler

    fast = FastSampler(model, use_graphs=False)
    time_utterance(model, cfg, min(frames, 25), 2, "sway", 16, None, 25, fast=fast)
    r = time_utterance(model, cfg, frames, 8, "sway", text_tokens=40, pad_to=None, fast=fast)
    rows.append((label, frames, "8 sway fast", "trim", r))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="tiny model only")
    ap.add_argument("--frames", type=int, default=75, help="latent frames of the utterance (25 per second)")
    args = ap.parse_args()
    cases = [(40, "linear", 256), (40, "linear", None), (8, "sway", 256), (8, "sway", None)]
    rows = run("tiny", tiny_config(), args.frames, cases)
    if not args.tiny:
        rows += run("v2 500M", full_v2_config(), args.frames, cases)
    machine = platform.processor() or platform.machine()
    print(
        f"# engine_cpu  {machine}  threads={torch.get_num_threads()}  torch {torch.__version__}  "
        f"{time.strftime('%Y-%m-%d')}"
    )
    cols = ["model", "frames", "steps", "text", "guided steps", "encode s", "sample s", "per step s"]
    print("| " + " | ".join([*cols, "vs 40 linear/256"]) + " |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = {}
    for label, frames, steps, text, r in rows:
        base.setdefault(label, r["encode_s"] + r["sample_s"])
        ratio = base[label] / (r["encode_s"] + r["sample_s"])
        print(
            f"| {label} | {frames} | {steps} | {text} | {r['guided']} | {r['encode_s']:.3f} | "
            f"{r['sample_s']:.3f} | {r['per_step_s']:.4f} | {ratio:.2f}x |"
        )


if __name__ == "__main__":
    main()
