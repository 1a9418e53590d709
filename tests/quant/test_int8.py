"""Int8 linears (W8A8, per-channel weights, per-row activations) for the CPU preset."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from irodori_speaker.quant.int8 import BLOCK_LINEARS, Int8Linear, quantize_linears_int8, quantize_weight_int8


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_weight_quantisation_is_symmetric_per_channel():
    w = torch.randn(6, 40) * torch.logspace(-2, 1, 6)[:, None]  # rows of very different scale
    q, scale = quantize_weight_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (6,)
    assert int(q.abs().amax(dim=1).min()) == 127  # every row uses its full range
    torch.testing.assert_close(q.float() * scale[:, None], w, atol=float(scale.max()) / 2 + 1e-7, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_linear_is_close_to_the_float_linear(dtype, bias):
    torch.manual_seed(0)
    lin = nn.Linear(256, 96, bias=bias)
    x = torch.randn(3, 17, 256)
    q = Int8Linear.from_linear(lin).to(dtype)
    with torch.inference_mode():
        y, ref = q(x.to(dtype)), lin(x)
    assert y.dtype == dtype and y.shape == (3, 17, 96)
    # measured: 7.9e-3 (fp32 input), 8.2e-3 (bf16 input) relative L2
    assert _rel(y, ref) < 2e-2


def test_int8_linear_keeps_its_int8_weight_under_to():
    q = Int8Linear.from_linear(nn.Linear(32, 8))
    q.to(torch.bfloat16)
    assert q.qweight.dtype == torch.int8 and q.scale.dtype == torch.float32
    assert q.bias is not None and q.bias.dtype == torch.bfloat16


def test_without_int_mm_the_same_products_are_summed_in_fp32(monkeypatch):
    torch.manual_seed(1)
    lin = nn.Linear(64, 16, bias=False)
    q = Int8Linear.from_linear(lin)
    x = torch.randn(5, 64)
    with torch.inference_mode():
        fast = q(x)

        def broken(*a, **k):
            raise RuntimeError("no int8 GEMM in this build")

        monkeypatch.setattr(torch, "_int_mm", broken)
        slow = q(x)
    assert not q._int_mm_ok
    torch.testing.assert_close(slow, fast, atol=1e-5, rtol=1e-5)


def test_quantize_swaps_the_per_step_linears_of_every_block():
    from irodori_speaker.engine.checkpoint import build_model
    from irodori_speaker.engine.config import ModelConfig
    from irodori_speaker.engine.tiny import TINY_CONFIGS

    torch.manual_seed(0)
    model = build_model(ModelConfig.from_dict(TINY_CONFIGS["v2"]), device="cpu")
    n = quantize_linears_int8(model)
    assert n == len(model.blocks) * len(BLOCK_LINEARS)
    blk = model.blocks[0]
    assert isinstance(blk.attention.wq, Int8Linear) and isinstance(blk.mlp.w2, Int8Linear)
    # once per line / schedule, and the encoders: left float
    assert type(blk.attention.wk_text) is nn.Linear and type(blk.attention_adaln.shift_up) is nn.Linear
    assert type(model.in_proj) is nn.Linear
    assert quantize_linears_int8(model) == 0  # already swapped
