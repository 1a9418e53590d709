"""The Speaker's constructor arguments: checked, and split into loading options and line options.

Everything here runs in `Speaker.__init__`, before any model work, so a bad argument is one
clear error at the call.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..cache import PhraseCache, StorePolicy
from ..errors import BackendError, CacheError, InputError
from ..options import SynthesisOptions, SynthesizerLike, option_specs
from ..synthesis.load_options import LOAD_FIELDS, LoadOptions, unexpected_keyword

_TORCH_DEVICE = re.compile(r"(cpu|cuda|mps|xpu|meta)(:\d+)?")

__all__ = [
    "check_loop",
    "check_seconds",
    "check_torch_device",
    "load_synthesizer_for",
    "loading_options",
    "output_specs",
    "phrase_cache",
    "prewarm_voices",
    "voice_labels",
]


def loading_options(
    synthesizer: Any, load: LoadOptions | None, keywords: Mapping[str, Any], own: Callable[..., Any]
) -> tuple[LoadOptions | None, dict[str, Any]]:
    """(what to load, or None with a `synthesizer` given; SynthesisOptions fields by name) from
    the Speaker's `load=` and its other keywords: `LoadOptions` fields (over `load`) and
    `SynthesisOptions` fields. Any other name is a TypeError (`own`: `Speaker.__init__`, whose
    parameters a misspelt name is matched against, with the two kinds of field); a synthesizer
    and loading options together are an InputError."""
    if load is not None and not isinstance(load, LoadOptions):
        raise InputError(
            f"load must be a LoadOptions, got {type(load).__name__}", hint="or pass its fields by name"
        )
    specs = option_specs(SynthesisOptions)
    for name in keywords:
        if name not in LOAD_FIELDS and name not in specs:
            params = [p for p in inspect.signature(own).parameters if p != "self"]
            raise unexpected_keyword("Speaker", name, [*params, *LOAD_FIELDS, *specs])
    options = (load or LoadOptions()).replace(**{k: v for k, v in keywords.items() if k in LOAD_FIELDS})
    if options.device is not None:
        check_torch_device(options.device)
    line_options = {k: v for k, v in keywords.items() if k in specs}
    if synthesizer is None:
        return options, line_options
    if options.given():
        raise InputError(
            f"got a synthesizer and loading options {sorted(options.given())}", hint="pass one or the other"
        )
    return None, line_options


def phrase_cache(cache: Any) -> tuple[Any, bool]:
    """(the PhraseCache, whether the Speaker made it and so closes it) from `cache=`."""

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
    """`device` looks like a torch device (whether it exists is checked when the model loads); a
    sound card's name here is the Speaker's likely mix-up with `output=`."""
    if not (isinstance(device, str) and _TORCH_DEVICE.fullmatch(device)):
        raise BackendError(
            f"device={device!r} is not a torch device: it says where the model runs (cpu, cuda, cuda:1, mps)",
            hint=f"a sound card is chosen with output=, e.g. Speaker(output={device!r})",
        )


def load_synthesizer_for(options: LoadOptions | None) -> SynthesizerLike:
    """`load_synthesizer(options)` (worker thread; torch loads here), or a clear error when the
    engine cannot be imported."""
    try:
        from ..synthesis.loading import load_synthesizer
    except ImportError as e:
        raise InputError(
            f"no synthesizer given and the engine cannot be imported ({e})",
            hint="install torch, or pass Speaker(synthesizer=...)",
        ) from e
    return load_synthesizer(options)


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


def voice_labels(voices: Sequence[Any]) -> list[str]:
    """A readable, unique name per voice (the keys of `Speaker.prewarm_seconds`): "default" for
    None, a Voice's `name`, a path's stem, else "voice N"; a repeated name gets " (2)", ..."""
    labels: list[str] = []
    for i, v in enumerate(voices, 1):
        if v is None:
            label = "default"
        elif isinstance(v, (str, os.PathLike)):
            label = Path(v).stem
        elif isinstance(getattr(v, "name", None), str):
            label = v.name
        else:
            label = f"voice {i}"
        base, n = label, 2
        while label in labels:
            label, n = f"{base} ({n})", n + 1
        labels.append(label)
    return labels
