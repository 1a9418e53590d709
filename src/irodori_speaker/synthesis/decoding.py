"""A rendered piece's latent -> audio chunks: whole, or streamed window by window.

Each decode is a job of the device owner (engine/hardware/owner.py); a window's samples come
back through `DEVICE.to_host`, so where the owner ran it (CUDA, lines that meet) the copy lands
later and the next window is launched before this one is read.

Windows of one length from lines that meet on the owner are decoded as one batch
(`DEVICE.run_batched`, up to the preset's `decode_batch`). A streamed line's later windows carry a
deadline: when the audio it has handed out so far will have played (counted from its first
chunk), less a margin (`MARGIN_S`, or four of its windows' times). The owner serves windows by
that deadline, so a line about to run dry goes before one that is seconds ahead (issue 27).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..engine.batch import lines_to_take
from ..engine.codec.streaming import window_frames
from ..engine.duration import HOP
from ..engine.hardware.owner import DECODE, DEVICE, NORMAL, URGENT
from ..errors import AudioError

# a window's deadline is this far ahead of its line running dry at least (or four of its windows'
# longest time from launch to landing, if more): only a line well ahead yields to the others. With
# 50 ms, 16 Speakers on the CPU tiny model had 8 holes in 32 lines (tests/speaker/test_jitter.py):
# a line deferred to its deadline found a queue of other lines' windows ahead of it
MARGIN_S = 1.0


@dataclass
class Playback:
    """A line's audio as handed out so far (its pieces and the silences between them): when the
    first of it went out, its playback start as far as the synthesizer knows, and how much. Its
    streamed windows' deadlines count from it; only its very first window is URGENT."""

    started: float | None = None
    samples: int = 0
    took: float = 0.0  # the longest a window took from launch to its samples on the host

    def handed(self, samples: int) -> None:
        if self.started is None:
            self.started = time.monotonic()
        self.samples += samples

    def deadline(self, before: int, sr: int) -> float | None:
        """When a window whose audio follows `before` samples of the line is needed: once those
        have played, less the margin (None before the line's first audio)."""
        if self.started is None:
            return None
        return self.started + before / sr - max(MARGIN_S, 4 * self.took)


@dataclass
class Rendered:
    """A sampled piece, ready to decode: latent frames [0, decode_frames) give `samples` samples,
    once its tail trim is applied (`settle`)."""

    latent: Any  # (1, T, C) on the model's device
    decode_frames: int
    samples: int
    trim: Any = None  # the tail-trim frame on its way to the host (a HostCopy), not yet applied
    trimmed: int = 0  # latent frames the trim cut off
    ready: Any = None  # an event after the sampling that made `latent` (a decode stream's wait)

    def settle(self, cancel: Any = None) -> None:
        """Apply the tail trim once its frame is on the host: the audio ends at that frame, and
        8 frames of right context make what is kept equal to a full decode."""
        if self.trim is None:
            return
        end, self.trim = int(self.trim.wait(cancel)), None
        if 0 < end < self.decode_frames:
            self.samples = min(self.samples, end * HOP)
            self.trimmed = self.decode_frames - end
            self.decode_frames = min(self.decode_frames, end + 8)


def decode_chunks(
    codec: Any,
    preset: Any,
    rendered: Rendered,
    opts: Any,
    cancel: Any,
    whole: bool,
    playback: Playback | None = None,
):
    """Yield (float32 numpy chunk, is_last) of one rendered piece, cut to its sample count.
    `playback`: its line's audio so far (a piece of its own: None), counted on as chunks go out.

    Each window is a job of the device owner, copied to the host without waiting where the
    owner ran it (CUDA); then the next window is launched before this one is read."""
    first = growth = None
    plan: tuple[int, ...] = ()  # a window plan is the stream's policy, as first and growth are
    # eager channels-last decodes: the chunks from one stateful stream (each frame decoded once).
    # A whole line takes a streamed line's chunks there: a push's rounding follows its length,
    # so the same chunks make a whole line the same samples as the line streamed
    stateful = preset.stream_stateful and getattr(codec, "streams_statefully", lambda: False)()
    if opts.chunk_frames is not None:
        chunk = opts.chunk_frames
    elif whole and not stateful:
        chunk = preset.decode_chunk_frames
    else:
        chunk, first = preset.stream_chunk_frames, preset.stream_first_chunk_frames
        growth, plan = preset.stream_chunk_growth, tuple(preset.stream_window_plan)
    # a streamed line's first window does not depend on where the tail trim falls unless it falls
    # inside that window: with `stream_first_before_trim` it goes to the device before the trim
    # frame has landed (so the GPU runs it straight after the sampler, no host round trip between),
    # and is checked against the trimmed line's windows after
    early = (
        rendered.trim is not None
        and first is not None
        and not whole
        and not stateful
        and preset.stream_first_before_trim
    )
    if not early:
        rendered.settle(cancel)
    frames = rendered.decode_frames  # every window, trimmed or not, reads within these
    total = rendered.samples

    def latent() -> Any:  # read by the line's first decode job (on the decode stream, if any)
        DEVICE.consume(rendered.latent, rendered.ready)
        return rendered.latent[:, :frames].to(codec.device, codec.dtype)

    if chunk is None or (chunk >= frames and first is None):
        whole_piece = _Window(
            lambda: codec.decoder_input(latent(), check_finite=False),
            0,
            rendered.decode_frames,
            0,
            rendered.decode_frames * codec.hop_length,
            total,
        )
        audio = DEVICE.run(lambda: _decode_many(codec, [whole_piece])[0], cancel, stream=DECODE)
        yield _finite(audio.wait(cancel).numpy()), True
        return
    tails = tuple(preset.stream_tail_windows)

    def plan_windows() -> list[Any]:
        return codec.stream_windows(
            rendered.decode_frames,
            chunk,
            first_chunk_frames=first,
            growth=growth,
            tail_lengths=tails,
            plan_lengths=plan,
        )

    windows = plan_windows()
    hop, limit, sr = codec.hop_length, max(1, int(preset.decode_batch)), codec.sample_rate
    # windows of lines that meet go as one batch; where graphs fill it up to its bucket, one that
    # would be a quarter or more fillers is cut to the bucket below (3 windows: 2, then 1)
    take = lines_to_take if getattr(codec, "fills_batches", lambda: False)() else None
    # the latent as the decoder takes it, made by the first window's job, and an event after it
    # where the decode has a stream of its own (a later window may run on another stream: inline
    # for a line alone, on the owner's decode stream when lines meet)
    held: list[Any] = []

    def source() -> Any:
        if not held:  # no NaN check on the device (a host sync): the audio is checked on the host
            made = codec.decoder_input(latent(), check_finite=False)
            held.extend((made, DEVICE.ready_mark(made)))
        else:
            DEVICE.consume(held[0], held[1])
        return held[0]

    # the stateful stream is made by the first chunk's job; each chunk a job of its own (a line's
    # state is its own)
    streams: list[Any] = []

    def stream_samples(a: int, b: int, keep: int) -> Any:
        if not streams:
            streams.append(codec.line_stream(source()))
        return DEVICE.to_host(streams[0].samples(a, b)[0, 0, :keep].float())

    line = playback if playback is not None else Playback()
    before = line.samples  # the line's audio ahead of this piece
    launched = 0  # samples of the windows launched so far

    def launch(i: int, priority: int) -> Any:
        nonlocal launched
        if i >= len(windows) or launched >= total:
            return None
        lo, start, end, hi = windows[i]
        keep = total - launched
        # a streamed window is needed when the line's audio before it has played
        deadline = None if whole else line.deadline(before + launched, sr)
        if stateful:
            a, b = start * hop, end * hop
            copy = DEVICE.run(lambda: stream_samples(a, b, keep), cancel, priority, deadline, stream=DECODE)
        else:
            item = _Window(source, lo, hi, (start - lo) * hop, (end - lo) * hop, keep)
            key = ("decode", id(codec), hi - lo)
            many = lambda items: _decode_many(codec, items)  # noqa: E731
            copy = DEVICE.run_batched(
                key, item, many, cancel, priority, limit=limit, deadline=deadline, take=take, stream=DECODE
            )
        launched += min(copy.tensor.shape[0], keep)
        return copy

    t0 = time.monotonic()
    # the line's first window is first audio: ahead of other lines' windows (a later piece's
    # first window is needed only when the pieces before it have played)
    head = URGENT if line.started is None else NORMAL
    ahead = launch(0, head)
    if early:
        guess, guessed = windows[0], total
        rendered.settle(cancel)
        windows, total = plan_windows(), rendered.samples
        span = (guess[2] - guess[1]) * hop  # the first window's samples, before the cut to `keep`
        if windows[0] != guess or min(span, guessed) != min(span, total):
            # the trim fell inside it (a line of a second or so): decoded again, trimmed
            if ahead is not None:
                ahead.wait(cancel)
            launched = 0
            ahead = launch(0, head)
    i, remaining = 1, total
    while ahead is not None and remaining > 0:
        # a copy still on its way (the owner launched it, CUDA): the next window goes in
        # before this one is read, so the GPU has it queued meanwhile
        overlap = ahead.pending
        nxt = launch(i, NORMAL) if overlap else None
        out = _finite(ahead.wait(cancel).numpy())
        line.took = max(line.took, time.monotonic() - t0)
        line.handed(len(out))
        remaining -= len(out)
        yield out, remaining <= 0
        t0 = time.monotonic()
        ahead = nxt if overlap else launch(i, NORMAL)
        i += 1


def _finite(audio: np.ndarray) -> np.ndarray:
    """`audio`, checked on the host (a NaN latent decodes to NaN audio; the device is not read)."""
    if not np.isfinite(audio).all():
        raise AudioError(
            "the decoded audio contains NaN or inf",
            hint="the model file or the options gave a broken latent; try another seed or model",
        )
    return audio


@dataclass
class _Window:
    """One window of a line: latent frames [lo, hi) of `source()`, samples [a, b) kept, cut to
    `keep` (the piece's end)."""

    source: Callable[[], Any]
    lo: int
    hi: int
    a: int
    b: int
    keep: int


def _decode_many(codec: Any, items: list[_Window]) -> list[Any]:
    """Windows of one length (of one line or several) as one batch; each one's samples on their
    way to the host (a job of the device owner), the batch's as one copy in float32."""
    windows = [(window_frames(w.source(), w.lo, w.hi), w.a, w.b) for w in items]
    rows, spans = codec.decode_window_stack(windows, torch.float32)
    kept = [(start, min(stop, start + w.keep)) for (start, stop), w in zip(spans, items)]
    return DEVICE.to_host_rows(rows[:, 0], kept)
