"""How well are numbers, dates, times and units read, before and after text/numbers.py?

Each line of benchmarks/data/number_readings.tsv is a written form and the reading a viewer
expects (katakana). "before" is pyopenjtalk's reading of the normalised text as it is,
"after" of the text after `read_numbers`; a row is right when the reading equals the
expected one. pyopenjtalk (the ``ja`` extra) is the reader: the project counts morae with it
and it is the closest offline proxy for how the text is read.

Run: ``python benchmarks/readings_numbers.py`` (``--all`` prints every row, not only changes).
"""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

from irodori_speaker.text.normalize import normalize_text
from irodori_speaker.text.numbers import read_numbers

DATA = Path(__file__).parent / "data" / "number_readings.tsv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true")
    args = ap.parse_args()
    with contextlib.redirect_stdout(io.StringIO()):
        import pyopenjtalk
    rows = [
        line.split("\t")
        for line in DATA.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    right_before = right_after = 0
    print("| written | before | after | expected |")
    print("|---|---|---|---|")
    for written, expected in rows:
        text = normalize_text(written)
        before = pyopenjtalk.g2p(text, kana=True)
        after = pyopenjtalk.g2p(read_numbers(text), kana=True)
        right_before += before == expected
        right_after += after == expected
        if args.all or before != after or after != expected:
            mark = "" if after == expected else " **wrong**"
            print(f"| `{written}` | {before} | {after}{mark} | {expected} |")
    n = len(rows)
    print(
        f"\n{n} cases: right before {right_before} ({100 * right_before / n:.0f} %), "
        f"after {right_after} ({100 * right_after / n:.0f} %)"
    )


if __name__ == "__main__":
    main()
