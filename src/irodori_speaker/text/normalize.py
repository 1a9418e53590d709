"""Text normalisation exactly as the released Irodori-TTS checkpoints were trained with.

The rules and their order follow the model spec (section 6) and the reference
implementation's ``normalize_text`` (without its later, optional English-to-katakana
pass, which the v2/v3 checkpoints do not depend on). The order matters: for example
``？`` is mapped before NFKC, ``～`` becomes ``ー`` before NFKC could turn it into
``~``, and whole-text brackets are stripped before NFKC, so ``（…)`` with mismatched
widths is *not* stripped.
"""

from __future__ import annotations

import re
import unicodedata

from irodori_speaker.errors import InputError

__all__ = ["drop_lone_surrogates", "normalize_or_raise", "normalize_text", "strip_enclosing_brackets"]

# Step 1 and 2: plain substring replacements, applied in this order. The reference also
# deletes the literal five characters ``\[n\]`` (a regex spelling used as a plain string);
# we keep that for parity with the training data.
_SIMPLE_REPLACEMENTS: tuple[tuple[str, str], ...] = (
    ("\t", ""),
    ("[n]", ""),
    ("\\[n\\]", ""),
    ("\u3000", ""),  # full-width space
    ("？", "?"),
    ("！", "!"),
    ("♥", "♡"),
    ("●", "○"),
    ("◯", "○"),
    ("〇", "○"),
)

# Step 3-5: regex rules, in this order.
_REGEX_REPLACEMENTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"[;▼♀♂《》≪≫①②③④⑤⑥]"), ""),
    (re.compile("[\u02d7\u2010-\u2015\u2043\u2212\u23af\u23e4\u2500\u2501\u2e3a\u2e3b]"), ""),
    (re.compile("[\uff5e\u301c]"), "ー"),  # ～ (full-width tilde) and 〜 (wave dash)
    (re.compile(r"…{3,}"), "……"),
)

_BRACKET_PAIRS: dict[str, str] = {"「": "」", "『": "』", "（": "）", "【": "】", "(": ")"}


def strip_enclosing_brackets(text: str) -> str:
    """Remove bracket pairs that enclose the *whole* text, repeatedly.

    A pair is removed only when the opening bracket at the start is closed by the
    bracket at the very end (same kind, depth-matched): ``「a」`` -> ``a``, but
    ``「a」と「b」`` stays as it is.
    """
    while len(text) >= 2:
        opening, closing = text[0], text[-1]
        if _BRACKET_PAIRS.get(opening) != closing:
            break
        depth = 0
        encloses_all = True
        for i, ch in enumerate(text):
            if ch == opening:
                depth += 1
            elif ch == closing:
                depth -= 1
            if depth == 0 and i < len(text) - 1:
                encloses_all = False
                break
        if not (encloses_all and depth == 0):
            break
        text = text[1:-1]
    return text


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def drop_lone_surrogates(text: str) -> str:
    """``text`` without lone UTF-16 surrogates (``"\\ud800"``; in a Python str every surrogate
    code point is lone). They encode no character, cannot be written as UTF-8 (the tokenizer and
    the cache key would raise), and a replacement character would be read to the model as an
    unknown symbol: chat text that carries one loses just that code point."""
    return _LONE_SURROGATE.sub("", text)


def normalize_text(text: str) -> str:
    """Normalise ``text`` the way the model's training data was normalised (may return "")."""
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got {type(text).__name__}")
    text = drop_lone_surrogates(text)  # not a reference rule: such text never reached it
    for old, new in _SIMPLE_REPLACEMENTS:
        text = text.replace(old, new)
    for pattern, replacement in _REGEX_REPLACEMENTS:
        text = pattern.sub(replacement, text)
    text = strip_enclosing_brackets(text)
    text = unicodedata.normalize("NFKC", text)
    # NFKC turns "…" into "...", so this also restores ellipses.
    text = text.replace("...", "…")
    text = text.replace("..", "…")
    return text


def normalize_or_raise(text: str) -> str:
    """`normalize_text`, raising `InputError` when the input or the result is empty."""
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got {type(text).__name__}")
    if not text.strip():
        raise InputError("text is empty or only whitespace", hint="pass some text to speak")
    normalized = normalize_text(text)
    if not normalized.strip():
        raise InputError(
            f"text {text[:40]!r} is empty after normalisation (only characters the model ignores)",
            hint="the normaliser deletes tabs, full-width spaces, '[n]', some symbols and enclosing brackets",
        )
    return normalized
