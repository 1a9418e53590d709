"""Shared helpers for the tests that read the golden DiT fixtures."""

from __future__ import annotations

import json

from safetensors import safe_open
from safetensors.torch import load_file

from irodori_speaker.engine.checkpoint import load_checkpoint

KINDS = ["v2_base", "v2_voicedesign", "v3_base", "v3_voicedesign"]
# fixture sampler-case key -> SamplerConfig field
CASE_KEYS = {"num_steps": "steps", "t_schedule_mode": "schedule", "cfg_guidance_mode": "guidance"}


def load_kind(dit_fixtures, kind):
    """(model, io tensors, sampler cases) of one fixture kind."""
    model = load_checkpoint(dit_fixtures / f"tiny_{kind}.safetensors").model
    io_path = dit_fixtures / f"tiny_{kind}_io.safetensors"
    with safe_open(str(io_path), "pt") as f:
        cases = json.loads(f.metadata()["sampler_cases"])
    return model, load_file(str(io_path)), cases


def case_settings(case: dict) -> dict:
    """A fixture sampler case as SamplerConfig keyword arguments."""
    return {CASE_KEYS.get(k, k): v for k, v in case.items() if k != "sequence_length"}


def encode(model, io, rows=slice(None)):
    """encode_conditions on the fixture inputs (the given batch rows)."""

    def get(k):
        return io[k][rows] if k in io else None

    return model.encode_conditions(
        get("text_input_ids"),
        get("text_mask"),
        get("ref_latent"),
        get("ref_mask"),
        get("caption_input_ids"),
        get("caption_mask"),
    )
