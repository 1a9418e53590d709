"""One utterance end to end: text (+ voice) -> 48 kHz mono float32 audio and a record.

This module's data types (`SynthesisOptions`, `SynthesisRecord`, `SynthesisResult`,
`AudioStream`) are the contract between the engine and the Speaker runtime. A
fake synthesizer in the Speaker tests implements the same `SynthesizerLike`
protocol.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from .cancel import CancelToken

SAMPLE_RATE = 48_000


@dataclass(frozen=True)
class SynthesisOptions:
    """How to render one line. `None` fields take the device preset's value."""

    steps: int | None = None
    schedule: str | None = None  # "linear" | "sway"
    sway_coeff: float | None = None
    guidance: str = "independent"  # "independent" | "joint" | "alternating"
    cfg_scale_text: float = 3.0
    cfg_scale_speaker: float = 5.0
    cfg_scale_caption: float = 3.0
    cfg_min_t: float = 0.5
    cfg_max_t: float = 1.0
    truncation_factor: float | None = None
    rescale_k: float | None = None
    rescale_sigma: float | None = None
    speaker_kv_scale: float | None = None
    speaker_kv_min_t: float = 0.9
    speaker_kv_max_layers: int | None = None
    seconds: float | None = None  # explicit length; else the predictor or the text estimate
    duration_scale: float = 1.0
    max_seconds: float | None = None  # cap on a predicted/estimated length
    seed: int | None = None  # None: a fresh seed per line, reported in the record
    tail_trim: bool = True
    chunk_frames: int | None = None  # chunked codec decode (None: the preset's)


@dataclass
class SynthesisRecord:
    """What happened while rendering one line."""

    text: str = ""  # normalised text actually spoken
    seed: int = 0
    frames: int = 0  # latent frames sampled (25 per second)
    samples: int = 0  # audio samples returned (after tail trim)
    steps: int = 0
    schedule: str = ""
    pieces: int = 1  # >1 when long text was split
    timings: dict[str, float] = field(default_factory=dict)  # stage -> seconds
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
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


class SynthesizerLike(Protocol):
    """What the Speaker needs from a synthesizer. Calls are synchronous (worker thread)."""

    sample_rate: int

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

    def prewarm(self, voice: Any = None) -> float:
        """Run one dummy synthesis; return its wall time in seconds."""
        ...
