"""`serve --max-gpu-memory`: the budget on /metrics and in the startup log (issue 27).

A real uvicorn server (tiny model) on a loopback port. On the CPU the budget is accepted, logged
as not applicable, and the gauge reads 0 (no cap is set); with CUDA the gauge is the budget in
bytes and the allocator's peak is exported beside it, within the budget after a line."""

from __future__ import annotations

import sys

import pytest
import torch
from server_helpers import httpx, start_server

GIB = 2**30
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("budget")
    backend = "cuda" if CUDA else "cpu"
    cmd = [sys.executable, "-m", "irodori_speaker.cli", "serve", "--tiny-random", "--backend", backend]
    srv = start_server(home, "--max-gpu-memory", "2GiB", "--no-cache", cmd=cmd)
    yield srv
    assert srv.stop() == 130, srv.log.read_text()[-2000:]


def test_the_budget_gauge_and_the_startup_log(server):
    r = httpx.post(
        server.url + "/v1/audio/speech", json={"model": "tts-1", "input": "こんにちは。", "voice": "alloy"}
    )
    assert r.status_code == 200, r.text
    text = httpx.get(server.url + "/metrics").text
    assert "irodori_gpu_memory_budget_bytes" in text
    log = server.log.read_text()
    if CUDA:
        assert server.metric("irodori_gpu_memory_budget_bytes") == 2 * GIB
        peak = server.metric("irodori_gpu_memory_peak_bytes")
        assert 0 < peak <= 2 * GIB
        assert "GPU memory budget 2 GiB of" in log and "max batch" in log
    else:
        assert server.metric("irodori_gpu_memory_budget_bytes") == 0  # not applicable: no cap set
        assert "irodori_gpu_memory_peak_bytes" not in text  # CUDA only
        assert "GPU memory budget 2 GiB" in log and "not applicable on cpu" in log
