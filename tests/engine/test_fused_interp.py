"""test_fused.py and test_fused_text.py under Triton's CPU interpreter (in a subprocess), and the
fused path's fall-back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (the 'cuda' / 'dev' extra)")


# a hang guard, not a speed bound: ~2 minutes on a quiet 2-core machine, past pytest's 300 s on a busy one.
# Its own xdist group: `--dist loadgroup` sends groups out before single tests, so the suite's
# longest test starts early instead of running on after everything else is done
@pytest.mark.xdist_group("fused-interp")
@pytest.mark.timeout(1800)
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU test_fused.py runs natively")
def test_fused_kernels_in_the_interpreter():
    here = Path(__file__).parent
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    files = [str(here / name) for name in ("test_fused.py", "test_fused_text.py", "test_fused_duration.py")]
    args = ["-q", "-rs", "-o", "addopts=", "-p", "no:cacheprovider", *files]
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    tail = proc.stdout[-3000:] + proc.stderr[-2000:]
    assert proc.returncode == 0, tail
    # every test runs but those of the GPU's own instructions (their skip reason: "the interpreter
    # has none"); any other skip, the whole module's first (no interpreter), fails
    skips = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert " passed" in proc.stdout and all("the interpreter has none" in s for s in skips), tail


def test_a_failing_kernel_switches_the_fused_path_off(monkeypatch):
    from irodori_speaker.engine import fused

    monkeypatch.setattr(fused, "_FAILED", [])
    monkeypatch.setattr(fused, "HAS_TRITON", True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert fused.fused_available(torch.device("cpu"))

    def broken():
        raise RuntimeError("PTX assembly aborted")

    with pytest.warns(UserWarning, match="switched off.*PTX assembly aborted"):
        assert fused.run_or_fall_back(broken, lambda: 42) == 42
    assert not fused.fused_available(torch.device("cpu"))
    assert fused.run_or_fall_back(lambda: 7, lambda: 42) == 7  # a later call may still run it
