"""An int4 DACVAE: the codec's convolutions as RTN nibbles (groups of 32, fp16 scale and zero).

Per the int4 release's format (docs/int4.md section 1): Conv1d weights flattened to [out, in*k],
ConvTranspose1d to [in, out*k], asymmetric RTN. It cuts the codec's weight memory about
6x (the seed: 377 -> 59 MB) at a cost in speed (each conv dequantises its weight per call;
the seed measured ~2x slower decode), so it is the option for the smallest memory, not the
default. Snake alphas and biases stay as they are.

`load_int4_codec` also reads the seed's own int4 codec, Irodori-TTS-Lite's
`dacvae_int4.safetensors` (`is_lite_int4_codec`): the codec's state dict after the seed swapped
every convolution for a packed one (its `irodori_tts_lite/packed_conv.py`): per conv `<m>.qweight`
(uint8, two 4-bit codes a byte, the even column in the low nibble), `<m>.scales` and `<m>.zeros`
(fp16, rows x groups, W = (q - z) * s), `<m>.bias`; rows and columns as ours (Conv1d
[out, in/groups * k], ConvTranspose1d [in, out/groups * k]), so the codes are used as stored; every
other tensor (Snake alphas) fp16. Layout learnt from that code, not from a copy of the released
file (not seen here); its codec config is the released codec's unless the file's metadata has
`kwargs`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from ...errors import CheckpointError, QuantError
from ..codec import DACVAE, FULL_CODEC_KWARGS, codec_from_state_dict, load_codec
from ..codec.config import CodecConfig
from ..codec.files import is_watermark_only
from .formats import RTNPacked, rtn_quantize
from .layers import Int4Conv1d, Int4ConvTranspose1d

LITE_PARTS = (".qweight", ".scales", ".zeros")

GROUP = 32


def _flat(conv: nn.Conv1d | nn.ConvTranspose1d) -> torch.Tensor:
    w = conv.weight.detach().float()
    return w.reshape(w.shape[0], -1)  # Conv1d [out, in*k]; ConvTranspose1d [in, out*k]


def quantize_codec(
    codec: nn.Module, *, parts: tuple[str, ...] = ("decoder",), group_size: int = GROUP
) -> int:
    """Replace the convolutions under `parts` (decoder, encoder, quantizer) in place; returns how many.

    A conv whose flattened width is not a multiple of `group_size` gets one group per row.
    """
    targets = []
    for name, module in codec.named_modules():
        if not any(name == p or name.startswith(p + ".") for p in parts):
            continue
        if type(module) in (nn.Conv1d, nn.ConvTranspose1d):
            targets.append((name, module))
    if not targets:
        raise QuantError(f"quantize_codec: no convolutions under {parts}")
    for name, conv in targets:
        flat = _flat(conv)
        gs = group_size if flat.shape[1] % group_size == 0 else None
        packed = rtn_quantize(flat, group_size=gs)
        cls = Int4Conv1d if type(conv) is nn.Conv1d else Int4ConvTranspose1d
        dtype = conv.weight.dtype
        new = cls.from_conv(conv, packed, device=conv.weight.device, act_dtype=dtype)
        parent_name, _, attr = name.rpartition(".")
        parent = codec.get_submodule(parent_name) if parent_name else codec
        setattr(parent, attr, new)
    return len(targets)


def load_int4_codec(
    path: str | os.PathLike[str],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float16,
    parts: tuple[str, ...] = ("decoder",),
) -> DACVAE:
    """`load_codec`, then the convolutions under `parts` packed as RTN int4 (the `codec_int4` preset).

    Packed on the CPU, then moved: `device` never holds the float codec. Snake alphas stay fp32,
    the packed buffers keep their dtypes under the move (only biases follow `dtype`).
    """
    if is_lite_int4_codec(path):
        return load_lite_int4_codec(path, device=device, dtype=dtype)
    codec = load_codec(path, device="cpu", dtype=dtype)
    quantize_codec(codec, parts=parts)
    return codec.to(device)


def is_lite_int4_codec(path: str | os.PathLike[str]) -> bool:
    """Is `path` a safetensors file of packed convolutions (`<m>.qweight` uint8), the seed's codec?"""
    try:
        with safe_open(str(path), framework="pt") as f:
            names = list(f.keys())
            return any(n.endswith(".qweight") and f.get_slice(n).get_dtype() == "U8" for n in names)
    except (SafetensorError, OSError, ValueError):
        return False


def load_lite_int4_codec(
    path: str | os.PathLike[str], *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float16
) -> DACVAE:
    """The seed's `dacvae_int4.safetensors` as our codec with the encoder's and decoder's convs kept
    packed (its codes as stored, dequantised one layer at a time inside forward; the bottleneck's
    two 1x1 convs held dequantised); the rest cast to `dtype`.

    The float codec is assembled on the CPU from the dequantised weights (to check every name and
    shape strictly, as `load_codec` does), then each conv is swapped for its packed form and the
    whole moved: `device` never holds the float codec."""
    source = f"int4 codec {Path(path)}"
    with safe_open(str(path), framework="pt", device="cpu") as f:
        meta = f.metadata() or {}
        state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    try:
        kwargs = json.loads(meta["kwargs"]) if "kwargs" in meta else dict(FULL_CODEC_KWARGS)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{source}: its 'kwargs' metadata is not JSON ({e})") from e
    cfg = CodecConfig.from_kwargs(kwargs)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in DACVAE(cfg).state_dict().items()}
    packed: dict[str, RTNPacked] = {}
    floats: dict[str, torch.Tensor] = {}
    for key in [k for k in state if k.endswith(".qweight")]:
        base = key[: -len(".qweight")]
        if is_watermark_only(f"{base}.weight", cfg):
            continue  # the watermark branch: not on the audio path
        if f"{base}.weight" not in shapes:
            raise CheckpointError(f"{source}: packed conv {base} is not a conv of the codec")
        shape = shapes[f"{base}.weight"]
        rows, cols = shape[0], int(torch.Size(shape).numel()) // shape[0]
        if tuple(state[key].shape) != (rows, (cols + 1) // 2):
            raise CheckpointError(
                f"{source}: packed conv {base} holds {tuple(state[key].shape)} bytes, the codec's "
                f"{rows} x {cols} weight needs {(rows, (cols + 1) // 2)}: the file does not match "
                + ("its kwargs" if "kwargs" in meta else "the released codec (and names no kwargs)")
            )
        try:
            scales = state[f"{base}.scales"]
            p = RTNPacked(state[key], scales, state[f"{base}.zeros"], rows, cols, scales.shape[1], name=base)
        except (KeyError, IndexError, QuantError) as e:
            raise CheckpointError(f"{source}: packed conv {base} is damaged ({e})") from e
        packed[base] = p
        floats[f"{base}.weight"] = p.dequantize(torch.float32).reshape(shape)
    if not packed:
        raise CheckpointError(f"{source}: no packed convolution (`<m>.qweight`) in it")
    for k, v in state.items():
        if not k.endswith(LITE_PARTS) and v.is_floating_point():
            floats[k] = v.float()
    codec = codec_from_state_dict(floats, kwargs, device="cpu", dtype=dtype, source=source)
    for base, p in packed.items():
        if base.startswith("quantizer."):  # two 1x1 bottleneck convs: kept dequantised (same values),
            continue  # they name the codec's device and dtype
        conv = codec.get_submodule(base)
        assert isinstance(conv, (nn.Conv1d, nn.ConvTranspose1d))  # checked by name and shape above
        cls = Int4Conv1d if type(conv) is nn.Conv1d else Int4ConvTranspose1d
        new = cls.from_conv(conv, p, act_dtype=dtype)
        parent_name, _, attr = base.rpartition(".")
        setattr(codec.get_submodule(parent_name) if parent_name else codec, attr, new)
    return codec.to(device)
