"""Several lines as one sampler batch: their conditions and noise stacked, padded and masked.

Padding is exact in the same way as the fast path's buckets: a padded condition position has
a zero state and a false mask, a padded latent frame is masked out of every row's keys, so
each line's valid frames see what they would see alone (up to the rounding of a larger
GEMM). Lines share a batch only when their sampler plans and loop settings are equal
(`signature`); everything else (text, voice, length, seed) may differ per row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from ..options import SamplerConfig
from .model import Conditions, TextToLatentRFDiT
from .sampler import known_any, note_any, plan_for

_FIELDS = ("text", "speaker", "caption")

#: Batch sizes a CUDA graph is captured for (prewarm captures them up to the preset's `max_batch`):
#: a batch is filled up to the next one, so a few graphs serve every size.
BATCH_BUCKETS = (2, 4, 8, 16, 32, 64)


def frame_mask(
    lengths: Sequence[int],
    total: int,
    device: torch.device | str,
    upload: Callable[[Tensor, torch.device], Tensor] | None = None,
) -> Tensor:
    """(B, total) bool: row b is valid in [0, lengths[b]). Built on the host and moved by `upload`
    (the device owner's pinned copy: a plain copy of a host list to CUDA waits for the GPU)."""
    mask = torch.arange(total)[None, :] < torch.tensor(list(lengths))[:, None]
    device = torch.device(device)
    if device.type == "cpu":
        return mask
    return upload(mask, device) if upload is not None else mask.to(device)


def _rows(rows: Sequence[Tensor], value: float | bool = 0) -> Tensor:
    """(1, L_b, ...) rows padded with `value` to the longest and stacked: (B, L_max, ...). One call
    (a fill and a copy a row) where a pad a row and a cat were three ops a row and one more, on the
    device owner's thread (issue 27: its host work bounds many streams)."""
    return pad_sequence([r[0] for r in rows], batch_first=True, padding_value=value)


def _pad_rows(states: list[Tensor], masks: list[Tensor]) -> tuple[Tensor, Tensor]:
    return _rows(states), _rows(masks, False)


def stack_conditions(items: Sequence[Conditions]) -> Conditions:
    """One row per line (each item has batch 1), every condition padded to the longest."""
    out: list[Tensor | None] = []
    for name in _FIELDS:
        states = [getattr(c, f"{name}_state") for c in items]
        masks = [getattr(c, f"{name}_mask") for c in items]
        if states[0] is None:
            out += [None, None]
        else:
            state, mask = _pad_rows(states, masks)
            known = [known_any(m) for m in masks]
            if None not in known:  # the plan asks whether any row has one: known from the lines'
                note_any(mask, any(known))  # masks (a voice's, read once) without a sync
            out += [state, mask]
    text_state, text_mask, *voice = out
    assert text_state is not None and text_mask is not None
    return Conditions(text_state, text_mask, *voice)


def stack_tokens(ids: Sequence[Tensor], masks: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Each line's (1, L_b) token ids and mask padded to the longest: (B, L_max), the padding
    token 0 and masked."""
    return _rows(ids), _rows(masks, False)


def fill_tokens(ids: Tensor, mask: Tensor, rows: int) -> tuple[Tensor, Tensor]:
    """Token rows grown to `rows` with copies of the first line, as `fill_batch` grows a batch
    (the caller drops their outputs)."""
    extra = rows - ids.shape[0]
    if extra <= 0:
        return ids, mask
    return torch.cat([ids, ids[:1].expand(extra, -1)]), torch.cat([mask, mask[:1].expand(extra, -1)])


def stack_noise(noises: Sequence[Tensor]) -> tuple[Tensor, list[int]]:
    """Each line's (1, S_b, C) noise padded with zeros to the longest: (B, S_max, C), [S_b]."""
    return _rows(noises), [int(n.shape[1]) for n in noises]


def present_conditions(conds: Conditions) -> tuple:
    """Which conditions exist and their dtypes: lines stack (`stack_conditions`) only where equal."""
    states = [(name, getattr(conds, f"{name}_state")) for name in _FIELDS]
    return tuple((name, None if state is None else state.dtype) for name, state in states)


def signature(model: TextToLatentRFDiT, conds: Conditions, cfg: SamplerConfig) -> tuple:
    """What lines must share to be sampled together: the plan (steps, schedule, guidance
    groups and weights), the loop's own settings, which conditions exist and their dtypes."""
    present = present_conditions(conds)
    loop = (
        cfg.rescale_k,
        cfg.rescale_sigma,
        cfg.speaker_kv_scale,
        cfg.speaker_kv_max_layers,
        cfg.truncation_factor,
    )
    return (plan_for(model, conds, cfg), loop, present, conds.batch_size)


def batch_bucket(rows: int) -> int:
    """The smallest of `BATCH_BUCKETS` holding `rows` (past the largest: `rows` rounded up to 16)."""
    for bucket in BATCH_BUCKETS:
        if bucket >= rows:
            return bucket
    return -(-rows // 16) * 16


#: a graphed batch filled with at least this fraction of filler rows is cut to the bucket below
#: instead, the rest left for the next batch: the sampling graph's time grows about linearly with
#: its rows from 4 up (H200, 150-frame v2 lines: 28.1 / 49.7 / 94.0 ms at 4 / 8 / 16 rows,
#: benchmarks/RESULTS.md "The ceiling"), so 10 lines took 94 ms filled to 16 and 67 ms as 8 + 2
MAX_FILL = 0.25


def lines_to_take(n: int) -> int:
    """How many of `n` lines that could share a graphed batch to sample now: all, unless filling
    them up to their bucket (`batch_bucket`) would make `MAX_FILL` or more of its rows fillers;
    then the largest bucket below (3 -> 2, 5 or 6 -> 4, 9-12 -> 8, 17-24 -> 16)."""
    if n <= 2:
        return n
    top = batch_bucket(n)
    if (top - n) / top < MAX_FILL:
        return n
    return max(b for b in (1, *BATCH_BUCKETS) if b <= n)


def fill_batch(
    conds: Conditions, noise: Tensor, lengths: Sequence[int], rows: int
) -> tuple[Conditions, Tensor, list[int]]:
    """The batch grown to `rows` with copies of its first line (whose outputs the caller drops)."""
    extra = rows - conds.batch_size
    if extra <= 0:
        return conds, noise, list(lengths)
    grown = Conditions.cat([conds, conds.row(0).repeat(extra)])
    return grown, torch.cat([noise, noise[:1].expand(extra, -1, -1)]), [*lengths, *[lengths[0]] * extra]
