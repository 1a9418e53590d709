"""The utterance bookkeeping: every open line's state, events and metrics, on the event loop.

The worker reports a line's synthesis here (started, chunk, timing, done, failed), the
player its playback (started, finished); a cancel, a skip or the end of a line goes through
`cancel` / `finish`. Each report moves the line (its `LineRecord`, through the record's own
steps), feeds the player, emits the event and counts it, so one line's story is told in one
place.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

from ..options import SynthesisRecord
from .events import (
    Event,
    Metrics,
    Series,
    Skipped,
    SynthesisFailed,
    SynthesisFinished,
    SynthesisStarted,
    Underrun,
)
from .jitter import JitterBuffer
from .playback import Chunk, Player, PlayItem, total_seconds_estimate
from .queue import LineQueue
from .record import LineRecord
from .utterance import UtteranceState

log = logging.getLogger("irodori_speaker.speaker")

__all__ = ["LineTracker"]


class LineTracker:
    """The open lines by id, their state changes and the Speaker's counters and series."""

    def __init__(
        self,
        queue: LineQueue,
        *,
        emit: Callable[[Event], None],
        wake: Callable[[], None],
        streaming: bool,
        pause_s: float,
    ) -> None:
        self.queue = queue
        self._emit_event = emit
        self.wake = wake
        self.streaming = streaming
        self.pause_s = pause_s
        self.player: Player | None = None  # set when the Speaker opens
        self.sample_rate = 0
        self.jitter = JitterBuffer()
        self.by_uid: dict[int, LineRecord] = {}
        self.series = {k: Series() for k in ("queue_wait", "first_chunk", "ttfa", "rtf", "gap")}
        self.counts = dict.fromkeys(("queued", "played", "interrupted", "skipped", "failed", "underruns"), 0)
        self.last_finished: LineRecord | None = None
        self._next_id = 1

    def new_id(self) -> int:
        uid = self._next_id
        self._next_id += 1
        return uid

    def emit(self, event: Event) -> None:
        if isinstance(event, Underrun):
            self.counts["underruns"] += 1
        self._emit_event(event)

    def open_lines(self) -> list[LineRecord]:
        return list(self.by_uid.values())

    def of(self, item: PlayItem) -> LineRecord | None:
        return self.by_uid.get(item.uid)

    def scheduled(self) -> list[LineRecord]:
        """The lines given to the player, in play order (the one heard now first)."""
        items = self.player.items if self.player is not None else ()
        return [u for u in (self.by_uid.get(i.uid) for i in items) if u is not None]

    def current(self) -> LineRecord | None:
        """The line being heard now."""
        return next((u for u in self.scheduled() if u.state == UtteranceState.PLAYING), None)

    def waiting(self) -> list[LineRecord]:
        """The lines given to the player that have not started, then the queue, in play order."""
        return [u for u in self.scheduled() if u.state != UtteranceState.PLAYING] + list(self.queue)

    def skippable(self) -> LineRecord | None:
        """The first line of the player not already stopping (the one `skip` fades out)."""
        items = self.player.items if self.player is not None else ()
        item = next((i for i in items if i.outcome is None and not i.stop_requested), None)
        return None if item is None else self.by_uid.get(item.uid)

    # -- synthesis (reported by the worker, on the loop) ------------------------------------------

    def synth_started(self, line: LineRecord, t0: float) -> None:
        if line.state.terminal:
            return
        wait = line.synthesis_started(t0)
        self.series["queue_wait"].add(wait)
        self.emit(SynthesisStarted(t0, line.id, line.text, wait))

    def chunk(self, line: LineRecord, chunk: Chunk, t: float) -> None:
        if line.state.terminal or line.preempted:  # a pre-empted run's audio is rendered again
            return
        first = line.chunk_arrived(chunk, t, self.sample_rate, self.jitter.lines_now())
        if first is not None:
            self.series["first_chunk"].add(first)
        if line.item is not None and self.player is not None:
            self.player.add(line.item, chunk)
        self.wake()

    def timing(self, line: LineRecord, timing: Any) -> None:
        if line.state.terminal or timing is None:
            return
        line.timed(timing)

    def synth_done(self, line: LineRecord, record: SynthesisRecord, t0: float, t1: float) -> None:
        if line.state.terminal or line.preempted:
            return
        line.synthesised(record, t1)
        if self.streaming:
            self.jitter.finished(line.feed)
        audio_s = line.received_s(self.sample_rate)
        compute = t1 - t0
        rtf = compute / audio_s if audio_s > 0 else math.inf
        if audio_s > 0:
            self.series["rtf"].add(rtf)
        first = line.timings.get("first_chunk", t1) - t0
        self.emit(SynthesisFinished(t1, line.id, line.text, compute, audio_s, rtf, first, record))
        if line.item is not None and self.player is not None:
            self.player.end(line.item)
        self.wake()

    def synth_failed(self, line: LineRecord, error: BaseException) -> None:
        if line.state.terminal:
            return
        log.warning("synthesis failed for line #%d: %r", line.id, error)
        line.failed(error)
        self.emit(SynthesisFailed(time.monotonic(), line.id, line.text, error))
        if line.item is not None and self.player is not None:
            self.player.stop(line.item)  # a streaming line that broke mid-way fades out; FAILED follows
        else:
            self.queue.remove(line)
            self.finish(line, UtteranceState.FAILED)

    def synth_ended(self, line: LineRecord) -> None:
        """The worker is done with `line` (whatever happened); a pre-empted line goes back in line."""
        if line.preempted:
            line.requeued()
        self.wake()

    # -- ending lines -----------------------------------------------------------------------------

    def add(self, line: LineRecord) -> None:
        """An open line (queued), until it ends."""
        self.by_uid[line.id] = line

    def cancel(self, line: LineRecord, reason: str) -> None:
        if line.state.terminal:
            return
        line.stopping(reason)
        if line.item is not None and self.player is not None:
            self.player.stop(line.item)  # completion arrives through play_finished
            return
        self.queue.remove(line)
        state = UtteranceState.EXPIRED if reason == "expired" else UtteranceState.CANCELLED
        self.emit(Skipped(time.monotonic(), line.id, line.text, reason))
        self.finish(line, state)
        self.wake()

    def skipped_empty(self, line: LineRecord, now: float) -> None:
        """A line with nothing to say: skipped at once, never queued."""
        self.emit(Skipped(now, line.id, line.text, "empty"))
        line.end(UtteranceState.SKIPPED)
        self.counts["skipped"] += 1

    def finish(self, line: LineRecord, state: UtteranceState) -> None:
        if line.state.terminal:
            return
        line.end(state)
        key = {
            UtteranceState.PLAYED: "played",
            UtteranceState.INTERRUPTED: "interrupted",
            UtteranceState.FAILED: "failed",
        }.get(state, "skipped")
        self.counts[key] += 1
        self.by_uid.pop(line.id, None)
        self.wake()

    # -- playback (reported by the player) --------------------------------------------------------

    def heard(self, item: PlayItem) -> tuple[float, str]:
        """(fraction of the line heard, the text heard) of an interrupted item."""
        line = self.by_uid.get(item.uid)
        if line is None:
            return (0.0, "")
        total = total_seconds_estimate(line.record, line.received_samples(), self.sample_rate)
        fraction = min(1.0, item.played_s / total) if total and total > 0 else 0.0
        norm = line.normalised_text()
        return (fraction, norm[: round(fraction * len(norm))])

    def play_started(self, item: PlayItem) -> None:
        line = self.by_uid.get(item.uid)
        if line is None or item.started_at is None:
            return
        line.playing(item.started_at)
        enqueued = line.timings["enqueued"]
        item.latency = item.started_at - enqueued
        self.series["ttfa"].add(item.latency)
        prev = self.last_finished.timings if self.last_finished is not None else {}
        if "playback_finished" in prev and enqueued < prev["playback_finished"]:
            self.series["gap"].add(max(0.0, item.started_at - prev["playback_finished"] - self.pause_s))

    def play_finished(self, item: PlayItem) -> None:
        line = self.by_uid.get(item.uid)
        if line is None:
            return
        t = item.finished_at if item.finished_at is not None else time.monotonic()
        failed = line.error is not None
        if item.outcome == "played":
            line.played(t)
            self.last_finished = line
            self.finish(line, UtteranceState.FAILED if failed else UtteranceState.PLAYED)
        elif item.outcome == "interrupted":
            item.played_fraction, item.heard_text = self.heard(item)
            line.cut(t, item.played_fraction, item.heard_text)
            self.last_finished = line
            self.finish(line, UtteranceState.FAILED if failed else UtteranceState.INTERRUPTED)
        else:  # dropped before a sample was heard
            line.dropped()
            if failed:
                self.finish(line, UtteranceState.FAILED)
                return
            self.emit(Skipped(t, line.id, line.text, line.reason))
            state = UtteranceState.EXPIRED if line.reason == "expired" else UtteranceState.CANCELLED
            self.finish(line, state)

    def metrics(self) -> Metrics:
        c, s = self.counts, self.series
        return Metrics(
            lines_queued=c["queued"],
            lines_played=c["played"],
            lines_interrupted=c["interrupted"],
            lines_skipped=c["skipped"],
            lines_failed=c["failed"],
            underruns=c["underruns"],
            queue_wait=s["queue_wait"].summary(),
            first_chunk=s["first_chunk"].summary(),
            time_to_first_audio=s["ttfa"].summary(),
            rtf=s["rtf"].summary(),
            gap=s["gap"].summary(),
        )
