"""Text front end: normalisation, tokenisation, splitting, stream segmentation, length estimate.

The tokenizer needs torch, so it is imported on first use: the runtime (the Speaker, its tags
and stream segmenter) imports this package without paying for torch.
"""

from typing import Any

from irodori_speaker.text.length import count_morae, count_pauses, estimate_seconds, mora_method
from irodori_speaker.text.normalize import normalize_or_raise, normalize_text
from irodori_speaker.text.segment import StreamSegmenter
from irodori_speaker.text.split import (
    CLAUSE_CHARS,
    CLOSING_CHARS,
    DEFAULT_MAX_CHARS,
    SENTENCE_END_CHARS,
    split_for_synthesis,
)

_LAZY = {"TextTokenizer", "build_tiny_tokenizer"}  # from irodori_speaker.text.tokenizer (torch)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from irodori_speaker.text import tokenizer

        return getattr(tokenizer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CLAUSE_CHARS",
    "CLOSING_CHARS",
    "DEFAULT_MAX_CHARS",
    "SENTENCE_END_CHARS",
    "StreamSegmenter",
    "TextTokenizer",
    "build_tiny_tokenizer",
    "count_morae",
    "count_pauses",
    "estimate_seconds",
    "mora_method",
    "normalize_or_raise",
    "normalize_text",
    "split_for_synthesis",
]
