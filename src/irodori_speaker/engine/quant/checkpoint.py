"""Int4 safetensors checkpoints (the Irodori-TTS-Lite / -500M-v3-int4 format): read, write, apply to a model.

Metadata: ``config_json``, ``quant_method`` = ``"autobit"``, ``checkpoint_format`` = ``"gptq"`` (v1 zeros)
or ``"gptq_v2"``, ``quant_layers_json`` (GPTQ Linears: ``{name}.qweight/.scales/.qzeros/.g_idx``, optional
``{name}.bias``, no ``{name}.weight``), ``extra_quant_layers_json`` (RTN nibbles:
``_extra.{name}.qweight_u8/.scales/.zeros``), ``embed_quant_layers_json`` (RTN embeddings:
``_embed.{name}.*``). Every other tensor is a plain (fp16) tensor of the model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from ...errors import QuantError
from ..checkpoint import LoadedModel, build_model, config_from_metadata, resolve_dtype
from ..layers import Embedding
from ..t5gemma import ScaledEmbedding
from .formats import GPTQ_FORMATS, GPTQPacked, RTNPacked, warn_if_corrupted
from .layers import (
    Int4Conv1d,
    Int4ConvTranspose1d,
    Int4Linear,
    PackedEmbedding,
    PackedScaledEmbedding,
    RTNLinear,
)

__all__ = [
    "DequantizePolicy",
    "Int4Checkpoint",
    "apply_int4",
    "is_int4_checkpoint",
    "load_int4_checkpoint",
    "load_int4_model",
    "save_int4_checkpoint",
]

QUANT_METHOD = "autobit"
_STANDARD_KEYS = (
    "config_json",
    "quant_method",
    "checkpoint_format",
    "quant_layers_json",
    "extra_quant_layers_json",
    "embed_quant_layers_json",
)
_GPTQ_PARTS = ("qweight", "scales", "qzeros", "g_idx")
_RTN_PARTS = ("qweight_u8", "scales", "zeros")


@dataclass
class Int4Checkpoint:
    """An int4 checkpoint in memory. `tensors` holds every tensor that is not part of a packed layer
    (biases of packed layers included), as stored."""

    config: dict
    checkpoint_format: str = "gptq"
    gptq: dict[str, GPTQPacked] = field(default_factory=dict)
    extra: dict[str, RTNPacked] = field(default_factory=dict)
    embed: dict[str, RTNPacked] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)  # other metadata keys, kept on save

    def packed_names(self) -> set[str]:
        return set(self.gptq) | set(self.extra) | set(self.embed)


def _json_list(meta: dict[str, str], key: str) -> list[dict]:
    raw = meta.get(key)
    if raw is None or raw == "":
        return []
    try:
        value = json.loads(raw)
    except ValueError as e:
        raise QuantError(f"metadata {key} is not valid JSON: {e}") from e
    if not isinstance(value, list) or not all(isinstance(v, dict) and "name" in v for v in value):
        raise QuantError(f"metadata {key} must be a JSON list of objects with a 'name'")
    return value


def _int_field(entry: dict, key: str, where: str) -> int:
    v = entry.get(key)
    if not isinstance(v, int) or isinstance(v, bool):
        raise QuantError(f"{where}: field {key!r} must be an integer, got {v!r}")
    return v


def is_int4_checkpoint(path: str | Path) -> bool:
    """True when the safetensors file at `path` carries int4 metadata (`quant_method`)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return "quant_method" in (f.metadata() or {})
    except Exception:
        return False


def load_int4_checkpoint(path: str | Path) -> Int4Checkpoint:
    """Read an int4 checkpoint (CPU tensors, unchanged). Raises QuantError on anything unsupported."""
    path = Path(path)
    if not path.is_file():
        raise QuantError(f"int4 checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open has no iterator
    except QuantError:
        raise
    except Exception as e:
        raise QuantError(f"cannot read {path} as safetensors: {e}") from e
    return checkpoint_from_tensors(tensors, meta, source=str(path))


def checkpoint_from_tensors(
    tensors: dict[str, torch.Tensor], meta: dict[str, str], *, source: str = "checkpoint"
) -> Int4Checkpoint:
    """Interpret raw safetensors contents as an int4 checkpoint (the work of `load_int4_checkpoint`)."""
    method = meta.get("quant_method")
    if method is None:
        raise QuantError(f"{source} is not an int4 checkpoint (no quant_method metadata)")
    if method != QUANT_METHOD:
        raise QuantError(f"{source}: unknown quant_method {method!r} (supported: {QUANT_METHOD!r})")
    fmt = meta.get("checkpoint_format", "gptq")
    if fmt not in GPTQ_FORMATS:
        raise QuantError(
            f"{source}: unknown checkpoint_format {fmt!r} (supported: {', '.join(GPTQ_FORMATS)})"
        )
    try:
        config = json.loads(meta.get("config_json", "{}"))
    except ValueError as e:
        raise QuantError(f"{source}: config_json is not valid JSON: {e}") from e
    remaining = dict(tensors)

    def take(name: str, owner: str) -> torch.Tensor:
        t = remaining.pop(name, None)
        if t is None:
            raise QuantError(f"{source}: tensor {name} of quantised layer {owner} is missing")
        return t

    ckpt = Int4Checkpoint(config=config, checkpoint_format=fmt)
    for entry in _json_list(meta, "quant_layers_json"):
        name = entry["name"]
        where = f"{source}: quant layer {name}"
        wbits = entry.get("wbits", 4)
        if wbits != 4:
            raise QuantError(f"{where}: wbits={wbits!r} is not supported (only 4)")
        if entry.get("actorder", False):
            raise QuantError(
                f"{where}: actorder=true checkpoints are not supported", hint="re-quantise without act-order"
            )
        k, n = _int_field(entry, "in_features", where), _int_field(entry, "out_features", where)
        gs = _int_field(entry, "groupsize", where) if "groupsize" in entry else 32
        gs = k if gs == -1 else gs
        if f"{name}.weight" in remaining:
            raise QuantError(f"{where}: float tensor {name}.weight present next to the packed weight")
        parts = {p: take(f"{name}.{p}", name) for p in _GPTQ_PARTS}
        bias = remaining.get(f"{name}.bias")  # stays in `tensors` (loaded like any other tensor)
        packed = GPTQPacked(
            **parts, in_features=k, out_features=n, group_size=gs, checkpoint_format=fmt, bias=bias, name=name
        )
        warn_if_corrupted(name, packed.qzeros, fmt)
        ckpt.gptq[name] = packed
    for key, prefix, dims, target in (
        ("extra_quant_layers_json", "_extra", ("out_features", "in_features"), ckpt.extra),
        ("embed_quant_layers_json", "_embed", ("num_embeddings", "embedding_dim"), ckpt.embed),
    ):
        for entry in _json_list(meta, key):
            name = entry["name"]
            where = f"{source}: {prefix[1:]} layer {name}"
            rows, cols = _int_field(entry, dims[0], where), _int_field(entry, dims[1], where)
            groups = _int_field(entry, "num_groups", where)
            parts = {p: take(f"{prefix}.{name}.{p}", name) for p in _RTN_PARTS}
            target[name] = RTNPacked(
                **parts, rows=rows, cols=cols, num_groups=groups, meta=dict(entry), name=f"{prefix}.{name}"
            )
    leftovers = sorted(k for k in remaining if k.startswith(("_extra.", "_embed.")) or k.endswith(".qweight"))
    if leftovers:
        raise QuantError(f"{source}: packed tensors not listed in the metadata: {', '.join(leftovers[:8])}")
    ckpt.tensors = remaining
    ckpt.metadata = {k: v for k, v in meta.items() if k not in _STANDARD_KEYS}
    return ckpt


def save_int4_checkpoint(path: str | Path, ckpt: Int4Checkpoint) -> None:
    """Write `ckpt` in the release's format (float tensors as fp16; GPTQ zeros in ckpt.checkpoint_format)."""
    if ckpt.checkpoint_format not in GPTQ_FORMATS:
        raise QuantError(f"unknown checkpoint_format {ckpt.checkpoint_format!r}")
    out: dict[str, torch.Tensor] = {}
    for name, t in ckpt.tensors.items():
        out[name] = t.to(torch.float16) if t.is_floating_point() else t
    quant_layers = []
    for name, p in ckpt.gptq.items():
        p = p.to_format(ckpt.checkpoint_format)
        for part in _GPTQ_PARTS:
            out[f"{name}.{part}"] = getattr(p, part)
        if p.bias is not None and f"{name}.bias" not in out:
            out[f"{name}.bias"] = p.bias.to(torch.float16)
        quant_layers.append(
            {
                "name": name,
                "wbits": 4,
                "groupsize": p.group_size,
                "actorder": False,
                "in_features": p.in_features,
                "out_features": p.out_features,
            }
        )
    extra_layers = []
    for name, rp in ckpt.extra.items():
        for part in _RTN_PARTS:
            out[f"_extra.{name}.{part}"] = getattr(rp, part)
        extra_layers.append(
            {"name": name, "in_features": rp.cols, "out_features": rp.rows, "num_groups": rp.num_groups}
        )
    embed_layers = []
    for name, ep in ckpt.embed.items():
        for part in _RTN_PARTS:
            out[f"_embed.{name}.{part}"] = getattr(ep, part)
        embed_layers.append(
            {"name": name, "num_embeddings": ep.rows, "embedding_dim": ep.cols, "num_groups": ep.num_groups}
        )
    meta = dict(ckpt.metadata)
    meta.update(
        {
            "config_json": json.dumps(ckpt.config, ensure_ascii=False),
            "quant_method": QUANT_METHOD,
            "checkpoint_format": ckpt.checkpoint_format,
            "quant_layers_json": json.dumps(quant_layers),
            "extra_quant_layers_json": json.dumps(extra_layers),
            "embed_quant_layers_json": json.dumps(embed_layers),
        }
    )
    save_file({k: v.contiguous() for k, v in out.items()}, str(path), metadata=meta)


# ------------------------------------------------------------------------------------------- apply

DequantizePolicy = Collection[str] | Callable[[str], bool] | str | None


def _dequant_predicate(policy: DequantizePolicy) -> Callable[[str], bool]:
    if policy is None or policy == "none":
        return lambda name: False
    if policy == "all":
        return lambda name: True
    if isinstance(policy, str):
        raise QuantError(f"dequantize: expected 'all', 'none', a set of names or a callable, got {policy!r}")
    if callable(policy):
        return policy
    names = set(policy)
    prefixes = tuple(n for n in names if n.endswith("."))
    return lambda name: name in names or (bool(prefixes) and name.startswith(prefixes))


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)


M = TypeVar("M", bound=nn.Module)


def _get(model: nn.Module, name: str, kinds: tuple[type[M], ...], what: str) -> M:
    try:
        mod = model.get_submodule(name)
    except AttributeError as e:
        raise QuantError(f"{what} {name} is not a module of the model") from e
    if not isinstance(mod, kinds):
        kinds_s = "/".join(k.__name__ for k in kinds)
        raise QuantError(f"{what} {name} is a {type(mod).__name__}, expected {kinds_s}")
    return mod


def _dense_linear(k: int, n: int, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    lin = nn.Linear(k, n, bias=bias is not None, device="meta")
    lin.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        lin.bias = nn.Parameter(bias, requires_grad=False)
    return lin


def apply_int4(
    model: nn.Module,
    ckpt: Int4Checkpoint | str | Path,
    *,
    device: torch.device | str = "cpu",
    act_dtype: torch.dtype = torch.float16,
    dequantize: DequantizePolicy = None,
) -> nn.Module:
    """Put an int4 checkpoint into `model` (built with plain nn.Linear / nn.Embedding / conv modules whose
    qualified names are the tensor names): packed layers replace those modules by name, every other tensor
    is loaded strictly (floating tensors cast to `act_dtype`). Returns `model` (modified in place).

    `dequantize` selects packed layers to expand at load into ordinary modules holding `act_dtype` weights:
    None / "none" (the default: keep everything packed), "all", a set of names (entries ending in "." are
    prefixes), or a callable(name) -> bool. Any missing, unexpected or mis-shaped tensor is a QuantError
    naming it. The model may be built on the meta device.
    """
    if not isinstance(ckpt, Int4Checkpoint):
        ckpt = load_int4_checkpoint(ckpt)
    device = torch.device(device)
    expand = _dequant_predicate(dequantize)
    derived_keys: set[str] = set()  # state_dict keys made from packed layers (not loaded from `tensors`)

    def bias_of(name: str) -> torch.Tensor | None:
        b = ckpt.tensors.get(f"{name}.bias")
        return None if b is None else b.to(device=device, dtype=act_dtype)

    for name, p in ckpt.gptq.items():
        lin = _get(model, name, (nn.Linear, Int4Linear), "quant layer")
        if (lin.in_features, lin.out_features) != (p.in_features, p.out_features):
            raise QuantError(
                f"quant layer {name}: checkpoint has {p.in_features}->{p.out_features}, "
                f"model has {lin.in_features}->{lin.out_features}"
            )
        has_bias = getattr(lin, "bias", None) is not None
        if has_bias != (f"{name}.bias" in ckpt.tensors):
            raise QuantError(
                f"quant layer {name}: bias {'missing from' if has_bias else 'unexpected in'} checkpoint"
            )
        if expand(name):
            new: nn.Module = _dense_linear(
                p.in_features,
                p.out_features,
                p.dequantize(torch.float32).to(device, act_dtype),
                bias_of(name),
            )
        else:
            packed = GPTQPacked(**{**p.__dict__, "bias": bias_of(name)})
            new = Int4Linear(packed, device=device, act_dtype=act_dtype)
        derived_keys.update(f"{name}.{b}" for b in _GPTQ_PARTS)
        derived_keys.add(f"{name}.weight")
        _set_submodule(model, name, new)

    for name, rp in ckpt.extra.items():
        mod = _get(model, name, (nn.Linear, nn.Conv1d, nn.ConvTranspose1d), "extra layer")
        has_bias = getattr(mod, "bias", None) is not None
        if has_bias != (f"{name}.bias" in ckpt.tensors):
            raise QuantError(
                f"extra layer {name}: bias {'missing from' if has_bias else 'unexpected in'} checkpoint"
            )
        if isinstance(mod, nn.Linear):
            if (rp.rows, rp.cols) != (mod.out_features, mod.in_features):
                raise QuantError(
                    f"extra layer {name}: packed {rp.rows}x{rp.cols}, "
                    f"model {mod.out_features}x{mod.in_features}"
                )
            if expand(name):
                new = _dense_linear(
                    mod.in_features, mod.out_features, rp.dequantize(act_dtype).to(device), bias_of(name)
                )
            else:
                new = RTNLinear(rp, bias_of(name), device=device, act_dtype=act_dtype)
        elif isinstance(mod, (nn.Conv1d, nn.ConvTranspose1d)):
            conv_cls = Int4Conv1d if isinstance(mod, nn.Conv1d) else Int4ConvTranspose1d
            try:
                packed_conv = conv_cls.from_conv(
                    mod, rp, device=device, act_dtype=act_dtype, bias=bias_of(name)
                )
            except QuantError as e:
                raise QuantError(f"extra layer {name}: {e}") from e
            new = packed_conv
            if expand(name):
                dense = type(mod)(**_plain_conv_args(mod), bias=has_bias, device="meta")
                weight = packed_conv._dequant(act_dtype).view_as(mod.weight)
                dense.weight = nn.Parameter(weight, requires_grad=False)
                bias = bias_of(name)
                if bias is not None:
                    dense.bias = nn.Parameter(bias, requires_grad=False)
                new = dense
        derived_keys.update([f"{name}.weight", *(f"{name}.{b}" for b in _RTN_PARTS)])
        _set_submodule(model, name, new)

    for name, ep in ckpt.embed.items():
        emb = _get(model, name, (nn.Embedding, ScaledEmbedding), "embedding layer")
        shape = tuple(cast(torch.Tensor, emb.weight).shape)
        if (ep.rows, ep.cols) != shape:
            raise QuantError(f"embedding layer {name}: packed {ep.rows}x{ep.cols}, model {shape}")
        if isinstance(emb, ScaledEmbedding):  # v4-Large: sqrt(hidden) and the end-of-image vector
            if expand(name):
                emb.weight = nn.Parameter(ep.dequantize(act_dtype).to(device), requires_grad=False)
                new = emb  # its eoi_embedding is loaded with the other tensors
            else:
                new = PackedScaledEmbedding(
                    ep, scale=emb.scale, eoi=emb.eoi, device=device, act_dtype=act_dtype
                )
        elif expand(name):
            new = Embedding(ep.rows, ep.cols, device="meta", padding_idx=cast(nn.Embedding, emb).padding_idx)
            new.weight = nn.Parameter(ep.dequantize(act_dtype).to(device), requires_grad=False)
        else:
            new = PackedEmbedding(ep, device=device, act_dtype=act_dtype)
        derived_keys.update([f"{name}.weight", *(f"{name}.{b}" for b in _RTN_PARTS)])
        _set_submodule(model, name, new)

    _load_rest_strict(model, ckpt, derived_keys, device, act_dtype)
    return model


def _plain_conv_args(conv: nn.Conv1d | nn.ConvTranspose1d) -> dict[str, Any]:
    args: dict[str, Any] = {
        "in_channels": conv.in_channels,
        "out_channels": conv.out_channels,
        "kernel_size": conv.kernel_size,
        "stride": conv.stride,
        "padding": conv.padding,
        "dilation": conv.dilation,
        "groups": conv.groups,
    }
    if isinstance(conv, nn.ConvTranspose1d):
        args["output_padding"] = conv.output_padding
    return args


def _load_rest_strict(
    model: nn.Module,
    ckpt: Int4Checkpoint,
    derived_keys: set[str],
    device: torch.device,
    act_dtype: torch.dtype,
) -> None:
    own = model.state_dict(keep_vars=True)
    expected = {k: v for k, v in own.items() if k not in derived_keys}
    given = ckpt.tensors
    missing = sorted(set(expected) - set(given))
    unexpected = sorted(set(given) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(
                f"missing from the checkpoint: {', '.join(missing[:10])}"
                + (" ..." if len(missing) > 10 else "")
            )
        if unexpected:
            parts.append(
                f"not in the model: {', '.join(unexpected[:10])}" + (" ..." if len(unexpected) > 10 else "")
            )
        raise QuantError("int4 checkpoint does not match the model; " + "; ".join(parts))
    for k, v in expected.items():
        t = given[k]
        if tuple(t.shape) != tuple(v.shape):
            raise QuantError(f"tensor {k}: checkpoint shape {tuple(t.shape)}, model shape {tuple(v.shape)}")
    state = {}
    for k, v in expected.items():
        t = given[k]
        dtype = act_dtype if t.is_floating_point() and v.is_floating_point() else v.dtype
        state[k] = t.to(device=device, dtype=dtype)
    model.load_state_dict(state, strict=False, assign=True)
    for p in model.parameters():
        p.requires_grad_(False)
    # non-persistent buffers (e.g. RoPE tables) follow the device unless still on meta (the builder's job)
    for mod in model.modules():
        for bname, buf in list(mod._buffers.items()):
            if buf is not None and not buf.is_meta and buf.device != device:
                mod._buffers[bname] = buf.to(device)


def load_int4_model(
    path: str | Path,
    *,
    dtype: str | torch.dtype = torch.float16,
    device: torch.device | str = "cpu",
    dequantize: DequantizePolicy = None,
) -> LoadedModel:
    """An int4 file as a ready model: the engine's float DiT built from its config_json on the meta
    device, then `apply_int4` swaps in the packed layers and loads every other tensor strictly."""
    return model_from_int4(
        load_int4_checkpoint(path), str(path), dtype=dtype, device=device, dequantize=dequantize
    )


def model_from_int4(
    ckpt: Int4Checkpoint,
    source: str,
    *,
    dtype: str | torch.dtype = torch.float16,
    device: torch.device | str = "cpu",
    dequantize: DequantizePolicy = None,
) -> LoadedModel:
    """The `LoadedModel` of an in-memory int4 checkpoint (from a file, or quantised at load)."""
    dtype = resolve_dtype(dtype)
    meta = {"config_json": json.dumps(ckpt.config)}
    if "text_encoder_config_json" in ckpt.metadata:  # v4: the backbone's config, kept as stored
        meta["text_encoder_config_json"] = ckpt.metadata["text_encoder_config_json"]
    cfg, inference = config_from_metadata(meta, source)
    model = build_model(cfg, device="meta", dtype=dtype)
    apply_int4(model, ckpt, device=device, act_dtype=dtype, dequantize=dequantize)
    model.eval()
    return LoadedModel(model, cfg, inference, source, quantized=True)
