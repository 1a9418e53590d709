"""The one process-wide lock that serialises all model work.

MPS command buffers are not thread-safe, and on CUDA one model at a time keeps
memory and timing predictable. Every Speaker, the CLI, the server and prebuild
share it. It is taken at one level: inside the synthesizer (`synthesis/synthesizer.py`,
with its voice part `voice_conditions.py` and `loading.py` while weights go to the device),
around each stage and decode chunk, so other model work can run between two
chunks of a line and a cancel is seen within one. It is re-entrant (a stage may
call a helper that takes it too).

It is fair: waiting threads get it in the order they asked. `threading.RLock` is not (the thread
that releases it, still running, usually takes it again before a waiter wakes), so with many
lines on one model some were served several times in a row while others starved, and a
streamed line planned at one speed ran dry inside (issue 30 item 8). (Letting a playing line's
next decode window go first was tried in issue 27: without knowing when playback starts it made
more holes, 27 against 6 of 576 lines at 16 Speakers on the CPU; RESULTS.md.)
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

from ...cancel import CancelToken, check


class FairRLock:
    """A re-entrant lock handed to its waiters first come, first served."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._count = 0
        self._queue: deque[int] = deque()  # waiting threads' tickets, oldest first
        self._next_ticket = 0

    def held_by_me(self) -> bool:
        return self._owner == threading.get_ident()

    def acquire(
        self,
        blocking: bool = True,
        timeout: float = -1,
        cancel: CancelToken | None = None,
    ) -> bool:
        """Take the lock (waiting at most `timeout` s; -1: no limit). With `cancel`, a wait is
        given up with `Cancelled` once it is set (the cancel wakes it), its place kept till then."""
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._count += 1
                return True
            if self._owner is None and not self._queue:
                self._owner, self._count = me, 1
                return True
            if not blocking:
                return False
            ticket = self._next_ticket
            self._next_ticket += 1
            self._queue.append(ticket)
            waking = cancel.waking(self._wake) if cancel is not None else contextlib.nullcontext()
            try:
                with waking:
                    remaining = timeout
                    while self._owner is not None or self._queue[0] != ticket:
                        check(cancel)
                        if timeout >= 0 and remaining <= 0:
                            return False
                        t = time.monotonic()
                        self._cond.wait(remaining if timeout >= 0 else None)
                        remaining -= time.monotonic() - t
                    self._owner, self._count = me, 1
                    return True
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()  # the next in line may be free to go now

    def _wake(self) -> None:  # a cancel: the waiters look at their tokens
        with self._cond:
            self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("cannot release the model lock: not held by this thread")
            self._count -= 1
            if self._count == 0:
                self._owner = None
                self._cond.notify_all()

    def __enter__(self) -> FairRLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


MODEL_LOCK = FairRLock()


@contextmanager
def hold_model_lock(cancel: CancelToken | None = None) -> Iterator[None]:
    """Hold `MODEL_LOCK`; while waiting for it, give up with `Cancelled` once `cancel` is set."""
    MODEL_LOCK.acquire(cancel=cancel)
    try:
        check(cancel)
        yield
    finally:
        MODEL_LOCK.release()
