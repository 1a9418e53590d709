"""Stream windows of lines that meet on the device owner decode as one batch (synthesis/decoding.py).

The real tiny model and codec on the CPU: lines from several threads (as several Speakers or the
server's streams send them) with `decode_batch` on; every window of a batch sounds as the line
decoded alone. A streamed line's later windows carry the deadline the owner orders them by.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from irodori_speaker.engine.hardware.owner import DECODE, DEVICE
from irodori_speaker.errors import AudioError, InputError
from irodori_speaker.synthesis.decoding import Rendered, decode_chunks
from owner_threads import queue_then_release
from test_batching import TEXTS, opts, together


@pytest.fixture(scope="module")
def synth(irodori_home):
    from irodori_speaker.synthesis.loading import load_synthesizer

    # windows, as on a GPU (where they batch): not the CPU preset's stateful stream, whose chunks
    # are each a job of their own line (the deadlines below are computed alike for both)
    return load_synthesizer(
        tiny_random=True,
        backend="cpu",
        voice_cache_dir=False,
        max_batch=8,
        max_padding=100.0,
        decode_batch=4,
        stream_stateful=False,
    )


def _spy_batches(codec) -> list[int]:
    """The size of every `decode_window_stack` call of the real codec from now on (the decode's
    batches; `del codec.decode_window_stack` puts the class's back)."""
    sizes: list[int] = []
    real = codec.decode_window_stack

    def recorded(windows, dtype=None):
        sizes.append(len(windows))
        return real(windows, dtype)

    codec.decode_window_stack = recorded
    return sizes


def test_a_batch_of_windows_decodes_each_as_alone(synth):
    codec = synth.codec
    gen = torch.Generator().manual_seed(0)
    z = [torch.randn(1, codec.latent_channels, 41, generator=gen) for _ in range(3)]
    cuts = [(0, 41 * codec.hop_length), (8 * codec.hop_length, 33 * codec.hop_length), (5, 900)]
    with torch.inference_mode():
        batch = codec.decode_window_batch([(w, a, b) for w, (a, b) in zip(z, cuts)])
        alone = [codec._decode_window(w, a, b) for w, (a, b) in zip(z, cuts)]
    for got, want in zip(batch, alone):
        assert got.shape == want.shape
        # fp32 on the CPU: a convolution over 3 rows may round differently from one over 1 row
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    with pytest.raises(InputError, match="one length"):
        codec.decode_window_batch([(z[0], 0, 10), (z[1][:, :, :40], 0, 10)])


def test_a_stack_of_windows_is_one_tensor_of_their_pieces_in_the_dtype_asked(synth):
    """`decode_window_stack`: the batch's pieces as the rows of one tensor, each row's span in it;
    `decode_window_batch`'s pieces are those rows' spans; float64 asked is cast once for all."""
    codec = synth.codec
    gen = torch.Generator().manual_seed(1)
    z = [torch.randn(1, codec.latent_channels, 30, generator=gen) for _ in range(3)]
    cuts = [(0, 30 * codec.hop_length), (4 * codec.hop_length, 20 * codec.hop_length), (7, 500)]
    windows = [(w, a, b) for w, (a, b) in zip(z, cuts)]
    with torch.inference_mode():
        rows, spans = codec.decode_window_stack(windows, torch.float64)
        pieces = codec.decode_window_batch(windows)
        one, (span,) = codec.decode_window_stack(windows[1:2])
        alone = codec._decode_window(*windows[1])
    assert rows.dtype == torch.float64 and rows.shape[:2] == (3, 1)
    assert [stop - start for start, stop in spans] == [b - a for a, b in cuts]
    for i, (start, stop) in enumerate(spans):
        assert pieces[i].shape == (1, 1, stop - start) and pieces[i].dtype == codec.dtype
        assert torch.equal(rows[i : i + 1, :, start:stop], pieces[i].double())
        with torch.inference_mode():  # each span holds its own window's samples, as decoded alone
            own = codec._decode_window(*windows[i]).double()
        # fp32 on the CPU: a convolution over 3 rows may round differently from one over 1 row
        torch.testing.assert_close(rows[i : i + 1, :, start:stop], own, atol=1e-5, rtol=1e-4)
    assert span == (0, cuts[1][1] - cuts[1][0]) and torch.equal(one, alone)
    with pytest.raises(InputError, match="no windows"):
        codec.decode_window_stack([])


def test_rows_go_to_the_host_as_one_copy_each_span_its_own_piece():
    """`DEVICE.to_host_rows`: row i's [start, stop) each a HostCopy of its own (off the owner
    thread, as here: landed at once)."""
    rows = torch.arange(12.0).reshape(3, 4)
    copies = DEVICE.to_host_rows(rows, [(0, 4), (1, 3), (2, 2)])
    assert [c.pending for c in copies] == [False] * 3
    assert [c.wait().tolist() for c in copies] == [[0.0, 1.0, 2.0, 3.0], [5.0, 6.0], []]


def _decode_from_threads(synth, rendered: list[Rendered], whole: bool) -> list[np.ndarray]:
    """Each piece decoded from its own thread, their first windows queued on the owner while the
    model lock is held (so they meet there, as under load), then the lock let go."""

    def decode(r: Rendered) -> np.ndarray:
        with torch.inference_mode():
            chunks = decode_chunks(synth.codec, synth.preset, r, opts(), None, whole)
            return np.concatenate([c for c, _ in chunks])

    return queue_then_release(DEVICE, [lambda _, r=r: decode(r) for r in rendered])


@pytest.mark.parametrize("whole", [False, True], ids=["streamed", "whole"])
def test_windows_of_lines_that_meet_decode_as_one_batch_and_sound_as_alone(synth, whole):
    gen = torch.Generator().manual_seed(1)
    hop = synth.codec.hop_length
    rendered = [
        Rendered(torch.randn(1, n, synth.config.latent_dim, generator=gen), n, n * hop - 17)
        for n in (90, 70, 120, 61)
    ]
    with torch.inference_mode():
        alone = [
            np.concatenate([c for c, _ in decode_chunks(synth.codec, synth.preset, r, opts(), None, whole)])
            for r in rendered
        ]
    sizes = _spy_batches(synth.codec)
    try:
        before = DEVICE.batches_run
        met = _decode_from_threads(synth, rendered, whole)
    finally:
        del synth.codec.decode_window_stack  # the class's method again
    assert sizes[0] == 4 and DEVICE.batches_run > before, sizes  # the first windows, one batch
    assert max(sizes) <= 4  # the preset's decode_batch
    for a, b, r in zip(alone, met, rendered):
        assert len(a) == len(b) == r.samples
        np.testing.assert_allclose(b, a, atol=1e-5)


def test_lines_that_meet_sound_as_alone_with_decode_batches_on(synth):
    jobs = [(t, opts(seed=i)) for i, t in enumerate(TEXTS)]
    alone = [synth.synthesize(t, options=o) for t, o in jobs]
    for a, b in zip(alone, together(synth, jobs)):
        assert len(a.audio) == len(b.audio)
        np.testing.assert_allclose(b.audio, a.audio, atol=1e-4)


def test_with_decode_batch_1_no_windows_meet_in_one_call(irodori_home):
    from irodori_speaker.synthesis.loading import load_synthesizer

    synth = load_synthesizer(
        tiny_random=True, backend="cpu", voice_cache_dir=False, decode_batch=1, stream_stateful=False
    )
    sizes = _spy_batches(synth.codec)
    n = 40
    rendered = [Rendered(torch.zeros(1, n, synth.config.latent_dim), n, n * synth.codec.hop_length)] * 3
    _decode_from_threads(synth, rendered, whole=False)
    assert sizes and set(sizes) == {1}


def _decode_jobs(monkeypatch) -> list[tuple[int, float | None]]:
    """(priority, deadline) of every decode window submitted to the owner from now on."""
    seen: list[tuple[int, float | None]] = []
    real = DEVICE.run_batched

    def recorded(key, item, many, cancel=None, priority=1, *, limit=8, deadline=None, take=None, stream=None):
        if key[0] == "decode":
            seen.append((priority, deadline))
            assert take is None  # the CPU's codec has no graphs: a batch is not filled, none cut
            assert stream == DECODE  # on the owner's decode stream where it keeps one
        kw = {"limit": limit, "deadline": deadline, "take": take, "stream": stream}
        return real(key, item, many, cancel, priority, **kw)

    monkeypatch.setattr(DEVICE, "run_batched", recorded)
    return seen


def test_a_streamed_lines_later_windows_carry_the_deadline_of_its_playback(synth, monkeypatch):
    from irodori_speaker.synthesis.decoding import MARGIN_S

    seen = _decode_jobs(monkeypatch)
    sizes, t_first = [], None
    for chunk in synth.stream(TEXTS[0] * 3, options=opts(seed=1)):
        t_first = t_first or time.monotonic()  # the line's first chunk: its playback starts
        sizes.append(len(chunk))
    assert len(sizes) >= 3 and len(seen) == len(sizes)
    (first_priority, first_deadline), *later = seen
    assert first_priority == 0 and first_deadline is None  # URGENT: first audio
    assert all(p == 1 and d is not None for p, d in later), later
    for k, (_, deadline) in enumerate(later, start=1):
        # window k is needed once the audio of the windows before it has played, less the margin
        needed = t_first + sum(sizes[:k]) / synth.sample_rate
        assert t_first - 30 < deadline <= needed - MARGIN_S, (k, deadline - t_first, needed - t_first)


def test_only_a_lines_first_window_is_urgent_and_later_pieces_count_from_its_start(synth, monkeypatch):
    """A line of two pieces (a pause between them): the second piece's first window is needed once
    the first piece and the pause have played, not as first audio."""
    from irodori_speaker.synthesis.decoding import MARGIN_S

    seen = _decode_jobs(monkeypatch)
    t0 = time.monotonic()
    stream = synth.stream(f"{TEXTS[1]}[pause:1.5]{TEXTS[2]}", options=opts(seed=2))
    sizes = [len(c) for c in stream]
    assert stream.record.pieces == 2, stream.record.pieces
    urgent = [d for p, d in seen if p == 0]
    assert urgent == [None]  # the line's first window only
    # the second piece's first window comes after the first piece's windows and the 1.5 s pause
    # (it is needed no sooner than 1.5 s after the line started, less the margin)
    later = [d for p, d in seen if p == 1]
    assert later and max(later) >= t0 + 1.5 - MARGIN_S, (max(later) - t0, sizes)


def test_the_stateful_streams_chunks_carry_the_same_priorities_and_deadlines(synth, monkeypatch):
    """On the CPU preset's stateful stream each chunk is a job of its own (no batch): the first
    URGENT, the later ones NORMAL with their line's playback deadline, as the windows have."""
    import dataclasses

    from irodori_speaker.synthesis.decoding import MARGIN_S, Playback

    assert synth.codec.streams_statefully()
    preset = dataclasses.replace(synth.preset, stream_stateful=True)
    seen: list[tuple[int, float | None]] = []
    real = DEVICE.run

    def recorded(fn, cancel=None, priority=1, deadline=None, *, stream=None):
        assert stream == DECODE  # a stateful stream's chunk is the decode's work too
        seen.append((priority, deadline))
        return real(fn, cancel, priority, deadline, stream=stream)

    monkeypatch.setattr(DEVICE, "run", recorded)
    monkeypatch.setattr(DEVICE, "run_batched", lambda *a, **k: pytest.fail("a window was batched"))
    n = 90
    latent = torch.randn(1, n, synth.config.latent_dim, generator=torch.Generator().manual_seed(3))
    line = Playback()
    with torch.inference_mode():
        chunks = list(
            decode_chunks(synth.codec, preset, Rendered(latent, n, n * 1920), opts(), None, False, line)
        )
    assert [len(c) // 1920 for c, _ in chunks] == [8, 25, 25, 25, 7]
    assert seen[0] == (0, None) and len(seen) == len(chunks)
    handed = 0
    for (priority, deadline), (chunk, _) in zip(seen[1:], chunks):
        handed += len(chunk)
        assert priority == 1 and deadline is not None
        assert deadline <= line.started + handed / synth.sample_rate - MARGIN_S + 1e-6


def test_a_non_finite_latent_is_a_clear_error_and_not_a_device_read(synth):
    latent = torch.zeros(1, 30, synth.config.latent_dim)
    latent[0, 3, 0] = float("nan")
    rendered = Rendered(latent, 30, 30 * synth.codec.hop_length)
    with pytest.raises(AudioError, match="NaN or inf"), torch.inference_mode():
        list(decode_chunks(synth.codec, synth.preset, rendered, opts(), None, whole=True))


def test_lines_streamed_from_threads_all_finish_with_batches_on(synth):
    out: dict[int, int] = {}

    def stream(i: int) -> None:
        out[i] = sum(len(c) for c in synth.stream(TEXTS[i], options=opts(seed=i)))

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(TEXTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(out) == list(range(len(TEXTS))) and all(n > 0 for n in out.values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need an NVIDIA GPU (run on the H200)")
def test_graphed_window_batches_replay_prewarms_graphs_and_equal_each_window_alone(irodori_home):
    from irodori_speaker.synthesis.loading import load_synthesizer

    cuda = load_synthesizer(tiny_random=True, backend="cuda", voice_cache_dir=False, max_batch=8)
    cuda.prewarm()
    codec, n = cuda.codec, cuda._window_lengths()[0]
    # batch graphs from prewarm: the first window's length keeps its right context only
    assert cuda._decode_rows() and codec._graphs.held((4, n, 0, 8)) is not None
    assert codec.fills_batches()  # so decoding cuts a mostly-filler batch (engine.batch.lines_to_take)
    captures = codec._graphs.captures
    gen = torch.Generator().manual_seed(2)
    z = [torch.randn(1, codec.latent_channels, n, generator=gen).cuda() for _ in range(3)]
    hop = codec.hop_length
    cuts = [(0, (n - 8) * hop), (4 * hop, (n - 12) * hop), (7, 1000)]  # within a first window's kept frames
    with torch.inference_mode():
        batch = codec.decode_window_batch([(w, a, b) for w, (a, b) in zip(z, cuts)])  # 3 rows: bucket 4
        alone = [codec._decode_window(w, a, b) for w, (a, b) in zip(z, cuts)]
    assert codec._graphs.captures == captures  # replayed, nothing captured
    for got, want in zip(batch, alone):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-3)
