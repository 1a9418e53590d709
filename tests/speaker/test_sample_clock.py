"""The sample clock behind PortAudio event times (outputs/clock.py): a line in sample position,
moved only as far as the callbacks' observations force."""

from __future__ import annotations

import numpy as np

from irodori_speaker.outputs.clock import SampleClock

RATE = 48_000
BLOCK = 512


def _observations(n: int, *, origin: float = 100.0, ppm: float = 0.0, seed: int = 0):
    """Block starts and their reported DAC times: the true line plus a callback delay in [0, 4] ms,
    exact (no delay) for one callback in ten."""
    rng = np.random.default_rng(seed)
    for k in range(n):
        pos = k * BLOCK
        delay = 0.0 if k % 10 == 0 else rng.uniform(0, 4e-3)
        yield pos, origin + pos / RATE * (1 + ppm * 1e-6) + delay


def test_callback_delays_do_not_enter_the_times() -> None:
    clock = SampleClock(RATE)
    times = [clock.observe(p, t) for p, t in _observations(500)]
    true = 100.0 + np.arange(500) * BLOCK / RATE
    assert np.abs(np.array(times) - true).max() < 0.2e-3  # the delays were up to 4 ms
    assert clock.anchors == 1


def test_a_device_clock_slower_than_the_monotonic_one_is_followed() -> None:
    clock = SampleClock(RATE)
    obs = list(_observations(2000, ppm=100.0))  # 21 s of audio, 2.1 ms of drift
    times = [clock.observe(p, t) for p, t in obs]
    true = 100.0 + np.arange(2000) * BLOCK / RATE * (1 + 1e-4)
    assert np.abs(np.array(times) - true).max() < 0.3e-3 and clock.anchors == 1


def test_an_underflow_or_a_sustained_jump_re_anchors() -> None:
    clock = SampleClock(RATE)
    for p, t in _observations(50):
        clock.observe(p, t)
    pos = 50 * BLOCK
    # the device played 30 ms of silence we did not count: flagged
    heard = clock.observe(pos, 100.0 + pos / RATE + 0.03, discontinuity=True)
    assert abs(heard - (100.0 + pos / RATE + 0.03)) < 1e-9 and clock.anchors == 2
    # then a 40 ms stall without a flag: re-anchored within one window of callbacks
    later = [clock.observe(p + pos, t + pos / RATE + 0.07) for p, t in _observations(40)]
    assert clock.anchors == 3
    assert abs(later[-1] - (100.0 + (39 * BLOCK + pos) / RATE + 0.07)) < 0.2e-3
