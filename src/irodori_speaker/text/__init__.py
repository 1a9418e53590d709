"""Text front end: normalisation, tokenisation, splitting, stream segmentation, length estimate."""

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
from irodori_speaker.text.tokenizer import TextTokenizer, build_tiny_tokenizer

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
