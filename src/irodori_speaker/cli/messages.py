"""What the command line tells the user besides results: library hints in its own words, the
extras' install line (a clone or a wheel), where a command's wall time went (-v), the progress bar."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def _process_age() -> float | None:
    """Seconds since this process started (Linux: /proc), None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            started_ticks = int(f.read().rpartition(")")[2].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Phases:
    """Where a command's wall time goes, for -v: the interpreter and the command line's imports,
    torch's import, the model load, the synthesis, and the rest (writing, playing)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.before = _process_age()  # the interpreter and our imports, before the command ran
        self.parts: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.parts[name] = self.parts.get(name, 0.0) + time.perf_counter() - t

    def summary(self) -> str:
        """ "4.31 s since the process started: python and imports 0.31 s, torch import 1.52 s, ..."."""
        ran = time.perf_counter() - self.t0
        rest = ran - sum(self.parts.values())
        shown = ([("python and imports", self.before)] if self.before is not None else []) + [
            *self.parts.items(),
            ("the rest", rest),
        ]
        total = ran + (self.before or 0.0)
        since = "the process started" if self.before is not None else "the command started"
        return f"{total:.2f} s since {since}: " + ", ".join(f"{k} {v:.2f} s" for k, v in shown)


#: This package runs from a clone of the repository (scripts/setup.sh, `pip install -e .`), not a wheel.
IN_A_CLONE = (Path(__file__).resolve().parents[3] / "scripts" / "setup.sh").is_file()

#: Python keyword spellings in the library's hints -> the command line's flags.
_FLAGS = (
    *("backend", "device", "dtype", "codec_device", "hostapi", "model", "codec", "tokenizer", "threads"),
    *("tags", "urls", "laughter", "steps", "seed", "seconds", "speed"),  # synthesis options with a flag
)
_KEYWORD = re.compile(r"\b(" + "|".join(_FLAGS) + r")=(?:(['\"])(.*?)\2|([\w.:/-]+))?")


def extra_hint(extra: str) -> str:
    """How to install an optional extra: from the clone this runs from, else the installed package's."""
    if IN_A_CLONE:
        return f"install the {extra} extra: pip install -e '.[{extra}]' in your clone"
    return f"install the {extra} extra: pip install 'irodori-speaker[{extra}]'"


def cli_hint(hint: str) -> str:
    """A library hint in the command line's words: `backend='cpu'` -> `--backend cpu`, the extras'
    install line for a clone or a wheel, no scripts/setup.sh where there is no clone."""
    hint = re.sub(r"pip install '?irodori-speaker\[(\w+)\]'?", lambda m: extra_hint(m.group(1)), hint)

    def flag(m: re.Match[str]) -> str:
        value = m.group(3) if m.group(3) is not None else m.group(4)
        return f"--{m.group(1).replace('_', '-')}" + (f" {value}" if value else "")

    ours, python, theirs = hint.partition("in Python")  # a hint that names both spellings keeps both
    hint = _KEYWORD.sub(flag, ours) + python + theirs
    if not IN_A_CLONE:
        hint = re.sub(r";? or run scripts/setup\.sh", "", hint)
    return hint


def phases_of(args: argparse.Namespace) -> Phases:
    """The command's `Phases` (one per run; programs with their own parser get one here)."""
    found = getattr(args, "phases", None)
    if not isinstance(found, Phases):
        found = Phases()
        args.phases = found
    return found


class Progress:
    """One tqdm bar on stderr for a whole job; nothing when stderr is not a terminal or with -q.

    Called as `progress(done, total)` (a line's sampler steps across all its pieces, or
    entries), optionally with an `eta` the caller knows (unused: tqdm's rate-based estimate
    is the one shown) and a short `note`. The bar fits the terminal's width (no wrapping).
    """

    def __init__(self, label: str, enabled: bool | None = None, *, counts: bool = True) -> None:
        self.label = label
        self.enabled = enabled  # None: tqdm decides (on only on a terminal)
        self.counts = counts  # show done/total; False for a fraction (a line's weighted steps)
        self.bar: Any = None

    def __call__(self, done: int, total: int, eta: float | None = None, note: Any = "") -> None:
        if self.enabled is False:
            return
        if self.bar is None:
            from tqdm import tqdm

            fmt = "{desc} {percentage:3.0f}%|{bar}| " + ("{n}/{total} " if self.counts else "")
            self.bar = tqdm(
                total=total,
                desc=self.label,
                file=sys.stderr,
                disable=None if self.enabled is None else not self.enabled,
                dynamic_ncols=True,
                leave=False,
                bar_format=fmt + "[{elapsed}<{remaining}]{postfix}",
            )
        if self.bar.total != total:
            self.bar.total = total
        if note:
            self.bar.set_postfix_str(str(note)[:30], refresh=False)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
