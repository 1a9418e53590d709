"""What this CPU offers the CPU preset: the instruction sets behind its bf16 and int8 tricks.

Read once per process (`cpu_features()`): on Linux from /proc/cpuinfo (the flags the CPU has and
the kernel enabled; AMX needs both); elsewhere (Windows, macOS) from torch's own cpuinfo checks
(`torch.cpu._is_*_supported`, imported only then). Importing this module does not import torch.

The flags that matter (x86):
- `amx_bf16`, `amx_int8` (Sapphire Rapids and later Xeons): oneDNN's tile matmuls, several times
  the AVX-512 rate for bf16 and int8 GEMMs and convolutions;
- `avx512_bf16` (Cooper Lake, Zen 4 / Zen 5): bf16 dot products, ~2.5x fp32 per core here;
- `avx512_vnni`, `avx_vnni` (Cascade Lake and later Xeons, Ice / Tiger Lake, Alder Lake and later
  desktops, Zen 4 / Zen 5): int8 dot products for int8 GEMMs.
The preset's choices per flag: presets.py (`cpu_preset_fields`); measurements:
benchmarks/cpu_preset.py and docs/backends.md.

`IRODORI_CPU_FLAGS` replaces the detection: `none` (the CPU preset of before: fp32, no tricks),
or the flags to assume, e.g. `avx512_bf16,avx512_vnni` (the test suite sets `none`, so its
results do not depend on the machine).
"""

from __future__ import annotations

import functools
import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from ...errors import BackendError

__all__ = [
    "CPUINFO",
    "FLAGS_ENV",
    "THREADS_ENV",
    "CpuFeatures",
    "cgroup_cpu_limit",
    "choose_threads",
    "cpu_features",
    "default_threads",
    "detect",
    "parse_cpuinfo",
    "usable_cpus",
]

CPUINFO = Path("/proc/cpuinfo")
CGROUP = Path("/sys/fs/cgroup")
FLAGS_ENV = "IRODORI_CPU_FLAGS"
#: Torch's CPU threads for the model (`--threads`, `threads=` win over it).
THREADS_ENV = "IRODORI_THREADS"
#: The flags the preset reads, in the spelling of Linux's /proc/cpuinfo.
INTERESTING = (
    "amx_bf16",
    "amx_int8",
    "amx_tile",
    "avx512_bf16",
    "avx512_vnni",
    "avx_vnni",
    "avx512f",
    "avx2",
)


@dataclass(frozen=True)
class CpuFeatures:
    """Instruction-set flags of this CPU (lower case, /proc/cpuinfo spelling) and where they came from."""

    flags: frozenset[str] = frozenset()
    model: str = ""
    source: str = "none"  # "/proc/cpuinfo", "torch" or "none" (nothing could be read)

    def has(self, flag: str) -> bool:
        return flag in self.flags

    @property
    def bf16_matmul(self) -> bool:
        """Native bf16 dot products (AMX or AVX512_BF16): bf16 GEMMs and convs faster than fp32.

        Without them oneDNN emulates bf16 through fp32 and a bf16 model runs slower than fp32."""
        return self.has("amx_bf16") or self.has("avx512_bf16")

    @property
    def int8_matmul(self) -> bool:
        """Native int8 dot products (AMX-INT8, AVX512-VNNI or AVX-VNNI) for int8 GEMMs."""
        return self.has("amx_int8") or self.has("avx512_vnni") or self.has("avx_vnni")

    @property
    def amx(self) -> bool:
        return self.has("amx_bf16") or self.has("amx_int8")

    def summary(self) -> str:
        """One line: the interesting flags present, the model and the source."""
        shown = [f for f in INTERESTING if f in self.flags] or ["none of " + ", ".join(INTERESTING)]
        model = f" ({self.model})" if self.model else ""
        return f"{' '.join(shown)}{model} [from {self.source}]"


def parse_cpuinfo(text: str) -> CpuFeatures:
    """The flags of the first processor in /proc/cpuinfo text (x86 `flags`, Arm `Features`)."""
    flags: frozenset[str] = frozenset()
    model = ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip().lower()
        if key in ("flags", "features") and not flags:
            flags = frozenset(value.lower().split())
        elif key == "model name" and not model:
            model = " ".join(value.split())
        if flags and model:
            break
    return CpuFeatures(flags, model, "/proc/cpuinfo")


def _from_torch() -> CpuFeatures:
    """The flags torch's bundled cpuinfo reports (any OS; no AVX-VNNI check there), or none."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return CpuFeatures()
    checks = {
        "avx2": "_is_avx2_supported",
        "avx512f": "_is_avx512_supported",
        "avx512_bf16": "_is_avx512_bf16_supported",
        "avx512_vnni": "_is_vnni_supported",
        "amx_tile": "_is_amx_tile_supported",
    }
    found = set()
    for flag, name in checks.items():
        probe = getattr(torch.cpu, name, None)
        try:
            if probe is not None and probe():
                found.add(flag)
        except Exception:  # a private check that changed: treat as absent
            continue
    if "amx_tile" in found:  # every CPU with AMX tiles so far has both the bf16 and int8 units
        found.update(("amx_bf16", "amx_int8"))
    return CpuFeatures(frozenset(found), platform.processor(), "torch")


def from_env(value: str) -> CpuFeatures:
    """The flags `IRODORI_CPU_FLAGS` names (`none` or empty: no flags)."""
    names = value.replace(",", " ").lower().split()
    return CpuFeatures(frozenset(n for n in names if n != "none"), "", FLAGS_ENV)


def detect(cpuinfo: Path = CPUINFO) -> CpuFeatures:
    """Read the flags now: `IRODORI_CPU_FLAGS` if set, /proc/cpuinfo where there is one, else torch's."""
    if FLAGS_ENV in os.environ:
        return from_env(os.environ[FLAGS_ENV])
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return _from_torch()
    found = parse_cpuinfo(text)
    return found if found.flags else _from_torch()


@functools.lru_cache(maxsize=1)
def cpu_features() -> CpuFeatures:
    """This machine's flags, detected once per process."""
    return detect()


def _own_cgroup(proc_cgroup: Path) -> str:
    """This process's cgroup v2 path ("0::/a/b" in /proc/self/cgroup), "" when unknown."""
    try:
        for line in proc_cgroup.read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip().strip("/")
    except OSError:
        pass
    return ""


def cgroup_cpu_limit(root: Path = CGROUP, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """How many CPUs this process's cgroup may use (quota / period; the tightest of its cgroup and
    the ones above it), or None when unlimited or unreadable. Containers and job slots set it while
    the machine's cores stay visible: torch then starts a thread per core of the whole machine."""
    limits = []
    own = _own_cgroup(proc_cgroup)
    parts = own.split("/") if own else []
    for depth in range(len(parts), -1, -1):  # cgroup v2: cpu.max = "<quota> <period>" or "max <period>"
        try:
            quota, period = (root.joinpath(*parts[:depth]) / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        if quota != "max" and int(period) > 0:
            limits.append(int(quota) / int(period))
    for v1 in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):  # cgroup v1: quota -1 is unlimited
        try:
            quota_us = int((root / v1 / "cpu.cfs_quota_us").read_text())
            period_us = int((root / v1 / "cpu.cfs_period_us").read_text())
        except (OSError, ValueError):
            continue
        if quota_us > 0 and period_us > 0:
            limits.append(quota_us / period_us)
        break
    return min(limits) if limits else None


def usable_cpus(root: Path = CGROUP, proc_cgroup: Path = Path("/proc/self/cgroup")) -> int:
    """The CPUs this process may run on: its affinity mask, capped by its cgroup's CPU quota."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        n = os.cpu_count() or 1
    limit = cgroup_cpu_limit(root, proc_cgroup)
    if limit is not None:
        n = min(n, max(1, math.floor(limit)))
    return n


def default_threads(usable: int | None = None) -> int:
    """Torch's CPU threads when none are asked for: half the CPUs this process may use, at least one.

    A streaming PC is shared (OBS, a game, an LLM): torch's own default, a thread per core, made
    its OpenMP threads wait on each other whenever another program held a core: the synthesis of
    the README's first line took 2.73 s instead of 0.81 s on a 2-core machine with 6 spinning
    processes, 7.15 s instead of 0.73 s under heavier mixed load; on a quiet one the two were
    equal (benchmarks/threads_under_load.py, docs/backends.md)."""
    return max(1, (usable if usable is not None else usable_cpus()) // 2)


def choose_threads(given: int | None = None, usable: int | None = None) -> tuple[int, str]:
    """(threads, why): `given` (--threads, `threads=`), else $IRODORI_THREADS, else the default."""
    if given is not None:
        return _check_threads(given, "threads"), "asked for"
    value = os.environ.get(THREADS_ENV, "").strip()
    if value:
        try:
            n = int(value)
        except ValueError:
            n = 0
        return _check_threads(n, f"{THREADS_ENV}={value!r}"), f"${THREADS_ENV}"
    usable = usable if usable is not None else usable_cpus()
    return default_threads(usable), f"half of the {usable} CPUs this process may use, the rest left free"


def _check_threads(n: object, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BackendError(
            f"{what}: CPU threads must be a whole number >= 1",
            hint="e.g. --threads 2 (Speaker(threads=2), IRODORI_THREADS=2); leave it out for the default",
        )
    return n
