"""irodori-speaker: Japanese speech for livestream bots, on our own PyTorch Irodori-TTS engine."""

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
]
