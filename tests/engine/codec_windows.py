"""The windows a graphed stream decodes, decoded eagerly: what a graph replay must equal bit for bit.

With graphs a line's last window reaches back to the middle length (`stretch_last`); an eager stream
(no graphs) keeps its own context there, so the two streams differ in that window's rounding. Tests
of "a replay equals eager" compare against this, not against an eager `decode_stream`.
"""

from __future__ import annotations

import torch

from irodori_speaker.engine.codec import streaming


def eager_graph_windows(codec, latent: torch.Tensor, chunk: int, first: int | None) -> list[torch.Tensor]:
    """The chunks of `latent` streamed in the windows a graphed `decode_stream` uses, decoded eagerly."""
    z = codec._check_latent(latent)
    windows = streaming.chunk_windows(
        z.shape[-1], chunk, streaming.RECEPTIVE_FIELD_FRAMES, first, stretch_last=True
    )
    return list(streaming.decode_windows(codec._decode_window, z, windows, codec.hop_length, None))


def window_synth(**fields):
    """The tiny random Synthesizer on the CPU, decoding in windows as on a GPU (not the CPU preset's
    stateful stream), with these preset fields."""
    from irodori_speaker.synthesis.loading import load_synthesizer

    return load_synthesizer(
        tiny_random=True, backend="cpu", voice_cache_dir=False, stream_stateful=False, **fields
    )
