"""Accent phrases and moras of a Japanese text, with estimated lengths (pyopenjtalk).

    phrases = accent_phrases("こんにちは、音声合成の世界へようこそ！")
    phrases[0].moras[0]   # Mora(text="コ", consonant="k", vowel="o", consonant_length=0.045, ...)

The structure is OpenJTalk's: its full-context labels give each phoneme's breath group,
accent phrase, mora position, accent type and question flag. The lengths are estimates,
not measurements: every mora lasts `1 / MORAE_PER_SECOND` (the rate `text/length.py`
fitted to pyopenjtalk's HTS voice, so the lengths of a line add up to the same estimate
the synthesizer uses), and a pause between breath groups lasts `PAUSE_S`. Pitches are
the Tokyo accent pattern on a log-Hz scale (high/low), zero on unvoiced moras. The
VOICEVOX AudioQuery (`server/voicevox/`) and the caption timing and visemes of the
voice-controls work build on these moras.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from functools import lru_cache

from irodori_speaker.errors import InputError
from irodori_speaker.text.length import MORAE_PER_SECOND, PAUSE_S, _load_pyopenjtalk

__all__ = [
    "AccentPhrase",
    "KanaParseError",
    "Mora",
    "accent_phrases",
    "kana_to_moras",
    "make_mora",
    "mora_kana",
    "parse_aquestalk",
    "pause_mora",
    "phrases_reading",
    "phrases_seconds",
    "to_katakana",
]

MORA_S = 1.0 / MORAE_PER_SECOND
CONSONANT_S = 0.045  # a typical Japanese consonant; the vowel takes the rest of the mora
PITCH_HIGH = 5.8  # log Hz (~330 Hz)
PITCH_LOW = 5.5  # ~245 Hz

# ---- the mora table: katakana <-> (consonant, vowel) as OpenJTalk names them -------------
# One row per consonant: the kana for the vowels a, i, u, e, o ("" where there is none).
_ROWS: tuple[tuple[str, str], ...] = (
    ("", "ア イ ウ エ オ"),
    ("k", "カ キ ク ケ コ"),
    ("g", "ガ ギ グ ゲ ゴ"),
    ("s", "サ スィ ス セ ソ"),
    ("sh", "シャ シ シュ シェ ショ"),
    ("z", "ザ ズィ ズ ゼ ゾ"),
    ("j", "ジャ ジ ジュ ジェ ジョ"),
    ("t", "タ ティ トゥ テ ト"),
    ("ch", "チャ チ チュ チェ チョ"),
    ("ts", "ツァ ツィ ツ ツェ ツォ"),
    ("d", "ダ ディ ドゥ デ ド"),
    ("n", "ナ ニ ヌ ネ ノ"),
    ("h", "ハ ヒ - ヘ ホ"),
    ("f", "ファ フィ フ フェ フォ"),
    ("b", "バ ビ ブ ベ ボ"),
    ("p", "パ ピ プ ペ ポ"),
    ("m", "マ ミ ム メ モ"),
    ("y", "ヤ - ユ イェ ヨ"),
    ("r", "ラ リ ル レ ロ"),
    ("w", "ワ ウィ - ウェ ウォ"),
    ("v", "ヴァ ヴィ ヴ ヴェ ヴォ"),
    ("ky", "キャ - キュ キェ キョ"),
    ("gy", "ギャ - ギュ ギェ ギョ"),
    ("ny", "ニャ - ニュ ニェ ニョ"),
    ("hy", "ヒャ - ヒュ ヒェ ヒョ"),
    ("by", "ビャ - ビュ ビェ ビョ"),
    ("py", "ピャ - ピュ ピェ ピョ"),
    ("my", "ミャ - ミュ ミェ ミョ"),
    ("ry", "リャ - リュ リェ リョ"),
    ("dy", "- - デュ - -"),
    ("ty", "- - テュ - -"),
    ("fy", "- - フュ - -"),
    ("kw", "クヮ - - - -"),
    ("gw", "グヮ - - - -"),
)
_KANA_TO_PHONEMES: dict[str, tuple[str, str]] = {"ン": ("", "N"), "ッ": ("", "cl")}
for _consonant, _kanas in _ROWS:
    for _vowel, _kana in zip("aiueo", _kanas.split()):
        if _kana != "-":
            _KANA_TO_PHONEMES[_kana] = (_consonant, _vowel)
_PHONEMES_TO_KANA = {v: k for k, v in _KANA_TO_PHONEMES.items()}
# kana that read as another kana's phonemes (the table above keeps the canonical spelling)
_KANA_TO_PHONEMES.update({"ヂ": ("j", "i"), "ヅ": ("z", "u"), "ヲ": ("", "o"), "ヮ": ("w", "a")})
_SMALL = set("ァィゥェォャュョヮ")
_VOWELS = set("aiueoAIUEO") | {"N", "cl"}


def mora_kana(consonant: str | None, vowel: str) -> str:
    """The katakana of one mora (an unvoiced vowel, e.g. "U", reads as its voiced kana)."""
    key = (consonant or "", vowel if vowel in ("N", "cl") else vowel.lower())
    kana = _PHONEMES_TO_KANA.get(key)
    if kana is None:
        raise InputError(f"no kana for the mora {consonant or ''}{vowel}")
    return kana


def to_katakana(text: str) -> str:
    """Hiragana -> katakana (everything else unchanged)."""
    return "".join(chr(ord(c) + 0x60) if "ぁ" <= c <= "ゖ" else c for c in text)


def kana_to_moras(kana: str) -> list[tuple[str, str, str]]:
    """Split katakana (or hiragana) into moras: [(text, consonant, vowel)], "ー" repeating
    the vowel before it. Raises `InputError` on characters that are not kana."""
    kana = to_katakana(kana)
    out: list[tuple[str, str, str]] = []
    i = 0
    while i < len(kana):
        two, one = kana[i : i + 2], kana[i]
        if len(two) == 2 and two[1] in _SMALL and two in _KANA_TO_PHONEMES:
            text = two
        elif one == "ー":
            if not out or out[-1][2] in ("N", "cl"):
                raise InputError(f"'ー' must follow a vowel in {kana!r}")
            out.append(("ー", "", out[-1][2]))
            i += 1
            continue
        elif one in _KANA_TO_PHONEMES:
            text = one
        else:
            raise InputError(
                f"{one!r} in {kana!r} is not a katakana reading",
                hint="write readings in katakana or hiragana",
            )
        consonant, vowel = _KANA_TO_PHONEMES[text]
        out.append((text, consonant, vowel))
        i += len(text)
    return out


@dataclass
class Mora:
    """One mora: VOICEVOX's fields (lengths in seconds, pitch in log Hz, 0 when unvoiced)."""

    text: str
    vowel: str
    vowel_length: float
    pitch: float
    consonant: str | None = None
    consonant_length: float | None = None

    @property
    def seconds(self) -> float:
        return (self.consonant_length or 0.0) + self.vowel_length


@dataclass
class AccentPhrase:
    """Moras said as one accent unit; `accent` is the 1-based mora the pitch falls after
    (VOICEVOX's convention), `pause_mora` the silence after it (None: no pause)."""

    moras: list[Mora]
    accent: int
    pause_mora: Mora | None = None
    is_interrogative: bool = False
    words: list[str] = field(default_factory=list)  # reserved for word timing (not filled yet)


def make_mora(text: str, consonant: str, vowel: str, high: bool) -> Mora:
    """A mora with the estimated lengths and the accent pattern's pitch."""
    voiced = vowel in ("a", "i", "u", "e", "o", "N")
    pitch = (PITCH_HIGH if high else PITCH_LOW) if voiced else 0.0
    if consonant:
        return Mora(text, vowel, MORA_S - CONSONANT_S, pitch, consonant, CONSONANT_S)
    return Mora(text, vowel, MORA_S, pitch)


def pause_mora(seconds: float = PAUSE_S) -> Mora:
    return Mora("、", "pau", seconds, 0.0)


def accent_pitches(n: int, accent: int) -> list[bool]:
    """Tokyo-accent high/low per mora: the first mora is low unless the accent is on it,
    then high up to the accent nucleus, low after it (accent 0: high to the end)."""
    if accent == 1:
        return [True] + [False] * (n - 1)
    end = n if accent == 0 else accent
    return [False] + [i < end for i in range(1, n)]


_LABEL = re.compile(
    r"-(?P<ph>[^+]+)\+.*?/A:(?P<a1>[-\dx]+)\+(?P<a2>[\dx]+)\+.*?/F:(?P<f1>[\dx]+)_(?P<f2>[\dx]+)#"
    r"(?P<f3>[\dx]+)_[\dx]+@(?P<f5>[\dx]+)_.*?/I:[\dx]+-[\dx]+@(?P<i3>[\dx]+)\+"
)
_lock = threading.Lock()  # pyopenjtalk's global instance is not thread-safe


def _labels(text: str) -> list[str]:
    pyopenjtalk = _load_pyopenjtalk()
    if pyopenjtalk is None:
        raise InputError(
            "accent phrases need pyopenjtalk", hint="pip install 'irodori-speaker[ja]' (pyopenjtalk-plus)"
        )
    with _lock:
        return list(pyopenjtalk.extract_fullcontext(text))


def accent_phrases(text: str) -> list[AccentPhrase]:
    """Accent phrases of `text` with estimated lengths and pitches (empty for no speech)."""
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got {type(text).__name__}")
    return [_copy(p) for p in _accent_phrases_cached(text)]


def _copy(p: AccentPhrase) -> AccentPhrase:
    moras = [Mora(**vars(m)) for m in p.moras]
    pause = None if p.pause_mora is None else Mora(**vars(p.pause_mora))
    return AccentPhrase(moras, p.accent, pause, p.is_interrogative, list(p.words))


@lru_cache(maxsize=512)
def _accent_phrases_cached(text: str) -> tuple[AccentPhrase, ...]:
    if not text.strip():
        return ()
    # (breath group, accent phrase) -> [moras as (key, consonant, vowel)], plus accent info
    phrases: list[dict] = []
    for label in _labels(text):
        m = _LABEL.search(label)
        if m is None:
            continue
        ph = m["ph"]
        if ph in ("sil", "pau"):
            if ph == "pau" and phrases:
                phrases[-1]["pause"] = True
            continue
        key = (m["i3"], m["f5"])  # (breath group, accent phrase in it)
        if not phrases or phrases[-1]["key"] != key:
            phrases.append(
                {"key": key, "accent": int(m["f2"]), "question": m["f3"] == "1", "moras": [], "pause": False}
            )
        moras = phrases[-1]["moras"]
        mora_index = m["a2"]
        # a2 counts moras (it stops at 49): a phoneme joins the mora before it only as its vowel
        if moras and moras[-1][0] == mora_index and moras[-1][2] == "":
            moras[-1][2] = ph  # the vowel after this mora's consonant
        elif ph in _VOWELS:
            moras.append([mora_index, "", ph])
        else:
            moras.append([mora_index, ph, ""])
    out: list[AccentPhrase] = []
    for p in phrases:
        n = len(p["moras"])
        accent = min(p["accent"], n) or n  # OpenJTalk gives a flat phrase the mora count already
        highs = accent_pitches(n, accent)
        moras = []
        for (_, consonant, vowel), high in zip(p["moras"], highs):
            vowel = vowel or "u"  # a lone consonant never comes out of OpenJTalk; be safe
            moras.append(make_mora(mora_kana(consonant, vowel), consonant, vowel, high))
        out.append(
            AccentPhrase(
                moras,
                accent,
                pause_mora() if p["pause"] else None,
                p["question"],
            )
        )
    return tuple(out)


def phrases_reading(phrases: list[AccentPhrase]) -> str:
    """The phrases read back as katakana text: "、" at pauses, "？" after a question."""
    parts: list[str] = []
    for p in phrases:
        parts.append("".join(m.text for m in p.moras))
        if p.is_interrogative:
            parts.append("？")
        if p.pause_mora is not None:
            parts.append("、")
    return "".join(parts)


def phrases_seconds(phrases: list[AccentPhrase]) -> float:
    """Total of the mora and pause lengths."""
    total = 0.0
    for p in phrases:
        total += sum(m.seconds for m in p.moras)
        if p.pause_mora is not None:
            total += p.pause_mora.seconds
    return total


class KanaParseError(InputError):
    """AquesTalk-style kana that cannot be parsed; `code` is VOICEVOX's error name."""

    def __init__(self, code: str, text: str, message: str) -> None:
        super().__init__(
            message, hint="phrases are katakana split by / or 、, with one ' after the accent mora"
        )
        self.code, self.text = code, text


def parse_aquestalk(kana: str) -> list[AccentPhrase]:
    """VOICEVOX's AquesTalk-like notation: katakana phrases split by "/" (no pause) or "、"
    (pause), "'" after the accent mora, "_" before an unvoiced mora, "？" ending a question."""
    phrases: list[AccentPhrase] = []
    pieces = re.split(r"([/、])", kana)
    for i in range(0, len(pieces), 2):
        body, sep = pieces[i], pieces[i + 1] if i + 1 < len(pieces) else ""
        if not body:
            if i == len(pieces) - 1 and phrases:
                break  # a trailing separator
            raise KanaParseError("EMPTY_PHRASE", body, f"phrase {i // 2 + 1} is empty")
        question = body.endswith("？")
        if question:
            body = body[:-1]
        if "？" in body:
            raise KanaParseError("INTERROGATION_MARK_NOT_AT_END", body, f"'？' inside the phrase {body!r}")
        if body.count("'") > 1:
            raise KanaParseError("ACCENT_TWICE", body, f"two accents in {body!r}")
        if "'" not in body:
            raise KanaParseError("ACCENT_NOTFOUND", body, f"no accent (') in {body!r}")
        if body.startswith("'"):
            raise KanaParseError("ACCENT_TOP", body, f"an accent cannot start the phrase {body!r}")
        moras: list[tuple[str, str, str]] = []
        accent, unvoice = 0, False
        j = 0
        while j < len(body):
            ch = body[j]
            if ch == "'":
                accent = len(moras)
                j += 1
                continue
            if ch == "_":
                unvoice = True
                j += 1
                continue
            two = body[j : j + 2]
            text = two if len(two) == 2 and two[1] in _SMALL and two in _KANA_TO_PHONEMES else ch
            if text not in _KANA_TO_PHONEMES and text != "ー":
                raise KanaParseError("UNKNOWN_TEXT", body, f"{text!r} is not katakana")
            try:
                (mora,) = kana_to_moras(("" if text != "ー" else (moras[-1][0] if moras else "")) + text)[-1:]
            except (InputError, ValueError):
                raise KanaParseError("UNKNOWN_TEXT", body, f"cannot read {text!r} in {body!r}") from None
            t, c, v = mora
            if unvoice and v in "aiueo":
                v = v.upper()
            moras.append((t if t != "ー" else mora_kana(c, v), c, v))
            unvoice = False
            j += len(text)
        highs = accent_pitches(len(moras), accent)
        phrases.append(
            AccentPhrase(
                [make_mora(t, c, v, h) for (t, c, v), h in zip(moras, highs)],
                accent,
                pause_mora() if sep == "、" else None,
                question,
            )
        )
    return phrases
