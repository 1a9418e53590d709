"""The progress bar, in a real terminal (tmux), and its absence where there is none.

`say` on a long text (several pieces) in an 80-column tmux pane, the screen captured a few
times a second: one bar line that never wraps, whose percentage only grows (no restart per
piece), whose estimate of the whole job is the right size, and that is gone at the end.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

# the five news sentences twice: ~20 pieces' worth of text for the splitter (a few pieces)
LONG = (
    "今日の東京は朝から青空が広がり、日中の最高気温は二十五度近くまで上がる見込みです。"
    "政府は新しい経済対策を発表し、子育て世帯への給付金や電気料金の補助を来月から全国で順次始めると明らかにしました。"
    "大型の台風が週末にかけて沖縄地方に接近する予報です。"
    "プロ野球では地元チームが九回裏に逆転サヨナラ勝ちしました。"
) * 2
WIDTH = 80
BAR = re.compile(r"synthesising\s+(\d+)%\|.*\| \[(\d+):(\d+)<(?:\?|(\d+):(\d+))\]")  # ? = no estimate yet


def _tmux() -> str:
    tmux = shutil.which("tmux")
    if tmux is None:
        if os.environ.get("CI"):
            pytest.fail("CI installs tmux (.ci/run) for the terminal tests")
        pytest.skip("tmux is not installed (the terminal test drives a real pseudo-terminal with it)")
    return tmux


def test_one_bar_across_a_long_text_in_a_real_terminal(irodori_home, tmp_path):
    tmux = _tmux()
    session = f"irodori-progress-{os.getpid()}"
    out, done = tmp_path / "long.wav", tmp_path / "done"
    cmd = " ".join(
        [
            f"IRODORI_CACHE={shlex.quote(str(irodori_home))} OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1",
            shlex.quote(sys.executable), "-m", "irodori_speaker.cli", "say", shlex.quote(LONG),
            "--tiny-random", "--backend", "cpu", "--steps", "60", "-o", shlex.quote(str(out)),
            f"; touch {shlex.quote(str(done))}; sleep 60",
        ]
    )  # fmt: skip
    subprocess.run([tmux, "new-session", "-d", "-s", session, "-x", str(WIDTH), "-y", "30", cmd], check=True)
    screens: list[list[str]] = []
    try:
        deadline = time.monotonic() + 200
        while not done.exists() and time.monotonic() < deadline:
            pane = subprocess.run([tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True)
            screens.append([line for line in pane.stdout.splitlines() if line.strip()])
            time.sleep(0.25)
        final = subprocess.run([tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True)
    finally:
        subprocess.run([tmux, "kill-session", "-t", session], capture_output=True)
    assert done.exists(), "say did not finish"
    final_lines = [line for line in final.stdout.splitlines() if line.strip()]
    result = next(line for line in final_lines if "s of audio in" in line)
    job_s = float(re.search(r"in ([\d.]+) s", result).group(1))

    seen = []  # (percent, elapsed s, remaining s) per screen that shows the bar
    for lines in screens:
        bars = [line for line in lines if "synthesising" in line]
        assert len(bars) <= 1, lines  # one line, updated in place: no new line per update
        if not bars:
            continue
        assert len(bars[0]) <= WIDTH
        m = BAR.search(bars[0])
        assert m, bars[0]  # the whole bar on its line: it did not wrap onto the next
        pct, em, es = map(int, m.groups()[:3])
        if m.group(4) is not None:
            seen.append((pct, 60 * em + es, 60 * int(m.group(4)) + int(m.group(5))))
    assert len({p for p, _, _ in seen}) >= 3, seen  # it moved while we watched
    percents = [p for p, _, _ in seen]
    assert percents == sorted(percents), percents  # never restarts (per piece, it used to)
    # the estimate is of the whole job: elapsed + remaining, once a third is done, is its size
    # (the old bar said "eta 140 s" 20 s into a 24 s job); loose bounds: a shared 2-core machine
    for pct, elapsed, remaining in seen:
        if pct >= 33 and elapsed >= 2:
            assert 0.3 * job_s <= elapsed + remaining <= 3 * job_s + 2, (seen, job_s)
    assert not any("synthesising" in line for line in final_lines)  # the bar is gone at the end


def test_no_bar_when_stderr_is_not_a_terminal(irodori_home, tmp_path):
    env = dict(os.environ, IRODORI_CACHE=str(irodori_home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    args = ["say", LONG[:80], "--tiny-random", "--backend", "cpu", "--steps", "4", "-o", tmp_path / "a.wav"]
    r = subprocess.run(
        [sys.executable, "-m", "irodori_speaker.cli", *map(str, args)],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "synthesising" not in r.stderr and "\r" not in r.stderr
    assert Path(tmp_path / "a.wav").is_file()


def test_a_long_line_reports_one_progress_from_zero_to_its_end(synth):
    from irodori_speaker.options import SynthesisOptions

    calls: list[tuple[int, int]] = []
    result = synth.synthesize(
        LONG, None, SynthesisOptions(steps=3, seed=0), progress=lambda d, t: calls.append((d, t))
    )
    assert result.record.pieces > 1
    totals = {t for _, t in calls}
    assert len(totals) == 1  # one total for the whole line, not one per piece
    done = [d for d, _ in calls]
    assert done == sorted(done) and done[-1] == totals.pop()  # grows only, and ends at the total
    assert len(calls) == result.record.pieces * (3 + 1)  # every step, and each piece's decode
