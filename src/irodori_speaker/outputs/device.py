"""Sound-card output through PortAudio (sounddevice), and the device lookup."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np

from ..audio.signal import SAMPLE_RATE
from ..errors import AudioError
from .base import Output
from .clock import SampleClock


def _sounddevice() -> Any:
    try:
        import sounddevice as sd
    except (ImportError, OSError) as e:
        raise AudioError(
            f"sound output is unavailable: {e}",
            hint="install PortAudio (Debian: apt-get install libportaudio2; or run scripts/setup.sh) "
            "and the 'audio' extra (sounddevice)",
        ) from e
    return sd


def list_output_devices() -> list[dict[str, Any]]:
    """Output devices as PortAudio sees them: name, hostapi name, channels, default rate."""
    sd = _sounddevice()
    apis = sd.query_hostapis()
    return [
        {
            "index": d["index"],
            "name": d["name"],
            "hostapi": apis[d["hostapi"]]["name"],
            "channels": d["max_output_channels"],
            "samplerate": d["default_samplerate"],
        }
        for d in sd.query_devices()
        if d["max_output_channels"] > 0
    ]


def find_output_device(name: str | None = None, hostapi: str | None = None) -> dict[str, Any]:
    """The one output device whose name contains `name` (case-insensitive), on `hostapi`.

    An exact name wins over substrings; several host APIs offering the same
    device resolve to the default host API. Anything still ambiguous, or
    nothing found, is an `AudioError` that lists the candidates.
    """
    sd = _sounddevice()
    devices = list_output_devices()
    if name is None:
        try:
            idx = sd.default.device[1]
        except Exception:
            idx = -1
        if idx is None or idx < 0:
            raise AudioError(
                "there is no default output device", hint=_available(devices) or "no output devices at all"
            )
        for d in devices:
            if d["index"] == idx:
                return d
        raise AudioError(f"the default output device ({idx}) has no output channels")
    want = name.lower()
    found = [d for d in devices if want in d["name"].lower()]
    if hostapi is not None:
        found = [d for d in found if hostapi.lower() in d["hostapi"].lower()]
    if not found:
        where = f" on host API {hostapi!r}" if hostapi else ""
        raise AudioError(
            f"no output device matching {name!r}{where}",
            hint=_available(devices) or "no output devices at all",
        )
    exact = [d for d in found if d["name"].lower() == want]
    if exact:
        found = exact
    if len({d["hostapi"] for d in found}) > 1:
        try:
            default_api = sd.query_hostapis(sd.default.hostapi)["name"]
        except Exception:
            default_api = None
        preferred = [d for d in found if d["hostapi"] == default_api]
        found = preferred or found
    if len({(d["name"], d["hostapi"]) for d in found}) > 1:
        listed = "; ".join(f"{d['name']!r} ({d['hostapi']})" for d in found)
        raise AudioError(
            f"output device name {name!r} is ambiguous: {listed}",
            hint="give more of the name, or hostapi=",
        )
    return found[0]


def _available(devices: list[dict[str, Any]]) -> str:
    if not devices:
        return ""
    return "available: " + "; ".join(f"{d['name']!r} ({d['hostapi']})" for d in devices)


class SoundDeviceOutput(Output):
    """A PortAudio output device chosen by a stable name (substring + host API), not an index.

    Opens at the device's default rate (the mixer's, which WASAPI shared mode
    insists on) unless `samplerate` is given; the Speaker resamples to it.
    `latency` is PortAudio's suggested output latency in seconds: it bounds how
    late an interrupt is heard, and how much GIL contention the stream absorbs.
    """

    def __init__(
        self,
        device: str | int | None = None,
        *,
        hostapi: str | None = None,
        samplerate: int | None = None,
        channels: int | None = None,
        latency: float | str = 0.05,
        blocksize: int = 0,
        stall_s: float = 2.0,
        fade_s: float = 0.01,
        name: str | None = None,
    ) -> None:
        label = name or (device if isinstance(device, str) else f"device {device}" if device else "default")
        super().__init__(name=str(label), fade_s=fade_s)
        self.device = device
        self.hostapi = hostapi
        self.samplerate = samplerate
        self.channels_req = channels
        self.latency_req = latency
        self.blocksize = blocksize
        self.stall_s = stall_s
        self.device_info: dict[str, Any] | None = None
        self._stream: Any = None
        self._latency = 0.0
        self._last_cb = 0.0
        self._sample_clock = SampleClock(SAMPLE_RATE)

    @property
    def latency(self) -> float:
        return self._latency

    def open(self, rescan: bool = False) -> None:
        sd = _sounddevice()
        if rescan:
            self._rescan(sd)
        if isinstance(self.device, int):
            info = next((d for d in list_output_devices() if d["index"] == self.device), None)
            if info is None:
                raise AudioError(f"no output device with index {self.device}")
        else:
            try:
                info = find_output_device(self.device, self.hostapi)
            except AudioError:
                if rescan:
                    raise
                self._rescan(sd)  # hot-plugged devices are invisible until PortAudio re-initialises
                info = find_output_device(self.device, self.hostapi)
        rate = int(self.samplerate or info["samplerate"])
        channels = int(self.channels_req or min(2, info["channels"]))
        self._prepare(rate, channels)
        self._sample_clock = SampleClock(rate)
        self.device_info = info
        try:
            stream = sd.OutputStream(
                device=info["index"],
                samplerate=rate,
                channels=channels,
                dtype="float32",
                latency=self.latency_req,
                blocksize=self.blocksize,
                callback=self._callback,
            )
            self._latency = float(stream.latency)
            self._last_cb = time.monotonic()
            stream.start()
        except Exception as e:
            raise AudioError(
                f"cannot open output {info['name']!r} ({info['hostapi']}) at {rate} Hz x{channels}: {e}"
            ) from e
        self._stream = stream

    @staticmethod
    def _rescan(sd: Any) -> None:
        # Pa_Terminate/Pa_Initialize: the only way PortAudio sees devices plugged in after start-up.
        # It closes every open sounddevice stream of the process, so it is tried only on request
        # or when the named device is missing.
        terminate, initialize = getattr(sd, "_terminate", None), getattr(sd, "_initialize", None)
        if terminate is None or initialize is None:
            return
        with contextlib.suppress(Exception):
            terminate()
            initialize()

    def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.stop()
            with contextlib.suppress(Exception):
                stream.close()

    def _callback(self, outdata: np.ndarray, frames: int, time_info: Any, status: Any) -> None:
        now = time.monotonic()
        delay = time_info.outputBufferDacTime - time_info.currentTime
        if not 0.0 < delay < 2.0:  # some host APIs report no DAC time
            delay = self._latency
        # PortAudio's currentTime is taken before this callback waited for the GIL; where it is
        # on the monotonic clock (ALSA, CoreAudio) it is the better "now"
        base = time_info.currentTime if 0.0 <= now - time_info.currentTime < 0.25 else now
        underflow = bool(getattr(status, "output_underflow", False))
        heard = self._sample_clock.observe(self._pos, base + delay, discontinuity=underflow)
        self._clock = (self._pos, frames, heard)
        self._last_cb = now
        self._render(outdata)
        self._pos += frames

    def check(self) -> BaseException | None:
        if self.error is not None:
            return self.error
        stream = self._stream
        if stream is None:
            return None
        try:
            active = stream.active
        except Exception as e:
            active, why = False, str(e)
        else:
            why = "the stream stopped"
        if not active:
            self.error = AudioError(f"output {self.name!r} failed: {why} (device unplugged?)")
        elif time.monotonic() - self._last_cb > self.stall_s:
            self.error = AudioError(f"output {self.name!r} stalled: no audio callback for {self.stall_s} s")
        return self.error
