"""Where a line's time goes on the GPU, and whether the fast path is still right at full size.

    python benchmarks/profile_line.py                      # every section
    python benchmarks/profile_line.py --sections accuracy  # accuracy | stages | kernels | codec

- accuracy: the full-size config of `--family` (v2's 500M by default, v4.1-mf, v4-large) with random
  weights (the file news5.py makes), one 8 s line, 8 sway steps with guidance: the final latent of
  each fast variant (unfused / fused, eager / CUDA graphs, bf16, int4) against the fp32 reference
  loop, as a relative L2 error.
- stages: news5 modes (`--modes`, default d and e; n and o are v4.1-MF), per-sentence stage
  timings from the synthesizer's record.
- kernels: one line of each of those modes under torch.profiler: GPU kernels launched, GPU busy
  time against wall time, the top kernels.
- codec: decode of the full line and of one stream window (16 and 66 frames) per dtype, eager,
  with cudnn.benchmark, and CUDA-graphed when the codec offers it.
Writes `$OUT/profile_line.json` when OUT is set. GPU only (weights random: speed and error only).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import news5

from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.engine.codec import load_codec, stream_window_lengths
from irodori_speaker.engine.fast import FastDiT, FastSampler
from irodori_speaker.engine.quant.checkpoint import load_int4_model
from irodori_speaker.engine.sampler import SamplerConfig, draw_noise, sample
from irodori_speaker.options import SynthesisOptions
from irodori_speaker.synthesis.voices import load_latent

DEV = torch.device("cuda")
FAMILY = ["v2"]  # --family: the accuracy section's model
SENTENCES = json.loads(news5.NEWS5_JSON.read_text())["sentences"]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def gpu_ms(fn, reps: int = 10) -> float:
    """Median wall time of fn() in ms, synchronised (includes launch cost: what a line pays)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def line_inputs(model, files, text: str, frames: int, seed: int = 7):
    tok = news5.ApproxTokenizer(model.cfg.text_token_vocab)
    ids, mask = tok.batch([text])
    ref = load_latent(files["ref"], model.cfg.latent_dim)[None].to(DEV, model.in_proj.weight.dtype)
    with torch.inference_mode():
        conds = model.encode_conditions(ids.to(DEV), mask.to(DEV), ref, None)
    return conds, draw_noise(seed, 1, frames, model.cfg.latent_dim, device=DEV)


def section_accuracy(files) -> dict:
    cfg = SamplerConfig(steps=8, schedule="sway")
    text, frames = SENTENCES[2], 200
    suffix = "" if FAMILY[0] == "v2" else f":{FAMILY[0]}"
    model = load_checkpoint(files["dit" + suffix], dtype=torch.float32, device=DEV).model
    conds, noise = line_inputs(model, files, text, frames)
    with torch.inference_mode():
        ref = sample(model, conds, noise, cfg)
    out = {}
    for name, fused, graphs in [
        ("fp32 fast unfused eager", False, False),
        ("fp32 fast fused eager", True, False),
        ("fp32 fast fused graphs", True, True),
    ]:
        sampler = FastSampler(FastDiT(model, fused=fused), use_graphs=graphs)
        out[name] = rel(sampler.sample(conds, noise, cfg), ref)
    del model, sampler
    torch.cuda.empty_cache()
    for name, path in [
        ("bf16 fast fused graphs", files["dit" + suffix]),
        ("int4 (bf16 act) fast fused graphs", files["int4" + suffix]),
    ]:
        load = load_int4_model if path == files["int4" + suffix] else load_checkpoint
        m = load(path, dtype=torch.bfloat16, device=DEV).model
        c, _ = line_inputs(m, files, text, frames)
        out[name] = rel(FastSampler(m).sample(c, noise, cfg), ref)
        del m
        torch.cuda.empty_cache()
    print(
        f"\n| variant (full-size {FAMILY[0]}, random weights, 8 s line, 8 sway steps) "
        "| rel. L2 error of the latent vs the fp32 reference |"
    )
    print("|---|---|")
    for k, v in out.items():
        print(f"| {k} | {v:.2e} |")
    return out


def build(key: str, files):
    mode = news5.modes_for("cuda")[key]
    synth, voice = news5.build(mode, files)
    return mode, synth, voice


def one_line(synth, voice, text: str) -> dict:
    opts = SynthesisOptions(seed=1234)
    if synth.config.family.startswith("v4"):  # random weights: v2's seconds estimate, as news5 does
        opts = opts.replace(seconds=news5.estimate_seconds(text))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    stream = synth.stream(text, voice, opts)
    first = None
    for _chunk in stream:
        if first is None:
            first = time.perf_counter() - t0
    torch.cuda.synchronize()
    total = time.perf_counter() - t0
    t = {k: round(1e3 * v, 2) for k, v in stream.record.timings.items()}
    return {"total_ms": round(1e3 * total, 2), "ttfa_ms": round(1e3 * first, 2), **t}


MODES = ["d", "e"]  # --modes


def section_stages(files) -> dict:
    out = {}
    for key in MODES:
        mode, synth, voice = build(key, files)
        for text in SENTENCES:
            one_line(synth, voice, text)  # warm-up: graphs for these buckets
        rows = [one_line(synth, voice, text) for text in SENTENCES]
        out[key] = rows
        print(f"\n({key}) {mode.desc}")
        for r in rows:
            print("  ", r)
        del synth
        torch.cuda.empty_cache()
    return out


def section_kernels(files) -> dict:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for key in MODES:
        _, synth, voice = build(key, files)
        for text in SENTENCES[:2]:
            one_line(synth, voice, text)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            one_line(synth, voice, SENTENCES[1])
        wall = 1e3 * (time.perf_counter() - t0)
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        busy = sum(e.device_time for e in kernels) / 1e3
        by_name: dict[str, list[float]] = {}
        for e in kernels:
            by_name.setdefault(e.name[:90], []).append(e.device_time)
        top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:15]
        out[key] = {
            "wall_ms": wall,
            "kernels": len(kernels),
            "gpu_busy_ms": busy,
            "top": [(n, len(v), sum(v) / 1e3) for n, v in top],
        }
        print(
            f"\n({key}) one line (sentence 2): {len(kernels)} kernels, "
            f"GPU busy {busy:.1f} ms, wall {wall:.1f} ms"
        )
        for n, c, ms in out[key]["top"]:
            print(f"   {ms:8.2f} ms  {c:6d}x  {n}")
        del synth
        torch.cuda.empty_cache()
    return out


def codec_times(codec, latent: torch.Tensor, stream_only: bool = False) -> dict:
    def stream():
        return list(codec.decode_stream(latent, 50, first_chunk_frames=8))

    with torch.inference_mode():
        row = (
            {}
            if stream_only
            else {
                "full 190": gpu_ms(lambda: codec.decode(latent)),
                "window 16": gpu_ms(lambda: codec.decode(latent[:, :16])),
                "window 66": gpu_ms(lambda: codec.decode(latent[:, :66])),
            }
        )
        row["stream 190 (8 then 50)"] = gpu_ms(stream, reps=5)
    return row


def codec_ops(files, window: torch.Tensor) -> list:
    """Which codec ops (with their input shapes) take the GPU time of one eager window decode."""
    from torch.profiler import ProfilerActivity, profile

    codec = load_codec(files["codec"], device=DEV, dtype=torch.float16)
    with torch.inference_mode():
        codec.decode(window)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            codec.decode(window)
            torch.cuda.synchronize()
    skip = ("aten::conv1d", "aten::convolution", "aten::_convolution", "aten::conv_transpose1d")
    rows = [e for e in prof.key_averages(group_by_input_shape=True) if e.key.startswith("aten::")]
    top = sorted((e for e in rows if e.key not in skip), key=lambda e: -e.device_time_total)[:12]
    print("\n  ops of one 66-frame window (fp16, eager): GPU us, calls, op, input shapes")
    out = []
    for e in top:
        print(f"   {e.device_time_total:9.1f} {e.count:4d}  {e.key}  {str(e.input_shapes)[:100]}")
        out.append((e.key, e.count, e.device_time_total, str(e.input_shapes)))
    return out


def section_codec(files) -> dict:
    out = {}
    latent = torch.randn(1, 190, 32, device=DEV)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        codec = load_codec(files["codec"], device=DEV, dtype=dtype)
        for bench in (False, True):
            torch.backends.cudnn.benchmark = bench
            out[f"{dtype} cudnn.benchmark={bench}"] = codec_times(codec, latent)
        torch.backends.cudnn.benchmark = False
        if hasattr(codec, "use_graphs"):
            codec.use_graphs(True, capture_on_use=None)  # as the synthesizer: prewarmed windows
            codec.prewarm_graphs(stream_window_lengths(50, first_chunk_frames=8))
            out[f"{dtype} graphs"] = codec_times(codec, latent, stream_only=True)
        del codec
        torch.cuda.empty_cache()
    ops = codec_ops(files, latent[:, :66])
    print("\n| codec (full size, random), ms | full 190 | window 16 | window 66 | stream 190 (8 then 50) |")
    print("|---|---|---|---|---|")
    for k, row in out.items():
        cells = [row.get(c) for c in ("full 190", "window 16", "window 66", "stream 190 (8 then 50)")]
        print(f"| {k} | " + " | ".join("" if v is None else f"{v:.2f}" for v in cells) + " |")
    out["ops of one 66-frame window, fp16 eager"] = ops
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sections", default="accuracy,stages,kernels,codec")
    ap.add_argument("--modes", default="d,e", help="news5 modes for stages and kernels (n, o: v4.1-MF)")
    ap.add_argument("--family", default="v2", choices=["v2", "v4.1-mf", "v4-large"], help="accuracy's model")
    args = ap.parse_args()
    MODES[:] = args.modes.split(",")
    FAMILY[0] = args.family
    table = news5.modes_for("cuda")
    timed = "stages" in args.sections or "kernels" in args.sections
    families = {args.family} | {table[k].family for k in MODES if timed}
    files = news5.prepare_files(int4=True, families=families)
    print(
        f"# profile_line  {torch.cuda.get_device_name()}  torch {torch.__version__}  "
        f"{time.strftime('%Y-%m-%d %H:%M')}"
    )
    results = {}
    for name in args.sections.split(","):
        t0 = time.perf_counter()
        try:
            results[name] = globals()[f"section_{name}"](files)
        except Exception as e:  # one broken section must not cost the others
            import traceback

            traceback.print_exc()
            results[name] = {"error": repr(e)}
        print(f"# section {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "profile_line.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
