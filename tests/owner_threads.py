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


def queue_then_release(owner, calls: list, before_release=lambda: None) -> list:
    """Each call (owner -> result) from its own thread, its first job queued on `owner` while the
    model lock is held here (so none runs inline, and they queue in this order), then the lock let
    go; their results (or the exception each raised) in order."""
    from irodori_speaker.engine.hardware.lock import MODEL_LOCK

    out: list = [None] * len(calls)

    def call(i: int) -> None:
        try:
            out[i] = calls[i](owner)
        except BaseException as e:
            out[i] = e

    with MODEL_LOCK:
        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(calls))]
        for i, t in enumerate(threads):
            t.start()
            while owner.queued() < i + 1:
                threading.Event().wait(0.002)
        before_release()
    for t in threads:
        t.join(60)
    return out
