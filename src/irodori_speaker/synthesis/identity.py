"""What the phrase-cache key needs of a model, found without loading its weights.

    ident = model_identity(tiny_random=True, backend="cpu")   # headers read, files hashed
    ident.render_identity("こんにちは。", voice, {"seed": 0})  # what the loaded Synthesizer gives

`plan_load` is every step of loading up to the weights: the preset, the files (resolved, or the
tiny-random ones built), the model's config from its safetensors header, the tokenizer files.
`loading.load_synthesizer` loads from that plan, and the loaded `Synthesizer` derives its key
from a `ModelIdentity` of what it loaded, with the same methods: the key made here and the
loaded model's cannot disagree. `prebuild` uses it to look a file's phrases up before it loads
anything (a file whose every phrase is cached loads no model).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.checkpoint import config_from_metadata, read_header, resolve_dtype
from ..engine.config import InferenceConfig, ModelConfig
from ..engine.hardware.presets import Preset, resolve_threads, select_preset
from ..engine.sampler import MEANFLOW_IGNORED, meanflow_defaults, plan_meanflow
from ..engine.sources import CODEC_REPO, DEFAULT_MODEL, TOKENIZER_REPO, resolve, resolve_files
from ..engine.tiny import tiny_random_files
from ..errors import CheckpointError, InputError
from ..options import SAMPLE_RATE, SynthesisOptions
from ..text.backbone_tokenizer import find_tokenizer_dir
from ..text.pauses import canonical
from ..text.userdict import resolve_user_dict
from .fingerprint import file_fingerprint
from .load_options import LOAD_FIELDS, LoadOptions, unexpected_keyword
from .plan import spoken_parts
from .voices import Voice

__all__ = ["LoadPlan", "ModelIdentity", "as_load_options", "model_identity", "plan_load", "resolve_options"]

TINY_NOTE = "tiny-random model: the output is noise, not speech"


def as_load_options(model: Any, options: Mapping[str, Any], caller: str = "load_synthesizer") -> LoadOptions:
    """`load_synthesizer(model, **options)`'s arguments as one `LoadOptions` (see its docstring)."""
    if isinstance(model, LoadOptions):
        load = model
    elif model is not None and "model" in options:
        raise TypeError(f"{caller}() got multiple values for argument 'model'")
    else:
        load = LoadOptions(model=model)
    if "cache_dir" in options:
        raise unexpected_keyword(caller, "cache_dir", LOAD_FIELDS)
    own = {k: v for k, v in options.items() if k in LOAD_FIELDS}
    return load.replace(**own).with_preset_fields(**{k: v for k, v in options.items() if k not in own})


@dataclass(frozen=True)
class LoadPlan:
    """What `load` will load, before any weight is read."""

    preset: Preset  # its threads decided
    threads_why: str  # why that many threads (the startup log)
    model: Path
    codec: Path
    tokenizer: Path | None  # the text tokenizer's file (v4: its folder's tokenizer.json); None: an object
    caption_tokenizer: Path | None  # a caption tokenizer file of its own (v2/v3 VoiceDesign), else None
    config: ModelConfig  # from the model file's header
    inference: InferenceConfig
    tokenizer_object: Any = None  # a tokenizer object given instead of a file
    note: str | None = None  # the tiny-random notice

    def fingerprints(self) -> dict[str, str]:
        """Content hashes of the files the model reads (a tokenizer object: its `fingerprint`)."""
        tok = self.tokenizer_object
        fps = {
            "model": file_fingerprint(self.model),
            "codec": file_fingerprint(self.codec),
            "tokenizer": (
                file_fingerprint(self.tokenizer)
                if tok is None and self.tokenizer is not None
                else str(getattr(tok, "fingerprint", None) or f"object:{type(tok).__qualname__}")
            ),
        }
        if self.caption_tokenizer is not None:
            fps["caption_tokenizer"] = file_fingerprint(self.caption_tokenizer)
        return fps


def plan_preset(load: LoadOptions) -> tuple[Preset, str]:
    """The preset `load` asks for (the backend's, or `load.preset`, with the overrides), its
    threads decided, and why that many."""
    preset, overrides = load.preset, {}
    if preset is None or isinstance(preset, Mapping):  # preset fields by name: over the backend's
        overrides, preset = dict(preset or {}), None
    if load.device is not None:
        overrides["device"] = load.device
    if load.dtype is not None:
        overrides["dtype"] = resolve_dtype(load.dtype)
    if load.threads is not None:
        overrides["threads"] = load.threads
    preset = (
        preset.with_overrides(**overrides) if preset is not None else select_preset(load.backend, **overrides)
    )
    return resolve_threads(preset)


def plan_load(load: LoadOptions) -> LoadPlan:
    """Every step of loading `load` that reads no weight: files resolved (downloaded if need be;
    tiny-random ones built), the model's config from its header, the tokenizer files."""
    preset, why = plan_preset(load)
    tokenizer, tiny = load.tokenizer, load.tiny_random
    given_tok = tokenizer is not None and not isinstance(tokenizer, (str, os.PathLike))
    tok_path: Path | None
    if tiny:
        files = tiny_random_files(kind=tiny if isinstance(tiny, str) else None)
        model_path, codec_path, tok_path = files.model, files.codec, files.tokenizer
    else:
        # all three at once, so a first run offline names every missing file in one error
        model_path, codec_path, tok_path = resolve_files(
            load.model or DEFAULT_MODEL,
            load.codec or CODEC_REPO,
            tokenizer,
            cache_dir=load.model_dir,
            want_tokenizer=not given_tok,
        )
    meta, _ = read_header(model_path)
    cfg, inference = config_from_metadata(meta, str(model_path))
    cap_path: Path | None = None
    if given_tok:
        tok_path = None
    elif cfg.pretrained_text:  # v4: the release's tokenizer/ folder, for text and caption
        folder = None if tok_path is None else (tok_path.parent if tok_path.is_file() else tok_path)
        folder = folder or find_tokenizer_dir(model_path)
        if folder is None:
            raise CheckpointError(
                f"{model_path} is a v4 model but no tokenizer/ folder was found beside it",
                hint="put the release's tokenizer/ folder next to model.safetensors, "
                "or pass --tokenizer FOLDER",
            )
        tok_path = folder / "tokenizer.json"  # what the tokenizer reads (hashed for the cache key)
    else:
        if tok_path is None:
            tok_source = tokenizer or cfg.text_tokenizer_repo or TOKENIZER_REPO
            tok_path = resolve(tok_source, "tokenizer", cache_dir=load.model_dir)
        repo = cfg.caption_tokenizer_repo  # None: the text tokenizer's
        own = repo != cfg.text_tokenizer_repo or tokenizer is not None
        if cfg.caption_enabled and repo is not None and own and not tiny:
            cap_path = resolve(repo, "tokenizer")
            cap_path = None if cap_path == tok_path else cap_path
    return LoadPlan(
        preset,
        why,
        model_path,
        codec_path,
        tok_path,
        cap_path,
        cfg,
        inference,
        tokenizer_object=tokenizer if given_tok else None,
        note=TINY_NOTE if tiny else None,
    )


def resolve_options(
    config: ModelConfig,
    inference: InferenceConfig,
    preset: Preset,
    options: SynthesisOptions | Mapping[str, Any] | None = None,
) -> SynthesisOptions:
    """`options` as a model of `config` renders them on `preset` (`Synthesizer.resolve_options`)."""
    limits = {"max_text_len": inference.max_text_len or 256}
    opts = SynthesisOptions.coerce(options)
    if config.meanflow:  # the release's defaults (4 steps), not the RF preset's
        opts = opts.with_defaults(meanflow_defaults())
        plan_meanflow(opts)  # RF-only settings are an InputError here, before any work
    return opts.resolve(preset, limits)


@dataclass(frozen=True)
class ModelIdentity:
    """What the phrase-cache key needs of a model: its config, its preset, its files' content
    hashes, the user dictionary. A loaded `Synthesizer` has one (`model_identity`); `model_identity()`
    makes one without the weights. Either gives the same `render_identity`."""

    config: ModelConfig
    inference: InferenceConfig
    preset: Preset
    fingerprints: Mapping[str, str]
    user_dict: Any = None  # resolved (text.userdict.resolve_user_dict)
    sample_rate: int = SAMPLE_RATE

    def resolve_options(
        self, options: SynthesisOptions | Mapping[str, Any] | None = None
    ) -> SynthesisOptions:
        return resolve_options(self.config, self.inference, self.preset, options)

    @property
    def identity(self) -> dict[str, Any]:
        """The model, codec and tokenizer content hashes (each once) and the precision it runs at."""
        fps = self.fingerprints
        caption_tok = fps.get("caption_tokenizer")
        return {
            "model": fps.get("model"),
            "codec": fps.get("codec"),
            "tokenizer": fps.get("tokenizer"),
            "caption_tokenizer": None if caption_tok == fps.get("tokenizer") else caption_tok,
            "precision": [
                str(self.preset.dtype),
                str(self.preset.codec_dtype),
                self.preset.name,
                *self.preset.audio_flags(),
            ],
        }

    def render_identity(
        self, text: str, voice: Any = None, options: SynthesisOptions | Mapping[str, Any] | None = None
    ) -> dict:
        """Everything that changes the sound of `text` rendered with `voice` and `options`
        (`Synthesizer.render_identity`); `options.seed` must be set."""
        opts = self.resolve_options(options)
        if opts.seed is None:
            raise InputError("a cacheable line needs a fixed seed (options.seed)")
        if isinstance(voice, (str, os.PathLike)):
            voice = Voice.from_path(voice)
        options_key = opts.audio_identity()
        if self.config.meanflow:  # guidance and schedule change nothing: one key for all of them
            options_key = {k: v for k, v in options_key.items() if k not in MEANFLOW_IGNORED}
        return {
            # after the dictionary and the readings (a new reading is a new line), pauses in one spelling
            "text": "".join(
                p if isinstance(p, str) else canonical(p.seconds)
                for p in spoken_parts(text, opts, self.user_dict)
            ),
            "voice": None if voice is None else voice.content_key(),
            "caption": getattr(voice, "caption", None),
            "options": options_key,
            # the family and sampler too: two families never share a line, even on equal files
            "family": self.config.family,
            "sampler": "meanflow" if self.config.meanflow else "rf",
            **self.identity,
        }


def model_identity(
    model: LoadOptions | str | os.PathLike[str] | None = None, /, **options: Any
) -> ModelIdentity:
    """The `ModelIdentity` of what `load_synthesizer(model, **options)` would load, without
    loading it: the files resolved and hashed, the model's header read, no weight."""
    load = as_load_options(model, options, "model_identity")
    plan = plan_load(load)
    return ModelIdentity(
        plan.config, plan.inference, plan.preset, plan.fingerprints(), resolve_user_dict(load.user_dict)
    )
