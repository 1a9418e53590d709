"""A thread-safe cancellation flag checked between sampler steps and decode chunks."""

from __future__ import annotations

import threading

from .errors import Cancelled


class CancelToken:
    """Set from any thread; the worker polls it at safe points and stops with `Cancelled`."""

    __slots__ = ("_event", "reason")

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: str = "cancelled"

    def cancel(self, reason: str = "cancelled") -> None:
        self.reason = reason
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise Cancelled(self.reason)


def check(token: CancelToken | None) -> None:
    """Raise `Cancelled` if `token` is set; a `None` token never cancels."""
    if token is not None:
        token.raise_if_cancelled()
