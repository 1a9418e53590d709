"""The GPU memory budget's value: `--max-gpu-memory` / `Speaker(max_gpu_memory=...)` /
`$IRODORI_MAX_GPU_MEMORY`. Torch-free: checked where it is given, before any model loads.

    parse_memory_budget("3GiB")     # MemoryBudget(bytes=3221225472)
    parse_memory_budget("3000MB")   # decimal units: 3_000_000_000 bytes
    parse_memory_budget("0.25")     # a fraction of the card's memory (also 0.25 or "25%")
    parse_memory_budget(2**31)      # a whole number of bytes

What the budget does on CUDA (the allocator's cap, the batch size, the graph buckets):
`engine/hardware/memory.py`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import BackendError, InputError

__all__ = [
    "BUDGET_ENV",
    "BudgetValueError",
    "MemoryBudget",
    "OverBudgetError",
    "budget_from",
    "format_bytes",
    "parse_bytes",
    "parse_memory_budget",
]

BUDGET_ENV = "IRODORI_MAX_GPU_MEMORY"

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    # docker's spelling: 3g is 3 GiB
    "k": 2**10,
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_SIZE = re.compile(r"(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>[a-z]*)")
_UNIT_NAMES = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB, or K, M, G, T"
_HINT = "e.g. 3GiB, 3000MB, 512MiB, or a fraction of the card such as 0.25"


class BudgetValueError(InputError):
    """A `max_gpu_memory` value that is not a size or a fraction of the card."""


class OverBudgetError(BackendError):
    """The GPU memory budget cannot hold the model, or a line's work on top of it."""


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes (`bytes`), or a fraction of the device's memory (`fraction`); `text` is as given."""

    bytes: int | None = None
    fraction: float | None = None
    text: str = ""

    def resolve(self, total: int) -> int:
        """The budget in bytes on a device of `total` bytes (never more than `total`)."""
        if self.bytes is not None:
            return min(self.bytes, total)
        assert self.fraction is not None
        return int(total * self.fraction)

    def describe(self, total: int | None = None) -> str:
        """'3 GiB', '25 % of the card' (with `total`: '25 % of the card (35.0 GiB)')."""
        if self.bytes is not None:
            return format_bytes(self.bytes)
        assert self.fraction is not None
        text = f"{self.fraction * 100:g} % of the card"
        return text if total is None else f"{text} ({format_bytes(self.resolve(total))})"


def format_bytes(n: float) -> str:
    """'3 GiB', '512 MiB', '1.5 GiB' (binary units, 3 significant figures)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def _bad(value: object, why: str, where: str, hint: str = _HINT) -> BudgetValueError:
    return BudgetValueError(f"{where} {value!r}: {why}", hint=hint)


def parse_memory_budget(
    value: str | int | float | None, where: str = "max_gpu_memory"
) -> MemoryBudget | None:
    """The budget `value` names, None for None / "" (no budget), else a `BudgetValueError`.

    A string with a unit (B, KB, MB, GB, TB in powers of 1000; KiB, MiB, GiB, TiB and K, M, G, T
    in powers of 1024; any case, a space allowed) is a size; a plain number string or a float is
    a fraction of the card in (0, 1]; "25%" is one too; an int is bytes. `where` names the value
    in the error (the flag, the keyword or the environment variable).
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise _bad(value, "is not a size", where)
    if isinstance(value, int):
        if value <= 0:
            raise _bad(value, "must be more than 0 bytes", where, "leave it out for no budget")
        return MemoryBudget(bytes=value, text=str(value))
    if isinstance(value, float):
        return MemoryBudget(fraction=_fraction(value, value, where), text=repr(value))
    if not isinstance(value, str):
        raise _bad(value, f"is a {type(value).__name__}, not a size", where)
    text = value.strip()
    if not text:
        return None
    if text.endswith("%"):
        try:
            percent = float(text[:-1])
        except ValueError:
            raise _bad(value, "is not a percentage", where) from None
        if percent > 100:
            raise _bad(value, "a percentage of the card is at most 100 %", where, "e.g. 25% or 0.25")
        return MemoryBudget(fraction=_fraction(percent / 100, value, where), text=text)
    if text.startswith("-"):
        raise _bad(value, "must be more than 0", where, "leave it out for no budget")
    m = _SIZE.fullmatch(text.lower())
    if m is None:
        raise _bad(value, "is not a size", where)
    if not m["unit"]:
        return MemoryBudget(fraction=_fraction(float(m["number"]), value, where), text=text)
    if m["unit"] not in _UNITS:
        raise _bad(value, f"unknown unit {m['unit']!r}", where, f"units: {_UNIT_NAMES}")
    size = parse_bytes(text)
    if size <= 0:
        raise _bad(value, "must be more than 0 bytes", where, "leave it out for no budget")
    return MemoryBudget(bytes=size, text=text)


def parse_bytes(text: str, *, bare: str = "bytes") -> int:
    """A size with a unit as bytes: B, KB, MB, GB, TB in powers of 1000; KiB, MiB, GiB, TiB and
    K, M, G, T (docker's "3g") in powers of 1024; any case, a space allowed. A bare number is
    bytes (`bare="bytes"`) or refused (`bare="refuse"`). The one size grammar of the project (the
    GPU budget, the phrase cache's limit). `InputError` for anything else."""
    m = _SIZE.fullmatch(text.strip().lower())
    if m is None or (not m["unit"] and bare != "bytes"):
        raise InputError(f"not a size: {text!r}", hint=f"a number and a unit: {_UNIT_NAMES}")
    unit = m["unit"] or "b"
    if unit not in _UNITS:
        raise InputError(f"not a size: unknown unit {m['unit']!r}", hint=f"units: {_UNIT_NAMES}")
    return int(float(m["number"]) * _UNITS[unit])


def _fraction(number: float, value: object, where: str) -> float:
    if not math.isfinite(number) or number <= 0:
        raise _bad(value, "must be more than 0", where, "leave it out for no budget")
    if number > 1:
        raise _bad(
            value,
            "a plain number is a fraction of the card, in (0, 1]",
            where,
            f"for a size give a unit: {number:g}GiB or {number:g}GB",
        )
    return float(number)


def budget_from(
    value: str | int | float | None, env: Mapping[str, str] | None = None, where: str = "max_gpu_memory"
) -> tuple[MemoryBudget | None, str]:
    """The budget asked for and where it came from: `value` if given, else $IRODORI_MAX_GPU_MEMORY
    (`env`, default os.environ), else (None, "")."""
    if value is not None:
        return parse_memory_budget(value, where), where
    raw = (os.environ if env is None else env).get(BUDGET_ENV, "")
    if raw.strip():
        return parse_memory_budget(raw, f"${BUDGET_ENV}"), f"${BUDGET_ENV}"
    return None, ""
