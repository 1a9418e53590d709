"""Loading a Synthesizer: the DiT, the codec and the tokenizers from their sources, for a preset.

    synth = load_synthesizer()                               # the default model, best backend
    synth = load_synthesizer("v2", backend="cpu")            # a release by alias, path, hf:// or repo id
    synth = load_synthesizer(tiny_random=True)               # offline: a small random model (noise)
    synth = load_synthesizer(LoadOptions(model="v4"))        # the options as one value (load_options.py)

`load_dit` picks the DiT's loader by its file (float: the engine's; int4: quant's; with
`preset.int4` a float file is quantised at load), `load_codec_for` the codec's. The weights go
to the device under the model lock (engine/hardware/lock.py), like every other piece of model
work.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

import torch

from ..engine.checkpoint import load_checkpoint, read_header
from ..engine.codec import load_codec
from ..engine.hardware.cpu_tricks import apply_cpu_tricks
from ..engine.hardware.lock import hold_model_lock
from ..engine.hardware.memory import apply_budget
from ..engine.hardware.presets import check_fp8
from ..engine.quant.checkpoint import load_int4_model, model_from_int4
from ..engine.quant.codec import is_lite_int4_codec, load_int4_codec
from ..engine.quant.fp8 import quantize_linears_fp8
from ..engine.quant.quantize import quantize_checkpoint
from ..engine.sources import note_gemma_terms
from ..engine.torchao import int8_layout, is_torchao_file
from ..errors import BackendError
from ..options.memory import budget_from
from ..text.backbone_tokenizer import tokenizer_for_model
from ..text.tokenizer import TextTokenizer
from .identity import as_load_options, plan_load
from .load_options import LoadOptions
from .synthesizer import Synthesizer
from .voices import VoiceCache, default_voice_cache_dir

__all__ = ["load_codec_for", "load_dit", "load_synthesizer"]

log = logging.getLogger("irodori_speaker.synthesis")


def _with_bos(tok: Any, add_bos: bool) -> Any:
    """The same tokenizer with BOS on or off (the caption's `caption_add_bos`)."""
    return TextTokenizer(tok._tok, add_bos=add_bos, bos_id=tok.bos_id, pad_id=tok.pad_id, source=tok.source)


def load_dit(path: Any, preset: Any) -> Any:
    """The DiT for `preset`, by the loader its file needs: float files (and the torchao int8
    `-Quantized` copies, dequantised to the preset's dtype: bf16 on CUDA, fp32 on most CPUs) by
    the engine's, int4 files by quant's. With preset.int4 a float or int8 file is RTN-quantised
    at load (an int8 file from its dequantised weights: int8's per-row rounding is ~1/17 of an
    int4 group's step, so the second rounding adds little). Other torchao files are refused by
    the engine's reader in one line, before any weight is read. With preset.fp8 a float file's
    linears become FP8 after loading (`engine.quant.fp8`); an int4 file with fp8 is refused."""
    check_fp8(preset)  # a Preset given whole did not pass select_preset's checks
    meta, shapes = read_header(path)
    if "quant_method" in meta:
        if preset.fp8:
            raise BackendError(
                f"{path} holds int4 weights: fp8 quantises a float file",
                hint="load the float release with fp8, or this file without it",
            )
        return load_int4_model(path, dtype=preset.dtype, device=preset.device)
    if not preset.int4:
        loaded = load_checkpoint(path, dtype=preset.dtype, device=preset.device)
        apply_cpu_tricks(loaded.model, preset)  # int8 linears where the CPU preset asks for them
        if preset.fp8:
            swap = quantize_linears_fp8(loaded.model)
            log.info("fp8: %d linears as W8A8 e4m3, %d kept float", len(swap.swapped), len(swap.kept))
        return loaded
    if is_torchao_file(meta, shapes):
        int8_layout(meta, shapes, str(path))  # a torchao int4 / fp8 file: refused before any work
    warnings.warn(
        f"{path} holds float (or int8) weights: quantising them to int4 with RTN at load. A GPTQ file "
        "(irodori-speaker quantize, or the released int4 checkpoints) keeps more quality.",
        UserWarning,
        stacklevel=4,  # the caller of load_synthesizer (-> _load -> load_dit)
    )
    # at load no file is written, so nothing is gained by packing the small layers (the compact
    # packing of `quantize` files): the fp16 remainder keeps half the error (docs/int4.md)
    report = quantize_checkpoint(
        path, None, method="rtn", report_errors=False, device=preset.device, packing="fp16-rest"
    )
    return model_from_int4(
        report.checkpoint, f"{path} (int4 RTN at load)", dtype=preset.dtype, device=preset.device
    )


def load_codec_for(path: Any, preset: Any) -> Any:
    """The codec for `preset` on `preset.codec_device` (default: the DiT's device): float
    (`engine.codec.load_codec`), or with preset.codec_int4 its decoder packed as RTN int4
    (`engine.quant.codec.load_int4_codec`; Irodori-TTS-Lite's `dacvae_int4.safetensors` is read packed
    as stored, with or without codec_int4)."""
    device = preset.codec_device or preset.device
    if preset.codec_int4 or is_lite_int4_codec(path):  # the seed's int4 codec loads as stored
        return load_int4_codec(path, device=device, dtype=preset.codec_dtype)
    return load_codec(path, device=device, dtype=preset.codec_dtype)


def load_synthesizer(
    model: LoadOptions | str | os.PathLike[str] | None = None, /, **options: Any
) -> Synthesizer:
    """Load model, codec and tokenizer from their sources (local paths, hf:// URIs, repo ids).

    `model` is the model's source, or all the options as one `LoadOptions`; `options` are
    `LoadOptions` fields by name (`backend="cpu"`, `tiny_random=True`, `model_dir=...`; over
    a given `LoadOptions`, they replace its fields) and device preset fields by name
    (`max_batch=4`, `int4=True`; None keeps the preset's), applied over `preset`.

    Two seams for benchmarks and tests: `tokenizer` may be a tokenizer object (with `encode`
    and `batch`, as `TextTokenizer`; its `fingerprint` attribute, else its class name, goes
    into cache keys), and `preset` a `Preset` used instead of the backend's (`device`, `dtype`
    and preset fields still apply).
    """
    return _load(as_load_options(model, options))


def _within_budget(preset: Any, budget: Any, source: str, loaded: Any, codec: Any) -> Any:
    """`preset` capped by the GPU memory budget (CUDA), else as it is with a warning: the CPU and
    MPS have no allocator cap to set, so the budget is accepted and reported as not applicable."""
    if torch.device(preset.device).type != "cuda":
        log.warning(
            "GPU memory budget %s (%s): not applicable on %s, ignored (it caps CUDA memory only)",
            budget.describe(),
            source,
            preset.device,
        )
        return preset
    with hold_model_lock():
        preset, plan = apply_budget(preset, budget, loaded.config, loaded.inference, codec)
    log.info("%s (%s)", plan.describe(), source)
    return preset


def _load(load: LoadOptions) -> Synthesizer:
    """The synthesizer `load` asks for (checked when it was built), loaded by its plan
    (identity.py: the same steps give the phrase-cache key without the weights)."""
    plan = plan_load(load)
    preset, cfg = plan.preset, plan.config
    budget, budget_source = budget_from(load.max_gpu_memory)  # $IRODORI_MAX_GPU_MEMORY checked here
    assert preset.threads is not None
    torch.set_num_threads(preset.threads)
    log.info("torch CPU threads: %d (%s)", preset.threads, plan.threads_why)
    if plan.note:
        log.warning("%s", plan.note)  # the one notice, wherever it loads (CLI, server, Python)
    with hold_model_lock():  # the weights go to the device: no other model work meanwhile
        loaded = load_dit(plan.model, preset)
    if cfg.family.startswith("v4-large") and not load.tiny_random:
        note_gemma_terms()  # a local file or a mirror: named here (a known repo when fetched)
    text_tok: Any
    caption_tok: Any = None
    if plan.tokenizer_object is not None:
        text_tok = plan.tokenizer_object
        caption_tok = text_tok if cfg.caption_enabled else None
    elif cfg.pretrained_text:  # v4: the release's tokenizer/ folder, for text and caption
        assert plan.tokenizer is not None
        text_tok = tokenizer_for_model(
            plan.tokenizer.parent, plan.model, cfg.text_backbone, add_bos=cfg.text_add_bos
        )
        if cfg.caption_enabled:
            add_bos = cfg.caption_add_bos if cfg.caption_add_bos is not None else cfg.text_add_bos
            caption_tok = text_tok if add_bos == text_tok.add_bos else _with_bos(text_tok, add_bos)
    else:
        assert plan.tokenizer is not None
        text_tok = TextTokenizer.from_file(
            plan.tokenizer, add_bos=cfg.text_add_bos, expected_vocab_size=cfg.text_vocab_size
        )
        if cfg.caption_enabled:
            add_bos = cfg.caption_add_bos if cfg.caption_add_bos is not None else cfg.text_add_bos
            caption_tok = TextTokenizer.from_file(
                plan.caption_tokenizer or plan.tokenizer,
                add_bos=add_bos,
                expected_vocab_size=cfg.caption("vocab_size"),
            )
    with hold_model_lock():
        codec_model = load_codec_for(plan.codec, preset)
    if budget is not None:
        preset = _within_budget(preset, budget, budget_source, loaded, getattr(codec_model, "config", None))
    if load.voice_cache_dir is False:
        cache = VoiceCache()
    elif load.voice_cache_dir is None or load.voice_cache_dir is True:
        cache = VoiceCache(default_voice_cache_dir())
    else:
        cache = VoiceCache(load.voice_cache_dir)
    return Synthesizer(
        loaded.model,
        codec_model,
        text_tok,
        caption_tokenizer=caption_tok,
        inference=loaded.inference,
        preset=preset,
        voice_cache=cache,
        fingerprints=plan.fingerprints(),
        note=plan.note,
        user_dict=load.user_dict,
    )
