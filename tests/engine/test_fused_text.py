"""The text towers' fused kernels (engine/fused.py: `add_layer_norm`, `rope_qkv`, `glu` with GELU
for v4's ModernBERT; `rope_qkv` with grouped K/V and head norms for v4-Large's T5Gemma 2;
`add_rms_modulate` ungated and `qkv_joint` without context for the scratch encoder of v2 / v3 /
VoiceDesign) against torch, and the fused forwards (engine/fast_text.py) against the reference's
golden states and the eager forward.

Runs natively on CUDA; on the CPU `test_fused_interp.py` runs this module under
TRITON_INTERPRET=1 in its subprocess. Without either, every test here skips.
"""

from __future__ import annotations

from pathlib import Path

import kernel_twins as twins
import pytest
import torch
import torch.nn.functional as F
from dit_cases import KINDS as SCRATCH_KINDS
from dit_cases import load_kind as load_scratch_kind
from safetensors.torch import load_file
from v4_cases import KINDS, load_kind

from irodori_speaker.engine import fused as fu
from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.engine.fast import FastDiT, FastSampler
from irodori_speaker.engine.fast_text import FastModernBert, FastT5Gemma, FastTextEncoder, fast_text_backbone
from irodori_speaker.engine.layers import apply_rotate_half, rope_tables, rotate_half_tables

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
V4_LARGE = Path(__file__).resolve().parents[1] / "data" / "dit_v4_large"
pytestmark = pytest.mark.skipif(
    not fu.fused_available(DEV), reason="needs CUDA + triton, or TRITON_INTERPRET=1 (test_fused_interp.py)"
)
# the kernels round once where torch rounds after each op: an ulp or two of a half type apart
TOL = {
    torch.float32: dict(atol=2e-5, rtol=2e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=6e-2, rtol=3e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _randn(*shape, dtype):
    return torch.randn(*shape, device=DEV).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "residual, bias, masked", [(True, False, False), (False, True, False), (True, True, True)]
)
def test_add_layer_norm_is_the_residual_add_then_layer_norm(dtype, residual, bias, masked):
    torch.manual_seed(0)
    D = 80  # not a power of two: the row block is masked
    x, y = _randn(2, 5, D, dtype=dtype) * 3 + 1, _randn(2, 5, D, dtype=dtype) if residual else None
    w, b = _randn(D, dtype=dtype), (_randn(D, dtype=dtype) if bias else None)
    mask = torch.rand(2, 5, device=DEV) > 0.4 if masked else None
    xo, h = fu.add_layer_norm(x, y, w, b, 1e-5, mask)
    s = x + y if y is not None else x
    assert torch.equal(xo, s)  # the residual as the eager path rounds it
    want = F.layer_norm(s, (D,), w, b, 1e-5)
    if mask is not None:
        want = want * mask[..., None].to(dtype)
        assert not h[~mask].any()
    torch.testing.assert_close(h.float(), want.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads, Dh", [(3, 12), (12, 64)])  # the tiny backbone's and the release's
def test_rope_qkv_rotates_q_and_k_and_lays_out_the_heads(dtype, heads, Dh):
    torch.manual_seed(1)
    B, L = 2, 7
    p = _randn(B, L, 3 * heads * Dh, dtype=dtype)
    cos, sin = rotate_half_tables(L, Dh, 10000.0, DEV)
    q, k, v = fu.rope_qkv(p, cos, sin, heads)
    want_q, want_k, want_v = p.view(B, L, 3, heads, Dh).permute(2, 0, 3, 1, 4).unbind(0)
    assert q.shape == (B, heads, L, Dh) and q.is_contiguous() and k.is_contiguous()
    assert torch.equal(v, want_v)
    for got, want in ((q, want_q), (k, want_k)):
        torch.testing.assert_close(got.float(), apply_rotate_half(want, cos, sin).float(), **TOL[dtype])
    assert not torch.allclose(q.float(), want_q.float())  # rotated: position 0 alone is not


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "heads, kv_heads, Dh", [(4, 2, 16), (4, 1, 256)]
)  # the tiny v4-Large's, the release's
def test_rope_qkv_with_grouped_kv_norms_the_heads_then_rotates(dtype, heads, kv_heads, Dh):
    """T5Gemma 2's attention inputs: q (heads) and k, v (kv_heads) laid out, q and k each RMS-normed
    per head times their multiplier (1 + w), then rotated; v as it is."""
    torch.manual_seed(5)
    B, L = 2, 5
    p = _randn(B, L, (heads + 2 * kv_heads) * Dh, dtype=dtype) * 3
    qn, kn = 1 + torch.randn(Dh, device=DEV) * 0.5, 1 + torch.randn(Dh, device=DEV) * 0.5
    cos, sin = rotate_half_tables(L, Dh, 10000.0, DEV)
    q, k, v = fu.rope_qkv(p, cos, sin, heads, kv_heads, (qn, kn), 1e-6)
    want_q, want_k, want_v = p.split([heads * Dh, kv_heads * Dh, kv_heads * Dh], dim=-1)

    def normed(t, n, h):
        t32 = t.float().view(B, L, h, Dh)
        return (t32 * torch.rsqrt(t32.pow(2).mean(-1, keepdim=True) + 1e-6) * n).transpose(1, 2)

    assert q.shape == (B, heads, L, Dh) and k.shape == v.shape == (B, kv_heads, L, Dh)
    assert torch.equal(v, want_v.view(B, L, kv_heads, Dh).transpose(1, 2))
    for got, want in ((q, normed(want_q, qn, heads)), (k, normed(want_k, kn, kv_heads))):
        torch.testing.assert_close(got.float(), apply_rotate_half(want, cos, sin), **TOL[dtype])
    plain, _, _ = fu.rope_qkv(p, cos, sin, heads, kv_heads)  # rotated, not normed
    assert not torch.allclose(plain.float(), q.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act, approximate", [("gelu", "none"), ("gelu_tanh", "tanh")])
def test_glu_with_gelu_is_geglu(dtype, act, approximate):
    torch.manual_seed(2)
    u = _randn(2, 3, 2 * 1100, dtype=dtype) * 2  # hidden over one block, not a multiple of it
    a, b = u.float().split(1100, dim=-1)
    want = F.gelu(a, approximate=approximate) * b
    torch.testing.assert_close(fu.glu(u, 1100, act).float(), want, **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [True, False])
def test_ungated_add_rms_modulate_is_the_residual_add_then_rms_norm(dtype, residual):
    torch.manual_seed(3)
    D = 80  # not a power of two: the row block is masked
    x, y = _randn(2, 5, D, dtype=dtype) * 3 + 1, _randn(2, 5, D, dtype=dtype) if residual else None
    w = _randn(D, dtype=dtype)
    xo, h = fu.add_rms_modulate(x, y, None, w, None, 1e-6)
    s = x + y if y is not None else x
    assert torch.equal(xo, s)  # the residual as the eager path rounds it (x as it is without y)
    s32 = s.float()
    want = s32 * torch.rsqrt(s32.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()
    torch.testing.assert_close(h.float(), want.to(dtype).float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_qkv_joint_rotates_every_head_with_no_context(dtype):
    """A scratch text encoder's attention inputs: q and k normed per head and every head rotated,
    the keys and values the tokens' own (a context of no positions)."""
    torch.manual_seed(4)
    B, S, H, Dh = 2, 6, 3, 16
    p = _randn(B, S, 4 * H * Dh, dtype=dtype)
    qn, kn = _randn(H, Dh, dtype=dtype), _randn(H, Dh, dtype=dtype)
    cos, sin = rope_tables(S, Dh, DEV)
    nothing = p.new_empty(B, H, 0, Dh)
    got = fu.qkv_joint(p, qn, kn, cos, sin, nothing, nothing, H, 1e-6, rope_heads=H)
    want = twins.qkv_joint(p, qn, kn, cos, sin, nothing, nothing, H, 1e-6, rope_heads=H)
    for a, b in zip(got, want):
        assert a.shape == (B, H, S, Dh)
        torch.testing.assert_close(a.float(), b.float(), **TOL[dtype])
    half = twins.qkv_joint(p, qn, kn, cos, sin, nothing, nothing, H, 1e-6)  # the DiT's: heads // 2
    assert not torch.allclose(got[0][:, -1].float(), half[0][:, -1].float())  # the last head rotated too


def _watched(fast: FastModernBert | FastT5Gemma | FastTextEncoder) -> list[int]:
    """Calls of `fast`'s fused forward, recorded (a fall-back to the eager one records none)."""
    calls: list[int] = []
    fused = fast._fused
    fast._fused = lambda *a: calls.append(1) or fused(*a)  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("kind", KINDS)
def test_the_fused_backbone_gives_the_reference_states(kind):
    """The tiny v4 / v4.1-MF ModernBERT (48 wide, 4 heads of 12, a full and two sliding layers,
    a padded row) against the reference's stored last_hidden_state; the padded row alone gives
    its states again (the tables kept from the first call), its padding zero."""
    model, io, _, _ = load_kind(kind)
    model = model.to(DEV)
    fast = fast_text_backbone(model)
    assert isinstance(fast, FastModernBert)
    calls = _watched(fast)
    with torch.inference_mode():
        got = fast(io["text_input_ids"].to(DEV), io["text_mask"].to(DEV))
    assert calls and fast.on  # the kernels ran, no fall-back
    torch.testing.assert_close(got.cpu(), io["out_text_backbone_state"], atol=1e-4, rtol=1e-4)
    # the RoPE tables kept for the length, made once (keyed by the device as given: cuda:0)
    assert [(n, d.type) for n, d in fast._tables] == [(16, DEV.type)]
    with torch.inference_mode():
        again = fast(io["text_input_ids"][1:].to(DEV), io["text_mask"][1:].to(DEV))  # the padded row alone
    torch.testing.assert_close(again, got[1:], atol=1e-5, rtol=1e-5)
    assert not again[0, int(io["text_mask"][1].sum()) :].any()


def _with_an_empty_row(io):
    """The fixture's text rows, a padded one among them, and a third row with no valid token."""
    ids, mask = io["text_input_ids"], io["text_mask"]
    assert not bool(mask.all()), "the fixture has a padded row"
    return torch.cat((ids, ids[:1])).to(DEV), torch.cat((mask, torch.zeros_like(mask[:1]))).to(DEV)


@pytest.mark.parametrize("kind", SCRATCH_KINDS)
def test_the_fused_text_encoder_gives_the_reference_states(dit_fixtures, kind):
    """The tiny v2 / v3 / VoiceDesign text encoders (32 wide, 2 heads of 16, 2 blocks, a padded
    row) through `model.encode_text` with the fused forward: the reference's stored text states;
    the eager forward, its projections now fused views, gives them too; a row with no valid token
    comes out zero, as eager."""
    model, io, _ = load_scratch_kind(dit_fixtures, kind)
    model = model.to(DEV)
    fast = fast_text_backbone(model)
    assert isinstance(fast, FastTextEncoder)
    calls = _watched(fast)
    ids, mask = _with_an_empty_row(io)
    with torch.inference_mode():
        got = model.encode_text(ids, mask, backbone=fast)
        eager = model.encode_text(ids, mask)
    assert calls and fast.on  # the kernels ran, no fall-back
    torch.testing.assert_close(got[:2].cpu(), io["out_text_state"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(eager[:2].cpu(), io["out_text_state"], atol=1e-4, rtol=1e-4)
    assert not got[2].any() and not eager[2].any()
    # the RoPE tables kept for the length, made once (keyed by the device as given: cuda:0)
    assert [(n, d.type) for n, d in fast._tables] == [(ids.shape[1], DEV.type)]


def test_the_fused_t5gemma_gives_the_reference_states():
    """The tiny v4-Large T5Gemma 2 tower (48 wide, 4 heads and 2 K/V heads of 16, three sliding
    layers and a full one, the end-of-image token in a row, a padded row) against the reference's
    stored states of a text, a caption and an empty caption (exact zeros); the eager forward, its
    projections now fused views, gives them too."""
    model = load_checkpoint(V4_LARGE / "tiny_v4_large.safetensors").model.to(DEV)
    io = {k: v.to(DEV) for k, v in load_file(V4_LARGE / "tiny_v4_large_io.safetensors").items()}
    fast = fast_text_backbone(model)
    assert isinstance(fast, FastT5Gemma)
    calls = _watched(fast)
    with torch.inference_mode():
        for what in ("text", "caption", "empty_caption"):
            ids, mask = io[f"{what}_input_ids"], io[f"{what}_mask"]
            got, eager = fast(ids, mask), model.pretrained_text_backbone(ids, mask)
            want = io[f"out_{what}_backbone_state"]
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(eager, want, atol=1e-4, rtol=1e-4)
    assert calls and fast.on  # the kernels ran, no fall-back
    assert not got.any()  # the empty caption: zeros, never NaN
    assert sorted(k[0] for k in fast._tables) == [12, 16]  # the RoPE tables kept per length


def test_an_int4_t5gemma_tower_fuses_its_int4_projections(tmp_path):
    """An int4 v4-Large file's tower (its projections `Int4Linear`, fused through `concat`): the
    fused forward gives the int4 model's eager states."""
    from irodori_speaker.engine.quant.checkpoint import load_int4_model
    from irodori_speaker.engine.quant.layers import Int4Linear
    from irodori_speaker.engine.quant.quantize import quantize_checkpoint

    dst = tmp_path / "int4.safetensors"
    # groups of 16: the tiny tower's 48-wide inputs in whole groups (the release's 1152 are 36 of
    # 32); with ragged groups they are RTN-packed, which does not fuse (the eager forward, as below)
    src = V4_LARGE / "tiny_v4_large.safetensors"
    quantize_checkpoint(src, dst, method="rtn", report_errors=False, group_size=16)
    model = load_int4_model(dst, dtype="fp32", device=DEV).model
    io = load_file(V4_LARGE / "tiny_v4_large_io.safetensors")
    ids, mask = io["text_input_ids"].to(DEV), io["text_mask"].to(DEV)
    with torch.inference_mode():
        want = model.pretrained_text_backbone(ids, mask)
        fast = fast_text_backbone(model)
        assert isinstance(fast, FastT5Gemma) and isinstance(fast.layers[0][1], Int4Linear)
        got = fast(ids, mask)
    assert fast.on
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    ragged = tmp_path / "ragged.safetensors"
    quantize_checkpoint(src, ragged, method="rtn", report_errors=False)
    assert fast_text_backbone(load_int4_model(ragged, dtype="fp32", device=DEV).model) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", ["v4.1-mf", "v2", "v4-large"])
def test_the_fast_sampler_encodes_text_through_it(dit_fixtures, family, dtype):
    """`FastSampler.encode_text` (the Synthesizer's path) takes the fused tower, v4.1-MF's backbone
    or v2's scratch encoder: the states equal the model's eager `encode_text` (projector and norm
    included) up to rounding, the padding zero."""
    if family == "v2":
        model, io, _ = load_scratch_kind(dit_fixtures, "v2_base")
        (ids, mask), kind = _with_an_empty_row(io), FastTextEncoder
    elif family == "v4-large":
        model = load_checkpoint(V4_LARGE / "tiny_v4_large.safetensors").model
        io = load_file(V4_LARGE / "tiny_v4_large_io.safetensors")
        (ids, mask), kind = _with_an_empty_row(io), FastT5Gemma
    else:
        model, io, _, _ = load_kind("v4_1_mf")
        ids, mask, kind = io["text_input_ids"].to(DEV), io["text_mask"].to(DEV), FastModernBert
    model = model.to(DEV, dtype)
    fast = FastDiT(model, fused=True)
    assert isinstance(fast.text_backbone, kind)
    calls = _watched(fast.text_backbone)
    with torch.inference_mode():
        got, _ = FastSampler(fast, use_graphs=False).encode_text(ids, mask)
        want = model.encode_text(ids, mask)
    assert calls and fast.text_backbone.on
    torch.testing.assert_close(
        got.float(), want.float(), **(TOL[dtype] if dtype != torch.float32 else dict(atol=1e-4, rtol=1e-4))
    )
    assert not got[~mask].any()
    assert fast_text_backbone(torch.nn.Linear(2, 2)) is None  # no text tower: the model's own path
