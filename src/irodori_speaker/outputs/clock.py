"""When an output sample is heard: a line in sample position fitted to a sound card's callbacks.

A PortAudio callback says which samples it delivers (a position) and when the first of them
reaches the DAC (its time info). Taken one callback at a time, that mapping jitters by the
callback's own scheduling delay (the GIL, the host API's thread: -1.1 to +3.8 ms measured on
ALSA). The DAC itself plays samples at a steady rate, so `SampleClock` keeps one line,
``t(pos) = origin + pos / rate``, and moves its origin only as far as the observations force:

- down at once to any observation earlier than the line (a callback is late, never early:
  the earliest one is the least delayed);
- up by at most `drift_ppm` of the elapsed audio (a device clock slower than the monotonic one);
- re-anchored on an underflow (the device played silence we did not count), and when a whole
  window of observations sits more than `jump_s` above the line (a stall without a flag).

Between such events the times of any two samples differ by exactly their distance / rate."""

from __future__ import annotations

import math

__all__ = ["SampleClock"]


class SampleClock:
    def __init__(
        self, rate: int, *, drift_ppm: float = 200.0, jump_s: float = 0.015, window: int = 16
    ) -> None:
        self.rate = rate
        self.drift = drift_ppm * 1e-6
        self.jump_s = jump_s
        self.window = window
        self.origin: float | None = None  # monotonic time of sample 0
        self.anchors = 0  # how often the line was (re)anchored
        self._last_pos = 0
        self._window_min = math.inf
        self._seen = 0

    def observe(self, pos: int, t: float, *, discontinuity: bool = False) -> float:
        """Sample `pos` was reported heard at monotonic time `t`; returns the line's time for it."""
        obs = t - pos / self.rate
        origin = self.origin
        if origin is None or discontinuity:
            origin = self._anchor(obs)
        else:
            creep = self.drift * max(0, pos - self._last_pos) / self.rate
            origin = self.origin = min(obs, origin + creep)
            self._window_min = min(self._window_min, obs)
            self._seen += 1
            if self._seen >= self.window:
                if self._window_min - origin > self.jump_s:
                    origin = self._anchor(self._window_min)
                self._window_min, self._seen = math.inf, 0
        self._last_pos = pos
        return origin + pos / self.rate

    def _anchor(self, origin: float) -> float:
        self.origin = origin
        self.anchors += 1
        self._window_min, self._seen = math.inf, 0
        return origin
