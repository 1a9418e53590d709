"""End to end with the real Synthesizer on the tiny random model: three lines into one WAV."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf

from irodori_speaker.options import SynthesisOptions
from irodori_speaker.outputs import FileOutput
from irodori_speaker.speaker import Speaker, UtteranceState

LINES = ["こんにちは。", "今日はいい天気ですね。", "さようなら。"]


@pytest.mark.slow
def test_three_lines_to_the_file_sink_make_one_continuous_wav_in_order(run, tmp_path):
    path = tmp_path / "three.wav"
    pause = 0.25

    async def body():
        async with Speaker(
            output=FileOutput(path, subtype="FLOAT"),
            pause_s=pause,
            options=SynthesisOptions(steps=2, seconds=0.4, seed=1),  # short and cheap on a 2-core CPU
            tiny_random=True,
            voice_cache_dir=False,
        ) as s:
            assert s.prewarm_seconds  # prewarmed through the real synthesizer
            return [await s.say(t) for t in LINES]

    hs = run(body(), timeout=240)
    assert [h.state for h in hs] == [UtteranceState.PLAYED] * 3
    audio, sr = sf.read(path, dtype="float32")
    assert sr == 48_000 and audio.ndim == 1
    gap = np.zeros(round(pause * sr), np.float32)
    parts = [hs[0].audio, gap, hs[1].audio, gap, hs[2].audio]
    assert all(len(h.audio) > 0 and np.any(h.audio != 0) for h in hs)
    np.testing.assert_array_equal(audio, np.concatenate(parts))
    assert [h.record.text for h in hs] == LINES
