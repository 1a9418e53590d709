"""benchmarks/decode_frames.py: the frames a line's stream windows decode (host arithmetic)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench_script import load
from irodori_speaker.engine.codec.streaming import RECEPTIVE_FIELD_FRAMES

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "decode_frames.py"


def _module():
    return load("decode_frames")


def test_windows_decode_every_frame_and_the_context_on_top():
    mod = _module()
    for frames in (5, 9, 37, 66, 118, 190, 252, 400):
        got, windows, _, _ = mod.decoded(frames, 50, 8, None)
        # at least every frame once; at most each window's frames plus both contexts and a stretch
        assert frames <= got <= frames + windows * (2 * RECEPTIVE_FIELD_FRAMES + 50)
        assert got == frames if frames <= 8 else got > frames


def test_the_plan_never_decodes_more_than_the_preset_windows_nor_fewer_than_the_line():
    mod = _module()
    lengths = (40, 66, 116, 216)
    for frames in range(1, 400, 7):
        plan, _, used, _ = mod.decoded(frames, 50, 8, None, plan=lengths)
        assert frames <= plan <= mod.decoded(frames, 50, 8, None)[0], frames
        assert used <= {16, *lengths} or frames < 16, (frames, used)  # the first window, then the plan's


def test_the_table_prints_a_row_per_config_and_the_plan():
    cmd = [sys.executable, str(SCRIPT), "--configs", "50:8:-,50:8:-:40,100:8:3"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith(("| chunks", "| window plan"))]
    assert len(rows) == 4, out
    assert "tail windows [40]" in rows[1] and "40" in rows[1].split("|")[2]
    assert rows[3].split("|")[2].strip() == "[16, 40, 66, 116, 216]", out
    ratios = [float(r.split("|")[4]) for r in rows]
    # the preset's tail windows and the plan decode fewer frames than the preset's windows
    assert all(x >= 1 for x in ratios) and ratios[1] < ratios[0] and ratios[3] <= ratios[1], out
    assert (ratios[0], ratios[3]) == (1.59, 1.30), out  # news5's lines
    # cropped, the last block carries about the lines' frames: fewer than the windows decode
    cropped = [float(r.split("|")[7]) for r in rows]
    assert all(1 <= c < x for c, x in zip(cropped, ratios, strict=True)), out


def test_a_cropped_window_carries_its_kept_frames_through_the_last_block():
    mod = _module()
    codec = mod.codec_from_state_dict(
        mod.random_codec_state_dict(mod.TINY_CODEC_KWARGS, seed=0, watermark=False), mod.TINY_CODEC_KWARGS
    )
    assert codec.use_channels_last(True)
    dec = codec._channels_last
    # a middle window keeps 50 of its 66 frames; a first one 8 of 16; a last one from C on
    assert 50 < mod.last_block_frames(dec, (24, 32, 82, 90)) < 50.2
    assert 8 <= mod.last_block_frames(dec, (0, 0, 8, 16)) < 8.2
    assert 108 <= mod.last_block_frames(dec, (74, 82, 190, 190)) < 108.2
