"""schemathesis (its CLI, as a user runs it) against the server's own OpenAPI document:
no 5xx, statuses, content types and bodies as the schema says. Bounded: few examples per
operation, one worker, a time budget."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from server_helpers import start_server

pytest.importorskip("schemathesis")


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("fuzz"), "--no-cache", "--max-text-chars", "40")
    yield srv
    assert srv.stop() == 130


def test_schemathesis_finds_nothing(fuzz_server):
    exe = shutil.which("schemathesis", path=os.path.dirname(sys.executable)) or shutil.which("schemathesis")
    if exe is None:
        pytest.skip("the schemathesis CLI is not on PATH")
    # the checks that say "no 5xx, no schema violation". Not run: positive_data_acceptance
    # (a schema-valid reading such as "abc" is still not katakana: a 422 with the reason is
    # right) and negative_data_rejection (unknown query parameters are ignored, as by VOICEVOX)
    checks = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"
    cmd = [
        exe,
        "run",
        fuzz_server.url + "/openapi.json",
        "--checks",
        checks,
        "--max-examples",
        "5",
        "--workers",
        "1",
        "--request-timeout",
        "60",
        "--max-time",
        "60",
        "--generation-deterministic",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
