"""Shared test fixtures: where ../shared lives, the golden DiT fixtures, a tiny-random synthesizer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("IRODORI_SHARED_DIR", REPO.parent / "shared"))

# One intra-op thread: the tiny models gain nothing from more, and on a shared 2-core machine
# OpenMP's spinning threads made them ~100x slower whenever the other core was busy.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")  # for the subprocesses tests start


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not (SHARED / "README.md").is_file():
        pytest.skip(f"shared specs/fixtures not found at {SHARED} (set IRODORI_SHARED_DIR)")
    return SHARED


@pytest.fixture(scope="session")
def dit_fixtures(shared_dir: Path) -> Path:
    return shared_dir / "fixtures" / "dit"


@pytest.fixture(scope="module")
def irodori_home(tmp_path_factory):
    """A fresh IRODORI_CACHE for one test module (tiny-random files, voices, phrase caches)."""
    mp = pytest.MonkeyPatch()
    home = tmp_path_factory.mktemp("irodori-home")
    mp.setenv("IRODORI_CACHE", str(home))
    yield home
    mp.undo()


@pytest.fixture(scope="module")
def synth(irodori_home):
    """The tiny-random v2 synthesizer on the CPU (its output is noise), one per module."""
    from irodori_speaker.synthesizer import load_synthesizer

    return load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False)
