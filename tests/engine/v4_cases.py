"""Shared helpers for the tests that read the golden v4 / v4.1-MF fixtures (tests/data/dit_v4)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from dit_cases import CASE_KEYS
from safetensors import safe_open
from safetensors.torch import load_file

from irodori_speaker.engine.checkpoint import load_checkpoint

V4_DATA = Path(__file__).resolve().parents[1] / "data" / "dit_v4"
KINDS = ["v4", "v4_1_mf"]
RELEASES = {"v4_small": 766_052_385, "v4_1_small_mf": 773_261_345}


def load_kind(kind: str):
    """(model, io tensors, sampler cases, io notes) of one fixture kind."""
    model = load_checkpoint(V4_DATA / f"tiny_{kind}.safetensors").model
    io_path = V4_DATA / f"tiny_{kind}_io.safetensors"
    with safe_open(str(io_path), "pt") as f:
        meta = f.metadata()
    return model, load_file(str(io_path)), json.loads(meta["sampler_cases"]), json.loads(meta["io_notes"])


def manifest(release: str) -> dict:
    with gzip.open(V4_DATA / f"{release}_keys.json.gz", "rt", encoding="utf-8") as f:
        return json.load(f)


def sampler_settings(case: dict) -> dict:
    """A fixture sampler case as SamplerConfig keyword arguments."""
    skip = {"sampler", "sequence_length", "seed", "conditions"}
    return {CASE_KEYS.get(k, k): v for k, v in case.items() if k not in skip}


def encode(model, io, prefix="", rows=slice(None), ref=True, caption=True):
    """encode_conditions on the stored inputs (`prefix` picks a sampler case's)."""

    def get(name):
        return io[f"{prefix}{name}"][rows]

    return model.encode_conditions(
        get("text_input_ids"),
        get("text_mask"),
        get("ref_latent") if ref else None,
        get("ref_mask") if ref else None,
        get("caption_input_ids") if caption else None,
        get("caption_mask") if caption else None,
    )
