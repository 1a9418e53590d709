"""The stateful stream (engine/codec/stateful.py): each conv carries its left context, every frame
is decoded once, and the chunks join to the one-pass decode; the codec and the synthesizer take it
where the channels-last decoder runs eagerly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from irodori_speaker.cancel import Cancelled, CancelToken
from irodori_speaker.engine.codec import TINY_CODEC_KWARGS, codec_from_state_dict, random_codec_state_dict
from irodori_speaker.engine.codec.fast import ChannelsLastDecoder
from irodori_speaker.engine.codec.stateful import LineStream, StatefulDecode

ATOL = 2e-6  # fp32: the convs' summation order only


def _codec(dtype: torch.dtype = torch.float32, channels_last: bool = True):
    state = random_codec_state_dict(TINY_CODEC_KWARGS, seed=1, watermark=False)
    codec = codec_from_state_dict(state, TINY_CODEC_KWARGS, device="cpu", dtype=dtype)
    assert codec.use_channels_last(channels_last) == channels_last
    return codec


def _latent(frames: int, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, frames, 32, generator=torch.Generator().manual_seed(frames))


def _stream(codec, rows: int) -> StatefulDecode:
    assert codec._channels_last is not None
    return StatefulDecode(codec._channels_last, rows, codec.dtype, codec.device)


@pytest.mark.parametrize(
    ("frames", "pushes"),
    [
        (23, [5, 7, 11]),
        (61, [16, 25, 20]),
        (9, [1] * 9),  # one frame a push: no audio until the receptive field is in
        (30, [30]),  # everything in `finish`
        (17, [0, 3, 0, 14]),  # pushes of no frames
        (40, [16, 24, None]),  # `finish` with no frames
        (2, [1, 1]),  # shorter than the receptive field
    ],
)
def test_pushes_join_to_the_one_pass_decode(frames: int, pushes: list[int | None]) -> None:
    codec = _codec()
    lat = _latent(frames)
    want = codec.decode(lat)
    stream = _stream(codec, 2)
    z = lat.to(codec.dtype)
    out, pos = [], 0
    with torch.no_grad():
        for i, n in enumerate(pushes):
            last = i == len(pushes) - 1
            piece = None if n is None else z[:, pos : pos + n]
            pos += n or 0
            out.append(stream.finish(piece) if last else stream.push(piece))
    got = torch.cat(out, -1)
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    with pytest.raises(RuntimeError, match="finished"):
        stream.push(z[:, :1])


def test_audio_lags_the_latent_by_the_receptive_field_only() -> None:
    """After n frames (n > 8), the samples of frames < n - 8 are out: a chunk needs its frames and 8."""
    codec = _codec()
    z = _latent(40).to(codec.dtype)
    stream, got = _stream(codec, 2), 0
    with torch.no_grad():
        for n in range(1, 41):
            got += stream.push(z[:, n - 1 : n]).shape[-1]
            assert got >= (n - 8) * codec.hop_length
            assert got <= max(0, n - 7) * codec.hop_length  # not more: the rest needs frames not in yet


class _Counting:
    """A conv that counts the outputs it computes (a spy around the real one)."""

    def __init__(self, conv) -> None:
        self.conv, self.outputs, self.calls = conv, 0, 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        self.outputs, self.calls = self.outputs + y.shape[1], self.calls + 1
        return y


def test_every_conv_computes_each_of_its_outputs_once() -> None:
    """The point of the stream: over all pushes every conv computes the one-pass decode's outputs,
    each once (a window decodes 8 frames of context a side again)."""
    codec = _codec()
    frames = 57
    stream = _stream(codec, 1)
    carried = [stream.first, *stream.convs]
    spies = []
    for c in carried:
        spies.append(_Counting(c.conv))
        c.conv = spies[-1]  # type: ignore[assignment]
    z = _latent(frames, batch=1).to(codec.dtype)
    with torch.no_grad():
        for lo in range(0, 48, 16):
            stream.push(z[:, lo : lo + 16])
        stream.finish(z[:, 48:])
    length = frames  # the one-pass decode's outputs of each conv, at its rate
    for c, spy in zip(carried, spies, strict=True):
        if not c.transposed:
            assert spy.outputs == length, (spy.outputs, length)
            continue
        # a transposed conv (kernel 2 x stride) also runs its kept input and gives the stride's
        # worth of outputs a side that are not final yet, per call: 2 x stride, plus one stride
        # for the zero input that ends the line
        length *= c.stride
        assert spy.outputs == length + c.stride * (2 * spy.calls + 1), (spy.outputs, length, spy.calls)


def test_chunks_asked_for_out_of_order_are_the_same_samples() -> None:
    codec = _codec()
    lat = _latent(61)
    want = codec.decode(lat)
    hop = codec.hop_length
    stream = LineStream(codec._channels_last, lat.to(codec.dtype), hop)  # type: ignore[arg-type]
    with torch.no_grad():
        second = stream.samples(8 * hop, 33 * hop)  # a job queue ran the second chunk first
        first = stream.samples(0, 8 * hop)
        third = stream.samples(33 * hop, 61 * hop)
    torch.testing.assert_close(torch.cat([first, second, third], -1), want, atol=ATOL, rtol=0)
    with pytest.raises(ValueError, match="not left"):
        stream.samples(0, hop)  # handed out in order up to there: gone


def test_the_codec_streams_statefully_where_channels_last_runs_eagerly(monkeypatch) -> None:
    """`decode_stream` and `decode_chunked` keep their chunks and audio; no window is decoded."""
    codec = _codec()
    assert codec.streams_statefully()
    assert not _codec(channels_last=False).streams_statefully()  # the (B, C, T) decoder: windows
    lat = _latent(61)
    want = codec.decode(lat)
    windows: list[int] = []
    real = ChannelsLastDecoder.__call__
    spy = lambda s, z, keep=None: windows.append(z.shape[1]) or real(s, z, keep)  # noqa: E731
    monkeypatch.setattr(ChannelsLastDecoder, "__call__", spy)
    chunks = list(codec.decode_stream(lat, 25, first_chunk_frames=8))
    assert [c.shape[-1] // codec.hop_length for c in chunks] == [8, 25, 25, 3]
    torch.testing.assert_close(torch.cat(chunks, -1), want, atol=ATOL, rtol=0)
    torch.testing.assert_close(codec.decode_chunked(lat, 20), want, atol=ATOL, rtol=0)
    assert windows == []
    # another context than the receptive field is a window decode, as asked
    list(codec.decode_stream(lat, 25, context_frames=4))
    assert windows


def test_a_cancelled_stream_stops_before_the_next_chunk() -> None:
    codec = _codec()
    cancel = CancelToken()
    chunks = codec.decode_stream(_latent(61), 25, first_chunk_frames=8, cancel=cancel)
    next(chunks)
    cancel.cancel()
    with pytest.raises(Cancelled):
        next(chunks)


def test_in_bf16_the_stream_is_as_accurate_as_the_one_pass_decode() -> None:
    ref = _codec(channels_last=False)
    codec = _codec(torch.bfloat16)
    lat = _latent(118, batch=1)
    want = ref.decode(lat)

    def snr(x: torch.Tensor) -> float:
        return float(10 * torch.log10(want.pow(2).mean() / (x - want).pow(2).mean()))

    one = snr(codec.decode(lat))
    streamed = snr(torch.cat(list(codec.decode_stream(lat, 50, first_chunk_frames=8, growth=3.0)), -1))
    assert one > 30 and abs(streamed - one) < 0.5, (streamed, one)


@pytest.mark.parametrize("stateful", [True, False])
def test_the_synthesizer_streams_the_same_chunks_either_way(irodori_home, stateful: bool) -> None:
    """`preset.stream_stateful` with the channels-last codec on the CPU: the chunks of a streamed
    and of a whole line are the windows' chunks, the audio theirs; no window decoded when on."""
    from irodori_speaker.options import SynthesisOptions
    from irodori_speaker.synthesis.loading import load_synthesizer

    def run(on: bool) -> tuple[list[np.ndarray], np.ndarray, list[int]]:
        synth = load_synthesizer(
            tiny_random=True, backend="cpu", voice_cache_dir=False, codec_channels_last=True,
            stream_stateful=on,
        )  # fmt: skip
        assert synth.codec.channels_last
        windows: list[int] = []
        real = synth.codec._decode_window
        synth.codec._decode_window = lambda z, a, b, dtype=None: (
            windows.append(z.shape[-1]) or real(z, a, b, dtype)
        )
        opts = SynthesisOptions(seed=3, steps=2, seconds=3.1, tail_trim=False)
        chunks = list(synth.stream("こんにちは、今日は", options=opts))
        whole = synth.synthesize("こんにちは、今日は", options=opts).audio
        return chunks, whole, windows

    chunks, whole, windows = run(stateful)
    want_chunks, want_whole, want_windows = run(False) if stateful else (chunks, whole, windows)
    assert [len(c) for c in chunks] == [len(c) for c in want_chunks] and len(chunks) > 2
    np.testing.assert_allclose(np.concatenate(chunks), np.concatenate(want_chunks), atol=1e-5)
    np.testing.assert_allclose(whole, want_whole, atol=1e-5)
    np.testing.assert_allclose(np.concatenate(chunks), whole, atol=1e-5)
    assert (windows == []) == stateful and want_windows


def test_a_line_cancelled_mid_stream_stops_within_one_chunk_and_frees_the_lock(irodori_home) -> None:
    """As tests/speaker/test_decode_cancel.py: a whole line decoded from the stateful stream (in a
    streamed line's chunks, 8 then 25 frames), cancelled after its first chunk, stops there; the
    next line plays."""
    import asyncio
    import threading

    from irodori_speaker.engine.hardware.lock import MODEL_LOCK
    from irodori_speaker.options import SynthesisOptions
    from irodori_speaker.outputs import NullOutput
    from irodori_speaker.speaker import Speaker, UtteranceState
    from irodori_speaker.synthesis.loading import load_synthesizer

    synth = load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False, codec_channels_last=True)
    assert synth.codec.streams_statefully() and synth.preset.decode_chunk_frames == 25
    chunks: list[int] = []  # the latent frames pushed when each chunk was handed out
    hooks: list = []
    real = LineStream.samples

    def samples(self, a: int, b: int) -> torch.Tensor:
        out = real(self, a, b)
        chunks.append(self.pushed)
        for hook in hooks:
            hook(len(chunks))
        return out

    long = SynthesisOptions(steps=2, seconds=8.0, seed=3, tail_trim=False)  # 200 frames: 8 chunks

    async def body():
        loop = asyncio.get_running_loop()
        async with Speaker(synth, output=NullOutput(), streaming=False, options=long) as s:
            chunks.clear()  # the prewarm line's
            h = s.enqueue("止めるまで長く話し続ける台詞です。")
            cancelled = threading.Event()

            def cancel_after_first_chunk(n: int) -> None:
                if n == 1:  # on the device owner's side: cancel from the event loop
                    loop.call_soon_threadsafe(lambda: (h.cancel(), cancelled.set()))
                    assert cancelled.wait(10)

            hooks.append(cancel_after_first_chunk)
            await h.wait()

            def take_the_lock() -> list[int]:
                assert MODEL_LOCK.acquire(timeout=60)
                try:
                    return list(chunks)
                finally:
                    MODEL_LOCK.release()

            decoded = await loop.run_in_executor(None, take_the_lock)
            hooks.clear()
            nxt = await s.say("次の台詞", options=SynthesisOptions(steps=2, seconds=0.4, seed=1))
            return h.state, decoded, nxt.state

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LineStream, "samples", samples)
        state, decoded, next_state = asyncio.run(asyncio.wait_for(body(), 100))
    assert state == UtteranceState.CANCELLED
    # one chunk: its 8 frames and 8 of right context pushed, far from the line's 200
    assert decoded == [8 + 8], decoded
    assert next_state == UtteranceState.PLAYED
