"""benchmarks/server_load.py: a burst on a real server (news5's tiny files on the CPU preset, real
uvicorn on loopback, httpx), and its fall-back to OpenAI requests where the server lacks pyopenjtalk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "server_load.py"

pytestmark = pytest.mark.slow


def _server_load(args: list[str], pythonpath: str) -> subprocess.CompletedProcess:
    """benchmarks/server_load.py with `args`, which must succeed."""
    run = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=pythonpath),
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return run


def _burst(tmp_path: Path, pythonpath: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "server_load.json"
    run = _server_load(["-n", "4", "--full", "smoke", "--json", str(out)], pythonpath)
    return run, json.loads(out.read_text())


def test_the_default_burst_mixes_voicevox_pairs_and_openai_requests_none_lost(tmp_path: Path) -> None:
    run, figures = _burst(tmp_path, str(REPO / "src"))
    assert figures["routes"] == ["voicevox", "openai"] and figures["note"] is None
    assert figures["serve_args"] == ["--no-cache"]  # serve's own queue and admission defaults
    groups = {k: (g["requests"], g["ok"], g["rejected"], g["lost"]) for k, g in figures["groups"].items()}
    assert groups == {"voicevox": (2, 2, 0, 0), "openai": (2, 2, 0, 0), "all": (4, 4, 0, 0)}
    assert figures["rejected_in_metrics"] == 0 and figures["server_exit"] == 130  # Ctrl-C, graceful
    for g in figures["groups"].values():
        assert 0 < g["ttfb_p50_s"] <= g["ttfb_p95_s"] and g["ttfb_p95_s"] <= g["total_p95_s"]
    assert "| voicevox | 2 | 2 | 0 | 0 |" in run.stdout


def test_a_server_without_pyopenjtalk_gets_openai_requests_only_with_a_note(tmp_path: Path) -> None:
    # stands in for the H200 image, which lacks pyopenjtalk: a package of that name that fails to
    # import, ahead of the installed one on the server's path
    shadow = tmp_path / "no_openjtalk" / "pyopenjtalk"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("not on this image")\n')
    run, figures = _burst(tmp_path, os.pathsep.join([str(shadow.parent), str(REPO / "src")]))
    assert figures["routes"] == ["openai"]
    assert "pyopenjtalk" in figures["note"] and "note: VOICEVOX pairs left out" in run.stdout
    assert figures["groups"]["all"] == {**figures["groups"]["all"], "requests": 4, "ok": 4, "lost": 0}
    assert set(figures["groups"]) == {"openai", "all"}


def test_the_gil_table_puts_each_sample_in_the_part_nearest_its_leaf(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import spy_profile

    raw = tmp_path / "gil.txt"
    raw.write_text(
        "thread (11): irodori-synthesis-3;run (threading.py:1);_render (irodori_speaker/synthesis/"
        "synthesizer.py:9);forward (irodori_speaker/engine/model.py:96) 30\n"
        "thread (12): MainThread;run (uvicorn/server.py:1);speech (irodori_speaker/server/routes/openai.py:"
        "5);validate (pydantic/main.py:3) 10\n"
        "thread (12): MainThread;run (uvicorn/server.py:1);speech (irodori_speaker/server/routes/openai.py:"
        "5) 6\n"
        "thread (11): irodori-synthesis-0;_render (irodori_speaker/synthesis/synthesizer.py:9);count_morae "
        "(irodori_speaker/text/length.py:120) 4\n"
    )
    table = spy_profile.gil_table(raw, requests=2)
    assert "50 samples at 200/s = 0.25 s holding the GIL, 125.0 ms a request" in table
    assert "| engine (the model's Python: launches, eager ops) | 60% | 75.0 |" in table
    assert "| HTTP (uvicorn, starlette, FastAPI, pydantic) | 20% | 25.0 |" in table
    assert "| server (routes, service, guards) | 12% | 15.0 |" in table
    assert "| text front-end (readings, tokens, length) | 8% | 10.0 |" in table
    assert table.endswith("by thread: irodori-synthesis 68%, MainThread 32%")
    lines = spy_profile.gil_table(raw, requests=5, unit="line", wall_s=0.5)
    assert "= 0.25 s holding the GIL (50% of 0.50 s), 50.0 ms a line" in lines
    assert "| part | share | ms a line |" in lines
    missing = spy_profile.gil_table(tmp_path / "none.txt", requests=2)
    assert missing.startswith("GIL profile: no samples (py-spy could not attach")


def test_a_burst_with_the_gil_profile_samples_the_real_server(tmp_path: Path) -> None:
    run = _server_load(["-n", "8", "--gil-profile", str(tmp_path / "gil.txt")], str(REPO / "src"))
    if "py-spy could not attach" in run.stdout:  # a machine that denies ptrace: said, not hidden
        pytest.skip(run.stdout.split("GIL profile: ")[-1][:300])
    assert "holding the GIL" in run.stdout and "| engine (the model's Python" in run.stdout


def test_the_wait_table_says_where_each_thread_group_runs_or_waits(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import spy_profile

    owner = "irodori_speaker/engine/hardware/owner.py"
    raw = tmp_path / "wait.txt"
    raw.write_text(
        "thread (1): stream-0;line (concurrency.py:9);TextEncoders.encode (irodori_speaker/synthesis/"
        f"encoding.py:70);DeviceOwner.run_batched ({owner}:170);DeviceOwner._submit ({owner}:219);"
        "wait (threading.py:359) 6\n"
        "thread (2): stream-1;line (concurrency.py:9);SampleBatcher._gather (irodori_speaker/synthesis/"
        "batching.py:145);wait (threading.py:359) 3\n"
        "thread (2): stream-1;line (concurrency.py:9);count_morae (irodori_speaker/text/length.py:120) 1\n"
        f"thread (3): irodori-device;DeviceOwner._own ({owner}:297);wait (threading.py:359) 3\n"
        f"thread (3): irodori-device;DeviceOwner._own ({owner}:300);DeviceOwner._do ({owner}:380) 1\n"
    )
    table = spy_profile.wait_table(raw)
    assert (
        "| stream | 10 | waits in DeviceOwner._submit <- TextEncoders.encode 60%; "
        "waits in SampleBatcher._gather 30%; runs in count_morae 10% |"
    ) in table
    assert "| irodori-device | 4 | waits in DeviceOwner._own 75%; runs in DeviceOwner._do 25% |" in table
    assert spy_profile.wait_table(tmp_path / "none.txt").startswith("wait profile: no samples")
