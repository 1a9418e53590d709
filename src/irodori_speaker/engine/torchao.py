"""The torchao `-Quantized` releases (v4-Large, v4.1-Small, ...): int8 weight-only files are
read (dequantised on load), every other torchao format is refused with one clear error.

Such a file is torchao's flattened state dict (torchao 0.16's safetensors layout, as
`tests/data/dit_v4_large/tiny_v4_large.int8-weight-only.safetensors` holds it):
metadata `irodori_quantization_json` ({"backend": "torchao", "format_version": 1,
"quantization_type": ...}), `tensor_names` (every original name) and, per original name, a JSON
entry: {"_type": "Tensor"} for a plain tensor stored under its name (bf16), or {"_type":
"Int8Tensor", "_data": {"block_size": [1, in], ...}, "_tensor_data_names": ["qdata", "scale"]}
for a weight `<m>.weight` stored as `<m>._weight_qdata` (int8, out x in) and
`<m>._weight_scale` (one scale per output row): weight = qdata * scale, symmetric, computed in
float32 and then cast to the dtype asked for (bf16 gives the very values torchao computes with).
No torchao is needed to read it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from ..errors import CheckpointError

QUANT_META = "irodori_quantization_json"
INT8_WEIGHT_ONLY = "int8_weight_only"
# Outward signs of a torchao file: tensor-subclass parts, or torchao named in the metadata.
TORCHAO_SUFFIXES = (
    ".qdata",
    "_qdata",
    ".zero_point",
    "scale_and_zero",
    ".packed_weight",
    ".int_data",
    ".float8_data",
)
SUPPORTED = (
    "supported: torchao int8_weight_only files (the -Quantized releases' int8-weight-only folder), "
    "float files and our own int4"
)
OUR_INT4_HINT = (
    "for 4-bit weights make our int4 with `irodori-speaker quantize` (from the float release or "
    "its int8-weight-only copy), or pass --int4 to quantise at load"
)
#: The metadata keys torchao's layout adds (beside one JSON entry per tensor name).
TORCHAO_META = (QUANT_META, "tensor_names")


def is_torchao_file(meta: dict[str, str], names: Iterable[object]) -> bool:
    """Does a safetensors header look like torchao's (metadata naming it, or its tensor parts)?"""
    text = " ".join(f"{k} {v[:200]}" for k, v in meta.items()).lower()
    if "torchao" in text:
        return True
    return any(str(n).endswith(TORCHAO_SUFFIXES) for n in names)


@dataclass(frozen=True)
class Int8Layout:
    """An int8 weight-only file's original tensors: name -> shape, and which are qdata x scale."""

    shapes: dict[str, tuple[int, ...]]
    quantized: frozenset[str]


def _parts(name: str) -> tuple[str, str]:
    """(qdata, scale) tensor names of a quantised `<m>.<attr>`: `<m>._<attr>_qdata`, `..._scale`."""
    parent, _, attr = name.rpartition(".")
    prefix = f"{parent}._{attr}" if parent else f"_{attr}"
    return f"{prefix}_qdata", f"{prefix}_scale"


def _json(meta: dict[str, str], key: str, refuse) -> Any:
    try:
        return json.loads(meta[key])
    except (KeyError, json.JSONDecodeError) as e:
        raise refuse(f"its metadata {key!r} is missing or not JSON ({e})") from e


def int8_layout(meta: dict[str, str], shapes: dict[str, tuple[int, ...]], source: str) -> Int8Layout:
    """The layout of a torchao int8 weight-only file; a one-line `CheckpointError` for any other
    torchao file (int4 tile-packed, fp8, an unknown version or a damaged header)."""

    def refuse(why: str) -> CheckpointError:
        return CheckpointError(
            f"{source} is a torchao-quantised copy: {why}; {SUPPORTED}", hint=OUR_INT4_HINT
        )

    if QUANT_META not in meta:
        raise refuse(f"no {QUANT_META} metadata, so its format is unknown")
    info = _json(meta, QUANT_META, refuse)
    qtype = info.get("quantization_type") if isinstance(info, dict) else None
    if not isinstance(info, dict) or info.get("backend") != "torchao" or info.get("format_version") != 1:
        raise refuse(f"{QUANT_META} is not torchao format_version 1 ({str(info)[:80]})")
    if qtype != INT8_WEIGHT_ONLY:
        packing = f", {info['packing_format']}" if info.get("packing_format") else ""
        raise refuse(f"{qtype}{packing} weights are not read")
    names = _json(meta, "tensor_names", refuse)
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise refuse("its metadata 'tensor_names' is not a list of names")
    out: dict[str, tuple[int, ...]] = {}
    quantized = set()
    used = set()
    for name in names:
        entry = _json(meta, name, refuse)
        kind = entry.get("_type") if isinstance(entry, dict) else None
        if kind == "Tensor":
            if name not in shapes:
                raise refuse(f"tensor {name} is listed but not stored")
            out[name] = shapes[name]
            used.add(name)
        elif kind == "Int8Tensor":
            qdata, scale = _parts(name)
            if (
                entry.get("_tensor_data_names") != ["qdata", "scale"]
                or qdata not in shapes
                or scale not in shapes
            ):
                raise refuse(f"{name}: expected {qdata} and {scale}")
            q_shape, s_shape = shapes[qdata], shapes[scale]
            block = (entry.get("_data") or {}).get("block_size")
            if (
                len(q_shape) != 2
                or s_shape not in ((q_shape[0], 1), (q_shape[0],))
                or block != [1, q_shape[1]]
            ):
                raise refuse(f"{name}: not one scale per output row (qdata {q_shape}, scale {s_shape})")
            out[name] = q_shape
            quantized.add(name)
            used |= {qdata, scale}
        else:
            raise refuse(f"tensor {name} is a {kind!r}, not read")
    extra = sorted(set(shapes) - used)
    if extra:
        raise refuse(f"tensors not in its tensor_names: {', '.join(extra[:3])}")
    return Int8Layout(out, frozenset(quantized))


def read_int8_state(
    f: Any, layout: Int8Layout, names: Iterable[str], *, dtype: torch.dtype, device: str | torch.device
) -> dict[str, Tensor]:
    """The float state dict of `names` from an open safetensors file `f` of `layout`: quantised
    weights dequantised (qdata * scale, in float32 on `device`), everything cast to `dtype`."""
    state = {}
    for name in names:
        if name in layout.quantized:
            qdata, scale = _parts(name)
            q, s = f.get_tensor(qdata), f.get_tensor(scale)
            if q.dtype != torch.int8 or not s.is_floating_point():
                raise CheckpointError(
                    f"{name}: qdata must be int8 and scale float, got {q.dtype} and {s.dtype}"
                )
            w = q.to(device).float() * s.to(device).float().reshape(-1, 1)
            state[name] = w.to(dtype)
        else:
            t = f.get_tensor(name)
            if not t.is_floating_point():
                raise CheckpointError(f"tensor {name} has non-float dtype {t.dtype}")
            state[name] = t.to(device=device, dtype=dtype)
    return state


def plain_metadata(meta: dict[str, str], layout: Int8Layout) -> dict[str, str]:
    """`meta` without torchao's own keys (its quantization record, tensor_names, the per-tensor
    entries): the metadata of the float checkpoint the file was made from."""
    return {k: v for k, v in meta.items() if k not in TORCHAO_META and k not in layout.shapes}


def read_float_state(
    path: str, meta: dict[str, str], shapes: dict[str, tuple[int, ...]]
) -> tuple[dict[str, str], dict[str, Tensor]]:
    """(metadata, float32 state) of a torchao int8 weight-only file, as the float checkpoint it was
    made from (weights dequantised); any other torchao file is refused (`int8_layout`)."""
    layout = int8_layout(meta, shapes, path)
    with safe_open(path, framework="pt", device="cpu") as f:
        state = read_int8_state(f, layout, layout.shapes, dtype=torch.float32, device="cpu")
    return plain_metadata(meta, layout), state
