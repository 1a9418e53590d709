"""A streamed line's first window goes to the device before its tail-trim frame has landed
(`Preset.stream_first_before_trim`, synthesis/decoding.py), and the audio is the same.

The real tiny model and codec on the CPU, on windows (as on a GPU; the CPU preset's stateful
stream is left out). On the CPU every copy lands at once, so a trim frame still on its way (as on
CUDA, where the owner queues the copy without waiting) is a `HostCopy` whose landing the test
sets by hand: the one stand-in here.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch

from irodori_speaker.engine.codec.streaming import RECEPTIVE_FIELD_FRAMES
from irodori_speaker.engine.hardware.owner import HostCopy
from irodori_speaker.synthesis.decoding import Rendered, decode_chunks
from test_batching import opts
from test_decode_batch import _spy_batches


@pytest.fixture(scope="module")
def synth(irodori_home):
    from irodori_speaker.synthesis.loading import load_synthesizer

    return load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False, stream_stateful=False)


def _decode(synth, latent, frames: int, end: int, early: bool, trim: HostCopy | None = None, plan=()):
    preset = dataclasses.replace(synth.preset, stream_first_before_trim=early, stream_window_plan=plan)
    hop = synth.codec.hop_length
    trim = trim or HostCopy(torch.tensor(end))
    rendered = Rendered(latent, frames, frames * hop - 7, trim)
    with torch.inference_mode():
        chunks = list(decode_chunks(synth.codec, preset, rendered, opts(), None, False))
    return chunks, rendered


@pytest.mark.parametrize("plan", [(), (40, 66, 116)], ids=["chunks", "plan"])
@pytest.mark.parametrize("end", [0, 3, 9, 40, 61, 90, 120])
def test_the_first_window_before_the_trim_gives_the_same_audio(synth, end, plan):
    """Trims far past the first window, inside it (decoded again), none (0, or at the end); the
    CPU preset's windows and the CUDA preset's window plan."""
    frames = 120
    first = synth.preset.stream_first_chunk_frames
    assert first is not None and first < 40  # the trims above fall inside and outside it
    latent = torch.randn(1, frames, synth.config.latent_dim, generator=torch.Generator().manual_seed(end))
    want, settled = _decode(synth, latent, frames, end, early=False, plan=plan)
    sizes = _spy_batches(synth.codec)
    try:
        got, early = _decode(synth, latent, frames, end, early=True, plan=plan)
    finally:
        del synth.codec.decode_window_stack
    # the first window is decoded again only where the trim fell inside it
    assert len(sizes) == len(want) + (
        1 if 0 < end < frames and end + 8 < first + RECEPTIVE_FIELD_FRAMES else 0
    )
    assert [last for _, last in got] == [last for _, last in want]
    for (g, _), (w, _) in zip(got, want, strict=True):
        assert np.array_equal(g, w)
    assert (early.decode_frames, early.samples, early.trimmed) == (
        settled.decode_frames,
        settled.samples,
        settled.trimmed,
    )
    assert early.trimmed == (frames - end if 0 < end < frames else 0)
    assert sum(len(c) for c, _ in got) == settled.samples


@pytest.mark.parametrize("early", [True, False])
def test_the_first_window_is_decoded_while_the_trim_is_on_its_way(synth, early):
    """With the knob on, the first window's decode runs before the trim frame lands; off, the
    decode waits for it."""
    frames, end = 120, 90
    latent = torch.randn(1, frames, synth.config.latent_dim, generator=torch.Generator().manual_seed(1))
    trim = HostCopy(torch.tensor(end), event=object())  # still on its way: lands when set below
    sizes = _spy_batches(synth.codec)
    out: list = []
    worker = threading.Thread(target=lambda: out.append(_decode(synth, latent, frames, end, early, trim)))
    try:
        worker.start()
        # the decode runs on this thread's device owner job; give it the time to run if it may
        worker.join(timeout=1.0)
        decoded_before = len(sizes)
        trim._land()  # the copy lands
        worker.join(timeout=60)
    finally:
        trim._land()
        del synth.codec.decode_window_stack  # the spy off: the real method again
    assert not worker.is_alive() and out
    assert (decoded_before >= 1) == early
    chunks, rendered = out[0]
    assert rendered.trimmed == frames - end and sum(len(c) for c, _ in chunks) == rendered.samples


def _stream_both_ways(synth, texts) -> list[tuple[list[np.ndarray], dict]]:
    """Each text streamed with the knob off, then on: (chunks, the record's extra) each."""
    base = synth.preset
    out = []
    try:
        for early in (False, True):
            synth.preset = dataclasses.replace(base, stream_first_before_trim=early)
            for text in texts:
                stream = synth.stream(text, None, opts(tail_trim=True))
                out.append(([c.copy() for c in stream], dict(stream.record.extra)))
    finally:
        synth.preset = base
    return out


def _assert_same(runs, n: int) -> None:
    for (off, off_extra), (on, on_extra) in zip(runs[:n], runs[n:], strict=True):
        assert len(on) == len(off)
        assert all(np.array_equal(a, b) for a, b in zip(on, off, strict=True))
        assert on_extra.get("trimmed_frames") == off_extra.get("trimmed_frames")


def test_a_streamed_line_sounds_the_same_with_the_first_window_before_the_trim(synth):
    """Through the synthesizer (encoders, sampler, the trim frame, windows): every chunk equal,
    the same frames trimmed. (The tiny model's random latents are never quiet, so nothing is cut
    here: the cuts are the decode-level test's above.)"""
    texts = ["こんにちは、今日もよろしくお願いします。", "ありがとう！"]
    _assert_same(_stream_both_ways(synth, texts), len(texts))


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the trim frame's copy is on its way only on CUDA (run on the H200)"
)
def test_on_cuda_a_streamed_line_sounds_the_same_with_the_first_window_before_the_trim(irodori_home):
    """On CUDA the trim frame is still on its way when the first window is launched; graphed
    windows, the CUDA preset's plan."""
    from irodori_speaker.synthesis.loading import load_synthesizer

    cuda = load_synthesizer(tiny_random=True, backend="cuda", voice_cache_dir=False)
    cuda.prewarm()
    texts = ["こんにちは、今日もよろしくお願いします。", "ニュースの時間です。", "ありがとう！"]
    _assert_same(_stream_both_ways(cuda, texts), len(texts))
