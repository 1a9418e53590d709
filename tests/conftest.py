"""Shared test fixtures: where ../shared lives, and the golden DiT fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("IRODORI_SHARED_DIR", REPO.parent / "shared"))

torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED / "README.md").is_file():
        pytest.skip(f"shared specs/fixtures not found at {SHARED} (set IRODORI_SHARED_DIR)")
    return SHARED


@pytest.fixture(scope="session")
def dit_fixtures(shared_dir: Path) -> Path:
    return shared_dir / "fixtures" / "dit"
