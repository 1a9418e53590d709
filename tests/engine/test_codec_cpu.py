"""The codec's CPU path (engine/codec/cpu.py) and Snake in bf16 on the CPU: same decode, within rounding."""

from __future__ import annotations

import copy

import pytest
import torch

from irodori_speaker.engine.codec import (
    TINY_CODEC_KWARGS,
    Decoder,
    Snake,
    codec_from_state_dict,
    random_codec_state_dict,
)
from irodori_speaker.engine.codec.cpu import CpuDecoder, cpu_decoder_supported, use_cpu_decoder


def _codec(dtype: torch.dtype = torch.float32):
    state = random_codec_state_dict(TINY_CODEC_KWARGS, seed=0, watermark=False)
    return codec_from_state_dict(state, TINY_CODEC_KWARGS, dtype=dtype)


def _latent(frames: int, batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, frames, 32, generator=torch.Generator().manual_seed(seed))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(scope="module")
def eager():
    return _codec()


def test_bf16_cpu_decoder_decodes_as_the_eager_bf16_decoder():
    bf16 = _codec(torch.bfloat16)
    fast = copy.deepcopy(bf16)
    assert use_cpu_decoder(fast) and type(fast.decoder) is CpuDecoder
    lat = _latent(20)
    want = bf16.decode(lat)
    # the same sums in another order: measured 1.6e-3 relative L2 between the two bf16 decoders
    assert _rel(fast.decode(lat), want) < 1e-2
    whole = fast.decode(lat)
    torch.testing.assert_close(fast.decode_chunked(lat, 5), whole, atol=1e-6, rtol=0)
    streamed = torch.cat(list(fast.decode_stream(lat, 7, first_chunk_frames=3)), dim=-1)
    torch.testing.assert_close(streamed, whole, atol=1e-6, rtol=0)


def test_fp32_input_takes_the_inherited_forward(eager):
    fast = copy.deepcopy(eager)
    assert use_cpu_decoder(fast)
    lat = _latent(6)
    torch.testing.assert_close(fast.decode(lat), eager.decode(lat), atol=0, rtol=0)


def test_bf16_cpu_decoder_is_within_bf16_rounding(eager):
    lat = _latent(20)
    want = eager.decode(lat)
    bf16 = _codec(torch.bfloat16)
    plain = _rel(bf16.decode(lat), want)
    assert use_cpu_decoder(bf16)
    fast = _rel(bf16.decode(lat), want)
    # measured on this tiny codec: eager bf16 1.2e-2, channels-last bf16 1.2e-2 (relative L2)
    assert plain < 3e-2 and fast < 3e-2


def test_switch_keeps_the_modules_and_goes_back(eager):
    fast = copy.deepcopy(eager)
    keys = list(fast.state_dict())
    use_cpu_decoder(fast)
    assert isinstance(fast.decoder, Decoder) and list(fast.state_dict()) == keys
    fast.to(torch.bfloat16)  # still one set of weights: a cast reaches the path too
    assert fast.decoder.model[0].weight.dtype == torch.bfloat16
    assert not use_cpu_decoder(fast, False) and type(fast.decoder) is Decoder


def test_int4_codec_stays_on_its_own_path(eager):
    from irodori_speaker.quant.codec import quantize_codec

    int4 = copy.deepcopy(eager)
    quantize_codec(int4)
    assert not cpu_decoder_supported(int4.decoder)
    assert not use_cpu_decoder(int4) and type(int4.decoder) is Decoder


def test_with_grad_the_inherited_forward_runs(eager):
    fast = copy.deepcopy(eager)
    use_cpu_decoder(fast)
    x = torch.randn(1, TINY_CODEC_KWARGS["latent_dim"], 4)
    with torch.enable_grad():
        y = fast.decoder(x)
    torch.testing.assert_close(y, eager.decoder(x), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("layout", ["ncw", "channels_last"])
def test_snake_bf16_on_the_cpu_in_bf16(layout):
    torch.manual_seed(0)
    snake = Snake(6)
    alpha = torch.tensor([2e-5, 0.1, 0.5, 1.0, 3.0, 12.0]).view(1, 6, 1)  # 1/alpha up to 5e4 (real weights)
    with torch.no_grad():
        snake.alpha.copy_(alpha)
    snake.to(torch.bfloat16)
    assert snake.alpha.dtype == torch.float32  # alpha stays fp32 in the module
    x = torch.linspace(-4, 4, 200).repeat(2, 6, 1)
    xin = (
        x.bfloat16()
        if layout == "ncw"
        else x.bfloat16().unsqueeze(2).contiguous(memory_format=torch.channels_last)
    )
    with torch.inference_mode():
        y = snake(xin) if layout == "ncw" else snake._eager(xin).squeeze(2)
    a, xd = alpha.double(), x.bfloat16().double()
    want = xd + torch.sin(a * xd) ** 2 / (a + 1e-9)
    assert y.dtype == torch.bfloat16
    # bf16 input, bf16 ops: a few bf16 roundings (2^-8 relative each); measured 2.0e-3 relative L2
    torch.testing.assert_close(y.double(), want, atol=3e-2, rtol=2e-2)
    assert _rel(y, want) < 6e-3
