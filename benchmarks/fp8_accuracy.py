"""FP8 (W8A8 e4m3, emulated) against bf16 and int4 on the tiny random models, on the CPU: the final
latent's relative error against the same model in fp32 (issue 27: FP8's accuracy stated like int4's).

For each of v2, v4.1-MF and v4-Large (the tiny-random kinds `engine.tiny` builds): the fp32 model's
final latent for a few seeds (text, a reference voice, a caption where the family has one; 8 sway
steps, 4 MeanFlow steps for v4.1-MF), then the same with
- bf16: the whole model in bf16 (what the CUDA preset runs);
- int4 RTN: our RTN int4 file of it, loaded in fp32 (what `--int4` makes of a float file);
- fp8 token / fp8 tensor: `quantize_linears_fp8` (the int4 layer selection) with activations scaled
  per token (the default) or per tensor, fp32 otherwise; the GEMMs emulated exactly as
  `torch._scaled_mm` computes them (e4m3 products summed in fp32);
- fp8 bf16: the bf16 model with FP8 linears, against the fp32 model (what `--fp8` runs on a GPU).

The tiny models' random weights are not trained ones (no outlier channels, every range filled), and
their layers are few and narrow: the figures say the paths are right and how FP8 ranks beside int4
and bf16, not what the full-size release loses (that needs the real weights on the H200).

    python benchmarks/fp8_accuracy.py            # 4 seeds per family
    python benchmarks/fp8_accuracy.py --seeds 2
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.engine.quant.checkpoint import load_int4_model
from irodori_speaker.engine.quant.fp8 import Fp8Linear, quantize_linears_fp8
from irodori_speaker.engine.quant.quantize import quantize_checkpoint
from irodori_speaker.engine.tiny import random_line_latent, tiny_random_files

KINDS = ("v2", "v4.1-mf", "v4-large")
COLUMNS = ("bf16", "int4 RTN", "fp8 token", "fp8 tensor", "fp8 bf16")


def fp8_model(model, *, scaling: str = "token", dtype: torch.dtype = torch.float32):
    q = copy.deepcopy(model).to(dtype)
    swap = quantize_linears_fp8(q, act_scaling=scaling, align=8)  # emulated: any width will do
    assert swap.swapped and not swap.kept, swap.kept
    return q


def errors(kind: str, seeds: range, workdir: Path) -> tuple[dict[str, tuple[float, float]], int]:
    path = tiny_random_files(kind).model
    ref = load_checkpoint(path).model
    want = [random_line_latent(ref, s, frames=48) for s in seeds]
    int4_file = workdir / f"{kind}-int4.safetensors"
    quantize_checkpoint(
        path, int4_file, method="rtn", report_errors=False, packing="fp16-rest"
    )  # as --int4 at load
    variants = {
        "bf16": load_checkpoint(path, dtype=torch.bfloat16).model,
        "int4 RTN": load_int4_model(int4_file, dtype="fp32").model,
        "fp8 token": fp8_model(ref),
        "fp8 tensor": fp8_model(ref, scaling="tensor"),
        "fp8 bf16": fp8_model(ref, dtype=torch.bfloat16),
    }
    n_fp8 = sum(isinstance(m, Fp8Linear) for m in variants["fp8 token"].modules())
    out = {}
    for name, model in variants.items():
        got = [random_line_latent(model, s, frames=48) for s in seeds]
        errs = [float((g - w).norm() / w.norm()) for g, w in zip(got, want)]
        out[name] = (sum(errs) / len(errs), max(errs))
    return out, n_fp8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of {', '.join(KINDS)}")
    args = ap.parse_args()
    torch.set_num_threads(1)
    seeds = range(args.seeds)
    print(f"# final latent vs the fp32 model, relative L2, {args.seeds} seeds: mean / max")
    head = f"{'model':10s} {'fp8 layers':>10s} " + " ".join(f"{c:>15s}" for c in COLUMNS)
    print(head)
    print("-" * len(head))
    with tempfile.TemporaryDirectory() as d:
        for kind in args.kinds.split(","):
            errs, n = errors(kind, seeds, Path(d))
            cells = " ".join(f"{errs[c][0]:7.4f}/{errs[c][1]:7.4f}" for c in COLUMNS)
            print(f"{kind:10s} {n:10d} {cells}")


if __name__ == "__main__":
    main()
