"""The codec in bf16 on the CPU: the channels-last decoder and Snake in bf16, within bf16 rounding."""

from __future__ import annotations

import copy

import pytest
import torch

from irodori_speaker.engine.codec import (
    TINY_CODEC_KWARGS,
    Snake,
    codec_from_state_dict,
    random_codec_state_dict,
)


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


def test_bf16_channels_last_decodes_as_the_eager_bf16_decoder():
    bf16 = _codec(torch.bfloat16)
    fast = copy.deepcopy(bf16)
    assert fast.use_channels_last()
    lat = _latent(20)
    want = bf16.decode(lat)
    # the same sums, rounded at other places (each bf16 decoder is ~1.2e-2 relative L2 from fp32):
    # measured 1.2e-2 between the two
    assert _rel(fast.decode(lat), want) < 3e-2
    whole = fast.decode(lat)
    # chunked and streamed on the CPU come from the stateful stream (engine/codec/stateful.py):
    # the same sums from convs of other lengths, so bf16 rounds a few of them the other way
    # (measured 1.1e-4 relative L2, 100x below bf16's own 1.2e-2 against fp32)
    assert fast.streams_statefully()
    assert _rel(fast.decode_chunked(lat, 5), whole) < 1e-3
    streamed = torch.cat(list(fast.decode_stream(lat, 7, first_chunk_frames=3)), dim=-1)
    assert streamed.shape == whole.shape and _rel(streamed, whole) < 1e-3


def test_bf16_channels_last_is_within_bf16_rounding(eager):
    lat = _latent(20)
    want = eager.decode(lat)
    bf16 = _codec(torch.bfloat16)
    plain = _rel(bf16.decode(lat), want)
    assert bf16.use_channels_last()
    fast = _rel(bf16.decode(lat), want)
    # measured on this tiny codec: eager bf16 1.2e-2, channels-last bf16 ~1.3e-2 (relative L2)
    assert plain < 3e-2 and fast < 3e-2


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
