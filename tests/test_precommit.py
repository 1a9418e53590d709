"""The pre-commit config CONTRIBUTING.md tells contributors to install is valid and runs ruff."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_precommit_config_is_valid_and_runs_ruff() -> None:
    exe = shutil.which("pre-commit")
    if exe is None:
        pytest.skip("pre-commit is not installed (the dev extra brings it)")
    cfg = REPO / ".pre-commit-config.yaml"
    out = subprocess.run([exe, "validate-config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    text = cfg.read_text(encoding="utf-8")
    assert "ruff check" in text and "ruff format --check" in text
