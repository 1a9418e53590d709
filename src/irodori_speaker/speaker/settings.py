"""The Speaker's constructor arguments: checked, and split into loading options and line options.

Everything here runs in `Speaker.__init__`, before any model work, so a bad argument is one
clear error at the call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import difflib
import inspect
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import BackendError, CacheError, InputError
from ..options import SynthesisOptions, SynthesizerLike, option_specs

__all__ = [
    "check_loop",
    "check_seconds",
    "check_torch_device",
    "load_synthesizer_for",
    "loading_options",
    "output_specs",
    "phrase_cache",
    "prewarm_voices",
]

_TORCH_DEVICE = re.compile(r"(cpu|cuda|mps|xpu|meta)(:\d+)?")


def loading_options(
    synthesizer: Any, given: Mapping[str, Any], extra: Mapping[str, Any], own: Callable[..., Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(options for `load_synthesizer`, SynthesisOptions fields by name) from the Speaker's
    loading arguments `given` and its other keywords `extra` (`own`: `Speaker.__init__`, whose
    parameters a misspelt name is matched against). Preset fields passed bare are deprecated;
    a synthesizer and loading options together are an error."""
    load = dict(given)
    load["backend"] = None if load.get("backend") == "auto" else load.get("backend")
    load["tiny_random"] = load.get("tiny_random") or None
    load = {k: v for k, v in load.items() if v is not None}
    names = option_specs(SynthesisOptions)
    line_options = {k: v for k, v in extra.items() if k in names}
    preset_fields = {k: v for k, v in extra.items() if k not in line_options}
    if preset_fields:
        load["preset"] = _merge_deprecated_preset_fields(given.get("preset"), preset_fields, own)
    if synthesizer is not None and load:
        raise InputError(
            f"got a synthesizer and loading options {sorted(load)}", hint="pass one or the other"
        )
    if given.get("device") is not None:
        check_torch_device(given["device"])
    return load, line_options


def phrase_cache(cache: Any) -> tuple[Any, bool]:
    """(the PhraseCache, whether the Speaker made it and so closes it) from `cache=`."""
    from ..cache import PhraseCache

    own = cache is not None and not isinstance(cache, PhraseCache)
    if not own:
        return cache, False
    try:
        return PhraseCache(cache), True
    except CacheError as e:  # issue 30: a cache that cannot be opened must not stop the bot
        warnings.warn(f"starting without the phrase cache: {e}", RuntimeWarning, stacklevel=3)
        return None, False


def check_loop(loop: Any) -> None:
    """Speaker methods run on the loop that opened it."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is not loop:
        raise InputError(
            "Speaker methods must be called on the event loop that opened it",
            hint="from another thread use speaker.enqueue_threadsafe(text)",
        )


def output_specs(output: Any, stall_flush_s: Any, lipsync_hz: Any, cache_store: Any) -> list[Any]:
    """The outputs to open (one or a list), after checking the Speaker's other arguments."""
    from ..cache import StorePolicy

    if stall_flush_s is not None and not stall_flush_s > 0:
        raise InputError(f"stall_flush_s must be > 0 or None, got {stall_flush_s!r}")
    if not lipsync_hz > 0:
        raise InputError(f"lipsync_hz must be > 0, got {lipsync_hz!r}")
    StorePolicy.parse(cache_store, "cache_store")  # the one store vocabulary (cache/policy.py)
    specs: list[Any] = list(output) if isinstance(output, (list, tuple)) else [output]
    if not specs:
        raise InputError("output= is an empty list", hint="use output='null' to play nowhere")
    return specs


def check_seconds(**values: Any) -> None:
    for name, v in values.items():
        if not (isinstance(v, (int, float)) and v >= 0 and math.isfinite(v)):
            raise InputError(f"{name} must be a finite number >= 0, got {v!r}")


def check_torch_device(device: Any) -> None:
    """`device` looks like a torch device (whether it exists is checked when the model loads)."""
    if not (isinstance(device, str) and _TORCH_DEVICE.fullmatch(device)):
        raise BackendError(
            f"device={device!r} is not a torch device: it says where the model runs (cpu, cuda, cuda:1, mps)",
            hint=f"a sound card is chosen with output=, e.g. Speaker(output={device!r})",
        )


def _merge_deprecated_preset_fields(preset: Any, fields: dict[str, Any], own: Callable[..., Any]) -> Any:
    """Speaker(int4=True) passed preset fields through; they now go in preset={...}."""
    from ..engine.hardware.presets import Preset

    known = [f.name for f in dataclasses.fields(Preset)]
    for name in fields:
        if name not in known:
            params = [p for p in inspect.signature(own).parameters if p != "self"]
            close = difflib.get_close_matches(name, [*params, *known, *option_specs(SynthesisOptions)], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"Speaker() got an unexpected keyword argument {name!r}{hint}")
    warnings.warn(
        f"Speaker({', '.join(f'{k}=...' for k in fields)}) is deprecated: pass preset fields as "
        f"preset={{{', '.join(repr(k) + ': ...' for k in fields)}}}",
        DeprecationWarning,
        stacklevel=4,
    )
    if preset is None:
        return dict(fields)
    if isinstance(preset, Mapping):
        return {**preset, **fields}
    return preset.with_overrides(**fields)


def load_synthesizer_for(options: Mapping[str, Any]) -> SynthesizerLike:
    """`load_synthesizer(**options)` (worker thread), or a clear error when it is unavailable."""
    try:
        from ..synthesis.synthesizer import load_synthesizer  # type: ignore[attr-defined]
    except ImportError as e:
        raise InputError(
            "no synthesizer given and irodori_speaker.synthesis.synthesizer.load_synthesizer is unavailable",
            hint="pass Speaker(synthesizer=...)",
        ) from e
    return load_synthesizer(**options)


def prewarm_voices(voice: Any, voices: Sequence[Any]) -> list[Any]:
    """The Speaker's voice and its `voices=`, each once."""
    out: list[Any] = []
    for v in [voice, *voices]:
        if not any(_same(v, u) for u in out):
            out.append(v)
    return out


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # arrays and the like: only identity counts
        return False
