"""Helpers of the server tests: a real `irodori-speaker serve` (tiny-random, CPU) on a loopback port."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")


def free_port() -> int:
    """A free port below the kernel's ephemeral range (32768-60999 on Linux). A port the kernel
    handed us (bind to 0) is one it may hand the next asker too before our server binds it:
    Ray's agents take theirs that way, and Ray's dashboard agent always takes 52365 (a CI run
    failed on exactly that port). Ray's own fixed ports (6379, 8265, 10001-19999) stay below."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, 32768)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32767")


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    home: Path
    log: Path

    def metric(self, name: str) -> float:
        """The sum of a metric's samples (all label values)."""
        from prometheus_client.parser import text_string_to_metric_families

        text = httpx.get(self.url + "/metrics", headers=self.headers).text
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    total += sample.value
        return total

    headers: dict | None = None

    def stop(self, timeout: float = 60, sig: int = signal.SIGINT) -> int:
        """Ctrl-C (or `sig`: SIGTERM as a service manager stops it), then its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _dump_stacks(self.proc.pid, self.log)
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _dump_stacks(pid: int, log: Path) -> None:
    """A server that did not stop: its threads' Python stacks into its log (py-spy, if installed)."""
    import shutil

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if Path(spy).exists():
        r = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
        with open(log, "a") as f:
            f.write("\n--- py-spy dump of the server that did not stop ---\n" + r.stdout + r.stderr)


def voices_config(home: Path) -> Path:
    """Two speakers: the model's own voice (id 0) and a reference wav (id 7, alias 'nova')."""
    import soundfile as sf

    t = np.arange(48_000 * 2) / 48_000
    wave = (0.3 * np.sin(2 * np.pi * 180 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    sf.write(home / "ref.wav", wave, 48_000)
    cfg = home / "voices.toml"
    cfg.write_text(
        """
[[speakers]]
name = "いろどり"
  [[speakers.styles]]
  name = "ノーマル"
  id = 0
[[speakers]]
name = "テスト"
policy = "test voice"
  [[speakers.styles]]
  name = "リファレンス"
  id = 7
  wav = "ref.wav"
  aliases = ["nova"]
""",
        encoding="utf-8",
    )
    return cfg


def start_server(
    home: Path, *extra: str, env: dict | None = None, wait_s: float = 120.0, cmd: list[str] | None = None
) -> Server:
    """Start a server and wait for `/version`. `cmd`: another server command (given `--port P`
    after it) instead of `irodori-speaker serve --tiny-random` with the test voices."""
    home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = home / f"server-{port}.log"
    environ = {
        **os.environ,
        "IRODORI_CACHE": str(home / "cache"),
        "IRODORI_DICT": str(home / "user_dict.sqlite3"),
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }
    if cmd is None:
        cmd = [sys.executable, "-m", "irodori_speaker.cli", "serve", "--tiny-random", "--backend", "cpu"]
        cmd += ["--voices", str(voices_config(home))]
    cmd = [*cmd, "--port", str(port), *extra]
    with open(log, "wb") as out:
        # SIGINT as in a terminal's foreground: a shell's background job (CI started with `&`)
        # ignores it, and a child inherits that, so Ctrl-C would never reach the server
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=environ,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/version", timeout=1.0).status_code == 200:
                return Server(url, proc, home, log)
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"server did not start in {wait_s} s:\n{log.read_text()[-3000:]}")


def wav_info(data: bytes):
    import io

    import soundfile as sf

    audio, rate = sf.read(io.BytesIO(data), always_2d=True)
    return audio, rate
