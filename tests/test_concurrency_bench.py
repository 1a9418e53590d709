"""benchmarks/concurrency.py: the GPU-busy and underrun arithmetic, the v4 lines' length, and a smoke
run of both modes' tables, the `--ceiling` table and the server stage on the tiny model (the CPU's
clock: checks the script, times nothing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench_script import load
from irodori_speaker.engine.duration import HOP

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "concurrency.py"


def _module():
    return load("concurrency")


def test_busy_time_is_the_union_of_intervals_and_gaps_lie_between_them() -> None:
    busy_and_gaps = _module().busy_and_gaps
    # overlapping (two streams), nested, touching and separate intervals, given out of order
    spans = [(20, 25), (0, 10), (5, 12), (21, 22), (12, 14), (30, 31)]
    assert busy_and_gaps(spans) == (14 + 5 + 1, [6, 5])
    assert busy_and_gaps([]) == (0, [])
    assert busy_and_gaps([(3, 9)]) == (6, [])


def test_each_streams_busy_time_and_the_time_two_ran_at_once() -> None:
    busy_by_stream = _module().busy_by_stream
    # stream 7 (the sampler's): 0-10 and 20-30; stream 9 (the decode's): 5-12, 8-9 nested, 40-41
    events = [(0, 10, 7), (5, 12, 9), (8, 9, 9), (20, 30, 7), (40, 41, 9)]
    each, both = busy_by_stream(events)
    assert each == {7: 20, 9: 8}
    assert both == 5  # 5-10: both streams ran; the union is 0-12, 20-30, 40-41 = 23
    assert busy_by_stream([(0, 4, 1), (2, 6, 1)]) == ({1: 6}, 0)  # one stream never overlaps itself
    assert busy_by_stream([]) == ({}, 0)


def test_idle_gaps_are_told_by_the_kernel_that_ended_them() -> None:
    gaps_by_next = _module().gaps_by_next
    # two streams overlap, one kernel nested (no gap among them); gaps of 6 before "dit", 5
    # before "win", 1 (not over 2) before "win" again, 9 before "dit"
    events = [
        (0, 10, "enc"),
        (1, 3, "enc"),
        (5, 12, "enc"),
        (18, 20, "dit"),
        (25, 30, "win"),
        (31, 32, "win"),
        (41, 50, "dit"),
    ]
    assert gaps_by_next(events[::-1], 2) == {"dit": [2, 6 + 9], "win": [1, 5]}
    assert gaps_by_next(events, 0) == {"dit": [2, 15], "win": [2, 6]}
    assert gaps_by_next([], 0) == {} and gaps_by_next([(3, 9, "x")], 0) == {}


def test_gpu_time_by_kernel_is_a_line_and_longest_first() -> None:
    by_kernel = _module().by_kernel
    events = [(0, 4_000_000, "gemm"), (4, 6_000_000, "conv"), (10, 3_000_010, "gemm"), (0, 1, "fill")]
    ranked = by_kernel(events, lines=2, top=2)
    assert [k["kernel"] for k in ranked] == ["gemm", "conv"]  # 7 ms against 6; "fill" left out
    assert ranked[0]["ms_a_line"] == 3.5 and ranked[0]["calls_a_line"] == 1.0
    assert ranked[1]["ms_a_line"] == (6_000_000 - 4) / 2e6 and ranked[1]["calls_a_line"] == 0.5
    assert by_kernel([], lines=0) == []
    share = _module().codec_share
    conv = [(0, 3, "sm90_xmma_fprop_implicit_gemm"), (3, 4, "_residual_unit_kernel"), (4, 10, "nvjet")]
    assert share(conv) == 0.4 and share([]) != share([])  # NaN with no kernels


def test_a_chunk_is_late_only_after_the_audio_before_it_has_played_out() -> None:
    late_chunks = _module().late_chunks
    second = 48_000  # samples of one second
    assert late_chunks([]) == 0
    assert late_chunks([(0.5, second), (1.4, second), (2.3, second)]) == 0  # each before the last ends
    # the second chunk comes 0.1 s after the first ran out: one underrun; playback then resumes from
    # it, so the third (due at 2.6 s, not 2.5) is in time
    assert late_chunks([(0.5, second), (1.6, second), (2.55, second)]) == 1
    assert late_chunks([(0.0, second // 2), (0.6, second // 2), (1.2, second // 2)]) == 2


def test_v4_lines_ask_for_v2s_seconds_estimate_as_news5_does() -> None:
    mod = _module()
    text = "今日の東京は朝から青空が広がり、日中の最高気温は二十五度近くまで上がる見込みです。"
    assert mod.line_options("v2", text, 7).seconds is None  # v2: the engine's own estimate
    v4 = mod.line_options("v4.1-mf", text, 7)
    assert v4.seconds == mod.news5.estimate_seconds(text) and v4.seed == 7
    mod.PREDICTOR[0] = True  # --predictor: v4 lines take the predictor's length (serve's path)
    try:
        assert mod.line_options("v4.1-mf", text, 7).seconds is None
    finally:
        mod.PREDICTOR[0] = False


def _smoke(args: list[str], timeout: int) -> subprocess.CompletedProcess[str]:
    """The script on the tiny-random files (`--smoke`), checked to exit cleanly."""
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, PYTHONPATH=str(REPO / "src")),
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return run


@pytest.mark.slow
def test_smoke_run_tables_per_mode_the_same_audio_the_ceiling_and_the_server(tmp_path: Path) -> None:
    out = tmp_path / "concurrency.json"
    cmd = ["--modes", "f,p", "--streams", "1,2", "--lines", "1", "--min-lines", "3", "--max-batch", "2"]
    cmd += ["--no-serial", "--ceiling", "--ceiling-frames", "20", "--server", "4", "--wait-profile", "2"]
    run = _smoke([*cmd, "--tail-windows", "40", "--json", str(out)], timeout=400)
    report = json.loads(out.read_text())
    assert list(report["modes"]) == ["f", "p"]  # one table each: v2 and v4.1-MF, the CPU presets
    assert run.stdout.count("| underruns (lines) | errors |") == 2
    assert run.stdout.count("stream windows [16, 41, 40]; window plan none") == 2  # --tail-windows
    v2, mf = report["modes"]["f"], report["modes"]["p"]
    assert (v2["family"], mf["family"]) == ("v2", "v4.1-mf")
    # the same latent frames per sentence in both modes (the v4 line asks for v2's estimate) ...
    assert v2["sentence_frames"] == mf["sentence_frames"] and min(v2["sentence_frames"]) > 0
    # ... so every row speaks the same audio (v4.1-MF's output trims a few ms of each line's end)
    for a, b in zip(v2["rows"], mf["rows"], strict=True):
        assert a["streams"] == b["streams"] and a["lines"] == b["lines"]
        assert b["audio_s"] == pytest.approx(a["audio_s"], rel=0.02)
    for mode in (v2, mf):
        rows = {r["streams"]: r for r in mode["rows"]}
        assert rows[1]["lines"] == 3  # one stream speaks --min-lines, not --lines
        assert rows[2]["lines"] == 4  # two streams: ceil(3 / 2) each
        for r in rows.values():
            assert r["errors"] == 0 and 0 <= r["underrun_lines"] <= r["underruns"]
            assert r["audio_s_per_s"] == pytest.approx(r["audio_s"] / r["wall_s"])
            assert r["x_one_stream"] == pytest.approx(r["audio_s_per_s"] / rows[1]["audio_s_per_s"])
            assert 0 < r["p50_s"] <= r["p95_s"]
    # --wait-profile: py-spy on the run's own threads (its table: where the streams wait)
    waits = {(w["streams"], w["kind"]): w["table"] for w in report["modes"]["f"]["wait_profile"]}
    assert set(waits) == {(2, "step"), (2, "line")}  # each --batching kind (the default two)
    for table in waits.values():
        assert "| stream |" in table and "| irodori-device |" in table
        assert "waits in DeviceOwner._submit <- " in table
    server = report["server"]
    assert server["exit"] == 0 and server["note"] is None  # pyopenjtalk here: both routes
    assert {k: (g["requests"], g["ok"], g["rejected"], g["lost"]) for k, g in server["groups"].items()} == {
        "voicevox": (2, 2, 0, 0),
        "openai": (2, 2, 0, 0),
        "all": (4, 4, 0, 0),
    }
    assert 0 < server["groups"]["all"]["total_p50_s"] <= server["groups"]["all"]["total_p95_s"]
    assert "--max-queue" not in server["serve_args"]  # serve's default queue
    ceiling = mf["ceiling"]
    assert [c["rows"] for c in v2["ceiling"]] == [c["rows"] for c in ceiling] == [1, 2]
    audio_s = 20 * HOP / 48_000
    for c in ceiling:
        total = c["text_ms"] + c["sampling_ms"] + c["windows_ms"]
        assert min(c["text_ms"], c["sampling_ms"], c["windows_ms"]) > 0
        assert c["ms_a_line"] == pytest.approx(total / c["rows"])
        assert c["audio_s_per_s"] == pytest.approx(c["rows"] * audio_s / (total / 1e3))
    one = ceiling[0]
    assert one["sampling_only_audio_s_per_s"] == pytest.approx(one["audio_s_per_s"])


@pytest.mark.slow
def test_window_plan_flag_is_the_presets_field_and_in_the_header() -> None:
    """`--window-plan`: the preset's stream_window_plan (prewarm's lengths: the first window and the
    plan's, no middle one), in the header; tails given beside it are not used."""
    cmd = ["--modes", "f", "--streams", "1", "--lines", "1", "--min-lines", "1", "--no-serial"]
    run = _smoke([*cmd, "--server", "0", "--tail-windows", "30", "--window-plan", "24,40"], timeout=300)
    assert "stream windows [16, 24, 40]; window plan [24, 40]" in run.stdout, run.stdout[:3000]


def test_owner_ops_counts_the_owner_threads_top_level_ops_a_line_and_no_other_threads() -> None:
    """`--host-ops`' table (owner_time.owner_ops): the torch ops the owner's thread ran in its
    rounds, each top-level op once (an op's own ops inside it are not counted again), a line;
    another thread's ops are not the owner's."""
    from types import SimpleNamespace

    import torch

    sys.path.insert(0, str(SCRIPT.parent))
    from owner_time import owner_ops, top_level

    from irodori_speaker.engine.hardware.owner import DEVICE
    from owner_threads import queue_then_release

    assert top_level([(0, 10, "a"), (2, 5, "b"), (10, 12, "c"), (11, 12, "d"), (3, 4, "e")]) == [
        (0, 10, "a"),
        (10, 12, "c"),
    ]

    def run() -> SimpleNamespace:
        for _ in range(8):
            torch.zeros(5)  # this thread's: not the owner's
        calls = [
            lambda o: o.run(lambda: torch.cat([torch.ones(2), torch.ones(2)])),
            lambda o: o.run(lambda: torch.arange(3).to(torch.float64)),
        ]
        return SimpleNamespace(lines=2, results=queue_then_release(DEVICE, calls))

    r, report = owner_ops(run)
    assert [float(t.sum()) for t in r.results] == [4.0, 3.0]
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in report.splitlines()}
    assert "aten::zeros" not in rows and "aten::empty" not in rows  # zeros' own op: inside it
    assert rows["aten::cat"][0] == "0.5" and rows["aten::to"][0] == "0.5"  # one call, two lines
    assert rows["aten::ones"][0] == "1.0" and "aten::_to_copy" not in rows
    assert "_round" not in DEVICE.__dict__  # put back


def test_owner_time_labels_and_times_the_owners_jobs_by_kind() -> None:
    """`--owner-profile`'s table (benchmarks/owner_time.py): every call the owner made (a batch of
    jobs is one), by its key's name or its function's; its shares add up to the rounds."""
    import time

    sys.path.insert(0, str(SCRIPT.parent))
    from owner_time import owner_time

    from irodori_speaker.engine.hardware.owner import DEVICE
    from owner_threads import queue_then_release

    def windows(items: list) -> list:
        time.sleep(0.02)
        return items

    def slow_alone() -> int:
        time.sleep(0.03)
        return 1

    calls = [lambda o, i=i: o.run_batched(("decode", 7, 50), i, windows) for i in range(3)]
    calls.append(lambda o: o.run(slow_alone))
    results, report = owner_time(queue_then_release, DEVICE, calls)
    assert results == [0, 1, 2, 1]
    rows = {
        line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:]
        for line in report.splitlines()
        if line.startswith("| ")
    }
    assert rows["decode"][0] == "1"  # three jobs of one key queued together: one call of `many`
    assert rows[slow_alone.__qualname__][0] == "1" and float(rows[slow_alone.__qualname__][1]) >= 30
    shares = [int(v[2].rstrip(" |")) for k, v in rows.items() if k not in ("what", "---")]
    assert 98 <= sum(shares) <= 102
    assert "_round" not in DEVICE.__dict__ and "_do" not in DEVICE.__dict__  # put back


def test_a_line_kind_spells_its_admission(irodori_home) -> None:
    """ "line~MS/N:B" with "e" (before the encoders) or "a" (after) sets each admission knob; what
    a kind leaves out is the preset's (so "a" can ask for the older rule where the preset holds
    lines before their encoders)."""
    import dataclasses

    from irodori_speaker.synthesis.loading import load_synthesizer

    conc = _module()
    synth = load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False, max_batch=4)
    synth.preset = dataclasses.replace(
        synth.preset, sample_admit_s=0.04, sample_admit_up_to=8, sample_admit_backlog=1,
        sample_admit_encoders=True,
    )  # fmt: skip
    conc.use_sampling(synth, "line~15/4:0a", 4, [None])
    b = synth._batcher
    assert (b.admit_s, b.admit_up_to, b.admit_backlog, b.admit_encoders) == (0.015, 4, 0, False)
    conc.use_sampling(synth, "line~20/2:3e", 4, [None])
    b = synth._batcher
    assert (b.admit_s, b.admit_up_to, b.admit_backlog, b.admit_encoders) == (0.02, 2, 3, True)
    conc.use_sampling(synth, "line", 4, [None])
    b = synth._batcher
    assert (b.admit_s, b.admit_up_to, b.admit_backlog, b.admit_encoders) == (0.04, 8, 1, True)
    # "+t" / "+w": the first window before / after the trim; neither: the preset's (off)
    seen = []
    for kind in ("line~15/4:0a+t", "line", "line+t", "line+w"):
        conc.use_sampling(synth, kind, 4, [None])
        seen.append(synth.preset.stream_first_before_trim)
    assert seen == [True, False, True, False] and synth._batcher.admit_s == 0.04
    conc.FIRST_BEFORE_TRIM[0] = True  # a preset with it on (main reads it from the preset)
    try:
        seen = []
        for kind in ("line", "line+w", "line+t"):
            conc.use_sampling(synth, kind, 4, [None])
            seen.append(synth.preset.stream_first_before_trim)
    finally:
        conc.FIRST_BEFORE_TRIM[0] = False
    assert seen == [True, False, True]
    # "+h" / "+d" / "+u": the decode on its own stream above / at the default priority, or not;
    # letters combine; neither: the preset's (this CPU one has none)
    from irodori_speaker.engine.hardware.owner import DECODE_PRIORITY, DEVICE

    seen = []
    try:
        for kind in ("line+h", "line+td", "line+u", "line"):
            conc.use_sampling(synth, kind, 4, [None])
            seen.append((DEVICE.decode_stream, DEVICE.decode_priority, synth.preset.stream_first_before_trim))
    finally:
        DEVICE.decode_stream, DEVICE.decode_priority = False, DECODE_PRIORITY
    off = (False, DECODE_PRIORITY, False)
    assert seen == [(True, DECODE_PRIORITY, False), (True, 0, True), off, off]
    with pytest.raises(SystemExit, match="unknown letters"):
        conc.use_sampling(synth, "line+q", 4, [None])


def test_x_runs_the_text_backbone_eagerly_and_captures_its_graphs_again(monkeypatch) -> None:
    """ "+x": the fused text backbone off for the run, on again after it; its text graphs,
    captured with the other forward, dropped and captured again (a stand-in Synthesizer: the
    fused backbone is only built where its kernels run)."""
    from types import SimpleNamespace

    conc = _module()
    captured = []
    monkeypatch.setattr(
        conc, "text_graphs", lambda synth, bucket, longest: captured.append((bucket, longest))
    )
    backbone = SimpleNamespace(on=True)
    fast = SimpleNamespace(fast=SimpleNamespace(text_backbone=backbone), _text_graphs={(1, 32): "g"},
                           use_graphs=True, context_bucket=32)  # fmt: skip
    synth = SimpleNamespace(fast_sampler=fast)
    seen = []
    for fused in (True, False, False, True):
        fast._text_graphs[(1, 32)] = "g"
        conc.use_text_backbone(synth, fused)
        seen.append((backbone.on, bool(fast._text_graphs)))
    assert seen == [(True, True), (False, False), (False, True), (True, False)]
    assert captured == [(32, 2 * conc.TEXT_RUNG_LEAST * 32)] * 2  # at each switch only
    conc.use_text_backbone(SimpleNamespace(fast_sampler=None), False)  # no fast path: nothing to do


def test_c_decodes_windows_whole_and_captures_the_codecs_graphs_again(irodori_home, monkeypatch) -> None:
    """ "line+c": stream windows decoded whole (the codec's crop_windows off) for the run, cropped
    again after it; its graphs dropped and captured again at each switch only."""
    from types import SimpleNamespace

    from irodori_speaker.synthesis.loading import load_synthesizer

    conc = _module()
    captured = []
    monkeypatch.setattr(conc, "codec_graphs", lambda synth: captured.append(synth.codec.crop_windows))
    synth = load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False, max_batch=4)
    cleared = []
    synth.codec._graphs = SimpleNamespace(clear=lambda: cleared.append(1))  # held graphs, stood in for
    seen = []
    for kind in ("line", "line+c", "line+c", "line"):
        conc.use_sampling(synth, kind, 4, [None])
        seen.append(synth.codec.crop_windows)
    assert seen == [True, False, False, True] and captured == [False, True] and len(cleared) == 2
    synth.codec._graphs = None
    with pytest.raises(SystemExit, match="unknown letters"):
        conc.use_sampling(synth, "line+q", 4, [None])


def test_3_and_1_pack_the_codecs_units_again_and_capture_its_graphs_again(irodori_home, monkeypatch) -> None:
    """ "line+3": the codec's units fused in thirds, up to 192 channels, for the run; "line+1":
    the 96-channel ones in one chunk; neither: as the tree ships them. The fused decoder's weights
    packed again and the codec's graphs captured again at each switch only (the tiny codec's
    48-channel stage packs as 3 x 16 in thirds, 64 in one chunk; graphs stood in for)."""
    from types import SimpleNamespace

    from irodori_speaker.engine.codec import fast, kernels
    from irodori_speaker.synthesis.loading import load_synthesizer

    conc = _module()
    captured = []
    monkeypatch.setattr(conc, "codec_graphs", lambda synth: captured.append(kernels.UNIT_THIRDS))
    synth = load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False, max_batch=4)
    assert synth.codec.use_channels_last(True)
    decoder = synth.codec._channels_last
    decoder.fuse_units = True  # as on Hopper (packing only: nothing decodes here)
    cleared = []
    synth.codec._graphs = SimpleNamespace(clear=lambda: cleared.append(1))  # held graphs, stood in for
    shipped = kernels.UNIT_THIRDS
    seen = []
    try:
        for kind in ("line", "line+3", "line#2+3", "line+1", "line"):
            conc.use_sampling(synth, kind, 4, [None])
            widths = sorted({w1.shape[0] for _, w1 in decoder._packs.values()})
            seen.append((kernels.UNIT_THIRDS, fast.FUSED_UNIT_WIDTH[kernels.UNIT_THIRDS], widths))
    finally:
        kernels.UNIT_THIRDS = shipped
        synth.codec._graphs = None
    asked = [shipped, True, True, False, shipped]
    assert seen == [(t, 192 if t else 96, [16, 32, 48] if t else [16, 32, 64]) for t in asked]
    switches = [b for a, b in zip([shipped, *asked], asked, strict=False) if a != b]
    assert captured == switches and len(cleared) == len(switches) >= 2


def test_a_kind_with_rows_decodes_that_many_windows_as_one_batch(irodori_home, monkeypatch) -> None:
    """ "line#8": up to 8 stream windows decoded together for the run (the preset's decode_batch),
    the codec's graphs made room for and captured for every window bucket up to 8; a kind without
    "#N" takes --decode-batch's, "serial" decodes one window at a time."""
    import dataclasses
    from types import SimpleNamespace

    from irodori_speaker.synthesis.loading import load_synthesizer

    conc = _module()
    captured = []
    monkeypatch.setattr(conc, "codec_graphs", lambda synth: captured.append(synth._decode_rows()))
    monkeypatch.setattr(conc, "DECODE_BATCH", [4])  # --decode-batch 4
    synth = load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False, max_batch=16)
    synth.preset = dataclasses.replace(synth.preset, codec_graphs=True)
    synth.codec._graphs = SimpleNamespace(clear=lambda: None, max_graphs=8)  # held graphs, stood in for
    keys = len(synth._window_keys())
    seen = []
    for kind in ("line#8", "line", "serial#8", "line#16+c"):
        conc.use_sampling(synth, kind, 16, [None])
        seen.append((synth.preset.decode_batch, synth.codec._graphs.max_graphs))
    assert seen == [(8, 4 * keys), (4, 4 * keys), (1, 4 * keys), (16, 5 * keys)]
    assert captured[:3] == [[2, 4, 8], [2, 4], []] and captured[3] == [2, 4, 8, 16]
    synth.codec._graphs = None


def test_a_kind_with_a_depth_runs_under_that_owner_queue_depth(irodori_home) -> None:
    """ "line@3": line batches with the device owner's queue depth 3; a kind without one: none."""
    from irodori_speaker.engine.hardware.owner import DEVICE
    from irodori_speaker.synthesis.batching import SampleBatcher
    from irodori_speaker.synthesis.loading import load_synthesizer
    from irodori_speaker.synthesis.stepping import StepScheduler

    conc = _module()
    synth = load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False, max_batch=4)
    try:
        conc.use_sampling(synth, "line@3", 4, [None])
        assert DEVICE.queue_depth == 3
        assert isinstance(synth._batcher, SampleBatcher) and synth._batcher.max_batch == 4
        conc.use_sampling(synth, "step", 4, [None])
        assert DEVICE.queue_depth == 0 and isinstance(synth._batcher, StepScheduler)
    finally:
        DEVICE.queue_depth = 0


def test_a_stalled_run_writes_every_threads_stack_and_a_finished_one_nothing(tmp_path: Path) -> None:
    """`--stall-dump`: a row whose streams are not done in time names itself and dumps the stacks
    (what the GPU run of mode (e) at 16 streams needs: it printed nothing in 370 s)."""
    import threading

    join_or_dump = _module().join_or_dump
    release = threading.Event()

    def waits_for_the_owner() -> None:
        release.wait(30)

    stuck = threading.Thread(target=waits_for_the_owner, name="stream-0", daemon=True)
    done = threading.Thread(target=lambda: None, name="stream-1")
    stuck.start()
    done.start()
    log = tmp_path / "dump.txt"
    with log.open("w") as f:
        assert join_or_dump([done, stuck], 0.2, f, "16 streams (line)") is False
    text = log.read_text()
    assert "# STALLED: 16 streams (line) not done after 0.2 s (1 of 2 threads still running)" in text
    assert "waits_for_the_owner" in text  # the stuck thread's frame
    release.set()
    stuck.join()
    with log.open("w") as f:
        assert join_or_dump([stuck, done], 0.2, f, "x") is True
        assert join_or_dump([stuck, done], None, f, "x") is True
    assert log.read_text() == ""
