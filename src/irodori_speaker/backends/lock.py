"""The one process-wide lock that serialises all model work.

MPS command buffers are not thread-safe, and on CUDA one model at a time keeps
memory and timing predictable. Every Speaker, the CLI and prebuild share it.
It is re-entrant, so a Speaker may hold it around a Synthesizer call that takes
it again inside.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..cancel import CancelToken, check

MODEL_LOCK = threading.RLock()


@contextmanager
def hold_model_lock(cancel: CancelToken | None = None, poll_s: float = 0.01) -> Iterator[None]:
    """Hold `MODEL_LOCK`; while waiting for it, give up with `Cancelled` once `cancel` is set."""
    while not MODEL_LOCK.acquire(timeout=poll_s):
        check(cancel)
    try:
        check(cancel)
        yield
    finally:
        MODEL_LOCK.release()
