"""irodori-speaker: Japanese speech for livestream bots, on our own PyTorch Irodori-TTS engine.

    async with Speaker() as s:
        await s.say("こんにちは！")

Heavy modules (torch, the engine) load on first use of a name that needs them.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

if sys.platform == "darwin":
    # Read when torch starts MPS, so set before torch loads: ops MPS lacks then run on the CPU.
    # A value the user set wins (engine/hardware/presets.py warns when it disables the fallback).
    os.environ.setdefault("PYTORCH_ENABLE_MPS_FALLBACK", "1")

from .errors import (
    AudioError,
    BackendError,
    CacheError,
    Cancelled,
    CheckpointError,
    InputError,
    IrodoriError,
    ModelSourceError,
    QuantError,
)

__version__ = "0.1.0"

_LAZY = {
    "Speaker": "speaker",
    "Utterance": "speaker",
    "Priority": "speaker.lines",
    "LineOptions": "speaker.lines",
    "UtteranceState": "speaker",
    "Synthesizer": "synthesis.synthesizer",
    "SynthesisOptions": "options",
    "SynthesisRecord": "options",
    "SynthesisResult": "options",
    "AudioStream": "options",
    "SynthesizerLike": "options",
    "load_synthesizer": "synthesis.loading",
    "LoadOptions": "synthesis.load_options",
    "Voice": "synthesis.voices",
    "CancelToken": "cancel",
    "SoundDeviceOutput": "outputs",
    "FileOutput": "outputs",
    "NullOutput": "outputs",
    "list_output_devices": "outputs",
    "PhraseCache": "cache",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'irodori_speaker' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])


__all__ = [
    "AudioError",
    "BackendError",
    "CacheError",
    "Cancelled",
    "CheckpointError",
    "InputError",
    "IrodoriError",
    "ModelSourceError",
    "QuantError",
    "__version__",
    *_LAZY,
]
