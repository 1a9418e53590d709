"""A piece's encoders, a job of the device owner; those of lines that meet there run as one batch.

Each piece's job (`EncodeItem`) makes its voice's states, its text state, its predicted length
(when no length is asked) and its sampler key. Jobs queued together on the owner
(engine/hardware/owner.py, `run_batched`) are one call of `TextEncoders.many` (issue 27): the
voices one by one (each line's own, kept per voice), then ONE text-encoder call over every line's
tokens (rows padded to the longest, padding masked) cut back to what each line has alone, then one
duration-predictor call over the lines that use it. A batch that raises is run again line by line
by the owner, so an error reaches its own line only. With `max_batch` 1 every job is alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from ..engine.batch import stack_conditions, stack_tokens
from ..engine.fast import FastSampler
from ..engine.hardware.owner import DEVICE, URGENT, HostCopy
from ..engine.model import Conditions, check_ids
from ..options import SynthesisOptions

__all__ = ["EncodeItem", "Encoded", "TextEncoders"]


@dataclass(eq=False)
class EncodeItem:
    """One piece's encoders: its tokens (host, (1, L)), its voice, its options."""

    ids: Tensor
    mask: Tensor
    voice_states: Callable[[], tuple]  # (has a reference, the voice's states), made once per line
    opts: SynthesisOptions
    started: float = 0.0  # when its text encoder was reached (its voice made): the record's timing


class Encoded(NamedTuple):
    conds: Conditions
    key: Hashable | None  # the sampler's batch key, or None
    pred: HostCopy | None  # the predictor's log frames on their way to the host, or None


class TextEncoders:
    """The encoders stage of one synthesizer. `fast()`: its FastSampler or None; `sample_key(conds,
    opts)`: the key its sampler batches by; `max_batch`: the most lines in one call."""

    def __init__(
        self,
        model: Any,
        fast: Callable[[], FastSampler | None],
        sample_key: Callable[[Conditions, SynthesisOptions], Hashable | None],
        max_batch: int,
    ) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.fast = fast
        self.sample_key = sample_key
        self.max_batch = max(1, int(max_batch))
        self._key = (id(self), "encode")
        self.batches: dict[int, int] = {}  # lines in a call -> how many calls gave their results

    def encode(self, item: EncodeItem, cancel: Any = None) -> Encoded:
        """`item` encoded on the device owner, with the items of other lines queued beside it.
        Its tokens are checked here, on the line's thread, before any device work."""
        check_ids(item.ids, item.mask, self.model.cfg.text_token_vocab, "text")
        return DEVICE.run_batched(self._key, item, self.many, cancel, URGENT, limit=self.max_batch)

    def many(self, items: list[EncodeItem]) -> list[Encoded]:
        """Each item's `Encoded`, in order: the text encoder and the predictor once for all."""
        voices = []
        for item in items:
            voices.append(item.voice_states())
            item.started = time.perf_counter()
        texts = self.text_states([i.ids for i in items], [i.mask for i in items])
        conds = [Conditions(state, mask, *voice[1]) for (state, mask), voice in zip(texts, voices)]
        asked = [b for b, item in enumerate(items) if item.opts.seconds is None]
        preds: dict[int, Tensor | None] = dict(
            zip(asked, self.predict([conds[b] for b in asked], [voices[b][0] for b in asked]))
        )
        out = []
        for b, item in enumerate(items):
            key = self.sample_key(conds[b], item.opts)
            pred = preds.get(b)
            out.append(Encoded(conds[b], key, None if pred is None else DEVICE.to_host(pred)))
        self.batches[len(items)] = self.batches.get(len(items), 0) + 1
        return out

    def text_states(self, ids: list[Tensor], masks: list[Tensor]) -> list[tuple[Tensor, Tensor]]:
        """Each line's (text state, mask) on the device, as it has them alone (padded to the
        context bucket with graphs, `FastSampler.text_width`), from one text-encoder call. The
        tokens are checked by the caller (`encode`, on the line's thread)."""
        rows, mask = (ids[0], masks[0]) if len(ids) == 1 else stack_tokens(ids, masks)
        rows, mask = DEVICE.upload(rows, self.device), DEVICE.upload(mask, self.device)
        fast = self.fast()
        if fast is not None:
            state, mask = fast.encode_text(rows, mask)
        else:
            state = self.model.encode_text(rows, mask)
        if len(ids) == 1:
            return [(state, mask)]
        widths = [int(i.shape[1]) if fast is None else fast.text_width(int(i.shape[1])) for i in ids]
        return [(state[b : b + 1, :n], mask[b : b + 1, :n]) for b, n in enumerate(widths)]

    def predict(self, conds: list[Conditions], has_ref: list[bool]) -> list[Tensor | None]:
        """The duration predictor's log frames of each line (device tensors, read later), from one
        call; None each without a predictor (v2)."""
        if not conds or not self.model.cfg.use_duration_predictor:
            return [None] * len(conds)
        has = DEVICE.upload(torch.tensor(has_ref), self.device)
        batch = conds[0] if len(conds) == 1 else stack_conditions(conds)
        fast = self.fast()
        if fast is not None:
            pred = fast.predict_log_frames(batch, has)
        else:
            pred = self.model.predict_log_frames(batch, has_speaker=has)
        return [pred] if len(conds) == 1 else [pred[b : b + 1] for b in range(len(conds))]
