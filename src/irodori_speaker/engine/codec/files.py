"""Codec files: the reference `weights.pth`, and the folded safetensors file `convert_codec` writes.

Loading is a strict name-by-name match against the layers (`expected_tensors`): weight-normed
convs (`weight_g` / `weight_v`) are folded into plain weights, the watermark branch's tensors are
accepted and ignored, anything else missing, extra or mis-shaped is a `CheckpointError` naming it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ...errors import CheckpointError, InputError
from .config import CodecConfig
from .model import DACVAE

__all__ = ["codec_from_state_dict", "convert_codec", "expected_tensors", "is_watermark_only", "load_codec"]

_FOLDED_FORMAT = "irodori-speaker/dacvae-folded"
_FOLDED_FORMAT_VERSION = "1"


def is_watermark_only(key: str, cfg: CodecConfig) -> bool:
    """Tensors of the reference's watermark branch: accepted in a checkpoint and ignored."""
    m = re.match(r"decoder\.model\.(\d+)\.block\.(\d+)\.", key)
    if m:
        return 1 <= int(m.group(1)) <= len(cfg.decoder_rates) and m.group(2) in {"3", "6", "7", "11"}
    return key.startswith("decoder.wm_model.") and not key.startswith(
        ("decoder.wm_model.encoder_block.pre.0.", "decoder.wm_model.encoder_block.pre.1.")
    )


def expected_tensors(cfg: CodecConfig) -> dict[str, tuple[tuple[int, ...], bool]]:
    """Our parameter name -> (shape, is a weight-normed conv weight in the reference)."""
    model = DACVAE.from_kwargs(_config_kwargs(cfg), device="meta")
    expected = {}
    for mod_name, module in model.named_modules():
        for p_name, p in module.named_parameters(recurse=False):
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            is_conv_weight = isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)) and p_name == "weight"
            expected[name] = (tuple(p.shape), is_conv_weight)
    return expected


def _config_kwargs(cfg: CodecConfig) -> dict[str, Any]:
    return {
        "encoder_dim": cfg.encoder_dim,
        "encoder_rates": list(cfg.encoder_rates),
        "latent_dim": cfg.latent_dim,
        "decoder_dim": cfg.decoder_dim,
        "decoder_rates": list(cfg.decoder_rates),
        "codebook_dim": cfg.codebook_dim,
        "sample_rate": cfg.sample_rate,
    }


def _fold_weight_norm(g: Tensor, v: Tensor) -> Tensor:
    """W = g * v / ||v||, the norm over every dim but dim 0, no epsilon (legacy weight_norm, dim=0)."""
    v = v.float()
    norm = v.norm(dim=tuple(range(1, v.dim())), keepdim=True)
    return v * (g.float() / norm)


def _shape(t: Tensor) -> list[int]:
    return list(t.shape)


def _used_weights(state: Mapping[str, Any], cfg: CodecConfig, source: str) -> dict[str, Tensor]:
    """Strict name-by-name match: the plain (folded) fp32 weights of the audio paths."""
    out: dict[str, Tensor] = {}
    consumed: set[str] = set()

    def tensor(key: str, shape: tuple[int, ...]) -> Tensor:
        t = state.get(key)
        if t is None:
            raise CheckpointError(f"{source}: missing tensor {key} (expected shape {list(shape)})")
        if not isinstance(t, Tensor) or not t.is_floating_point():
            what = t.dtype if isinstance(t, Tensor) else type(t).__name__
            raise CheckpointError(f"{source}: tensor {key} is not floating point ({what})")
        if tuple(t.shape) != shape:
            raise CheckpointError(f"{source}: tensor {key} has shape {_shape(t)}, expected {list(shape)}")
        consumed.add(key)
        return t

    for name, (shape, weight_normed) in expected_tensors(cfg).items():
        if weight_normed:
            prefix = name[: -len("weight")]
            has_gv = prefix + "weight_g" in state or prefix + "weight_v" in state
            if has_gv and name in state:
                raise CheckpointError(f"{source}: both {name} and {prefix}weight_g/_v are present")
            if has_gv:
                v = tensor(prefix + "weight_v", shape)
                g = tensor(prefix + "weight_g", (shape[0], 1, 1))
                w = _fold_weight_norm(g, v)
            else:
                if name not in state:
                    raise CheckpointError(
                        f"{source}: missing tensor {prefix}weight_g / {prefix}weight_v "
                        f"(weight-normed conv, weight shape {list(shape)})"
                    )
                w = tensor(name, shape).float()
        else:
            w = tensor(name, shape).float()
        if not bool(torch.isfinite(w).all()):
            raise CheckpointError(f"{source}: tensor {name} contains NaN or inf (a zero weight_v row?)")
        out[name] = w.contiguous()

    unknown = sorted(k for k in state if k not in consumed and not is_watermark_only(k, cfg))
    if unknown:
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise CheckpointError(
            f"{source}: unexpected tensors {', '.join(unknown[:5])}{more}: "
            "the checkpoint does not match its kwargs or is not a DACVAE codec"
        )
    return out


def _read_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(raw state_dict, kwargs, format) of a weights.pth or a converted safetensors file."""
    p = Path(path)
    source = f"codec checkpoint {p}"
    if not p.is_file():
        raise CheckpointError(f"{source} not found (or not a file)")
    size = p.stat().st_size
    with p.open("rb") as f:
        head = f.read(16)
    if size == 0:
        raise CheckpointError(f"{source} is empty")
    if head[:2] == b"\x1f\x8b":
        raise CheckpointError(f"{source} is gzip-compressed", hint="gunzip it first")
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":  # torch.save: zip or legacy pickle
        return _read_torch_checkpoint(p, source)
    if len(head) >= 9 and head[8:9] == b"{":
        header_len = int.from_bytes(head[:8], "little")
        if 8 + header_len > size:
            raise CheckpointError(f"{source} is a truncated safetensors file (header runs past the end)")
        return _read_safetensors_checkpoint(p, source)
    raise CheckpointError(f"{source} is neither a torch.save file (weights.pth) nor a safetensors file")


def _read_torch_checkpoint(p: Path, source: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    try:
        # an open file, not the path: torch.load dispatches on the name's extension
        with p.open("rb") as f:
            obj = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises RuntimeError, UnpicklingError, EOFError, ... on bad files
        raise CheckpointError(
            f"{source} cannot be read ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})",
            hint="the file is truncated or corrupt; download it again",
        ) from exc
    if not isinstance(obj, dict) or not isinstance(obj.get("state_dict"), dict):
        raise CheckpointError(f"{source} has no 'state_dict' dict: not a DACVAE weights.pth")
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("kwargs"), dict):
        raise CheckpointError(f"{source} has no metadata.kwargs: not a DACVAE weights.pth")
    return obj["state_dict"], metadata["kwargs"], "pth"


def _read_safetensors_checkpoint(p: Path, source: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    from safetensors import safe_open

    try:
        with safe_open(str(p), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    except Exception as exc:  # SafetensorError and friends
        raise CheckpointError(
            f"{source} cannot be read as safetensors ({type(exc).__name__}: {str(exc)[:200]})",
            hint="the file is truncated or corrupt; convert it again",
        ) from exc
    if "kwargs" not in metadata:
        raise CheckpointError(f"{source} has no 'kwargs' metadata: not a converted codec file")
    try:
        kwargs = json.loads(metadata["kwargs"])
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{source}: its 'kwargs' metadata is not JSON ({exc})") from exc
    if not isinstance(kwargs, dict):
        raise CheckpointError(f"{source}: its 'kwargs' metadata is not a JSON object")
    return state, kwargs, "safetensors"


def _config_for(kwargs: Mapping[str, Any], source: str) -> CodecConfig:
    try:
        return CodecConfig.from_kwargs(kwargs)
    except InputError as exc:
        raise CheckpointError(f"{source}: {exc}") from exc


def _check_dtype(dtype: torch.dtype) -> None:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InputError(f"codec dtype must be a floating-point torch.dtype, got {dtype!r}")


def codec_from_state_dict(
    state_dict: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    source: str = "codec state_dict",
) -> DACVAE:
    """Build a ready (eval, no grad) codec from a reference-format or folded state_dict."""
    _check_dtype(dtype)
    cfg = _config_for(kwargs, source)
    weights = _used_weights(state_dict, cfg, source)
    with torch.device("meta"):
        model = DACVAE(cfg)
    model.load_state_dict(weights, strict=True, assign=True)
    model.to(device=device, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    return model


def load_codec(
    path: str | os.PathLike[str], *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> DACVAE:
    """Load the real `weights.pth` or a file written by `convert_codec` (told apart by content)."""
    _check_dtype(dtype)
    state, kwargs, _ = _read_checkpoint(path)
    return codec_from_state_dict(state, kwargs, device=device, dtype=dtype, source=f"codec checkpoint {path}")


def convert_codec(src_pth: str | os.PathLike[str], dst_safetensors: str | os.PathLike[str]) -> Path:
    """Write the audio-path tensors of `src_pth` with weight norm folded to a safetensors file.

    The result loads with `load_codec` without pickle and about 14% smaller
    (no watermark weights). Written to a temporary name, then renamed.
    """
    from safetensors.torch import save_file

    source = f"codec checkpoint {src_pth}"
    state, kwargs, _ = _read_checkpoint(src_pth)
    weights = _used_weights(state, _config_for(kwargs, source), source)
    dst = Path(dst_safetensors)
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    metadata = {
        "format": _FOLDED_FORMAT,
        "format_version": _FOLDED_FORMAT_VERSION,
        "kwargs": json.dumps(kwargs, sort_keys=True),
    }
    try:
        save_file(weights, str(tmp), metadata=metadata)
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()
    return dst
