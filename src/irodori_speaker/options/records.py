"""What a synthesizer gives back, and what the runtime calls on one."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..audio.signal import SAMPLE_RATE
from ..cancel import CancelToken
from .synthesis import SynthesisOptions


@dataclass
class SynthesisRecord:
    """What happened while rendering one line."""

    text: str = ""  # normalised text actually spoken
    source: str = ""  # the line as written, less its pause markup and stripped tags (captions show it)
    seed: int = 0
    frames: int = 0  # latent frames sampled (25 per second)
    samples: int = 0  # audio samples returned (after tail trim)
    steps: int = 0
    schedule: str = ""
    pieces: int = 1  # >1 when long text was split
    # stage -> seconds ("sampling" counts the wait for the line's batch too)
    timings: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def audio_seconds(self) -> float:
        return self.samples / SAMPLE_RATE

    @property
    def compute_seconds(self) -> float:
        return float(sum(self.timings.values()))


@dataclass
class SynthesisResult:
    audio: np.ndarray  # float32, mono, (samples,)
    record: SynthesisRecord
    sample_rate: int = SAMPLE_RATE


class AudioStream(Iterator[np.ndarray]):
    """Audio chunks (float32 mono) of one line in order as the decoder produces them.

    `record` is complete once the iterator is exhausted.
    """

    def __init__(self, chunks: Iterator[np.ndarray], record: SynthesisRecord) -> None:
        self._chunks = chunks
        self.record = record

    def __iter__(self) -> AudioStream:
        return self

    def __next__(self) -> np.ndarray:
        return next(self._chunks)

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)  # a generator has one, a list iterator not
        if close is not None:
            close()


@runtime_checkable
class SynthesizerLike(Protocol):
    """What the Speaker, the phrase cache and prebuild call on a synthesizer.

    Calls are synchronous (the Speaker runs them in its worker thread). `options` may be
    SynthesisOptions, a mapping of options or None. An implementation holds
    `engine.hardware.lock.MODEL_LOCK` around its model work (per stage or chunk); callers never do.
    """

    sample_rate: int

    def resolve_options(
        self, options: SynthesisOptions | Mapping[str, Any] | None = None
    ) -> SynthesisOptions:
        """The options as this synthesizer renders them (checked; preset defaults filled in)."""
        ...

    def synthesize(
        self,
        text: str,
        voice: Any = None,
        options: SynthesisOptions | None = None,
        cancel: CancelToken | None = None,
    ) -> SynthesisResult: ...

    def stream(
        self,
        text: str,
        voice: Any = None,
        options: SynthesisOptions | None = None,
        cancel: CancelToken | None = None,
    ) -> AudioStream: ...

    def prewarm(self, voice: Any = None, *, batch_voices: Sequence[Any] = ()) -> float:
        """Absorb first-call costs (one dummy line); return the wall time in seconds.
        `batch_voices`: other voices whose lines will be batched (their batch graphs)."""
        ...

    def render_identity(self, text: str, voice: Any = None, options: SynthesisOptions | None = None) -> dict:
        """JSON-able: everything that changes the sound of this line (the phrase-cache key)."""
        ...
