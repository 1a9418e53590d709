"""The pretrained text backbones of v4 files: their configs, read from the metadata
`text_encoder_config_json` (a Hugging Face config object) and picked by its `model_type`:
"modernbert" (v4-Small, v4.1-Small, v4.1-Small-MF) or "t5gemma2" (v4-Large).

Torch-free: `engine.config` (and so the model sources) read files with it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from ..errors import CheckpointError

LAYER_TYPES = ("full_attention", "sliding_attention")
# GELU spellings of Hugging Face configs: exact (erf) or the tanh approximation.
GELU_ACTIVATIONS = {"gelu": "none", "gelu_python": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}
# RoPE variants of T5Gemma 2 layers: plain, or positions divided by `factor` ("linear").
T5GEMMA_ROPE_TYPES = ("default", "linear")


@dataclass(frozen=True)
class BackboneConfig:
    """The pretrained ModernBERT text backbone of v4 files (metadata `text_encoder_config_json`).

    Built from the Hugging Face config object stored in the file (docs/models.md, "The v4 file format"):
    transformers 5.x `layer_types` / `rope_parameters`, or the 4.x `global_attn_every_n_layers`,
    `global_rope_theta`, `local_rope_theta` (`layer_types` wins). Fields we do not use are kept
    in `raw`, so a re-saved file keeps the object unchanged.
    """

    model_type: ClassVar[str] = "modernbert"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    layer_types: tuple[str, ...]
    full_rope_theta: float = 160000.0
    sliding_rope_theta: float = 10000.0
    local_attention: int = 128
    norm_eps: float = 1e-5
    norm_bias: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hidden_activation: str = "gelu"
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def gelu_approximate(self) -> str:
        return GELU_ACTIVATIONS[self.hidden_activation]

    def rope_theta(self, layer_type: str) -> float:
        return self.full_rope_theta if layer_type == "full_attention" else self.sliding_rope_theta

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "text_encoder_config_json") -> BackboneConfig:
        def bad(msg: str) -> CheckpointError:
            return CheckpointError(f"{source}: text backbone config: {msg}")

        if not isinstance(data, dict):
            raise bad("must be a JSON object")
        model_type = data.get("model_type", "modernbert")
        if model_type != "modernbert":
            raise bad(f"model_type {model_type!r} is not a ModernBERT config (use parse_backbone_config)")
        shape = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        missing = [k for k in shape if not isinstance(data.get(k), int) or data[k] <= 0]
        if missing:
            raise bad(f"missing or non-positive {', '.join(missing)}")
        n = data["num_hidden_layers"]
        layer_types = data.get("layer_types")
        if layer_types is None:
            every = int(data.get("global_attn_every_n_layers") or 1)
            layer_types = ["full_attention" if i % every == 0 else "sliding_attention" for i in range(n)]
        if not isinstance(layer_types, list) or len(layer_types) != n or set(layer_types) - set(LAYER_TYPES):
            raise bad(f"layer_types must list {n} of {', '.join(LAYER_TYPES)}, got {layer_types!r}")
        full = float(data.get("global_rope_theta") or 160000.0)
        sliding = float(data.get("local_rope_theta") or 10000.0)
        rope = data.get("rope_parameters")
        if isinstance(rope, dict):
            per_type = rope if set(rope) & set(LAYER_TYPES) else dict.fromkeys(LAYER_TYPES, rope)
            thetas = {}
            for kind in LAYER_TYPES:
                params = per_type.get(kind) or {}
                if params.get("rope_type", "default") not in ("default", None):
                    raise bad(f"rope_type {params['rope_type']!r} ({kind}) is not supported, only 'default'")
                thetas[kind] = params.get("rope_theta")
            full = float(thetas["full_attention"] or full)
            sliding = float(thetas["sliding_attention"] or sliding)
        activation = data.get("hidden_activation", "gelu")
        if activation not in GELU_ACTIVATIONS:
            raise bad(f"hidden_activation {activation!r} is not supported ({', '.join(GELU_ACTIVATIONS)})")
        cfg = cls(
            vocab_size=data["vocab_size"],
            hidden_size=data["hidden_size"],
            intermediate_size=data["intermediate_size"],
            num_hidden_layers=n,
            num_attention_heads=data["num_attention_heads"],
            layer_types=tuple(layer_types),
            full_rope_theta=full,
            sliding_rope_theta=sliding,
            local_attention=int(data.get("local_attention", 128)),
            norm_eps=float(data.get("norm_eps", 1e-5)),
            norm_bias=bool(data.get("norm_bias", False)),
            attention_bias=bool(data.get("attention_bias", False)),
            mlp_bias=bool(data.get("mlp_bias", False)),
            hidden_activation=activation,
            pad_token_id=data.get("pad_token_id"),
            bos_token_id=data.get("bos_token_id"),
            raw=dict(data),
        )
        if cfg.hidden_size % cfg.num_attention_heads or cfg.head_dim % 2:
            raise bad(
                f"hidden_size {cfg.hidden_size} over {cfg.num_attention_heads} heads "
                "must give an even head size"
            )
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """The Hugging Face config object as stored (what `from_dict` read, or our fields)."""
        if self.raw:
            return dict(self.raw)
        return {
            "model_type": "modernbert",
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "raw"},
            "layer_types": list(self.layer_types),
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": self.full_rope_theta},
                "sliding_attention": {"rope_type": "default", "rope_theta": self.sliding_rope_theta},
            },
        }


def _positive_ints(data: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    return [k for k in names if not isinstance(data.get(k), int) or isinstance(data[k], bool) or data[k] <= 0]


@dataclass(frozen=True)
class T5Gemma2Config:
    """The T5Gemma 2 text encoder of v4-Large (`model_type` "t5gemma2").

    The file stores a whole `T5Gemma2Config` (encoder with text and vision towers, decoder);
    only `encoder.text_config` and the top-level `eoi_token_index` build anything: a Gemma 3
    style bidirectional encoder (grouped-query attention, q/k norms, `1 + w` RMSNorms, RoPE per
    layer type, an asymmetric sliding window). The whole object is kept in `raw`.
    """

    model_type: ClassVar[str] = "t5gemma2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    sliding_window: int
    query_pre_attn_scalar: float = 256.0
    full_rope_theta: float = 1_000_000.0
    full_rope_factor: float = 1.0
    sliding_rope_theta: float = 10_000.0
    sliding_rope_factor: float = 1.0
    rms_norm_eps: float = 1e-6
    hidden_activation: str = "gelu_pytorch_tanh"
    attention_bias: bool = False
    eoi_token_index: int | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def gelu_approximate(self) -> str:
        return GELU_ACTIVATIONS[self.hidden_activation]

    @property
    def attention_scale(self) -> float:
        """Scores are q k^T * query_pre_attn_scalar^-0.5 (not head_dim^-0.5)."""
        return float(self.query_pre_attn_scalar) ** -0.5

    @property
    def window(self) -> tuple[int, int]:
        """(back, ahead) of sliding layers: keys k in [q - ceil(W/2) + 1, q + floor(W/2)]."""
        W = self.sliding_window
        return math.ceil(W / 2) - 1, W // 2

    def rope(self, layer_type: str) -> tuple[float, float]:
        """(theta, linear factor) of a layer type."""
        if layer_type == "full_attention":
            return self.full_rope_theta, self.full_rope_factor
        return self.sliding_rope_theta, self.sliding_rope_factor

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "text_encoder_config_json") -> T5Gemma2Config:
        def bad(msg: str) -> CheckpointError:
            return CheckpointError(f"{source}: T5Gemma 2 text backbone config: {msg}")

        if not isinstance(data, dict) or data.get("model_type") != "t5gemma2":
            raise bad("must be a JSON object with model_type 't5gemma2'")
        encoder = data.get("encoder")
        text = encoder.get("text_config") if isinstance(encoder, dict) else None
        if not isinstance(text, dict):
            raise bad("has no encoder.text_config object (the text tower's config)")
        shape = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        missing = _positive_ints(text, shape)
        if missing:
            raise bad(f"encoder.text_config: missing or non-positive {', '.join(missing)}")
        n, heads = text["num_hidden_layers"], text["num_attention_heads"]
        kv_heads = text.get("num_key_value_heads") or heads
        head_dim = text.get("head_dim") or text["hidden_size"] // heads
        window = text.get("sliding_window")
        layer_types = text.get("layer_types")
        if layer_types is None:  # transformers 4.x Gemma 3: every `sliding_window_pattern`-th layer is full
            every = int(text.get("sliding_window_pattern") or 6)
            layer_types = [
                "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)
            ]
        if not isinstance(layer_types, list) or len(layer_types) != n or set(layer_types) - set(LAYER_TYPES):
            raise bad(f"layer_types must list {n} of {', '.join(LAYER_TYPES)}, got {layer_types!r}")
        if "sliding_attention" in layer_types and not (isinstance(window, int) and window > 0):
            raise bad(f"sliding_window must be a positive integer, got {window!r}")
        if text.get("attn_logit_softcapping") is not None:
            raise bad("attn_logit_softcapping is set; T5Gemma 2 encoders without softcapping only")
        activation = text.get("hidden_activation", "gelu_pytorch_tanh")
        if activation not in GELU_ACTIVATIONS:
            raise bad(f"hidden_activation {activation!r} is not supported ({', '.join(GELU_ACTIVATIONS)})")
        rope = _t5gemma_rope(text, bad)

        def token_id(name: str) -> int | None:
            value = text.get(name, data.get(name))
            return value if isinstance(value, int) and not isinstance(value, bool) else None

        eoi = data.get("eoi_token_index", encoder.get("eoi_token_index"))  # type: ignore[union-attr]
        cfg = cls(
            vocab_size=text["vocab_size"],
            hidden_size=text["hidden_size"],
            intermediate_size=text["intermediate_size"],
            num_hidden_layers=n,
            num_attention_heads=heads,
            num_key_value_heads=int(kv_heads),
            head_dim=int(head_dim),
            layer_types=tuple(layer_types),
            sliding_window=int(window or 0),
            query_pre_attn_scalar=float(text.get("query_pre_attn_scalar", 256)),
            full_rope_theta=rope["full_attention"][0],
            full_rope_factor=rope["full_attention"][1],
            sliding_rope_theta=rope["sliding_attention"][0],
            sliding_rope_factor=rope["sliding_attention"][1],
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            hidden_activation=activation,
            attention_bias=bool(text.get("attention_bias", False)),
            eoi_token_index=eoi if isinstance(eoi, int) and not isinstance(eoi, bool) else None,
            pad_token_id=token_id("pad_token_id"),
            bos_token_id=token_id("bos_token_id"),
            eos_token_id=token_id("eos_token_id"),
            raw=dict(data),
        )
        if cfg.num_key_value_heads <= 0 or cfg.num_attention_heads % cfg.num_key_value_heads:
            raise bad(f"{heads} query heads cannot share {kv_heads} key/value heads")
        if cfg.head_dim <= 0 or cfg.head_dim % 2:
            raise bad(f"head_dim must be even and positive for RoPE, got {cfg.head_dim}")
        return cfg

    def to_dict(self) -> dict[str, Any]:
        """The Hugging Face config object as stored (what `from_dict` read, or our fields)."""
        if self.raw:
            return dict(self.raw)
        skip = {"raw", "eoi_token_index"} | {
            f"{k}_rope_{p}" for k in ("full", "sliding") for p in ("theta", "factor")
        }
        text = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
        text["layer_types"] = list(self.layer_types)
        text["rope_parameters"] = {kind: _rope_entry(*self.rope(kind)) for kind in LAYER_TYPES}
        ids = {k: getattr(self, k) for k in ("pad_token_id", "bos_token_id", "eos_token_id")}
        return {
            "model_type": "t5gemma2",
            "encoder": {"text_config": text, "eoi_token_index": self.eoi_token_index},
            "eoi_token_index": self.eoi_token_index,
            **ids,
        }


def _rope_entry(theta: float, factor: float) -> dict[str, Any]:
    if factor == 1.0:
        return {"rope_type": "default", "rope_theta": theta}
    return {"rope_type": "linear", "factor": factor, "rope_theta": theta}


def _t5gemma_rope(text: dict[str, Any], bad) -> dict[str, tuple[float, float]]:
    """(theta, linear factor) per layer type: transformers 5.x `rope_parameters` per type, or the
    4.x `rope_theta` / `rope_scaling` (full layers) and `rope_local_base_freq` (sliding)."""
    params = text.get("rope_parameters")
    if isinstance(params, dict) and set(params) & set(LAYER_TYPES):
        per_type = {kind: params.get(kind) or {} for kind in LAYER_TYPES}
    else:
        scaling = text.get("rope_scaling") or {}
        per_type = {
            "full_attention": {**scaling, "rope_theta": text.get("rope_theta", 1_000_000.0)},
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": text.get("rope_local_base_freq", 10_000.0),
            },
        }
    out = {}
    for kind, entry in per_type.items():
        rope_type = entry.get("rope_type") or entry.get("type") or "default"
        if rope_type not in T5GEMMA_ROPE_TYPES:
            raise bad(f"rope_type {rope_type!r} ({kind}) is not supported ({', '.join(T5GEMMA_ROPE_TYPES)})")
        theta = entry.get("rope_theta") or (1_000_000.0 if kind == "full_attention" else 10_000.0)
        factor = float(entry.get("factor", 1.0)) if rope_type == "linear" else 1.0
        if not factor > 0:
            raise bad(f"linear RoPE factor must be positive ({kind}), got {factor}")
        out[kind] = (float(theta), factor)
    return out


# What `ModelConfig.text_backbone` holds for a v4 file.
TextBackboneConfig = BackboneConfig | T5Gemma2Config
BACKBONES: dict[str, type[BackboneConfig] | type[T5Gemma2Config]] = {
    "modernbert": BackboneConfig,
    "t5gemma2": T5Gemma2Config,
}


def parse_backbone_config(data: Any, *, source: str = "text_encoder_config_json") -> TextBackboneConfig:
    """The backbone config of a `text_encoder_config_json` object, by its `model_type`
    (absent: ModernBERT, as 4.x-era v4 files may store it); any other type is refused."""
    if not isinstance(data, dict):
        raise CheckpointError(f"{source}: text backbone config: must be a JSON object")
    model_type = data.get("model_type", "modernbert")
    kind = BACKBONES.get(model_type) if isinstance(model_type, str) else None
    if kind is None:
        raise CheckpointError(
            f"{source}: text backbone model_type {model_type!r} is not supported "
            "(modernbert: v4-Small / v4.1-Small / v4.1-Small-MF; t5gemma2: v4-Large)"
        )
    return kind.from_dict(data, source=source)
