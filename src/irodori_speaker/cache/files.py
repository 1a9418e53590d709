"""The phrase cache's audio files and sizes: `AudioFiles` (the audio/ and tmp/ folders: atomic
writes, removal, sweeps), encode / decode, fsync, '500M' <-> bytes."""

from __future__ import annotations

import contextlib
import io
import os
import re
import time
import uuid
from collections.abc import Container
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from ..dirs import cache_root
from ..errors import CacheError, InputError
from ..options.memory import parse_bytes

AUDIO_FORMATS = ("f32", "flac")

#: What an index row's `file` may name: a file under audio/ (never a path out of the cache).
AUDIO_FILE = re.compile(r"audio/[0-9a-z]+/[0-9a-z]+\.[0-9a-z]+\.[0-9a-z]+")


def default_cache_dir() -> Path:
    """`$IRODORI_CACHE/phrases`, else `$XDG_CACHE_HOME/irodori-speaker/phrases` (~/.cache)."""
    return cache_root() / "phrases"


def parse_size(text: str | int) -> int:
    """'500MiB', '2G', '1.5GiB', '800k', '123' (bytes) -> bytes (`options.memory.parse_bytes`'s
    units: KB, MB, GB in powers of 1000, KiB, MiB, GiB and K, M, G in powers of 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        value = parse_bytes(str(text))
    if value <= 0:
        raise InputError(f"a cache size limit must be > 0 bytes, got {text!r}")
    return value


def encode_audio(audio: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    if fmt == "f32":
        return np.ascontiguousarray(audio, dtype="<f4").tobytes()

    buf = io.BytesIO()
    sf.write(buf, np.clip(audio, -1.0, 1.0), sample_rate, format="FLAC", subtype="PCM_24")
    return buf.getvalue()


def decode_audio(data: bytes, fmt: str) -> np.ndarray:
    if fmt == "f32":
        if len(data) % 4:
            raise ValueError("raw float32 file size is not a multiple of 4")
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    if fmt == "flac":
        audio, _ = sf.read(io.BytesIO(data), dtype="float32", always_2d=False)
        return np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
    raise ValueError(f"unknown audio format {fmt!r}")


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # Windows cannot open directories; rename there is durable enough
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class AudioFiles:
    """The audio files of a cache at `directory`: `audio/` (one file per entry, named by the
    index row) and `tmp/` (writes in progress). Paths are relative to `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def create(self) -> None:
        """Create the folders (OSError if it cannot)."""
        (self.directory / "audio").mkdir(parents=True, exist_ok=True)
        (self.directory / "tmp").mkdir(parents=True, exist_ok=True)

    def path(self, rel: str) -> Path:
        return self.directory / rel

    def write(self, rel: str, data: bytes) -> None:
        """Write `data` to `rel` atomically: temp file -> fsync -> rename -> fsync(dir)."""
        final = self.directory / rel
        tmp = self.directory / "tmp" / f"{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part"
        try:
            final.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)  # atomic: a reader sees the whole file or none
            _fsync_dir(final.parent)
        except BaseException as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            if isinstance(e, OSError):
                raise CacheError(f"cannot write {final}: {e}") from e
            raise

    def unlink(self, rel: Any) -> None:
        """Remove an audio file an index row named, only if it is one of this cache's (a damaged
        row must not delete something else)."""
        if isinstance(rel, str) and AUDIO_FILE.fullmatch(rel):
            with contextlib.suppress(OSError):
                (self.directory / rel).unlink()

    def sweep_temp(self, grace_s: float) -> int:
        """Remove temp files older than `grace_s` (a crashed writer's); returns how many."""
        removed = 0
        now = time.time()
        with contextlib.suppress(OSError):
            for p in (self.directory / "tmp").iterdir():
                with contextlib.suppress(OSError):
                    if now - p.stat().st_mtime > grace_s:
                        p.unlink()
                        removed += 1
        return removed

    def sweep_orphans(self, known: Container[str], grace_s: float) -> int:
        """Remove audio files not in `known` and older than `grace_s`; returns how many.

        A writer renames its file into place a moment before it commits the row, so only
        files older than `grace_s` count as orphans."""
        removed = 0
        now = time.time()
        for p in (self.directory / "audio").rglob("*"):
            if not p.is_file():
                continue
            if p.relative_to(self.directory).as_posix() in known:
                continue
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime > grace_s:
                    p.unlink()
                    removed += 1
        return removed
