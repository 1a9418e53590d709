"""An int4 DACVAE: the codec's convolutions as RTN nibbles (groups of 32, fp16 scale and zero).

Per the int4 release's format (docs/int4.md section 1): Conv1d weights flattened to [out, in*k],
ConvTranspose1d to [in, out*k], asymmetric RTN. It cuts the codec's weight memory about
6x (the seed: 377 -> 59 MB) at a cost in speed (each conv dequantises its weight per call;
the seed measured ~2x slower decode), so it is the option for the smallest memory, not the
default. Snake alphas and biases stay as they are.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ...errors import QuantError
from ..codec import DACVAE, load_codec
from .formats import rtn_quantize
from .layers import Int4Conv1d, Int4ConvTranspose1d

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
    codec = load_codec(path, device="cpu", dtype=dtype)
    quantize_codec(codec, parts=parts)
    return codec.to(device)
