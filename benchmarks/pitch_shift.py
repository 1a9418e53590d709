"""Pitch control (issue 16): accuracy and cost of `audio.controls.pitch_shift` on real speech.

The speech is pyopenjtalk-plus's HTS voice (48 kHz, no model weights needed). For each
interval asked, the f0 is measured before and after with Harvest (run on the output audio):

- "shift, per frame": the median over the frames voiced in both of each frame's f0 ratio
  (what the test asserts within 10 cents),
- "shift of medians": the ratio of the two tracks' medians over those frames (shown for
  honesty: it moves by up to ~90 cents with the estimator's octave errors, see the notes),
- the length change, and the cost in ms of CPU per second of audio (best of --repeat).

With --dio, the same with DIO + StoneMask as the shift's f0 analysis (about half the cost,
more frames half an octave or more off).

A second table measures `intonation` (the scale of the f0 contour about its median) for each
scale asked: the f0 standard deviation in cents after / before (over the frames voiced in
both, leaving out the frames the re-analysis puts > 600 cents off the asked contour: gross
estimator errors, counted), the median f0 change of the frames within 50 cents of the
median the shift scales about (that of its own Harvest analysis of the input: "centre"),
the change of the medians (shown for honesty, as above), the length change and the cost.

    python benchmarks/pitch_shift.py [--repeat 3] [--dio]
"""

from __future__ import annotations

import argparse
import math
import time
import warnings

import numpy as np

SR = 48_000
TEXTS = (
    "こんにちは、今日はいい天気ですね。配信に来てくれてありがとう。",
    "それでは次のコーナーに行きましょう。コメントもどんどん書いてくださいね。",
)
INTERVALS = (-12.0, -7.0, -3.0, -1.0, 1.0, 3.0, 7.0, 12.0)
SCALES = (0.0, 0.5, 0.8, 1.2, 1.5, 2.0)


def pyworld():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        import pyworld as pw
    return pw


def speech() -> np.ndarray:
    import pyopenjtalk

    parts = []
    for text in TEXTS:
        x, sr = pyopenjtalk.tts(text)
        assert sr == SR
        parts.append(np.asarray(x, np.float64) / 32768.0)
    return np.concatenate(parts).astype(np.float32)


def f0_cents(x: np.ndarray) -> np.ndarray:
    """Harvest f0 in cents re 1 Hz (0: unvoiced); 71-1200 Hz: the shift's floor, room above it."""
    f0 = pyworld().harvest(x.astype(np.float64), SR, frame_period=5.0, f0_floor=71.0, f0_ceil=1200.0)[0]
    return np.where(f0 > 0, 1200 * np.log2(np.maximum(f0, 1e-9)), 0.0)


def measure_intonation(fn, x, repeat):
    rows = []
    seconds = len(x) / SR
    a_all = f0_cents(x)
    own = pyworld().harvest(x.astype(np.float64), SR, frame_period=5.0)[0]  # the shift's own analysis
    median = float(np.median(1200 * np.log2(own[own > 0])))  # the centre it scales about
    for k in SCALES:
        best = math.inf
        for _ in range(repeat):
            t0 = time.process_time()
            y = fn(x, SR, 0.0, intonation=k)
            best = min(best, time.process_time() - t0)
        b = f0_cents(y)
        n = min(len(a_all), len(b))
        a, b = a_all[:n], b[:n]
        voiced = (a > 0) & (b > 0)
        good = voiced & (np.abs(b - (median + (a - median) * k)) < 600)
        spread = float(np.std(b[good])) / float(np.std(a[good]))
        centre = good & (np.abs(a - median) < 50)
        rows.append(
            (
                k,
                float(np.std(a[good])),
                spread,
                float(np.median((b - a)[centre])),
                float(np.median(b[voiced]) - np.median(a[voiced])),
                1 - good.sum() / voiced.sum(),
                (len(y) - len(x)) / len(x),
                best * 1000 / seconds,
            )
        )
    return rows


def f0_track(x: np.ndarray) -> np.ndarray:
    return pyworld().harvest(x.astype(np.float64), SR, frame_period=5.0, f0_floor=50.0, f0_ceil=1100.0)[0]


def measure(name, fn, x, f0_before, repeat):
    rows = []
    seconds = len(x) / SR
    for st in INTERVALS:
        best = math.inf
        for _ in range(repeat):
            t0 = time.process_time()
            y = fn(x, SR, st, analysis=name)
            best = min(best, time.process_time() - t0)
        after = f0_track(y)
        n = min(len(after), len(f0_before))
        a, b = f0_before[:n], after[:n]
        voiced = (a > 0) & (b > 0)
        per_frame = float(np.median(1200 * np.log2(b[voiced] / a[voiced])))
        medians = 1200 * math.log2(float(np.median(b[voiced])) / float(np.median(a[voiced])))
        octave = float(np.mean(np.abs(1200 * np.log2(b[voiced] / a[voiced]) - 100 * st) > 600))
        rows.append(
            (
                name,
                st,
                per_frame,
                per_frame - 100 * st,
                medians,
                octave,
                (len(y) - len(x)) / len(x),
                best * 1000 / seconds,
            )
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dio", action="store_true", help="also the DIO-analysis variant (cheaper)")
    args = ap.parse_args()

    from irodori_speaker.audio.controls import pitch_shift

    x = speech()
    before = f0_track(x)
    voiced = before[before > 0]
    print(f"speech: {len(x) / SR:.2f} s of pyopenjtalk HTS speech, median f0 {np.median(voiced):.0f} Hz")
    rows = measure("harvest", pitch_shift, x, before, args.repeat)
    if args.dio:
        rows += measure("dio", pitch_shift, x, before, args.repeat)
    print()
    print(
        "| f0 analysis | asked st | shift, per frame (cents) | error (cents) | shift of medians (cents) "
        "| frames off > 600 cents | length change | CPU ms per s of audio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, st, per_frame, err, medians, octave, length, cost in rows:
        print(
            f"| {name} | {st:+g} | {per_frame:+.1f} | {err:+.1f} | {medians:+.1f} | {octave:.1%} "
            f"| {length:+.2%} | {cost:.0f} |"
        )
    print()
    print(
        "| asked intonation | f0 std before (cents) | std after / before | centre change (cents) "
        "| change of medians (cents) | frames off > 600 cents | length change | CPU ms per s of audio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for row in measure_intonation(pitch_shift, x, args.repeat):
        k, std, spread, centre, medians, gross, length, cost = row
        off = f"{spread / k - 1:+.1%}" if k else "-"
        print(
            f"| {k:g} | {std:.0f} | {spread:.3f} ({off}) | {centre:+.1f} "
            f"| {medians:+.1f} | {gross:.1%} | {length:+.2%} | {cost:.0f} |"
        )


if __name__ == "__main__":
    main()
