"""benchmarks/device_wheels.sh: the wheels a device call carries, pinned to this environment's
versions (the download itself needs the package registry: run by hand, see the script)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "device_wheels.sh"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHON": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


def test_print_pins_each_wheel_to_the_installed_version():
    base = _run("--print")
    assert base.returncode == 0, base.stderr
    pins = base.stdout.split()
    assert pins == [f"{n}=={version(n)}" for n in ("soundfile", "cffi", "pycparser", "soxr", "pyloudnorm")]
    both = _run("base", "server", "--print").stdout.split()
    assert both[: len(pins)] == pins and f"fastapi=={version('fastapi')}" in both
    assert f"uvicorn=={version('uvicorn')}" in both and len(both) == len(set(both))


def test_an_unknown_group_is_one_line_and_downloads_nothing():
    bad = _run("serverx")
    assert bad.returncode == 2 and bad.stdout == ""
    want = "device_wheels.sh: unknown argument 'serverx' (base, server, --print)"
    assert bad.stderr.strip().splitlines() == [want]
