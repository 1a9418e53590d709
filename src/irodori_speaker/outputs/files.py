"""Sound-file output (WAV, FLAC, OGG, Opus, MP3) and the one writer of whole files."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from ..audio.signal import SAMPLE_RATE
from ..errors import AudioError
from .paced import PacedOutput

FILE_FORMATS: dict[str, tuple[str, str]] = {
    ".wav": ("WAV", "PCM_16"),
    ".flac": ("FLAC", "PCM_16"),
    ".ogg": ("OGG", "VORBIS"),
    ".opus": ("OGG", "OPUS"),
    ".mp3": ("MP3", "MPEG_LAYER_III"),
}
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)  # what Opus takes, not SAMPLE_RATE


def file_format(
    path: str | os.PathLike[str], subtype: str | None = None, sample_rate: int = SAMPLE_RATE
) -> tuple[str, str]:
    """(format, subtype) for a sound file named `path`, from its extension; AudioError if we cannot."""

    ext = Path(path).suffix.lower()
    known = ", ".join(FILE_FORMATS)
    if ext not in FILE_FORMATS:
        what = f"unknown file extension {ext!r}" if ext else "no file extension"
        raise AudioError(
            f"cannot write sound file {os.fspath(path)!r}: {what}", hint=f"end the name in one of {known}"
        )
    fmt, default = FILE_FORMATS[ext]
    sub = (subtype or default).upper()
    if not sf.check_format(fmt, sub):
        raise AudioError(
            f"{ext} files cannot hold subtype {sub!r}",
            hint=f"one of {', '.join(sf.available_subtypes(fmt))}, or leave subtype unset ({default})",
        )
    if sub == "OPUS" and sample_rate not in OPUS_RATES:
        raise AudioError(
            f"Opus cannot store {sample_rate} Hz audio",
            hint=f"use sample_rate one of {', '.join(map(str, OPUS_RATES))}, or another format",
        )
    return fmt, sub


def check_writable(path: str | os.PathLike[str], *, make_parent: bool = False) -> None:
    """AudioError unless a file can be written at `path`.

    Probes for real (opens the file; an existing file is not truncated, a new one is removed
    again), so a read-only place or /proc fails here, before any work. A missing directory is
    an error, or is made with `make_parent` (the command line's `-o out/a.wav`).
    """
    p = Path(path)
    hint = "choose a file in a directory you can write to"
    if p.is_dir():
        raise AudioError(f"cannot write {p}: it is a directory", hint="give a file name, e.g. out.wav")
    if not make_parent and not p.parent.is_dir():
        raise AudioError(f"cannot write {p}: directory {p.parent} does not exist", hint="create it first")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists():
            with open(p, "r+b"):
                pass
        else:
            with open(p, "xb"):
                pass
            p.unlink()
    except OSError as e:
        raise AudioError(f"cannot write {p}: {e.strerror or e}", hint=hint) from e


def write_sound_file(
    path: str | os.PathLike[str], audio: np.ndarray, sample_rate: int, subtype: str | None = None
) -> Path:
    """Write float audio to `path` in the format its extension names (see FILE_FORMATS)."""

    fmt, sub = file_format(path, subtype, sample_rate)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        sf.write(str(p), audio, sample_rate, format=fmt, subtype=sub)
    except (OSError, RuntimeError, TypeError, ValueError) as e:
        raise AudioError(f"cannot write {p}: {e}", hint="check the path and the free disk space") from e
    return p


class FileOutput(PacedOutput):
    """Writes what is played to a sound file, as fast as it arrives.

    The format comes from the extension (FILE_FORMATS: .wav 16-bit PCM, .flac, .ogg Vorbis,
    .opus, .mp3); `subtype` overrides the default one (e.g. "PCM_24", "FLOAT" for WAV). An
    unknown extension, an impossible subtype or a path that cannot be written is an
    `AudioError` when the output is made, before any model work. `sample_rate` (default
    48 kHz, the model's) and `channels` (1 = mono; 2 = the mono line on both) are the file's.
    With `speed=inf` (default) the file is the lines back to back with the
    configured pauses, never waiting silence; a finite `speed` records the
    stream as a sound card would play it, silences and underruns included.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        sample_rate: int = SAMPLE_RATE,
        channels: int = 1,
        subtype: str | None = None,
        speed: float = math.inf,
        fade_s: float = 0.01,
        name: str | None = None,
    ) -> None:
        super().__init__(
            speed=speed, sample_rate=sample_rate, channels=channels, fade_s=fade_s, name=name or str(path)
        )
        self.path = Path(path)
        self.format, self.subtype = file_format(self.path, subtype, sample_rate)
        check_writable(self.path, make_parent=True)  # one rule with `say -o out/a.wav`: the folder is made
        self._file: Any = None

    def _open_sink(self) -> None:

        try:
            self._file = sf.SoundFile(
                self.path,
                "w",
                samplerate=self.sample_rate,
                channels=self.channels,
                format=self.format,
                subtype=self.subtype,
            )
        except (OSError, RuntimeError, TypeError, ValueError) as e:
            raise AudioError(f"cannot open {self.path} for writing: {e}") from e

    def _write(self, audio: np.ndarray) -> None:
        super()._write(audio)
        self._file.write(audio)

    def _close_sink(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
