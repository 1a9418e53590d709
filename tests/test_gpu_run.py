"""benchmarks/gpu_run.sh packs its stages' logs into one file: the device returns at most 8 files a
call. The GPU is stood in for by a fake `nvidia-smi` on PATH (the env stage's first command); the
stages themselves run on a device only. The script runs from a copy in an empty folder, so a
checkout's .whl and .device_caches stay out of it."""

from __future__ import annotations

import os
import signal
import subprocess
import tarfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_run.sh"


def _fake_gpu(tmp_path: Path, seconds: float) -> dict[str, str]:
    """An env for gpu_run.sh whose `nvidia-smi` marks that it runs, then sleeps `seconds`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\ntouch "{tmp_path}/smi-running"\nsleep {seconds}\necho "FAKE H200"\n')
    smi.chmod(0o755)
    caches = tmp_path / "triton"
    caches.mkdir()
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "gpu_run.sh").write_text(SCRIPT.read_text())
    return {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "OUT": str(tmp_path / "out"),
        "TRITON_CACHE_DIR": str(caches),
    }


def _call(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "gpu_run.sh"], cwd=tmp_path / "tree", env=env, capture_output=True, text=True, timeout=60
    )


def _members(out: Path) -> set[str]:
    with tarfile.open(out / "logs.tar") as tar:
        return set(tar.getnames())


def test_a_finished_call_returns_its_logs_as_one_tar_and_the_caches_beside_it(tmp_path):
    env = {**_fake_gpu(tmp_path, 0), "STAGES": "env caches"}
    out = Path(env["OUT"])
    (out / "batch").mkdir(parents=True)  # as a stage's own folder of files (news5_batch's)
    (out / "batch" / "news5.json").write_text("{}")
    proc = _call(tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["device_caches.tgz", "logs.tar"]
    assert _members(out) == {"batch/news5.json", "env.txt"}
    with tarfile.open(out / "logs.tar") as tar:
        env_txt = tar.extractfile("env.txt")
        assert env_txt is not None and "FAKE H200" in env_txt.read().decode()


def test_a_call_cut_off_mid_stage_has_packed_every_stage_before_it(tmp_path):
    """The device kills a call at its time limit, past any exit trap: what the earlier stages wrote
    must already be in logs.tar when the next stage starts."""
    env = {**_fake_gpu(tmp_path, 60), "STAGES": "env"}
    out = Path(env["OUT"])
    out.mkdir()
    for name in ("pytest.txt", "pytest_full.txt", "files.txt"):  # earlier stages' files
        (out / name).write_text(name)
    proc = subprocess.Popen(
        ["bash", "gpu_run.sh"], cwd=tmp_path / "tree", env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "smi-running").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the env stage never started"
            time.sleep(0.05)
        assert _members(out) == {"pytest.txt", "pytest_full.txt", "files.txt"}
        # nothing else loose: env.txt is tee's, open (created as the stage's pipe starts)
        assert {p.name for p in out.iterdir()} - {"env.txt"} == {"logs.tar"}
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_last_stages_logs_are_packed_as_the_call_ends(tmp_path):
    env = {**_fake_gpu(tmp_path, 0), "STAGES": "env"}
    proc = _call(tmp_path, env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = Path(env["OUT"])
    assert [p.name for p in out.iterdir()] == ["logs.tar"] and _members(out) == {"env.txt"}
