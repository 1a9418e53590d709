"""benchmarks/roofline.py: the smoke run's tables and JSON, its arithmetic checked independently,
and the full-size v2 GEMM shapes the CUDA fast path runs (built on the meta device)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from irodori_speaker.engine.codec import TINY_CODEC_KWARGS
from irodori_speaker.engine.config import ModelConfig
from irodori_speaker.engine.tiny import TINY_CONFIGS

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "roofline.py"
# one xdist worker runs this module, so its smoke run (a subprocess, `smoke`) runs once
pytestmark = pytest.mark.xdist_group(__name__)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("roofline") / "roofline.json"
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout, json.loads(out.read_text())


def test_tables_and_json_structure(smoke: tuple[str, dict[str, Any]]) -> None:
    text, data = smoke
    for heading in ("## DiT GEMMs per forward", "## Per step", "## Per line", "## Codec decoder", "## CPU"):
        assert heading in text
    assert "| news5 |" in text and "| RTF |" in text
    dit = data["dit"]
    assert data["smoke"] is True
    assert len(dit["lines"]) == 5 and dit["steps_per_line"] == 8
    # independent CFG with text and a reference voice: the conditional row plus one per dropped condition
    assert set(dit["step_rows"]) == {1, 3} and len(dit["step_rows"]) == 8
    assert {g["name"] for g in dit["gemms"]} == {"qkvg", "wo", "w13", "w2"}
    assert len(data["codec"]["convs"]) > 10


def test_gemm_arithmetic(smoke: tuple[str, dict[str, Any]]) -> None:
    """The qkvg and w1/w3 rows of news5 line 1's guided steps, recomputed from the tiny config."""
    _, data = smoke
    cfg = ModelConfig.from_dict(TINY_CONFIGS["v2"])
    D, hidden = cfg.model_dim, int(cfg.model_dim * cfg.mlp_ratio)
    frames = round(1.48 * 25)  # 25 latent frames a second
    M = 3 * math.ceil(frames / 16) * 16  # 3 CFG rows x frames padded to the 16-frame bucket
    rows = {g["name"]: g for g in data["dit"]["gemms"] if g["line"] == 1 and g["guided"]}
    for name, N, K in (("qkvg", 4 * D, D), ("w13", 2 * hidden, D), ("wo", D, D), ("w2", D, hidden)):
        g = rows[name]
        assert (g["M"], g["N"], g["K"]) == (M, N, K)
        assert g["flops"] == 2 * M * N * K
        assert g["parts"]["bf16"] == [2 * N * K + 2 * M * K + 2 * M * N]
        assert g["bf16"]["compute"] == pytest.approx(2 * M * N * K / 790e12)
    # a line's GFLOP is the sum over its steps plus its context K/V; news5's the sum over lines
    lines = data["dit"]["lines"]
    assert data["dit"]["news5"]["GFLOP"] == pytest.approx(sum(ln["summary"]["GFLOP"] for ln in lines))
    step_flops = sum(s["bf16"]["flops"] * s["n_steps"] for s in data["dit"]["steps"] if s["line"] == 1)
    assert lines[0]["bf16"]["flops"] > step_flops


def test_codec_arithmetic(smoke: tuple[str, dict[str, Any]]) -> None:
    _, data = smoke
    codec = data["codec"]
    convs = codec["convs"]
    assert codec["gflop_per_s"] * 1e9 == pytest.approx(sum(r["flops"] for r in convs))
    first = next(r for r in convs if r["name"] == "model.0")  # latent_dim -> decoder_dim, k7, 25 Hz
    cin, cout = TINY_CODEC_KWARGS["latent_dim"], TINY_CODEC_KWARGS["decoder_dim"]
    assert (first["cin"], first["cout"], first["kernel"], first["t_out"]) == (cin, cout, 7, 25)
    assert first["flops"] == 2 * cin * cout * 7 * 25
    assert convs[-1]["cout"] == 1 and convs[-1]["t_out"] == TINY_CODEC_KWARGS["sample_rate"]


def test_full_size_shapes() -> None:
    """The full-size v2 block on the meta device: the fused shapes the CUDA fast path runs."""
    spec = importlib.util.spec_from_file_location("roofline", SCRIPT)
    assert spec is not None and spec.loader is not None
    roofline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roofline)
    cfg = ModelConfig.from_dict(json.loads(roofline.V2_MANIFEST.read_text())["config"])
    shapes = roofline.dit_shapes(cfg)
    assert shapes["cuda"] == {
        "qkvg": (5120, 1280),
        "wo": (1280, 1280),
        "w13": (7360, 1280),
        "w2": (1280, 3680),
    }
    assert shapes["cpu"]["mlp.w1"] == (3680, 1280) and shapes["cpu"]["attention.wq"] == (1280, 1280)
    assert shapes["context"] == {
        "wk_text": (1280, 512),
        "wv_text": (1280, 512),
        "wk_speaker": (1280, 768),
        "wv_speaker": (1280, 768),
    }
