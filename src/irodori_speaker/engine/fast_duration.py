"""The duration predictor on the fast path: its blocks' elementwise work in fused kernels.

The predictor (v3, VoiceDesign, v4, v4.1, v4.1-MF; engine/duration.py) gives a line's length
when the caller asks none: every line of `serve`'s VOICEVOX and OpenAI clients on the default
model. It runs in the line's encoders' job, before the sampler. Eager, a block launches ~22
kernels around its GEMMs: the speaker's (and caption's) SiLU and modulation, the RMS norm's six,
the modulation's three, SwiGLU's, tanh of the gate, the gated residual add; three blocks (the
release) and the input and output ~80 a call, each a few microseconds of the device owner's
thread. Here the blocks' modulations are one GEMM (two with a caption) made before the first
block, and a block is four launches: w1 and w3 as one GEMM, `fused.swiglu`, w2, and
`fused.add_rms_modulate` (the gated residual add and the next block's modulated norm, or the
output norm); ~20 a call.

The weights are the model's, its linear layers run as themselves (int4 or not; fused side by
side as the DiT's are, `engine.fusing`), and the rows' preparation and the frames' sum are the
predictor's own: this stands in for its blocks (`DurationPredictor.forward(..., body=)`,
`.log_total`). The kernels round once where eager rounds after each op: the log frames differ by
rounding only (tests/engine/test_fused_duration.py).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .duration import DurationBlock, DurationPredictor
from .fast_text import FusedForward
from .fused import add_rms_modulate, swiglu
from .fusing import Named, fusable_into, fuse_into

__all__ = ["FastDurationPredictor", "fast_duration_predictor"]


class FastDurationPredictor(FusedForward):
    """`DurationPredictor.body` with its blocks' elementwise work fused (called as the predictor's
    `body`); its layers fused here (modifying them, as the DiT's are)."""

    what = "the duration predictor's fused kernels"

    def __init__(self, predictor: DurationPredictor) -> None:
        super().__init__(predictor, predictor.body)
        blocks = [cast(DurationBlock, b) for b in predictor.token_blocks]
        self.width = int(predictor.token_out_norm.weight.shape[0])
        self.hidden = int(cast(nn.Linear, blocks[0].mlp.w1).out_features)  # before fusing
        self.eps = [b.norm.eps for b in blocks] + [predictor.token_out_norm.eps]
        speaker, caption, mlps = _groups(blocks)
        self.modulation = fuse_into(speaker)
        self.caption_modulation = fuse_into(caption) if caption else None
        self.mlps = [(fuse_into(w13), b.mlp.w2) for b, w13 in zip(blocks, mlps)]
        self.norms = torch.stack([b.norm.weight.detach().float() for b in blocks])  # (L, D)

    def _fused(self, state: Tensor, mask: Tensor, spk: Tensor, cap: Tensor | None) -> Tensor:
        p = cast(DurationPredictor, self.module)
        B, L, D = state.shape[0], len(self.mlps), self.width
        mod = self.modulation(F.silu(spk))
        if self.caption_modulation is not None and cap is not None:
            mod = mod + self.caption_modulation(F.silu(cap))
        shift, scale, gate = mod.view(B, L, 3, D).unbind(2)  # each (B, L, D): block i's at [:, i]
        scale1 = self.norms * (1.0 + scale.float())  # the norm's weight times (1 + scale)
        gate = torch.tanh(gate)
        x = p.token_input_proj(state)
        _, h = add_rms_modulate(x, None, None, scale1[:, 0], shift[:, 0], self.eps[0])
        for i, (w13, w2) in enumerate(self.mlps):
            y = w2(swiglu(w13(h), self.hidden))
            if i + 1 < L:  # the residual add, then the next block's modulated norm
                x, h = add_rms_modulate(x, y, gate[:, i], scale1[:, i + 1], shift[:, i + 1], self.eps[i + 1])
            else:  # ... or the output norm
                x, h = add_rms_modulate(x, y, gate[:, i], p.token_out_norm.weight, None, self.eps[L])
        return p.log_total(h, mask)


def _groups(blocks: list[DurationBlock]) -> tuple[Named, Named, list[Named]]:
    """The predictor's fused groups: every block's speaker modulation, every block's caption
    modulation (none without a caption), and each block's w1 | w3."""
    caption: Named = [(b, "caption_modulation") for b in blocks if hasattr(b, "caption_modulation")]
    return [(b, "modulation") for b in blocks], caption, [[(b.mlp, "w1"), (b.mlp, "w3")] for b in blocks]


def fast_duration_predictor(model: nn.Module) -> FastDurationPredictor | None:
    """The fused blocks of a model's duration predictor, passed to `model.predict_log_frames`; None
    for a model without one (v2) or whose layers do not fuse (an int4 file's RTN-packed layers)."""
    predictor = getattr(model, "duration_predictor", None)
    if not isinstance(predictor, DurationPredictor) or not len(predictor.token_blocks):
        return None
    speaker, caption, mlps = _groups([cast(DurationBlock, b) for b in predictor.token_blocks])
    fuses = fusable_into(speaker, *([caption] if caption else []), *mlps)
    return FastDurationPredictor(predictor) if fuses else None
