"""A synthesizer of known timing for the Speaker tests (implements SynthesizerLike).

Each line is `steps` sampler steps of `step_s` seconds (the cancel token is
checked between steps, like the real sampler), then `chunks` decode chunks of
`chunk_s` each. Like the real synthesizer it holds the process-wide model lock
around each step and chunk (and its prewarm), never around a whole line. Its
audio is a constant level per line (`amplitude(text)`), so a recording shows
which line played when. Every call is recorded, and a `Recorder` shared by
several fakes sees whether model work ever overlapped.
"""

from __future__ import annotations

import contextlib
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from irodori_speaker.audio.signal import SAMPLE_RATE
from irodori_speaker.cancel import CancelToken, check
from irodori_speaker.engine.hardware.lock import hold_model_lock
from irodori_speaker.errors import Cancelled
from irodori_speaker.options import (
    AudioStream,
    SamplerDefaults,
    SynthesisOptions,
    SynthesisRecord,
    SynthesisResult,
)

SR = SAMPLE_RATE


@dataclass
class Call:
    kind: str  # "synthesize" | "stream" | "prewarm"
    text: str
    voice: Any
    started: float
    options: SynthesisOptions | None = None  # as the Speaker passed them
    ended: float | None = None
    steps_done: int = 0
    chunks_done: int = 0
    cancelled: bool = False
    error: BaseException | None = None


@dataclass
class Recorder:
    """Concurrency of model work across fakes (the lock must keep it at 1)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    active: int = 0
    max_active: int = 0
    intervals: list[tuple[str, float, float]] = field(default_factory=list)

    def enter(self) -> float:
        with self.lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        return time.monotonic()

    def leave(self, name: str, t0: float) -> None:
        with self.lock:
            self.active -= 1
            self.intervals.append((name, t0, time.monotonic()))


def amplitude(text: str) -> float:
    """The constant level of a line's audio, from its text (0.10 .. 0.73)."""
    return round(0.01 * (10 + zlib.crc32(text.encode()) % 64), 2)


class FakeSynth:
    sample_rate = SR

    def __init__(
        self,
        *,
        steps: int = 4,
        step_s: float = 0.005,
        seconds_per_char: float = 0.02,
        chunks: int = 1,
        chunk_s: float = 0.0,
        fail: tuple[str, ...] = (),
        fail_after_chunks: int | None = None,
        recorder: Recorder | None = None,
        name: str = "fake",
        normalise: bool = False,
        model_lock: bool = True,
    ) -> None:
        self.steps = steps
        self.step_s = step_s
        self.seconds_per_char = seconds_per_char
        self.chunks = chunks
        self.chunk_s = chunk_s
        self.fail = fail
        self.fail_after_chunks = fail_after_chunks
        self.recorder = recorder or Recorder()
        self.name = name
        self.normalise = normalise
        self.model_lock = model_lock  # False: nothing serialises its work (a control for the Recorder)
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def resolve_options(self, options: Any = None) -> SynthesisOptions:
        return SynthesisOptions.coerce(options).resolve(SamplerDefaults(8, "sway", -1.0))

    def render_identity(self, text: str, voice: Any = None, options: Any = None) -> dict:
        opts = self.resolve_options(options)
        return {
            "text": self.norm(text),
            "voice": repr(voice),
            "options": opts.audio_identity(),
            "fake": self.name,
        }

    def samples_for(self, text: str) -> int:
        return round(len(text) * self.seconds_per_char * SR)

    def audio_for(self, text: str) -> np.ndarray:
        return np.full(self.samples_for(text), amplitude(text), dtype=np.float32)

    def norm(self, text: str) -> str:
        return text.replace("！", "").replace("、", "") if self.normalise else text

    def _new_call(self, kind: str, text: str, voice: Any, options: Any = None) -> Call:
        c = Call(kind, text, voice, time.monotonic(), options=options)
        with self._lock:
            self.calls.append(c)
        return c

    @contextlib.contextmanager
    def _work(self, cancel: CancelToken | None = None) -> Iterator[None]:
        """One piece of model work: under the model lock (as the real synthesizer), recorded."""
        with hold_model_lock(cancel) if self.model_lock else contextlib.nullcontext():
            t0 = self.recorder.enter()
            try:
                yield
            finally:
                self.recorder.leave(self.name, t0)

    def _sample(self, call: Call, cancel: CancelToken | None) -> None:
        for _ in range(self.steps):
            check(cancel)
            with self._work(cancel):
                time.sleep(self.step_s)
            call.steps_done += 1
        check(cancel)
        if call.text in self.fail:
            raise RuntimeError(f"fake failure on {call.text!r}")

    def _seed(self, options: Any) -> int:
        """The seed the record reports, as the real synthesizer's (0 for a random one here)."""
        seed = SynthesisOptions.coerce(options).seed
        return 0 if seed is None else int(seed)

    def _record(self, text: str, samples: int, options: Any = None) -> SynthesisRecord:
        return SynthesisRecord(
            seed=self._seed(options),
            text=self.norm(text),
            frames=round(samples / SR * 25),
            samples=samples,
            steps=self.steps,
        )

    def synthesize(
        self,
        text: str,
        voice: Any = None,
        options: SynthesisOptions | None = None,
        cancel: CancelToken | None = None,
    ) -> SynthesisResult:
        call = self._new_call("synthesize", text, voice, options)
        with self._tracked(call):
            self._sample(call, cancel)
            for _ in range(self.chunks):
                check(cancel)
                with self._work(cancel):
                    time.sleep(self.chunk_s)
                call.chunks_done += 1
            audio = self.audio_for(text)
            return SynthesisResult(audio, self._record(text, len(audio), options))

    @contextlib.contextmanager
    def _tracked(self, call) -> Iterator[None]:
        """Records how the call ended (cancelled / error) and when."""
        try:
            yield
        except Cancelled:
            call.cancelled = True
            raise
        except BaseException as e:
            call.error = e
            raise
        finally:
            call.ended = time.monotonic()

    def stream(
        self,
        text: str,
        voice: Any = None,
        options: SynthesisOptions | None = None,
        cancel: CancelToken | None = None,
    ) -> AudioStream:
        call = self._new_call("stream", text, voice, options)
        audio = self.audio_for(text)
        record = SynthesisRecord(
            text=self.norm(text),
            seed=self._seed(options),
            frames=round(len(audio) / SR * 25),
            steps=self.steps,
        )

        def chunks() -> Iterator[np.ndarray]:
            with self._tracked(call):
                self._sample(call, cancel)
                bounds = np.linspace(0, len(audio), self.chunks + 1).round().astype(int)
                for i in range(self.chunks):
                    check(cancel)
                    if self.fail_after_chunks is not None and i == self.fail_after_chunks:
                        raise RuntimeError(f"fake decode failure on {text!r}")
                    with self._work(cancel):
                        time.sleep(self.chunk_s)
                    call.chunks_done += 1
                    yield audio[bounds[i] : bounds[i + 1]]
                record.samples = len(audio)

        return AudioStream(chunks(), record)

    def prewarm(self, voice: Any = None) -> float:
        call = self._new_call("prewarm", "", voice)
        try:
            with self._work():
                time.sleep(self.step_s)
        finally:
            call.ended = time.monotonic()
        return call.ended - call.started

    def texts(self, kind: str | None = None) -> list[str]:
        return [c.text for c in self.calls if kind is None or c.kind == kind]


def runs(signal: np.ndarray, tol: float = 1e-4) -> list[tuple[float, int]]:
    """Run-length encoding of a (mostly piecewise-constant) mono signal: [(value, length), ...]."""
    x = np.asarray(signal, dtype=np.float64).reshape(len(signal), -1)[:, 0]
    out: list[tuple[float, int]] = []
    if len(x) == 0:
        return out
    edges = np.flatnonzero(np.abs(np.diff(x)) > tol) + 1
    starts = np.concatenate([[0], edges])
    ends = np.concatenate([edges, [len(x)]])
    for a, b in zip(starts, ends):
        out.append((round(float(x[a]), 4), int(b - a)))
    return out


class EventLog:
    """Every event of a Speaker, in emission order (subscribed before anything is queued)."""

    def __init__(self, speaker: Any) -> None:
        self.events: list[Any] = []
        self._off = speaker.on(None, self.events.append)

    def of(self, kind: str, uid: int | None = None) -> list[Any]:
        return [e for e in self.events if e.kind == kind and (uid is None or e.utterance_id == uid)]

    def one(self, kind: str, uid: int) -> Any:
        got = self.of(kind, uid)
        assert len(got) == 1, f"expected one {kind} for #{uid}, got {got}"
        return got[0]

    def kinds(
        self, uid: int | None = None, skip: tuple[str, ...] = ("mouth", "word", "viseme", "line_timing")
    ) -> list[str]:
        return [
            e.kind
            for e in self.events
            if e.kind not in skip and (uid is None or getattr(e, "utterance_id", None) == uid)
        ]

    def index(self, kind: str, uid: int) -> int:
        for i, e in enumerate(self.events):
            if e.kind == kind and getattr(e, "utterance_id", None) == uid:
                return i
        raise AssertionError(f"no {kind} event for #{uid}: {self.kinds()}")
