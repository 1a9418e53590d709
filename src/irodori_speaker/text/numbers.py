"""Numbers, dates, times, units and symbols rewritten so that they are read naturally.

Only what pyopenjtalk (the reading front end Irodori's training text was read with, and the
one `length.py` counts morae with) gets wrong is rewritten; what it already reads well
(`1,000円`, `3.5kg`, `20%`, `2026年12月3日`, `100万円`, `10km`) is left as it is. The list
of cases, with pyopenjtalk's reading before and after, is `benchmarks/readings_numbers.py`
(numbers in docs/text-and-readings.md). Input is text after the reference normalisation
(NFKC: ASCII digits, `〜` already `ー`).

| written | rewritten | pyopenjtalk read it as |
|---|---|---|
| `15:30`, `9:05`, `12:00`, `1:02:03` | `15時30分`, `9時5分`, `12時`, `1時2分3秒` | ジューゴ：サンジュー |
| `2026/12/03`, `2026-12-03`, `12/3` | `2026年12月3日`, `12月3日` | ジューニ／サン |
| `3ー5`, `3~5` (ranges) | `3から5` | サンーゴ |
| `-5` (a sign) | `マイナス5` | ゴ (sign not read) |
| `$100`, `¥500`, `€3`, `£2` | `100ドル`, `500円`, `3ユーロ`, `2ポンド` | ＄ヒャク |
| `10°C`, `10℃`, `5°` | `10度` | ジュー°Ｃ |
| `5GB`, `200ms`, `30s`, `2L`, `24h`, `5min` | `5ギガバイト`, `200ミリ秒` ... | ファイブジーＢ |
| `#1` | `ナンバー1` | ＃イチ |
| `#配信` (hashtag) | `配信` | ＃ハイシン |
| `1st` ... `10th` | `ファースト` ... `テンス` | イチショートトン |
| `v1.2`, `ver2` | `バージョン1.2` | ｖイッテンニ |
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["read_numbers"]

_NOT_DIGIT_BEFORE = r"(?<![\d.:/])"
_NOT_DIGIT_AFTER = r"(?![\d:/]|\.\d)"

_TIME: Final = re.compile(_NOT_DIGIT_BEFORE + r"(\d{1,2}):(\d{2})(?::(\d{2}))?" + _NOT_DIGIT_AFTER)
_DATE_YMD: Final = re.compile(
    _NOT_DIGIT_BEFORE + r"((?:19|20)\d{2})([/\-.])(\d{1,2})\2(\d{1,2})" + _NOT_DIGIT_AFTER
)
_DATE_MD: Final = re.compile(r"(?<![\d./:\-])(\d{1,2})/(\d{1,2})(?![\d/:]|\.\d)")
_RANGE: Final = re.compile(r"(\d)\s*[ー~]\s*(?=\d)")
_MINUS: Final = re.compile(r"(?<![A-Za-z0-9)\]}])-(?=\d)")
_CURRENCY: Final = re.compile(r"([$¥€£])\s?(\d[\d,]*(?:\.\d+)?)(万|億|兆)?")
_CURRENCY_WORD: Final = {"$": "ドル", "¥": "円", "€": "ユーロ", "£": "ポンド"}
_DEGREES: Final = re.compile(r"(\d)\s?(?:°C|℃|°)")
_NUMBER_SIGN: Final = re.compile(r"#(?=\d)")
_HASHTAG: Final = re.compile(r"(?:(?<=\s)|^)#(?=[^\s\d#])")
_ORDINAL: Final = re.compile(r"(?<![\w])(10|[1-9])(st|nd|rd|th)(?![A-Za-z])")
_ORDINAL_WORD: Final = {
    "1": "ファースト", "2": "セカンド", "3": "サード", "4": "フォース", "5": "フィフス",
    "6": "シックスス", "7": "セブンス", "8": "エイス", "9": "ナインス", "10": "テンス",
}  # fmt: skip
_VERSION: Final = re.compile(r"(?<![A-Za-z])(?:v|ver\.?|Ver\.?|V)(?=\d)")

# Unit symbols after a number that pyopenjtalk misreads (measured, benchmarks/readings_numbers.py:
# "5GB" is ファイブジーＢ though "1GB" is right, "200ms" エムエス, "30s" セカンド, "2L" Ｌ); the
# ones it reads well (kg, km, cm, mm, ml, mg, TB, MB, KB, Mbps, GHz, Hz, kW, W, V, dB, fps, %)
# are left alone. Longest first ("mAh" before "ms").
_UNITS: Final = {
    "GB": "ギガバイト", "kB": "キロバイト", "mAh": "ミリアンペアアワー", "min": "分",
    "ms": "ミリ秒", "s": "秒", "h": "時間", "L": "リットル",
}  # fmt: skip
_UNIT: Final = re.compile(
    r"(\d)\s?(" + "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True)) + r")(?![A-Za-z])"
)


def _time(m: re.Match[str]) -> str:
    h, mi, s = int(m[1]), int(m[2]), m[3]
    if h > 48 or mi > 59 or (s is not None and int(s) > 59):
        return m[0]  # not a clock time (a score "12:99", a ratio)
    out = f"{h}時"
    if mi or s is not None:
        out += f"{mi}分"
    if s is not None:
        out += f"{int(s)}秒"
    return out


def _valid_md(month: int, day: int) -> bool:
    return 1 <= month <= 12 and 1 <= day <= 31


def _date_ymd(m: re.Match[str]) -> str:
    y, mo, d = m[1], int(m[3]), int(m[4])
    return f"{y}年{mo}月{d}日" if _valid_md(mo, d) else m[0]


def _date_md(m: re.Match[str]) -> str:
    mo, d = int(m[1]), int(m[2])
    return f"{mo}月{d}日" if _valid_md(mo, d) else m[0]


def _currency(m: re.Match[str]) -> str:
    return f"{m[2]}{m[3] or ''}{_CURRENCY_WORD[m[1]]}"


def read_numbers(text: str) -> str:
    """`text` with numbers, dates, times, units and number signs written to be read naturally."""
    if not any(ch.isdecimal() or ch == "#" for ch in text):
        return text
    text = _DATE_YMD.sub(_date_ymd, text)
    text = _TIME.sub(_time, text)
    text = _DATE_MD.sub(_date_md, text)
    text = _RANGE.sub(r"\1から", text)
    text = _MINUS.sub("マイナス", text)
    text = _CURRENCY.sub(_currency, text)
    text = _DEGREES.sub(r"\1度", text)
    text = _UNIT.sub(lambda m: m[1] + _UNITS[m[2]], text)
    text = _ORDINAL.sub(lambda m: _ORDINAL_WORD[m[1]], text)
    text = _VERSION.sub("バージョン", text)
    text = _NUMBER_SIGN.sub("ナンバー", text)
    text = _HASHTAG.sub("", text)
    return text
