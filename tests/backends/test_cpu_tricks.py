"""The CPU preset's tricks end to end on the tiny random model: bf16, int8 linears, the CPU decoder.

Each run loads the tiny-random synthesizer with the preset fields, applies the after-load steps
(`engine.hardware.cpu_tricks`, which the loader runs too: applying twice is harmless),
renders one line with a fixed seed, and compares the latent and the audio with the fp32 run.
Nothing is timed (benchmarks/cpu_preset.py measures speed).
"""

from __future__ import annotations

import pytest
import torch

from irodori_speaker.engine.hardware.cpu_tricks import apply_cpu_tricks
from irodori_speaker.engine.quant.int8 import Int8Linear
from irodori_speaker.options import SynthesisOptions
from irodori_speaker.synthesis.loading import load_synthesizer

F32, BF16 = torch.float32, torch.bfloat16
TEXT = "今日はいい天気ですね。"
OPTS = SynthesisOptions(seed=3, seconds=1.0)


def _render(**fields):
    fields.setdefault("codec_channels_last", False)  # the (B, C, T) decoder unless a row asks
    synth = load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False, **fields)
    done = {"int8_linears": sum(isinstance(m, Int8Linear) for m in synth.model.modules())}  # by the loader
    assert apply_cpu_tricks(synth.model, synth.preset).get("int8_linears", 0) == 0  # idempotent
    return synth, done, *_speak(synth)


def _speak(synth):
    """The sampled latent and the audio of TEXT."""
    seen = {}
    inner = synth.sample_latent

    def capture(*a, **k):
        out = inner(*a, **k)
        seen["latent"] = out.float().clone()
        return out

    synth.sample_latent = capture
    audio = torch.from_numpy(synth.synthesize(TEXT, None, OPTS).audio.copy())
    synth.sample_latent = inner
    return seen["latent"], audio


@pytest.fixture(scope="module")
def reference(irodori_home):
    _, done, latent, audio = _render(dtype=F32, codec_dtype=F32)
    assert done == {"int8_linears": 0}  # the plain fp32 reference: no int8 layer
    return latent, audio


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    n = min(len(a), len(b)) if a.dim() == 1 else None
    a, b = (a[:n], b[:n]) if n else (a, b)
    return float((a.double() - b.double()).norm() / b.double().norm())


# Measured on the tiny model (relative L2 against fp32): latent bf16 2.8e-3, int8 4.4e-4, bf16 + int8
# 2.8e-3; audio with the bf16 codec 1.2e-2 (38.5 dB SNR), with everything 1.25e-2; the channels-last
# decoder in fp32 differs from the (B, C, T) one by summation order only. The bounds leave 2.5-4x headroom.
@pytest.mark.parametrize(
    ("fields", "latent_tol", "audio_tol"),
    [
        ({"dtype": BF16, "codec_dtype": F32}, 1e-2, 1.5e-2),
        ({"dtype": F32, "codec_dtype": F32, "int8_linears": True}, 2e-3, 3e-3),
        ({"dtype": BF16, "codec_dtype": F32, "int8_linears": True}, 1e-2, 1.5e-2),
        ({"dtype": F32, "codec_dtype": F32, "codec_channels_last": True}, 0.0, 1e-5),
        ({"dtype": F32, "codec_dtype": BF16, "codec_channels_last": True}, 0.0, 4e-2),
        ({"dtype": BF16, "codec_dtype": BF16, "int8_linears": True, "codec_channels_last": True}, 1e-2, 4e-2),
    ],
    ids=["bf16", "int8", "bf16+int8", "cpu-codec", "cpu-codec-bf16", "all"],
)
def test_each_trick_renders_close_to_fp32(reference, fields, latent_tol, audio_tol):
    ref_latent, ref_audio = reference
    synth, done, latent, audio = _render(**fields)
    if fields.get("int8_linears"):
        assert done["int8_linears"] == 2 * 8  # the tiny model's 2 blocks x 8 per-step linears
        assert isinstance(synth.model.blocks[0].mlp.w1, Int8Linear)
    assert synth.codec.channels_last == bool(fields.get("codec_channels_last", False))
    assert synth.model.in_proj.weight.dtype == fields["dtype"]
    assert synth.codec.dtype == fields["codec_dtype"]
    assert len(audio) == len(ref_audio) and bool(audio.abs().max() > 0)
    assert _rel(latent, ref_latent) <= latent_tol
    assert _rel(audio, ref_audio) < audio_tol


def test_the_cache_key_tells_the_tricks_apart(reference):
    from irodori_speaker.engine.hardware.presets import select_preset

    plain = select_preset("cpu", codec_channels_last=False)
    tricks = select_preset("cpu", int8_linears=True, codec_channels_last=True)
    assert plain.audio_flags() == [] and tricks.audio_flags() == ["int8_linears", "codec_channels_last"]


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["int8", "bf16+int8"])
def test_int8_siblings_share_one_quantisation_and_render_the_same(irodori_home, monkeypatch, dtype):
    """The preset's int8 model: q/k/v/gate and w1/w3 quantise their common input once; the line's
    latent and audio are bit for bit those of linears that each quantise their own."""
    import irodori_speaker.engine.quant.int8 as int8

    calls = []
    inner = int8._quantize_rows

    def counted(x):
        calls.append(1)
        return inner(x)

    monkeypatch.setattr(int8, "_quantize_rows", counted)
    synth, _, latent, audio = _render(dtype=dtype, codec_dtype=F32, int8_linears=True)
    shared_calls = len(calls)
    layers = [m for m in synth.model.modules() if isinstance(m, Int8Linear)]
    assert sum(m.shared is not None for m in layers) == 2 * 6  # the tiny model's 2 blocks x 6 siblings
    for m in layers:
        m.shared = None  # each quantises its own input, as before
    calls.clear()
    alone_latent, alone_audio = _speak(synth)
    assert shared_calls > 0 and len(calls) == 2 * shared_calls  # 8 quantisations per block, not 4
    assert torch.equal(alone_latent, latent) and torch.equal(alone_audio, audio)
