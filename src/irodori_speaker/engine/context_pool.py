"""The condition keys/values of the lines being stepped, in one pool of slots (engine/steps.py).

A stepped line's context (each guidance group's keys/values, one row per branch) is written once,
at its start, into consecutive slots, and every step reads it there: the fused attention through
a row -> slot table (`fused.qkv_joint`'s `ctx_rows`), the model's own blocks through one gather.
Lines joining and leaving repack nothing, and a line scaling its speaker keys/values does it in
its own slots. The pool grows (slots doubled, length up to the longest context) when a line does
not fit, pointing every held line at the new tensors, and lets its memory go when it holds none.

A pool `fix`ed at prewarm keeps its tensors (the step graphs of engine/step_graphs.py read them by
address): it keeps its memory when empty, and `room` says how many joining lines fit in its free
slots, so that the others wait for lines to finish rather than grow it. It still grows for a line
whose context is longer than its length (the graphs are then dropped, `generation` tells them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from .model import ContextKV
from .sampler import LineContext

log = logging.getLogger("irodori_speaker.engine")


@dataclass(eq=False)
class Held:
    """A line's place in the pool: its first slot, the rows of each group, its context length."""

    start: int
    sizes: tuple[int, ...]  # rows of each guidance group, in slot order
    length: int  # its context positions (the rest of each slot is masked)
    segments: list[tuple[str, int, int]]
    context: LineContext = field(init=False, repr=False)  # views of its slots (re-made as the pool grows)

    @property
    def rows(self) -> int:
        return sum(self.sizes)

    def slots(self, group: int) -> range:
        """The slots of group `group`'s rows; -1: the conditional row alone (group 0's first)."""
        if group < 0:
            return range(self.start, self.start + 1)
        first = self.start + sum(self.sizes[:group])
        return range(first, first + self.sizes[group])


class ContextPool:
    """Per layer keys and values (slots, heads, length, head_dim) and a mask (slots, length)."""

    def __init__(
        self, min_slots: int = 8, upload: Callable[[Tensor, torch.device], Tensor] | None = None
    ) -> None:
        self.min_slots = min_slots
        # host index tensors to the device: the device owner's copy that does not wait, or a plain one
        self.upload = upload or (lambda t, device: t.to(device))
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.mask: Tensor | None = None
        self.generation = 0  # bumped whenever the tensors are replaced (views made before are stale)
        self.fixed = False  # `fix`: its tensors kept (empty too) and joining lines limited by `room`
        self._free: list[bool] = []
        self._held: set[Held] = set()

    @property
    def slots(self) -> int:
        return len(self._free)

    @property
    def length(self) -> int:
        return 0 if self.mask is None else int(self.mask.shape[1])

    @property
    def held(self) -> int:
        return len(self._held)

    def fix(
        self,
        slots: int,
        length: int,
        *,
        layers: int,
        heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        """Allocate `slots` slots of `length` positions now and keep them (prewarm: the step graphs
        read these tensors). Held lines are copied over, as when it grows."""
        layout = _Layout(layers, heads, head_dim, dtype, torch.device(device))
        self._grow(layout, max(0, slots - self.slots), length, exact=True)
        self.fixed = True

    def room(self, rows: list[int]) -> int:
        """How many of lines needing `rows[i]` consecutive slots each (in order) fit now without
        growing a fixed pool; every line fits a pool that is not fixed (it grows). A line longer
        than `length` positions is counted as fitting: it grows the pool (and drops the graphs)."""
        if not self.fixed:
            return len(rows)
        free = list(self._free)
        for n, need in enumerate(rows):
            start = _first_run(free, need)
            if start is None:
                return n
            free[start : start + need] = [False] * need
        return len(rows)

    def _reserve(self, rows: int, lines: int, length: int, like: ContextKV) -> None:
        """Room for `lines` more lines of `rows` consecutive rows each, contexts up to `length`
        (`like`: one of them): a pool that is not fixed grows once for all of them together."""
        if self.fixed and self.keys and length <= self.length:
            fits = self.room([rows] * lines) == lines  # each line in its own run of free slots
        else:
            fits = bool(self.keys) and length <= self.length and self._find(rows * lines) is not None
        if not fits:
            self._grow(_layout_of(like), rows * lines, length)

    def hold(self, groups: list[ContextKV], lines: int = 1) -> list[Held]:
        """Hold `lines` lines whose contexts come batched, as one `context_kv` call per guidance
        group gives them: group g's row j * lines + i is line i's branch j (one context length
        for all). One copy per layer for all the lines; each line's `Held.context` views its
        consecutive slots."""
        sizes = tuple(int(g.mask.shape[0]) // lines for g in groups)
        n, length = sum(sizes), int(groups[0].mask.shape[1])
        self._reserve(n, lines, length, groups[0])
        assert self.mask is not None
        held: list[Held] = []
        for _ in range(lines):
            start = self._find(n)
            assert start is not None
            for i in range(start, start + n):
                self._free[i] = False
            held.append(Held(start, sizes, length, groups[0].segments))
        tail = length < self.length  # masked out; zeroed so that a value left there is finite
        device = self.mask.device
        for g, group in enumerate(groups):
            # batched row j * lines + i -> line i's slot of branch j
            slots = [h.slots(g).start + j for j in range(sizes[g]) for h in held]
            index = self.upload(torch.tensor(slots), device)
            for pool, part in zip(self.keys + self.values, group.keys + group.values):
                (pool[:, :, :length] if tail else pool).index_copy_(0, index, part)
                if tail:
                    pool[:, :, length:].index_fill_(0, index, 0)
            (self.mask[:, :length] if tail else self.mask).index_copy_(0, index, group.mask)
            if tail:
                self.mask[:, length:].index_fill_(0, index, False)
        for h in held:
            h.context = self._views(h)
            self._held.add(h)
        return held

    def release(self, held: Held) -> None:
        """Give a line's slots back (once; again is a no-op); an empty pool lets its memory go."""
        if held not in self._held:
            return
        self._held.discard(held)
        for i in range(held.start, held.start + held.rows):
            self._free[i] = True
        if not self._held and not self.fixed:
            self.keys, self.values, self.mask, self._free = [], [], None, []
            self.generation += 1

    def _find(self, n: int) -> int | None:
        return _first_run(self._free, n)

    def _grow(self, layout: _Layout, rows: int, length: int, *, exact: bool = False) -> None:
        """Larger tensors (twice the slots, or as many as needed; `exact`: `rows` more; the
        longest length), the held contexts copied over and every held line pointed at its new
        views."""
        slots = max(self.min_slots, self.slots)
        if exact:
            slots = self.slots + rows
        elif self._find(rows) is None:  # new slots go at the end, after the free ones there
            slots = max(slots, 2 * self.slots)
            while slots - self.slots + self._tail_free() < rows:
                slots *= 2
        length = max(length, self.length)
        if self.fixed:
            log.warning(
                "the step batch's context pool grows (%d slots of %d positions to %d of %d): its CUDA "
                "graphs are dropped and steps run eagerly",
                self.slots,
                self.length,
                slots,
                length,
            )
        shape = (slots, layout.heads, length, layout.head_dim)
        keys = [torch.zeros(shape, dtype=layout.dtype, device=layout.device) for _ in range(layout.layers)]
        values = [torch.zeros(shape, dtype=layout.dtype, device=layout.device) for _ in range(layout.layers)]
        mask = torch.zeros(slots, length, dtype=torch.bool, device=layout.device)
        old, L = self.slots, self.length
        if old:
            assert self.mask is not None
            for new, cur in zip(keys + values, self.keys + self.values):
                new[:old, :, :L].copy_(cur)
            mask[:old, :L].copy_(self.mask)
        self.keys, self.values, self.mask = keys, values, mask
        self._free += [True] * (slots - old)
        self.generation += 1
        for held in self._held:
            held.context = self._views(held)

    def _tail_free(self) -> int:
        n = 0
        for free in reversed(self._free):
            if not free:
                break
            n += 1
        return n

    def _views(self, held: Held) -> LineContext:
        assert self.mask is not None
        whole = held.length == self.length  # no second slice (each is an op the owner pays)
        groups = []
        for i in range(len(held.sizes)):
            s = held.slots(i)
            r, L = slice(s.start, s.stop), held.length
            groups.append(
                ContextKV(
                    [k[r] if whole else k[r, :, :L] for k in self.keys],
                    [v[r] if whole else v[r, :, :L] for v in self.values],
                    self.mask[r] if whole else self.mask[r, :L],
                    held.segments,
                )
            )
        return LineContext(groups, [None] * len(groups), groups[0].rows(1), None)


class _Layout(NamedTuple):
    """What the pool's tensors are: per layer (slots, heads, length, head_dim) of `dtype`."""

    layers: int
    heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device


def _layout_of(ctx: ContextKV) -> _Layout:
    k = ctx.keys[0]
    return _Layout(len(ctx.keys), int(k.shape[1]), int(k.shape[3]), k.dtype, k.device)


def _first_run(free: list[bool], n: int) -> int | None:
    """The start of the first `n` consecutive free slots, or None."""
    run = 0
    for i, f in enumerate(free):
        run = run + 1 if f else 0
        if run == n:
            return i - n + 1
    return None
