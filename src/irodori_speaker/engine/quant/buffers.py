"""Quantised layers whose codes and scales follow a module's device moves but never its dtype."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn


class KeepsCodeDtype(nn.Module):
    """`model.to(torch.bfloat16)` must not cast int8 / e4m3 codes or their fp32 scales: the buffers
    named in `code_buffers` move with `.to(device)` and keep their dtype (Int8Linear, Fp8Linear)."""

    code_buffers: ClassVar[tuple[str, ...]] = ()

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        held: dict[str, torch.Tensor] = {}
        for k in self.code_buffers:
            t = self._buffers.pop(k)
            assert t is not None, k
            held[k] = t
        try:
            super()._apply(fn, recurse)
        finally:
            target = fn(torch.empty(0, device=held[self.code_buffers[0]].device)).device
            for k, t in held.items():
                self._buffers[k] = t.to(target)
        return self
