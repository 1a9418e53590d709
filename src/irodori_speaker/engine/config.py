"""Model configuration: every field of the released `config_json`, with the spec's defaults."""

from __future__ import annotations

import dataclasses
import json
import warnings
from dataclasses import dataclass, field
from typing import Any

from ..errors import CheckpointError

# Inference-only keys that may sit in the same `config_json` object.
INFERENCE_KEYS = ("max_text_len", "max_caption_len", "fixed_target_latent_steps")

DURATION_ARCHITECTURES = ("token_sum_adarn_zero_no_aux", "token_sum_dual_adarn_zero_no_aux")


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
    def from_dict(cls, data: dict[str, Any], *, source: str = "config") -> ModelConfig:
        """Build from a `config_json` object: missing fields take defaults, unknown ones warn."""
        known = {f.name for f in dataclasses.fields(cls)} - {"unknown"}
        kwargs = {k: v for k, v in data.items() if k in known}
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
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "unknown"}
        out.update(self.unknown)
        return out

    def validate(self, source: str = "config") -> None:
        def bad(msg: str) -> CheckpointError:
            return CheckpointError(f"{source}: {msg}")

        for name in ("model_dim", "num_layers", "num_heads", "latent_dim", "text_dim", "text_heads"):
            if int(getattr(self, name)) <= 0:
                raise bad(f"{name} must be positive, got {getattr(self, name)}")
        if self.model_dim % self.num_heads:
            raise bad(f"model_dim {self.model_dim} is not divisible by num_heads {self.num_heads}")
        if self.head_dim % 2:
            raise bad(f"head_dim {self.head_dim} must be even for RoPE")
        if self.text_dim % self.text_heads:
            raise bad(f"text_dim {self.text_dim} is not divisible by text_heads {self.text_heads}")
        if self.speaker_enabled and self.speaker_dim % self.speaker_heads:
            raise bad(f"speaker_dim {self.speaker_dim} is not divisible by speaker_heads")
        if self.caption_enabled:
            if self.caption("vocab_size") is None:
                raise bad("use_caption_condition is set but caption_vocab_size/text_vocab_size is null")
            if self.caption("dim") % self.caption("heads"):
                raise bad("caption_dim is not divisible by caption_heads")
        if self.use_duration_predictor and self.duration_architecture not in DURATION_ARCHITECTURES:
            raise bad(
                f"unsupported duration_architecture {self.duration_architecture!r} "
                f"(supported: {', '.join(DURATION_ARCHITECTURES)})"
            )
        if self.use_duration_predictor and self.dual_duration and not self.caption_enabled:
            raise bad("the dual duration predictor needs caption conditioning")


@dataclass(frozen=True)
class InferenceConfig:
    """The optional inference keys stored beside the model config."""

    max_text_len: int | None = 256
    max_caption_len: int | None = None
    fixed_target_latent_steps: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> InferenceConfig:
        kw = {k: data[k] for k in INFERENCE_KEYS if k in data}
        if kw.get("max_text_len") is None:
            kw["max_text_len"] = 256
        return cls(**kw)


def parse_config_json(text: str, *, source: str) -> tuple[ModelConfig, InferenceConfig]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{source}: config_json is not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise CheckpointError(f"{source}: config_json must be a JSON object")
    return ModelConfig.from_dict(data, source=source), InferenceConfig.from_dict(data)
