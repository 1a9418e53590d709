"""Our int4 for v4-Large on the tiny random Large model: the final latent's relative error against
the fp32 model (RTN, GPTQ; the T5Gemma 2 embedding table float or packed), and what the packing
makes of the full-size release (from the tensor manifest, no weights needed).

The tiny model's random weights fill every 4-bit range and its layers are few and narrow, so its
errors say that the path is right, not what the trained release loses (that needs the real
weights on the H200: benchmarks/memory_gpu.py / profile_line.py).

    python benchmarks/int4_large_tiny.py
"""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import torch

from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.engine.quant.checkpoint import load_int4_model
from irodori_speaker.engine.quant.quantize import (
    RELEASE_SELECTION,
    LayerSelection,
    plan_layers,
    quantize_checkpoint,
)
from irodori_speaker.engine.quant.selection import COMPACT_SELECTION, int4_file_bytes
from irodori_speaker.engine.tiny import random_line_latent, tiny_random_files
from irodori_speaker.text.backbone_tokenizer import tokenizer_for_model

MANIFEST = Path(__file__).resolve().parents[1] / "tests" / "data" / "dit_v4_large" / "v4_large_keys.json.gz"


def full_size_bytes() -> list[tuple[str, float]]:
    """Bytes of the full-size Large: fp32, bf16, and our int4 file (release selection, embedding
    packed or fp16): 0.5 B per weight plus each group of 32's scale and zero; and the compact
    packing's file (`int4_file_bytes`, benchmarks/int4_pack.py)."""
    with gzip.open(MANIFEST, "rt", encoding="utf-8") as f:
        tensors = {k: tuple(v) for k, v in json.load(f)["tensors"].items()}
    shapes = {k[: -len(".weight")]: v for k, v in tensors.items() if k.endswith(".weight")}
    plan = plan_layers(shapes, RELEASE_SELECTION)
    n_all = sum(torch.Size(v).numel() for v in tensors.values())

    def int4_bytes(embed_packed: bool) -> float:
        total = 0.0
        for k, v in tensors.items():
            n = torch.Size(v).numel()
            name = k[: -len(".weight")] if k.endswith(".weight") else None
            if name in plan.gptq:  # nibbles, an fp16 scale and a 4-bit zero per group
                total += n * 0.5 + n / 32 * (2 + 0.5)
            elif name in plan.embed and embed_packed:  # RTN nibbles: fp16 scale and zero
                total += n * 0.5 + n / 32 * (2 + 2)
            else:
                total += n * 2
        return total

    return [
        ("fp32", n_all * 4.0),
        ("bf16", n_all * 2.0),
        ("int4, embedding fp16", int4_bytes(False)),
        ("int4, embedding packed", int4_bytes(True)),
        ("int4 compact (the rest RTN)", float(sum(int4_file_bytes(tensors, COMPACT_SELECTION)))),
    ]


def main() -> None:
    files = tiny_random_files("v4-large")
    ref = load_checkpoint(files.model).model
    tok = tokenizer_for_model(None, files.model, ref.cfg.text_backbone)
    seeds = range(4)
    want = [random_line_latent(ref, s) for s in seeds]
    tiny_embed = LayerSelection(
        gptq=RELEASE_SELECTION.gptq, embed=RELEASE_SELECTION.embed, embed_group_size=16
    )
    print("# tiny random v4-Large (hidden 48): relative error of the final latent vs fp32, 8 sway steps,")
    print("# text + reference + caption, 4 seeds (mean / max)")
    print(f"{'method':6s} {'embedding':22s} {'mean':>7s} {'max':>7s}")
    with tempfile.TemporaryDirectory() as d:
        for method in ("rtn", "gptq"):
            for label, sel in (("float (fp16)", RELEASE_SELECTION), ("packed (groups of 16)", tiny_embed)):
                out = Path(d) / f"{method}.safetensors"
                quantize_checkpoint(
                    files.model, out, method=method, layers=sel, tokenizer=tok, report_errors=False,
                    fallback="keep",
                )  # fmt: skip
                q = load_int4_model(out, dtype="fp32").model
                errs = [float((random_line_latent(q, s) - w).norm() / w.norm()) for s, w in zip(seeds, want)]
                print(f"{method:6s} {label:22s} {sum(errs) / len(errs):7.4f} {max(errs):7.4f}")
    print("\n# full-size v4-Large weights (manifest: 3,288,179,489 parameters)")
    for label, b in full_size_bytes():
        print(f"{label:28s} {b / 2**30:6.2f} GiB")


if __name__ == "__main__":
    main()
