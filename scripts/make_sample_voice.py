"""Make the sample reference voice shipped in the package (src/irodori_speaker/data/sample_voice.opus).

    apt-get install espeak-ng          # Debian / Ubuntu (eSpeak NG 1.51 made the shipped file)
    .venv/bin/python scripts/make_sample_voice.py

eSpeak NG's Japanese voice (formant synthesis, no recording of anyone) reads one sentence; the
clip is trimmed, resampled to 48 kHz, gently saturated, set to -15 LUFS and stored as Opus
(~34 kB, 4.4 s). The
program's output is not covered by eSpeak NG's GPL; the clip is ours, dedicated to the public
domain (CC0 1.0: src/irodori_speaker/data/SAMPLE_VOICE.md).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyloudnorm as pyln
import soundfile as sf

from irodori_speaker.audio.signal import SAMPLE_RATE, resample

TEXT = "こんにちは。いろどりスピーカーです。よろしくおねがいします。"
OUT = Path(__file__).resolve().parents[1] / "src" / "irodori_speaker" / "data" / "sample_voice.opus"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "ja.wav"
        subprocess.run(
            ["espeak-ng", "-v", "ja+f3", "-s", "165", "-p", "60", "-w", str(wav), TEXT], check=True
        )
        x, rate = sf.read(str(wav), dtype="float32")
    loud = np.flatnonzero(np.abs(x) > 0.01)
    x = x[max(0, loud[0] - int(0.05 * rate)) : loud[-1] + int(0.15 * rate)]
    y = resample(x, rate, SAMPLE_RATE)
    # formant speech has a high crest factor: a gentle tanh saturation, then -15 LUFS, so the
    # reference's -16 LUFS normalisation only turns it down (no peak limiting, no warning)
    y = np.tanh(2.0 * y / np.abs(y).max()) / np.tanh(2.0)
    y = (y * 10 ** ((-15.0 - pyln.Meter(SAMPLE_RATE).integrated_loudness(y)) / 20)).astype(np.float32)
    sf.write(str(OUT), y, SAMPLE_RATE, format="OGG", subtype="OPUS")
    print(f"wrote {OUT} ({len(y) / SAMPLE_RATE:.1f} s, {OUT.stat().st_size / 1000:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
