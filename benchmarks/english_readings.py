"""Which source reads Latin words as a Japanese viewer expects: pyopenjtalk, alkana, e2k, or a chain?

The list is benchmarks/data/english_words.tsv: 262 English words and names common on
Japanese streams (game and platform names, stream vocabulary, everyday loanwords, names,
acronyms) with the readings a viewer expects (alternatives with ``|``). Each source gives a
katakana reading (or none: a miss, counted wrong); a reading is right when it equals one of
the expected ones, "near" when it is within one katakana of one (edit distance 1, e.g.
ストゥリーム for ストリーム). pyopenjtalk's reading counts only when its dictionary knows
the word (a word it spells letter by letter is a miss); the chains ask each source in turn.

Run: ``python benchmarks/english_readings.py`` (needs the ``english`` and ``ja`` extras, and
``pip install alkana`` for its rows; ``--show-wrong`` lists the misses of the default).
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from irodori_speaker.text import english

DATA = Path(__file__).parent / "data" / "english_words.tsv"


def load() -> list[tuple[str, list[str]]]:
    rows = []
    for line in DATA.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        word, readings = line.split("\t")
        rows.append((word, readings.split("|")))
    return rows


def alkana_word(word: str) -> str | None:
    """alkana's reading (its dictionary, the word as written, then lower-case), or None."""
    try:
        import alkana  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return None
    return alkana.get_kana(word) or alkana.get_kana(word.lower()) or None


def edit_distance(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def phrase(read_word: Callable[[str], str | None]) -> Callable[[str], str | None]:
    """A word reader applied to each word of a phrase ("thank you"); None if any word misses."""

    def read(text: str) -> str | None:
        parts = [read_word(w) for w in text.split()]
        return None if any(p is None for p in parts) else "".join(parts)  # type: ignore[misc]

    return read


def chain(*readers: Callable[[str], str | None]) -> Callable[[str], str | None]:
    def read(word: str) -> str | None:
        for r in readers:
            out = r(word)
            if out:
                return out
        return None

    return read


def acronym_first(rest: Callable[[str], str | None]) -> Callable[[str], str | None]:
    def read(word: str) -> str | None:
        if word.isupper() and len(word) <= 4:
            return english.openjtalk_word(word) or english.spell(word)
        return rest(word)

    return read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--show-wrong", action="store_true")
    args = ap.parse_args()
    rows = load()
    oj, alk, e2k = english.openjtalk_word, alkana_word, english.e2k_word
    sources: dict[str, Callable[[str], str | None]] = {
        "openjtalk": oj,
        "alkana": alk,
        "e2k": e2k,
        "alkana > e2k": chain(alk, e2k),
        "openjtalk > alkana > e2k": chain(oj, alk, e2k),
        "acronyms > openjtalk > e2k": acronym_first(chain(oj, e2k)),
        "acronyms > openjtalk > alkana > e2k": acronym_first(chain(oj, alk, e2k)),
        "word_reading (default: + capitals before a word)": english.word_reading,
    }
    english._e2k()  # model loading is not part of the per-word time
    alkana_word("a")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"{len(rows)} words; {platform.machine()} {platform.python_version()}; commit {commit}")
    print("| source | covered % | right % | right or near % | ms/word |")
    print("|---|---|---|---|---|")
    wrong: list[tuple[str, str | None, list[str]]] = []
    for name, fn in sources.items():
        read = phrase(fn)
        covered = right = near = 0
        t0 = time.perf_counter()
        results = [(w, read(w), exp) for w, exp in rows]
        ms = (time.perf_counter() - t0) * 1000 / len(rows)
        for w, got, exp in results:
            if got is None:
                if name.startswith("word_reading"):
                    wrong.append((w, got, exp))
                continue
            covered += 1
            if got in exp:
                right += 1
                near += 1
            else:
                near += min(edit_distance(got, e) for e in exp) <= 1
                if name.startswith("word_reading"):
                    wrong.append((w, got, exp))
        n = len(rows)
        print(
            f"| {name} | {100 * covered / n:.1f} | {100 * right / n:.1f} | {100 * near / n:.1f} | {ms:.2f} |"
        )
    if args.show_wrong:
        for w, got, exp in wrong:
            print(f"  {w}: {got} (expected {'|'.join(exp)})")


if __name__ == "__main__":
    main()
