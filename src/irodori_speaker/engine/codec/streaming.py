"""Chunked and streamed decode: which latent windows to decode so the chunks join exactly.

A chunk of frames [start, end) is decoded from the window [start - context, end + context) and the
context's audio dropped; with context = `RECEPTIVE_FIELD_FRAMES` (8) the joined chunks equal a
one-pass decode (docs/codec.md). `DACVAE.decode_stream` / `decode_chunked` walk these windows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ...cancel import CancelToken, check
from ...errors import InputError

__all__ = [
    "RECEPTIVE_FIELD_FRAMES",
    "chunk_windows",
    "decode_windows",
    "stream_window_lengths",
    "window_frames",
]

#: An output sample of latent frame k depends on latent frames k-8 .. k+8 (see docs/codec.md).
RECEPTIVE_FIELD_FRAMES = 8

# (lo, start, end, hi): emit frames [start, end), decode [lo, hi); lo < 0: the window starts with
# -lo zero frames before the latent (`window_frames`; a short line's last window, see chunk_windows)
Window = tuple[int, int, int, int]


def window_frames(z: Tensor, lo: int, hi: int) -> Tensor:
    """Frames [lo, hi) of `z` (..., T), zero frames standing in before frame 0 when lo < 0."""
    return z[..., lo:hi] if lo >= 0 else F.pad(z[..., :hi], (-lo, 0))


def check_int(name: str, value: Any, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InputError(f"{name} must be an integer >= {least}, got {value!r}")


def stream_args(
    chunk_frames: int, context_frames: int, first_chunk_frames: int | None, growth: float | None = None
) -> int:
    """Check a stream's arguments; returns the first chunk's frames."""
    first = chunk_frames if first_chunk_frames is None else first_chunk_frames
    check_int("chunk_frames", chunk_frames, 1)
    check_int("context_frames", context_frames, 0)
    check_int("first_chunk_frames", first, 1)
    if growth is not None and (
        isinstance(growth, bool) or not isinstance(growth, (int, float)) or not growth >= 1
    ):
        raise InputError(f"chunk growth must be a number >= 1 or None, got {growth!r}")
    return first


def chunk_windows(
    frames: int,
    chunk_frames: int,
    context_frames: int,
    first_chunk_frames: int | None = None,
    *,
    growth: float | None = None,
    stretch_last: bool = True,
    tail_lengths: Sequence[int] = (),
) -> list[Window]:
    """(lo, start, end, hi) per chunk: emit frames [start, end), decode [lo, hi).

    After the first chunk each chunk is `chunk_frames`, or with `growth` at most `growth` times
    the one before it (8, 24, 50, 50, ... for 8, 3.0, 50): where decode is slow next to real time
    (a CPU) a chunk's window is decoded while the shorter chunk before it plays.

    With `stretch_last` (CUDA graphs) the last window of a line reaches back further left when it
    is shorter than a middle window (more context than needed changes nothing), so it has the
    middle windows' length and reuses their graph instead of running eagerly; without graphs
    that is wasted work. A line too short for that (fewer frames than a middle window) has its
    last window start before frame 0 (lo < 0, zero frames there) when its kept frames begin at
    least `context_frames` in: their samples depend on frames from 0 on only, at every layer, so
    what stands before frame 0 changes nothing (a short line's eager window took ~28 ms of the
    owner thread under cProfile at 16 streams on the H100; RESULTS.md, twelfth session).
    `tail_lengths`: shorter graphed lengths the last window may take instead, the shortest that
    holds it (a line's tail of a few frames then decodes 40 frames, not 66: the windows decoded
    news5 1.59x over, 1.44x with a 40; benchmarks/decode_frames.py).
    """
    first = stream_args(chunk_frames, context_frames, first_chunk_frames, growth)
    middle = chunk_frames + 2 * context_frames
    windows, start, size = [], 0, first
    while start < frames:
        end = min(start + size, frames)
        lo, hi = max(0, start - context_frames), min(frames, end + context_frames)
        if stretch_last and start > 0 and end == frames and hi - lo < middle:
            length = min((n for n in tail_lengths if hi - lo <= n < middle), default=middle)
            lo = hi - length if start >= context_frames else max(0, hi - length)
        windows.append((lo, start, end, hi))
        start = end
        size = _next_chunk(size, chunk_frames, growth)
    return windows


def _next_chunk(size: int, chunk_frames: int, growth: float | None) -> int:
    """The chunk after one of `size` frames: `chunk_frames`, or with `growth` at most that times
    `size` (and at least one frame more)."""
    return chunk_frames if growth is None else min(chunk_frames, max(size + 1, math.ceil(size * growth)))


def stream_window_lengths(
    chunk_frames: int,
    context_frames: int = RECEPTIVE_FIELD_FRAMES,
    first_chunk_frames: int | None = None,
    growth: float | None = None,
) -> list[int]:
    """The window lengths (frames) `decode_stream` decodes with these arguments, for `prewarm_graphs`.

    In order, without repeats: the first window, any next ones still cut short
    by the line's start or growing (`growth`), and the middle windows
    (`chunk_frames + 2 * context_frames`).
    A line's last window is stretched to the middle length (see `chunk_windows`; left out: a line
    whose only window is its first, and one whose second chunk starts within the context of its
    start). `decode_chunked(latent, n)`
    uses the windows of `decode_stream(latent, n)`.
    """
    first = stream_args(chunk_frames, context_frames, first_chunk_frames, growth)
    # long enough to reach the middle windows with the line's end still out of reach
    ramp, size = 0, first
    while growth is not None and size < chunk_frames:  # the growing chunks before the middle ones
        size = _next_chunk(size, chunk_frames, growth)
        ramp += size
    frames = first + ramp + chunk_frames * (context_frames + 2) + context_frames
    windows = chunk_windows(frames, chunk_frames, context_frames, first_chunk_frames, growth=growth)
    return list(dict.fromkeys(hi - lo for lo, _, end, hi in windows if end + context_frames <= frames))


def decode_windows(
    decode_window: Callable[[Tensor, int, int], Tensor],
    z: Tensor,
    windows: list[Window],
    hop: int,
    cancel: CancelToken | None,
) -> Iterator[Tensor]:
    """Each window's kept samples, in order: `decode_window(z[..., lo:hi], a, b)` gives samples [a, b)."""
    for lo, start, end, hi in windows:
        check(cancel)
        # no_grad is entered and left around each chunk: a mode held across `yield`
        # would leak into the consumer's code.
        with torch.no_grad():
            piece = decode_window(window_frames(z, lo, hi), (start - lo) * hop, (end - lo) * hop)
        yield piece
