"""The pre-commit config CONTRIBUTING.md tells contributors to install is valid and runs ruff."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_precommit_config_is_valid_and_runs_ruff() -> None:
    exe = pre_commit()
    if exe is None:
        pytest.skip("pre-commit is not installed (the dev extra brings it)")
    cfg = REPO / ".pre-commit-config.yaml"
    out = subprocess.run([exe, "validate-config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    text = cfg.read_text(encoding="utf-8")
    assert "ruff check" in text and "ruff format --check" in text


def pre_commit() -> str | None:
    """The pre-commit of this environment (.venv/bin beside the running Python: the venv need not
    be activated), else one on PATH."""
    here = Path(sys.executable).parent / ("pre-commit.exe" if sys.platform == "win32" else "pre-commit")
    return str(here) if here.is_file() else shutil.which("pre-commit")


def test_pre_commit_is_found_in_the_running_environment_without_path(monkeypatch):
    if not (Path(sys.executable).parent / "pre-commit").is_file():
        pytest.skip("this environment has no pre-commit")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert pre_commit() == str(Path(sys.executable).parent / "pre-commit")
