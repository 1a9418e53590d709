"""Which characters of the text as written each part of the spoken text came from.

The readings pass rewrites a line before the model reads it (the user dictionary, tags,
URLs, www, numbers, Latin words, and the reference normalisation before and after): the
timing of a line (`estimate.py`) is of that spoken text, but captions and word events should
show the line as the streamer wrote it ("VTuberの配信で草", not ブイチューバー...). `SourceMap`
aligns the two texts once, after all the rewrites, so it covers every rewrite (present and
future) without each having to record its edits; written here because the alignment is
difflib's (standard library) and the rest is bookkeeping.

A rewrite shows up in the alignment as a replaced run (`VTuber` -> ブイチューバー, `:` -> 時),
an inserted run (the 分 of 15時30分: nothing of the source), or a deleted run (a stripped
tag, a pause markup, a dropped URL: in no caption). `source_text(a, b)` is what of the
source the spoken characters a..b stand for: the characters matched one to one, and each
replaced source run whole, given to the spoken range that holds its first character (so a
run split over two words or cues is shown once).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

__all__ = ["SourceMap"]


@dataclass(frozen=True)
class SourceMap:
    """The alignment of `spoken` (what the model reads) to `source` (the line as written)."""

    source: str
    spoken: str
    opcodes: tuple[tuple[str, int, int, int, int], ...]  # difflib's (tag, i1, i2, j1, j2): i source, j spoken

    @classmethod
    def align(cls, source: str, spoken: str) -> SourceMap:
        """Sentence by sentence where both texts have the same sentence ends (difflib is
        quadratic: 485x slower on a 4,000-character line, benchmarks/caption_align.py), else whole."""
        src, spk = _sentences(source), _sentences(spoken)
        if len(src) != len(spk):
            src, spk = [source], [spoken]
        ops: list[tuple[str, int, int, int, int]] = []
        i0 = j0 = 0
        for a, b in zip(src, spk):
            matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
            ops += [(t, i1 + i0, i2 + i0, j1 + j0, j2 + j0) for t, i1, i2, j1, j2 in matcher.get_opcodes()]
            i0, j0 = i0 + len(a), j0 + len(b)
        return cls(source, spoken, tuple(ops))

    def source_text(self, start: int, end: int) -> str:
        """The source characters the spoken characters `start:end` stand for (deleted source
        characters, e.g. a stripped tag, never appear)."""
        out: list[str] = []
        for tag, i1, i2, j1, j2 in self.opcodes:
            if j2 <= start:
                continue
            if j1 >= end:
                break
            if tag == "equal":
                a, b = max(start, j1), min(end, j2)
                out.append(self.source[i1 + a - j1 : i1 + b - j1])
            elif tag == "replace" and start <= j1 < end:
                out.append(self.source[i1:i2])
        return "".join(out)


_SENTENCE_END = re.compile(r"(?<=[。！？!?\n])")


def _sentences(text: str) -> list[str]:
    """`text` cut after each sentence end (the ends kept; the pieces join back to `text`)."""
    return [p for p in _SENTENCE_END.split(text) if p]
