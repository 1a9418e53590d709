"""The condition keys/values of the lines being stepped, in one pool of slots (engine/steps.py).

A stepped line's context (each guidance group's keys/values, one row per branch) is written once,
at its start, into consecutive slots, and every step reads it there: the fused attention through
a row -> slot table (`fused.qkv_joint`'s `ctx_rows`), the model's own blocks through one gather.
Lines joining and leaving repack nothing, and a line scaling its speaker keys/values does it in
its own slots. The pool grows (slots doubled, length up to the longest context) when a line does
not fit (each held line's views follow), and lets its memory go when it holds none.

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

from .config import ModelConfig
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
    pool: ContextPool = field(repr=False)
    _context: LineContext | None = field(default=None, init=False, repr=False)
    _generation: int = field(default=-1, init=False, repr=False)

    @property
    def rows(self) -> int:
        return sum(self.sizes)

    @property
    def context(self) -> LineContext:
        """Views of its slots, made when first asked for (a layer's keys and values each: a step
        reads the pool itself, only a line's own guidance or speaker scaling needs them) and again
        once the pool's tensors have moved."""
        if self._context is None or self._generation != self.pool.generation:
            self._context, self._generation = self.pool._views(self), self.pool.generation
        return self._context

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

    def fix(self, slots: int, length: int, layout: PoolLayout) -> None:
        """Allocate `slots` slots of `length` positions now and keep them (prewarm: the step graphs
        read these tensors). Held lines are copied over, as when it grows. Fixed already at that
        size or more: nothing changes (the graphs made on it stay valid)."""
        if self.fixed and self.slots >= slots and self.length >= length:
            return
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

    def _reserve(self, rows: int, lines: int, length: int, layout: PoolLayout) -> None:
        """Room for `lines` more lines of `rows` consecutive rows each, contexts up to `length`:
        a pool that is not fixed grows once for all of them together."""
        if self.fixed and self.keys and length <= self.length:
            fits = self.room([rows] * lines) == lines  # each line in its own run of free slots
        else:
            fits = bool(self.keys) and length <= self.length and self._find(rows * lines) is not None
        if not fits:
            self._grow(layout, rows * lines, length)

    def take(
        self,
        sizes: tuple[int, ...],
        lines: int,
        length: int,
        segments: list[tuple[str, int, int]],
        layout: PoolLayout,
    ) -> list[Held]:
        """Slots for `lines` lines of `sizes[g]` rows in each guidance group and `length` context
        positions (grown first where needed); `write_layer` / `write_mask` fill them at `index`."""
        n = sum(sizes)
        self._reserve(n, lines, length, layout)
        held: list[Held] = []
        for _ in range(lines):
            start = self._find(n)
            assert start is not None
            for i in range(start, start + n):
                self._free[i] = False
            held.append(Held(start, sizes, length, segments, self))
        self._held.update(held)
        return held

    def index(self, held: list[Held]) -> Tensor:
        """The slots of `held`'s rows as batched contexts come (every group's rows one after the
        other; within group g, row j * len(held) + i is line i's branch j), on the device in one
        upload. A line may repeat (a batch filled up to its bucket: the same rows written twice)."""
        assert self.mask is not None
        sizes = held[0].sizes
        slots = [h.slots(g).start + j for g in range(len(sizes)) for j in range(sizes[g]) for h in held]
        return self.upload(torch.tensor(slots), self.mask.device)

    def write_layer(self, layer: int, index: Tensor, keys: Tensor, values: Tensor) -> None:
        """One layer's keys/values (rows, heads, length, head_dim) into the slots `index`; the rest
        of each slot zeroed (masked out, zeroed so that a value left there is finite)."""
        length = int(keys.shape[2])
        tail = length < self.length
        for pool, part in ((self.keys[layer], keys), (self.values[layer], values)):
            (pool[:, :, :length] if tail else pool).index_copy_(0, index, part)
            if tail:
                pool[:, :, length:].index_fill_(0, index, 0)

    def write_mask(self, index: Tensor, mask: Tensor) -> None:
        """The context mask (rows, length) into the slots `index`, the rest of each slot false."""
        assert self.mask is not None
        length = int(mask.shape[1])
        tail = length < self.length
        (self.mask[:, :length] if tail else self.mask).index_copy_(0, index, mask)
        if tail:
            self.mask[:, length:].index_fill_(0, index, False)

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

    def first_free(self) -> int | None:
        """A slot no line holds, or None."""
        return self._find(1)

    def _find(self, n: int) -> int | None:
        return _first_run(self._free, n)

    def _grow(self, layout: PoolLayout, rows: int, length: int, *, exact: bool = False) -> None:
        """Larger tensors (twice the slots, or as many as needed; `exact`: `rows` more; the
        longest length), the held contexts copied over (each held line's views follow when next
        asked for)."""
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
        self.generation += 1  # the held lines' views are made again when next asked for

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


class PoolLayout(NamedTuple):
    """What the pool's tensors are: per layer (slots, heads, length, head_dim) of `dtype`."""

    layers: int
    heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, cfg: ModelConfig, dtype: torch.dtype, device: torch.device | str) -> PoolLayout:
        """The pool's tensors for a model of `cfg`: its layers, heads and head size."""
        return cls(cfg.num_layers, cfg.num_heads, cfg.head_dim, dtype, torch.device(device))


def _first_run(free: list[bool], n: int) -> int | None:
    """The start of the first `n` consecutive free slots, or None."""
    run = 0
    for i, f in enumerate(free):
        run = run + 1 if f else 0
        if run == n:
            return i - n + 1
    return None
