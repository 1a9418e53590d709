"""Int4 modules on the CPU (reference paths) against torch's own modules holding the dequantised weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from irodori_speaker.engine.quant.formats import pack_gptq, rtn_quantize
from irodori_speaker.engine.quant.layers import (
    Int4Conv1d,
    Int4ConvTranspose1d,
    Int4Linear,
    PackedEmbedding,
    RTNLinear,
    concat_int4_linears,
)
from irodori_speaker.errors import QuantError


def _gptq(n: int, k: int, *, sym: bool, seed: int, bias: bool = False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g)
    z = torch.full((n, k // 32), 8) if sym else torch.randint(0, 16, (n, k // 32), generator=g)
    s = torch.rand(n, k // 32, generator=g) * 0.05 + 0.01
    b = torch.randn(n, generator=g) if bias else None
    return pack_gptq(q, z, s, bias=b)


@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int4_linear_reference_path(sym: bool, dtype: torch.dtype) -> None:
    p = _gptq(48, 64, sym=sym, seed=1, bias=True)
    layer = Int4Linear(p, act_dtype=dtype)
    assert layer.symmetric is sym and (layer.zero_bias is None) is sym
    x = torch.randn(2, 5, 64).to(dtype)
    w = p.dequantize(torch.float32)
    expect = F.linear(x.float(), w, p.bias.float())
    y = layer(x)
    assert y.shape == (2, 5, 48) and y.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(y.float(), expect, rtol=tol, atol=tol)
    assert torch.equal(layer.dequantize_weight(), w)
    with pytest.raises(QuantError, match="64"):
        layer(torch.randn(3, 32))


def test_int4_linear_keeps_packed_dtypes_under_to() -> None:
    layer = Int4Linear(_gptq(16, 32, sym=False, seed=2, bias=True))
    scales = layer.scales.clone()
    layer.to(torch.bfloat16)
    assert layer.scales.dtype == torch.float16 and torch.equal(layer.scales, scales)
    assert layer.qweight.dtype == torch.int32 and layer.zero_bias.dtype == torch.float16
    assert layer.bias.dtype == torch.bfloat16
    assert set(layer.state_dict()) == {"qweight", "qzeros", "scales", "g_idx", "bias"}


def test_packed_round_trip_v2() -> None:
    p = _gptq(16, 64, sym=False, seed=3)
    layer = Int4Linear(p.to_format("gptq_v2"))
    assert torch.equal(layer.packed().qzeros, p.qzeros)  # held as v1
    assert torch.equal(layer.packed("gptq_v2").dequantize(), p.dequantize())


def test_concat_int4_linears() -> None:
    parts = [
        Int4Linear(_gptq(n, 64, sym=s, seed=i, bias=True))
        for i, (n, s) in enumerate([(16, True), (24, False)])
    ]
    fused = concat_int4_linears(parts)
    x = torch.randn(3, 64)
    torch.testing.assert_close(fused(x), torch.cat([p(x) for p in parts], dim=-1), rtol=1e-6, atol=1e-6)
    assert fused.out_features == 40 and not fused.symmetric
    with pytest.raises(QuantError):
        concat_int4_linears([parts[0], Int4Linear(_gptq(16, 32, sym=True, seed=9))])


def test_packed_embedding_dequantises_rows() -> None:
    table = torch.randn(37, 40)
    p = rtn_quantize(table, group_size=20)
    emb = PackedEmbedding(p, act_dtype=torch.float32)
    ids = torch.tensor([[0, 36, 5], [5, 5, 1]])
    ref = nn.Embedding.from_pretrained(p.dequantize())
    out = emb(ids)
    assert out.shape == (2, 3, 40)
    assert torch.equal(out, ref(ids))
    assert (out - table[ids]).abs().max() < 0.6 * float(p.scales.float().max())


def test_rtn_linear() -> None:
    w = torch.randn(12, 33)  # odd columns
    p = rtn_quantize(w, num_groups=3)
    b = torch.randn(12)
    lin = RTNLinear(p, b)
    x = torch.randn(4, 33)
    torch.testing.assert_close(lin(x), F.linear(x, p.dequantize(), b))


@pytest.mark.parametrize(
    ("cin", "cout", "k", "stride", "padding", "dilation", "groups"),
    [(4, 6, 7, 1, 3, 1, 1), (6, 4, 3, 2, 0, 1, 2), (5, 3, 3, 1, 3, 3, 1), (4, 8, 1, 1, 0, 1, 4)],
)
def test_int4_conv1d_matches_conv1d(cin, cout, k, stride, padding, dilation, groups) -> None:
    ref = nn.Conv1d(cin, cout, k, stride=stride, padding=padding, dilation=dilation, groups=groups)
    flat = ref.weight.detach().reshape(cout, -1)
    p = rtn_quantize(flat, group_size=None if flat.shape[1] % 2 else flat.shape[1] // 2)
    q = Int4Conv1d.from_conv(ref, p)
    with torch.no_grad():
        ref.weight.copy_(p.dequantize().view_as(ref.weight))
    x = torch.randn(2, cin, 23)
    torch.testing.assert_close(q(x), ref(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("cin", "cout", "k", "stride", "padding", "output_padding", "groups"),
    [(6, 4, 4, 2, 1, 0, 1), (4, 6, 6, 3, 2, 1, 2), (3, 5, 16, 8, 4, 0, 1)],
)
def test_int4_conv_transpose1d_matches(cin, cout, k, stride, padding, output_padding, groups) -> None:
    ref = nn.ConvTranspose1d(
        cin, cout, k, stride=stride, padding=padding, output_padding=output_padding, groups=groups
    )
    flat = ref.weight.detach().reshape(cin, -1)  # [in, out/groups * k]
    p = rtn_quantize(flat, group_size=None)
    q = Int4ConvTranspose1d.from_conv(ref, p)
    with torch.no_grad():
        ref.weight.copy_(p.dequantize().view_as(ref.weight))
    x = torch.randn(2, cin, 9)
    y = q(x)
    assert y.shape == ref(x).shape
    torch.testing.assert_close(y, ref(x), rtol=1e-5, atol=1e-5)


def test_conv_shape_mismatch_is_an_error() -> None:
    conv = nn.Conv1d(4, 6, 3)
    with pytest.raises(QuantError, match="expected 6x12"):
        Int4Conv1d.from_conv(conv, rtn_quantize(torch.randn(6, 10), group_size=None))


def test_a_grown_out_scratch_buffer_is_retired_not_freed() -> None:
    """A CUDA graph captured earlier still points into the old buffer (see `_RETIRED`); the
    mechanism is the same on every device, so it is checked here on the CPU."""
    from irodori_speaker.engine.quant import w4a16_dequant as wd

    wd.release_scratch()
    dev = torch.device("cpu")
    first = wd._scratch(100, torch.float32, dev)
    assert wd._scratch(50, torch.float32, dev).data_ptr() == first.data_ptr()  # no growth: reused
    grown = wd._scratch(1000, torch.float32, dev)
    assert grown.data_ptr() != first.data_ptr()
    assert any(t.data_ptr() == first.data_ptr() for t in wd._RETIRED)
    wd.release_scratch()
    assert not wd._RETIRED and not wd._SCRATCH
