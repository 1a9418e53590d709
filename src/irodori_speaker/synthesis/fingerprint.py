"""Content fingerprints of files and bytes (cache keys must follow content, not paths)."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

_memo: dict[tuple[str, int, int], str] = {}
_memo_lock = threading.Lock()
CHUNK = 1 << 22


def bytes_fingerprint(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_fingerprint(path: str | os.PathLike) -> str:
    """sha256 of the file's bytes, memoised per (real path, size, mtime) for this process."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    with _memo_lock:
        if key in _memo:
            return _memo[key]
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    digest = h.hexdigest()
    with _memo_lock:
        _memo[key] = digest
    return digest
