"""Roofline of news5 on paper: the time floors of the v2 DiT's sampling and of the codec's decode.

No GPU and no weights: the full-size v2 DiT (the config of its release manifest,
tests/data/dit/v2_500m_keys.json) and the full-size codec (`FULL_CODEC_KWARGS`) are built on the
meta device; every shape comes from those modules, the fast path's fused projections
(`engine/fast.py`), the sampler's plan (`engine/sampler.py`) and the presets. Prints markdown:

1. the DiT's GEMMs per forward as the CUDA fast path runs them (Q/K/V/gate and w1/w3 fused), at the
   guided steps' M (3 CFG rows x frames padded to the bucket; `--all-rows`: every M): FLOPs, bytes
   with bf16 weights, int4 weights (group 32, fp16 scales) and the scratch path (int4 read, bf16
   written, bf16 read by cuBLAS), intensity, compute / memory / launch floors on an H200;
2. per step and per line (8 sway steps, news5's five lines): work, kernels and floors next to the
   measured sampling ms of modes (d) bf16 and (e) int4 (`--measured-sampling-ms*`);
3. the codec decoder per conv for one second of audio, its floors for news5 on the H200 (one pass
   and streamed windows), and sentence 1 on a 16-core CPU (DiT + codec, RTF floor vs measured).

    python benchmarks/roofline.py                         # full size (a few seconds, CPU only)
    python benchmarks/roofline.py --all-rows --json /tmp/roofline.json
    python benchmarks/roofline.py --smoke                 # tiny-random configs (the test's check)

A kernel's floor is max(FLOPs / peak, bytes / bandwidth, launch); a line's is the sum over its
kernels (they run one after another). Assumptions, each a flag: 790 TFLOP/s dense bf16 / fp16 (the
device notes measured 788 on random data; the datasheet says 989), 4.8 TB/s HBM (datasheet; a
copy measured ~4.3), 2.5 us per kernel inside a CUDA graph (assumed, not measured); CPU: AMX-BF16
at 1024 FLOP/cycle/core x 2.0 GHz x 16 cores (vendor-style peak), 4 TFLOP/s achievable, 200 GB/s.
Not counted: the Euler / CFG update, the per-line context norms and cats, the bytes of the fused
elementwise kernels (their launches are), the text encoder (its own graph, ~2.4 ms a line), Snake's
arithmetic and the codec's bias / residual adds.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from irodori_speaker.engine.checkpoint import build_model  # noqa: E402
from irodori_speaker.engine.codec import DACVAE, FULL_CODEC_KWARGS, TINY_CODEC_KWARGS, Snake  # noqa: E402
from irodori_speaker.engine.codec.streaming import RECEPTIVE_FIELD_FRAMES, chunk_windows  # noqa: E402
from irodori_speaker.engine.config import ModelConfig  # noqa: E402
from irodori_speaker.engine.duration import FRAMES_PER_SECOND  # noqa: E402
from irodori_speaker.engine.fast import FastDiT, FastSampler, round_up  # noqa: E402
from irodori_speaker.engine.hardware.presets import base_preset  # noqa: E402
from irodori_speaker.engine.quant.formats import gptq_is_packable  # noqa: E402
from irodori_speaker.engine.quant.quantize import quantize_checkpoint  # noqa: E402
from irodori_speaker.engine.sampler import plan_sampling  # noqa: E402
from irodori_speaker.engine.tiny import TINY_CONFIGS  # noqa: E402
from irodori_speaker.options import SamplerConfig  # noqa: E402

V2_MANIFEST = REPO / "tests" / "data" / "dit" / "v2_500m_keys.json"
NEWS5_JSON = REPO / "benchmarks" / "data" / "news5.json"
GROUP = inspect.signature(quantize_checkpoint).parameters["group_size"].default  # 32
# engine/fast.py `_velocity_fused`: 2 add_rms_modulate, qkv_joint, gate_heads, swiglu per block
ELEMENTWISE_PER_BLOCK = 5
FORMATS = ("bf16", "int4", "scratch")
Item = dict[str, Any]


def floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def gemm(name: str, M: int, N: int, K: int, count: int, int4: bool = True) -> Item:
    """y[M, N] = x[M, K] W^T, `count` times; bytes of each kernel per weight format (int4: the
    fused kernel; scratch: a dequant kernel writing bf16 W, then cuBLAS reading it)."""
    int4 = int4 and gptq_is_packable(K, N, GROUP)  # else the quantiser keeps it float
    act, w4 = 2 * M * K + 2 * M * N, N * K // 2 + 2 * (K // GROUP) * N
    bf16 = [2 * N * K + act]
    parts = {
        "bf16": bf16,
        "int4": [w4 + act] if int4 else bf16,
        "scratch": [w4 + 2 * N * K, 2 * N * K + act] if int4 else bf16,
    }
    return {"name": name, "M": M, "N": N, "K": K, "count": count, "flops": 2 * M * N * K, "parts": parts}


def same_parts(b: int) -> dict[str, list[int]]:
    return {f: [b] for f in FORMATS}


def attention(B: int, S: int, ctx: int, D: int, count: int) -> Item:
    """Joint attention, B rows of S queries over S + ctx keys: QK^T and PV, 2 * S * L * D FLOPs each."""
    L = S + ctx
    b = 2 * B * (2 * S * D + 2 * L * D + L)  # q, o, k, v and the additive mask, bf16
    return {"name": "attention", "M": B * S, "N": L, "K": D, "count": count, "flops": 4 * B * S * L * D} | {
        "parts": same_parts(b)
    }


def cost(items: list[Item], fmt: str, tflops: float, bw: float, launch_us: float) -> dict[str, float]:
    """FLOPs, bytes, kernels and the floors (s) of `items` with weights in `fmt`; bw in bytes/s."""
    out = dict.fromkeys(("flops", "bytes", "kernels", "compute", "memory", "launch", "floor"), 0.0)
    for it in items:
        parts, n = it["parts"][fmt], it["count"]
        out["flops"] += n * it["flops"]
        out["bytes"] += n * sum(parts)
        out["kernels"] += n * len(parts)
        for i, b in enumerate(parts):  # the FLOPs run in the last kernel (the GEMM after a dequant)
            f = it["flops"] if i == len(parts) - 1 else 0
            out["floor"] += n * max(f / (tflops * 1e12), b / bw, launch_us * 1e-6)
    out["compute"], out["memory"] = out["flops"] / (tflops * 1e12), out["bytes"] / bw
    out["launch"] = out["kernels"] * launch_us * 1e-6
    return out


def dit_shapes(cfg: ModelConfig) -> dict[str, dict[str, tuple[int, int]]]:
    """(N, K) of a diffusion block's per-step linears as the CUDA fast path fuses them, as the
    model's own blocks run them (CPU), the per-line context K/V projections, in/out projections."""
    model = build_model(cfg, device="meta")
    own = {
        n: (m.out_features, m.in_features)
        for n, m in model.blocks[0].named_modules()
        if isinstance(m, nn.Linear)
    }
    is_ctx = [n for n in own if "_text" in n or "_speaker" in n or "_caption" in n]
    cpu = {n: s for n, s in own.items() if "adaln" not in n and n not in is_ctx}
    fb = FastDiT(model, fused=True).blocks[0]  # fuse_linears on the meta weights: the real fused shapes
    cuda = {k: (getattr(fb, k).out_features, getattr(fb, k).in_features) for k in ("qkvg", "wo", "w13", "w2")}
    io = {n: (getattr(model, n).out_features, getattr(model, n).in_features) for n in ("in_proj", "out_proj")}
    return {"cuda": cuda, "cpu": cpu, "context": {n.split(".")[-1]: own[n] for n in is_ctx}, "io": io}


def forward_items(cfg: ModelConfig, shapes: dict, block: str, rows: int, S: int, ctx: int) -> list[Item]:
    """One velocity forward of `rows` CFG rows of S (padded) positions, block linears `block`."""
    L = cfg.num_layers
    items = [gemm(n, rows * S, N, K, L) for n, (N, K) in shapes[block].items()]
    items += [gemm(n, rows * S, N, K, 1, int4=False) for n, (N, K) in shapes["io"].items()]
    items.append(attention(rows, S, ctx, cfg.model_dim, L))
    if block == "cuda":  # the fused elementwise kernels and the final norm: launches only
        items.append({"name": "elementwise", "count": ELEMENTWISE_PER_BLOCK * L + 1, "flops": 0})
        items[-1]["parts"] = same_parts(0)
    return items


def codec_rows(kwargs: dict[str, Any]) -> tuple[list[Item], int]:
    """Each decoder conv for one second of audio (25 latent frames, one pass) with the Snake before
    it; and the decode path's weight bytes (fp16), read once per pass / window."""
    codec = DACVAE.from_kwargs(kwargs, device="meta")
    names = {m: n for n, m in codec.named_modules()}
    rows: list[Item] = []
    snake = [0]

    def hook(mod: nn.Module, inp: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
        x = inp[0]
        if isinstance(mod, Snake):
            snake[0] += 2 * 2 * x.numel()  # read and write, fp16
            return
        assert isinstance(mod, nn.Conv1d | nn.ConvTranspose1d)
        (cin, t_in), (cout, t_out), k = x.shape[1:], out.shape[1:], mod.kernel_size[0]
        t_mac = t_in if isinstance(mod, nn.ConvTranspose1d) else t_out  # a transposed conv scatters inputs
        name = names[mod].replace("decoder.", "").replace(".block", "").replace("wm_model.encoder_", "")
        rows.append(
            {"name": name, "cin": cin, "cout": cout, "kernel": k, "stride": mod.stride[0], "t_out": t_out,
             "flops": 2 * cin * cout // mod.groups * k * t_mac, "act_bytes": 2 * (cin * t_in + cout * t_out),
             "snake_bytes": snake[0]}
        )  # fmt: skip
        snake[0] = 0

    convs: list[nn.Module] = [codec.quantizer.out_proj]
    convs += [m for m in codec.decoder.modules() if isinstance(m, nn.Conv1d | nn.ConvTranspose1d)]
    for m in [*convs, *(m for m in codec.decoder.modules() if isinstance(m, Snake))]:
        m.register_forward_hook(hook)
    with torch.no_grad():
        z = torch.empty(1, codec.config.codebook_dim, FRAMES_PER_SECOND, device="meta")
        codec.decoder(codec.quantizer.out_proj(z))
    return rows, 2 * sum(p.numel() for m in convs for p in m.parameters())


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def table(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows])


def dit_section(args: argparse.Namespace, cfg: ModelConfig) -> dict[str, Any]:
    """The DiT's GEMM, per-step and per-line tables; returns their rows and the CPU's sentence-1 cost."""
    shapes = dit_shapes(cfg)
    fast = FastSampler(FastDiT(build_model(cfg, device="meta"), fused=False))  # its buckets
    preset = base_preset("cuda")
    scfg = SamplerConfig(steps=preset.steps, schedule=preset.schedule, sway_coeff=preset.sway_coeff)
    # v2's guidance with a reference voice: every condition whose default scale is > 0
    enabled = tuple(n for n in ("text", "speaker") if getattr(scfg, f"cfg_scale_{n}") > 0)
    plan = plan_sampling(scfg, enabled)
    step_rows = [len(plan.groups[s.group]) if s.group >= 0 else 1 for s in plan.steps]
    ctx_rows = len(plan.groups[0]) if plan.groups else 1  # context K/V of the guided group's rows
    chars = [len(s) for s in json.loads(NEWS5_JSON.read_text())["sentences"]]
    ref = int(args.ref_seconds * FRAMES_PER_SECOND) // (cfg.latent_patch_size * cfg.speaker_patch_size)
    spk_pad = round_up(ref + 1, fast.context_bucket)  # + the summary token
    gpu = {"tflops": args.tflops, "bw": args.tbs * 1e12, "launch_us": args.launch_us}
    print(
        f"H200: {args.tflops:g} TFLOP/s, {args.tbs:g} TB/s, {args.launch_us:g} us a kernel (assumed). "
        f"{len(plan.steps)} {preset.schedule} steps, CFG rows per step {step_rows}; frames padded to "
        f"{fast.frame_bucket}, context to {fast.context_bucket} (text + {spk_pad} speaker keys for "
        f"{args.ref_seconds:g} s of reference); int4 group {GROUP}.\n"
    )
    gemms: list[Item] = []
    steps: list[Item] = []
    lines: list[Item] = []
    cpu_items: list[Item] = []  # sentence 1 on the model's own (unfused) blocks, as the CPU runs it
    for i, sec in enumerate(args.seconds):
        frames = round(sec * FRAMES_PER_SECOND)
        tokens = 1 + max(1, round(chars[i % len(chars)] / 1.25))  # news5.py's ApproxTokenizer, + BOS
        s_pad = round_up(frames, fast.frame_bucket * cfg.latent_patch_size)
        text_pad = round_up(tokens, fast.context_bucket)
        S, ctx = s_pad // cfg.latent_patch_size, text_pad + spk_pad
        line = {"line": i + 1, "seconds": sec, "frames": frames, "s_pad": s_pad, "text_tokens": tokens}
        line |= {"text_pad": text_pad, "keys": S + ctx}
        pad = {"text": text_pad, "speaker": spk_pad}
        items = [
            gemm(n, ctx_rows * pad[n.split("_")[1]], N, K, cfg.num_layers)
            for n, (N, K) in shapes["context"].items()
        ]
        cpu_line = list(items)
        for rows in sorted(set(step_rows), reverse=True):
            n = step_rows.count(rows)
            fw = forward_items(cfg, shapes, "cuda", rows, S, ctx)
            items += [it | {"count": it["count"] * n} for it in fw]
            cpu_fw = forward_items(cfg, shapes, "cpu", rows, S, ctx)
            cpu_line += [it | {"count": it["count"] * n} for it in cpu_fw]
            steps.append(line | {"rows": rows, "M": rows * S, "n_steps": n})
            steps[-1] |= {f: cost(fw, f, **gpu) for f in FORMATS}
            for it in fw:
                if it["name"] in shapes["cuda"]:
                    one = it | {"count": 1, "line": i + 1, "guided": rows > 1}
                    gemms.append(one | {f: cost([one], f, **gpu) for f in FORMATS})
        line |= {f: cost(items, f, **gpu) for f in FORMATS}
        lines.append(line)
        cpu_items = cpu_items or cpu_line

    print("## DiT GEMMs per forward (fast path on CUDA; us per GEMM, one layer)\n")
    seen, rows_out = set(), []
    for g in gemms:
        if (g["name"], g["M"]) in seen or not (g["guided"] or args.all_rows):
            continue
        seen.add((g["name"], g["M"]))
        b, w4, sc = (g[f] for f in FORMATS)
        saved = (b["bytes"] - w4["bytes"]) / (args.tbs * 1e6)
        us = [x * 1e6 for x in (b["compute"], b["memory"], w4["memory"], sc["memory"])]
        us += [x * 1e6 for x in (b["floor"], w4["floor"], sc["floor"])]
        intensity = [g["flops"] / b["bytes"], g["flops"] / w4["bytes"]]
        rows_out.append([g["name"], g["M"], g["N"], g["K"], g["flops"] / 1e9, *intensity, *us, saved])
    heads = ["GEMM", "M", "N", "K", "GFLOP", "FLOP/B bf16", "FLOP/B int4", "compute us", "mem us bf16"]
    heads += ["mem us int4", "mem us scratch", "floor us bf16", "floor us int4", "floor us scratch"]
    print(table([*heads, "int4 saves us"], sorted(rows_out, key=lambda r: (r[1], r[0]))))

    print("\n## Per step (one forward: the layers' GEMMs and attention, in/out proj, fused elementwise)\n")
    heads = ["line", "CFG rows", "M", "keys", "GFLOP", "MB bf16", "MB int4", "compute us", "mem us bf16"]
    heads += ["mem us int4", "kernels d / e", "floor us bf16", "floor us int4", "floor us scratch"]
    rows_out = [
        [s["line"], s["rows"], s["M"], s["keys"], s["bf16"]["flops"] / 1e9, s["bf16"]["bytes"] / 1e6]
        + [s["int4"]["bytes"] / 1e6, s["bf16"]["compute"] * 1e6, s["bf16"]["memory"] * 1e6]
        + [s["int4"]["memory"] * 1e6, f"{s['bf16']['kernels']:.0f} / {s['scratch']['kernels']:.0f}"]
        + [s[f]["floor"] * 1e6 for f in FORMATS]
        for s in steps
    ]
    print(table(heads, rows_out))

    print("\n## Per line (all steps + the context K/V) and news5: floors vs measured sampling ms\n")
    keys = ["GFLOP", "compute ms", "mem ms bf16", "mem ms int4", "launch ms (d)", "floor ms (d)"]
    keys += ["floor ms int4", "floor ms scratch (e)", "measured (d)", "measured (e)"]
    total = dict.fromkeys(keys, 0.0)
    rows_out = []
    for ln, md, me in zip(lines, args.measured_sampling_ms_bf16, args.measured_sampling_ms):
        b, w4, sc = (ln[f] for f in FORMATS)
        v = [b["flops"] / 1e9] + [x * 1e3 for x in (b["compute"], b["memory"], w4["memory"], b["launch"])]
        v += [x * 1e3 for x in (b["floor"], w4["floor"], sc["floor"])] + [md, me]
        ln["summary"] = dict(zip(keys, v))
        for k, x in zip(keys, v):
            total[k] += x
        frames, text = f"{ln['frames']} -> {ln['s_pad']}", f"{ln['text_tokens']} -> {ln['text_pad']}"
        rows_out.append([ln["line"], f"{ln['seconds']:g}", frames, text, *v, md / v[5], me / v[7]])
    t = list(total.values())
    rows_out.append(["news5", f"{sum(args.seconds):g}", "", "", *t, t[8] / t[5], t[9] / t[7]])
    heads = ["line", "audio s", "frames", "text tokens", *keys, "(d) / floor", "(e) / scratch floor"]
    print(table(heads, rows_out))
    cpu_costs = {
        k: cost(cpu_items, "bf16", tf, args.cpu_gbs * 1e9, 0.0)
        for k, tf in (("peak", args.cpu_peak_tflops), ("achievable", args.cpu_tflops))
    }
    config = {"steps_per_line": len(plan.steps), "step_rows": step_rows, "speaker_keys": spk_pad}
    config |= {"frame_bucket": fast.frame_bucket, "context_bucket": fast.context_bucket, "shapes": shapes}
    return config | {"gemms": gemms, "steps": steps, "lines": lines, "news5": total, "cpu_dit": cpu_costs}


def codec_section(args: argparse.Namespace, kwargs: dict[str, Any], dit: dict[str, Any]) -> dict[str, Any]:
    convs, weights = codec_rows(kwargs)
    gf = sum(r["flops"] for r in convs) / 1e9
    gb = sum(r["act_bytes"] + r["snake_bytes"] for r in convs) / 1e9
    print("\n## Codec decoder per second of audio (one pass, fp16 activations)\n")
    keys = ("name", "cin", "cout", "kernel", "stride", "t_out")
    rows = [
        [*(r[k] for k in keys), r["flops"] / 1e9, r["act_bytes"] / 1e6, r["snake_bytes"] / 1e6] for r in convs
    ]
    heads = ["conv", "Cin", "Cout", "k", "stride", "T out", "GFLOP", "act MB in+out", "Snake MB before"]
    print(table(heads, [*rows, ["total", "", "", "", "", "", gf, gb * 1e3, ""]]))

    def decode(frames: list[int], chunk: int | None, first: int | None) -> tuple[float, float]:
        """(GFLOP, GB) of decoding lines of `frames`: one pass each, or the stream's windows."""
        wins = [
            [(0, 0, f, f)] if chunk is None else chunk_windows(f, chunk, RECEPTIVE_FIELD_FRAMES, first)
            for f in frames
        ]
        seconds = sum(hi - lo for w in wins for lo, _, _, hi in w) / FRAMES_PER_SECOND
        return gf * seconds, gb * seconds + weights / 1e9 * sum(map(len, wins))

    frames = [ln["frames"] for ln in dit["lines"]]
    audio = sum(frames) / FRAMES_PER_SECOND
    gpu, cpu = base_preset("cuda"), base_preset("cpu")
    stream = (gpu.stream_chunk_frames, gpu.stream_first_chunk_frames)
    gpu_rows = []
    for what, (f, b), ms in (
        ("one pass per line", decode(frames, None, None), args.measured_codec_ms[0]),
        (f"streamed {stream[1]}/{stream[0]}", decode(frames, *stream), args.measured_codec_ms[1]),
    ):
        c, m = f / args.tflops, b / args.tbs  # GFLOP / (TFLOP/s) and GB / (TB/s) are ms
        gpu_rows.append([what, audio, f, b, c, m, max(c, m), ms, ms / max(c, m)])
    print(f"\nDecode weights {weights / 1e6:.0f} MB (fp16), read once per pass / window. H200, news5:\n")
    heads = ["decode", "audio s", "GFLOP", "GB", "compute ms", "memory ms", "floor ms", "measured ms"]
    print(table([*heads, "x floor"], gpu_rows))

    a1, cd = frames[0] / FRAMES_PER_SECOND, dit["cpu_dit"]
    print(
        f"\n## CPU, news5 sentence 1 ({a1:g} s): 16 cores, AMX-BF16 peak {args.cpu_peak_tflops:.1f} "
        f"TFLOP/s (vendor-style, assumed), achievable {args.cpu_tflops:g} TFLOP/s, {args.cpu_gbs:g} GB/s\n"
    )
    dit_row = [cd["peak"]["flops"] / 1e9, cd["peak"]["bytes"] / 1e9]
    cpu_rows = [
        ["DiT (8 steps + context)", *dit_row, cd["peak"]["floor"] * 1e3, cd["achievable"]["floor"] * 1e3]
    ]
    cpu_rows[0].append(args.measured_cpu_dit_ms)
    stream = (cpu.stream_chunk_frames, cpu.stream_first_chunk_frames)
    for what, (f, b), ms in (
        ("codec one pass", decode(frames[:1], None, None), ""),
        (f"codec streamed {stream[1]}/{stream[0]}", decode(frames[:1], *stream), args.measured_cpu_codec_ms),
    ):
        mem = b / args.cpu_gbs * 1e3  # GB / (GB/s) is s
        cpu_rows.append([what, f, b, max(f / args.cpu_peak_tflops, mem), max(f / args.cpu_tflops, mem), ms])
    d, s = cpu_rows[0], cpu_rows[2]
    line = [d[1] + s[1], d[2] + s[2], d[3] + s[3], d[4] + s[4], d[5] + s[5]]
    cpu_rows += [["line (DiT + streamed codec)", *line], ["RTF", "", "", *(x / a1 / 1e3 for x in line[2:])]]
    heads = ["part", "GFLOP", "GB", "floor ms at peak", "floor ms achievable", "measured ms", "x achievable"]
    print(table(heads, [[*r, r[5] / r[4] if isinstance(r[5], float) else ""] for r in cpu_rows]))
    out = {"convs": convs, "gflop_per_s": gf, "gb_per_s": gb, "weight_bytes": weights}
    return out | {"gpu": gpu_rows, "cpu": cpu_rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add = ap.add_argument
    add("--smoke", action="store_true", help="the tiny-random configs")
    add("--seconds", type=floats, default=[1.48, 7.60, 10.08, 4.72, 4.72], help="news5's audio s")
    add("--ref-seconds", type=float, default=10.0, help="reference voice length")
    add("--measured-sampling-ms", type=floats, default=[9.6, 12.5, 13.5, 10.8, 10.8], help="(e)")
    add("--measured-sampling-ms-bf16", type=floats, default=[7.8, 10.9, 11.5, 9.0, 9.0], help="(d)")
    add("--measured-codec-ms", type=floats, default=[27.9, 51.0], help="news5: one pass, streamed")
    add("--tflops", type=float, default=790.0, help="H200 dense bf16 / fp16 TFLOP/s (assumed)")
    add("--tbs", type=float, default=4.8, help="H200 HBM TB/s")
    add("--launch-us", type=float, default=2.5, help="us a kernel in a CUDA graph (assumed)")
    add("--cpu-peak-tflops", type=float, default=1024 * 2.0e9 * 16 / 1e12, help="AMX-BF16 peak")
    add("--cpu-tflops", type=float, default=4.0, help="achievable CPU bf16 TFLOP/s")
    add("--cpu-gbs", type=float, default=200.0, help="CPU memory GB/s")
    add("--measured-cpu-dit-ms", type=float, default=518.0, help="sentence 1: text encoder + sampling")
    add("--measured-cpu-codec-ms", type=float, default=449.0, help="sentence 1: streamed decode")
    add("--all-rows", action="store_true", help="GEMM table at every M, not only the guided steps'")
    add("--json", type=Path, help="write every row here")
    args = ap.parse_args()
    if args.smoke:
        cfg, codec_kwargs = ModelConfig.from_dict(TINY_CONFIGS["v2"]), TINY_CODEC_KWARGS
    else:
        cfg = ModelConfig.from_dict(json.loads(V2_MANIFEST.read_text())["config"])
        codec_kwargs = FULL_CODEC_KWARGS
    print(f"# Roofline: {'tiny-random (smoke)' if args.smoke else 'full-size'} {cfg.family}, news5\n")
    dit = dit_section(args, cfg)
    codec = codec_section(args, codec_kwargs, dit)
    if args.json:
        out = {"smoke": args.smoke, "model": cfg.to_dict(), "group_size": GROUP, "dit": dit, "codec": codec}
        args.json.write_text(json.dumps(out, indent=1, default=str))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
