"""The user dictionary's matcher: every surface in a line, found in time linear in the line.

    m = SurfaceMatcher([("東京", 5, "トーキョー"), ("東京都", 5, "トーキョート")])
    m.replace("東京都に行く")            # -> "トーキョートに行く"

The surfaces live in a trie; from each position of the text the walk goes at most as deep as
the longest surface (`MAX_SURFACE_CHARS`, so the whole search is O(len(text) * 100) whatever
the number of words: 100,000 words starting with "ア" against 5,000 "ア" cost what 10 do).

Where matches overlap the rule is the dictionary's (docs/text-and-readings.md): the higher
priority wins; among equal priorities the longer surface, then the earlier start; among words
with the same surface, the higher priority, then the newest. Matches are taken greedily in that
order, each one only if none of its characters is taken yet. They are bucketed by (priority,
length) as they are found, so no sort over all matches is needed.

`blocked` spans (tags, URLs, pause markup: `protected_spans`) are never matched into: a match
may neither start nor reach inside one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

__all__ = ["SurfaceMatcher"]

T = TypeVar("T")
_END = ""  # the trie key under which a node keeps the word ending there (no character is "")


class SurfaceMatcher(Generic[T]):
    """A trie of surfaces, each with a priority and a payload (the reading, a word...).

    `words`: (surface, priority, payload) oldest first; where one surface comes several times
    the higher priority, then the later one, is kept."""

    def __init__(self, words: Iterable[tuple[str, int, T]]) -> None:
        root: dict = {}
        ends: list[tuple[dict, int, int, T]] = []  # (node, priority, length, payload) per surface
        for surface, priority, payload in words:
            if not surface:
                continue
            node = root
            for ch in surface:
                node = node.setdefault(ch, {})
            old = node.get(_END)
            if old is None:
                node[_END] = len(ends)
                ends.append((node, priority, len(surface), payload))
            elif priority >= ends[old][1]:
                ends[old] = (node, priority, len(surface), payload)
        # each surface's bucket: its place in the order (priority down, then length down)
        self._sizes = sorted({(-p, -n) for _, p, n, _ in ends})
        place = {key: k for k, key in enumerate(self._sizes)}
        for node, priority, size, payload in ends:
            node[_END] = (place[(-priority, -size)], payload)
        self._root = root
        self.size = len(ends)
        self.depth = max((n for _, _, n, _ in ends), default=0)

    def __len__(self) -> int:
        return self.size

    def find(self, text: str, blocked: Sequence[tuple[int, int]] = ()) -> list[tuple[int, int, T]]:
        """The chosen matches (start, end, payload), by start; none inside a `blocked` span."""
        n = len(text)
        if not self.size or not n:
            return []
        block = bytearray(n)
        for a, b in blocked:
            block[max(0, a) : max(0, b)] = b"\x01" * max(0, min(b, n) - max(0, a))
        root = self._root
        buckets: list[list[tuple[int, T]]] = [[] for _ in self._sizes]
        found = False
        for i in range(n):
            if block[i]:
                continue
            node = root.get(text[i])
            j = i + 1
            while node is not None:
                word = node.get(_END)
                if word is not None:
                    buckets[word[0]].append((i, word[1]))
                    found = True
                if j >= n or block[j]:
                    break
                node = node.get(text[j])
                j += 1
        if not found:
            return []
        taken = bytearray(n)
        chosen: list[tuple[int, int, T]] = []
        for (_, neg_size), starts in zip(self._sizes, buckets, strict=True):
            size = -neg_size
            ones = b"\x01" * size
            for start, payload in starts:  # in order of start: the earlier wins a tie
                end = start + size
                if taken.find(1, start, end) < 0:
                    taken[start:end] = ones
                    chosen.append((start, end, payload))
        chosen.sort(key=lambda m: m[0])
        return chosen

    def replace(self, text: str, blocked: Sequence[tuple[int, int]] = ()) -> str:
        """`text` with every chosen match replaced by its payload (a str)."""
        chosen = self.find(text, blocked)
        if not chosen:
            return text
        out, pos = [], 0
        for start, end, payload in chosen:
            out.append(text[pos:start])
            out.append(str(payload))
            pos = end
        out.append(text[pos:])
        return "".join(out)
