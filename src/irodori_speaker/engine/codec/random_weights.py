"""Random codecs in the reference's real `weights.pth` layout (tests, benchmarks, the tiny-random model).

`checkpoint_layout` lists every tensor of a reference file, the watermark branch included (its
shapes follow the reference; we never build it), so the files these write exercise the real loader.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from .config import TINY_CODEC_KWARGS, CodecConfig
from .files import expected_tensors, is_watermark_only

__all__ = ["checkpoint_layout", "random_codec_state_dict", "save_random_codec_pth"]

# Watermark branch of the reference (not built here; only needed to write real-format files).
_DEFAULT_WM_RATES = (8, 5, 4, 2)
_WM_HIDDEN = 512
_WM_LATENT = 128
_WM_CHANNELS = 32
_WM_NBITS = 16
_WM_DOWNSAMPLING = 3

_RESIDUAL_CONV_G = re.compile(r"\.block\.\d+\.block\.[13]\.weight_g$")


def checkpoint_layout(
    kwargs: Mapping[str, Any] | None = None, *, watermark: bool = True
) -> dict[str, list[int]]:
    """Every tensor name -> shape of a reference-format `weights.pth` for these kwargs.

    Weight-normed convs appear as `weight_g` / `weight_v`; with `watermark`, the
    reference's watermark-branch tensors too (their shapes follow the reference:
    `wm_rates` default (8, 5, 4, 2), 512-wide LSTMs).
    """
    kwargs = copy.deepcopy(dict(TINY_CODEC_KWARGS if kwargs is None else kwargs))
    cfg = CodecConfig.from_kwargs(kwargs)
    layout: dict[str, list[int]] = {}
    for name, (shape, weight_normed) in expected_tensors(cfg).items():
        if weight_normed:
            prefix = name[: -len("weight")]
            layout[prefix + "weight_g"] = [shape[0], 1, 1]
            layout[prefix + "weight_v"] = list(shape)
        else:
            layout[name] = list(shape)
    if not watermark:
        return layout
    wm_rates = tuple(kwargs.get("wm_rates") or _DEFAULT_WM_RATES)
    for i, wm_stride in enumerate(wm_rates[: len(cfg.decoder_rates)]):
        cin = cfg.decoder_dim // 2**i // _WM_DOWNSAMPLING
        cout = cfg.decoder_dim // 2 ** (i + 1) // _WM_DOWNSAMPLING
        hidden = cout // 2
        b = f"decoder.model.{i + 1}.block"
        layout[f"{b}.3.weight"] = [cin, cout, 2 * wm_stride]  # ConvTranspose1d cin -> cout
        layout[f"{b}.3.bias"] = [cout]
        for unit in (6, 7):  # ELU residual units, compress 2
            layout[f"{b}.{unit}.block.1.weight"] = [hidden, cout, 3]
            layout[f"{b}.{unit}.block.1.bias"] = [hidden]
            layout[f"{b}.{unit}.block.3.weight"] = [cout, hidden, 1]
            layout[f"{b}.{unit}.block.3.bias"] = [cout]
        layout[f"{b}.11.weight"] = [cin, cout, 2 * wm_stride]  # Conv1d cout -> cin
        layout[f"{b}.11.bias"] = [cin]
    wm = "decoder.wm_model"
    gates = 4 * _WM_HIDDEN
    lstm: dict[str, list[int]] = {}
    for layer in (0, 1):
        lstm |= {
            f"weight_ih_l{layer}": [gates, _WM_HIDDEN],
            f"weight_hh_l{layer}": [gates, _WM_HIDDEN],
            f"bias_ih_l{layer}": [gates],
            f"bias_hh_l{layer}": [gates],
        }
    layout[f"{wm}.encoder_block.pre.3.weight"] = [_WM_CHANNELS, 1, 7]
    layout[f"{wm}.encoder_block.pre.3.bias"] = [_WM_CHANNELS]
    layout |= {f"{wm}.encoder_block.post.0.lstm.{k}": v for k, v in lstm.items()}
    layout[f"{wm}.encoder_block.post.2.weight"] = [_WM_LATENT, _WM_HIDDEN, 7]
    layout[f"{wm}.encoder_block.post.2.bias"] = [_WM_LATENT]
    layout[f"{wm}.msg_processor.msg_processor.weight"] = [2 * _WM_NBITS, _WM_LATENT]
    layout[f"{wm}.decoder_block.pre.0.weight"] = [_WM_HIDDEN, _WM_LATENT, 7]
    layout[f"{wm}.decoder_block.pre.0.bias"] = [_WM_HIDDEN]
    layout |= {f"{wm}.decoder_block.pre.1.lstm.{k}": v for k, v in lstm.items()}
    layout[f"{wm}.decoder_block.post.1.weight"] = [1, _WM_CHANNELS, 7]
    layout[f"{wm}.decoder_block.post.1.bias"] = [1]
    return layout


def random_codec_state_dict(
    kwargs: Mapping[str, Any] | None = None, seed: int = 0, *, watermark: bool = True
) -> dict[str, Tensor]:
    """A random reference-format state_dict (legacy weight-norm keys; watermark tensors zero).

    Scaled so activations stay in a sane range (decoded noise has std ~0.13,
    unsaturated): folded conv rows have norm ~1 (~0.3 inside residual units),
    Snake alphas in [0.5, 1.5], small biases.
    """
    kwargs = TINY_CODEC_KWARGS if kwargs is None else kwargs
    cfg = CodecConfig.from_kwargs(kwargs)
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, Tensor] = {}
    for key, shape in checkpoint_layout(kwargs, watermark=watermark).items():
        if is_watermark_only(key, cfg):
            state[key] = torch.zeros(shape)
        elif key.endswith(".alpha"):
            state[key] = 0.5 + torch.rand(shape, generator=gen)
        elif key.endswith(".weight_g"):
            # residual branches at 0.3 keep activations ~1 deep into the decoder (at 1 the
            # output saturates: 90% of samples at |x| > 0.9)
            scale = 0.3 if _RESIDUAL_CONV_G.search(key) else 1.0
            state[key] = scale * (0.8 + 0.4 * torch.rand(shape, generator=gen))
        elif key.endswith(".weight_v"):
            state[key] = torch.randn(shape, generator=gen)
        else:
            state[key] = 0.01 * torch.randn(shape, generator=gen)
    return state


def save_random_codec_pth(
    path: str | os.PathLike[str],
    kwargs: Mapping[str, Any] | None = None,
    seed: int = 0,
    *,
    watermark: bool = True,
) -> Path:
    """Write a random codec in the real `weights.pth` container (default: `TINY_CODEC_KWARGS`).

    `watermark=False` leaves out the (zero, ignored) watermark tensors: the tiny
    file shrinks from ~39 MB to ~1.6 MB.
    """
    kwargs = copy.deepcopy(dict(TINY_CODEC_KWARGS if kwargs is None else kwargs))
    state = random_codec_state_dict(kwargs, seed, watermark=watermark)
    p = Path(path)
    torch.save({"state_dict": state, "metadata": {"kwargs": kwargs}}, p)
    return p
