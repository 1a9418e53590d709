"""benchmarks/concurrency.py: the GPU-busy arithmetic of `--profile`, and a smoke run of the rows
and the `--ceiling` table on the tiny model (the CPU's clock: checks the script, times nothing)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from irodori_speaker.engine.duration import HOP

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "concurrency.py"


def _module():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("concurrency_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_busy_time_is_the_union_of_intervals_and_gaps_lie_between_them() -> None:
    busy_and_gaps = _module().busy_and_gaps
    # overlapping (two streams), nested, touching and separate intervals, given out of order
    spans = [(20, 25), (0, 10), (5, 12), (21, 22), (12, 14), (30, 31)]
    assert busy_and_gaps(spans) == (14 + 5 + 1, [6, 5])
    assert busy_and_gaps([]) == (0, [])
    assert busy_and_gaps([(3, 9)]) == (6, [])


@pytest.mark.slow
def test_smoke_run_speaks_the_minimum_lines_and_the_ceiling_adds_up(tmp_path: Path) -> None:
    out = tmp_path / "concurrency.json"
    cmd = [sys.executable, str(SCRIPT), "--smoke", "--mode", "f", "--streams", "1,2", "--lines", "1"]
    cmd += ["--min-lines", "3", "--max-batch", "2", "--no-serial", "--ceiling", "--ceiling-frames", "20"]
    run = subprocess.run(
        [*cmd, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    rows = {r["streams"]: r for r in report["rows"]}
    assert rows[1]["lines"] == 3  # one stream speaks --min-lines, not --lines
    assert rows[2]["lines"] == 4  # two streams: ceil(3 / 2) each
    assert "| x 1 stream |" in run.stdout
    ceiling = report["ceiling"]
    assert [c["rows"] for c in ceiling] == [1, 2]
    audio_s = 20 * HOP / 48_000
    for c in ceiling:
        total = c["text_ms"] + c["sampling_ms"] + c["windows_ms"]
        assert min(c["text_ms"], c["sampling_ms"], c["windows_ms"]) > 0
        assert c["ms_a_line"] == pytest.approx(total / c["rows"])
        assert c["audio_s_per_s"] == pytest.approx(c["rows"] * audio_s / (total / 1e3))
    one = ceiling[0]
    assert one["sampling_only_audio_s_per_s"] == pytest.approx(one["audio_s_per_s"])
