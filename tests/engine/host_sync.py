"""A progress callback that forbids every tensor -> Python conversion after the first step."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch


def forbid_host_sync_after_first_step(monkeypatch: pytest.MonkeyPatch) -> Callable[[int, int], None]:
    def forbid(*_a, **_k):
        raise AssertionError("host sync inside the sampler loop")

    def progress(done: int, total: int) -> None:
        if done == 1:
            for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
                monkeypatch.setattr(torch.Tensor, name, forbid)

    return progress
