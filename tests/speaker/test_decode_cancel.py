"""Issue 12: with `streaming=False` (a whole line decoded at once, as the CPU preset does) a line
cancelled during its decode stops within one decode chunk and frees the model lock; the old
one-pass decode ran to the end holding it (1.6-2.1 s on a CPU) while the next reply waited.
The CPU preset decodes on the stateful stream in a streamed line's chunks (8, then 25 frames)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from irodori_speaker.engine.hardware.lock import MODEL_LOCK
from irodori_speaker.options import SynthesisOptions
from irodori_speaker.outputs import NullOutput
from irodori_speaker.speaker import Speaker, UtteranceState

pytestmark = pytest.mark.timeout(120)

LONG = SynthesisOptions(steps=2, seconds=8.0, seed=3, tail_trim=False)  # 200 latent frames


@pytest.fixture
def counted_decode(synth, monkeypatch):
    """Count the latent frames every codec window decodes (on the CPU preset's stateful stream:
    the frames of each chunk asked of it); the hooks run after each one."""
    from irodori_speaker.engine.codec.stateful import LineStream

    codec = synth.codec
    seen: list[int] = []
    hooks: list = []

    def counted(frames: int) -> None:
        seen.append(frames)
        for hook in hooks:
            hook(len(seen))

    def window(z, a, b, dtype=None):
        out = type(codec)._decode_window(codec, z, a, b, dtype)
        counted(int(z.shape[-1]))
        return out

    samples = LineStream.samples

    def chunk(stream, a, b):
        out = samples(stream, a, b)
        counted((b - a) // codec.hop_length)
        return out

    monkeypatch.setattr(codec, "_decode_window", window)  # the instance attribute shadows the method
    monkeypatch.setattr(LineStream, "samples", chunk)
    yield seen, hooks


def test_the_cpu_preset_decodes_a_whole_line_in_bounded_chunks(synth):
    # on the (B, C, T) windows in 25-frame chunks; on the stateful stream in a streamed line's
    assert synth.preset.name == "cpu" and synth.preset.decode_chunk_frames == 25
    assert synth.preset.stream_stateful and synth.codec.streams_statefully()


def test_a_line_cancelled_mid_decode_stops_within_one_chunk_and_frees_the_lock(run, synth, counted_decode):
    seen, hooks = counted_decode
    total = round(LONG.seconds * 25)

    async def body():
        loop = asyncio.get_running_loop()
        async with Speaker(synth, output=NullOutput(), streaming=False, options=LONG) as s:
            seen.clear()  # prewarm decoded too
            h = s.enqueue("止めるまで長く話し続ける台詞です。")
            cancelled = threading.Event()

            def cancel_after_first_window(n: int) -> None:
                if n == 1:  # in the worker, with the model lock held: cancel from the event loop
                    loop.call_soon_threadsafe(lambda: (h.cancel(), cancelled.set()))
                    assert cancelled.wait(10)

            hooks.append(cancel_after_first_window)
            await h.wait()

            def take_the_lock() -> list[int]:  # what the next line would do: wait for the lock
                assert MODEL_LOCK.acquire(timeout=60)
                try:
                    return list(seen)  # what the cancelled line had decoded when it let go
                finally:
                    MODEL_LOCK.release()

            decoded = await loop.run_in_executor(None, take_the_lock)
            hooks.clear()
            seen.clear()
            nxt = await s.say("次の台詞", options=SynthesisOptions(steps=2, seconds=0.4, seed=1))
            return h.state, decoded, nxt.state

    state, decoded, next_state = run(body(), timeout=100)
    assert state == UtteranceState.CANCELLED
    # one chunk decoded (the stream's first, 8 frames), then the cancel was seen: far from the
    # 200 frames a one-pass decode goes through
    assert decoded == [8] and total > 8 + 8, decoded
    assert next_state == UtteranceState.PLAYED


def test_a_whole_line_decoded_in_chunks_equals_the_streamed_line(synth, counted_decode):
    seen, _ = counted_decode
    opts = SynthesisOptions(steps=2, seconds=3.0, seed=7, tail_trim=False)
    whole = synth.synthesize("分けても同じ音です。", options=opts).audio
    assert seen == [8, 25, 25, 17]  # 75 frames in a streamed line's chunks
    import numpy as np

    streamed = np.concatenate(list(synth.stream("分けても同じ音です。", options=opts)))
    assert seen == [8, 25, 25, 17] * 2
    np.testing.assert_array_equal(whole, streamed)  # the same chunks: the same samples
