"""The channels-last decoder (engine/codec/fast.py) against the (B, C, T) decoder it replaces.

On the CPU its epilogues are the torch path (the real fall-back where Triton does not run); the
Triton epilogue kernel itself is held to that path in test_fused.py (natively on a GPU, in the
interpreter here). The GPU tests at the end run on the H200 (benchmarks/gpu_run.sh).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from codec_windows import eager_graph_windows

from irodori_speaker.engine.codec import (
    DACVAE,
    TINY_CODEC_KWARGS,
    codec_from_state_dict,
    random_codec_state_dict,
)
from irodori_speaker.engine.codec.fast import supports_channels_last

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


def _codec(device: str = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0) -> DACVAE:
    state = random_codec_state_dict(TINY_CODEC_KWARGS, seed=seed, watermark=False)
    return codec_from_state_dict(state, TINY_CODEC_KWARGS, device=device, dtype=dtype)


def _latent(frames: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, frames, 32, generator=torch.Generator().manual_seed(seed))


def test_channels_last_decode_equals_the_decoder() -> None:
    codec = _codec()
    lat = _latent(23)
    want = codec.decode(lat)
    assert codec.use_channels_last() and codec.channels_last
    got = codec.decode(lat)
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)  # fp32: only the summation order differs
    codec.use_channels_last(False)
    assert not codec.channels_last  # the weights keep their values (in the NHWC strides)
    torch.testing.assert_close(codec.decode(lat), want, rtol=0, atol=2e-6)


def test_channels_last_decode_matches_the_reference_golden_output(codec_fixtures) -> None:
    import gzip
    import io

    from safetensors.torch import load_file

    with gzip.open(codec_fixtures / "tiny_dacvae_weights.pth.gz", "rb") as f:
        ckpt = torch.load(io.BytesIO(f.read()), map_location="cpu", weights_only=True)
    codec = codec_from_state_dict(ckpt["state_dict"], ckpt["metadata"]["kwargs"])
    golden = load_file(codec_fixtures / "tiny_dacvae_io.safetensors")
    assert codec.use_channels_last()
    audio = codec.decode(golden["decode_latent"])
    torch.testing.assert_close(audio, golden["decode_audio"], atol=1e-5, rtol=0)  # test_codec.py's ATOL


def test_channels_last_stream_joins_to_the_one_pass_decode() -> None:
    codec = _codec(seed=1)
    lat = _latent(61, batch=1, seed=2)
    want = codec.decode(lat)
    codec.use_channels_last()
    got = torch.cat(list(codec.decode_stream(lat, 25, first_chunk_frames=8)), -1)
    torch.testing.assert_close(got, want, rtol=0, atol=2e-6)


def test_channels_last_holds_no_second_copy_of_the_weights() -> None:
    codec = _codec()
    before = {n: (p.data_ptr(), p.shape) for n, p in codec.named_parameters()}
    codec.use_channels_last()
    after = {n: (p.data_ptr(), p.shape) for n, p in codec.named_parameters()}
    assert {n: s for n, (_, s) in before.items()} == {n: s for n, (_, s) in after.items()}
    fast = codec._channels_last
    assert fast is not None
    params = {p.data_ptr() for p in codec.parameters()}
    assert all(conv.weight.data_ptr() in params for conv, *_ in fast.steps)  # the module's own storage


def test_channels_last_survives_a_cast_and_refuses_int4_convs() -> None:
    codec = _codec()
    lat = _latent(19)
    codec.use_channels_last()
    codec.to(torch.float64)  # rebuilt on the cast weights
    assert codec.channels_last
    codec.to(torch.float32)
    want = _codec().decode(lat)
    torch.testing.assert_close(codec.decode(lat), want, rtol=0, atol=2e-6)

    from irodori_speaker.engine.quant.codec import quantize_codec

    q = _codec()
    quantize_codec(q)
    assert not supports_channels_last(q.decoder)
    assert q.use_channels_last() is False and not q.channels_last  # int4 layers: the (B, C, T) path


def test_the_preset_field_makes_the_synthesizer_switch_it_on() -> None:
    from irodori_speaker.engine.hardware.presets import base_preset
    from irodori_speaker.synthesis.synthesizer import Synthesizer

    # on in the CUDA preset (measured faster on every news5 line, RESULTS.md) and in the CPU preset
    # (its stateful stream runs on it); off here, so that the Synthesizer is what switches it on
    assert base_preset("cuda").codec_channels_last and base_preset("cpu").codec_channels_last

    class _Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

    codec = _codec()
    assert not codec.channels_last
    Synthesizer(_Model(), codec, tokenizer=None, preset=base_preset("cpu"))  # type: ignore[arg-type]
    assert codec.channels_last


def test_a_fused_unit_that_fails_leaves_only_the_units_unfused(monkeypatch) -> None:
    """A residual unit's kernel that fails (its block wants more shared memory than an older GPU
    has) switches this decoder's units back to their four ops with one warning; the decode is the
    unfused one and the other fused kernels stay on. The GPU is stood in for: Triton's epilogue by
    its torch twin, the unit's kernel by one that raises (the only mocks here)."""
    from irodori_speaker.engine import fused
    from irodori_speaker.engine.codec import fast

    codec = _codec(dtype=torch.bfloat16)
    lat = _latent(5).to(torch.bfloat16)
    codec.use_channels_last()
    want = codec.decode(lat)  # on the CPU: the torch epilogues, units unfused
    d = codec._channels_last
    assert d is not None and not d.fuse_units  # fused only on CUDA by default
    d.fuse_units = True
    assert d.fuse_units and d._packs

    def no_room(*args, **kwargs):
        raise RuntimeError("out of resource: shared memory, Required: 114688, Hardware limit: 65536")

    monkeypatch.setattr(fast, "fused_available", lambda device: True)
    monkeypatch.setattr(fast, "conv_epilogue", fast.epilogue_torch)
    monkeypatch.setattr(fast, "residual_unit", no_room)
    monkeypatch.setattr(fused, "_FAILED", [])
    with pytest.warns(UserWarning, match="fused residual units switched off.*shared memory"):
        got = codec.decode(lat)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert not d.fuse_units and fused._FAILED == []  # the units alone went back
    torch.testing.assert_close(codec.decode(lat), want, rtol=0, atol=0)  # no second warning needed


def test_the_units_fused_are_those_up_to_the_width_of_their_packing(monkeypatch) -> None:
    """Which units fuse follows `kernels.UNIT_THIRDS` as read when fusing is switched on: in thirds
    up to `FUSED_UNIT_WIDTH[True]`, in one chunk up to `[False]` (192 and 96 channels in the tree;
    here 48 and 24, the tiny codec's two widest stages). Packing only: nothing decodes."""
    from irodori_speaker.engine.codec import fast, kernels

    monkeypatch.setattr(fast, "FUSED_UNIT_WIDTH", {False: 24, True: 48})
    codec = _codec(dtype=torch.bfloat16)
    codec.use_channels_last()
    d = codec._channels_last
    assert d is not None
    fused = {}
    for thirds in (False, True, False):
        monkeypatch.setattr(kernels, "UNIT_THIRDS", thirds)
        d.fuse_units = True
        assert d._packs is not None
        fused[thirds] = sorted(d.steps[i][0].weight.shape[0] for i in d._packs)
    assert set(fused[False]) == {6, 12, 24} and set(fused[True]) == {6, 12, 24, 48}


# --------------------------------------------------------------------------- on a GPU


def _exact_cudnn() -> contextlib.AbstractContextManager:
    return torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True, allow_tf32=False)


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_channels_last_on_cuda_equals_the_decoder(dtype: torch.dtype) -> None:
    codec = _codec("cuda", dtype)
    lats = [_latent(n, seed=n).cuda() for n in (41, 16, 66)]
    with _exact_cudnn(), torch.inference_mode():
        want = [codec.decode(lat) for lat in lats]
        codec.use_channels_last()
        got = [codec.decode(lat) for lat in lats]
    # fp16: the bias / residual sums feed the Snake unrounded here, rounded in the decoder
    tol = 2e-5 if dtype == torch.float32 else 4e-3
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=tol)


@needs_gpu
def test_the_decoder_fuses_its_narrow_units_on_hopper_only() -> None:
    """Measured faster on an H100 only, so fused from compute capability 9 (H100, H200) and left
    as four ops on older cards; the units fused are those up to FUSED_UNIT_WIDTH's channels."""
    from irodori_speaker.engine.codec import kernels
    from irodori_speaker.engine.codec.fast import FUSED_UNIT_WIDTH

    codec = _codec("cuda", torch.float16)
    codec.use_channels_last()
    d = codec._channels_last
    assert d is not None
    assert d.fuse_units == (torch.cuda.get_device_capability()[0] >= 9)
    d.fuse_units = True
    widest = FUSED_UNIT_WIDTH[kernels.UNIT_THIRDS]
    assert d._packs and all(d.steps[i][0].weight.shape[0] <= widest for i in d._packs)
    units = [i for i, (conv, *_) in enumerate(d.steps) if not conv.transposed and conv.kernel > 1]
    assert sorted(d._packs) == units  # the tiny codec's stages are all narrow: every unit


@needs_gpu
def test_channels_last_graphs_replay_the_eager_channels_last_decode_exactly() -> None:
    from irodori_speaker.engine.codec import stream_window_lengths

    codec = _codec("cuda", torch.float16)
    codec.use_channels_last()
    lines = [_latent(n, seed=n).cuda() for n in (40, 57)]
    with _exact_cudnn(), torch.inference_mode():
        want = [torch.cat(eager_graph_windows(codec, lat, 25, 8), -1) for lat in lines]
        codec.use_graphs(max_graphs=3)
        codec.prewarm_graphs(stream_window_lengths(25, first_chunk_frames=8), batch=2)
        got = [torch.cat(list(codec.decode_stream(lat, 25, first_chunk_frames=8)), -1) for lat in lines]
    assert codec.channels_last and codec._graphs is not None and codec._graphs.captures >= 2
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize(("padding", "dilation"), [(3, 1), (9, 3), (0, 1)])
def test_a_conv_run_as_one_gemm_equals_the_conv(padding: int, dilation: int) -> None:
    from irodori_speaker.engine.codec.fast import _Conv

    torch.manual_seed(0)
    conv = torch.nn.Conv1d(16, 24, 7, padding=padding, dilation=dilation)
    x = torch.randn(2, 40, 16)  # (B, T, C)
    want = torch.nn.functional.conv1d(x.transpose(1, 2), conv.weight, None, 1, padding, dilation)
    want = want.transpose(1, 2)
    gemm = _Conv.of(conv, as_gemm=True)
    assert gemm.as_gemm
    got = gemm(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(_Conv.of(conv)(x), want, rtol=1e-5, atol=1e-5)


def test_as_gemm_is_refused_where_it_does_not_apply() -> None:
    from irodori_speaker.engine.codec.fast import _Conv

    strided = torch.nn.Conv1d(4, 4, 4, stride=2)
    upsampling = torch.nn.ConvTranspose1d(4, 4, 4, stride=2)
    one_tap = torch.nn.Conv1d(4, 4, 1)
    assert not _Conv.of(strided, as_gemm=True).as_gemm
    assert not _Conv.of(upsampling, as_gemm=True).as_gemm
    assert not _Conv.of(one_tap, as_gemm=True).as_gemm


def test_only_the_convs_cudnn_runs_slowly_in_nhwc_become_gemms() -> None:
    from irodori_speaker.engine.codec.fast import _cudnn_slow

    assert _cudnn_slow(torch.nn.Conv1d(384, 384, 7, dilation=9, padding=27))
    assert not _cudnn_slow(torch.nn.Conv1d(384, 384, 7, dilation=3, padding=9))
    assert not _cudnn_slow(torch.nn.Conv1d(768, 768, 7, dilation=9, padding=27))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the rule is cuDNN's: needs an NVIDIA GPU")
def test_the_full_size_decoder_runs_its_slow_cudnn_conv_as_a_gemm_on_cuda() -> None:
    from irodori_speaker.engine.codec import FULL_CODEC_KWARGS, codec_from_state_dict, random_codec_state_dict

    state = random_codec_state_dict(FULL_CODEC_KWARGS, seed=0, watermark=False)
    codec = codec_from_state_dict(state, FULL_CODEC_KWARGS, device="cuda", dtype=torch.float16)
    assert codec.use_channels_last(True)
    cl = codec._channels_last
    gemms = [(c.weight.shape[1], c.dilation) for c, *_ in cl.steps if c.as_gemm]
    assert gemms == [(384, 9)]
    z = torch.randn(1, 37, 32, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        got = codec.decode(z).float()
        codec.use_channels_last(False)
        want = codec.decode(z).float()
    assert (got - want).abs().max() < 5e-3


@pytest.mark.parametrize(("dilation", "frames", "phases"), [(3, 90, 3), (9, 99, 9), (9, 96, 3), (9, 100, 1)])
def test_a_dilated_conv_in_phases_equals_the_conv(dilation: int, frames: int, phases: int) -> None:
    """Samples (T / P, P) as an NHWC image: dilation d along T is d / P along its height; P is the
    dilation where it divides T, else 3 (the decoder's 9 at a length not a multiple of 9), else none."""
    from irodori_speaker.engine.codec.fast import _Conv

    torch.manual_seed(0)
    conv = torch.nn.Conv1d(16, 24, 7, padding=3 * dilation, dilation=dilation)
    x = torch.randn(2, frames, 16)  # (B, T, C)
    want = torch.nn.functional.conv1d(x.transpose(1, 2), conv.weight, None, 1, 3 * dilation, dilation)
    fast = _Conv.of(conv)
    assert fast.phases(frames) == phases
    if phases > 1:
        got = fast.phase_conv(x, phases)
        assert got.shape == want.transpose(1, 2).shape
        torch.testing.assert_close(got, want.transpose(1, 2), rtol=1e-5, atol=1e-5)


def test_only_dilated_stride_one_convs_run_in_phases() -> None:
    from irodori_speaker.engine.codec.fast import _Conv

    assert _Conv.of(torch.nn.Conv1d(4, 4, 7, padding=3)).phases(90) == 1  # dilation 1
    assert _Conv.of(torch.nn.ConvTranspose1d(4, 4, 4, stride=2, padding=1)).phases(90) == 1
    assert _Conv.of(torch.nn.Conv1d(4, 4, 7, padding=9, dilation=3)).phases(91) == 1  # 91 = 7 x 13
