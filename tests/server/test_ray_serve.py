"""`irodori-speaker serve --ray --replicas 2` on a real local Ray instance (CPU, tiny model).

Ray's own proxy spreads the requests; each replica loads the model and runs the whole app;
SIGTERM stops it all, leaving no Ray process.
The test reads Ray's per-replica access logs (logs/serve/replica_*.log under the session
directory, set by RAY_TMPDIR) to see that both replicas served lines.
"""

from __future__ import annotations

import concurrent.futures as cf
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from server_helpers import httpx, start_server, wav_info

pytest.importorskip("ray.serve")
# hang guards, not speed bounds: Ray's node start took minutes on a busy 2-core machine
pytestmark = pytest.mark.timeout(1500)


def _replica_logs(ray_tmp: Path) -> dict[str, str]:
    logs = sorted(ray_tmp.glob("ray/session_latest/logs/serve/replica_*.log"))
    return {p.name: p.read_text(errors="replace") for p in logs}


def test_two_replicas_serve_voicevox_and_openai(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # Ray's AF_UNIX socket paths must stay under 107 bytes: a short directory, not tmp_path
    ray_tmp = Path(tempfile.mkdtemp(prefix="irodori-ray-"))
    request.addfinalizer(lambda: shutil.rmtree(ray_tmp, ignore_errors=True))
    server = start_server(
        tmp_path / "home",
        "--ray",
        "--replicas",
        "2",
        "--no-cache",
        env={"RAY_TMPDIR": str(ray_tmp), "RAY_DEDUP_LOGS": "0", "RAY_USAGE_STATS_ENABLED": "0"},
        wait_s=900,
    )
    try:

        def voicevox(i: int) -> tuple[int, int]:
            q = httpx.post(
                server.url + "/audio_query", params={"text": "こんにちは。", "speaker": 0}, timeout=300
            )
            q.raise_for_status()
            r = httpx.post(server.url + "/synthesis", params={"speaker": 0}, json=q.json(), timeout=300)
            r.raise_for_status()
            audio, rate = wav_info(r.content)
            assert rate == q.json()["outputSamplingRate"]
            return rate, audio.shape[0]

        # rounds of 8 concurrent lines until Ray's proxy has used both replicas (right after the
        # start the proxy may know only the first one for a moment)
        results: list[tuple[int, int]] = []
        served: dict[str, int] = {}
        with cf.ThreadPoolExecutor(8) as pool:
            for _ in range(6):
                results += pool.map(voicevox, range(8))
                served = {name: log.count("POST /synthesis") for name, log in _replica_logs(ray_tmp).items()}
                if len(served) == 2 and all(served.values()):
                    break
        # the same text and seed on either replica: the same audio
        assert len(set(results)) == 1 and results[0][1] > 0
        # (a replica writes its access-log line just after the answer: the count may lag by one)
        assert len(served) == 2 and sum(served.values()) <= len(results), served
        assert all(n >= 1 for n in served.values()), f"Ray's proxy sent every line to one replica: {served}"

        with httpx.stream(
            "POST",
            server.url + "/v1/audio/speech",
            json={"model": "tts-1", "voice": "nova", "input": "配信を始めます。", "response_format": "wav"},
            timeout=300,
        ) as r:
            assert r.status_code == 200
            body = b"".join(r.iter_bytes())
        import soundfile as sf

        audio, rate = sf.read(io.BytesIO(body))
        assert len(audio) > 0 and rate > 0
        assert _ray_processes(ray_tmp)  # the check below sees this Ray instance's processes

    finally:
        # SIGTERM, as a service manager stops it (it ended 134 and left Ray running); Ray tears
        # down its controller, proxy and replicas: slow on a loaded 2-core machine
        code = server.stop(timeout=180, sig=signal.SIGTERM)
    assert code == 0, server.log.read_text()[-3000:]
    deadline = time.monotonic() + 30
    while _ray_processes(ray_tmp) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _ray_processes(ray_tmp), "Ray processes outlived the server"


def _ray_processes(ray_tmp: Path) -> list[str]:
    """The command lines of the processes of this test's Ray instance (they name its directory)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(ray_tmp) in text:
            found.append(text[:200])
    return found


def test_a_ray_that_cannot_start_is_one_line(tmp_path: Path) -> None:
    """A Ray node that fails to start (here: a session directory too long for its sockets)
    raises a plain Exception: `serve --ray` says so in one line and exits 1, no traceback."""
    long_tmp = Path(tempfile.mkdtemp(prefix="irodori-ray-" + "x" * 100))
    try:
        r = subprocess.run(
            [sys.executable, "-m", "irodori_speaker.cli", "serve", "--tiny-random", "--ray", "--no-prewarm"],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "RAY_TMPDIR": str(long_tmp), "RAY_USAGE_STATS_ENABLED": "0"},
        )
    finally:
        shutil.rmtree(long_tmp, ignore_errors=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "error: Ray Serve did not start: validate_socket_filename failed" in r.stderr


def test_serve_ray_gives_rays_proxy_time_to_start_on_a_busy_machine() -> None:
    """Ray Serve's proxy readiness check (5 s, three misses and it is restarted) failed `serve
    --ray` on a loaded 2-core CI runner; the app sets 30 s before Ray starts, a user's value wins."""
    name = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"
    code = f"import os, irodori_speaker.server.ray_app; print(os.environ[{name!r}])"
    for env, want in (({}, "30"), ({name: "7"}, "7")):
        environ = {k: v for k, v in os.environ.items() if k != name}
        run = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env={**environ, **env}, timeout=120
        )
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.strip() == want
