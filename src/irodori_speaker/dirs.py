"""Where irodori-speaker keeps what it makes on this machine: one root, a folder per kind.

`$IRODORI_CACHE`, else `$XDG_CACHE_HOME/irodori-speaker`, else `~/.cache/irodori-speaker`:
`phrases/` (the phrase cache), `voices/` (encoded references), `kernels/` (kernel choices
measured on this GPU).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    base = os.environ.get("IRODORI_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "irodori-speaker"
    )
    return Path(base)
