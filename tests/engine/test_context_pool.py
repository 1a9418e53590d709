"""The step batcher's context pool (engine/context_pool.py): each line's context keys/values held
in consecutive slots, equal to what was written, after the pool grows too; slots reused once given
back; the memory let go when no line is held. Stepped lines through it: tests/engine/test_steps.py.
"""

from __future__ import annotations

import itertools

import torch

from irodori_speaker.engine.context_pool import ContextPool, Held, PoolLayout
from irodori_speaker.engine.model import ContextKV

LAYERS, H, DH = 2, 3, 4


def _context(rows: int, length: int, seed: int) -> ContextKV:
    gen = torch.Generator().manual_seed(seed)
    keys = [torch.randn(rows, length, H, DH, generator=gen).transpose(1, 2) for _ in range(LAYERS)]  # strided
    values = [torch.randn(rows, H, length, DH, generator=gen) for _ in range(LAYERS)]
    mask = torch.rand(rows, length, generator=gen) > 0.3
    return ContextKV(keys, values, mask, [("text", 0, length)])


def _hold(pool: ContextPool, groups: list[ContextKV], lines: int = 1) -> list[Held]:
    """Hold `lines` lines whose contexts come batched as one call per guidance group gives them
    (group g's row j * lines + i is line i's branch j), through the pool's own take / index /
    write, as `engine.start_graphs.write_contexts` does with the model's."""
    k = groups[0].keys[0]
    layout = PoolLayout(len(groups[0].keys), int(k.shape[1]), int(k.shape[3]), k.dtype, k.device)
    sizes = tuple(int(g.mask.shape[0]) // lines for g in groups)
    held = pool.take(sizes, lines, int(groups[0].mask.shape[1]), groups[0].segments, layout)
    index, start = pool.index(held), 0
    for group in groups:
        rows = index[start : start + int(group.mask.shape[0])]
        start += int(group.mask.shape[0])
        pool.write_mask(rows, group.mask)
        for layer, (keys, values) in enumerate(zip(group.keys, group.values)):
            pool.write_layer(layer, rows, keys, values)
    return held


def _same(got: ContextKV, want: ContextKV) -> None:
    for a, b in zip(got.keys + got.values, want.keys + want.values):
        assert torch.equal(a, b)
    assert torch.equal(got.mask, want.mask) and got.segments == want.segments


def test_held_contexts_read_back_as_written_and_stay_so_as_the_pool_grows():
    pool = ContextPool(min_slots=2)
    written = [[_context(3, 5, 0), _context(1, 5, 1)], [_context(1, 9, 2)], [_context(2, 4, 3)]]
    held, grew = [], []
    for groups in written:  # more slots, then a longer context, then room to spare
        before = pool.generation
        held += _hold(pool, groups)
        grew.append(pool.generation > before)
        for h, want in zip(held, written):  # every line so far, through its re-pointed views
            for got, w in zip(h.context.groups, want):
                _same(got, w)
            _same(h.context.cond, want[0].rows(1))
    assert grew == [True, True, False] and pool.length == 9 and [h.rows for h in held] == [4, 1, 2]
    starts = sorted((h.start, h.start + h.rows) for h in held)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(starts))  # no two lines share a slot
    assert not pool.mask[held[2].start, 4:].any()  # past a line's length: masked out


def test_slots_given_back_are_reused_and_an_empty_pool_lets_its_memory_go():
    pool = ContextPool(min_slots=4)
    (a,) = _hold(pool, [_context(2, 6, 0)])
    (b,) = _hold(pool, [_context(2, 6, 1)])
    slots = pool.slots
    pool.release(a)
    pool.release(a)  # again: nothing
    (c,) = _hold(pool, [_context(2, 6, 2)])
    assert c.start == a.start and pool.slots == slots  # a's slots, no growth
    with torch.no_grad():  # a line scaling its own context (speaker K/V) touches its slots only
        c.context.groups[0].keys[0].mul_(0)
    _same(b.context.groups[0], _context(2, 6, 1))
    pool.release(b)
    pool.release(c)
    assert pool.held == 0 and pool.keys == [] and pool.mask is None and pool.slots == 0


def test_lines_arriving_together_are_held_from_their_batched_rows():
    """As `context_kv` gives a group for 3 lines of 2 branches: row j * 3 + i is line i's branch j."""
    pool = ContextPool(min_slots=1)
    (alone,) = _hold(pool, [_context(1, 7, 9)])  # a line already held: the batch goes around it
    groups = [_context(6, 5, 0), _context(3, 5, 1)]  # two branches, then one
    held = _hold(pool, groups, lines=3)
    assert [h.sizes for h in held] == [(2, 1)] * 3
    for i, h in enumerate(held):
        for g, (got, batched) in enumerate(zip(h.context.groups, groups)):
            rows = [j * 3 + i for j in range(h.sizes[g])]
            mine = ContextKV(
                [k[rows] for k in batched.keys],
                [v[rows] for v in batched.values],
                batched.mask[rows],
                batched.segments,
            )
            want_mask = torch.nn.functional.pad(mine.mask, (0, pool.length - 5))  # the pool is 7 long
            assert torch.equal(pool.mask[h.slots(g).start : h.slots(g).stop], want_mask)
            _same(got, mine)
    _same(alone.context.groups[0], _context(1, 7, 9))


def test_a_fixed_pool_keeps_its_tensors_and_fits_lines_in_scattered_free_slots():
    pool = ContextPool()
    pool.fix(6, 8, PoolLayout(LAYERS, H, DH, torch.float32, torch.device("cpu")))
    keys, generation = pool.keys[0], pool.generation
    held = _hold(pool, [_context(6, 8, 0)], lines=6)  # six one-row lines fill it
    assert pool.room([1]) == 0
    for h in held[::2]:  # free slots 0, 2, 4: three, none next to another
        pool.release(h)
    assert pool.room([2]) == 0 and pool.room([1, 1, 1, 1]) == 3
    written = _context(3, 5, 1)
    again = _hold(pool, [written], lines=3)  # each line in a slot of its own: no growth
    assert pool.generation == generation and pool.keys[0] is keys
    assert sorted(h.start for h in again) == [0, 2, 4]
    for i, h in enumerate(again):
        _same(
            h.context.groups[0],
            ContextKV(
                [k[i : i + 1] for k in written.keys],
                [v[i : i + 1] for v in written.values],
                written.mask[i : i + 1],
                written.segments,
            ),
        )
    for h in again + held[1::2]:
        pool.release(h)
    assert pool.held == 0 and pool.keys[0] is keys  # empty, its memory kept (graphs read it)
    _hold(pool, [_context(1, 12, 2)])  # longer than its length: it grows after all
    assert pool.generation != generation and pool.length == 12
