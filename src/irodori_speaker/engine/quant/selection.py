"""Which layers an int4 file packs, and how: the release's selection (GPTQ block Linears, RTN text
embeddings, the rest fp16) and the compact one (the rest RTN-packed too, as the seed's
Irodori-TTS-Lite `dit_int4.safetensors` is), and the size of the file either makes of a tensor
manifest (no weights needed).

What the seed packs was read from its loader (github.com/kizuna-intelligence/Irodori-TTS-Lite,
`irodori_tts_lite/checkpoint_loader.py`, `quant_utils.py`, `docs/architecture.md`): GPTQ 4-bit,
groups of 32, for the DiT blocks' Linears and the AdaLN projections (`quant_layers_json`);
asymmetric RTN nibbles (`_extra.{name}.qweight_u8` uint8, fp16 `scales` / `zeros` per row group)
for the encoders, `cond_module`, the text embedding and the q/k RMSNorm weights
(`extra_quant_layers_json`); every layer it packs is expanded to fp16 at load except the block
Linears. Its file is 292,719,472 bytes for the v2 500M model (fp32 494,993,952 x 4 = 1888 MiB).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import prod

from .formats import gptq_is_packable

__all__ = [
    "COMPACT_SELECTION",
    "PACKINGS",
    "RELEASE_SELECTION",
    "SEED_DIT_INT4_BYTES",
    "LayerPlan",
    "LayerSelection",
    "int4_file_bytes",
    "matches",
    "plan_layers",
]

#: the seed's v2 `dit_int4.safetensors` (Irodori-TTS-Lite, weights/dit_int4.safetensors, LFS size)
SEED_DIT_INT4_BYTES = 292_719_472


@dataclass(frozen=True)
class LayerSelection:
    """Which tensors to quantise, as regular expressions matched (fullmatch) against module names.

    `gptq`: Linears packed GPTQ (calibrated with method="gptq", round-to-nearest with "rtn");
    `embed`: Embeddings packed as RTN nibbles; `extra`: Linears packed as RTN nibbles ("extra" layers);
    `rtn`: Linears always rounded to nearest (never calibrated): GPTQ layout where the shape fits,
    else RTN nibbles; `exclude`: never quantised. `ragged`: widths that are not a multiple of the
    group size are packed with a shorter last group (and GPTQ targets that do not fit go to RTN
    nibbles) instead of staying float.
    """

    gptq: tuple[str, ...] = ()
    embed: tuple[str, ...] = ()
    extra: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    embed_group_size: int = 32
    rtn: tuple[str, ...] = ()
    ragged: bool = False


RELEASE_SELECTION = LayerSelection(
    gptq=(
        r"blocks\.\d+\.attention\.(wq|wk|wv|gate|wo)",
        r"blocks\.\d+\.attention\.(wk|wv)_(text|speaker|caption)",
        r"blocks\.\d+\.mlp\.(w1|w2|w3)",
        r"(text|speaker|caption)_encoder\.blocks\.\d+\.attention\.(wq|wk|wv|wo|gate)",
        # v4: the ModernBERT text backbone's linears (236 M of its 315 M parameters at full size)
        r"pretrained_text_backbone\.backbone\.layers\.\d+\.(attn\.Wqkv|attn\.Wo|mlp\.Wi|mlp\.Wo)",
        # v4-Large: the T5Gemma 2 encoder's linears
        r"pretrained_text_backbone\.backbone\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)",
    ),
    embed=(
        r"(text|caption)_encoder\.text_embedding",
        r"pretrained_text_backbone\.backbone\.embeddings\.tok_embeddings",
        # v4-Large's 262,144 x 1,152 table (604 MB in fp16): 189 MB packed, dequantised per row
        r"pretrained_text_backbone\.backbone\.embed_tokens",
    ),
)

#: The release's selection plus every remaining Linear of the DiT, the encoders and the duration
#: predictor rounded to nearest (AdaLN, cond_module, encoder MLPs, v4 projectors), and the token
#: tables in groups of 64 (a lookup's rounding does not accumulate through a matmul; groups of 32
#: would put the v2 file 0.6 MB over the seed's). Left float: norms, biases, and the latent's own
#: in/out projections (in_proj's dtype is the model's dtype for the sampler; together 0.1 % of
#: the weights).
COMPACT_SELECTION = LayerSelection(
    gptq=RELEASE_SELECTION.gptq,
    embed=RELEASE_SELECTION.embed,
    rtn=(
        r"blocks\.\d+\.(attention|mlp)_adaln\.(shift|scale|gate)_(down|up)",
        r"(delta_)?cond_module\.\d+",
        r"(text|speaker|caption)_encoder\.blocks\.\d+\.mlp\.(w1|w2|w3)",
        r"(text|caption)_encoder\.(projector|residual_up|residual_down)",
        r"duration_predictor\.token_input_proj",
        r"duration_predictor\.token_blocks\.\d+\.(modulation|caption_modulation|mlp\.(w1|w2|w3))",
    ),
    embed_group_size=64,
    ragged=True,
)

#: `quantize(packing=...)` / `irodori-speaker quantize --packing`
PACKINGS: dict[str, LayerSelection] = {"compact": COMPACT_SELECTION, "fp16-rest": RELEASE_SELECTION}


@dataclass
class LayerPlan:
    gptq: list[str] = field(default_factory=list)
    embed: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # selected but not packable -> why
    rtn: list[str] = field(default_factory=list)  # GPTQ layout, always rounded to nearest


def matches(name: str, patterns: Sequence[str]) -> bool:
    """Whether `name` fullmatches one of the regular expressions `patterns`."""
    return any(re.fullmatch(p, name) for p in patterns)


def plan_layers(
    weight_shapes: Mapping[str, tuple[int, ...]],
    selection: LayerSelection = RELEASE_SELECTION,
    *,
    group_size: int = 32,
) -> LayerPlan:
    """Decide per module (name -> its `.weight` shape) what is packed; unpackable shapes stay float."""
    plan = LayerPlan()
    sel = selection
    for name, shape in sorted(weight_shapes.items()):
        if matches(name, sel.exclude):
            continue
        is_gptq, is_rtn, is_extra = (matches(name, p) for p in (sel.gptq, sel.rtn, sel.extra))
        if is_gptq or is_rtn or is_extra:
            if len(shape) != 2:
                plan.kept[name] = f"weight is {len(shape)}-D"
                continue
            n, k = shape
            fits = gptq_is_packable(k, n, group_size)
            if (is_gptq or is_rtn) and fits:
                (plan.gptq if is_gptq else plan.rtn).append(name)
            elif sel.ragged or (is_extra and k % group_size == 0):
                plan.extra.append(name)
            elif is_extra:
                plan.kept[name] = f"{k} inputs are not a multiple of the group size {group_size}"
            else:
                plan.kept[name] = f"{k}->{n} does not fit GPTQ (in % {group_size}, out % 8)"
        elif matches(name, sel.embed):
            if len(shape) == 2 and (sel.ragged or shape[1] % sel.embed_group_size == 0):
                plan.embed.append(name)
            else:
                plan.kept[name] = f"embedding dim {shape[-1]} is not a multiple of {sel.embed_group_size}"
    return plan


def int4_file_bytes(
    tensors: Mapping[str, Sequence[int]],
    selection: LayerSelection = COMPACT_SELECTION,
    *,
    group_size: int = 32,
    metadata: Mapping[str, str] | None = None,
) -> tuple[int, int]:
    """(tensor bytes, header bytes) of the int4 file `quantize` writes for a model whose float
    tensors (name -> shape) are `tensors`, every selected layer packed (as when calibration covers
    it). Tensor bytes are exact; the header is the safetensors JSON built the same way (names,
    dtypes, shapes, offsets, our metadata lists plus `metadata`), exact up to the ordering of the
    offsets' digits (a few bytes)."""
    shapes = {k[: -len(".weight")]: tuple(v) for k, v in tensors.items() if k.endswith(".weight")}
    plan = plan_layers(shapes, selection, group_size=group_size)
    gptq, extra, embed = set(plan.gptq) | set(plan.rtn), set(plan.extra), set(plan.embed)
    out: dict[str, tuple[str, tuple[int, ...], int]] = {}  # name -> dtype, shape, bytes
    lists: dict[str, list[dict]] = {"quant": [], "extra": [], "embed": []}
    for key, shape in tensors.items():
        name = key[: -len(".weight")] if key.endswith(".weight") else ""
        shape = tuple(shape)
        if name in gptq:
            n, k = shape
            g = k // group_size
            out[f"{name}.qweight"] = ("I32", (k // 8, n), k // 8 * n * 4)
            out[f"{name}.qzeros"] = ("I32", (g, n // 8), g * n // 8 * 4)
            out[f"{name}.scales"] = ("F16", (g, n), g * n * 2)
            out[f"{name}.g_idx"] = ("I32", (k,), k * 4)
            lists["quant"].append(
                {
                    "name": name,
                    "wbits": 4,
                    "groupsize": group_size,
                    "actorder": False,
                    "in_features": k,
                    "out_features": n,
                }
            )
        elif name in extra or name in embed:
            rows, cols = shape
            gs = group_size if name in extra else selection.embed_group_size
            g = -(-cols // gs)
            prefix = "_extra" if name in extra else "_embed"
            out[f"{prefix}.{name}.qweight_u8"] = ("U8", (rows, (cols + 1) // 2), rows * ((cols + 1) // 2))
            for part in ("scales", "zeros"):
                out[f"{prefix}.{name}.{part}"] = ("F16", (rows, g), rows * g * 2)
            if name in extra:
                lists["extra"].append(
                    {"name": name, "in_features": cols, "out_features": rows, "num_groups": g}
                )
            else:
                lists["embed"].append(
                    {"name": name, "num_embeddings": rows, "embedding_dim": cols, "num_groups": g}
                )
        else:
            out[key] = ("F16", shape, prod(shape) * 2)
    data = sum(b for _, _, b in out.values())
    header: dict[str, object] = {}
    offset = 0
    for key in sorted(out):
        dtype, shape, nbytes = out[key]
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    meta = dict(metadata or {})
    meta.update(
        {
            "quant_method": "autobit",
            "checkpoint_format": "gptq",
            "quant_layers_json": json.dumps(lists["quant"]),
            "extra_quant_layers_json": json.dumps(lists["extra"]),
            "embed_quant_layers_json": json.dumps(lists["embed"]),
        }
    )
    header["__metadata__"] = meta
    text = json.dumps(header, separators=(",", ":"))
    return data, 8 + -(-len(text.encode()) // 8) * 8
