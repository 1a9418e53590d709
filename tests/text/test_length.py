"""Mora counts and the seconds estimate (pyopenjtalk's HTS voice as the reference for speech)."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from irodori_speaker.errors import InputError
from irodori_speaker.text import length
from irodori_speaker.text.length import count_morae, count_pauses, estimate_seconds, mora_method

with contextlib.redirect_stdout(io.StringIO()):
    pyopenjtalk = pytest.importorskip("pyopenjtalk")

# Hand-counted morae (small kana merge, long vowels, っ and ん count).
MORAE = [
    ("こんにちは", 5),
    ("東京", 4),  # to-o-kyo-o
    ("きゃく", 2),
    ("がっこう", 4),
    ("カード", 3),
    ("さようなら", 5),
    ("ありがとう！", 5),
]


@pytest.mark.parametrize(("text", "expected"), MORAE)
def test_openjtalk_morae(text: str, expected: int) -> None:
    assert count_morae(text, method="openjtalk") == expected


@pytest.mark.parametrize(("text", "expected"), [m for m in MORAE if m[0] != "東京"])
def test_kana_morae_on_kana(text: str, expected: int) -> None:
    assert count_morae(text, method="kana") == expected


def test_kana_approximation_is_close_on_mixed_text() -> None:
    texts = [
        "今日の東京は朝から青空が広がり、日中の最高気温は二十五度近くまで上がる見込みです。",
        "YouTubeとTwitchで同時配信しています。",
        "価格は1,980円で、送料は無料です。",
    ]
    for t in texts:
        ref = count_morae(t, method="openjtalk")
        assert abs(count_morae(t, method="kana") - ref) <= 0.15 * ref + 2, t


def test_empty_text_has_no_morae() -> None:
    assert count_morae("") == 0
    assert count_morae("  ") == 0
    assert count_morae("。！", method="kana") == 0


def test_auto_uses_openjtalk_when_importable_and_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    assert mora_method() == "openjtalk"
    assert count_morae("東京") == count_morae("東京", method="openjtalk")
    monkeypatch.setattr(length, "_load_pyopenjtalk", lambda: None)
    assert mora_method() == "kana"
    assert count_morae("カード") == 3
    with pytest.raises(InputError, match="pyopenjtalk"):
        count_morae("カード", method="openjtalk")
    assert estimate_seconds("カード", method="auto") == estimate_seconds("カード", method="kana")


@pytest.mark.parametrize(
    ("text", "pauses"),
    [
        ("はい。", 0),
        ("うん、そうだね。", 1),
        ("え、マジで！？", 1),
        ("a、b。c！？d", 3),
        ("……そう", 1),
        ("", 0),
    ],
)
def test_count_pauses(text: str, pauses: int) -> None:
    assert count_pauses(text) == pauses


def test_estimate_formula_with_explicit_parameters() -> None:
    # 10 morae, 1 pause
    got = estimate_seconds(
        "こんにちは、さようなら", morae_per_second=10.0, pause_s=0.5, margin_s=0.0, floor_s=0.5
    )
    assert got == pytest.approx(1.5)
    # chars: 5 non-whitespace characters / 5 per second + 0.5
    got = estimate_seconds("あい うえお", method="chars", chars_per_second=5.0, margin_s=0.5, floor_s=0.5)
    assert got == pytest.approx(1.5)


def test_estimate_clamps() -> None:
    assert estimate_seconds("はい", floor_s=2.0) == 2.0
    assert estimate_seconds("あ" * 1000) == 30.0
    assert estimate_seconds("あ" * 1000, cap_s=12.0) == 12.0
    short, longer = estimate_seconds("はい、そうです。"), estimate_seconds("はい、そうです。" * 4)
    assert short < longer


@pytest.mark.parametrize(
    "kwargs",
    [
        {"morae_per_second": 0.0},
        {"chars_per_second": -1.0},
        {"floor_s": 0.1},
        {"floor_s": 5.0, "cap_s": 4.0},
        {"cap_s": 31.0},
        {"method": "nope"},
        {"margin_s": float("nan")},
    ],
)
def test_estimate_rejects_bad_parameters(kwargs: dict) -> None:
    with pytest.raises(InputError):
        estimate_seconds("はい", **kwargs)


def _hts_seconds(text: str) -> float:
    wav, sr = pyopenjtalk.tts(text)
    x = np.asarray(wav, dtype=np.float64)
    hop = sr // 100
    frames = len(x) // hop
    rms = np.sqrt(np.mean(x[: frames * hop].reshape(frames, hop) ** 2, axis=1))
    voiced = np.nonzero(rms > rms.max() * 0.01)[0]
    return float((voiced[-1] - voiced[0] + 1) * hop / sr)


def test_default_estimate_covers_hts_speech_of_news5(news5_sentences: list[str]) -> None:
    for text in news5_sentences:
        speech = _hts_seconds(text)
        est = estimate_seconds(text)
        old = min(30.0, max(4.0, len(text) / 4.5 + 1.0))
        assert speech - 0.1 <= est <= speech + 1.0, (text, speech, est)
        assert abs(est - speech) < abs(old - speech)
