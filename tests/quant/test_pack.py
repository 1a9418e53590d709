"""The compact int4 packing (every layer GPTQ does not cover RTN-packed, as the seed's
Irodori-TTS-Lite dit_int4.safetensors is) against the older fp16-remainder files: size from the
full-size manifests, the files of tiny models of each family, ragged RTN groups, the CLI."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch import nn

from irodori_speaker.engine.checkpoint import load_checkpoint
from irodori_speaker.engine.quant.checkpoint import load_int4_checkpoint, load_int4_model
from irodori_speaker.engine.quant.formats import RTNPacked, rtn_quantize
from irodori_speaker.engine.quant.layers import Int4Linear, RTNLinear
from irodori_speaker.engine.quant.quantize import PACKINGS, quantize_checkpoint
from irodori_speaker.engine.quant.selection import SEED_DIT_INT4_BYTES, int4_file_bytes
from irodori_speaker.engine.sampler import SamplerConfig
from irodori_speaker.engine.tiny import random_line_latent, tiny_random_files
from irodori_speaker.errors import QuantError

DATA = Path(__file__).resolve().parents[1] / "data"
V2 = DATA / "dit" / "v2_500m_keys.json"
V3 = DATA / "dit" / "v3_500m_keys.json"
V41 = DATA / "dit_v4" / "v4_1_small_mf_keys.json.gz"
LARGE = DATA / "dit_v4_large" / "v4_large_keys.json.gz"
V2_PARAMETERS = 494_993_952  # the seed's fp32 file is 4 x this (1888 MiB): its dit_int4 is v2
STD_KEYS = (
    "quant_method",
    "checkpoint_format",
    "quant_layers_json",
    "extra_quant_layers_json",
    "embed_quant_layers_json",
)


def _manifest(path: Path) -> dict:
    with gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open() as f:
        return json.load(f)


def _file_bytes(path: Path, packing: str) -> int:
    m = _manifest(path)
    return sum(
        int4_file_bytes(m["tensors"], PACKINGS[packing], metadata={"config_json": json.dumps(m["config"])})
    )


def test_full_size_v2_is_as_small_as_the_seeds_file() -> None:
    m = _manifest(V2)
    assert m["num_parameters"] == V2_PARAMETERS
    data, header = int4_file_bytes(m["tensors"], metadata={"config_json": json.dumps(m["config"])})
    # the header is estimated (a few hundred bytes high on real files, below); the source file's own
    # metadata adds a few KB more, well inside the 2.5 MB left
    assert data + header <= SEED_DIT_INT4_BYTES - 2_000_000
    old = _file_bytes(V2, "fp16-rest")
    assert 411 * 2**20 < old < 413 * 2**20  # the ~412 MiB our older files have
    # v3 adds a 17 M-parameter duration predictor: as dense as the seed, byte for parameter
    assert _file_bytes(V3, "compact") / _manifest(V3)["num_parameters"] <= SEED_DIT_INT4_BYTES / V2_PARAMETERS


@pytest.mark.parametrize("path", [V41, LARGE], ids=["v4.1-mf", "v4-large"])
def test_the_compact_packing_shrinks_the_v4_files_too(path: Path) -> None:
    m = _manifest(path)
    compact, old = _file_bytes(path, "compact"), _file_bytes(path, "fp16-rest")
    assert compact < 0.8 * old
    assert compact / m["num_parameters"] < 0.6  # bytes a parameter (fp16: 2)


@pytest.mark.parametrize("kind", ["v3", "v4.1-mf", "v4-large"])
def test_the_size_estimate_is_the_written_files(tmp_path: Path, kind: str) -> None:
    src = tiny_random_files(kind).model
    with safe_open(str(src), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    for packing, selection in PACKINGS.items():
        out = tmp_path / f"{packing}.safetensors"
        quantize_checkpoint(src, out, method="rtn", packing=packing, report_errors=False)
        with safe_open(str(out), "pt") as f:
            meta = {k: v for k, v in (f.metadata() or {}).items() if k not in STD_KEYS}
        data, header = int4_file_bytes(shapes, selection, metadata=meta)
        real = out.stat().st_size
        assert 0 <= data + header - real <= 256, (packing, data + header, real)


def _latent(model, seed: int) -> torch.Tensor:
    return random_line_latent(
        model, seed, text=10, reference=16, caption=5, frames=30, cfg=SamplerConfig(steps=6, schedule="sway")
    )


# final latent of RTN files on the tiny random models (6 sway steps, seeds 0-1), relative error
# against the fp32 model's, measured: fp16-rest / compact  v2 0.0024 / 0.0045, v3 0.0024 / 0.0045,
# v4.1-mf 0.0020 / 0.0028, v4-large 0.0022 / 0.0037. Stated tolerance: compact within 0.02 of the
# fp16-rest file's latent (relative), and within 0.02 of the fp32 model's.
LATENT_TOL = 0.02


@pytest.mark.parametrize("kind", ["v2", "v3", "v4.1-mf", "v4-large"])
def test_compact_files_load_strictly_and_sample_like_the_fp16_rest_files(tmp_path: Path, kind: str) -> None:
    src = tiny_random_files(kind).model
    ref = load_checkpoint(src).model
    files, latents = {}, {}
    for packing in PACKINGS:
        files[packing] = out = tmp_path / f"{packing}.safetensors"
        quantize_checkpoint(src, out, method="rtn", packing=packing, report_errors=False)
        model = load_int4_model(out, dtype="fp32").model  # strict: any missing / extra tensor raises
        latents[packing] = [_latent(model, s) for s in (0, 1)]
    for seed, (z_old, z_new) in enumerate(zip(latents["fp16-rest"], latents["compact"])):
        z_ref = _latent(ref, seed)
        assert float((z_new - z_old).norm() / z_old.norm()) < LATENT_TOL, seed
        assert float((z_new - z_ref).norm() / z_ref.norm()) < LATENT_TOL, seed
    assert files["compact"].stat().st_size < 0.75 * files["fp16-rest"].stat().st_size
    compact = load_int4_model(files["compact"], dtype="fp32").model
    left_float = {"in_proj", "out_proj", "speaker_encoder.in_proj", "duration_predictor.token_out_proj"}
    assert {n for n, m in compact.named_modules() if type(m) is nn.Linear} <= left_float
    adaln = compact.blocks[0].attention_adaln
    assert isinstance(adaln.shift_down, Int4Linear) and isinstance(adaln.shift_up, (Int4Linear, RTNLinear))
    assert isinstance(compact.cond_module[0], Int4Linear)
    ckpt = load_int4_checkpoint(files["compact"])
    matrices = {k[: -len(".weight")] for k, t in ckpt.tensors.items() if t.dim() == 2}
    assert all(n in left_float or n.endswith("_norm") for n in matrices), matrices  # + RMSNorm (heads, dim)


def test_compact_files_read_back_exactly_as_quantised(tmp_path: Path) -> None:
    src = tiny_random_files("v3").model
    rep = quantize_checkpoint(src, tmp_path / "c.safetensors", method="rtn", report_errors=False)
    assert rep.plan.rtn and rep.plan.extra and not rep.plan.kept
    assert all(rep.used[n] == "rtn" for n in rep.plan.rtn)
    ckpt = load_int4_checkpoint(tmp_path / "c.safetensors")
    for name in rep.plan.rtn:
        assert torch.equal(ckpt.gptq[name].dequantize(), rep.dequantised[name]), name
    for name in rep.plan.extra:
        assert torch.equal(ckpt.extra[name].dequantize(), rep.dequantised[name]), name
    w = load_checkpoint(src).model.state_dict()
    for name in rep.plan.extra:  # within one 4-bit step (half a step, plus the zero's rounding)
        err = (rep.dequantised[name] - w[f"{name}.weight"]).abs().max()
        assert float(err) <= float(ckpt.extra[name].scales.float().max()) + 1e-6, name


def test_ragged_rtn_groups() -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 71, generator=g)  # 71 columns in groups of at most 32: 3 groups of 24, 24, 23
    p = rtn_quantize(w, group_size=32, ragged=True)
    assert p.num_groups == 3 and p.group_cols == 24 and p.qweight_u8.shape == (6, 36)
    deq = p.dequantize()
    for lo, hi in ((0, 24), (24, 48), (48, 71)):  # each group quantised on its own range
        part = rtn_quantize(w[:, lo:hi].contiguous(), group_size=None)
        assert torch.equal(deq[:, lo:hi], part.dequantize())
    with pytest.raises(QuantError, match="not a multiple"):
        rtn_quantize(w, group_size=32)  # without ragged: refused as before
    # 13 groups of ceil(71 / 13) = 6: 12 of them cover 72 columns, the 13th would be empty
    with pytest.raises(QuantError, match="cannot be split into 13 groups"):
        RTNPacked(p.qweight_u8, torch.zeros(6, 13).half(), torch.zeros(6, 13).half(), 6, 71, 13)
    assert torch.equal(RTNLinear(p)(torch.eye(71)), deq.t())


def test_cli_quantize_writes_the_compact_file_by_default(tmp_path: Path) -> None:
    src = tiny_random_files("v2").model
    sizes = {}
    for extra in ([], ["--packing", "fp16-rest"]):
        dst = tmp_path / f"q{len(extra)}.safetensors"
        cli = [sys.executable, "-m", "irodori_speaker.cli", "quantize", str(src), "-o", str(dst)]
        r = subprocess.run(
            [*cli, "--method", "rtn", "--no-report", *extra],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        sizes[extra[-1] if extra else "default"] = dst.stat().st_size
        assert ("fp16-rest" if extra else "compact") in r.stdout
        model = load_int4_model(dst).model
        assert isinstance(model.cond_module[0], Int4Linear) == (not extra)
    assert sizes["default"] < 0.75 * sizes["fp16-rest"]
