"""The loop side of playback: lines handed to the outputs, and what the listener hears.

The `Player` pushes each line's audio to every output as one `Track` (see
outputs/base.py), keeps at most the current line and the next one inside the
outputs (so a high-priority line can still go next), and polls the outputs
about 50 times a second to turn their sample positions into events: playback
started / finished / interrupted at the moment the sound card plays it, the
lip-sync stream, underruns, and output failures.

The first healthy output is the clock: its DAC time decides when a line
"is heard"; the others play the same blocks at their own rates.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..audio.lipsync import Envelope
from ..audio.signal import resample
from ..outputs import Block, Output, Track
from .events import (
    Event,
    LineTimingEvent,
    Mouth,
    OutputError,
    PlaybackFinished,
    PlaybackInterrupted,
    PlaybackStarted,
    Underrun,
    Viseme,
    WordEvent,
)


@dataclass
class Chunk:
    """Audio of one line at the synthesizer's rate, plus the same audio at each output rate."""

    audio: np.ndarray
    by_rate: dict[int, np.ndarray] = field(default_factory=dict)

    def at(self, rate: int, source_rate: int) -> np.ndarray:
        got = self.by_rate.get(rate)
        if got is None:
            if rate == source_rate or len(self.audio) == 0:
                got = self.audio
            else:  # an output reopened at a rate the worker did not know
                got = resample(self.audio, source_rate, rate)
            self.by_rate[rate] = got
        return got


class PlayItem:
    """A line inside the outputs."""

    def __init__(self, uid: int, text: str, envelope: Envelope) -> None:
        self.uid = uid
        self.text = text
        self.tracks: dict[int, Track] = {}  # id(output) -> its track
        self.envelope = envelope
        self.ended = False  # the last chunk has been pushed
        self.started_at: float | None = None  # monotonic time its first sample was heard
        self.finished_at: float | None = None
        self.outcome: str | None = None  # "played" | "interrupted" | "dropped" | "lost"
        self.played_s = 0.0
        self.played_fraction = 0.0  # set by the Speaker when it ends
        self.heard_text = ""
        self.latency = 0.0  # enqueue -> first sample heard, set by the Speaker
        self.stop_requested = False
        self.timing: Any = None  # timing.LineTiming (seconds into the line), set when known
        self.timing_sent = False
        self.next_word = 0
        self.visemes: list[tuple[float, str]] | None = None
        self.next_viseme = 0

    def retimed(self, timing: Any) -> None:
        """A newer timing of the line: what is not announced yet follows it (the words and
        visemes already sent stay sent)."""
        self.timing = timing
        self.visemes = None  # remade from `timing` at the next announcement


class Player:
    """Feeds the outputs and reports what is heard. Runs on the event loop only."""

    def __init__(
        self,
        outputs: list[Output],
        *,
        source_rate: int,
        pause_s: float,
        emit: Callable[[Event], None],
        on_started: Callable[[PlayItem], None],
        on_finished: Callable[[PlayItem], None],
        lipsync_lead_s: float = 0.0,
        clock: Callable[[], float],
    ) -> None:
        self.outputs = outputs
        self.source_rate = source_rate
        self.pause_s = pause_s
        self.emit = emit
        self.on_started = on_started
        self.on_finished = on_finished
        self.lead = lipsync_lead_s
        self.clock = clock
        self.items: deque[PlayItem] = deque()
        self.failed: set[int] = set()
        self.paused = False
        self.last_end: float | None = None  # when the last line finished being heard
        self._underruns = {id(o): 0 for o in outputs}
        self._mouth_open: int | None = None

    # -- state -----------------------------------------------------------------------------------

    @property
    def healthy(self) -> list[Output]:
        return [o for o in self.outputs if id(o) not in self.failed]

    @property
    def primary(self) -> Output | None:
        h = self.healthy
        return h[0] if h else None

    @property
    def busy(self) -> bool:
        return bool(self.items)

    def pending_seconds(self, now: float) -> float:
        """Audio pushed to the clock output but not heard yet."""
        o = self.primary
        if o is None or not self.items:
            return 0.0
        in_device = max(0.0, o.position - o.heard_position(now))
        return (in_device + o.queued_samples()) / o.sample_rate

    def can_push(self, now: float, ahead_s: float) -> bool:
        """Room for the next line: nothing playing, or the current line fully pushed and nearly done."""
        if self.primary is None:
            return False
        if not self.items:
            return True
        if len(self.items) > 1 or not self.items[-1].ended:
            return False
        return self.pending_seconds(now) <= ahead_s

    # -- pushing -----------------------------------------------------------------------------------

    def start(self, uid: int, text: str, envelope: Envelope) -> PlayItem:
        """Begin a line (its chunks follow through `add`); the pause goes in front of it."""
        now = self.clock()
        item = PlayItem(uid, text, envelope)
        clock = self.primary
        if self.items:
            pad_s = self.pause_s
        elif self.last_end is None:
            pad_s = 0.0
        elif clock is not None and not clock.realtime:
            pad_s = self.pause_s  # a file's timeline has no wall-clock idle time to count
        else:  # the silence since the last line counts towards the pause
            pad_s = max(0.0, min(self.pause_s, self.pause_s - (now - self.last_end)))
        for o in self.healthy:
            tr = Track(uid)
            item.tracks[id(o)] = tr
            n = round(pad_s * o.sample_rate)
            if n:
                o.push(Block(tr, np.zeros(n, dtype=np.float32), pad=True))
        self.items.append(item)
        return item

    def add(self, item: PlayItem, chunk: Chunk, *, last: bool = False) -> None:
        if item.ended or item.stop_requested:
            return
        item.envelope.append(chunk.audio)
        for o in self.healthy:
            tr = item.tracks.get(id(o))
            if tr is None:
                continue
            o.push(Block(tr, chunk.at(o.sample_rate, self.source_rate), last=last))
        if last:
            item.ended = True

    def end(self, item: PlayItem) -> None:
        """No more audio for `item`."""
        if not item.ended:
            self.add(item, Chunk(np.zeros(0, dtype=np.float32)), last=True)

    def stop(self, item: PlayItem) -> None:
        """Fade `item` out now (or drop it if it has not started)."""
        if item.outcome is not None or item.stop_requested:
            return
        item.stop_requested = True
        dropped_everywhere = True
        for o in self.outputs:
            tr = item.tracks.get(id(o))
            if tr is not None and not o.drop_track(tr):
                dropped_everywhere = dropped_everywhere and id(o) in self.failed
        if dropped_everywhere:
            self._complete(item, "dropped", self.clock())

    def pause(self) -> None:
        self.paused = True
        for o in self.outputs:
            o.pause()

    def resume(self) -> None:
        self.paused = False
        for o in self.outputs:
            o.resume()

    # -- polling -----------------------------------------------------------------------------------

    def poll(self) -> list[PlayItem]:
        """Advance events to what has been heard by now; returns the items taken off the queue
        because every output failed (they never started: the Speaker queues them again)."""
        now = self.clock()
        lost = self._check_outputs(now)
        o = self.primary
        if o is not None:
            self._check_underruns()
            for item in list(self.items):
                self._advance(item, o, now)
        self._lipsync(o, now)
        self._timing(o, now)
        return lost

    def _advance(self, item: PlayItem, o: Output, now: float) -> None:
        tr = item.tracks.get(id(o))
        if tr is None:  # pushed before this output became the clock: follow the output it had
            tr = next((t for k, t in item.tracks.items() if k not in self.failed), None)
            if tr is None:
                return
        heard = o.heard_position(now)
        start = tr.start_pos
        audible = start is not None and not tr.dropped and not (tr.stopped and tr.played == 0)
        if item.started_at is None and audible and start is not None and heard >= start:
            item.started_at = min(now, o.time_at(start))
            self.on_started(item)
            self.emit(PlaybackStarted(item.started_at, item.uid, item.text, item.latency))
        if tr.done and tr.end_pos is not None and heard >= tr.end_pos:
            if item.timing is not None and not tr.dropped and tr.start_pos is not None:
                # the end came within this poll: what it reached is still announced, in order
                self._timing_of(item, o, tr, (tr.end_pos - tr.start_pos) / o.sample_rate, now)
            item.played_s = tr.played / o.sample_rate
            outcome = "interrupted" if tr.stopped else "played"
            if tr.stopped and item.started_at is None:
                outcome = "dropped"
            self._complete(item, outcome, min(now, o.time_at(tr.end_pos)))

    def _complete(self, item: PlayItem, outcome: str, t: float) -> None:
        if item.outcome is not None:
            return
        item.outcome = outcome
        item.finished_at = t
        if outcome in ("played", "interrupted"):
            self.last_end = t
        if self._mouth_open == item.uid:
            self.emit(Mouth(t, 0.0, item.uid))
            self._mouth_open = None
        if item.visemes is not None and item.next_viseme < len(item.visemes):
            item.next_viseme = len(item.visemes)  # the line is over: the mouth closes
            self.emit(Viseme(t, "closed", item.uid))
        self.on_finished(item)
        if outcome == "played":
            self.emit(PlaybackFinished(t, item.uid, item.text, item.played_s))
        elif outcome == "interrupted":
            self.emit(PlaybackInterrupted(t, item.uid, item.text, item.played_fraction, item.heard_text))
        for o in self.outputs:  # other outputs lagging behind the clock stop with it
            tr = item.tracks.get(id(o))
            if tr is not None and not tr.done and outcome != "played":
                o.drop_track(tr)
        with contextlib.suppress(ValueError):
            self.items.remove(item)

    def _lipsync(self, o: Output | None, now: float) -> None:
        if o is None or not o.realtime:
            return
        t = now + self.lead
        heard = o.heard_position(t)
        for item in self.items:
            tr = item.tracks.get(id(o))
            if tr is None or tr.start_pos is None or tr.dropped or heard < tr.start_pos:
                continue
            if tr.end_pos is not None and heard >= tr.end_pos:
                continue
            if self.paused and self._mouth_open is None:
                return
            level = 0.0 if self.paused else item.envelope.level((heard - tr.start_pos) / o.sample_rate)
            if self.paused:
                self._mouth_open = None
            else:
                self._mouth_open = item.uid
            self.emit(Mouth(t, level, item.uid))
            return

    def _timing(self, o: Output | None, now: float) -> None:
        """Word and viseme events of the lines being heard, stamped with the time the sound card
        plays them (visemes with the lip-sync lead, like `Mouth`), in the order of those times."""
        if o is None:
            return
        for item in self.items:
            tr = item.tracks.get(id(o))
            if (
                item.timing is None
                or tr is None
                or tr.start_pos is None
                or tr.dropped
                or item.outcome is not None
            ):
                continue
            self._timing_of(item, o, tr, (o.heard_position(now) - tr.start_pos) / o.sample_rate, now)

    def _timing_of(self, item: PlayItem, o: Output, tr: Any, heard: float, now: float) -> None:
        """Send `item`'s timing events up to `heard` seconds into it (its last when it ends)."""
        tm = item.timing
        if heard < 0:
            return
        if item.visemes is None:
            item.visemes = tm.visemes()
        if tr.stopped:  # interrupted: what was not heard is not announced
            item.next_word = len(tm.words)
            if item.next_viseme < len(item.visemes):
                item.next_viseme = len(item.visemes)
                self.emit(Viseme(now, "closed", item.uid))
            return
        # the heard start once known: the clock is re-anchored as it plays, so recomputing the
        # start could land a rounding step before the line's playback_started
        start = item.started_at if item.started_at is not None else o.time_at(tr.start_pos)
        if not item.timing_sent:
            item.timing_sent = True
            self.emit(LineTimingEvent(start, item.uid, item.text, tm.shifted(start)))

        def at(seconds: float) -> float:  # the clock time of an offset into the line
            return max(start, o.time_at(tr.start_pos + seconds * o.sample_rate))

        due: list[tuple[float, int, Event]] = []
        while item.next_word < len(tm.words) and tm.words[item.next_word].start <= heard:
            w = tm.words[item.next_word]
            event = WordEvent(
                at(w.start),
                item.uid,
                w.text,
                w.reading,
                at(w.end),
                item.next_word,
                w.char_start,
                w.char_end,
                w.spoken,
            )
            due.append((w.start, 0, event))
            item.next_word += 1
        while item.next_viseme < len(item.visemes) and item.visemes[item.next_viseme][0] <= heard + self.lead:
            t, v = item.visemes[item.next_viseme]
            due.append((t, 1, Viseme(at(t), v, item.uid)))  # sent up to `lead` early, like Mouth
            item.next_viseme += 1
        for _, _, due_event in sorted(due, key=lambda d: (d[0], d[1])):
            self.emit(due_event)

    def _check_underruns(self) -> None:
        for o in self.healthy:
            n = o.underruns
            if n != self._underruns.get(id(o), 0):
                self._underruns[id(o)] = n
                self.emit(Underrun(self.clock(), o.name, o.underrun_uid))

    def _check_outputs(self, now: float) -> list[PlayItem]:
        newly = []
        for o in self.outputs:
            if id(o) in self.failed:
                continue
            err = o.check()
            if err is not None:
                self.failed.add(id(o))
                newly.append(o)
                self.emit(OutputError(now, o.name, err))
        if not newly or self.primary is not None:
            return []
        # Nothing left to play on: the line being heard ends here, the rest go back to the queue.
        lost: list[PlayItem] = []
        for item in list(self.items):
            if item.started_at is not None:
                tr = next(iter(item.tracks.values()), None)
                item.played_s = (tr.played / self._rate_of(item)) if tr is not None else 0.0
                self._complete(item, "interrupted", now)
            else:
                item.outcome = "lost"
                self.items.remove(item)
                lost.append(item)
        return lost

    def _rate_of(self, item: PlayItem) -> int:
        first = next(iter(item.tracks))
        for o in self.outputs:
            if id(o) == first:
                return o.sample_rate
        return self.source_rate

    def reset_output(self, o: Output) -> None:
        """`o` was reopened: it plays again from the next line on."""
        self.failed.discard(id(o))
        self._underruns[id(o)] = o.underruns


def total_seconds_estimate(record: Any, received_samples: int, sample_rate: int) -> float:
    """Length of a line for its played fraction: the record's, else its latent frames, else what came."""
    samples = getattr(record, "samples", 0) if record is not None else 0
    if samples:
        return samples / sample_rate
    frames = getattr(record, "frames", 0) if record is not None else 0
    if frames:
        return max(frames / 25.0, received_samples / sample_rate)
    return received_samples / sample_rate if received_samples else math.nan
