"""Speech-length estimate for models without a duration predictor (v2 checkpoints).

The model generates exactly the length it is asked for: too short cuts speech off, too
long leaves a tail (which the tail trim removes, at the cost of wasted sampling). The
estimate is ``morae / morae_per_second + pauses * pause_s + margin_s`` clamped to
``[floor_s, cap_s]`` (or the same with characters). Morae come from pyopenjtalk (the
``ja`` extra, ``pyopenjtalk-plus``) when it is importable, else from a kana/character
approximation. The default rates were fitted to pyopenjtalk's HTS voice
(benchmarks/duration_estimate.py, numbers in docs/text.md); Irodori voices speak at their
own pace, so pass the rate measured for your voice when it differs.
"""

from __future__ import annotations

import contextlib
import io
import math
import threading
import unicodedata
from types import ModuleType
from typing import Final, Literal

from irodori_speaker.errors import InputError

__all__ = [
    "CHARS_PER_SECOND",
    "MORAE_PER_SECOND",
    "PAUSE_S",
    "count_morae",
    "count_pauses",
    "estimate_seconds",
    "mora_method",
]

MoraMethod = Literal["auto", "openjtalk", "kana"]
EstimateMethod = Literal["auto", "openjtalk", "kana", "chars"]

# Fitted on HTS speech (docs/text.md, "Length estimate"); margins keep truncation rare.
MORAE_PER_SECOND: Final[float] = 8.4
PAUSE_S: Final[float] = 0.5
CHARS_PER_SECOND: Final[float] = 5.7
_MARGIN_S: Final[dict[str, float]] = {"openjtalk": 0.3, "kana": 0.4, "chars": 0.6}
FLOOR_S: Final[float] = 1.0
CAP_S: Final[float] = 30.0

# Kana approximation: weights per character class (kanji average, digits, Latin letters),
# fitted to pyopenjtalk's mora counts on the benchmark sentences.
_KANJI_MORAE: Final[float] = 1.77
_DIGIT_MORAE: Final[float] = 2.5
_LATIN_MORAE: Final[float] = 1.6
_SMALL_KANA: Final[frozenset[str]] = frozenset("ぁぃぅぇぉゃゅょゎゕゖァィゥェォャュョヮヵヶ")
_PAUSE_CHARS: Final[frozenset[str]] = frozenset("、。，．,.!?！？…‥：:；;\n")

_lock = threading.Lock()
_pyopenjtalk: ModuleType | None = None
_import_failed = False


def _load_pyopenjtalk() -> ModuleType | None:
    """Import pyopenjtalk once, quietly (pyopenjtalk-plus prints a note about ONNX on import)."""
    global _pyopenjtalk, _import_failed
    with _lock:
        if _pyopenjtalk is None and not _import_failed:
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    import pyopenjtalk
                _pyopenjtalk = pyopenjtalk
            except Exception:  # ImportError, or a broken native build
                _import_failed = True
        return _pyopenjtalk


def mora_method() -> Literal["openjtalk", "kana"]:
    """The mora counter that ``method="auto"`` uses on this machine."""
    return "openjtalk" if _load_pyopenjtalk() is not None else "kana"


def _resolve(method: str) -> str:
    if method == "auto":
        return mora_method()
    if method == "openjtalk" and _load_pyopenjtalk() is None:
        raise InputError(
            "mora counting with pyopenjtalk was asked for but pyopenjtalk is not importable",
            hint="pip install 'irodori-speaker[ja]' (pyopenjtalk-plus), or use method='kana'",
        )
    if method not in ("openjtalk", "kana", "chars"):
        raise InputError(f"unknown method {method!r}; use 'auto', 'openjtalk', 'kana' or 'chars'")
    return method


def _kana_morae(text: str) -> float:
    total = 0.0
    for ch in unicodedata.normalize("NFKC", text):
        o = ord(ch)
        if ch in _SMALL_KANA:
            continue  # merges with the kana before it (きゃ is one mora)
        if 0x3041 <= o <= 0x309F or 0x30A1 <= o <= 0x30FA or ch == "ー":
            total += 1.0
        elif 0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or ch in "々〆":
            total += _KANJI_MORAE
        elif ch.isdecimal():
            total += _DIGIT_MORAE
        elif ch.isascii() and ch.isalpha():
            total += _LATIN_MORAE
    return total


def count_morae(text: str, *, method: MoraMethod = "auto") -> int:
    """Number of morae in `text` (pyopenjtalk's reading, or the kana approximation)."""
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got {type(text).__name__}")
    resolved = _resolve(method)
    if resolved == "chars":
        raise InputError("count_morae takes method 'auto', 'openjtalk' or 'kana'")
    if not text.strip():
        return 0
    if resolved == "openjtalk":
        pyopenjtalk = _load_pyopenjtalk()
        assert pyopenjtalk is not None
        return int(sum(int(node["mora_size"]) for node in pyopenjtalk.run_frontend(text)))
    return round(_kana_morae(text))


def count_pauses(text: str) -> int:
    """Pauses inside `text`: runs of punctuation (、。！？… and the like) before its last word."""
    end = len(text)
    while end > 0 and not text[end - 1].isalnum():
        end -= 1
    body = text[:end]
    pauses = 0
    in_run = False
    for ch in body:
        if ch in _PAUSE_CHARS:
            if not in_run:
                pauses += 1
            in_run = True
        elif not ch.isspace():
            in_run = False
    return pauses


def estimate_seconds(
    text: str,
    *,
    method: EstimateMethod = "auto",
    morae_per_second: float = MORAE_PER_SECOND,
    pause_s: float = PAUSE_S,
    chars_per_second: float = CHARS_PER_SECOND,
    margin_s: float | None = None,
    floor_s: float = FLOOR_S,
    cap_s: float = CAP_S,
) -> float:
    """Seconds of audio to generate for `text` when the model cannot predict its length.

    ``method``: "auto" (morae via pyopenjtalk when importable, else the kana
    approximation), "openjtalk", "kana", or "chars" (non-whitespace characters /
    `chars_per_second`). `margin_s` defaults to the method's measured margin (docs/text.md).
    """
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got {type(text).__name__}")
    for name, value in (("morae_per_second", morae_per_second), ("chars_per_second", chars_per_second)):
        if not (math.isfinite(value) and value > 0):
            raise InputError(f"{name} must be a positive number, got {value}")
    if not (0.5 <= floor_s <= cap_s <= 30.0):
        raise InputError(f"need 0.5 <= floor_s <= cap_s <= 30 (the model's limits), got {floor_s}, {cap_s}")
    resolved = _resolve(method)
    margin = _MARGIN_S[resolved] if margin_s is None else margin_s
    if not math.isfinite(margin) or not math.isfinite(pause_s):
        raise InputError("margin_s and pause_s must be finite")
    if resolved == "chars":
        seconds = sum(1 for ch in text if not ch.isspace()) / chars_per_second
    else:
        morae = count_morae(text, method=resolved)  # type: ignore[arg-type]
        seconds = morae / morae_per_second + count_pauses(text) * pause_s
    return float(min(cap_s, max(floor_s, seconds + margin)))
