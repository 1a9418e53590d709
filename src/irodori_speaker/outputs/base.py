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

import logging
import time
from collections import deque

import numpy as np

from ..errors import InputError

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
