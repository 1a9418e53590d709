"""The CPU preset's after-load step: int8 linears in the DiT.

bf16 needs no step here (the loaders read `Preset.dtype` / `codec_dtype`), nor does the
channels-last decoder (`codec_channels_last`: the Synthesizer switches it on, as on CUDA).
`apply_cpu_tricks(model, preset)` does what the preset's `int8_linears` asks, where the
model is on the CPU, and says what it did. The loader calls it once after loading
(`synthesis.loading.load_dit`); benchmarks and tests call it on models they loaded themselves.
"""

from __future__ import annotations

from typing import Any

from ..quant.int8 import quantize_linears_int8

__all__ = ["apply_cpu_tricks", "apply_int8_linears"]


def _device_type(module: Any) -> str | None:
    device = getattr(module, "device", None)
    if device is None:
        param = next(iter(module.parameters()), None) if hasattr(module, "parameters") else None
        device = None if param is None else param.device
    return None if device is None else getattr(device, "type", str(device))


def apply_int8_linears(model: Any) -> int:
    """The DiT's per-step linears as `engine.quant.int8.Int8Linear` (CPU only); how many were swapped."""
    if _device_type(model) != "cpu":
        return 0
    return quantize_linears_int8(model)


def apply_cpu_tricks(model: Any, preset: Any) -> dict[str, Any]:
    """Do what `preset` asks of the loaded `model` (the DiT); returns what was done,
    e.g. {"int8_linears": 96} (nothing for a field that is off)."""
    done: dict[str, Any] = {}
    if getattr(preset, "int8_linears", False) and model is not None:
        done["int8_linears"] = apply_int8_linears(model)
    return done
