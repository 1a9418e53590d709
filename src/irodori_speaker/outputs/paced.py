"""Outputs paced by the monotonic clock instead of a sound card: the base of the null and file sinks."""

from __future__ import annotations

import logging
import math
import threading
import time

import numpy as np

from ..audio.signal import SAMPLE_RATE
from ..errors import InputError
from .base import Output

log = logging.getLogger("irodori_speaker.speaker")


class PacedOutput(Output):
    """Plays into nothing at `speed` times real time (inf: as fast as it arrives); the base of the
    null and file sinks.

    `speed > 1` is a virtual-time sound card for tests and servers: it keeps the
    pacing of a device (silence when nothing is queued, underruns) but runs
    faster. `latency_s` simulates a DAC delay (in stream seconds). `record=True`
    keeps everything it "played" (`recorded()`).
    """

    def __init__(
        self,
        *,
        speed: float = 1.0,
        sample_rate: int = SAMPLE_RATE,
        channels: int = 1,
        block_s: float = 0.01,
        record: bool = False,
        latency_s: float = 0.0,
        fade_s: float = 0.01,
        name: str = "null",
    ) -> None:
        super().__init__(name=name, fade_s=fade_s)
        if not speed > 0:
            raise InputError(f"speed must be positive (inf for instant), got {speed}")
        if not 0.0 <= latency_s < 10.0:
            raise InputError(f"latency_s must be in [0, 10), got {latency_s}")
        self.latency_s = latency_s
        if sample_rate <= 0 or channels <= 0 or not block_s > 0:
            raise InputError("sample_rate, channels and block_s must be positive")
        self.speed = float(speed)
        self.realtime = math.isfinite(self.speed)
        self._rate_req = int(sample_rate)
        self._channels_req = int(channels)
        self.block_s = block_s
        self.record = record
        self._recorded: list[np.ndarray] = []
        self._thread: threading.Thread | None = None
        self._running = False
        self._event = threading.Event()

    @property
    def latency(self) -> float:
        return self.latency_s / self.speed if self.realtime else 0.0

    def _speed(self) -> float:
        return self.speed if self.realtime else math.inf

    def heard_position(self, t: float) -> float:
        if not self.realtime:
            return float(self._pos)
        return super().heard_position(t)

    def time_at(self, pos: float) -> float:
        if not self.realtime:
            return time.monotonic()
        return super().time_at(pos)

    def open(self) -> None:
        self._prepare(self._rate_req, self._channels_req)
        self._recorded = []
        self._open_sink()
        self._running = True
        self._thread = threading.Thread(target=self._run, name=f"irodori-{self.name}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._running = False
        self._event.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        self._close_sink()

    def _open_sink(self) -> None:
        pass

    def _close_sink(self) -> None:
        pass

    def _write(self, audio: np.ndarray) -> None:
        if self.record:
            self._recorded.append(audio.copy())

    def _wake(self) -> None:
        self._event.set()

    def recorded(self) -> np.ndarray:
        """Everything output so far, (samples, channels) float32 (needs `record=True`)."""
        if not self._recorded:
            return np.zeros((0, self.channels), dtype=np.float32)
        return np.concatenate(self._recorded)

    def _run(self) -> None:
        n = max(1, round(self.block_s * self.sample_rate))
        buf = np.zeros((n, self.channels), dtype=np.float32)
        try:
            if self.realtime:
                self._run_paced(buf)
            else:
                self._run_instant(buf)
        except BaseException as e:  # a failing sink reports and stops, like an unplugged device
            log.exception("output %s failed", self.name)
            self.error = e

    def _run_paced(self, buf: np.ndarray) -> None:
        n = buf.shape[0]
        period = n / (self.sample_rate * self.speed)
        next_t = time.monotonic()
        while self._running:
            self._clock = (self._pos, n, next_t + self.latency)  # heard `latency` after it is handed over
            self._render(buf)
            self._pos += n
            self._write(buf)
            next_t += period
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -0.25:  # starved of CPU: resync instead of racing to catch up
                next_t = time.monotonic()

    def _run_instant(self, buf: np.ndarray) -> None:
        while self._running:
            self._event.clear()
            produced = self._render(buf)
            self._clock = (self._pos, produced, time.monotonic())
            self._pos += produced
            if produced:
                self._write(buf[:produced])
            else:
                self._event.wait(0.05)


class NullOutput(PacedOutput):
    """Discards audio (a `PacedOutput` that writes nowhere): a virtual sound card for tests, servers
    and a bot with no speakers."""
