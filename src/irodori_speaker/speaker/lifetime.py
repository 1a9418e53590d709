"""Speakers that are never closed: warn like an unclosed file, and never keep the process alive.

An open Speaker holds a worker thread (non-daemon, as every `ThreadPoolExecutor`'s), its
outputs (a PortAudio stream) and perhaps a line in synthesis. If the program forgets
`aclose()` the Speaker is abandoned at one of three moments, whichever comes first: its event
loop cancels its scheduler task (`asyncio.run` does so when `main()` returns), it is garbage
collected, or the interpreter starts to exit. `Speaker._abandon` then emits a `ResourceWarning`
naming where the Speaker was created, cancels its lines (the worker stops within one sampler
step or decode chunk) and closes its outputs, so the exit's join of the worker is immediate.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 - registers its exit hook first (see below)
import contextlib
import os
import sys
import threading
import warnings
import weakref
from typing import Any

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_HERE = os.path.dirname(os.path.abspath(__file__))


def creation_site() -> str:
    """'file:line' of the first caller outside this package (cheap: no traceback objects)."""
    f = sys._getframe(1)
    while f is not None and os.path.abspath(f.f_code.co_filename).startswith(_HERE + os.sep):
        f = f.f_back  # type: ignore[assignment]
    return "?" if f is None else f"{f.f_code.co_filename}:{f.f_lineno}"


def warn_unclosed(obj: Any, created_at: str) -> None:
    """The `ResourceWarning` of a Speaker abandoned open (names where it was made)."""
    warnings.warn(
        f"unclosed Speaker created at {created_at}: use `async with Speaker(...)` or "
        "`await speaker.aclose()`",
        ResourceWarning,
        stacklevel=3,
        source=obj,
    )


def track(obj: Any) -> None:
    """`obj._abandon(at_exit=True)` runs at interpreter exit unless `untrack(obj)` came first."""
    _LIVE.add(obj)


def untrack(obj: Any) -> None:
    _LIVE.discard(obj)


def _abandon_all() -> None:
    for obj in list(_LIVE):
        with contextlib.suppress(Exception):  # exiting: nothing may stop the others
            obj._abandon(at_exit=True)


# threading's exit hooks run, last registered first, before the interpreter joins non-daemon
# threads; concurrent.futures' hook joins every executor's workers, so ours must come after it in
# the list (it is imported above) to cancel the lines first. `atexit` would run after the join.
_register = getattr(threading, "_register_atexit", None)
with contextlib.suppress(RuntimeError):  # imported while the interpreter is already shutting down
    (_register or atexit.register)(_abandon_all)
