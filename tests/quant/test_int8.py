"""Int8 linears (W8A8, per-channel weights, per-row activations) for the CPU preset."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from irodori_speaker.engine.quant.int8 import (
    BLOCK_LINEARS,
    Int8Linear,
    quantize_linears_int8,
    quantize_weight_int8,
)


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


def _tiny_int8_pair(dtype):
    """The tiny v2 model twice, int8 linears each quantising its own input / siblings sharing it."""
    import copy

    from irodori_speaker.engine.checkpoint import build_model
    from irodori_speaker.engine.config import ModelConfig
    from irodori_speaker.engine.tiny import TINY_CONFIGS

    torch.manual_seed(0)
    model = build_model(ModelConfig.from_dict(TINY_CONFIGS["v2"]), device="cpu").to(dtype)
    alone, shared = copy.deepcopy(model), model
    quantize_linears_int8(alone, share_inputs=False)
    quantize_linears_int8(shared)
    return alone, shared


def _velocity(model, seed=1):
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, cfg.text_vocab_size, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 9:] = False
    ref = torch.randn(2, 20, cfg.latent_dim, generator=g)
    x_t = torch.randn(2, 16, cfg.latent_dim, generator=g)
    with torch.inference_mode():
        conds = model.encode_conditions(ids, mask, ref, torch.ones(2, 20, dtype=torch.bool))
        ctx = model.context_kv(conds)
        return model.velocity(x_t, torch.tensor([0.9, 0.4]), ctx)


def _count_quantisations(monkeypatch):
    import irodori_speaker.engine.quant.int8 as int8

    calls = []
    inner = int8._quantize_rows

    def counted(x):
        calls.append(tuple(x.shape))
        return inner(x)

    monkeypatch.setattr(int8, "_quantize_rows", counted)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_siblings_quantise_their_shared_input_once_with_the_same_result(monkeypatch, dtype):
    alone, shared = _tiny_int8_pair(dtype)
    blocks = len(shared.blocks)
    calls = _count_quantisations(monkeypatch)
    expected = _velocity(alone)
    assert len(calls) == 8 * blocks  # each of the 8 linears quantises its input
    calls.clear()
    got = _velocity(shared)
    # one quantisation per distinct input: q/k/v/gate's, wo's, w1/w3's, w2's
    assert len(calls) == 4 * blocks
    assert torch.equal(got, expected)  # the same int8 values and scales: bit for bit
    for blk in shared.blocks:  # nothing held between calls
        assert blk.attention.wq.shared._held is None and blk.mlp.w1.shared._held is None


def test_quantize_links_the_siblings_once():
    _, model = _tiny_int8_pair(torch.float32)
    a, mlp = model.blocks[0].attention, model.blocks[0].mlp
    assert a.wq.shared is a.wk.shared is a.wv.shared is a.gate.shared is not None
    assert mlp.w1.shared is mlp.w3.shared is not None and mlp.w1.shared is not a.wq.shared
    assert a.wo.shared is None and mlp.w2.shared is None  # their inputs are their own
    assert model.blocks[1].attention.wq.shared is not a.wq.shared
    hooks = (len(a._forward_pre_hooks), len(a._forward_hooks))
    assert quantize_linears_int8(model) == 0  # a second call links nothing again
    assert (len(a._forward_pre_hooks), len(a._forward_hooks)) == hooks == (1, 1)


def test_shared_rows_are_keyed_on_the_input_tensor():
    from irodori_speaker.engine.quant.int8 import SharedRows

    rows = SharedRows()
    x, y = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    qx, sx = rows.rows(x, 8)
    again = rows.rows(x, 8)
    assert again[0] is qx and again[1] is sx  # the same tensor: reused
    qy, sy = rows.rows(y, 8)  # another tensor (of the same shape): quantised anew
    assert qy is not qx and torch.equal(sy, y.reshape(-1, 8).abs().amax(1, keepdim=True) / 127)
    rows.clear()
    assert rows.rows(y, 8)[0] is not qy


def test_a_deep_copy_shares_within_itself():
    import copy

    alone, model = _tiny_int8_pair(torch.float32)
    twin = copy.deepcopy(model)
    a = twin.blocks[0].attention
    assert a.wq.shared is a.gate.shared and a.wq.shared is not model.blocks[0].attention.wq.shared
    # the copy's hooks clear the copy's shared rows (bound methods are re-bound by deepcopy)
    assert next(iter(a._forward_pre_hooks.values())).__self__ is a.wq.shared
    assert torch.equal(_velocity(twin), _velocity(alone))
