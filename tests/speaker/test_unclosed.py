"""Issue 12: a Speaker that is never closed warns like an unclosed file (ResourceWarning naming
where it was created) and does not keep the process alive: its worker used to finish the line in
synthesis (~10 s) after `asyncio.run` returned, with the PortAudio stream never closed.

Each case runs a user's script in a subprocess; the subprocess timeout is the bound on exit
(the line it leaves behind would synthesise for 60 s)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import irodori_speaker

HERE = Path(__file__).resolve().parent
SRC = Path(irodori_speaker.__file__).resolve().parents[1]  # the package under test
EXIT_BOUND_S = 20  # far below the 60 s line, far above a loaded CI machine's start-up

PRELUDE = """
import asyncio, sys, warnings
warnings.simplefilter("always", ResourceWarning)
sys.path.insert(0, {here!r})
from speaker_fakes import FakeSynth
from irodori_speaker.outputs import NullOutput
from irodori_speaker.speaker import Speaker

fake = FakeSynth(steps=12000, step_s=0.005)  # a line that would synthesise for 60 s

async def synthesising(s):
    await s.open()
    s.enqueue("閉じ忘れた台詞")
    while not any(c.steps_done for c in fake.calls):  # sampling, the model lock held
        await asyncio.sleep(0.01)
"""

CASES = {
    # asyncio.run returns while a line is in synthesis: the loop cancels the scheduler
    "asyncio.run": """
async def main():
    s = Speaker(fake, output=NullOutput(speed=1.0))  # MARK
    await synthesising(s)

asyncio.run(main())
print("returned", flush=True)
""",
    # the loop is never closed nor its tasks cancelled: abandoned when the interpreter exits
    "loop-left-open": """
loop = asyncio.new_event_loop()
s = Speaker(fake, output=NullOutput(speed=1.0))  # MARK
loop.run_until_complete(synthesising(s))
print("returned", flush=True)
""",
    # idle, then dropped: abandoned when the loop goes, collected later
    "idle-then-dropped": """
async def main():
    s = Speaker(fake, output=NullOutput(speed=1.0))  # MARK
    await s.open()

asyncio.run(main())
import gc; gc.collect()
print("returned", flush=True)
""",
}


def run_script(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    script = tmp_path / "bot.py"
    script.write_text(textwrap.dedent(PRELUDE.format(here=str(HERE))) + textwrap.dedent(body), "utf-8")
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=EXIT_BOUND_S, env=env
    )


def mark_line(tmp_path: Path) -> int:
    lines = (tmp_path / "bot.py").read_text("utf-8").splitlines()
    return next(i + 1 for i, line in enumerate(lines) if "# MARK" in line)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unclosed_speaker_warns_where_it_was_made_and_the_process_exits(tmp_path, case):
    p = run_script(tmp_path, CASES[case])  # a hang is subprocess.TimeoutExpired
    assert p.returncode == 0, p.stderr
    assert "returned" in p.stdout
    assert "ResourceWarning: unclosed Speaker created at" in p.stderr, p.stderr
    assert f"bot.py:{mark_line(tmp_path)}" in p.stderr
    assert p.stderr.count("unclosed Speaker") == 1, p.stderr
    assert "Traceback" not in p.stderr, p.stderr


@pytest.mark.timeout(60)
def test_a_closed_speaker_does_not_warn(tmp_path):
    p = run_script(
        tmp_path,
        """
async def main():
    async with Speaker(fake, output=NullOutput(speed=1.0), drain_on_exit=False) as s:
        s.enqueue("閉じる台詞")
        while not fake.calls:
            await asyncio.sleep(0.01)

asyncio.run(main())
print("returned", flush=True)
""",
    )
    assert p.returncode == 0 and "returned" in p.stdout, p.stderr
    assert "ResourceWarning" not in p.stderr, p.stderr


@pytest.mark.timeout(60)
def test_an_unclosed_speaker_closes_its_portaudio_stream(tmp_path):
    try:
        from irodori_speaker.outputs import find_output_device

        find_output_device("irodori_virtual", hostapi="ALSA")
    except Exception as e:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs .ci/virtual-audio.sh, which provides irodori_virtual ({e})")
        pytest.skip(f"no irodori_virtual ALSA device ({e}); .ci/virtual-audio.sh sets one up")
    p = run_script(
        tmp_path,
        """
from irodori_speaker.outputs import SoundDeviceOutput
out = SoundDeviceOutput("irodori_virtual", hostapi="ALSA")

async def main():
    s = Speaker(fake, output=out)  # MARK
    await synthesising(s)
    assert out._stream is not None and out._stream.active

asyncio.run(main())
print("stream closed:", out._stream is None, flush=True)
""",
    )
    assert p.returncode == 0, p.stderr
    assert "stream closed: True" in p.stdout and "unclosed Speaker" in p.stderr, (p.stdout, p.stderr)
