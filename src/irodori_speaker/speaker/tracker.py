"""The utterance bookkeeping: every open line's state, events and metrics, on the event loop.

The worker reports a line's synthesis here (started, chunk, timing, done, failed), the
player its playback (started, finished); a cancel, a skip or the end of a line goes through
`cancel` / `finish`. Each report moves the line's state, feeds the player, emits the event
and counts it, so one line's story is told in one place.
"""

from __future__ import annotations

import asyncio
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
from .utterance import Utterance, UtteranceState

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
        self.by_uid: dict[int, Utterance] = {}
        self.series = {k: Series() for k in ("queue_wait", "first_chunk", "ttfa", "rtf", "gap")}
        self.counts = dict.fromkeys(("queued", "played", "interrupted", "skipped", "failed", "underruns"), 0)
        self.last_finished: Utterance | None = None
        self._next_id = 1

    def new_id(self) -> int:
        uid = self._next_id
        self._next_id += 1
        return uid

    def emit(self, event: Event) -> None:
        if isinstance(event, Underrun):
            self.counts["underruns"] += 1
        self._emit_event(event)

    def open_lines(self) -> list[Utterance]:
        return list(self.by_uid.values())

    def of(self, item: PlayItem) -> Utterance | None:
        return self.by_uid.get(item.uid)

    def scheduled(self) -> list[Utterance]:
        """The lines given to the player, in play order (the one heard now first)."""
        items = self.player.items if self.player is not None else ()
        return [u for u in (self.by_uid.get(i.uid) for i in items) if u is not None]

    def current(self) -> Utterance | None:
        """The line being heard now."""
        return next((u for u in self.scheduled() if u.state == UtteranceState.PLAYING), None)

    def waiting(self) -> list[Utterance]:
        """The lines given to the player that have not started, then the queue, in play order."""
        return [u for u in self.scheduled() if u.state != UtteranceState.PLAYING] + list(self.queue)

    def skippable(self) -> Utterance | None:
        """The first line of the player not already stopping (the one `skip` fades out)."""
        items = self.player.items if self.player is not None else ()
        item = next((i for i in items if i.outcome is None and not i.stop_requested), None)
        return None if item is None else self.by_uid.get(item.uid)

    # -- synthesis (reported by the worker, on the loop) ------------------------------------------

    def synth_started(self, utt: Utterance, t0: float) -> None:
        if utt.state.terminal:
            return
        utt.timings["synthesis_started"] = t0
        utt._feed.started_t = t0
        wait = t0 - utt.timings["enqueued"]
        self.series["queue_wait"].add(wait)
        self.emit(SynthesisStarted(t0, utt.id, utt.text, wait))

    def chunk(self, utt: Utterance, chunk: Chunk, t: float) -> None:
        if utt.state.terminal or utt._preempted:  # a pre-empted run's audio is rendered again
            return
        if "first_chunk" not in utt.timings:
            utt.timings["first_chunk"] = t
            self.series["first_chunk"].add(t - utt.timings.get("synthesis_started", t))
        utt._chunks.append(chunk)
        utt._feed.add(t, len(chunk.audio) / max(1, self.sample_rate))
        if utt._item is not None and self.player is not None:
            self.player.add(utt._item, chunk)
        self.wake()

    def timing(self, utt: Utterance, timing: Any) -> None:
        if utt.state.terminal or timing is None:
            return
        utt.timing = timing
        if utt._item is not None:
            utt._item.timing = timing

    def synth_done(self, utt: Utterance, record: SynthesisRecord, t0: float, t1: float) -> None:
        if utt.state.terminal or utt._preempted:
            return
        utt._synth_done = True
        utt.record = record
        if self.streaming:
            self.jitter.finished(utt._feed)
        utt.timings["synthesis_finished"] = t1
        if utt.state == UtteranceState.SYNTHESIZING:
            utt.state = UtteranceState.READY
        audio_s = utt._received_s(self.sample_rate)
        compute = t1 - t0
        rtf = compute / audio_s if audio_s > 0 else math.inf
        if audio_s > 0:
            self.series["rtf"].add(rtf)
        first = utt.timings.get("first_chunk", t1) - t0
        self.emit(SynthesisFinished(t1, utt.id, utt.text, compute, audio_s, rtf, first, record))
        if utt._item is not None and self.player is not None:
            self.player.end(utt._item)
        self.wake()

    def synth_failed(self, utt: Utterance, error: BaseException) -> None:
        if utt.state.terminal:
            return
        log.warning("synthesis failed for line #%d: %r", utt.id, error)
        utt.error = error
        self.emit(SynthesisFailed(time.monotonic(), utt.id, utt.text, error))
        if utt._item is not None and self.player is not None:
            self.player.stop(utt._item)  # a streaming line that broke mid-way fades out; FAILED follows
        else:
            self.queue.remove(utt)
            self.finish(utt, UtteranceState.FAILED)

    def synth_ended(self, utt: Utterance) -> None:
        """The worker is done with `utt` (whatever happened); a pre-empted line goes back in line."""
        if utt._preempted:
            utt._restart()
        self.wake()

    # -- ending lines -----------------------------------------------------------------------------

    def cancel(self, utt: Utterance, reason: str) -> None:
        if utt.state.terminal:
            return
        utt._token.cancel(reason)
        utt._reason = reason
        if utt._item is not None and self.player is not None:
            self.player.stop(utt._item)  # completion arrives through play_finished
            return
        self.queue.remove(utt)
        state = UtteranceState.EXPIRED if reason == "expired" else UtteranceState.CANCELLED
        self.emit(Skipped(time.monotonic(), utt.id, utt.text, reason))
        self.finish(utt, state)
        self.wake()

    def skipped_empty(self, utt: Utterance, now: float) -> None:
        """A line with nothing to say: skipped at once, never queued."""
        self.emit(Skipped(now, utt.id, utt.text, "empty"))
        utt.state = UtteranceState.SKIPPED
        self.counts["skipped"] += 1
        asyncio.get_running_loop().call_soon(utt._done.set)

    def finish(self, utt: Utterance, state: UtteranceState) -> None:
        if utt.state.terminal:
            return
        utt.state = state
        key = {
            UtteranceState.PLAYED: "played",
            UtteranceState.INTERRUPTED: "interrupted",
            UtteranceState.FAILED: "failed",
        }.get(state, "skipped")
        self.counts[key] += 1
        self.by_uid.pop(utt.id, None)
        # after this step's event callbacks (also scheduled with call_soon): an awaiting
        # caller sees every event of the line delivered
        asyncio.get_running_loop().call_soon(utt._done.set)
        self.wake()

    # -- playback (reported by the player) --------------------------------------------------------

    def heard(self, item: PlayItem) -> tuple[float, str]:
        """(fraction of the line heard, the text heard) of an interrupted item."""
        utt = self.by_uid.get(item.uid)
        if utt is None:
            return (0.0, "")
        received = sum(len(c.audio) for c in utt._chunks)
        total = total_seconds_estimate(utt.record, received, self.sample_rate)
        fraction = min(1.0, item.played_s / total) if total and total > 0 else 0.0
        norm = utt.record.text if utt.record is not None and utt.record.text else utt.text
        return (fraction, norm[: round(fraction * len(norm))])

    def play_started(self, item: PlayItem) -> None:
        utt = self.by_uid.get(item.uid)
        if utt is None or item.started_at is None:
            return
        utt.state = UtteranceState.PLAYING
        utt.timings["playback_started"] = item.started_at
        item.latency = item.started_at - utt.timings["enqueued"]
        self.series["ttfa"].add(item.latency)
        prev = self.last_finished
        if (
            prev is not None
            and "playback_finished" in prev.timings
            and utt.timings["enqueued"] < prev.timings["playback_finished"]
        ):
            self.series["gap"].add(
                max(0.0, item.started_at - prev.timings["playback_finished"] - self.pause_s)
            )

    def play_finished(self, item: PlayItem) -> None:
        utt = self.by_uid.get(item.uid)
        if utt is None:
            return
        utt._item = None
        t = item.finished_at if item.finished_at is not None else time.monotonic()
        if item.outcome == "played":
            utt.played_fraction = 1.0
            utt.heard_text = utt.record.text if utt.record is not None and utt.record.text else utt.text
            utt.timings["playback_finished"] = t
            self.last_finished = utt
            self.finish(utt, UtteranceState.FAILED if utt.error is not None else UtteranceState.PLAYED)
        elif item.outcome == "interrupted":
            utt.played_fraction, utt.heard_text = self.heard(item)
            item.played_fraction, item.heard_text = utt.played_fraction, utt.heard_text
            utt.timings["playback_finished"] = t
            self.last_finished = utt
            utt._token.cancel("interrupted")
            self.finish(utt, UtteranceState.FAILED if utt.error is not None else UtteranceState.INTERRUPTED)
        else:  # dropped before a sample was heard
            utt._token.cancel(utt._reason)
            if utt.error is not None:
                self.finish(utt, UtteranceState.FAILED)
                return
            self.emit(Skipped(t, utt.id, utt.text, utt._reason))
            state = UtteranceState.EXPIRED if utt._reason == "expired" else UtteranceState.CANCELLED
            self.finish(utt, state)

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
