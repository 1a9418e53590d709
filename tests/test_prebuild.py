"""Prebuild: phrase files, skipping what is valid, per-line failures, interrupt and re-run."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from irodori_speaker.cache import PhraseCache
from irodori_speaker.cache.prebuild import Phrase, load_phrases, parse_text, parse_yaml, prebuild
from irodori_speaker.errors import InputError
from irodori_speaker.options import SynthesisOptions

FAST = SynthesisOptions(steps=2, seconds=0.4)
REPO = Path(__file__).resolve().parents[1]
PHRASES = ["こんにちは！", "いらっしゃい！", "ありがとう！", "またね！", "おやすみ！"]


class Spy:
    def __init__(self, inner, fail=()) -> None:
        self.inner = inner
        self.sample_rate = inner.sample_rate
        self.renders: list[str] = []
        self.fail = set(fail)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def synthesize(self, text, voice=None, options=None, cancel=None, **kw):
        self.renders.append(text)
        if text in self.fail:
            raise RuntimeError("the model fell over")
        return self.inner.synthesize(text, voice, options, cancel, **kw)


@pytest.fixture
def pc(tmp_path):
    c = PhraseCache(tmp_path / "phrases")
    yield c
    c.close()


# ---- phrase files -------------------------------------------------------------------------------


def test_text_files_one_phrase_a_line_with_comments(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text(
        "\ufeff# stock lines\nこんにちは！\n\n   # indented comment\n  今日は #雑談 配信  \n", "utf-8"
    )
    got = load_phrases(f)
    assert [p.text for p in got] == ["こんにちは！", "今日は #雑談 配信"]  # a later # is text
    assert [p.where for p in got] == ["p.txt:2", "p.txt:5"]
    assert parse_text("") == []


def test_yaml_phrases_with_defaults_and_their_own_settings(tmp_path):
    (tmp_path / "voices").mkdir()
    f = tmp_path / "p.yaml"
    f.write_text(
        "defaults:\n"
        "  steps: 4\n"
        "  voice: voices/aoi.wav\n"
        "phrases:\n"
        "  - こんにちは！\n"
        "  - text: ようこそ\n"
        "    seed: 3\n"
        "    steps: 6\n"
        "    seconds: 1.5\n"
        "    name: welcome\n"
        "  - text: 説明\n"
        "    caption: 落ち着いた声\n"
        "    voice: /abs/other.wav\n",
        "utf-8",
    )
    a, b, c = load_phrases(f)
    assert (a.text, a.options, a.voice) == ("こんにちは！", {"steps": 4}, str(tmp_path / "voices/aoi.wav"))
    assert b.options == {"steps": 6, "seed": 3, "seconds": 1.5} and b.name == "welcome"
    assert isinstance(b.options["seconds"], float) and "welcome" in b.where
    assert (c.voice, c.caption) == ("/abs/other.wav", "落ち着いた声")
    assert [p.text for p in parse_yaml("- 一\n- text: 二\n")] == ["一", "二"]


@pytest.mark.parametrize(
    "doc, match",
    [
        ("- text: 一\n  stpes: 4\n", "phrase 1: unknown phrase setting 'stpes'"),
        ("- text: 一\n  seed: many\n", "phrase 1: seed must be an integer in"),
        ("- 一\n- seed: 3\n", "phrase 2: text is missing"),
        ("- [1, 2]\n", "phrase 1: a phrase is a string or a mapping"),
        ("phrase:\n  - 一\n", "unknown top-level key"),
        ("- text: 一\n  tail_trim: 1\n", "tail_trim must be True or False"),
        ("[unclosed\n", "not valid YAML"),
    ],
)
def test_yaml_mistakes_are_clear_errors(doc, match):
    with pytest.raises(InputError, match=match):
        parse_yaml(doc, "p.yaml")


def test_missing_phrase_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_phrases(tmp_path / "nope.txt")


# ---- the run ------------------------------------------------------------------------------------


def test_prebuild_renders_each_phrase_once_and_skips_valid_entries(synth, pc):
    spy = Spy(synth)
    report = prebuild(spy, pc, [*PHRASES, PHRASES[0]], options=FAST)
    assert report.ok and report.rendered == 5 and report.cached == 1  # the repeat is a duplicate
    assert spy.renders == PHRASES
    for text in PHRASES:  # stored with the default cache seed 0, found by a plain lookup
        line = pc.lookup(synth, text, None, FAST)
        assert line is not None and line.record.seed == 0 and line.source == "prebuild"
    spy.renders.clear()
    again = prebuild(spy, pc, PHRASES, options=FAST)
    assert again.ok and again.rendered == 0 and again.cached == 5 and spy.renders == []
    # a damaged entry is not "valid": the next run renders it again
    key = pc.key(synth, PHRASES[2], None, FAST)
    path = pc.directory / pc._index.row(key)[1]
    path.write_bytes(path.read_bytes()[:100])
    third = prebuild(spy, pc, PHRASES, options=FAST)
    assert spy.renders == [PHRASES[2]] and third.rendered == 1


def test_phrase_settings_go_into_the_key(synth, pc):
    items = [Phrase("一", {"seed": 7}), Phrase("一", {"seed": 8}), Phrase("一", {"steps": 3})]
    report = prebuild(synth, pc, items, options=FAST)
    assert report.rendered == 3
    assert pc.lookup(synth, "一", None, dataclasses.replace(FAST, seed=7)).record.seed == 7
    assert pc.lookup(synth, "一", None, dataclasses.replace(FAST, steps=3)).record.steps == 3
    seeds = {pc.lookup(synth, "一", None, dataclasses.replace(FAST, seed=s)).audio.tobytes() for s in (7, 8)}
    assert len(seeds) == 2


def test_failures_are_reported_per_line_and_the_run_goes_on(synth, pc, tmp_path):
    spy = Spy(synth, fail={"いらっしゃい！"})
    items = [
        Phrase("こんにちは！", where="p:1"),
        Phrase("いらっしゃい！", where="p:2"),
        Phrase("声のない行", voice=str(tmp_path / "missing.wav"), where="p:3"),
        Phrase("またね！", where="p:4"),
    ]
    report = prebuild(spy, pc, items, options=FAST)
    assert not report.ok and report.rendered == 2
    failed = {r.phrase.where: r.error for r in report.failed}
    assert set(failed) == {"p:2", "p:3"}
    assert "RuntimeError: the model fell over" in failed["p:2"] and "missing.wav" in failed["p:3"]
    assert "2 rendered" in report.summary() and "2 failed" in report.summary()
    assert pc.lookup(synth, "いらっしゃい！", None, FAST) is None  # nothing half-stored


def test_interrupted_half_way_then_re_run_renders_only_the_rest(synth, pc):
    spy = Spy(synth)
    calls: list[tuple[int, int]] = []

    def ctrl_c_after_two(done, total, eta, result):
        calls.append((done, total))
        if done == 2:
            raise KeyboardInterrupt  # what Ctrl-C raises in the main thread

    report = prebuild(spy, pc, PHRASES, options=FAST, progress=ctrl_c_after_two)
    assert report.interrupted and report.rendered == 2 and report.remaining == 3
    assert "interrupted" in report.summary()
    assert calls == [(0, 5), (1, 5), (2, 5)]
    assert pc.stats().entries == 2 and pc.verify().clean  # what was stored is whole
    spy.renders.clear()
    rerun = prebuild(spy, pc, PHRASES, options=FAST)
    assert rerun.ok and rerun.rendered == 3 and rerun.cached == 2
    assert spy.renders == PHRASES[2:]


def test_progress_counts_only_what_needs_rendering_with_an_eta(synth, pc):
    prebuild(synth, pc, PHRASES[:2], options=FAST)
    seen = []
    prebuild(synth, pc, PHRASES, options=FAST, progress=lambda d, t, eta, r: seen.append((d, t, eta)))
    assert [(d, t) for d, t, _ in seen] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert seen[0][2] is None and all(e is not None and e >= 0 for _, _, e in seen[1:])
    assert seen[-1][2] == 0


# ---- the command, as a user runs it: two processes, Ctrl-C, re-run ------------------------------


def run_cli(args, home: Path, **kw):
    env = dict(os.environ, IRODORI_CACHE=str(home), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-m", "irodori_speaker.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT as in a terminal's foreground (a background job of a shell ignores it)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **kw,
    )


def test_cli_prebuild_ctrl_c_while_another_process_reads_then_re_run(synth, irodori_home, tmp_path):
    # lines long enough (2 s each) that the Ctrl-C lands half way even when this process reads
    # slowly on a loaded machine
    phrases = [f"{i}番目の定型文です。" for i in range(40)]
    f = tmp_path / "phrases.txt"
    f.write_text("# stock lines\n" + "\n".join(phrases) + "\n", "utf-8")
    d = tmp_path / "cache"
    args = ["prebuild", str(f), "--cache-dir", str(d), "--tiny-random", "--backend", "cpu"]
    args += ["--steps", "2", "--seconds", "2.0"]
    opts = dataclasses.replace(FAST, seed=0, seconds=2.0)
    proc = run_cli(args, irodori_home)
    seen: dict[str, bytes] = {}
    deadline = time.monotonic() + 120
    reader = None
    while time.monotonic() < deadline and proc.poll() is None:  # this process reads meanwhile
        if reader is None and (d / "index.sqlite3").exists():
            reader = PhraseCache(d)
        if reader is not None:
            # the Ctrl-C is timed by the cheap row count, so a reader slowed by a loaded machine
            # still interrupts half way; the lookups read whole lines while the writer writes
            if reader.stats().entries >= 3:
                proc.send_signal(signal.SIGINT)  # Ctrl-C half way
                break
            for text in phrases[: len(seen) + 2]:
                line = reader.lookup(synth, text, None, opts)
                if line is not None:
                    assert len(line.audio) == line.record.samples and np.isfinite(line.audio).all()
                    assert seen.setdefault(text, line.audio.tobytes()) == line.audio.tobytes()
        time.sleep(0.01)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in out and "Traceback" not in err
    stored = reader.stats().entries
    assert 3 <= stored < len(phrases)
    assert reader.verify().clean
    proc = run_cli(args, irodori_home)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"{len(phrases) - stored} rendered, {stored} already cached, 0 failed" in out
    for text in phrases:
        line = reader.lookup(synth, text, None, opts)
        assert line is not None
        if text in seen:  # what the reader saw before is what is there now
            assert line.audio.tobytes() == seen[text]
    reader.close()


def test_cli_prebuild_failing_phrase_exits_1_with_a_summary(irodori_home, tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("- こんにちは！\n- text: 声がない\n  voice: missing.wav\n", "utf-8")
    args = ["prebuild", str(f), "--cache-dir", str(tmp_path / "c"), "--tiny-random", "--backend", "cpu"]
    proc = run_cli([*args, "--steps", "2", "--seconds", "0.4"], irodori_home)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "failed: p.yaml: phrase 2: " in err and "missing.wav" in err and "Traceback" not in err
    assert "1 rendered, 0 already cached, 1 failed" in out


# ---- a cached file loads no model (issue 29) ----------------------------------------------------


def test_only_the_missing_phrases_load_the_model_and_render(synth, pc, caplog):
    from irodori_speaker.synthesis.identity import model_identity

    keys = model_identity(tiny_random=True, backend="cpu")  # headers and hashes, no weights
    loads: list[Spy] = []

    def load() -> Spy:
        loads.append(Spy(synth))
        return loads[-1]

    first = prebuild(keys, pc, PHRASES[:3], options=FAST, load=load)
    assert first.loaded and first.rendered == 3 and loads[0].renders == PHRASES[:3]
    part = prebuild(keys, pc, PHRASES, options=FAST, load=load)  # two new phrases
    assert part.loaded and len(loads) == 2 and loads[1].renders == PHRASES[3:]
    assert (part.rendered, part.cached) == (2, 3)
    for text in PHRASES:  # stored under the loaded model's key: a plain lookup finds each
        assert pc.lookup(synth, text, None, FAST) is not None
    whole = prebuild(keys, pc, [*PHRASES, PHRASES[0]], options=FAST, load=load)
    assert whole.ok and not whole.loaded and len(loads) == 2  # nothing missing: load() not called
    assert (whole.rendered, whole.cached) == (0, 6)
    assert "differs" not in caplog.text  # the keys without the model were the loaded model's
    # keys that did not match the model (here: another family's) cost a load, never a wrong line
    other = model_identity(tiny_random="v3" if synth.config.family != "v3" else "v2", backend="cpu")
    odd = prebuild(other, pc, PHRASES, options=FAST, load=load)
    assert odd.loaded and len(loads) == 3 and loads[2].renders == [] and odd.cached == 5
    assert caplog.text.count("the key without the model differs") == 5


def test_a_fully_cached_file_prebuilds_without_loading_the_model(synth, irodori_home, tmp_path):
    d = tmp_path / "cache"
    with PhraseCache(d) as filled:  # filled by this process's model, as a stream's earlier prebuild
        assert prebuild(synth, filled, PHRASES[:3], options=FAST).rendered == 3
    f = tmp_path / "phrases.txt"
    f.write_text("\n".join(PHRASES[:3]) + "\n", "utf-8")
    args = ["prebuild", str(f), "--cache-dir", str(d), "--tiny-random", "--backend", "cpu", "-v"]
    proc = run_cli([*args, "--steps", "2", "--seconds", "0.4"], irodori_home)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "0 rendered, 3 already cached, 0 failed" in out
    assert "all 3 phrases already cached; model not loaded" in out
    # -v shows where the time went: the identity from the files, no model load phase
    assert "model identity" in err and "wall:" in err
    assert "model load" not in err and "noise" not in err, err


def test_cli_prebuild_renders_only_the_missing_phrases_of_a_partly_cached_file(synth, irodori_home, tmp_path):
    d = tmp_path / "cache"
    with PhraseCache(d) as filled:
        assert prebuild(synth, filled, PHRASES[:3], options=FAST).rendered == 3
        before = {e.key: e.created for e in filled.entries()}
    f = tmp_path / "phrases.txt"
    f.write_text("\n".join(PHRASES) + "\n", "utf-8")
    args = ["prebuild", str(f), "--cache-dir", str(d), "--tiny-random", "--backend", "cpu", "-v"]
    proc = run_cli([*args, "--steps", "2", "--seconds", "0.4"], irodori_home)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "2 rendered, 3 already cached, 0 failed" in out and "model not loaded" not in out
    assert "model load" in err
    with PhraseCache(d) as after:
        entries = {e.key: e.created for e in after.entries()}
        assert len(entries) == 5 and all(entries[k] == t for k, t in before.items())  # untouched
        assert all(after.lookup(synth, text, None, FAST) is not None for text in PHRASES)
