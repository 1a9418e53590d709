"""benchmarks/codec_roofline.py: its op-by-op walk is the decoder's path, and its costs are the
textbook ones. The timing itself needs CUDA events (a GPU benchmark); here a host clock stands in."""

from __future__ import annotations

import time

import torch

from bench_script import load
from irodori_speaker.engine.codec import TINY_CODEC_KWARGS, codec_from_state_dict, random_codec_state_dict
from irodori_speaker.engine.codec.fast import _Conv


def _module():
    return load("codec_roofline")


def test_conv_costs_are_the_textbook_ones():
    mod = _module()
    conv = _Conv.of(torch.nn.Conv1d(8, 16, 7, padding=9, dilation=3))
    x, y = torch.zeros(2, 40, 8), torch.zeros(2, 40, 16)
    nbytes, flops = mod.conv_cost(conv, x, y)
    assert nbytes == (2 * 40 * 8 + 2 * 40 * 16 + 16 * 8 * 7) * 4
    assert flops == 2 * (2 * 40 * 16) * 8 * 7  # a multiply-add per output, input channel and tap
    up = _Conv.of(torch.nn.ConvTranspose1d(8, 4, 6, stride=3, padding=2))
    x, y = torch.zeros(1, 10, 8), torch.zeros(1, 30, 4)
    assert mod.conv_cost(up, x, y)[1] == 2 * (30 * 4) * 8 * 2  # kernel 2 x stride: 2 taps an output


def test_the_op_by_op_walk_decodes_what_the_decoder_decodes():
    mod = _module()

    class HostLedger(mod.Ledger):  # the host clock where the benchmark reads CUDA events
        def run(self, kind, stage, fn, nbytes, flops):
            t0 = time.perf_counter()
            out = fn()
            row = self.rows[(kind, stage)]
            for i, v in enumerate((1e3 * (time.perf_counter() - t0), nbytes, flops, 1)):
                row[i] += v
            return out

    state = random_codec_state_dict(TINY_CODEC_KWARGS, seed=2, watermark=False)
    codec = codec_from_state_dict(state, TINY_CODEC_KWARGS, device="cpu")
    assert codec.use_channels_last(True) and codec._channels_last is not None
    z = torch.randn(2, codec.latent_channels, 9, generator=torch.Generator().manual_seed(0))
    ledger = HostLedger(1)
    with torch.no_grad():
        audio, fused_bytes = mod.decode(codec._channels_last, z.transpose(1, 2), ledger)
        want = codec._decode_frames(z)
    torch.testing.assert_close(audio, want, atol=2e-6, rtol=0)
    kinds = {kind for kind, _ in ledger.rows}
    assert {"epilogue", "conv T", "conv k1", "conv k7 d1", "conv k7 d3", "conv k7 d9", "head"} <= kinds
    calls = sum(r[3] for r in ledger.rows.values())
    assert calls == 2 + 2 + 4 * (1 + 1 + 3 * 4) + 1  # in_proj, first conv, 4 blocks, the head
    # one kernel a unit moves less than the ops do, and no less than the head and the units' writes
    assert 0 < fused_bytes < sum(r[1] for r in ledger.rows.values())
