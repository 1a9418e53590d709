"""Filling a huggingface_hub cache directory by hand, laid out as the library lays it out."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fill_cache(cache: Path, repo_id: str, files: dict[str, bytes]) -> None:
    """Lay files out as huggingface_hub's cache does: blobs, snapshots/<commit>, refs/main."""
    root = cache / ("models--" + repo_id.replace("/", "--"))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = root / "snapshots" / COMMIT / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))


def run_cli_offline(
    args: list, hf_home: Path, cwd: Path, timeout: float = 300
) -> subprocess.CompletedProcess:
    """`irodori-speaker ARGS` in a subprocess with HF_HOME=hf_home and HF_HUB_OFFLINE=1 (no other HF_*)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "irodori_speaker.cli", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )
