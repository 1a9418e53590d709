"""benchmarks/server_load.py: a burst on a real server (news5's tiny files on the CPU preset, real
uvicorn on loopback, httpx), and its fall-back to OpenAI requests where the server lacks pyopenjtalk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "server_load.py"

pytestmark = pytest.mark.slow


def _burst(tmp_path: Path, pythonpath: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "server_load.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "-n", "4", "--full", "smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=pythonpath),
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return run, json.loads(out.read_text())


def test_the_default_burst_mixes_voicevox_pairs_and_openai_requests_none_lost(tmp_path: Path) -> None:
    run, figures = _burst(tmp_path, str(REPO / "src"))
    assert figures["routes"] == ["voicevox", "openai"] and figures["note"] is None
    assert figures["serve_args"] == ["--no-cache"]  # serve's own queue and admission defaults
    groups = {k: (g["requests"], g["ok"], g["rejected"], g["lost"]) for k, g in figures["groups"].items()}
    assert groups == {"voicevox": (2, 2, 0, 0), "openai": (2, 2, 0, 0), "all": (4, 4, 0, 0)}
    assert figures["rejected_in_metrics"] == 0 and figures["server_exit"] == 130  # Ctrl-C, graceful
    for g in figures["groups"].values():
        assert 0 < g["ttfb_p50_s"] <= g["ttfb_p95_s"] and g["ttfb_p95_s"] <= g["total_p95_s"]
    assert "| voicevox | 2 | 2 | 0 | 0 |" in run.stdout


def test_a_server_without_pyopenjtalk_gets_openai_requests_only_with_a_note(tmp_path: Path) -> None:
    # stands in for the H200 image, which lacks pyopenjtalk: a package of that name that fails to
    # import, ahead of the installed one on the server's path
    shadow = tmp_path / "no_openjtalk" / "pyopenjtalk"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("not on this image")\n')
    run, figures = _burst(tmp_path, os.pathsep.join([str(shadow.parent), str(REPO / "src")]))
    assert figures["routes"] == ["openai"]
    assert "pyopenjtalk" in figures["note"] and "note: VOICEVOX pairs left out" in run.stdout
    assert figures["groups"]["all"] == {**figures["groups"]["all"], "requests": 4, "ok": 4, "lost": 0}
    assert set(figures["groups"]) == {"openai", "all"}
