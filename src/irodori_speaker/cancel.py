"""A thread-safe cancellation flag checked between sampler steps and decode chunks."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

from .errors import Cancelled

log = logging.getLogger(__name__)


class CancelToken:
    """Set from any thread; the worker polls it at safe points and stops with `Cancelled`."""

    __slots__ = ("_event", "_lock", "_wakers", "reason")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._wakers: list[Callable[[], None]] = []
        self.reason: str = "cancelled"

    def cancel(self, reason: str = "cancelled") -> None:
        self.reason = reason
        self._event.set()
        with self._lock:
            wakers, self._wakers = self._wakers, []
        for wake in wakers:
            try:
                wake()
            except Exception:  # a waiter's wake-up must not stop the cancel or the other wake-ups
                log.debug("a cancel wake-up raised", exc_info=True)

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise Cancelled(self.reason)

    @contextlib.contextmanager
    def waking(self, wake: Callable[[], None]) -> Iterator[None]:
        """Inside the block, a cancel calls `wake()` (on the cancelling thread): a thread blocked
        on something else (a job's result, a copy) hears of it at once instead of polling. A
        cancel that came first calls nothing: check `cancelled` once inside the block."""
        with self._lock:
            self._wakers.append(wake)
        try:
            yield
        finally:
            with self._lock, contextlib.suppress(ValueError):  # gone if a cancel called it
                self._wakers.remove(wake)


def check(token: CancelToken | None) -> None:
    """Raise `Cancelled` if `token` is set; a `None` token never cancels."""
    if token is not None:
        token.raise_if_cancelled()
