"""The int4 codec: every decoder conv packed, decode close to the float codec, far less weight memory."""

from __future__ import annotations

import torch
from torch import nn

from irodori_speaker.engine.codec import (
    DACVAE,
    TINY_CODEC_KWARGS,
    codec_from_state_dict,
    random_codec_state_dict,
)
from irodori_speaker.engine.quant.codec import quantize_codec
from irodori_speaker.engine.quant.layers import Int4Conv1d, Int4ConvTranspose1d


def weight_bytes(m: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()])


def test_int4_decoder_tracks_the_float_decoder():
    state = random_codec_state_dict(TINY_CODEC_KWARGS, seed=1)
    ref = codec_from_state_dict(state, TINY_CODEC_KWARGS)
    q = codec_from_state_dict(state, TINY_CODEC_KWARGS)
    n = quantize_codec(q)
    convs = [m for m in q.decoder.modules() if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d))]
    packed = [m for m in q.decoder.modules() if isinstance(m, (Int4Conv1d, Int4ConvTranspose1d))]
    assert not convs and len(packed) == n > 10
    assert weight_bytes(q.decoder) < 0.4 * weight_bytes(ref.decoder)
    z = torch.randn(1, 20, 32, generator=torch.Generator().manual_seed(0))
    a, b = ref.decode(z), q.decode(z)
    rel = ((a - b).norm() / a.norm()).item()
    # measured 0.21 on the random tiny codec: Gaussian random weights fill every 4-bit range, and the
    # error of ~17 quantised convs adds up (the seed saw almost no loss on the trained codec)
    assert rel < 0.3
    # RTN: each weight is within half a step (fp16 scale rounding aside) wherever the group's range
    # contains 0; the release's formula clamps the zero point, so an all-positive group can miss more
    floats = dict(ref.decoder.named_modules())
    for name, m in q.decoder.named_modules():
        if isinstance(m, (Int4Conv1d, Int4ConvTranspose1d)):
            p = m.packed()
            w = floats[name].weight.detach().float().reshape(p.rows, p.num_groups, -1)
            deq = p.dequantize(torch.float32).reshape(w.shape)
            step = p.scales.float()[..., None]
            straddles = (w.amin(-1, keepdim=True) <= 0) & (w.amax(-1, keepdim=True) >= 0)
            err = ((deq - w).abs() / step).masked_fill(~straddles, 0)
            assert err.max() <= 0.51, name
    # chunked decode stays exact on the int4 codec too (it is still a fixed function)
    torch.testing.assert_close(q.decode_chunked(z, 7), b, atol=1e-5, rtol=0)
    assert isinstance(q, DACVAE)


def test_the_codec_int4_preset_option_loads_a_packed_decoder(synth):
    """load_synthesizer(codec_int4=True): the codec users get is packed, renders the same line (as noise
    of the same length), and is told apart from the float codec in the phrase-cache key."""
    from irodori_speaker.options import SynthesisOptions
    from irodori_speaker.synthesis.loading import load_synthesizer

    q = load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False, codec_int4=True)
    assert q.preset.codec_int4 and not synth.preset.codec_int4
    decoder = list(q.codec.decoder.modules())
    assert not any(type(m) in (nn.Conv1d, nn.ConvTranspose1d) for m in decoder)
    assert any(isinstance(m, Int4ConvTranspose1d) for m in decoder)
    assert any(type(m) is nn.Conv1d for m in q.codec.encoder.modules())  # the encoder stays float
    opts = SynthesisOptions(seed=3, seconds=1.0)
    a, b = synth.synthesize("こんにちは。", options=opts), q.synthesize("こんにちは。", options=opts)
    assert len(a.audio) == len(b.audio) > 0 and bool(torch.isfinite(torch.from_numpy(b.audio)).all())
    assert not torch.equal(torch.from_numpy(a.audio), torch.from_numpy(b.audio))
    ident_a, ident_b = (
        synth.render_identity("こんにちは。", None, opts),
        q.render_identity("こんにちは。", None, opts),
    )
    *head, last = ident_a["precision"]
    assert last == "codec_channels_last"  # the CPU preset's; flags in AUDIO_FLAGS' order
    assert ident_b["precision"] == [*head, "codec_int4", last]


def test_load_int4_codec_packs_on_the_cpu_and_keeps_the_packed_dtypes(tmp_path):
    from irodori_speaker.engine.codec import save_random_codec_pth
    from irodori_speaker.engine.quant.codec import load_int4_codec

    path = save_random_codec_pth(tmp_path / "c.pth", TINY_CODEC_KWARGS, seed=2, watermark=False)
    codec = load_int4_codec(path, dtype=torch.float32)
    conv = codec.decoder.model[1].block["1"]
    assert isinstance(conv, Int4ConvTranspose1d) and conv.qweight_u8.dtype == torch.uint8
    assert conv.scales.dtype == torch.float16 and codec.dtype == torch.float32
