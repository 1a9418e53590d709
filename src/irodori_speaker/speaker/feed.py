"""The event feed: a Speaker's events as JSON messages for tools that are not Python.

`EventFeed(speaker)` turns the Speaker's events into the messages of one documented schema
(docs/overlay.md, "The feed's schema"; `SCHEMA_VERSION`): lines queued / synthesised / started /
finished (with the text as written and as spoken, the voice and the lane), the line's word
timing, each word and viseme when it is heard, the mouth level at a fixed rate, and the end of
every line (an interruption is a `line_finished` with outcome "interrupted"). Every time is on
the playback clock: `time.monotonic()` seconds of this process at which the sound card plays
it; a client maps it onto its own clock with the `clock` of the hello and of `pong` replies.

Each reader gets a `FeedReader` (an async iterator of JSON strings, the first a `hello` with a
snapshot of the queue, the line being heard and the last lines). A reader that falls more than
`max_pending` messages behind is ended (its stream stops; it reconnects and starts from a fresh
hello) so one slow page never holds the others or the Speaker back. The HTTP / WebSocket
serving of a feed lives in `irodori_speaker.server.feed`; this module needs no extra.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .events import (
    Closed,
    Event,
    LineTimingEvent,
    Mouth,
    PlaybackFinished,
    PlaybackInterrupted,
    PlaybackStarted,
    Queued,
    Skipped,
    SynthesisFailed,
    SynthesisFinished,
    Viseme,
    WordEvent,
)

__all__ = ["MESSAGE_TYPES", "SCHEMA_VERSION", "EventFeed", "FeedReader", "dumps", "kana_only", "voice_label"]

SCHEMA_VERSION = 1
#: Every message type of the schema, in the order a line meets them.
MESSAGE_TYPES = (
    "hello",
    "line_queued",
    "line_synthesized",
    "line_started",
    "line_timing",
    "word",
    "viseme",
    "mouth",
    "line_finished",
    "pong",
    "closed",
)
_SMALL_KANA = frozenset("ぁぃぅぇぉゃゅょゎゕゖァィゥェォャュョヮヵヶ")


def dumps(message: dict[str, Any]) -> str:
    """One message as compact JSON (Japanese left as it is)."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":"))


def kana_only(text: str) -> bool:
    """Whether `text` has kana and nothing else but punctuation and spaces (captions then show
    it mora by mora)."""
    has_kana = False
    for ch in text:
        if "\u3041" <= ch <= "\u309f" or "\u30a0" <= ch <= "\u30ff" or "\uff66" <= ch <= "\uff9f":
            has_kana = True
        elif ch.isalnum():
            return False
    return has_kana


def split_morae(text: str) -> list[str]:
    """Written kana into morae: a small kana joins the one before it (きょ, ティ), ー is one."""
    out: list[str] = []
    for ch in text:
        is_kana = "\u3041" <= ch <= "\u30ff" and ch not in "・"
        if out and (ch in _SMALL_KANA or not is_kana):  # punctuation stays with its mora
            out[-1] += ch
        else:
            out.append(ch)
    return out


def voice_label(voice: Any) -> str | None:
    """A voice as the feed names it: None (the model's own), a `Voice`'s name, a path's stem."""
    if voice is None:
        return None
    name = getattr(voice, "name", None)
    if isinstance(name, str) and name:
        return name
    text = str(voice)
    return text.replace("\\", "/").rsplit("/", 1)[-1].rsplit(".", 1)[0] or text


@dataclass
class _Line:
    id: int
    text: str
    lane: str
    voice: str | None
    spoken: str | None = None
    queued_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    outcome: str | None = None
    heard_text: str | None = None
    audio_s: float | None = None
    kana: bool = False
    moras: list[tuple[float, float, str]] = field(default_factory=list)  # (start, end, kana)

    def public(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "text": self.text,
            "spoken": self.spoken,
            "voice": self.voice,
            "lane": self.lane,
            "queued_at": self.queued_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "outcome": self.outcome,
            "heard_text": self.heard_text,
            "audio_s": self.audio_s,
        }


class FeedReader:
    """One reader of a feed: an async iterator of JSON messages; ends when the feed closes,
    when `close()` is called, or when it fell behind (`lagging`)."""

    def __init__(self, feed: EventFeed, max_pending: int) -> None:
        self._feed = feed
        self._queue: deque[str | None] = deque()
        self._ready = asyncio.Event()
        self.max_pending = max_pending
        self.lagging = False
        self.sent = 0

    def put(self, message: str | None) -> None:
        if message is not None and len(self._queue) >= self.max_pending:
            self.lagging = True  # it cannot keep up: end it rather than queue without bound
            self._feed.unsubscribe(self)
            self._queue.clear()
            message = None
        self._queue.append(message)
        self._ready.set()

    def __aiter__(self) -> FeedReader:
        return self

    async def __anext__(self) -> str:
        while not self._queue:
            self._ready.clear()
            await self._ready.wait()
        message = self._queue[0]
        if message is None:
            raise StopAsyncIteration
        self._queue.popleft()
        self.sent += 1
        return message

    def close(self) -> None:
        self._feed.unsubscribe(self)
        self.put(None)


class EventFeed:
    """A Speaker's events as the feed's JSON messages, fanned out to any number of readers.

    `speaker` may be given later (`attach`); `mouth_hz` is the rate of `mouth` messages while a
    line is heard; `recent` how many finished lines the hello's snapshot keeps. Runs on the
    Speaker's event loop."""

    def __init__(
        self, speaker: Any = None, *, mouth_hz: float = 30.0, recent: int = 20, max_pending: int = 4000
    ) -> None:
        if not 1.0 <= mouth_hz <= 120.0:
            raise ValueError(f"mouth_hz must be in [1, 120], got {mouth_hz}")
        self.mouth_hz = float(mouth_hz)
        self.max_pending = max_pending
        self.speaker: Any = None
        self._off: Any = None
        self._readers: set[FeedReader] = set()
        self._lines: dict[int, _Line] = {}  # open lines by id
        self._recent: deque[_Line] = deque(maxlen=recent)
        self._heard: int | None = None  # the line being heard
        self._level = 0.0
        self._mouth_timer: asyncio.TimerHandle | None = None
        self.lagged = 0  # readers ended because they fell behind
        self.closed = False
        if speaker is not None:
            self.attach(speaker)

    # -- wiring ------------------------------------------------------------------------------------

    def attach(self, speaker: Any) -> None:
        """Follow `speaker`'s events from now on (one Speaker per feed)."""
        if self.speaker is not None:
            raise ValueError("this feed already follows a Speaker")
        self.speaker = speaker
        self.closed = False
        self._off = speaker.on(None, self._on_event)

    def detach(self) -> None:
        """Stop following the Speaker; readers stay connected (a new Speaker may be attached)."""
        if self._off is not None:
            self._off()
        self._off, self.speaker = None, None
        self._stop_mouth()

    def close(self) -> None:
        """End every reader."""
        self.detach()
        self.closed = True
        for reader in list(self._readers):
            reader.close()

    @property
    def readers(self) -> int:
        return len(self._readers)

    def unsubscribe(self, reader: FeedReader) -> None:
        """`reader` gets nothing more (it ended, or fell too far behind)."""
        self._readers.discard(reader)

    def subscribe(self) -> FeedReader:
        """A reader whose first message is the hello (schema version, clock, snapshot)."""
        reader = FeedReader(self, self.max_pending)
        reader.put(dumps(self.hello()))
        if self.closed:
            reader.put(None)
        else:
            self._readers.add(reader)
        return reader

    # -- snapshots ---------------------------------------------------------------------------------

    @staticmethod
    def clock() -> float:
        """The playback clock now."""
        return time.monotonic()

    def pong(self, ping: Any) -> dict[str, Any]:
        """The answer to a client's `{"type": "ping", ...}`: its fields back, plus the clock."""
        out = {k: v for k, v in ping.items() if k not in ("v", "type")} if isinstance(ping, dict) else {}
        return {"v": SCHEMA_VERSION, "type": "pong", **out, "clock": self.clock()}

    def snapshot(self) -> dict[str, Any]:
        """The queue (in arrival order), the line being heard and the last lines that ended."""
        current = self._lines.get(self._heard) if self._heard is not None else None
        waiting = [ln.public() for ln in self._lines.values() if ln.started_at is None]
        return {
            "speaker": self.speaker is not None,
            "current": current.public() if current is not None else None,
            "queue": waiting,
            "recent": [ln.public() for ln in reversed(self._recent)],
        }

    def hello(self) -> dict[str, Any]:
        return {
            "v": SCHEMA_VERSION,
            "type": "hello",
            "schema": SCHEMA_VERSION,
            "clock": self.clock(),
            "mouth_hz": self.mouth_hz,
            "state": self.snapshot(),
        }

    # -- events -> messages ------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        if not self._readers:
            return
        text = dumps({"v": SCHEMA_VERSION, **message})
        for reader in list(self._readers):
            reader.put(text)
            if reader.lagging:
                self.lagged += 1

    def _on_event(self, ev: Event) -> None:
        handler = _HANDLERS.get(type(ev))
        if handler is not None:
            handler(self, ev)

    def _handle_of(self, uid: int) -> Any:
        s = self.speaker
        if s is None:
            return None
        current = s.current
        if current is not None and current.id == uid:
            return current
        return next((u for u in s.queue if u.id == uid), None)

    def _queued(self, ev: Queued) -> None:
        handle = self._handle_of(ev.utterance_id)
        lane = ev.priority
        voice = voice_label(handle.voice) if handle is not None else None
        line = _Line(ev.utterance_id, ev.text, lane, voice, queued_at=ev.time, kana=kana_only(ev.text))
        self._lines[line.id] = line
        self._send({"type": "line_queued", "t": ev.time, "line": line.public(), "position": ev.position})

    def _synthesized(self, ev: SynthesisFinished) -> None:
        line = self._lines.get(ev.utterance_id)
        spoken = ev.record.text if ev.record is not None else None
        if line is not None:
            line.spoken = line.spoken or spoken
            line.audio_s = ev.audio_s
        self._send(
            {"type": "line_synthesized", "t": ev.time, "id": ev.utterance_id, "spoken": spoken,
             "audio_s": ev.audio_s}
        )  # fmt: skip

    def _started(self, ev: PlaybackStarted) -> None:
        line = self._lines.get(ev.utterance_id)
        if line is None:
            return
        line.started_at = ev.time
        if line.spoken is None:
            handle = self._handle_of(line.id)
            record = getattr(handle, "record", None)
            line.spoken = getattr(record, "text", None)
        self._heard = line.id
        self._send({"type": "line_started", "t": ev.time, "line": line.public(), "latency": ev.latency})
        self._start_mouth()

    def _timing(self, ev: LineTimingEvent) -> None:
        line = self._lines.get(ev.utterance_id)
        tm = ev.timing
        if line is None or tm is None:
            return
        line.spoken = line.spoken or tm.text
        line.moras = [(m.start, m.end, m.kana) for m in tm.moras]
        words = [
            {"index": i, "text": w.text, "spoken": w.spoken, "reading": w.reading, "t": w.start, "end": w.end}
            for i, w in enumerate(tm.words)
        ]
        self._send(
            {"type": "line_timing", "t": ev.time, "id": line.id, "spoken": line.spoken,
             "kana_only": line.kana, "duration": tm.duration, "words": words}
        )  # fmt: skip

    def _word(self, ev: WordEvent) -> None:
        line = self._lines.get(ev.utterance_id)
        self._send(
            {"type": "word", "t": ev.time, "end": ev.end, "id": ev.utterance_id, "index": ev.index,
             "text": ev.text, "spoken": ev.spoken, "reading": ev.reading,
             "moras": _word_morae(line, ev) if line is not None else []}
        )  # fmt: skip

    def _viseme(self, ev: Viseme) -> None:
        self._send({"type": "viseme", "t": ev.time, "id": ev.utterance_id, "viseme": ev.viseme})

    def _mouth(self, ev: Mouth) -> None:
        self._level = ev.level

    def _finished(self, ev: Event) -> None:
        uid = getattr(ev, "utterance_id", None)
        line = self._lines.get(uid) if isinstance(uid, int) else None
        if line is None:
            return
        if isinstance(ev, PlaybackFinished):
            outcome = "failed" if isinstance(line.outcome, str) else "played"
        elif isinstance(ev, PlaybackInterrupted):
            outcome = "failed" if isinstance(line.outcome, str) else "interrupted"
            line.heard_text = ev.heard_text
        elif isinstance(ev, SynthesisFailed):
            if line.started_at is not None:  # it fades out: the playback end follows
                line.outcome = "failed"
                return
            outcome = "failed"
        else:
            outcome = getattr(ev, "reason", "cancelled")
        line.outcome, line.finished_at = outcome, ev.time
        del self._lines[line.id]
        self._recent.append(line)
        message: dict[str, Any] = {"type": "line_finished", "t": ev.time, "id": line.id, "outcome": outcome}
        if isinstance(ev, PlaybackInterrupted):
            message.update(heard_text=ev.heard_text, played_fraction=ev.played_fraction)
        if self._heard == line.id:
            self._heard = None
            self._stop_mouth()
        self._send(message)

    def _closed(self, ev: Closed) -> None:
        self._send({"type": "closed", "t": ev.time})
        self._lines.clear()
        self._heard = None
        self._stop_mouth()

    # -- the mouth at a fixed rate -----------------------------------------------------------------

    def _start_mouth(self) -> None:
        if self._mouth_timer is None:
            self._mouth_tick()

    def _mouth_tick(self) -> None:
        self._send({"type": "mouth", "t": self.clock(), "id": self._heard, "level": round(self._level, 4)})
        loop = asyncio.get_running_loop()
        self._mouth_timer = loop.call_later(1.0 / self.mouth_hz, self._mouth_tick)

    def _stop_mouth(self) -> None:
        if self._mouth_timer is not None:
            self._mouth_timer.cancel()
            self._mouth_timer = None
            self._level = 0.0
            self._send({"type": "mouth", "t": self.clock(), "id": None, "level": 0.0})


def _word_morae(line: _Line, ev: WordEvent) -> list[dict[str, Any]]:
    """The morae of a word with their times; for a kana-only line their written kana too (a
    caption then shows it mora by mora)."""
    if not line.moras:
        return []
    # the line_timing's morae are on the clock already; those inside the word's span are its own
    inside = [(s, e, k) for s, e, k in line.moras if ev.time - 1e-3 <= s < ev.end - 1e-3]
    written = split_morae(ev.text) if line.kana else []
    if written and len(written) != len(inside):
        written = [ev.text] if len(inside) else []
        inside = inside[:1]
    return [
        {"kana": k, "text": written[i] if written else None, "t": s, "end": e}
        for i, (s, e, k) in enumerate(inside)
    ]


_HANDLERS: dict[type, Any] = {
    Queued: EventFeed._queued,
    SynthesisFinished: EventFeed._synthesized,
    PlaybackStarted: EventFeed._started,
    LineTimingEvent: EventFeed._timing,
    WordEvent: EventFeed._word,
    Viseme: EventFeed._viseme,
    Mouth: EventFeed._mouth,
    PlaybackFinished: EventFeed._finished,
    PlaybackInterrupted: EventFeed._finished,
    Skipped: EventFeed._finished,
    SynthesisFailed: EventFeed._finished,
    Closed: EventFeed._closed,
}
