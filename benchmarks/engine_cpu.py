"""Engine speed on this CPU: per sampler step and per utterance, tiny vs full 500M v2 (random weights).

Side by side in one run: 40 linear steps (upstream default) vs 8 sway steps (our preset),
and text padded to 256 tokens (the reference) vs trimmed to its real length.

`--int8`: instead, the CPU preset's int8 linears (`engine.quant.int8`) on the full-size model, 8 sway
steps on the fast path as the product samples: siblings sharing one quantisation of their input
(q/k/v/gate, w1/w3: today's) against each linear quantising its own (before), on fp32 and bf16
activations, the two timed alternately `--repeat` times after a warm-up (fastest shown), and their
latents compared (they must be equal).

    python benchmarks/engine_cpu.py            # tiny + full size (a few minutes on 2 cores)
    python benchmarks/engine_cpu.py --tiny     # tiny only
    python benchmarks/engine_cpu.py --int8 --frames 35 --threads 1 --repeat 5
"""

from __future__ import annotations

import argparse
import copy
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
            latent = sample(model, conds, noise, sc)
        else:
            latent = fast.sample(conds, noise, sc)
    t2 = time.perf_counter()
    return {
        "encode_s": t1 - t0,
        "sample_s": t2 - t1,
        "per_step_s": (t2 - t1) / steps,
        "guided": guided,
        "latent": latent,
    }


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


def step_inputs(model, cfg, frames: int, rows: int = 3):
    """One sampler step's inputs for `FastDiT.velocity`: `rows` guidance rows (cond + 2 dropped)."""
    from irodori_speaker.engine.model import rope_tables

    torch.manual_seed(2)
    ids, mask, ref, ref_mask = make_inputs(cfg, 40, None, 250)
    rep = lambda t: t.expand(rows, *t.shape[1:])  # noqa: E731
    with torch.inference_mode():
        ctx = model.context_kv(model.encode_conditions(rep(ids), rep(mask), rep(ref), rep(ref_mask)))
        attn_mask = model.attention_mask(ctx, frames)
    x = torch.randn(rows, frames, cfg.latent_dim, dtype=model.in_proj.weight.dtype)
    return x, ctx, attn_mask, rope_tables(frames, cfg.head_dim, "cpu")


def run_int8(cfg, frames, repeat):
    """int8 linears, shared vs own quantisation of the input, per activation dtype (see the docstring)."""
    from irodori_speaker.engine.fast import FastSampler
    from irodori_speaker.engine.quant.int8 import quantize_linears_int8

    torch.manual_seed(0)
    base = build_model(cfg, device="cpu").eval()
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        model = base.to(dtype)  # in place: fp32 first, then bf16
        variants = {}
        for name, share in (("own", False), ("shared", True)):
            m = copy.deepcopy(model)
            quantize_linears_int8(m, share_inputs=share)
            variants[name] = (m, FastSampler(m, use_graphs=False))
        best: dict[str, dict] = {}
        for r in range(repeat + 1):  # the first round warms up; own and shared alternate
            for name, (m, fast) in variants.items():
                torch.manual_seed(1)  # the same text and reference every run
                res = time_utterance(m, cfg, frames, 8, "sway", 40, None, fast=fast)
                if r and (name not in best or res["sample_s"] < best[name]["sample_s"]):
                    best[name] = res
        # one step's velocity (3 guidance rows, the frames padded to the fast path's bucket),
        # own and shared alternating call by call: a finer comparison than whole lines
        bucket = -(-frames // 16) * 16
        step = step_inputs(model, cfg, bucket)
        table = variants["own"][1].fast.modulation_table([0.5])
        outs = {}
        for name in variants:
            best[name]["step_s"] = float("inf")
        with torch.inference_mode():
            for r in range(4 * repeat + 1):
                for name, (_, fast) in variants.items():
                    t0 = time.perf_counter()
                    outs[name] = fast.fast.velocity(step[0], table[0], *step[1:])
                    if r:
                        best[name]["step_s"] = min(best[name]["step_s"], time.perf_counter() - t0)
        same = torch.equal(best["own"]["latent"], best["shared"]["latent"])
        same = same and torch.equal(outs["own"], outs["shared"])
        rows.append((str(dtype).replace("torch.", ""), best["own"], best["shared"], same))
        del variants
    return rows


def print_int8(rows, frames: int, repeat: int) -> None:
    machine = platform.processor() or platform.machine()
    print(
        f"# engine_cpu --int8  {machine}  threads={torch.get_num_threads()}"
        f"  torch {torch.__version__}  {time.strftime('%Y-%m-%d %H:%M')}  full v2, {frames} frames, 8 sway,"
        f" fast path, fastest of {repeat} lines / {4 * repeat} steps"
    )
    print(
        "| activations | quantisation | encode s | sample s | own / shared | one step ms | own / shared "
        "| outputs equal |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for dtype, own, shared, same in rows:
        line = own["sample_s"] / shared["sample_s"]
        step = own["step_s"] / shared["step_s"]
        for name, r in (("own per linear (before)", own), ("shared by siblings", shared)):
            cells = (f"{line:.3f}x", f"{step:.3f}x") if r is shared else ("1", "1")
            print(
                f"| {dtype} | {name} | {r['encode_s']:.3f} | {r['sample_s']:.3f} | {cells[0]} | "
                f"{1e3 * r['step_s']:.1f} | {cells[1]} | {same} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="tiny model only")
    ap.add_argument("--frames", type=int, default=75, help="latent frames of the utterance (25 per second)")
    ap.add_argument("--int8", action="store_true", help="only the int8 shared-quantisation rows (full size)")
    ap.add_argument("--repeat", type=int, default=5, help="--int8: timed runs of each variant")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.int8:
        print_int8(run_int8(full_v2_config(), args.frames, args.repeat), args.frames, args.repeat)
        return
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
