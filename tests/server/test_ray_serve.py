"""`irodori-speaker serve --ray --replicas 2` on a real local Ray instance (CPU, tiny model).

Ray's own proxy spreads the requests; each replica loads the model and runs the whole app.
The test reads Ray's per-replica access logs (logs/serve/replica_*.log under the session
directory, set by RAY_TMPDIR) to see that both replicas served lines.
"""

from __future__ import annotations

import concurrent.futures as cf
import io
import shutil
import tempfile
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

    finally:
        # Ray tears down its controller, proxy and replicas: slow on a loaded 2-core machine
        code = server.stop(timeout=180)
    assert code == 130, server.log.read_text()[-3000:]  # Ctrl-C: 130, as serve's help says
