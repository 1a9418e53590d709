"""The phrase cache's audio files and sizes: encode / decode, fsync, '500M' <-> bytes."""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

import numpy as np

from ..dirs import cache_root
from ..errors import InputError

AUDIO_FORMATS = ("f32", "flac")


def default_cache_dir() -> Path:
    """`$IRODORI_CACHE/phrases`, else `$XDG_CACHE_HOME/irodori-speaker/phrases` (~/.cache)."""
    return cache_root() / "phrases"


def parse_size(text: str | int) -> int:
    """'500M', '2G', '1.5GiB', '800k', '123' (bytes) -> bytes. Units are powers of 1024."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", str(text), re.IGNORECASE)
        if not m:
            raise InputError(f"not a size: {text!r}", hint="e.g. 500M, 2G, 1.5GiB or a number of bytes")
        value = int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2).lower() or " "))
    if value <= 0:
        raise InputError(f"a cache size limit must be > 0 bytes, got {text!r}")
    return value


def format_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _encode(audio: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    if fmt == "f32":
        return np.ascontiguousarray(audio, dtype="<f4").tobytes()
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, np.clip(audio, -1.0, 1.0), sample_rate, format="FLAC", subtype="PCM_24")
    return buf.getvalue()


def _decode(data: bytes, fmt: str) -> np.ndarray:
    if fmt == "f32":
        if len(data) % 4:
            raise ValueError("raw float32 file size is not a multiple of 4")
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    if fmt == "flac":
        import soundfile as sf

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
