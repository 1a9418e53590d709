"""The CPU preset's after-load steps: int8 linears in the DiT, the channels-last CPU decoder.

bf16 needs no step here (the loaders read `Preset.dtype` / `codec_dtype`). The other two change
loaded modules: `apply_cpu_tricks(model, codec, preset)` does what the preset's `int8_linears` and
`cpu_codec` ask, where the model / codec is on the CPU, and says what it did. The loader calls it
once after loading (synthesizer.load_synthesizer); benchmarks and tests call it on models they
loaded themselves.
"""

from __future__ import annotations

from typing import Any

__all__ = ["apply_cpu_codec", "apply_cpu_tricks", "apply_int8_linears"]


def _device_type(module: Any) -> str | None:
    device = getattr(module, "device", None)
    if device is None:
        param = next(iter(module.parameters()), None) if hasattr(module, "parameters") else None
        device = None if param is None else param.device
    return None if device is None else getattr(device, "type", str(device))


def apply_int8_linears(model: Any) -> int:
    """The DiT's per-step linears as `quant.int8.Int8Linear` (CPU only); how many were swapped."""
    if _device_type(model) != "cpu":
        return 0
    from ..quant.int8 import quantize_linears_int8

    return quantize_linears_int8(model)


def apply_cpu_codec(codec: Any) -> bool:
    """The codec's decoder on the channels-last CPU path (`engine.codec.cpu`); True when on."""
    if _device_type(codec) != "cpu":
        return False
    from ..engine.codec.cpu import use_cpu_decoder

    return use_cpu_decoder(codec, True)


def apply_cpu_tricks(model: Any, codec: Any, preset: Any) -> dict[str, Any]:
    """Do what `preset` asks of the loaded `model` (the DiT) and `codec`; returns what was done,
    e.g. {"int8_linears": 96, "cpu_codec": True} (nothing for a field that is off)."""
    done: dict[str, Any] = {}
    if getattr(preset, "int8_linears", False) and model is not None:
        done["int8_linears"] = apply_int8_linears(model)
    if getattr(preset, "cpu_codec", False) and codec is not None:
        done["cpu_codec"] = apply_cpu_codec(codec)
    return done
