"""The project's error types. Every error we raise on purpose is an `IrodoriError`."""

from __future__ import annotations


class IrodoriError(Exception):
    """Base class of every error irodori-speaker raises on purpose.

    `hint`, when set, is one line telling the user what to do about it.
    """

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint

    def __str__(self) -> str:
        msg = super().__str__()
        return f"{msg} (hint: {self.hint})" if self.hint else msg


class InputError(IrodoriError, ValueError):
    """Bad caller input: empty text, impossible seconds, out-of-range ids, mismatched batches."""


class CheckpointError(IrodoriError):
    """A model, codec or tokenizer file is missing, corrupt, or does not match its config."""


class ModelSourceError(IrodoriError):
    """A model source cannot be resolved (no network, not in the cache, bad path)."""


class AudioError(IrodoriError):
    """Audio cannot be read, decoded or played (unreadable file, absent output device)."""


class QuantError(CheckpointError):
    """An int4 checkpoint uses a format we do not support, or is inconsistent."""


class BackendError(IrodoriError):
    """A device backend is unavailable or asked for something it cannot do."""


class CacheError(IrodoriError):
    """The phrase cache cannot be opened or written."""


class Cancelled(IrodoriError):
    """Work was stopped through a `CancelToken` (between sampler steps or decode chunks)."""
