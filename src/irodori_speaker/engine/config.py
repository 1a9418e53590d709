"""Model configuration: every field of the released `config_json`, with the spec's defaults."""

from __future__ import annotations

import dataclasses
import json
import math
import typing
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..errors import CheckpointError
from .backbone_config import (  # noqa: F401 - BackboneConfig and the constants: re-exported
    GELU_ACTIVATIONS,
    LAYER_TYPES,
    BackboneConfig,
    T5Gemma2Config,
    TextBackboneConfig,
    parse_backbone_config,
)

# Inference-only keys that may sit in the same `config_json` object.
INFERENCE_KEYS = ("max_text_len", "max_caption_len", "fixed_target_latent_steps", "ref_max_seconds")

DURATION_ARCHITECTURES = ("token_sum_adarn_zero_no_aux", "token_sum_dual_adarn_zero_no_aux")
FLOW_PARAMETERIZATIONS = ("rf_velocity", "meanflow")
TEXT_ENCODER_TYPES = ("scratch", "pretrained")
PROJECTOR_TYPES = ("linear", "residual_mlp")
# Reference cap of files that do not store `ref_max_seconds` (v2, v3).
DEFAULT_REF_MAX_SECONDS = 30.0


def _field_type_error(name: str, value: Any, hint: Any) -> str | None:
    """Why `value` is not of the annotated type `hint` (int, float, bool, str, X | None), else None.

    JSON has no int/float split we can trust for floats, so an int is a valid float; a bool is
    never a number (json gives True for `true`, and True == 1 would hide the mistake)."""
    args = typing.get_args(hint)
    if type(None) in args:
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint in (bool, str):
        ok = isinstance(value, hint)
    else:
        return None  # nested objects are checked by their own parser
    if ok:
        return None
    shown = json.dumps(value, ensure_ascii=False, default=str)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    kind = {float: "a finite number", int: "an integer", bool: "true or false", str: "a string"}[hint]
    return f"config field {name!r} must be {kind}, got {shown}"


def _check_field_types(cls: type, data: dict[str, Any], source: str, what: str = "config_json") -> None:
    """A `CheckpointError` naming the first field of `data` whose value is not of its dataclass type."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in data and (why := _field_type_error(f.name, data[f.name], hints[f.name])):
            raise CheckpointError(
                f"{source}: {what}: {why}", hint="the file's metadata is damaged or hand-edited"
            )


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of TextToLatentRFDiT (defaults: the released v2 files')."""

    latent_dim: int = 128
    latent_patch_size: int = 1
    model_dim: int = 2048
    num_layers: int = 24
    num_heads: int = 16
    mlp_ratio: float = 2.875
    text_mlp_ratio: float = 2.6
    speaker_mlp_ratio: float = 2.6
    dropout: float = 0.0
    text_vocab_size: int = 102400
    text_tokenizer_repo: str | None = None
    text_add_bos: bool = True
    text_dim: int = 1280
    text_layers: int = 14
    text_heads: int = 10
    use_caption_condition: bool = False
    use_speaker_condition: bool | None = None
    caption_vocab_size: int | None = None
    caption_tokenizer_repo: str | None = None
    caption_add_bos: bool | None = None
    caption_dim: int | None = None
    caption_layers: int | None = None
    caption_heads: int | None = None
    caption_mlp_ratio: float | None = None
    speaker_dim: int = 1280
    speaker_layers: int = 14
    speaker_heads: int = 10
    speaker_patch_size: int = 1
    timestep_embed_dim: int = 512
    adaln_rank: int = 256
    norm_eps: float = 1e-5
    use_duration_predictor: bool = False
    duration_aux_dim: int = 14
    duration_hidden_dim: int = 1024
    duration_layers: int = 3
    duration_dropout: float = 0.1
    duration_attention_heads: int = 8
    duration_architecture: str = "token_sum_adarn_zero_no_aux"
    duration_token_init_frames: float = 9.0
    duration_speaker_fusion: str = "adarn_zero"
    duration_caption_fusion: str = "adarn_zero"
    duration_caption_pooling: str = "masked_mean"
    # v4: the pretrained text backbone, projectors and the MeanFlow parameterisation
    flow_parameterization: str = "rf_velocity"
    text_encoder_type: str = "scratch"
    text_encoder_revision: str | None = None
    pretrained_projector_type: str = "linear"
    pretrained_projector_hidden_ratio: float = 2.0
    pretrained_projector_dropout: float = 0.0
    # From the separate metadata key `text_encoder_config_json` (not part of `config_json`).
    text_backbone: TextBackboneConfig | None = None
    # Fields we did not recognise, kept so a re-saved file loses nothing.
    unknown: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ---- derived ------------------------------------------------------------------------
    @property
    def speaker_enabled(self) -> bool:
        if self.use_speaker_condition is None:
            return not self.use_caption_condition
        return bool(self.use_speaker_condition)

    @property
    def caption_enabled(self) -> bool:
        return bool(self.use_caption_condition)

    @property
    def pretrained_text(self) -> bool:
        """v4: text and caption go through the pretrained backbone and a projector each."""
        return self.text_encoder_type == "pretrained"

    @property
    def meanflow(self) -> bool:
        """v4.1-MF: the model predicts the average velocity over [t - dt, t]."""
        return self.flow_parameterization == "meanflow"

    @property
    def family(self) -> str:
        """Which release this configuration is shaped like: v2, v2-voicedesign, v3,
        v3-voicedesign, v4 (v4 / v4.1, rectified flow), v4.1-mf (MeanFlow) or v4-large (the
        T5Gemma 2 backbone; "v4-large-mf" would be a MeanFlow one, none is released)."""
        if self.pretrained_text and isinstance(self.text_backbone, T5Gemma2Config):
            return "v4-large-mf" if self.meanflow else "v4-large"
        if self.pretrained_text:
            return "v4.1-mf" if self.meanflow else "v4"
        base = "v3" if self.use_duration_predictor else "v2"
        return f"{base}-voicedesign" if self.caption_enabled else base

    @property
    def text_token_vocab(self) -> int:
        """Size of the table text ids index: the backbone's vocabulary in v4, else text_vocab_size."""
        if self.text_backbone is not None and self.pretrained_text:
            return self.text_backbone.vocab_size
        return self.text_vocab_size

    @property
    def caption_token_vocab(self) -> int:
        if self.text_backbone is not None and self.pretrained_text:
            return self.text_backbone.vocab_size
        return self.caption("vocab_size")

    @property
    def speaker_in_dim(self) -> int:
        """Width of one speaker-encoder input position: the reference is patched by
        latent_patch_size, then by speaker_patch_size."""
        return self.latent_dim * self.latent_patch_size * self.speaker_patch_size

    @property
    def patched_latent_dim(self) -> int:
        return self.latent_dim * self.latent_patch_size

    @property
    def head_dim(self) -> int:
        return self.model_dim // self.num_heads

    @property
    def mlp_hidden(self) -> int:
        return int(self.model_dim * self.mlp_ratio)

    @property
    def text_mlp_hidden(self) -> int:
        return int(self.text_dim * self.text_mlp_ratio)

    @property
    def speaker_mlp_hidden(self) -> int:
        return int(self.speaker_dim * self.speaker_mlp_ratio)

    def caption(self, name: str) -> Any:
        """A caption_* field, falling back to the text_* field when null."""
        value = getattr(self, f"caption_{name}")
        return getattr(self, f"text_{name}") if value is None else value

    @property
    def caption_mlp_hidden(self) -> int:
        return int(self.caption("dim") * self.caption("mlp_ratio"))

    @property
    def dual_duration(self) -> bool:
        return self.duration_architecture == "token_sum_dual_adarn_zero_no_aux"

    # ---- (de)serialisation ----------------------------------------------------------------
    @classmethod
    def from_dict(
        cls, data: dict[str, Any], *, source: str = "config", text_backbone: TextBackboneConfig | None = None
    ) -> ModelConfig:
        """Build from a `config_json` object: missing fields take defaults, unknown ones warn.

        `text_backbone` is the parsed `text_encoder_config_json` of a v4 file."""
        known = {f.name for f in dataclasses.fields(cls)} - {"unknown", "text_backbone"}
        _check_field_types(cls, {k: v for k, v in data.items() if k in known}, source)
        kwargs: dict[str, Any] = {k: v for k, v in data.items() if k in known}
        kwargs["text_backbone"] = text_backbone
        unknown = {k: v for k, v in data.items() if k not in known and k not in INFERENCE_KEYS}
        if unknown:
            warnings.warn(
                f"{source}: ignoring unknown config fields {sorted(unknown)}", UserWarning, stacklevel=2
            )
        try:
            cfg = cls(**kwargs, unknown=unknown)
        except TypeError as e:  # pragma: no cover - dataclass kwargs are filtered above
            raise CheckpointError(f"{source}: bad config: {e}") from e
        cfg.validate(source)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        skip = ("unknown", "text_backbone")
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in skip}
        out.update(self.unknown)
        return out

    def validate(self, source: str = "config") -> None:
        def bad(msg: str) -> CheckpointError:
            return CheckpointError(f"{source}: {msg}")

        for name, allowed in (
            ("flow_parameterization", FLOW_PARAMETERIZATIONS),
            ("text_encoder_type", TEXT_ENCODER_TYPES),
            ("pretrained_projector_type", PROJECTOR_TYPES),
        ):
            if getattr(self, name) not in allowed:
                raise bad(f"unsupported {name} {getattr(self, name)!r} (supported: {', '.join(allowed)})")
        positive = ["model_dim", "num_layers", "num_heads", "latent_dim", "text_dim", "speaker_dim"]
        positive += ["latent_patch_size", "speaker_patch_size", "timestep_embed_dim", "adaln_rank"]
        positive += ["mlp_ratio", "text_mlp_ratio", "speaker_mlp_ratio", "norm_eps", "text_vocab_size"]
        if not self.pretrained_text:
            positive.append("text_heads")
        if self.speaker_enabled:
            positive.append("speaker_heads")
        if self.use_duration_predictor:
            positive += ["duration_hidden_dim", "duration_layers", "duration_attention_heads"]
        for name in positive:
            if not getattr(self, name) > 0:
                raise bad(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("text_layers", "speaker_layers", "duration_aux_dim"):
            if getattr(self, name) < 0:
                raise bad(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("dropout", "duration_dropout", "pretrained_projector_dropout"):
            if not 0 <= getattr(self, name) < 1:
                raise bad(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.model_dim % self.num_heads:
            raise bad(f"model_dim {self.model_dim} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 2:
            raise bad(f"head_dim {self.head_dim} must be even for RoPE")
        if self.speaker_enabled and self.speaker_dim % self.speaker_heads:
            raise bad(f"speaker_dim {self.speaker_dim} is not divisible by speaker_heads")
        if self.pretrained_text:
            self._validate_pretrained(bad)
        else:
            self._validate_scratch(bad)
        if self.use_duration_predictor and self.duration_architecture not in DURATION_ARCHITECTURES:
            raise bad(
                f"unsupported duration_architecture {self.duration_architecture!r} "
                f"(supported: {', '.join(DURATION_ARCHITECTURES)})"
            )
        if self.use_duration_predictor and self.dual_duration and not self.caption_enabled:
            raise bad("the dual duration predictor needs caption conditioning")

    def _validate_pretrained(self, bad) -> None:
        if self.text_backbone is None:
            raise bad(
                "text_encoder_type is 'pretrained' but the file has no text_encoder_config_json "
                "(the backbone's config), so the text encoder cannot be built offline"
            )
        if self.caption_enabled and self.caption_tokenizer_repo not in (None, self.text_tokenizer_repo):
            raise bad(
                "text and caption share the pretrained backbone, so text_tokenizer_repo and "
                f"caption_tokenizer_repo must be equal ({self.text_tokenizer_repo!r} != "
                f"{self.caption_tokenizer_repo!r})"
            )

    def _validate_scratch(self, bad) -> None:
        if self.text_dim % self.text_heads:
            raise bad(f"text_dim {self.text_dim} is not divisible by text_heads {self.text_heads}")
        if self.caption_enabled:
            if self.caption("vocab_size") is None:
                raise bad("use_caption_condition is set but caption_vocab_size/text_vocab_size is null")
            if self.caption("dim") % self.caption("heads"):
                raise bad("caption_dim is not divisible by caption_heads")


@dataclass(frozen=True)
class InferenceConfig:
    """The optional inference keys stored beside the model config."""

    max_text_len: int | None = 256
    max_caption_len: int | None = None
    fixed_target_latent_steps: int | None = None
    ref_max_seconds: float | None = None  # v4: 120 s; stored only when > 0

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> InferenceConfig:
        kw = {k: data[k] for k in INFERENCE_KEYS if k in data}
        _check_field_types(cls, kw, source)
        if kw.get("max_text_len") is None:
            kw["max_text_len"] = 256
        if kw.get("ref_max_seconds") is not None and not float(kw["ref_max_seconds"]) > 0:
            kw["ref_max_seconds"] = None
        return cls(**kw)

    @property
    def reference_seconds(self) -> float:
        """How much reference audio a voice may give: the file's cap, else 30 s (v2, v3)."""
        return float(self.ref_max_seconds) if self.ref_max_seconds else DEFAULT_REF_MAX_SECONDS


def _json_object(text: str, key: str, source: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{source}: {key} is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{source}: {key} must be a JSON object")
    return data


def parse_config_json(
    text: str, *, source: str, text_encoder_config: str | None = None
) -> tuple[ModelConfig, InferenceConfig]:
    """(model config, inference keys) from the `config_json` metadata (and, in v4 files, the
    backbone's `text_encoder_config_json`)."""
    data = _json_object(text, "config_json", source)
    backbone = None
    if text_encoder_config is not None:
        raw = _json_object(text_encoder_config, "text_encoder_config_json", source)
        try:
            backbone = parse_backbone_config(raw, source=source)
        except (TypeError, ValueError) as e:  # a number field holding a string, a list, ...
            raise CheckpointError(
                f"{source}: text_encoder_config_json: a field of the wrong type ({e})"
            ) from e
    cfg = ModelConfig.from_dict(data, source=source, text_backbone=backbone)
    return cfg, InferenceConfig.from_dict(data, source=source)
