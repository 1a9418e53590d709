"""The command line's subcommands and the examples, run as a user runs them (subprocesses)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from irodori_speaker import cli
from irodori_speaker.cache import PhraseCache
from irodori_speaker.errors import AudioError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("irodori-home")


def run(args, home: Path, *, script: Path | None = None, timeout: float = 240):
    # OMP_NUM_THREADS=1: two OpenMP threads on a shared 2-core CPU wait on each other
    env = dict(os.environ, IRODORI_CACHE=str(home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(script)] if script else [sys.executable, "-m", "irodori_speaker.cli"]
    return subprocess.run(
        [*cmd, *map(str, args)], env=env, capture_output=True, text=True, timeout=timeout, cwd=home
    )


def one_line_error(r) -> str:
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and "Traceback" not in r.stderr
    return r.stderr


# ---- help and usage (in process: no model) ------------------------------------------------------


@pytest.mark.parametrize(
    "argv, wanted",
    [
        ([], ["say", "prebuild", "cache", "devices", "bench", "convert-codec", "exit status"]),
        (["say"], ["--play", "--output-device", "--cache", "--cache-dir", "--seed", ".opus", "standard"]),
        (["prebuild"], ["--cache-dir", "--max-bytes", "--audio-format", "--seed", "default: 0", "comments"]),
        (["cache"], ["stats", "list", "verify", "clear"]),
        (["cache", "stats"], ["--cache-dir", "--json"]),
        (["cache", "verify"], ["--no-repair", "sha256"]),
        (["devices"], ["--tone", "--hostapi", "names"]),
        (["bench"], ["--repeat", "--warmup", "--tiny-random", "time to first", "--codec-int4", "--int4"]),
    ],
)
def test_help_explains_each_command(argv, wanted, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([*argv, "--help"])
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for w in wanted:
        assert w in out, w


@pytest.mark.parametrize(
    "argv", [["cache"], ["prebuild"], ["bench", "--repeat"], ["devices", "--frobnicate"]]
)
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


# ---- cache stats / list / verify / clear ----------------------------------------------------------


def _fill(d: Path, n: int = 3) -> list[str]:
    keys = []
    with PhraseCache(d) as c:
        for i in range(n):
            key = hashlib.sha256(f"k{i}".encode()).hexdigest()
            c.put(key, np.full(4800 * (i + 1), 0.1, np.float32), text=f"行{i}", source="test")
            keys.append(key)
        c.get(keys[0])
        c.get("0" * 64)
    return keys


def test_cache_commands(home, tmp_path):
    d = tmp_path / "c"
    keys = _fill(d)
    r = run(["cache", "stats", "--cache-dir", d, "--json"], home)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert (s["entries"], s["bytes"], s["hits"], s["misses"]) == (3, 4 * 4800 * 6, 1, 1)
    assert s["audio_seconds"] == pytest.approx(0.6) and s["hit_rate"] == 0.5
    r = run(["cache", "stats", "--cache-dir", d], home)
    assert "3 (0.6 s of audio)" in r.stdout and "1 hits, 1 misses" in r.stdout
    r = run(["cache", "list", "--cache-dir", d, "--sort", "bytes"], home)
    assert [line.split()[-1] for line in r.stdout.splitlines()] == ["行2", "行1", "行0"]
    assert run(["cache", "verify", "--cache-dir", d], home).returncode == 0
    with PhraseCache(d) as c:  # damage one entry
        p = d / c._index.row(keys[1])[1]
    p.write_bytes(p.read_bytes()[:-4])
    r = run(["cache", "verify", "--cache-dir", d, "--no-repair"], home)
    assert r.returncode == 1 and "bad: " in r.stderr and "truncated" in r.stderr
    r = run(["cache", "verify", "--cache-dir", d], home)
    assert r.returncode == 1 and "dropped: " in r.stderr and "2 ok, 1 damaged" in r.stdout
    r = run(["cache", "verify", "--cache-dir", d], home)
    assert r.returncode == 0 and "2 ok, 0 damaged" in r.stdout
    r = run(["cache", "clear", "--cache-dir", d], home)  # not a terminal: it asks for --yes
    assert "add --yes" in one_line_error(r)
    r = run(["cache", "--cache-dir", d, "clear", "--yes"], home)  # --cache-dir before the action too
    assert r.returncode == 0 and "removed 2 entries" in r.stdout
    with PhraseCache(d) as c:
        assert c.stats().entries == 0
        assert [f for f in (d / "audio").rglob("*") if f.is_file()] == []


def test_cache_commands_on_a_missing_cache_say_so(home, tmp_path):
    for action in ("stats", "verify", "clear", "list"):
        r = run(["cache", action, "--cache-dir", tmp_path / "nothing-here"], home)
        assert "no phrase cache at" in one_line_error(r) and "hint: " in r.stderr
    assert not (tmp_path / "nothing-here").exists()  # looking did not create one


def test_default_cache_dir_follows_irodori_cache(home):
    _fill(home / "phrases", 1)
    r = run(["cache", "stats", "--json"], home)
    assert r.returncode == 0 and json.loads(r.stdout)["directory"] == str(home / "phrases")


# ---- devices --------------------------------------------------------------------------------------


def _virtual_device() -> dict | None:
    from irodori_speaker.outputs import find_output_device

    try:
        return find_output_device("irodori_virtual", hostapi="ALSA")
    except AudioError:
        return None


def test_devices_lists_outputs_by_name_or_explains_why_not(home):
    try:
        from irodori_speaker.outputs import list_output_devices

        devices = list_output_devices()
    except AudioError:
        devices = None
    r = run(["devices", "--json"], home)
    if devices is None:  # no PortAudio: one clear line
        assert "sound output is unavailable" in one_line_error(r)
        return
    assert r.returncode == 0
    listed = json.loads(r.stdout)
    assert [(d["name"], d["hostapi"]) for d in listed] == [(d["name"], d["hostapi"]) for d in devices]
    assert sum(d["default"] for d in listed) <= 1
    r = run(["devices"], home)
    for d in devices:
        assert repr(d["name"]) in r.stdout


def test_devices_tone_plays_on_a_named_device(home):
    if _virtual_device() is None:
        if os.environ.get("CI"):
            pytest.fail("CI runs .ci/virtual-audio.sh, which provides the irodori_virtual ALSA device")
        pytest.skip("no irodori_virtual ALSA device (.ci/virtual-audio.sh sets one up, as root)")
    r = run(["devices", "--tone", "irodori_virtual", "--seconds", "0.3"], home)
    assert r.returncode == 0, r.stderr
    assert "played a 0.3 s 440 Hz tone on irodori_virtual (ALSA)" in r.stdout
    r = run(["devices", "--tone", "no-such-device-anywhere"], home)
    assert "no output device matching" in one_line_error(r)


def test_tone_is_a_clean_sine():
    x = cli.tone(0.5, 440.0, 48_000, 0.2)
    assert len(x) == 24_000 and x.dtype == np.float32
    assert abs(x[0]) < 1e-3 and abs(x[-1]) < 1e-3 and np.max(np.abs(x)) == pytest.approx(0.2, abs=1e-3)
    spectrum = np.abs(np.fft.rfft(x))
    assert np.argmax(spectrum) * 48_000 / len(x) == pytest.approx(440.0, abs=2.0)


# ---- say with the cache, bench ---------------------------------------------------------------------


def test_say_through_the_cache_renders_once(home, tmp_path):
    d = tmp_path / "c"
    args = ["say", "こんにちは", "--tiny-random", "--backend", "cpu", "--steps", "2", "--seconds", "0.5"]
    r1 = run([*args, "-o", tmp_path / "1.wav", "--cache-dir", d], home)
    assert r1.returncode == 0, r1.stderr
    assert "RTF" in r1.stdout and "seed 0" in r1.stdout  # a cached line uses seed 0
    play = ["--play", "--output-device", "irodori_virtual"] if _virtual_device() else []
    r2 = run([*args, "-o", tmp_path / "2.wav", "--cache-dir", d, *play], home)
    assert r2.returncode == 0, r2.stderr
    assert "from the phrase cache" in r2.stdout
    a, b = sf.read(tmp_path / "1.wav")[0], sf.read(tmp_path / "2.wav")[0]
    assert len(a) == 24_000 and np.array_equal(a, b)


def test_builtin_news5_is_the_benchmark_set(news5_sentences):
    assert list(cli.NEWS5) == news5_sentences
    assert [len(s) for s in cli.NEWS5] == [10, 41, 56, 26, 29]


def test_bench_runs_offline_and_reports_each_sentence(home, tmp_path):
    out = tmp_path / "bench.json"
    r = run(
        ["bench", "--tiny-random", "--backend", "cpu", "--steps", "2", "--seconds", "0.5", "--json", out],
        home,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text("utf-8"))
    rows = doc["rows"]
    assert [row["text"] for row in rows] == list(cli.NEWS5)
    for row in rows:
        assert row["audio_s"] == pytest.approx(0.5, abs=0.02)
        assert row["rtf"] == pytest.approx(row["gen_s"] / row["audio_s"])
        assert 0 < row["ttfa_s"] <= row["gen_s"]
    t = doc["totals"]
    assert t["gen_s"] == pytest.approx(sum(row["gen_s"] for row in rows))
    assert t["rtf"] == pytest.approx(t["gen_s"] / t["audio_s"]) and t["chars"] == 162
    assert doc["steps"] == 2 and doc["device"].startswith("cpu") and doc["model"] == "tiny-random"
    table = [line for line in r.stdout.splitlines() if re.match(r"\s*(\d|all)\s+\d+\s", line)]
    assert len(table) == 6  # five sentences and the total
    assert "noise" in r.stderr


def test_the_int4_and_codec_placement_flags_reach_the_preset(home, tmp_path):
    """--int4 / --codec-int4 / --codec-device are the preset fields int4 / codec_int4 / codec_device."""
    out = tmp_path / "bench-int4.json"
    args = ["bench", "--tiny-random", "--backend", "cpu", "--steps", "2", "--seconds", "0.5", "--json", out]
    r = run([*args, "--int4", "--codec-int4", "--codec-device", "cpu"], home)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text("utf-8"))
    assert doc["int4"] is True and doc["codec_int4"] is True and doc["codec_device"] == "cpu"
    assert "RTN at load" in r.stderr  # the tiny float DiT was quantised at load, with the warning
    assert all(row["audio_s"] == pytest.approx(0.5, abs=0.02) for row in doc["rows"])
    bad = run(["say", "x", "-o", tmp_path / "x.wav", "--tiny-random", "--codec-device", "gpu0"], home)
    assert "codec_device 'gpu0'" in one_line_error(bad)


def test_quantize_writes_an_int4_checkpoint_the_loader_reads(tmp_path, dit_fixtures):
    from irodori_speaker.engine.quant.checkpoint import load_int4_model
    from irodori_speaker.engine.quant.layers import Int4Linear

    src = dit_fixtures / "tiny_v2_base.safetensors"
    dst = tmp_path / "tiny-int4.safetensors"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "irodori_speaker.cli",
            "quantize",
            str(src),
            "-o",
            str(dst),
            "--method",
            "rtn",
            "--no-report",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and "rtn" in r.stdout
    loaded = load_int4_model(dst)
    assert loaded.quantized and isinstance(loaded.model.blocks[0].attention.wq, Int4Linear)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "irodori_speaker.cli",
            "quantize",
            str(tmp_path / "none.safetensors"),
            "-o",
            str(dst),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and r.stderr.startswith("error: ")
