"""The runtime side is torch-free: a bot that imports the Speaker, its events, the phrase cache,
the options and the outputs does not pay for torch (~0.75 s and hundreds of MB) until a model
loads. Checked in a fresh interpreter, where nothing else has imported torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

MODULES = [
    "irodori_speaker",
    "irodori_speaker.speaker",
    "irodori_speaker.speaker.events",
    "irodori_speaker.cache",
    "irodori_speaker.options",
    "irodori_speaker.speaker.lines",
    "irodori_speaker.outputs",
    "irodori_speaker.audio.lipsync",
    "irodori_speaker.errors",
]


@pytest.mark.parametrize("module", MODULES)
def test_importing_loads_no_torch(module: str) -> None:
    code = (
        "import sys\n"
        f"import {module}\n"
        "from irodori_speaker import Speaker, SynthesisOptions, LineOptions\n"
        "SynthesisOptions(seed=1, steps=4); LineOptions(priority='high')\n"
        "Speaker(output='null', tags={'happy': {'options': {'speed': 1.1}}})\n"  # built, not opened
        "heavy = sorted(m for m in ('torch', 'triton', 'safetensors.torch') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "", f"importing {module} loaded {out.stdout.strip()}"
