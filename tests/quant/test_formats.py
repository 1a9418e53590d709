"""GPTQ / RTN nibble formats: bit layouts against the spec's formulas, exact round trips, quantisers,
and the unmasked-packer corruption check."""

from __future__ import annotations

import warnings

import pytest
import torch

from irodori_speaker.engine.quant.formats import (
    QuantCorruptionWarning,
    detect_unmasked_zero_corruption,
    gptq_group_params,
    pack_gptq,
    pack_gptq_qweight,
    pack_gptq_qzeros,
    pack_nibbles,
    quantize_codes,
    rtn_quantize,
    unpack_gptq_qweight,
    unpack_gptq_qzeros,
    unpack_nibbles,
    warn_if_corrupted,
)
from irodori_speaker.errors import QuantError


def _u32(v: int) -> int:
    return v & 0xFFFFFFFF


@pytest.mark.parametrize("seed", range(6))
def test_qweight_round_trip_and_bit_layout(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    k = 8 * int(torch.randint(1, 9, (1,), generator=g))
    n = int(torch.randint(1, 40, (1,), generator=g))  # qweight itself allows any N
    q = torch.randint(0, 16, (k, n), generator=g, dtype=torch.int32)
    qw = pack_gptq_qweight(q)
    assert qw.shape == (k // 8, n) and qw.dtype == torch.int32
    assert torch.equal(unpack_gptq_qweight(qw), q)
    # the spec's formula, evaluated with Python ints on every element
    for kk in range(k):
        for nn_ in range(n):
            assert (_u32(int(qw[kk // 8, nn_])) >> (4 * (kk % 8))) & 0xF == int(q[kk, nn_])


@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("seed", range(4))
def test_qzeros_round_trip_and_bit_layout(fmt: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    groups, n = int(torch.randint(1, 6, (1,), generator=g)), 8 * int(torch.randint(1, 6, (1,), generator=g))
    z = torch.randint(0, 16, (groups, n), generator=g, dtype=torch.int32)
    qz = pack_gptq_qzeros(z, fmt)
    assert qz.shape == (groups, n // 8)
    assert torch.equal(unpack_gptq_qzeros(qz, fmt), z)
    for gg in range(groups):
        for nn_ in range(n):
            stored = (_u32(int(qz[gg, nn_ // 8])) >> (4 * (nn_ % 8))) & 0xF
            expect = (stored + 1) & 0xF if fmt == "gptq" else stored
            assert expect == int(z[gg, nn_])


def test_symmetric_zero_words() -> None:
    z = torch.full((2, 16), 8, dtype=torch.int32)
    assert {_u32(int(v)) for v in pack_gptq_qzeros(z, "gptq").flatten()} == {0x77777777}
    assert {_u32(int(v)) for v in pack_gptq_qzeros(z, "gptq_v2").flatten()} == {0x88888888}


def test_gptq_shape_errors() -> None:
    with pytest.raises(QuantError, match="N % 8"):
        pack_gptq_qzeros(torch.zeros(1, 12, dtype=torch.int32))
    with pytest.raises(QuantError, match="K % 8"):
        pack_gptq_qweight(torch.zeros(12, 8, dtype=torch.int32))
    with pytest.raises(QuantError, match=r"0\.\.15"):
        pack_gptq_qweight(torch.full((8, 8), 16, dtype=torch.int32))
    with pytest.raises(QuantError, match="does not fit GPTQ"):
        pack_gptq(torch.zeros(12, 64, dtype=torch.int32), torch.zeros(12, 2), torch.ones(12, 2))
    with pytest.raises(QuantError, match="checkpoint_format"):
        pack_gptq_qzeros(torch.zeros(1, 8, dtype=torch.int32), "gptq_v3")


@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_gptq_dequant_formula(fmt: str) -> None:
    g = torch.Generator().manual_seed(1)
    n, k, gs = 16, 64, 32
    q = torch.randint(0, 16, (n, k), generator=g)
    z = torch.randint(0, 16, (n, k // gs), generator=g)
    s = (torch.rand(n, k // gs, generator=g) + 0.1).half().float()
    p = pack_gptq(q, z, s, group_size=gs, checkpoint_format=fmt)
    w = p.dequantize()
    assert w.shape == (n, k)
    for nn_ in range(0, n, 5):
        for kk in range(0, k, 7):
            expect = float(s[nn_, kk // gs]) * (int(q[nn_, kk]) - int(z[nn_, kk // gs]))
            assert float(w[nn_, kk]) == pytest.approx(expect, rel=0, abs=0)
    # v1 <-> v2 re-packing changes the zeros' storage, not the weight
    other = p.to_format("gptq_v2" if fmt == "gptq" else "gptq")
    assert torch.equal(other.dequantize(), w)
    assert torch.equal(p.g_idx, torch.arange(k, dtype=torch.int32) // gs)


def test_nibble_layout_and_round_trip_odd_columns() -> None:
    q = torch.tensor([[1, 2, 3], [15, 0, 7]], dtype=torch.uint8)
    packed = pack_nibbles(q)
    assert packed.tolist() == [[0x21, 0x03], [0x0F, 0x07]]  # col 2j low nibble, 2j+1 high; odd pad 0
    assert torch.equal(unpack_nibbles(packed, 3), q)
    g = torch.Generator().manual_seed(3)
    for rows, cols in [(1, 1), (5, 7), (3, 64), (4, 97)]:
        codes = torch.randint(0, 16, (rows, cols), generator=g, dtype=torch.uint8)
        p = pack_nibbles(codes)
        assert p.shape == (rows, (cols + 1) // 2)
        assert torch.equal(unpack_nibbles(p, cols), codes)
    with pytest.raises(QuantError):
        unpack_nibbles(packed, 5)


def test_rtn_asymmetric_matches_spec_formula() -> None:
    g = torch.Generator().manual_seed(4)
    w = torch.randn(6, 64, generator=g)
    p = rtn_quantize(w, group_size=32)
    assert p.num_groups == 2 and p.scales.dtype == torch.float16
    wg = w.view(6, 2, 32)
    lo, hi = wg.amin(-1), wg.amax(-1)
    scale = (torch.clamp(hi - lo, min=1e-8) / 15).half().float()
    zero = torch.round(-lo / scale).clamp(0, 15)
    q = torch.round(wg / scale[..., None] + zero[..., None]).clamp(0, 15)
    assert torch.equal(p.scales.float(), scale)
    assert torch.equal(p.zeros.float(), zero)
    expect = ((q - zero[..., None]) * scale[..., None]).view(6, 64)
    assert torch.equal(p.dequantize(), expect)
    assert (p.dequantize() - w).abs().max() <= scale.max() * 0.5 + 1e-6


def test_rtn_symmetric_and_groups() -> None:
    g = torch.Generator().manual_seed(5)
    w = torch.randn(4, 30, generator=g)
    p = rtn_quantize(w, num_groups=3, symmetric=True)
    assert p.group_cols == 10 and bool((p.zeros == 8).all())
    scale = (2 * w.view(4, 3, 10).abs().amax(-1) / 15).half().float()
    assert torch.equal(p.scales.float(), scale)
    err = (p.dequantize() - w).abs().view(4, 3, 10)
    # half a step, plus what the fp16 rounding of the scale adds at the clamped end (+max -> code 15)
    assert bool((err <= scale[..., None] * 0.51).all())
    one = rtn_quantize(w, group_size=None)
    assert one.num_groups == 1
    with pytest.raises(QuantError, match="multiple of group_size"):
        rtn_quantize(w, group_size=32)
    rows = torch.tensor([3, 0, 3])
    assert torch.equal(p.dequantize(rows=rows), p.dequantize()[rows])


def test_gptq_group_params() -> None:
    w = torch.tensor([[-1.0, 0.5, 0.25, 0.75], [0.1, 0.2, 0.3, 0.4]])
    s, z = gptq_group_params(w, symmetric=True)
    assert torch.equal(z, torch.tensor([8.0, 8.0]))
    assert torch.equal(s, (torch.tensor([2.0, 0.8]) / 15).half().float())
    s, z = gptq_group_params(w, symmetric=False)
    # asymmetric: the range includes 0, so the all-positive row gets zero 0
    assert torch.equal(s, (torch.tensor([1.75, 0.4]) / 15).half().float())
    assert z.tolist() == [round(1.0 / float(s[0])), 0.0]
    q = quantize_codes(w, s[:, None], z[:, None])
    assert bool(((q >= 0) & (q <= 15)).all())
    zero_s, zero_z = gptq_group_params(torch.zeros(1, 4))
    assert torch.equal(
        quantize_codes(torch.zeros(1, 4), zero_s[:, None], zero_z[:, None]), torch.full((1, 4), 8.0)
    )


def _buggy_pack_qzeros_v1(z: torch.Tensor) -> torch.Tensor:
    """The old packer: OR in (z - 1) << 4j without masking to 4 bits (int32 arithmetic, Python ints here)."""
    groups, n = z.shape
    out = torch.zeros(groups, n // 8, dtype=torch.int32)
    for gg in range(groups):
        for w in range(n // 8):
            word = 0
            for j in range(8):
                word |= (int(z[gg, w * 8 + j]) - 1) << (4 * j)  # -1 sign-extends over every higher bit
            word &= 0xFFFFFFFF
            out[gg, w] = word - (1 << 32) if word >= 1 << 31 else word
    return out


def test_unmasked_packer_corruption_is_detected() -> None:
    g = torch.Generator().manual_seed(6)
    z = torch.randint(1, 15, (4, 32), generator=g)  # clean values 1..14
    z[1, 3] = 0  # a zero of 0 in word 0 of group 1, position 3
    z[2, 8 + 5] = 0  # and one in word 1 of group 2, position 5
    bad = _buggy_pack_qzeros_v1(z)
    good = pack_gptq_qzeros(z, "gptq")
    # the buggy words really are corrupted: the following zeros of those words read back as 0
    decoded = unpack_gptq_qzeros(bad, "gptq")
    assert decoded[1, 3:8].tolist() == [0] * 5 and decoded[1, 3:8].tolist() != z[1, 3:8].tolist()
    assert detect_unmasked_zero_corruption(bad, "gptq") == 2
    with pytest.warns(QuantCorruptionWarning, match="unmasked-packer"):
        warn_if_corrupted("blocks.0.attention.wq", bad, "gptq")
    # the same zeros packed correctly (zero 0 present, following nibbles intact) do not warn
    assert detect_unmasked_zero_corruption(good, "gptq") == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_corrupted("ok", good, "gptq") == 0
        assert warn_if_corrupted("sym", pack_gptq_qzeros(torch.full((2, 16), 8), "gptq"), "gptq") == 0
        assert warn_if_corrupted("v2", pack_gptq_qzeros(z, "gptq_v2"), "gptq_v2") == 0
    # a zero of 0 in the last nibble corrupts nothing and is not flagged
    z_last = torch.full((1, 8), 5)
    z_last[0, 7] = 0
    assert detect_unmasked_zero_corruption(_buggy_pack_qzeros_v1(z_last), "gptq") == 0
