"""The real playback path: sounddevice -> PortAudio -> ALSA, on the virtual device of .ci/virtual-audio.sh.

"irodori_virtual" is ALSA's file plugin over its null device, writing the raw
stream to the FIFO named by IRODORI_ALSA_TAP. A reader thread here drains that
FIFO at the stream's real-time rate, which both gives the device a clock (the
writes block when the FIFO is full, as a sound card would) and lets the test
check what PortAudio actually played. Skips where PortAudio or the device is
missing, but fails under CI (CI runs .ci/virtual-audio.sh first, so it must be there).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import threading
import time

import numpy as np
import pytest
from speaker_fakes import EventLog, FakeSynth, amplitude

from irodori_speaker.outputs import SoundDeviceOutput, find_output_device
from irodori_speaker.speaker import Speaker, UtteranceState

DEVICE = "irodori_virtual"
F_SETPIPE_SZ = 1031


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI runs .ci/virtual-audio.sh, which must provide it")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def virtual_device() -> dict:
    try:
        import sounddevice  # noqa: F401
    except (ImportError, OSError) as e:
        _unavailable(
            f"PortAudio is unavailable ({e}); run scripts/setup.sh as root (it installs libportaudio2)"
        )
    try:
        return find_output_device(DEVICE, hostapi="ALSA")
    except Exception as e:
        _unavailable(f"the ALSA device {DEVICE!r} is not configured ({e}); run .ci/virtual-audio.sh as root")
    raise AssertionError("unreachable")


def _longest_run(mask: np.ndarray) -> tuple[int, int, int]:
    """(first, last, length) of the longest run of True in `mask` ((0, 0, 0) if none)."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if len(starts) == 0:
        return (0, 0, 0)
    k = int(np.argmax(ends - starts))
    return (int(starts[k]), int(ends[k]) - 1, int(ends[k] - starts[k]))


class Tap:
    """Reads the FIFO ALSA writes into, at `rate` frames per second."""

    def __init__(self, path: str, frame_bytes: int, rate: int) -> None:
        self.path = path
        self.bytes_per_s = frame_bytes * rate
        self.data = bytearray()
        self.opened = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="test-alsa-tap", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            with open(self.path, "rb", buffering=0) as f:  # blocks until ALSA opens the device
                self.opened += 1
                with contextlib.suppress(OSError):
                    fcntl.fcntl(f.fileno(), F_SETPIPE_SZ, 4096)
                t0, got = time.monotonic(), 0
                while True:
                    b = f.read(4096)
                    if not b:
                        break
                    self.data.extend(b)
                    got += len(b)
                    ahead = got / self.bytes_per_s - (time.monotonic() - t0)
                    if ahead > 0 and not self._stop:
                        time.sleep(ahead)

    def stop(self) -> None:
        self._stop = True
        # a reader still waiting in open(): give it a writer so it returns
        with contextlib.suppress(OSError):
            fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        self._thread.join(timeout=5)


def test_speech_goes_through_portaudio_alsa_in_order_with_lip_sync_and_a_clean_stop(
    run, virtual_device, tmp_path, monkeypatch
):
    rate, channels = int(virtual_device["samplerate"]), min(2, virtual_device["channels"])
    fifo = str(tmp_path / "tap")
    os.mkfifo(fifo)
    monkeypatch.setenv("IRODORI_ALSA_TAP", fifo)  # read by ALSA when the stream opens
    tap = Tap(fifo, 4 * channels, rate)
    tap.start()
    fake = FakeSynth(seconds_per_char=0.03)
    lines = ["本物の再生経路です", "二行目も順番どおり"]
    long = "この長い行は途中で止めますので最後まで聞こえません"
    out = SoundDeviceOutput(DEVICE, hostapi="ALSA", latency=0.05)

    async def body():
        async with Speaker(fake, output=out, pause_s=0.1) as s:
            log = EventLog(s)
            hs = [s.enqueue(t) for t in lines]
            await asyncio.gather(*hs)
            cut = s.enqueue(long)
            while cut.state != UtteranceState.PLAYING:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            s.interrupt()
            await cut
            return log, hs, cut

    try:
        log, hs, cut = run(body())
    finally:
        tap.stop()
    assert out.sample_rate == rate and out.latency > 0
    assert all(h.state == UtteranceState.PLAYED for h in hs)
    assert cut.state == UtteranceState.INTERRUPTED and 0 < cut.played_fraction < 1
    assert log.of("mouth") and log.of("mouth")[-1].level == 0.0
    assert tap.opened >= 1

    frames = np.frombuffer(bytes(tap.data[: len(tap.data) // (4 * channels) * 4 * channels]), np.float32)
    frames = frames.reshape(-1, channels)
    assert np.array_equal(frames[:, 0], frames[:, -1])  # mono copied to every channel
    x = frames[:, 0]
    # each line came out of the device at the device rate, in order, at its level
    spans = [_longest_run(np.abs(x - amplitude(t)) < 2e-3) for t in [*lines, long]]
    assert all(n > 0.1 * rate for _, _, n in spans), spans
    assert spans[0][1] < spans[1][0] < spans[2][0]
    for (_, _, n), t in zip(spans[:2], lines):
        assert abs(n - fake.samples_for(t) * rate / 48_000) < 0.02 * n
    # the interrupted line ends in a fade, not a cliff
    end = spans[2][1]
    tail = x[end : end + round(0.012 * rate)]
    assert tail[0] <= amplitude(long) + 1e-3 and np.all(np.diff(tail) <= 2e-3) and abs(tail[-1]) < 0.02


class _ClockLog(SoundDeviceOutput):
    """The real output, keeping what each callback made of the clock: (position, heard, anchors)."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.log: list[tuple[int, float, int]] = []

    def _callback(self, outdata, frames, time_info, status) -> None:
        super()._callback(outdata, frames, time_info, status)
        p0, _, heard = self._clock
        self.log.append((p0, heard, self._sample_clock.anchors))


def test_event_times_follow_the_stream_sample_clock(virtual_device, tmp_path, monkeypatch):
    """Issue 12: event times on PortAudio were off by -1.1 to +3.8 ms against the sample
    positions (each callback's own delay entered them). From the stream's sample clock, the time
    of every sample is origin + position / rate: over a steady stretch the origin the callbacks
    imply moves by the drift allowance from one callback to the next (not by their delays) and
    stays within 1 ms of a steady drift, whichever callback computed it (0.08 ms measured on an
    idle machine). The drift itself is the null device's clock against the monotonic one: ~900
    ppm under the suite's load (1.16 ms over the stretch, a CI failure at b13a892), so it is
    taken out before the spread is measured, and only bounded."""
    rate, channels = int(virtual_device["samplerate"]), min(2, virtual_device["channels"])
    fifo = str(tmp_path / "tap")
    os.mkfifo(fifo)
    monkeypatch.setenv("IRODORI_ALSA_TAP", fifo)
    tap = Tap(fifo, 4 * channels, rate)
    tap.start()
    out = _ClockLog(DEVICE, hostapi="ALSA", latency=0.05)
    try:
        out.open()
        time.sleep(1.5)
    finally:
        out.close()
        tap.stop()
    log = np.array(out.log)
    assert out.sample_rate == rate and len(log) > 40
    steady = log[log[:, 0] >= 0.3 * rate]  # after the start-up burst that fills the buffer
    segments = [steady[steady[:, 2] == a] for a in np.unique(steady[:, 2])]  # between re-anchors
    longest = max(segments, key=len)
    assert longest[-1, 0] - longest[0, 0] > 0.5 * rate, (len(segments), [len(s) for s in segments])
    origin = longest[:, 1] - longest[:, 0] / rate
    step = np.abs(np.diff(origin))  # callback to callback: the drift allowance, not their delays
    assert np.percentile(step, 90) < 50e-6, np.percentile(step, 90)  # was ~0.9 ms
    slope, _ = np.polyfit(longest[:, 0] / rate, origin, 1)  # seconds of drift per second
    assert abs(slope) < 5e-3, slope  # a sound card's clock, not a broken one (5,000 ppm)
    wander = origin - slope * longest[:, 0] / rate
    assert np.ptp(wander) < 1e-3, (np.ptp(wander), np.ptp(origin), slope)
