"""The seed's int4 codec (Irodori-TTS-Lite `dacvae_int4.safetensors`): a tiny codec written here in
that layout (every conv as `<m>.qweight` uint8 nibbles, `<m>.scales` / `<m>.zeros` fp16 per row
group, `<m>.bias`; everything else fp16) loads with its codes as stored, decodes as the float
codec rebuilt from the same dequantised weights, and `--codec-int4` speaks with it.

The writer below follows the layout of the seed's packed_conv.py (asymmetric groups of 32,
s = (max - min) / 15, z = round(-min / s)); the real release file was not seen here."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import save_file
from torch import nn

from hub_cache import run_cli_offline
from irodori_speaker.engine.codec import TINY_CODEC_KWARGS, codec_from_state_dict, random_codec_state_dict
from irodori_speaker.engine.quant.codec import is_lite_int4_codec, load_int4_codec
from irodori_speaker.engine.quant.layers import Int4Conv1d, Int4ConvTranspose1d
from irodori_speaker.errors import CheckpointError


def _seed_pack(w: torch.Tensor, group: int = 32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows, cols = w.shape
    g = cols // group if cols % group == 0 else 1
    wg = w.float().reshape(rows, g, cols // g)
    hi, lo = wg.amax(-1, keepdim=True), wg.amin(-1, keepdim=True)
    s = ((hi - lo) / 15).clamp(min=1e-8)
    z = torch.round(-lo / s)
    q = torch.clamp(torch.round(wg / s) + z, 0, 15).to(torch.uint8).reshape(rows, cols)
    if cols % 2:
        q = torch.cat([q, torch.zeros(rows, 1, dtype=torch.uint8)], 1)
    nibbles = (q[:, 0::2] & 0xF) | ((q[:, 1::2] & 0xF) << 4)
    return nibbles.contiguous(), s.reshape(rows, g).half(), z.reshape(rows, g).half()


def write_seed_codec(path, float_codec: nn.Module, kwargs: dict | None) -> int:
    """The float codec's state in the seed's packed layout; returns how many convs were packed."""
    out, n = {}, 0
    for name, module in float_codec.named_modules():
        if type(module) in (nn.Conv1d, nn.ConvTranspose1d):
            w = module.weight.detach()
            q, s, z = _seed_pack(w.reshape(w.shape[0], -1))
            out.update({f"{name}.qweight": q, f"{name}.scales": s, f"{name}.zeros": z})
            if module.bias is not None:
                out[f"{name}.bias"] = module.bias.detach().half()
            n += 1
    for k, v in float_codec.state_dict().items():
        if k.rpartition(".")[0] + ".qweight" not in out:
            out[k] = v.half()
    meta = {"kwargs": json.dumps(kwargs)} if kwargs is not None else None
    save_file(out, str(path), metadata=meta)
    return n


@pytest.fixture(scope="module")
def seed_file(tmp_path_factory):
    state = random_codec_state_dict(TINY_CODEC_KWARGS, seed=3)
    ref = codec_from_state_dict(state, TINY_CODEC_KWARGS)
    path = tmp_path_factory.mktemp("lite") / "dacvae_int4.safetensors"
    n = write_seed_codec(path, ref, dict(TINY_CODEC_KWARGS))
    return path, ref, n


def test_the_seed_codec_loads_packed_and_decodes_as_its_dequantised_weights(seed_file):
    path, ref, n = seed_file
    assert is_lite_int4_codec(path)
    q = load_int4_codec(path, dtype=torch.float32)
    packed = [m for m in q.modules() if isinstance(m, (Int4Conv1d, Int4ConvTranspose1d))]
    floats = [name for name, m in q.named_modules() if type(m) in (nn.Conv1d, nn.ConvTranspose1d)]
    assert floats == ["quantizer.in_proj", "quantizer.out_proj"]  # the 1x1 bottleneck, dequantised
    assert len(packed) == n - 2 > 10
    # the same function as a float codec holding the dequantised weights (the codes used as stored)
    deq = {}
    for name, m in q.named_modules():
        if isinstance(m, (Int4Conv1d, Int4ConvTranspose1d)):
            deq[f"{name}.weight"] = (
                m.packed()
                .dequantize(torch.float32)
                .reshape(dict(ref.named_parameters())[f"{name}.weight"].shape)
            )
    held = q.state_dict()  # the rest as the loader holds it (fp16-rounded, the bottleneck dequantised)
    float_state = {k: deq[k] if k in deq else held[k].float() for k in ref.state_dict()}
    same = codec_from_state_dict(float_state, TINY_CODEC_KWARGS)
    z = torch.randn(1, 20, 32, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a, b, c = q.decode(z), same.decode(z), ref.decode(z)
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        # the 4-bit rounding of a random tiny codec (our own int4 codec measured 0.21 on it)
        assert float((a - c).norm() / c.norm()) < 0.35
        assert q.encode(torch.zeros(1, 1, 4800)).shape[-1] == 32  # the encoder is packed and runs too


def test_codec_int4_speaks_with_the_seed_codec(seed_file, irodori_home, tmp_path):
    from irodori_speaker.engine.tiny import tiny_random_files

    path, _, _ = seed_file
    out = tmp_path / "a.wav"
    tiny = tiny_random_files("v2")  # the tiny model's own files: --tiny-random takes no --codec
    model = ["--model", str(tiny.model), "--tokenizer", str(tiny.tokenizer), "--backend", "cpu"]
    args = ["say", "こんにちは。", *model, "--codec", path, "--codec-int4", "--seed", "1", "-o", out]
    r = run_cli_offline(args, tmp_path / "hf", tmp_path)
    assert r.returncode == 0, r.stderr
    audio, sr = sf.read(str(out), dtype="float32")
    assert sr == 48_000 and len(audio) > 0 and np.isfinite(audio).all()


def test_a_damaged_or_mismatched_seed_codec_is_one_error(seed_file, tmp_path):
    path, ref, _ = seed_file
    bad = tmp_path / "no-kwargs.safetensors"
    write_seed_codec(bad, ref, None)  # no kwargs: read as the released codec, whose shapes differ
    with pytest.raises(CheckpointError, match="does not match the released codec") as e:
        load_int4_codec(bad)
    assert "\n" not in str(e.value)
    damaged = tmp_path / "damaged.safetensors"
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    tensors.pop("decoder.model.0.zeros")
    save_file(tensors, str(damaged), metadata={"kwargs": json.dumps(dict(TINY_CODEC_KWARGS))})
    with pytest.raises(CheckpointError, match=r"packed conv decoder\.model\.0 is damaged"):
        load_int4_codec(damaged)


def test_the_lite_int4_codec_alias_names_the_seeds_file():
    from irodori_speaker.engine.sources import parse_source

    spec = parse_source("lite-int4", "codec")
    assert (spec.repo_id, spec.filename) == (
        "kizuna-intelligence/Irodori-TTS-Lite-int4",
        "dacvae_int4.safetensors",
    )
