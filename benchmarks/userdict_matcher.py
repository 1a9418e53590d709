"""The user dictionary's matcher, old vs new (issue 30): CPU time to find the words of one line.

"old" is the matcher before issue 30 (every word that starts with the character, tried at
every position, then all matches sorted): quadratic in the worst case. "new" is
`text.dict_match.SurfaceMatcher` (a trie walked at most MAX_SURFACE_CHARS deep from each
position, matches bucketed by priority and length). Both choose the same matches (the
property test in tests/test_hostile_dict.py checks it on small inputs; here the outputs are
compared too).

Cases: 10,000 and 100,000 entries against 5,000-character lines, three dictionaries:
- "all ア": every surface starts with ア (ア + 1-8 random kana), the line 5,000 ア (issue 30);
- "nested": ア, アア, ... (1-100 ア, the longest surface allowed) plus random words, the line
  5,000 ア: every position matches 100 surfaces (the new matcher's worst case);
- "random": random kana words of 2-6 characters, a random kana line.
Plus the server case of the issue: 1,900 imported words of "ああ" against "あ" x 1,000.

Run: ``python benchmarks/userdict_matcher.py`` (``--quick``: 10,000 entries only; ``--no-old``:
skip the old matcher, which takes minutes at 100,000 entries).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

from irodori_speaker.text.dict_match import SurfaceMatcher

KANA = [chr(c) for c in range(ord("ア"), ord("ン") + 1)]
LINE = 5_000

Word = tuple[str, int, str]  # (surface, priority, reading), oldest first


def old_replace(words: list[Word], text: str) -> str:
    """The matcher before issue 30, verbatim in its logic (text/userdict.py `apply`)."""
    index: dict[str, list[Word]] = {}
    for w in words:
        index.setdefault(w[0][0], []).append(w)
    matches: list[tuple[int, int, Word]] = []
    for i, ch in enumerate(text):
        for w in index.get(ch, ()):
            if text.startswith(w[0], i):
                matches.append((i, i + len(w[0]), w))
    if not matches:
        return text
    order = sorted(
        range(len(matches)),
        key=lambda k: (-matches[k][2][1], -(matches[k][1] - matches[k][0]), matches[k][0], -k),
    )
    taken = [False] * len(text)
    chosen: list[tuple[int, int, Word]] = []
    for k in order:
        start, end, w = matches[k]
        if not any(taken[start:end]):
            taken[start:end] = [True] * (end - start)
            chosen.append((start, end, w))
    chosen.sort(key=lambda m: m[0])
    out, pos = [], 0
    for start, end, w in chosen:
        out.append(text[pos:start])
        out.append(w[2])
        pos = end
    out.append(text[pos:])
    return "".join(out)


def new_replace(words: list[Word], text: str) -> str:
    return SurfaceMatcher(words).replace(text)


def _word(rng: random.Random, surface: str) -> Word:
    return (surface, rng.randint(0, 10), "".join(rng.choices(KANA, k=3)))


def case(name: str, n: int, rng: random.Random) -> tuple[list[Word], str]:
    if name == "all ア":
        words = [_word(rng, "ア" + "".join(rng.choices(KANA, k=rng.randint(1, 8)))) for _ in range(n)]
        return words, "ア" * LINE
    if name == "nested":
        words = [_word(rng, "ア" * k) for k in range(1, 101)]
        words += [_word(rng, "".join(rng.choices(KANA, k=rng.randint(2, 6)))) for _ in range(n - 100)]
        return words, "ア" * LINE
    words = [_word(rng, "".join(rng.choices(KANA, k=rng.randint(2, 6)))) for _ in range(n)]
    return words, "".join(rng.choices(KANA, k=LINE))


def cpu(f: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.process_time()
    out = f()
    return time.process_time() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10,000 entries only")
    ap.add_argument("--no-old", action="store_true", help="skip the old matcher")
    args = ap.parse_args()
    rng = random.Random(30)
    rows: list[tuple[str, int, int, float | None, float, float]] = []
    sizes = (10_000,) if args.quick else (10_000, 100_000)
    for n in sizes:
        for name in ("all ア", "nested", "random"):
            words, text = case(name, n, rng)
            rows.append(_measure(name, words, text, args.no_old))
    server = [("ああ", 5, "アア")] * 1_900
    rows.append(_measure("server ああ", server, "あ" * 1_000, args.no_old))
    print("| dictionary | entries | line | old CPU s | new CPU s (build + match) | speed-up |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, n, size, old, build, match in rows:
        new = build + match
        old_s = "-" if old is None else f"{old:.3f}"
        gain = "-" if old is None else f"{old / max(new, 1e-6):.0f}x"
        print(f"| {name} | {n:,} | {size:,} | {old_s} | {new:.3f} ({build:.3f} + {match:.3f}) | {gain} |")


def _measure(name: str, words: list[Word], text: str, no_old: bool):
    build, matcher = cpu(lambda: SurfaceMatcher(words))
    match, new_out = cpu(lambda: matcher.replace(text))
    old = None
    if not no_old:
        old, old_out = cpu(lambda: old_replace(words, text))
        assert old_out == new_out, f"{name}: the matchers disagree"
    return name, len(words), len(text), old, build, match


if __name__ == "__main__":
    main()
