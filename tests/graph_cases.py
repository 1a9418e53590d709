"""CUDA graphs in tests: the capture stood in for on the CPU, and the captured-vs-eager check.

`stood_in_capture` replaces `engine.cuda_graphs.capture` where a module imported it: the code
around a capture (static buffers, buckets, fillers) runs for real, and a replay runs the function
again on the static inputs, writing its result where the captured output is (None for a function
that only writes, as a line start does)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class StoodInGraph:
    """A CUDA graph stood in for: `replay` runs `fn(*static)` again into the captured output."""

    def __init__(self, fn: Callable[..., Any], static: list[Any]) -> None:
        self.fn, self.static = fn, static
        out = fn(*static)
        self.out = None if out is None else out.clone()

    def replay(self) -> None:
        out = self.fn(*self.static)
        if self.out is not None:
            self.out.copy_(out)


def stood_in_capture(
    fn: Callable[..., Any], static: list[Any], pool: Any, *, warm: Any = None, replay: str = "default"
) -> tuple:
    """`cuda_graphs.capture`'s signature: (graph, captured output)."""
    graph = StoodInGraph(fn, static)
    return graph, graph.out


def captured_equals_eager(run: Callable[[bool], list[torch.Tensor]]) -> None:
    """`run(capture)` twice, eagerly on the graphs' buffers and then captured (CUDA): the same
    latents, up to a replay's rounding."""
    eager, captured = run(False), run(True)
    assert len(eager) == len(captured)
    for a, b in zip(eager, captured):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
