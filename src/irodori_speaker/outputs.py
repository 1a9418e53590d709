"""Where the Speaker's audio goes: sound devices, sound files (WAV, FLAC, OGG, Opus, MP3), a null sink.

Every output owns a queue of ready blocks (`Block`) that the event loop appends
to and the output's own thread (PortAudio's callback thread, or a small writer
thread for the file and null sinks) consumes through `Output._render`. That
render path is kept trivial: no locks that synthesis could hold, no large
allocation, only slicing and copying of already-resampled float32 blocks. The
loop talks to it through plain attribute flags and `deque` operations, which
are atomic under the GIL; the render thread reports back through attributes
that the loop polls (~50 Hz).

A `Track` is one line inside one output's queue. Whoever first pops its
`claim` token decides its fate: the render thread (it starts playing) or the
loop (it is dropped before a sample was played). That makes "cancel a line
that may be starting right now" race-free without a lock.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from .errors import AudioError, InputError
from .sample_clock import SampleClock

log = logging.getLogger("irodori_speaker.speaker")


class Track:
    """One line's audio inside one output; shared by the loop and the output thread."""

    __slots__ = ("claim", "done", "dropped", "end_pos", "played", "start_pos", "stop", "stopped", "uid")

    def __init__(self, uid: int) -> None:
        self.uid = uid
        self.claim: deque[int] = deque([1])
        self.stop = False  # loop: fade out and drop the rest
        # written by the output thread (or by the loop when it wins the claim)
        self.start_pos: int | None = None  # output sample index of the first audible sample
        self.end_pos: int | None = None  # output sample index just after the last one
        self.played = 0  # samples of the line output (fade included, lead-in pause excluded)
        self.stopped = False  # ended by a stop request
        self.dropped = False  # never started
        self.done = False


class Block:
    """A run of samples at the output's rate and channel-free (mono) layout."""

    __slots__ = ("data", "last", "offset", "pad", "track")

    def __init__(self, track: Track | None, data: np.ndarray, *, last: bool = False, pad: bool = False):
        self.track = track
        self.data = data
        self.offset = 0
        self.last = last  # the track ends after this block
        self.pad = pad  # lead-in silence (the pause between lines)


class Output:
    """Base class of the Speaker's outputs. Subclasses provide the clock and the thread."""

    #: True when the output consumes audio at (scaled) wall-clock speed, like a sound card.
    realtime = True

    def __init__(self, *, name: str = "output", fade_s: float = 0.01) -> None:
        if not 0.0 <= fade_s <= 0.5:
            raise InputError(f"fade_s must be in [0, 0.5], got {fade_s}")
        self.name = name
        self.fade_s = fade_s
        self.sample_rate = 0
        self.channels = 1
        self.underruns = 0
        self.underrun_uid: int | None = None
        self.error: BaseException | None = None
        self._q: deque[Block] = deque()
        self._reset_render_state()

    # -- lifecycle (called from a worker thread by the Speaker) --------------------------------

    def open(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    @property
    def latency(self) -> float:
        """Seconds from handing a sample to the output until it is heard."""
        return 0.0

    def _reset_render_state(self) -> None:
        self._q.clear()
        self._cur: Block | None = None
        self._track: Track | None = None
        self._pos = 0
        self._stop_left = 0
        self._stopping = False
        self._starving = False
        self._want_pause = False
        self._gain = 0  # fade position: self._fade_n is full volume
        self._clock: tuple[int, int, float] | None = None
        self._fade_n = 0
        self._ramp = np.zeros(0, dtype=np.float32)

    def _prepare(self, sample_rate: int, channels: int) -> None:
        """Set the format and preallocate what the render path needs."""
        self.sample_rate = int(sample_rate)
        self.channels = int(channels)
        self._reset_render_state()
        self._fade_n = max(1, round(self.fade_s * self.sample_rate))
        # cosine fade 1 -> 0 over _fade_n samples: smooth at both ends, no click
        self._ramp = (0.5 + 0.5 * np.cos(np.linspace(0.0, np.pi, self._fade_n + 1)[1:])).astype(np.float32)
        self._ramp_up = self._ramp[::-1].copy()
        self._gain = self._fade_n
        self.error = None

    # -- loop side -------------------------------------------------------------------------------

    def push(self, block: Block) -> None:
        self._q.append(block)
        self._wake()

    def drop_track(self, track: Track) -> bool:
        """Cancel `track`. True if it never started (dropped now); else the thread fades it out."""
        track.stop = True
        try:
            track.claim.popleft()
        except IndexError:
            self._wake()
            return False
        track.dropped = track.done = True
        return True

    def pause(self) -> None:
        self._want_pause = True
        self._wake()

    def resume(self) -> None:
        self._want_pause = False
        self._wake()

    def queued_samples(self) -> int:
        """Samples pushed but not yet handed to the device (an estimate; the thread moves on)."""
        cur = self._cur
        n = len(cur.data) - cur.offset if cur is not None else 0
        return n + sum(len(b.data) - b.offset for b in list(self._q))

    @property
    def position(self) -> int:
        """Samples handed to the device so far (silence included)."""
        return self._pos

    def heard_position(self, t: float) -> float:
        """The output sample being heard at monotonic time `t`."""
        c = self._clock
        if c is None:
            return 0.0
        p0, n, th = c
        return min(float(p0 + n), p0 + (t - th) * self.sample_rate * self._speed())

    def time_at(self, pos: float) -> float:
        """Monotonic time at which output sample `pos` is (or was) heard."""
        c = self._clock
        if c is None:
            return time.monotonic()
        p0, _, th = c
        return th + (pos - p0) / (self.sample_rate * self._speed())

    def _speed(self) -> float:
        return 1.0

    def check(self) -> BaseException | None:
        """The output's failure, if it has failed (polled by the Speaker)."""
        return self.error

    def _wake(self) -> None:
        pass

    # -- output thread -----------------------------------------------------------------------------

    def _render(self, out: np.ndarray) -> int:
        """Fill `out` (frames, channels) with the next audio; returns samples of real audio."""
        n = out.shape[0]
        m = out[:, 0]
        produced = 0
        if self._want_pause:
            if self._gain > 0:  # fade to silence, consuming only the faded samples
                k = min(n, self._gain)
                produced = self._pull(m, k)
                start = self._fade_n - self._gain
                m[:produced] *= self._ramp[start : start + produced]
                self._gain -= k
            tr = self._track
            if self._gain == 0 and tr is not None and tr.stop:
                self._finish(tr, self._pos + produced, stopped=True)
        else:
            produced = self._pull(m, n)
            if self._gain < self._fade_n:
                if produced == 0:
                    self._gain = self._fade_n
                else:
                    k = min(produced, self._fade_n - self._gain)
                    m[:k] *= self._ramp_up[self._gain : self._gain + k]
                    self._gain += k
        m[produced:] = 0.0
        if self.channels > 1:
            out[:, 1:] = out[:, :1]
        return produced

    def _finish(self, tr: Track, pos: int, *, stopped: bool) -> None:
        tr.end_pos = pos
        if tr.start_pos is None:
            tr.start_pos = pos
        tr.stopped = stopped
        tr.done = True
        if self._track is tr:
            self._track = None
        if self._cur is not None and self._cur.track is tr:
            self._cur = None
        self._stopping = False
        self._stop_left = 0

    def _pull(self, m: np.ndarray, k: int) -> int:
        """Copy up to `k` samples of queued audio into m[:k]; returns how many."""
        i = 0
        base = self._pos
        while i < k:
            blk = self._cur
            if blk is None:
                try:
                    blk = self._q.popleft()
                except IndexError:
                    tr = self._track
                    if tr is not None:
                        if tr.stop:
                            self._finish(tr, base + i, stopped=True)
                        elif not self._starving and self.realtime:  # a file has no clock to miss
                            self._starving = True
                            self.underruns += 1
                            self.underrun_uid = tr.uid
                    break
                tr = blk.track
                if tr is not None and tr is not self._track:
                    if tr.done:
                        continue  # leftover block of a dropped or stopped line
                    try:
                        tr.claim.popleft()
                    except IndexError:
                        continue  # the loop dropped it first
                    if self._track is not None:  # the previous line never got its last block
                        self._finish(self._track, base + i, stopped=True)
                    self._track = tr
                self._cur = blk
                self._starving = False
            tr = blk.track
            if tr is not None and tr.done:
                self._cur = None
                continue
            take = min(k - i, len(blk.data) - blk.offset)
            if tr is not None and tr.stop:
                if blk.pad or tr.start_pos is None:  # nothing audible yet: end at once
                    self._finish(tr, base + i, stopped=True)
                    continue
                if not self._stopping:
                    self._stopping = True
                    self._stop_left = self._fade_n
                take = min(take, self._stop_left)
                seg = m[i : i + take]
                seg[:] = blk.data[blk.offset : blk.offset + take]
                start = self._fade_n - self._stop_left
                seg *= self._ramp[start : start + take]
                self._stop_left -= take
            else:
                m[i : i + take] = blk.data[blk.offset : blk.offset + take]
            if tr is not None and not blk.pad:
                if tr.start_pos is None:
                    tr.start_pos = base + i
                tr.played += take
            blk.offset += take
            i += take
            if tr is not None and self._stopping and self._stop_left == 0:
                self._finish(tr, base + i, stopped=True)
            elif blk.offset >= len(blk.data):
                self._cur = None
                if blk.last and tr is not None:
                    self._finish(tr, base + i, stopped=False)
        return i


class NullOutput(Output):
    """Discards audio, at `speed` times real time (inf: as fast as it arrives).

    `speed > 1` is a virtual-time sound card for tests and servers: it keeps the
    pacing of a device (silence when nothing is queued, underruns) but runs
    faster. `latency_s` simulates a DAC delay (in stream seconds). `record=True`
    keeps everything it "played" (`recorded()`).
    """

    def __init__(
        self,
        *,
        speed: float = 1.0,
        sample_rate: int = 48_000,
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


#: The sound files we write, by extension: (libsndfile format, default subtype).
FILE_FORMATS: dict[str, tuple[str, str]] = {
    ".wav": ("WAV", "PCM_16"),
    ".flac": ("FLAC", "PCM_16"),
    ".ogg": ("OGG", "VORBIS"),
    ".opus": ("OGG", "OPUS"),
    ".mp3": ("MP3", "MPEG_LAYER_III"),
}
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


def file_format(
    path: str | os.PathLike[str], subtype: str | None = None, sample_rate: int = 48_000
) -> tuple[str, str]:
    """(format, subtype) for a sound file named `path`, from its extension; AudioError if we cannot."""
    import soundfile as sf

    ext = Path(path).suffix.lower()
    known = ", ".join(FILE_FORMATS)
    if ext not in FILE_FORMATS:
        what = f"unknown extension {ext!r}" if ext else "no extension"
        raise AudioError(
            f"cannot write sound file {os.fspath(path)!r}: {what}", hint=f"end the name in one of {known}"
        )
    fmt, default = FILE_FORMATS[ext]
    sub = (subtype or default).upper()
    if not sf.check_format(fmt, sub):
        raise AudioError(
            f"{ext} files cannot hold subtype {sub!r}",
            hint=f"one of {', '.join(sf.available_subtypes(fmt))}, or leave subtype unset ({default})",
        )
    if sub == "OPUS" and sample_rate not in OPUS_RATES:
        raise AudioError(
            f"Opus cannot store {sample_rate} Hz audio",
            hint=f"use sample_rate one of {', '.join(map(str, OPUS_RATES))}, or another format",
        )
    return fmt, sub


def check_writable(path: str | os.PathLike[str], *, make_parent: bool = False) -> None:
    """AudioError unless a file can be written at `path`.

    Probes for real (opens the file; an existing file is not truncated, a new one is removed
    again), so a read-only place or /proc fails here, before any work. A missing directory is
    an error, or is made with `make_parent` (the command line's `-o out/a.wav`).
    """
    p = Path(path)
    hint = "choose a file in a directory you can write to"
    if p.is_dir():
        raise AudioError(f"cannot write {p}: it is a directory", hint="give a file name, e.g. out.wav")
    if not make_parent and not p.parent.is_dir():
        raise AudioError(f"cannot write {p}: directory {p.parent} does not exist", hint="create it first")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists():
            with open(p, "r+b"):
                pass
        else:
            with open(p, "xb"):
                pass
            p.unlink()
    except OSError as e:
        raise AudioError(f"cannot write {p}: {e.strerror or e}", hint=hint) from e


def write_sound_file(
    path: str | os.PathLike[str], audio: np.ndarray, sample_rate: int, subtype: str | None = None
) -> Path:
    """Write float audio to `path` in the format its extension names (see FILE_FORMATS)."""
    import soundfile as sf

    fmt, sub = file_format(path, subtype, sample_rate)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        sf.write(str(p), audio, sample_rate, format=fmt, subtype=sub)
    except (OSError, RuntimeError, TypeError, ValueError) as e:
        raise AudioError(f"cannot write {p}: {e}", hint="check the path and the free disk space") from e
    return p


class FileOutput(NullOutput):
    """Writes what is played to a sound file, as fast as it arrives.

    The format comes from the extension (FILE_FORMATS: .wav 16-bit PCM, .flac, .ogg Vorbis,
    .opus, .mp3); `subtype` overrides the default one (e.g. "PCM_24", "FLOAT" for WAV). An
    unknown extension, an impossible subtype or a path that cannot be written is an
    `AudioError` when the output is made, before any model work. `sample_rate` (default
    48 kHz, the model's) and `channels` (1 = mono; 2 = the mono line on both) are the file's.
    With `speed=inf` (default) the file is the lines back to back with the
    configured pauses, never waiting silence; a finite `speed` records the
    stream as a sound card would play it, silences and underruns included.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        sample_rate: int = 48_000,
        channels: int = 1,
        subtype: str | None = None,
        speed: float = math.inf,
        fade_s: float = 0.01,
        name: str | None = None,
    ) -> None:
        super().__init__(
            speed=speed, sample_rate=sample_rate, channels=channels, fade_s=fade_s, name=name or str(path)
        )
        self.path = Path(path)
        self.format, self.subtype = file_format(self.path, subtype, sample_rate)
        check_writable(self.path)
        self._file: Any = None

    def _open_sink(self) -> None:
        import soundfile as sf

        try:
            self._file = sf.SoundFile(
                self.path,
                "w",
                samplerate=self.sample_rate,
                channels=self.channels,
                format=self.format,
                subtype=self.subtype,
            )
        except (OSError, RuntimeError, TypeError, ValueError) as e:
            raise AudioError(f"cannot open {self.path} for writing: {e}") from e

    def _write(self, audio: np.ndarray) -> None:
        super()._write(audio)
        self._file.write(audio)

    def _close_sink(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


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
        self._sample_clock = SampleClock(48_000)

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


OutputSpec = Output | str | os.PathLike[str] | None


def _looks_like_a_file(spec: str) -> bool:
    """A path (a separator, or `name.ext` without spaces) rather than a device name ("CABLE Input")."""
    suffix = Path(spec).suffix
    if suffix.lower() in FILE_FORMATS:
        return True
    if any(c.isspace() for c in spec):
        return False
    return "/" in spec or os.sep in spec or (len(suffix) in range(3, 6) and suffix[1:].isalpha())


def make_output(spec: OutputSpec) -> Output:
    """An `Output` from a spec: an Output, "null", a device name, a path (FILE_FORMATS), None."""
    if isinstance(spec, Output):
        return spec
    if spec is None:
        return SoundDeviceOutput(None)
    if isinstance(spec, os.PathLike):
        return FileOutput(spec)
    if isinstance(spec, str):
        if spec == "null":
            return NullOutput()
        if _looks_like_a_file(spec):
            return FileOutput(spec)
        return SoundDeviceOutput(spec)
    raise InputError(f"not an output: {spec!r}", hint="an Output, 'null', a device name or a file path")
