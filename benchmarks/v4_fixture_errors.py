"""How far our v4 / v4.1-MF engine is from the reference on its golden cases (CPU, fp32).

    python benchmarks/v4_fixture_errors.py

Prints the max absolute error of every golden output in tests/data/dit_v4 (backbone states,
conditions, velocity, duration, every sampler case) next to the tests' tolerance (1e-4): the
fixture-error table of issue 14. The tests assert the tolerance; this prints the values.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "engine"))
from v4_cases import KINDS, encode, load_kind, sampler_settings

from irodori_speaker.engine.sampler import SamplerConfig, sample


def err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def rows_for(kind: str) -> list[tuple[str, float]]:
    model, io, cases, _ = load_kind(kind)
    out: list[tuple[str, float]] = []
    with torch.inference_mode():
        backbone = model.pretrained_text_backbone
        for what in ("text", "caption"):
            got = backbone(io[f"{what}_input_ids"], io[f"{what}_mask"])
            out.append((f"{what} backbone state", err(got, io[f"out_{what}_backbone_state"])))
        conds = encode(model, io)
        for name in ("text_state", "speaker_state", "caption_state"):
            out.append((name.replace("_", " "), err(getattr(conds, name), io[f"out_{name}"])))
        dt = {"dt": io["t"] - io["r"]} if kind == "v4_1_mf" else {}
        v = model.velocity(io["x_t"], io["t"], conds, io["latent_mask"], **dt)
        out.append(("velocity" if not dt else "average velocity", err(v, io["out_velocity"])))
        pred = model.predict_log_frames(
            conds, has_speaker=io["duration_has_speaker"], has_caption=io["duration_has_caption"]
        )
        out.append(("duration (log frames)", err(pred, io["out_duration_log_frames"])))
        for case, spec in cases.items():
            c = encode(model, io, prefix=f"sample_{case}_")
            got = sample(model, c, io[f"sample_{case}_noise"], SamplerConfig(**sampler_settings(spec)))
            out.append((f"sampler {case} ({spec['conditions']})", err(got, io[f"sample_{case}_out"])))
    return out


def main() -> None:
    print("| fixture | output | max abs error | tolerance |")
    print("|---|---|---|---|")
    worst = 0.0
    for kind in KINDS:
        for name, e in rows_for(kind):
            worst = max(worst, e)
            print(f"| {kind} | {name} | {e:.2e} | 1e-4 |")
    print(f"\nworst: {worst:.2e}")


if __name__ == "__main__":
    main()
