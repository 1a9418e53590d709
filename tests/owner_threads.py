"""Waiting out the device owner's idle exit before a test counts the package's threads."""

from __future__ import annotations

import threading


def irodori_threads() -> list:
    """The package's threads still alive once the device owner's idle exit has passed (its
    threads end `linger_s` after their last work: engine/hardware/owner.py)."""
    for t in threading.enumerate():
        if t.name.startswith("irodori-device"):
            t.join(2.0)
    return [t for t in threading.enumerate() if t.name.startswith("irodori")]
