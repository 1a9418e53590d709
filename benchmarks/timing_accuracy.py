"""How far are the estimated mora and word times (timing/estimate.py) from the truth?

Truth: pyopenjtalk's own HTS voice speaking the sentence. Its duration model gives each
full-context label (phoneme) a length from that label alone, so synthesising one label at a
time gives exactly the frames it has in the whole sentence (checked: the sum equals the
whole synthesis, sample for sample). Those are the true phoneme boundaries of that speech.

Estimate: `estimate_timing(text, seconds, speech=...)` as the Speaker calls it, with the
voiced span found by `speech_span` on the synthesised audio (as in the Speaker) or given
exactly ("span: truth"). Rows: the mean-phoneme table fitted on all 50 sentences (in-sample),
the same fitted on one half and scored on the other (2-fold, out-of-sample), and a uniform
baseline (every mora the same length). Errors are |estimated - true| start times, in ms, over
every mora and every word of the 50 sentences of benchmarks/duration_estimate.py (its 45 and
news5).

Run: ``python benchmarks/timing_accuracy.py`` (``--fit`` prints the table for timing/estimate.py).
HTS is a proxy: Irodori's own timing is not known here (no alignment, no real weights).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import platform
import sys
from collections import defaultdict
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from duration_estimate import SENTENCES, _news5

from irodori_speaker.timing import estimate as timing


def truth(pj, engine, text: str):
    """(phoneme list, their seconds, the whole audio) of HTS speaking `text`."""
    labels = pj.extract_fullcontext(text)
    fs = engine.get_sampling_frequency()
    phones = [lab.split("-")[1].split("+")[0] for lab in labels]
    secs = [len(engine.synthesize([lab])) / fs for lab in labels]
    audio = engine.synthesize(labels)
    return phones, secs, audio, fs


def true_starts(phones, secs):
    """Start times of each mora and of each morpheme's first mora, walking like the estimator."""
    t, out, c_start = 0.0, [], None
    for p, d in zip(phones, secs, strict=True):
        if p in ("sil", "pau"):
            c_start = None
        elif p.lower() in timing.VOWELS or p in ("N", "cl"):
            out.append(c_start if c_start is not None else t)
            c_start = None
        elif c_start is None:
            c_start = t
        t += d
    return out


def fit(rows) -> tuple[dict[str, float], float]:
    """(mean seconds per phoneme, the lengthening of a vowel before a pause or the end)."""
    acc: dict[str, list[float]] = defaultdict(list)
    final: list[float] = []
    for phones, secs, *_ in rows:
        for j, (p, d) in enumerate(zip(phones, secs, strict=True)):
            if p == "sil":
                continue
            key = p.lower() if p.lower() in timing.VOWELS else p
            acc[key].append(d)
            if key in timing.VOWELS and j + 1 < len(phones) and phones[j + 1] in ("pau", "sil"):
                final.append(d)
    means = {k: float(np.mean(v)) for k, v in acc.items() if len(v) >= 3}
    vowel = np.mean([d for k in timing.VOWELS for d in acc[k]])
    return means, float(np.mean(final) / vowel)


def score(rows, table, final, span_mode: str):
    mora_err, word_err = [], []
    with (
        mock.patch.dict(timing.PHONEME_SECONDS, table, clear=True),
        mock.patch.object(timing, "FINAL_LENGTHENING", final),
    ):
        for phones, secs, audio, fs, text in rows:
            total = sum(secs)
            if span_mode == "truth":
                speech = (secs[0], total - secs[-1])
            else:
                speech = timing.speech_span(audio.astype(np.float32) / 32768.0, fs)
            est = timing.estimate_timing(text, len(audio) / fs, speech=speech)
            starts = true_starts(phones, secs)
            if est is None or len(est.moras) != len(starts):
                raise SystemExit(f"mora count differs for {text!r}")
            mora_err += [abs(m.start - s) for m, s in zip(est.moras, starts, strict=True)]
            # a word's true start: the true start of its first mora
            index = {id(m): i for i, m in enumerate(est.moras)}
            first = {}
            for w in est.words:
                ms = [m for m in est.moras if w.start <= m.start < w.end + 1e-9]
                if ms:
                    first[w] = index[id(ms[0])]
            word_err += [abs(w.start - starts[i]) for w, i in first.items()]
    m, w = np.array(mora_err) * 1000, np.array(word_err) * 1000
    return m, w


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="print the fitted table for timing/estimate.py")
    args = ap.parse_args()
    with contextlib.redirect_stdout(io.StringIO()):
        import pyopenjtalk as pj
    engine = pj.HTSEngine(pj.DEFAULT_HTS_VOICE)
    texts = list(dict.fromkeys([*SENTENCES, *_news5()]))
    rows = [(*truth(pj, engine, t), t) for t in texts]
    means, final = fit(rows)
    if args.fit:
        print({k: round(v, 4) for k, v in sorted(means.items())}, "final", round(final, 3))
    halves = (rows[0::2], rows[1::2])
    uniform = {"a": 0.1, "i": 0.1, "u": 0.1, "e": 0.1, "o": 0.1, "N": 0.1, "cl": 0.1, "pau": 0.1, "C": 0.0}
    results = []
    shipped = dict(timing.PHONEME_SECONDS), timing.FINAL_LENGTHENING
    for span in ("detected", "truth"):
        results.append(("timing.py as shipped", span, *score(rows, *shipped, span)))
        results.append(("table fitted on all (in-sample)", span, *score(rows, means, final, span)))
        ms, ws = [], []
        for train, test in (halves, halves[::-1]):
            f, fl = fit(train)
            m, w = score(test, f, fl, span)
            ms.append(m)
            ws.append(w)
        results.append(
            ("table fitted on the other half (2-fold)", span, np.concatenate(ms), np.concatenate(ws))
        )
        results.append(("uniform morae (baseline)", span, *score(rows, uniform, 1.0, span)))
    print(
        f"{len(rows)} sentences, {sum(len(true_starts(r[0], r[1])) for r in rows)} morae; "
        f"{platform.machine()} Python {platform.python_version()}"
    )
    print("| estimator | span | mora mean ms | mora p95 ms | word mean ms | word p95 ms | word max ms |")
    print("|---|---|---|---|---|---|---|")
    for name, span, m, w in results:
        print(
            f"| {name} | {span} | {m.mean():.0f} | {np.percentile(m, 95):.0f} | {w.mean():.0f} | "
            f"{np.percentile(w, 95):.0f} | {w.max():.0f} |"
        )


if __name__ == "__main__":
    main()
