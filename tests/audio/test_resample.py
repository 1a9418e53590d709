"""One sample rate and one resampler: `audio.signal.SAMPLE_RATE`, `resample` (a whole array) and
`StreamResampler` (chunk by chunk), which no chunking can tell apart; and src/ holds no other."""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import numpy as np
import pytest

import irodori_speaker
from irodori_speaker.audio.signal import SAMPLE_RATE, StreamResampler, resample

PACKAGE = Path(irodori_speaker.__file__).parent
HOME = PACKAGE / "audio" / "signal.py"  # where the rate is defined and soxr is called
ALLOWED = "not SAMPLE_RATE"  # a comment saying a 48000 is some other thing's rate (Opus's)


def _noise(n: int, channels: int | None = None, seed: int = 0) -> np.ndarray:
    shape = (n,) if channels is None else (n, channels)
    return (0.3 * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def _streamed(r: StreamResampler, x: np.ndarray, cuts: list[int]) -> np.ndarray:
    bounds = np.cumsum(cuts)
    pieces = np.split(x, bounds[bounds < len(x)])
    return np.concatenate([r.feed(p) for p in pieces] + [r.flush()])


CUTS = {
    "whole": [10**9],
    "odd": [1, 7, 1920, 333, 0, 4000, 10],
    "blocks": [960] * 60,
    "samples": [1] * 300 + [10**9],
}


@pytest.mark.parametrize("to_hz", [8_000, 16_000, 24_000, 44_100, 96_000, SAMPLE_RATE])
@pytest.mark.parametrize("cuts", list(CUTS), ids=list(CUTS))
def test_a_stream_equals_the_whole_array(to_hz: int, cuts: str) -> None:
    x = _noise(SAMPLE_RATE // 2)
    whole = resample(x, SAMPLE_RATE, to_hz)
    y = _streamed(StreamResampler(SAMPLE_RATE, to_hz), x, CUTS[cuts])
    assert y.dtype == np.float32 and y.shape == whole.shape
    np.testing.assert_allclose(y, whole, atol=1e-6)


def test_multichannel_streams_and_equal_rates_pass_through() -> None:
    x = _noise(12_000, channels=2)
    y = _streamed(StreamResampler(SAMPLE_RATE, 22_050, channels=2), x, [1000, 5, 7000, 4000])
    np.testing.assert_allclose(y, resample(x, SAMPLE_RATE, 22_050), atol=1e-6)
    same = StreamResampler(SAMPLE_RATE, SAMPLE_RATE)
    chunk = _noise(480)
    out = same.feed(chunk)
    np.testing.assert_array_equal(out, chunk)
    assert out is not chunk and same.flush().shape == (0,)


def test_flush_and_reset_leave_it_ready_for_a_new_stream() -> None:
    a, b = _noise(5000, seed=1), _noise(7000, seed=2)
    want = resample(b, SAMPLE_RATE, 16_000)
    r = StreamResampler(SAMPLE_RATE, 16_000)
    _streamed(r, a, [1234])  # ends in flush
    np.testing.assert_allclose(_streamed(r, b, [333, 4000]), want, atol=1e-6)
    r.feed(a[:2500])  # abandoned halfway
    r.reset()
    np.testing.assert_allclose(_streamed(r, b, [10**9]), want, atol=1e-6)


# --------------------------------------------------------------------------- the rule in src/


def _sources() -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    assert HOME in files and len(files) > 50
    return files


def test_only_the_audio_signal_module_imports_soxr() -> None:
    offenders = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if path != HOME and any(n == "soxr" or n.startswith("soxr.") for n in names):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == [], "resample through audio.signal (resample, StreamResampler), not soxr"


def test_no_second_sample_rate_in_src() -> None:
    """No bare 48000 in code (docstrings and comments may say it) but `SAMPLE_RATE = 48_000`
    itself, and no other module-level name for it."""
    offenders = []
    for path in _sources():
        text = path.read_text()
        lines = text.splitlines()
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type != tokenize.NUMBER:
                continue
            if ast.literal_eval(tok.string) != SAMPLE_RATE:
                continue
            line = lines[tok.start[0] - 1]
            if (path == HOME and line.startswith("SAMPLE_RATE = ")) or ALLOWED in line:
                continue
            offenders.append(f"{path.relative_to(PACKAGE)}:{tok.start[0]}: {line.strip()}")
        for node in ast.parse(text).body:  # aliases: OTHER_RATE = SAMPLE_RATE
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Name)
                and node.value.id == "SAMPLE_RATE"
            ):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == [], "use irodori_speaker.audio.signal.SAMPLE_RATE"
