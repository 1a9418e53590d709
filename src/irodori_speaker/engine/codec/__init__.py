"""The DACVAE codec (Aratako/Semantic-DACVAE-Japanese-32dim) in plain PyTorch, in small modules:

- `config`: the reference constructor's kwargs checked into a `CodecConfig`.
- `layers`: Snake, residual units, encoder / decoder blocks, the output head.
- `model`: `DACVAE` (decode, chunked and streamed decode, encode; CUDA graphs opt-in).
- `streaming`: the latent windows a chunked / streamed decode uses so the chunks join exactly.
- `graphs`: capturing window decodes as CUDA graphs, and which shapes get one.
- `files`: loading `weights.pth` or a converted safetensors file, strictly; `convert_codec`.
- `random_weights`: random codecs in the real file layout (tests, benchmarks, tiny-random).

Module and parameter names follow the reference checkpoint's state_dict keys. Layout of the real
checkpoint, the layers and their behaviour: docs/codec.md.
"""

from .config import FULL_CODEC_KWARGS, TINY_CODEC_KWARGS, CodecConfig
from .files import codec_from_state_dict, convert_codec, load_codec
from .layers import (
    Decoder,
    DecoderBlock,
    Encoder,
    EncoderBlock,
    OutputHead,
    ResidualUnit,
    Snake,
    VAEBottleneck,
    conv_to_one_channel,
)
from .model import DACVAE
from .random_weights import checkpoint_layout, random_codec_state_dict, save_random_codec_pth
from .streaming import RECEPTIVE_FIELD_FRAMES, stream_window_keys, stream_window_lengths

__all__ = [
    "DACVAE",
    "FULL_CODEC_KWARGS",
    "RECEPTIVE_FIELD_FRAMES",
    "TINY_CODEC_KWARGS",
    "CodecConfig",
    "Decoder",
    "DecoderBlock",
    "Encoder",
    "EncoderBlock",
    "OutputHead",
    "ResidualUnit",
    "Snake",
    "VAEBottleneck",
    "checkpoint_layout",
    "codec_from_state_dict",
    "conv_to_one_channel",
    "convert_codec",
    "load_codec",
    "random_codec_state_dict",
    "save_random_codec_pth",
    "stream_window_keys",
    "stream_window_lengths",
]
