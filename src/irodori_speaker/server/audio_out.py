"""What the server does to the synthesizer's audio before it leaves: the output rate and
channels (`PostProcess`; volume and silences are options of the synthesizer), and the
encoders (WAV, raw PCM, MP3, Opus, AAC, FLAC), whole or streamed.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import soundfile as sf  # type: ignore[import-untyped,unused-ignore]

from ..audio.signal import SAMPLE_RATE, StreamResampler, resample
from ..errors import InputError

MIN_RATE, MAX_RATE = 8_000, 192_000
MEDIA_TYPES = {
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
}


@dataclass(frozen=True)
class PostProcess:
    """Output rate and channels of 48 kHz mono float32 audio (what the options pipeline leaves
    to the response format; gain and silences are options: types.SynthesisOptions)."""

    rate: int = SAMPLE_RATE
    stereo: bool = False

    def __post_init__(self) -> None:
        if not MIN_RATE <= self.rate <= MAX_RATE:
            raise InputError(f"output sampling rate must be {MIN_RATE}-{MAX_RATE} Hz, got {self.rate}")

    def apply(self, audio: np.ndarray) -> np.ndarray:
        """The whole line: (samples,) mono or (samples, 2) stereo, float32 in [-1, 1]."""
        return self.channels(np.clip(self.resample(audio), -1.0, 1.0))

    def resample(self, audio: np.ndarray) -> np.ndarray:
        if self.rate == SAMPLE_RATE:
            return audio.astype(np.float32, copy=False)
        return resample(audio, SAMPLE_RATE, self.rate)

    def channels(self, x: np.ndarray) -> np.ndarray:
        return np.stack([x, x], axis=1) if self.stereo else x

    def stream(self, chunks: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        """`apply` chunk by chunk (the output equals the whole-line result up to resampler edges)."""
        resampler = StreamResampler(SAMPLE_RATE, self.rate)
        for chunk in chunks:
            x = resampler.feed(chunk)
            if len(x):
                yield self.channels(np.clip(x, -1.0, 1.0))
        tail = resampler.flush()
        if len(tail):
            yield self.channels(np.clip(tail, -1.0, 1.0))


def to_pcm16(x: np.ndarray) -> bytes:
    return (np.clip(x, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def wav_bytes(audio: np.ndarray, rate: int) -> bytes:
    """A complete 16-bit PCM WAV file (what VOICEVOX returns)."""
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def streaming_wav_header(rate: int, channels: int) -> bytes:
    """A WAV header for a stream of unknown length (sizes 0xFFFFFFFF, as OpenAI streams it).

    soundfile cannot write a header before it knows the length, so this one is packed here."""
    block = 2 * channels
    fmt = struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * block, block, 16)
    return (
        b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " + fmt + b"data" + struct.pack("<I", 0xFFFFFFFF)
    )


class _Sink:
    """A write-only file for PyAV: collects what the muxer writes until it is drained."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def drain(self) -> bytes:
        out = b"".join(self.parts)
        self.parts.clear()
        return out


_AV_FORMATS = {  # container, codec, sample rate the codec takes
    "mp3": ("mp3", "libmp3lame", None),
    "opus": ("ogg", "libopus", 48_000),  # Opus's own rate, not SAMPLE_RATE
    "aac": ("adts", "aac", None),
}


class Encoder:
    """Encodes float32 chunks into one audio format, yielding bytes as soon as they exist.

    wav and pcm stream sample-exact; mp3, opus (Ogg) and aac stream through PyAV (FFmpeg);
    flac is written whole at the end (its header must carry the length: readers such as
    libsndfile refuse a FLAC stream without it).
    """

    def __init__(self, fmt: str, rate: int, channels: int = 1) -> None:
        if fmt not in MEDIA_TYPES:
            raise InputError(f"unknown audio format {fmt!r}; use one of {', '.join(MEDIA_TYPES)}")
        self.fmt, self.rate, self.channels = fmt, rate, channels
        self._pending: list[np.ndarray] = []
        self._container: Any = None
        if fmt in _AV_FORMATS:
            import av

            container, codec, codec_rate = _AV_FORMATS[fmt]
            self._sink = _Sink()
            options = {"page_duration": "20000"} if container == "ogg" else {}  # Ogg pages every 20 ms
            self._container = av.open(self._sink, "w", format=container, options=options)
            self._stream: Any = self._container.add_stream(
                codec, rate=codec_rate or rate, layout="stereo" if channels == 2 else "mono"
            )
            self._resampler = StreamResampler(rate, codec_rate or rate, channels)
            self._codec_rate = codec_rate or rate

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.fmt]

    def start(self) -> bytes:
        return streaming_wav_header(self.rate, self.channels) if self.fmt == "wav" else b""

    def encode(self, x: np.ndarray) -> bytes:
        if self.fmt in ("wav", "pcm"):
            return to_pcm16(x)
        if self.fmt == "flac":
            self._pending.append(x)
            return b""
        return self._av_encode(self._resampler.feed(x))

    def finish(self) -> bytes:
        if self.fmt in ("wav", "pcm"):
            return b""
        if self.fmt == "flac":
            buf = io.BytesIO()
            audio = np.concatenate(self._pending) if self._pending else np.zeros(0, np.float32)
            sf.write(buf, audio, self.rate, format="FLAC", subtype="PCM_16")
            return buf.getvalue()
        out = self._av_encode(self._resampler.flush())
        assert self._container is not None
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        return out + self._sink.drain()

    def _av_encode(self, x: np.ndarray) -> bytes:
        import av

        if len(x) == 0:
            return b""
        packed = np.ascontiguousarray(x.reshape(1, -1), dtype=np.float32)  # interleaved channels
        layout = "stereo" if self.channels == 2 else "mono"
        frame = av.AudioFrame.from_ndarray(packed, format="flt", layout=layout)
        frame.sample_rate = self._codec_rate
        assert self._container is not None
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        return self._sink.drain()
