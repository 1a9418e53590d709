"""The audio helpers and the reference-voice front end (mono, 48 kHz, -16 LUFS, peak <= 1, <= 30 s)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyloudnorm
import pytest
import soundfile as sf
import torch

from irodori_speaker.audio.signal import (
    SAMPLE_RATE,
    loudness_lufs,
    normalize_loudness,
    peak_limit,
    prepare_reference,
    read_audio,
    resample,
    to_mono,
)
from irodori_speaker.engine.codec import TINY_CODEC_KWARGS, codec_from_state_dict, random_codec_state_dict
from irodori_speaker.errors import AudioError, InputError

SR = SAMPLE_RATE


def _sine(freq: float, seconds: float, sr: int, amp: float = 0.5) -> np.ndarray:
    t = np.arange(round(seconds * sr)) / sr
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _noise(
    seconds: float, sr: int, scale: float = 0.1, channels: int | None = None, seed: int = 0
) -> np.ndarray:
    shape = (round(seconds * sr),) if channels is None else (round(seconds * sr), channels)
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def _pyloudnorm(x: np.ndarray, sr: int) -> float:
    return pyloudnorm.Meter(sr).integrated_loudness(x.astype(np.float64))


@pytest.fixture(scope="module")
def codec():
    state = random_codec_state_dict(TINY_CODEC_KWARGS, seed=0, watermark=False)
    return codec_from_state_dict(state, TINY_CODEC_KWARGS)


# --------------------------------------------------------------------------- read_audio


def test_read_audio_stereo_wav(tmp_path: Path) -> None:
    data = np.stack([_sine(440, 0.5, 22050), _sine(660, 0.5, 22050, 0.25)], axis=1)
    sf.write(tmp_path / "s.wav", data, 22050, subtype="FLOAT")
    x, sr = read_audio(tmp_path / "s.wav")
    assert sr == 22050 and x.dtype == np.float32 and x.shape == data.shape
    np.testing.assert_allclose(x, data, atol=1e-7)
    sf.write(tmp_path / "m.flac", data[:, 0], 22050)
    x, sr = read_audio(str(tmp_path / "m.flac"))
    assert x.shape == (data.shape[0], 1) and sr == 22050


def test_read_audio_errors(tmp_path: Path) -> None:
    with pytest.raises(AudioError, match="not found"):
        read_audio(tmp_path / "missing.wav")
    with pytest.raises(AudioError, match="directory"):
        read_audio(tmp_path)
    (tmp_path / "notes.wav").write_text("this is text, not audio\n" * 20)
    with pytest.raises(AudioError, match="cannot read audio file"):
        read_audio(tmp_path / "notes.wav")
    (tmp_path / "noise.bin").write_bytes(np.random.default_rng(1).bytes(4096))
    with pytest.raises(AudioError, match="cannot read audio file"):
        read_audio(tmp_path / "noise.bin")
    sf.write(tmp_path / "empty.wav", np.zeros((0, 1), dtype=np.float32), SR)
    with pytest.raises(AudioError, match="no samples"):
        read_audio(tmp_path / "empty.wav")
    wav = tmp_path / "cut.wav"
    sf.write(wav, _sine(440, 0.2, SR), SR)
    (tmp_path / "header.wav").write_bytes(wav.read_bytes()[:30])
    with pytest.raises(AudioError):
        read_audio(tmp_path / "header.wav")


# --------------------------------------------------------------------------- to_mono / resample


def test_to_mono() -> None:
    left, right = _sine(440, 0.1, SR), _noise(0.1, SR)
    np.testing.assert_allclose(to_mono(np.stack([left, right], axis=1)), (left + right) / 2, atol=1e-7)
    np.testing.assert_array_equal(to_mono(left), left)
    assert to_mono((left * 32767).astype(np.int16)).dtype == np.float32
    with pytest.raises(InputError):
        to_mono(np.zeros((2, 3, 4), dtype=np.float32))
    with pytest.raises(InputError, match="channels, samples"):
        to_mono(np.zeros((2, 48000), dtype=np.float32))


@pytest.mark.parametrize("sr_in", [8000, 16000, 44100, 96000])
def test_resample_keeps_a_sine(sr_in: int) -> None:
    x = _sine(1000, 0.5, sr_in)
    y = resample(x, sr_in, SR)
    assert y.dtype == np.float32 and abs(y.shape[0] - 0.5 * SR) <= 1
    want = _sine(1000, 0.5, SR)
    mid = slice(2000, 22000)  # away from the filter's edge transients
    np.testing.assert_allclose(y[mid], want[mid], atol=2e-3)


def test_resample_multichannel_and_identity() -> None:
    x = np.stack([_sine(500, 0.3, 44100), _sine(2000, 0.3, 44100, 0.1)], axis=1)
    y = resample(x, 44100, SR)
    assert y.shape[1] == 2 and abs(y.shape[0] - round(0.3 * SR)) <= 1
    for ch in range(2):
        np.testing.assert_allclose(y[:, ch], resample(x[:, ch], 44100, SR), atol=1e-6)
    same = resample(x, 44100, 44100)
    np.testing.assert_array_equal(same, x)
    assert same is not x
    with pytest.raises(InputError, match="to_hz"):
        resample(x, 44100, 0)


# --------------------------------------------------------------------------- loudness


@pytest.mark.parametrize("amp_db", [0.0, -20.0, -35.0])
def test_loudness_of_a_1khz_sine(amp_db: float) -> None:
    """BS.1770: a 1 kHz sine in one channel reads 3.01 dB below its peak level."""
    x = _sine(1000, 3.0, SR, amp=10 ** (amp_db / 20))
    assert loudness_lufs(x, SR) == pytest.approx(amp_db - 3.01, abs=0.1)
    assert loudness_lufs(x, SR) == pytest.approx(_pyloudnorm(x, SR), abs=1e-6)


@pytest.mark.parametrize(
    ("signal", "sr"),
    [(_sine(1000, 2.0, SR, 0.05), SR), (_noise(2.0, SR, 0.3), SR), (_noise(1.5, 16000, 0.01, seed=4), 16000)],
)
def test_normalize_loudness_hits_the_target(signal: np.ndarray, sr: int) -> None:
    for target in (-16.0, -23.0):
        y = normalize_loudness(signal, sr, target)
        assert _pyloudnorm(y, sr) == pytest.approx(target, abs=0.1)
        # a pure gain
        ratio = y / np.where(signal == 0, 1, signal)
        assert np.allclose(ratio[signal != 0], ratio[signal != 0][0], rtol=1e-5)


def test_short_signals_are_measured_as_repeated() -> None:
    """Under one 0.4 s block: the loudness of the signal repeated (a steady tone reads as a long one)."""
    long = loudness_lufs(_sine(997, 3.0, SR, 0.2), SR)
    for seconds in (0.3, 0.1, 0.02):
        assert loudness_lufs(_sine(997, seconds, SR, 0.2), SR) == pytest.approx(long, abs=0.1)
    y = normalize_loudness(_noise(0.1, SR), SR)
    assert loudness_lufs(y, SR) == pytest.approx(-16.0, abs=0.05)
    assert _pyloudnorm(np.tile(y, 5), SR) == pytest.approx(-16.0, abs=0.2)


def test_silence_is_left_alone() -> None:
    silence = np.zeros(SR, dtype=np.float32)
    assert loudness_lufs(silence, SR) == -math.inf
    np.testing.assert_array_equal(normalize_loudness(silence, SR), silence)


def test_peak_limit() -> None:
    np.testing.assert_allclose(peak_limit(np.array([0.5, -2.0, 1.0], dtype=np.float32)), [0.25, -1.0, 0.5])
    quiet = np.array([0.5, -0.9], dtype=np.float32)
    np.testing.assert_array_equal(peak_limit(quiet), quiet)
    np.testing.assert_allclose(peak_limit(quiet, peak=0.45), [0.25, -0.45], rtol=1e-6)
    with pytest.raises(InputError):
        peak_limit(quiet, peak=0)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_samples_are_rejected(bad: float) -> None:
    x = _noise(0.5, SR)
    x[100] = bad
    for fn in (
        lambda: loudness_lufs(x, SR),
        lambda: normalize_loudness(x, SR),
        lambda: peak_limit(x),
        lambda: resample(x, SR, 16000),
        lambda: prepare_reference(x, sr=SR),
    ):
        with pytest.raises(AudioError, match="NaN or inf"):
            fn()


def test_empty_audio() -> None:
    empty = np.zeros(0, dtype=np.float32)
    with pytest.raises(AudioError, match="no samples"):
        prepare_reference(empty, sr=SR)
    with pytest.raises(AudioError, match="empty"):
        loudness_lufs(empty, SR)


# --------------------------------------------------------------------------- prepare_reference


def _check_reference(y: np.ndarray, seconds: float) -> None:
    assert y.dtype == np.float32 and y.ndim == 1
    assert abs(y.shape[0] - seconds * SR) <= 2
    assert np.abs(y).max() <= 1.0
    assert _pyloudnorm(y, SR) == pytest.approx(-16.0, abs=0.1)


def test_prepare_reference_from_a_stereo_file(tmp_path: Path) -> None:
    data = _noise(2.0, 44100, 0.02, channels=2)
    sf.write(tmp_path / "ref.wav", data, 44100, subtype="PCM_16")
    y, warnings = prepare_reference(tmp_path / "ref.wav")
    _check_reference(y, 2.0)
    assert warnings == []
    with pytest.raises(InputError, match="own sample rate"):
        prepare_reference(tmp_path / "ref.wav", sr=44100)


@pytest.mark.parametrize("sr", [8000, 16000, 44100, 96000])
def test_prepare_reference_rates(sr: int) -> None:
    speechlike = _sine(220, 1.5, sr, 0.1) + _noise(1.5, sr, 0.01)
    y, warnings = prepare_reference(speechlike, sr=sr)
    _check_reference(y, 1.5)
    assert warnings == []


def test_prepare_reference_int16_array() -> None:
    y, _ = prepare_reference((_noise(1.0, 16000, 0.05) * 32767).astype(np.int16), sr=16000)
    _check_reference(y, 1.0)


def test_prepare_reference_cuts_to_max_seconds() -> None:
    y, warnings = prepare_reference(_noise(31.0, 16000, 0.05), sr=16000)
    assert y.shape == (30 * SR,)
    assert len(warnings) == 1 and "31.0 s" in warnings[0] and "first 30 s" in warnings[0]
    y, warnings = prepare_reference(_noise(3.0, SR), sr=SR, max_seconds=2.5)
    assert y.shape == (round(2.5 * SR),) and "2.5 s" in warnings[0]


def test_prepare_reference_peak_limits_with_a_warning() -> None:
    """A quiet signal with one loud click: -16 LUFS would need a peak far above 1."""
    x = _sine(300, 2.0, SR, 0.01)
    x[SR] = 0.9
    y, warnings = prepare_reference(x, sr=SR)
    assert np.abs(y).max() == pytest.approx(1.0, abs=1e-6)
    assert len(warnings) == 1 and "peak-limited" in warnings[0]
    measured = _pyloudnorm(y, SR)
    assert measured < -16.5
    reported = float(warnings[0].split("loudness is ")[1].split(" LUFS")[0])
    assert reported == pytest.approx(measured, abs=0.1)


def test_prepare_reference_rejects_silence_and_bad_input(tmp_path: Path) -> None:
    with pytest.raises(AudioError, match="silent"):
        prepare_reference(np.zeros(SR, dtype=np.float32), sr=SR)
    with pytest.raises(InputError, match="needs sr"):
        prepare_reference(_noise(1.0, SR))
    with pytest.raises(InputError, match="max_seconds"):
        prepare_reference(_noise(1.0, SR), sr=SR, max_seconds=0)
    (tmp_path / "x.wav").write_bytes(b"RIFF....WAVEjunk")
    with pytest.raises(AudioError, match="cannot read"):
        prepare_reference(tmp_path / "x.wav")


# --------------------------------------------------------------------------- with the codec's encoder


@pytest.mark.parametrize("seconds", [0.03, 0.5, 1.0, 2.345])
def test_prepared_reference_encodes_to_ceil_n_over_1920(codec, seconds: float) -> None:
    y, _ = prepare_reference(_noise(seconds, 16000, 0.05), sr=16000)
    latent = codec.encode(torch.from_numpy(y).view(1, 1, -1))
    assert latent.shape == (1, math.ceil(y.shape[0] / 1920), 32)


def test_a_reference_of_960_samples_or_fewer_cannot_be_encoded(codec) -> None:
    y, _ = prepare_reference(_noise(0.02, SR), sr=SR)  # 960 samples
    assert y.shape == (960,)
    with pytest.raises(InputError, match="at least 961 samples"):
        codec.encode(torch.from_numpy(y).view(1, 1, -1))
    y, _ = prepare_reference(_noise(961 / SR, SR), sr=SR)
    assert codec.encode(torch.from_numpy(y).view(1, 1, -1)).shape == (1, 1, 32)
