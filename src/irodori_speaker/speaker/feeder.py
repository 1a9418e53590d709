"""The feeder: streamed text (LLM tokens) -> speakable segments -> queued lines.

`Feeder` backs `Speaker.feed` / `end_feed` (one turn at a time) and `speak_stream` backs
`Speaker.say_stream`. A partial segment that waits longer than `stall_flush_s` for more text
is flushed and queued, so a stalled stream is still heard.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterable, Callable, Iterable
from typing import Any

from ..errors import InputError
from ..text.segment import StreamSegmenter
from .lines import LineOptions, Reply
from .utterance import Utterance

log = logging.getLogger("irodori_speaker.speaker")

__all__ = ["Feeder", "default_segmenter", "speak_stream"]

Enqueue = Callable[[str, LineOptions, Reply], Utterance]


def default_segmenter() -> Any:

    return StreamSegmenter(min_chars=10, first_min_chars=5)


class Feeder:
    """One turn of streamed text: segments are queued through `enqueue` as they complete, as one
    `Reply` (one time-to-live: the reply plays whole or expires whole)."""

    def __init__(
        self,
        enqueue: Enqueue,
        line: LineOptions,
        *,
        segmenter: Any,
        stall_flush_s: float | None,
        closing: Callable[[], bool] = lambda: False,
    ) -> None:
        self._enqueue_line = enqueue
        self.line = line
        self.segmenter = segmenter
        self.stall_flush_s = stall_flush_s
        self._closing = closing
        self.handles: list[Utterance] = []
        self.reply = Reply()
        self._timer: asyncio.TimerHandle | None = None

    def feed(self, chunk: str | None, line: LineOptions | None = None) -> list[Utterance]:
        if line is not None:  # options given mid-turn apply from here on; none given: keep the turn's
            self.line = line
        if chunk is None:  # OpenAI-style streams send None deltas: nothing to say
            return []
        if not isinstance(chunk, str):
            raise InputError(f"feed() takes text, got {type(chunk).__name__}")
        out = self._enqueue(self.segmenter.feed(chunk))
        self._arm()
        return out

    def end(self) -> list[Utterance]:
        self._disarm()
        return self._enqueue(self.segmenter.flush())

    def close(self) -> None:
        self._disarm()

    def _enqueue(self, segments: Iterable[str]) -> list[Utterance]:
        out = []
        for seg in segments:
            if seg and seg.strip():
                out.append(self._enqueue_line(seg, self.line, self.reply))
                if self.line.interrupt:  # only the turn's first segment cuts in
                    self.line = dataclasses.replace(self.line, interrupt=False)
        self.handles.extend(out)
        return out

    def _arm(self) -> None:
        self._disarm()
        if self.segmenter.pending.strip() and self.stall_flush_s is not None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.stall_flush_s, self._on_stall)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_stall(self) -> None:
        self._timer = None
        if self._closing():
            return
        try:
            try:  # StreamSegmenter: final=False keeps the turn's state (first-segment rule, open code)
                segments = self.segmenter.flush(final=False)
            except TypeError:
                segments = self.segmenter.flush()
            self._enqueue(segments)
        except Exception:
            log.exception("stall flush failed")


async def speak_stream(
    feeder: Feeder, source: AsyncIterable[str | None] | Iterable[str | None]
) -> list[Utterance]:
    """Feed `source` through `feeder` and wait until every segment has ended (see `Speaker.say_stream`)."""
    try:
        if isinstance(source, AsyncIterable):
            async for chunk in source:
                feeder.feed(chunk)
        else:
            for chunk in source:
                feeder.feed(chunk)
                await asyncio.sleep(0)
        feeder.end()
        error: Exception | None = None
        for h in list(feeder.handles):
            try:
                await h
            except Exception as e:  # its synthesis failed: raised once every segment has ended
                error = error or e
        if error is not None:
            raise error
        return feeder.handles
    except asyncio.CancelledError:
        for h in feeder.handles:
            h.cancel()
        raise
    finally:
        feeder.close()
