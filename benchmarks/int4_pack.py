"""Int4 packings side by side: "fp16-rest" (the release's GPTQ layers, everything else fp16: our
older files) and "compact" (those layers RTN-packed too, as the seed Irodori-TTS-Lite's
dit_int4.safetensors does), on the tiny random v2, v4.1-MF and v4-Large models; then the file
size each makes of the full-size releases (from the tensor manifests, no weights needed).

Per group of layers: the relative weight error ||W_q - W|| / ||W|| of what the file holds
(fp16 rounding where the layer stays float), and the final latent's relative error against the
fp32 model (8 sway steps with text, reference and, where the model has one, caption; 4 seeds).
The tiny models' random weights fill every 4-bit range and their layers are few and narrow, so
the errors say that each path is right and how the packings compare, not what the trained
release loses (that needs the real weights).

    python benchmarks/int4_pack.py
"""

from __future__ import annotations

import gzip
import json
import re
import tempfile
from pathlib import Path

import torch

from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.engine.quant.checkpoint import load_int4_model
from irodori_speaker.engine.quant.quantize import PACKINGS, quantize_checkpoint
from irodori_speaker.engine.quant.selection import SEED_DIT_INT4_BYTES, int4_file_bytes
from irodori_speaker.engine.sampler import SamplerConfig
from irodori_speaker.engine.tiny import random_line_latent, tiny_random_files
from irodori_speaker.text.backbone_tokenizer import tokenizer_for_model

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
MANIFESTS = {
    "v2 (500M)": DATA / "dit" / "v2_500m_keys.json",
    "v3 (500M)": DATA / "dit" / "v3_500m_keys.json",
    "v4.1-MF": DATA / "dit_v4" / "v4_1_small_mf_keys.json.gz",
    "v4-Large": DATA / "dit_v4_large" / "v4_large_keys.json.gz",
}
GROUPS = (  # first match wins
    ("embeddings", r".*(text_embedding|tok_embeddings|embed_tokens)\.weight"),
    ("adaln", r"blocks\.\d+\.(attention|mlp)_adaln\..*\.weight"),
    ("attention", r"blocks\.\d+\.attention\.(wq|wk|wv|wo|gate|w[kv]_\w+)\.weight"),
    ("mlp", r"blocks\.\d+\.mlp\..*\.weight"),
    ("cond", r"(delta_)?cond_module\..*\.weight"),
    ("in/out proj", r"(in_proj|out_proj)\.weight"),
    ("text encoder", r"(text_encoder|caption_encoder|pretrained_text_backbone)\..*\.weight"),
    ("speaker enc.", r"speaker_encoder\..*\.weight"),
    ("duration", r"duration_predictor\..*\.weight"),
)


def _latent(model, seed: int) -> torch.Tensor:
    return random_line_latent(model, seed, cfg=SamplerConfig(steps=8, schedule="sway"))


def manifest(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open() as f:
        return json.load(f)


def group_errors(ref: dict[str, torch.Tensor], got: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per group: ||W_q - W|| / ||W|| over all its 2-D weights."""
    num: dict[str, float] = {}
    den: dict[str, float] = {}
    for k, w in ref.items():
        if w.dim() != 2:
            continue
        group = next((g for g, p in GROUPS if re.fullmatch(p, k)), None)
        if group is None:
            continue
        num[group] = num.get(group, 0.0) + float((got[k].float() - w.float()).pow(2).sum())
        den[group] = den.get(group, 0.0) + float(w.float().pow(2).sum())
    return {g: (num[g] / den[g]) ** 0.5 for g in num if den[g] > 0}


def tiny_table(kind: str, methods: tuple[str, ...] = ("rtn", "gptq")) -> None:
    files = tiny_random_files(kind)
    ref = load_checkpoint(files.model).model
    tok = (
        tokenizer_for_model(None, files.model, ref.cfg.text_backbone)
        if ref.cfg.pretrained_text
        else files.tokenizer
    )
    seeds = range(4)
    want = [_latent(ref, s) for s in seeds]
    ref_state = ref.state_dict()
    rows = {}
    with tempfile.TemporaryDirectory() as d:
        for method in methods:
            for packing in PACKINGS:
                out = Path(d) / f"{method}-{packing}.safetensors"
                quantize_checkpoint(
                    files.model, out, method=method, packing=packing, tokenizer=tok, report_errors=False
                )
                q = load_int4_model(out, dtype="fp32").model
                errs = [float((_latent(q, s) - w).norm() / w.norm()) for s, w in zip(seeds, want)]
                expanded = load_int4_model(out, dtype="fp32", dequantize="all").model.state_dict()
                rows[(method, packing)] = (group_errors(ref_state, expanded), errs, out.stat().st_size)
    groups = [g for g, _ in GROUPS if g in rows[(methods[0], "compact")][0]]
    print(f"\n## tiny random {kind}: relative weight error per group, final latent vs fp32 (4 seeds)")
    head = f"{'method':6s} {'packing':9s} " + " ".join(f"{g:>12s}" for g in groups)
    print(head + f" {'latent mean':>11s} {'max':>7s} {'file':>9s}")
    for (method, packing), (ge, errs, size) in rows.items():
        cells = " ".join(f"{ge.get(g, 0.0):12.2e}" for g in groups)
        mean = sum(errs) / len(errs)
        print(f"{method:6s} {packing:9s} {cells} {mean:11.4f} {max(errs):7.4f} {size / 1024:7.0f} KB")


def size_table() -> None:
    print("\n## full-size files from the tensor manifests (tensors exact, header estimated)")
    print(f"the seed's v2 dit_int4.safetensors: {SEED_DIT_INT4_BYTES:,d} bytes")
    print(
        f"{'model':10s} {'parameters':>14s} {'fp16-rest':>15s} {'compact':>15s} "
        f"{'compact MiB':>11s} {'B/param':>7s}"
    )
    for label, path in MANIFESTS.items():
        m = manifest(path)
        meta = {"config_json": json.dumps(m["config"])}
        size = {p: sum(int4_file_bytes(m["tensors"], sel, metadata=meta)) for p, sel in PACKINGS.items()}
        n = m["num_parameters"]
        print(
            f"{label:10s} {n:14,d} {size['fp16-rest']:15,d} {size['compact']:15,d} "
            f"{size['compact'] / 2**20:11.1f} {size['compact'] / n:7.3f}"
        )
    print(f"the seed: {SEED_DIT_INT4_BYTES / 494_993_952:.3f} bytes a parameter (v2)")


def main() -> None:
    for kind in ("v2", "v4.1-mf", "v4-large"):
        tiny_table(kind)
    size_table()


if __name__ == "__main__":
    main()
