"""Chunked and streamed decode: which latent windows to decode so the chunks join exactly.

A chunk of frames [start, end) is decoded from the window [start - context, end + context) and the
context's audio dropped; with context = `RECEPTIVE_FIELD_FRAMES` (8) the joined chunks equal a
one-pass decode (docs/codec.md). `DACVAE.decode_stream` / `decode_chunked` walk these windows.
"""

from __future__ import annotations

import functools
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
    "plan_args",
    "stream_window_keys",
    "stream_window_lengths",
    "window_crop",
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


def window_crop(window: Window, context: int = RECEPTIVE_FIELD_FRAMES) -> tuple[int, int]:
    """(left, right): the frames at each end of `window` that only give context, `context` where
    it has that many beyond its kept frames, else 0 (a line's start or end). A window's graph is
    captured per crop (two or three a length, not one a window); its decode carries only what its
    kept samples depend on through the deeper blocks (`fast.ChannelsLastDecoder.crop_spans`): the
    first, frame-rate blocks see the context, the 24 and 48 kHz ones about the kept frames."""
    lo, start, end, hi = window
    return (context if start - lo >= context else 0, context if hi - end >= context else 0)


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


def plan_args(lengths: Sequence[int], context_frames: int, growth: float | None = None) -> tuple[int, ...]:
    """Check a window plan (`chunk_windows`' `plan_lengths`); returns its lengths sorted, once each."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence):
        raise InputError(
            f"a stream window plan must be a sequence of window lengths, got {lengths!r}",
            hint="e.g. (40, 66, 116, 216)",
        )
    if lengths and growth is not None:
        raise InputError(
            "a stream window plan and chunk growth are two policies for the windows after the first",
            hint="set stream_window_plan or stream_chunk_growth, not both",
        )
    least = 2 * context_frames + 1
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, int) or n < least:
            raise InputError(
                f"a stream window plan's lengths must be integers >= {least}, got {n!r}",
                hint=f"a window keeps its frames less {context_frames} of context a side; e.g. 40,66,116,216",
            )
    return tuple(sorted(set(lengths)))


def chunk_windows(
    frames: int,
    chunk_frames: int,
    context_frames: int,
    first_chunk_frames: int | None = None,
    *,
    growth: float | None = None,
    stretch_last: bool = True,
    tail_lengths: Sequence[int] = (),
    plan_lengths: Sequence[int] = (),
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
    `plan_lengths` (a window plan; `chunk_frames` then only sizes a first chunk not given, and
    `tail_lengths` is not used): the first chunk as without, then windows of these lengths only,
    as few frames decoded as they allow (`_planned`; news5 1.30x its frames with 40, 66, 116 and
    216 against 1.59x). Not with `growth`. Without `stretch_last` the last window keeps only the
    context it needs. The one exception: a first chunk shorter than the context and a line too
    short for any window after it from frame 0 takes one window [0, frames), as without a plan.
    """
    first = stream_args(chunk_frames, context_frames, first_chunk_frames, growth)
    plan = plan_args(plan_lengths, context_frames, growth)
    if plan:
        windows = [(0, 0, min(first, frames), min(frames, first + context_frames))] if frames > 0 else []
        if frames > first:
            windows += _planned(frames, first, plan, context_frames)
            if not stretch_last:
                lo, start, end, hi = windows[-1]
                windows[-1] = (max(0, start - context_frames), start, end, hi)
        return windows
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


@functools.lru_cache(maxsize=4096)
def _planned(frames: int, first: int, lengths: tuple[int, ...], context: int) -> tuple[Window, ...]:
    """The windows of frames [first, frames) with lengths (hi - lo) from `lengths`, the fewest
    frames decoded, then the fewest windows (then the first found trying the last window before
    middle ones, shorter lengths first). Host arithmetic, once per line: cached.

    From a start s a middle window of n frames is [s - C, s + n - C) and keeps n - 2C frames
    (n - C - s where s < C: it starts at frame 0, the line's start); the line's last window
    [frames - n, frames) keeps up to n - C (no right context), reaching further left than it needs
    (more context changes nothing; before frame 0 zero frames, `window_frames`, only where s >= C).
    """
    c = context
    # best[s]: (frames decoded, windows, this window's length, its end) from start s to the end
    best: dict[int, tuple[int, int, int, int]] = {}
    for s in range(frames - 1, first - 1, -1):
        if first < s < c:
            continue  # no window starts there: the first middle one ends at n - C > C
        options = [(n, 1, n, frames) for n in lengths if (n == frames if s < c else frames - s <= n - c)]
        for n in lengths:
            end = n - c if s < c else s + n - 2 * c
            if end + c <= frames and end < frames and end in best:
                cost, count, _, _ = best[end]
                options.append((n + cost, 1 + count, n, end))
        if options:
            best[s] = min(options, key=lambda o: o[:2])  # min keeps the first of equal keys
    if first not in best:  # s < C and no length fits a line this short: one window from frame 0
        return ((0, first, frames, frames),)
    middles, s = [], first
    while (step := best[s])[3] < frames:
        middles.append(step[2])
        s = step[3]
    last = step[2]
    # the middle windows shortest first: the second chunk, due when the short first one has played,
    # decodes soonest, and audio runs further ahead of playback before the longer windows (the
    # frames they keep add up the same in any order: only the first middle one may start at frame 0)
    windows, s = [], first
    for n in sorted(middles):
        lo = max(0, s - c)
        windows.append((lo, s, lo + n - c, lo + n))
        s = lo + n - c
    windows.append((frames - last, s, frames, frames))
    return tuple(windows)


def _next_chunk(size: int, chunk_frames: int, growth: float | None) -> int:
    """The chunk after one of `size` frames: `chunk_frames`, or with `growth` at most that times
    `size` (and at least one frame more)."""
    return chunk_frames if growth is None else min(chunk_frames, max(size + 1, math.ceil(size * growth)))


def stream_window_lengths(
    chunk_frames: int,
    context_frames: int = RECEPTIVE_FIELD_FRAMES,
    first_chunk_frames: int | None = None,
    growth: float | None = None,
    *,
    plan_lengths: Sequence[int] = (),
) -> list[int]:
    """The window lengths (frames) `decode_stream` decodes with these arguments, for `prewarm_graphs`.

    In order, without repeats: the first window, any next ones still cut short
    by the line's start or growing (`growth`), and the middle windows
    (`chunk_frames + 2 * context_frames`).
    A line's last window is stretched to the middle length (see `chunk_windows`; left out: a line
    whose only window is its first, and one whose second chunk starts within the context of its
    start). `decode_chunked(latent, n)`
    uses the windows of `decode_stream(latent, n)`.
    With `plan_lengths` (`chunk_windows`): the first window, then the plan's lengths, every one
    (sorted; the middle length only where the plan has it).
    """
    first = stream_args(chunk_frames, context_frames, first_chunk_frames, growth)
    plan = plan_args(plan_lengths, context_frames, growth)
    if plan:
        return list(dict.fromkeys([first + context_frames, *plan]))
    # long enough to reach the middle windows with the line's end still out of reach
    ramp, size = 0, first
    while growth is not None and size < chunk_frames:  # the growing chunks before the middle ones
        size = _next_chunk(size, chunk_frames, growth)
        ramp += size
    frames = first + ramp + chunk_frames * (context_frames + 2) + context_frames
    windows = chunk_windows(frames, chunk_frames, context_frames, first_chunk_frames, growth=growth)
    return list(dict.fromkeys(hi - lo for lo, _, end, hi in windows if end + context_frames <= frames))


def stream_window_keys(
    chunk_frames: int,
    context_frames: int = RECEPTIVE_FIELD_FRAMES,
    first_chunk_frames: int | None = None,
    growth: float | None = None,
    *,
    plan_lengths: Sequence[int] = (),
    tail_lengths: Sequence[int] = (),
) -> list[tuple[int, tuple[int, int]]]:
    """(length, crop) of the windows `stream_window_lengths` (and `tail_lengths`) names, every length
    in its order, with the crops their windows take (`window_crop`), for `prewarm_graphs`: the
    first window keeps its right context only; a later one both (a middle window) or its left (a
    line's last); a later window that can start within the context of the line's start (a first
    chunk shorter than it, or growing chunks) its right only too; a length too short to crop,
    none."""
    first = stream_args(chunk_frames, context_frames, first_chunk_frames, growth)
    lengths = stream_window_lengths(
        chunk_frames, context_frames, first_chunk_frames, growth, plan_lengths=plan_lengths
    )
    c = context_frames
    later = [(c, c), (c, 0), *([(0, c)] if first < c or growth is not None else [])]
    keys = [(lengths[0], (0, c))]
    for n in dict.fromkeys([*lengths[1:], *(() if plan_lengths else tail_lengths)]):
        keys += [(n, crop) for crop in later if sum(crop) < n] or [(n, (0, 0))]  # too short to crop
    return list(dict.fromkeys(keys))


def decode_windows(
    decode_window: Callable[[Tensor, int, int], Tensor],
    z: Tensor,
    windows: list[Window],
    hop: int,
    cancel: CancelToken | None,
    stream_samples: Callable[[int, int], Tensor] | None = None,
) -> Iterator[Tensor]:
    """Each window's kept samples, in order: `decode_window(z[..., lo:hi], a, b)` gives samples [a, b);
    `stream_samples(a, b)` (a `stateful.LineStream`'s `samples`) gives the same samples instead."""
    for lo, start, end, hi in windows:
        check(cancel)
        # no_grad is entered and left around each chunk: a mode held across `yield`
        # would leak into the consumer's code.
        with torch.no_grad():
            if stream_samples is not None:
                piece = stream_samples(start * hop, end * hop).contiguous()
            else:
                piece = decode_window(window_frames(z, lo, hi), (start - lo) * hop, (end - lo) * hop)
        yield piece
