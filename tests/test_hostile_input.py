"""Issue 12, tracebacks: text that is not valid Unicode or not UTF-8 (lone surrogates, Shift_JIS
bytes on the command line and on stdin) becomes speech or one clear error, never a traceback; the
module's Speaker then speaks a normal line (tests/hostile.py). The command-line cases run `say` in
a fresh process each, so no Speaker outlives a case there."""

from __future__ import annotations

import numpy as np
import pytest

from hostile import one_line, real_audio, run, speaks_normally


def test_a_lone_surrogate_is_dropped_everywhere(synth, tmp_path, hostile_loop, hostile_speaker) -> None:
    """Issue 12: "\\ud800" raised UnicodeEncodeError from the tokenizer and from the cache."""
    from irodori_speaker.cache import PhraseCache

    assert synth.spoken_text("こん\ud800にちは\udfff") == synth.spoken_text("こんにちは")
    res = synth.synthesize("こん\ud800にちは", options={"seed": 1, "seconds": 0.5})
    assert res.audio.size > 0
    with PhraseCache(tmp_path / "phrases") as pc:
        assert pc.lookup(synth, "こん\ud800にちは") is None  # a miss, not a traceback
        _line, hit = pc.render(synth, "こん\ud800にちは", options=synth.resolve_options({"seed": 1}))
        assert not hit and pc.lookup(synth, "こんにちは", options=synth.resolve_options({"seed": 1}))

    async def case():
        h = await hostile_speaker.say("こん\ud800にちは\udfff")
        real_audio(h.audio)
        await speaks_normally(hostile_speaker)

    run(hostile_loop, case())


def _say(home, text_arg: bytes | None, stdin: bytes | None = None):
    import os
    import subprocess
    import sys

    env = dict(os.environ, IRODORI_CACHE=str(home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    args = [b"say", text_arg if text_arg is not None else b"-", b"-o", b"out.wav", b"--tiny-random"]
    args += [b"--backend", b"cpu", b"--steps", b"2", b"--seconds", b"0.5"]
    return subprocess.run(
        [sys.executable.encode(), b"-m", b"irodori_speaker.cli", *args],
        env=env,
        input=stdin,
        capture_output=True,
        timeout=240,
        cwd=home,
    )


@pytest.mark.timeout(300)
def test_shift_jis_text_on_the_command_line_and_stdin_is_read(tmp_path) -> None:
    sjis = "こんにちは".encode("cp932")
    for arg, stdin in ((sjis, None), (None, sjis)):
        p = _say(tmp_path, arg, stdin)
        assert p.returncode == 0, p.stderr.decode(errors="replace")
        assert b"Shift_JIS" in p.stderr and b"Traceback" not in p.stderr
        assert (tmp_path / "out.wav").stat().st_size > 44
        (tmp_path / "out.wav").unlink()
    p = _say(tmp_path, b"abc\x81\x7f")  # neither UTF-8 nor cp932
    err = p.stderr.decode(errors="replace")
    assert p.returncode == 1 and "Traceback" not in err
    assert "neither UTF-8 nor Shift_JIS" in err and "hint:" in err


@pytest.mark.parametrize("bad", [np.full(4800, np.nan, np.float32), np.full((4800, 2), np.inf, np.float32)])
def test_voice_from_array_refuses_nan_and_inf(bad, hostile_loop, hostile_speaker) -> None:
    from irodori_speaker.errors import AudioError
    from irodori_speaker.synthesis.voices import Voice

    with pytest.raises(AudioError, match="NaN or Inf") as e:
        Voice.from_array(bad, 48_000)
    one_line(e.value)
    run(hostile_loop, speaks_normally(hostile_speaker))
