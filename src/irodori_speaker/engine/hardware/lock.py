"""The one process-wide lock that serialises all model work.

MPS command buffers are not thread-safe, and on CUDA one model at a time keeps
memory and timing predictable. Every Speaker, the CLI, the server and prebuild
share it. It is taken at one level: inside the synthesizer (`synthesis/synthesizer.py`, with its
voice part `voice_conditions.py` and `loading.py` while weights go to the device),
around each stage and decode chunk, so other model work can run between two
chunks of a line and a cancel is seen within one. It is re-entrant (a stage may
call a helper that takes it too).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ...cancel import CancelToken, check

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
