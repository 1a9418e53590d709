"""A rendered piece's latent -> audio chunks: whole, or streamed window by window.

Each decode is a job of the device owner (engine/hardware/owner.py); a window's samples come
back through `DEVICE.to_host`, so where the owner ran it (CUDA, lines that meet) the copy lands
later and the next window is launched before this one is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..engine.hardware.owner import DEVICE, NORMAL, URGENT


@dataclass
class Rendered:
    """A sampled piece, ready to decode: latent frames [0, decode_frames) give `samples` samples."""

    latent: Any  # (1, T, C) on the model's device
    decode_frames: int
    samples: int


def decode_chunks(codec: Any, preset: Any, rendered: Rendered, opts: Any, cancel: Any, whole: bool):
    """Yield (float32 numpy chunk, is_last) of one rendered piece, cut to its sample count.

    Each window is a job of the device owner, copied to the host without waiting where the
    owner ran it (CUDA); then the next window is launched before this one is read."""
    first = growth = None
    if opts.chunk_frames is not None:
        chunk = opts.chunk_frames
    elif whole:
        chunk = preset.decode_chunk_frames
    else:
        chunk, first = preset.stream_chunk_frames, preset.stream_first_chunk_frames
        growth = preset.stream_chunk_growth
    total = rendered.samples

    def latent() -> Any:
        return rendered.latent[:, : rendered.decode_frames].to(codec.device, codec.dtype)

    if chunk is None or (chunk >= rendered.decode_frames and first is None):
        audio = DEVICE.run(lambda: DEVICE.to_host(codec.decode(latent())[0, 0, :total].float()), cancel)
        yield audio.wait(cancel).numpy(), True
        return
    stream: Any = None  # the codec's window generator, made by the first window's job
    launched = 0  # samples of the windows launched so far

    def launch(priority: int) -> Any:
        nonlocal launched
        if launched >= total:
            return None

        def window() -> Any:
            nonlocal stream
            if stream is None:
                stream = codec.decode_stream(
                    latent(), chunk, cancel=cancel, first_chunk_frames=first, growth=growth
                )
            part = next(stream, None)
            return None if part is None else DEVICE.to_host(part[0, 0, : total - launched].float())

        copy = DEVICE.run(window, cancel, priority)
        if copy is not None:
            launched += min(copy.tensor.shape[0], total - launched)
        return copy

    ahead = launch(URGENT)  # the first window is first audio: ahead of other lines' windows
    remaining = total
    while ahead is not None and remaining > 0:
        # a copy still on its way (the owner launched it, CUDA): the next window goes in
        # before this one is read, so the GPU has it queued meanwhile
        overlap = ahead.pending
        nxt = launch(NORMAL) if overlap else None
        out = ahead.wait(cancel).numpy()
        remaining -= len(out)
        yield out, remaining <= 0
        ahead = nxt if overlap else launch(NORMAL)
