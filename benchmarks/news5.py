"""news5 end to end, side by side in ONE run: the reference-equivalent path vs our presets.

Full 500M v2 configuration with random weights plus the full-size codec (random), the five
sentences of benchmarks/data/news5.json, a 10 s reference voice, the engine's seconds
estimate for every mode, warm-up before timing. Per sentence and in total: generation
time (DiT + codec), audio length, RTF, time to first audio, peak GPU memory.

Modes (a)-(e) need CUDA; (f) runs our CPU preset on the machine's CPU. On Apple
Silicon, `--device mps` runs the reference and our MPS preset (not run here: no Mac).
Modes (m)-(q) are the v4.1-Small-MF release (random full-size weights from its manifest:
the ModernBERT backbone, MeanFlow 4 steps, no CFG): (m) the reference-equivalent path, (n)
our CUDA preset bf16, (o) int4, (p) our CPU preset; side by side with the v2 modes in one run.
(q) and (r) are (e) and (o) with the (B, C, T) codec decoder (the CUDA preset decodes
channels-last since 2026-12-04). (h) and (w) are (d) and (n) with the DiT's linears as W8A8 FP8
(`--fp8`, engine/quant/fp8.py: e4m3 weights per channel, activations per token, `_scaled_mm`;
needs compute capability 8.9+; with --smoke the FP8 GEMMs are emulated on the CPU).
Modes (s)-(v) are v4-Large (random full-size weights of its 3.29B-parameter manifest: the T5Gemma
2 text encoder, RF with CFG; written for the H200, a 13 GB fp32 file): (s) the reference-equivalent
path at upstream's default 40 linear steps, (t) the same at 8 sway steps (as upstream's demo runs
it), (u) our CUDA preset bf16, (v) int4. Targets (issue 31): (u) >= 8x faster than (t); (v) RTF
<= 0.05 with first audio <= 30 ms. Its text lengths use the llm-jp ratio too (Gemma 3's on
Japanese news is not measured here).

    python benchmarks/news5.py                      # all v2 modes on CUDA, then (f) on the CPU
    python benchmarks/news5.py --modes a,b,d,e      # a subset
    python benchmarks/news5.py --family v4.1-mf     # the v4.1-MF modes (m, n, o, p) and v2 (e)
    python benchmarks/news5.py --family v4-large    # the v4-Large modes (s, t, u, v)
    python benchmarks/news5.py --device mps         # Apple Silicon (fp32, sway 8)

Weights are random, so the audio is noise: this measures speed and memory, not quality.
The text tokenizer is approximated (the real llm-jp-3 tokenizer.json is not available on
the benchmark machines): one token per 1.25 characters plus BOS, the ratio of llm-jp-3 on
Japanese news text, so the text lengths the model sees are realistic.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import platform
import sys
import time
import traceback
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from irodori_speaker.engine.backbone_config import parse_backbone_config  # noqa: E402
from irodori_speaker.engine.checkpoint import (  # noqa: E402
    build_model,
    config_from_metadata,
    read_header,
    save_checkpoint,
)
from irodori_speaker.engine.codec import FULL_CODEC_KWARGS, load_codec  # noqa: E402
from irodori_speaker.engine.config import BackboneConfig, InferenceConfig, ModelConfig  # noqa: E402
from irodori_speaker.options import SynthesisOptions  # noqa: E402
from irodori_speaker.synthesis.loading import load_synthesizer  # noqa: E402
from irodori_speaker.synthesis.synthesizer import Synthesizer  # noqa: E402
from irodori_speaker.synthesis.voices import Voice, save_latent  # noqa: E402
from irodori_speaker.text.length import estimate_seconds  # noqa: E402

#: The five news sentences (benchmarks/data/README.md says where they come from).
NEWS5_JSON = REPO / "benchmarks" / "data" / "news5.json"
#: Tensor manifest of the released 500M v2 model (its config builds the random full-size file).
V2_MANIFEST = REPO / "tests" / "data" / "dit" / "v2_500m_keys.json"
#: ... and of the v4.1-Small-MF release (its config and the ModernBERT-ja-310m backbone's).
MF_MANIFEST = REPO / "tests" / "data" / "dit_v4" / "v4_1_small_mf_keys.json.gz"
#: ... and of v4-Large (its config and the T5Gemma 2 encoder's, tests/data/dit_v4_large/README.md).
LARGE_MANIFEST = REPO / "tests" / "data" / "dit_v4_large" / "v4_large_keys.json.gz"
FAMILIES = ("v2", "v4.1-mf", "v4-large")
WORK = Path(os.environ.get("BENCH_WORK", "/tmp/irodori-news5"))


class ApproxTokenizer:
    """Token ids of llm-jp-3-like length (1 per 1.25 chars + BOS), deterministic per text."""

    fingerprint = "approx-llm-jp-3: 1 token per 1.25 chars + BOS"

    def __init__(self, vocab: int) -> None:
        self.vocab = vocab

    def encode(self, text: str) -> list[int]:
        n = max(1, round(len(text) / 1.25))
        g = np.random.default_rng(zlib.crc32(text.encode()))  # str hash() differs per process
        return [1, *g.integers(8, self.vocab, n).tolist()]

    def batch(self, texts, max_len=None, pad_to=None):
        rows = [self.encode(t)[: max_len or None] for t in texts]
        L = pad_to or max(map(len, rows))
        ids = torch.full((len(rows), L), 4, dtype=torch.long)
        mask = torch.zeros(len(rows), L, dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r[:L])
            mask[i, : len(r)] = True
        return ids, mask


@dataclass
class Mode:
    key: str
    desc: str
    device: str
    dtype: torch.dtype
    codec_dtype: torch.dtype
    steps: int
    schedule: str
    fast: bool
    graphs: bool
    pad_text: int | None
    stream_chunk: int | None  # None: decode the whole line (first audio = end of generation);
    #  else streamed: a first chunk of this many frames, then the preset's 25-frame chunks
    int4: bool = False
    fp8: bool = False  # the DiT's linears as W8A8 FP8 (preset field fp8)
    int4_codec: bool = False
    family: str = "v2"  # which release's configuration (FAMILIES)
    codec_cl: bool | None = None  # the channels-last codec decoder (None: the preset's choice)
    # results (not init fields: `replace` gives each derived mode its own)
    rows: list[dict] = field(default_factory=list, init=False)
    peak_mb: float = field(default=float("nan"), init=False)
    load_peak_mb: float = field(default=float("nan"), init=False)
    load_s: float = field(default=float("nan"), init=False)
    warm_s: float = field(default=float("nan"), init=False)
    prewarm: dict = field(default_factory=dict, init=False)


def modes_for(device: str) -> dict[str, Mode]:
    """The side-by-side modes: the reference-equivalent path and our presets, for `device`."""
    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    ref = Mode(
        "a", "reference: fp32, 40 linear, eager, text padded 256, codec fp32", device, f32, f32,
        steps=40, schedule="linear", fast=False, graphs=False, pad_text=256, stream_chunk=None,
    )  # fmt: skip
    ours = replace(ref, steps=8, schedule="sway", fast=True, pad_text=None, stream_chunk=8)
    b = replace(ref, key="b", desc="(a) at 8 sway steps", steps=8, schedule="sway")
    # v4.1-MF: 4 MeanFlow steps, no CFG (what the release runs; schedule is not read)
    mf_ref = replace(
        ref, key="m", desc="v4.1-MF reference: fp32, 4 MeanFlow steps, eager, text padded 256, codec fp32",
        steps=4, family="v4.1-mf",
    )  # fmt: skip
    mf_ours = replace(mf_ref, fast=True, pad_text=None, stream_chunk=8)
    # v4-Large: RF with CFG; upstream's default is 40 linear steps, its demo 8 sway
    large_ref = replace(
        ref, key="s", desc="v4-Large reference: fp32, 40 linear, eager, text padded 256, codec fp32",
        family="v4-large",
    )  # fmt: skip
    large_ours = replace(large_ref, steps=8, schedule="sway", fast=True, pad_text=None, stream_chunk=8)
    if device == "mps":
        d = replace(
            ours, key="d", desc="our MPS preset: fp32, 8 sway, fast path, trimmed text, streamed decode"
        )
        mf_mps = replace(mf_ours, key="n", desc="v4.1-MF on our MPS preset: fp32, 4 MF steps, fast path")
        return {"a": ref, "b": b, "d": d, "m": mf_ref, "n": mf_mps}
    cuda = replace(ours, dtype=bf16, codec_dtype=f16, graphs=True)
    mf_cuda = replace(mf_ours, dtype=bf16, codec_dtype=f16, graphs=True)
    large_cuda = replace(large_ours, dtype=bf16, codec_dtype=f16, graphs=True)
    return {
        "s": large_ref,
        "t": replace(large_ref, key="t", desc="(s) at 8 sway steps", steps=8, schedule="sway"),
        "u": replace(large_cuda, key="u", desc="v4-Large on our CUDA preset, bf16 weights (8 sway, graphs)"),
        "v": replace(large_cuda, key="v", desc="v4-Large on our CUDA preset, int4 DiT (W4A16)", int4=True),
        "m": mf_ref,
        "n": replace(mf_cuda, key="n", desc="v4.1-MF on our CUDA preset, bf16 weights (4 MF steps, graphs)"),
        "o": replace(mf_cuda, key="o", desc="v4.1-MF on our CUDA preset, int4 DiT (W4A16)", int4=True),
        "w": replace(mf_cuda, key="w", desc="v4.1-MF on our CUDA preset, FP8 DiT (W8A8 e4m3)", fp8=True),
        "p": replace(
            mf_ours, key="p", desc="v4.1-MF on our CPU preset (its picks), 4 MF steps", device="cpu"
        ),
        "a": ref,
        "b": b,
        "c": replace(
            b, key="c", desc="(b) in bf16 (DiT bf16, codec bf16), eager", dtype=bf16, codec_dtype=bf16
        ),
        "d": replace(
            cuda,
            key="d",
            desc="our CUDA preset, bf16 weights: fused, AdaLN precomputed, CUDA graphs, trimmed text, "
            "codec fp16 streamed",
        ),
        "e": replace(
            cuda, key="e", desc="our CUDA preset, int4 weights (W4A16, bf16 activations)", int4=True
        ),
        "h": replace(
            cuda, key="h", desc="our CUDA preset, FP8 DiT (W8A8 e4m3, per-token activations)", fp8=True
        ),
        "q": replace(
            cuda,
            key="q",
            desc="(e) with the (B, C, T) codec decoder (the preset's before 2026-12-04)",
            int4=True,
            codec_cl=False,
        ),
        "r": replace(
            mf_cuda, key="r", desc="(o) with the (B, C, T) codec decoder", int4=True, codec_cl=False
        ),
        "g": replace(
            cuda, key="g", desc="(e) with the int4 codec too (smallest memory)", int4=True, int4_codec=True
        ),
        "f": replace(
            ours,
            key="f",
            desc="our CPU preset (its picks for this CPU), 8 sway, trimmed text, streamed",
            device="cpu",
        ),
    }


def _full_config(family: str) -> ModelConfig:
    """The released configuration of `family` (from its tensor manifest in tests/data)."""
    if family == "v2":
        return ModelConfig.from_dict(json.loads(V2_MANIFEST.read_text())["config"])
    with gzip.open(LARGE_MANIFEST if family == "v4-large" else MF_MANIFEST, "rt", encoding="utf-8") as f:
        manifest = json.load(f)
    backbone = parse_backbone_config(manifest["text_encoder_config"])
    return ModelConfig.from_dict(manifest["config"], text_backbone=backbone)


def _smoke_config(family: str) -> ModelConfig:
    from irodori_speaker.engine.tiny import TINY_BACKBONE, TINY_BACKBONES, TINY_CONFIGS

    if family == "v2":
        return ModelConfig.from_dict(dict(TINY_CONFIGS["v2"], model_dim=128, num_heads=4))
    if family == "v4-large":
        backbone = parse_backbone_config(dict(TINY_BACKBONES["v4-large"]))
        return ModelConfig.from_dict(TINY_CONFIGS["v4-large"], text_backbone=backbone)
    return ModelConfig.from_dict(
        TINY_CONFIGS["v4.1-mf"], text_backbone=BackboneConfig.from_dict(TINY_BACKBONE)
    )


def prepare_files(
    int4: bool | set[str], smoke: bool = False, families: set[str] | None = None
) -> dict[str, Path]:
    """Random full-size DiT (fp32) and codec files, made once; the int4 file by our RTN quantiser.

    One DiT per family in `families` (keys "dit" / "int4" for v2, "dit:v4.1-mf" / "int4:v4.1-mf");
    `int4` (True: every family, or a set of families) says which get an int4 file.
    `smoke`: the tiny-random configurations instead (a quick check of this script on any CPU).
    """
    families = families or {"v2"}
    int4_families = set(families) if int4 is True else set(int4 or ())
    work = WORK / ("smoke" if smoke else "full")
    work.mkdir(parents=True, exist_ok=True)
    files = {"codec": work / "codec_random.safetensors", "ref": work / "ref10s.safetensors"}
    codec_kwargs = FULL_CODEC_KWARGS
    if smoke:
        from irodori_speaker.engine.codec import TINY_CODEC_KWARGS

        codec_kwargs = TINY_CODEC_KWARGS
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    for family in sorted(families):
        stem = "v2" if family == "v2" else family.replace(".", "_").replace("-", "_")
        suffix = "" if family == "v2" else f":{family}"
        dit, packed = work / f"{stem}_random.safetensors", work / f"{stem}_random_int4.safetensors"
        files["dit" + suffix], files["int4" + suffix] = dit, packed
        if not dit.exists():
            cfg = _smoke_config(family) if smoke else _full_config(family)
            torch.manual_seed(0)
            model = build_model(cfg, device=dev)
            inference = (
                InferenceConfig(max_text_len=256)
                if family == "v2"
                else InferenceConfig(max_text_len=256, max_caption_len=512, ref_max_seconds=120.0)
            )
            save_checkpoint(model, dit, inference=inference)
            del model
        if family in int4_families and not packed.exists():
            from irodori_speaker.engine.quant.quantize import quantize_checkpoint

            quantize_checkpoint(dit, packed, method="rtn", report_errors=False, device=dev)
    if not files["codec"].exists():
        from irodori_speaker.engine.codec import convert_codec, save_random_codec_pth

        pth = work / "codec_random.pth"
        save_random_codec_pth(pth, codec_kwargs, seed=0, watermark=False)
        convert_codec(pth, files["codec"])
        pth.unlink()
    if not files["ref"].exists():  # a 10 s voice-like signal, encoded once with the fp32 codec
        t = np.arange(10 * 48_000) / 48_000
        f0 = 180 + 30 * np.sin(2 * np.pi * 0.7 * t)
        phase = 2 * np.pi * np.cumsum(f0) / 48_000
        wave = sum(np.sin(k * phase) / k for k in range(1, 12)) * (
            0.5 + 0.5 * np.sin(2 * np.pi * 2.5 * t) ** 2
        )
        wave = (0.1 * wave / np.sqrt(np.mean(wave**2))).astype(np.float32)
        codec = load_codec(files["codec"], device=dev)
        with torch.inference_mode():
            x = torch.from_numpy(wave)[None, None].to(codec.device)
            save_latent(codec.encode(x)[0], files["ref"])
        del codec
    return files


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def device_ms(device: str, fn, *args, reps: int = 20, **kwargs) -> float:
    """Median ms of `reps` calls of `fn(*args, **kwargs)` after two warm-up calls: CUDA events on
    CUDA (the GPU's time, launches overlapped), else the host clock around each synchronised call."""
    for _ in range(2):
        fn(*args, **kwargs)
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args, **kwargs)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn(*args, **kwargs)
            sync(device)
            times.append(1e3 * (time.perf_counter() - t0))
    return sorted(times)[len(times) // 2]


def _header_meta(path: Path) -> tuple[dict[str, str], str]:
    return read_header(path)[0], str(path)


def build(
    mode: Mode, files: dict[str, Path], int4_impl: str = "auto", **preset: object
) -> tuple[Synthesizer, Voice]:
    """The Synthesizer of `mode` as users get it (`load_synthesizer`: the product's DiT and codec
    loaders, its preset with the mode's overrides and `preset`), with the approximate tokenizer,
    and the voice."""
    suffix = "" if mode.family == "v2" else f":{mode.family}"
    dit = files[("int4" if mode.int4 else "dit") + suffix]
    cfg, _ = config_from_metadata(*_header_meta(dit))
    overrides = {
        "steps": mode.steps,
        "schedule": mode.schedule,
        "fast_path": mode.fast,
        "cuda_graphs": mode.graphs,
        "codec_graphs": mode.graphs,
        "int4": mode.int4,
        "codec_int4": mode.int4_codec,
        # on the CPU (--smoke) the preset refuses fp8: the same swap is made after loading, emulated
        "fp8": mode.fp8 and mode.device == "cuda",
    }
    if mode.stream_chunk is not None:
        overrides["stream_first_chunk_frames"] = mode.stream_chunk
    # our CPU preset picks its precision and tricks from the CPU's flags (docs/backends.md): left
    # to it, so (f) / (p) measure what a user of that CPU gets
    preset_picks = mode.device == "cpu" and mode.fast
    if not preset_picks and mode.codec_cl is not None:
        overrides["codec_channels_last"] = mode.codec_cl
    synth = load_synthesizer(
        dit,
        codec=files["codec"],
        tokenizer=ApproxTokenizer(cfg.text_token_vocab),
        backend=mode.device,
        dtype=None if preset_picks else mode.dtype,
        codec_dtype=None if preset_picks else mode.codec_dtype,
        voice_cache_dir=False,
        **overrides,
        **preset,
    )
    if mode.fp8 and mode.device != "cuda":
        from irodori_speaker.engine.quant.fp8 import quantize_linears_fp8

        quantize_linears_fp8(synth.model, align=8)  # the tiny models' 184-wide MLPs too
    if mode.int4 and int4_impl != "auto":  # a measurement knob of the int4 kernel's chooser
        from irodori_speaker.engine.quant.layers import Int4Linear

        for m in synth.model.modules():
            if isinstance(m, Int4Linear):
                m.impl = int4_impl
    return synth, Voice.from_latent(files["ref"])


def run_mode(
    mode: Mode, files: dict[str, Path], sentences: list[str], seed: int, int4_impl: str, **preset: object
) -> None:
    gc.collect()
    if mode.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    synth, voice = build(mode, files, int4_impl, **preset)
    sync(mode.device)
    mode.load_s = time.perf_counter() - t0
    if mode.device == "cuda":  # peak while loading (e.g. the float codec before it is packed) ...
        mode.load_peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
        torch.cuda.reset_peak_memory_stats()  # ... then the peak while running (weights included)
    opts = SynthesisOptions(seed=seed, pad_text_to=mode.pad_text)
    if mode.family != "v2":  # MeanFlow: the mode's steps (schedule and guidance are not read)
        opts = opts.replace(steps=mode.steps)

    def options_for(text: str) -> SynthesisOptions:
        # random weights make the v4 duration predictor's lengths arbitrary: every family gets the
        # frames v2 gets (the seconds estimate), so the modes compare the same work
        return opts if mode.family == "v2" else opts.replace(seconds=estimate_seconds(text))

    def one(text: str) -> dict:
        line_opts = options_for(text)
        sync(mode.device)
        t_start = time.perf_counter()
        if mode.stream_chunk is None:
            res = synth.synthesize(text, voice, line_opts)
            sync(mode.device)
            t_end = time.perf_counter()
            ttfa, samples, rec = t_end - t_start, len(res.audio), res.record
        else:
            stream = synth.stream(text, voice, line_opts)
            first = None
            samples = 0
            for chunk in stream:
                if first is None:
                    sync(mode.device)
                    first = time.perf_counter() - t_start
                samples += len(chunk)
            sync(mode.device)
            t_end = time.perf_counter()
            ttfa, rec = first, stream.record
        gen = t_end - t_start
        audio = samples / 48_000
        return {
            "gen_s": gen,
            "audio_s": audio,
            "rtf": gen / audio,
            "ttfa_s": ttfa,
            "frames": rec.frames,
            "cond_s": rec.timings.get("duration", 0.0),  # text encoder + length choice
            "sampling_s": rec.timings.get("sampling", 0.0),
            "decode_s": rec.timings.get("decode", 0.0),
        }

    t0 = time.perf_counter()
    if mode.fast:  # the product's warm-up: graphs for every bucket up to prewarm_seconds, codec windows
        synth.prewarm(voice)
        mode.prewarm = synth.prewarm_report
    warm = sentences if mode.key != "a" else sentences[:1]
    for text in warm:  # warm-up: kernel selection, autotune, graph capture for these buckets
        one(text)
    mode.warm_s = time.perf_counter() - t0
    mode.rows = [one(text) for text in sentences]
    if mode.device == "cuda":
        mode.peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20


def print_tables(modes: list[Mode], sentences: list[str]) -> dict:
    # each family's reference: (a) v2, (m) v4.1-MF, (t) v4-Large at 8 sway (the target base)
    refs = {m.family: sum(r["gen_s"] for r in m.rows) for m in modes if m.key in ("a", "m", "t")}
    cols = "mode | sentence | chars | audio s | gen ms | text ms | sampling ms | decode ms | RTF | TTFA ms"
    print(f"\n| {cols} |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m in modes:
        for i, r in enumerate(m.rows):
            print(
                f"| {m.key} | {i + 1} | {len(sentences[i])} | {r['audio_s']:.2f} | {1e3 * r['gen_s']:.1f} | "
                f"{1e3 * r['cond_s']:.1f} | {1e3 * r['sampling_s']:.1f} | {1e3 * r['decode_s']:.1f} | "
                f"{r['rtf']:.4f} | "
                f"{1e3 * r['ttfa_s']:.1f} |"
            )
    print(
        "\n| mode | what | total gen s | audio s | RTF | TTFA 1st ms | peak MiB (load) | x vs (a)/(m)/(t) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    summary = {}
    for m in modes:
        total = sum(r["gen_s"] for r in m.rows)
        audio = sum(r["audio_s"] for r in m.rows)
        ref_total = refs.get(m.family)
        ratio = ref_total / total if ref_total else float("nan")
        summary[m.key] = {
            "desc": m.desc,
            "total_gen_s": total,
            "audio_s": audio,
            "rtf": total / audio,
            "ttfa_first_s": m.rows[0]["ttfa_s"],
            "peak_mb": m.peak_mb,
            "load_peak_mb": m.load_peak_mb,
            "vs_a": ratio,
            "load_s": m.load_s,
            "warm_s": m.warm_s,
            "prewarm": {k: v for k, v in m.prewarm.items() if k != "voice"},
            "rows": m.rows,
        }
        print(
            f"| {m.key} | {m.desc} | {total:.3f} | {audio:.2f} | {total / audio:.4f} | "
            f"{1e3 * m.rows[0]['ttfa_s']:.1f} | {m.peak_mb:.0f} ({m.load_peak_mb:.0f}) | {ratio:.1f} |"
        )
    if "b" in summary:
        for k in ("d", "e", "h", "g", "n", "o", "w"):
            if k in summary:
                print(f"({k}) vs (b): {summary['b']['total_gen_s'] / summary[k]['total_gen_s']:.1f}x")
    if "m" in summary:
        for k in ("n", "o", "w", "p", "e"):
            if k in summary:
                print(f"({k}) vs (m): {summary['m']['total_gen_s'] / summary[k]['total_gen_s']:.1f}x")
    for fp8_key, bf16_key, int4_key in (("h", "d", "e"), ("w", "n", "o")):  # FP8 beside bf16 and int4
        if fp8_key in summary and bf16_key in summary:
            f8 = summary[fp8_key]["total_gen_s"]
            line = f"({fp8_key}) FP8 vs ({bf16_key}) bf16: {summary[bf16_key]['total_gen_s'] / f8:.2f}x"
            if int4_key in summary:
                line += f", vs ({int4_key}) int4: {summary[int4_key]['total_gen_s'] / f8:.2f}x"
            print(line + " (above 1: FP8 faster)")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default=None, help="which modes, in this order (default: the family's)")
    ap.add_argument(
        "--family",
        default="v2",
        choices=["v2", "v4.1-mf", "v4-large", "all"],
        help="v2: modes a,b,d,e,h,g,c,f; v4.1-mf: m,n,o,w,e,p (v2's (e) side by side); v4-large: "
        "s,t,u,v; all: v2 and v4.1-mf",
    )
    ap.add_argument(
        "--int4-impl",
        default="auto",
        choices=["auto", "kernel", "scratch"],
        help="Int4Linear path for (e): auto = the measured per-shape choice (tunes on first use)",
    )
    ap.add_argument("--device", default="cuda", choices=["cuda", "mps"])
    ap.add_argument("--cpu-sentences", type=int, default=5, help="sentences for mode (f) on the CPU")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="the preset's max_batch (default: its own): what prewarming line batches costs one stream",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="tiny random model, every mode on the CPU (checks the script, times nothing useful)",
    )
    args = ap.parse_args()
    if args.device == "mps":
        os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")
    sentences = json.loads(NEWS5_JSON.read_text())["sentences"]
    table = modes_for(args.device)
    default_modes = {
        "v2": "a,b,d,e,h,g,c,f",
        "v4.1-mf": "m,n,o,w,e,p",
        "v4-large": "s,t,u,v",
        "all": "a,b,d,e,h,g,c,m,n,o,w,f,p",
    }
    chosen = [table[k] for k in (args.modes or default_modes[args.family]).split(",") if k in table]
    if args.smoke:
        for m in chosen:
            m.device, m.graphs = "cpu", False
            if m.dtype != torch.float32 and not m.int4:
                m.dtype = m.codec_dtype = torch.bfloat16
            if m.int4:
                m.dtype, m.codec_dtype = torch.float32, torch.float32
    files = prepare_files(
        int4={m.family for m in chosen if m.int4}, smoke=args.smoke, families={m.family for m in chosen}
    )
    done = []
    for m in chosen:
        print(f"running ({m.key}) {m.desc}", flush=True)
        try:
            texts = sentences if m.device != "cpu" else sentences[: args.cpu_sentences]
            run_mode(m, files, texts, args.seed, args.int4_impl, max_batch=args.max_batch)
            done.append(m)
            total = sum(r["gen_s"] for r in m.rows)
            print(  # a line per finished mode, so a run cut short still reports what it measured
                f"  ({m.key}) total gen {total:.3f} s, TTFA 1st {1e3 * m.rows[0]['ttfa_s']:.1f} ms, "
                f"peak {m.peak_mb:.0f} MiB, load {m.load_s:.1f} s, warm-up {m.warm_s:.1f} s",
                flush=True,
            )
        except Exception:  # report and go on: one broken mode must not cost the others' numbers
            traceback.print_exc()
    chosen = done
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor()
    batch = "" if args.max_batch is None else f"  max_batch {args.max_batch}"
    print(f"\n# news5  {gpu}  torch {torch.__version__}  {time.strftime('%Y-%m-%d %H:%M')}{batch}")
    summary = print_tables(chosen, sentences)
    out = os.environ.get("OUT")
    if out:
        Path(out, "news5.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
