"""Issue 12, rotted phrase-cache rows: a damaged byte or a column of the wrong type in an index
row (a real sqlite file, damaged with sqlite3 UPDATE or a byte flip in the file) is a miss that is
rendered again and logged once, never a traceback from lookup / render / wrap / prebuild /
`say --cache`; `cache verify` reports such rows and drops them. Cache directories that cannot be
used (a file, read-only) are one clear CacheError. Where a Speaker reads the cache, the same
Speaker then plays through the damage and speaks a normal line (tests/hostile.py)."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from hostile import real_audio, run, speaks_normally
from irodori_speaker.cache import PhraseCache
from irodori_speaker.errors import CacheError
from irodori_speaker.options import SynthesisOptions

pytestmark = pytest.mark.timeout(120)

FAST = SynthesisOptions(steps=2, seconds=0.4, seed=5)
TEXT = "腐った行"

#: (name, SQL assignment) of one damaged column; each is a row sqlite stores without complaint.
ROT = [
    ("record-first-byte", "record = '#' || substr(record, 2)"),
    ("record-last-byte-cut", "record = substr(record, 1, length(record) - 1)"),
    ("record-not-object", "record = '[1, 2]'"),
    ("record-seed-string", 'record = \'{"seed": "abc"}\''),
    ("record-timings-string", 'record = \'{"timings": {"sample": "x"}}\''),
    ("record-warnings-int", "record = '{\"warnings\": 3}'"),
    ("record-blob", "record = X'FFFE00'"),
    ("identity-cut", "identity = substr(identity, 1, length(identity) - 1)"),
    ("identity-null", "identity = 'null'"),
    ("samples-text", "samples = 'abc'"),
    ("samples-float", "samples = 1.5"),
    ("sample-rate-zero", "sample_rate = 0"),
    ("bytes-negative", "bytes = -1"),
    ("bytes-text", "bytes = 'many'"),
    ("format-unknown", "format = 'mp3'"),
    ("sha-short", "sha256 = 'abc'"),
    ("file-int", "file = 12345"),
    ("file-escapes", "file = '../outside.f32'"),
    ("levels-odd-length", "levels = X'000000'"),
    ("levels-text", "levels = 'loud'"),
    ("levels-hz-negative", "levels_hz = -50.0"),
    ("created-text", "created = 'yesterday'"),
    ("text-blob", "text = X'FF'"),
    ("source-blob", "source = X'07'"),
]


class Spy:
    """The real tiny synthesizer, counting the calls that do model work."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls = 0
        self.sample_rate = inner.sample_rate

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def synthesize(self, *a, **kw):
        self.calls += 1
        return self.inner.synthesize(*a, **kw)

    def stream(self, *a, **kw):
        self.calls += 1
        return self.inner.stream(*a, **kw)


def rot(directory: Path, assignment: str, key: str | None = None) -> None:
    """Damage the index with a plain sqlite3 connection, as a stray writer would."""
    conn = sqlite3.connect(directory / "index.sqlite3")
    where = "" if key is None else f" WHERE key = '{key}'"
    assert conn.execute(f"UPDATE entries SET {assignment}{where}").rowcount >= 1
    conn.commit()
    conn.close()


def drops(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "dropping entry" in r.getMessage()]


@pytest.fixture
def spy(synth):
    return Spy(synth)


@pytest.mark.parametrize("assignment", [a for _, a in ROT], ids=[n for n, _ in ROT])
def test_a_rotted_row_is_a_miss_rendered_again_and_logged_once(
    spy, tmp_path, caplog, hostile_loop, hostile_speaker, assignment
):
    d = tmp_path / "c"
    outside = tmp_path / "outside.f32"  # what a damaged `file` column points at: never deleted
    outside.write_bytes(b"\0" * 8)
    with PhraseCache(d) as pc:
        first, hit = pc.render(spy, TEXT, None, FAST)
        assert not hit and spy.calls == 1
    rot(d, assignment)
    caplog.set_level(logging.WARNING, logger="irodori_speaker.cache")
    with PhraseCache(d) as pc:
        assert pc.lookup(spy, TEXT, None, FAST) is None  # a miss, no model work
        assert pc.lookup(spy, TEXT, None, FAST) is None
        again, hit = pc.render(spy, TEXT, None, FAST)
        assert not hit and spy.calls == 2
        np.testing.assert_array_equal(again.audio, first.audio)
        assert pc.lookup(spy, TEXT, None, FAST) is not None and spy.calls == 2  # healed
        assert pc.stats().dropped == 1 and pc.verify().clean
    assert len(drops(caplog)) == 1, drops(caplog)
    assert "index row is damaged" in drops(caplog)[0] or "audio" in drops(caplog)[0]
    assert outside.exists()
    speaker_plays_past(hostile_loop, hostile_speaker, assignment)


def speaker_plays_past(loop, speaker, assignment: str) -> None:
    """The same damage in the module Speaker's cache (every row): the line it stored plays
    again, re-rendered, and the Speaker speaks a normal line."""
    from irodori_speaker.speaker import UtteranceState

    async def case():
        first = await speaker.say(TEXT)  # stored (cache_store="all"), or a hit from a case before
        assert first.state == UtteranceState.PLAYED
        rot(speaker.cache.directory, assignment)
        again = await speaker.say(TEXT)
        assert again.state == UtteranceState.PLAYED and again.audio.size == first.audio.size
        real_audio(again.audio)
        await speaks_normally(speaker)

    run(loop, case())


@pytest.mark.parametrize("assignment", [a for _, a in ROT[:4]], ids=[n for n, _ in ROT[:4]])
def test_the_cached_synthesizer_renders_past_a_rotted_row(spy, tmp_path, assignment):
    d = tmp_path / "c"
    with PhraseCache(d) as pc:
        pc.render(spy, TEXT, None, FAST)
    rot(d, assignment)
    with PhraseCache(d) as pc:
        wrapped = pc.wrap(spy, store="all")
        assert wrapped.synthesize(TEXT, None, FAST).audio.size > 0 and spy.calls == 2
        assert list(wrapped.stream(TEXT, None, FAST)) and spy.calls == 2  # stored again: a hit


def test_prebuild_re_renders_a_rotted_row_it_would_have_skipped(spy, tmp_path):
    from irodori_speaker.cache.prebuild import prebuild

    d = tmp_path / "c"
    with PhraseCache(d) as pc:
        assert prebuild(spy, pc, [TEXT, "二つ目"], options=FAST, verify=False).rendered == 2
    rot(d, "record = '#' || substr(record, 2)", key=None)
    with PhraseCache(d) as pc:
        for verify in (False, True):
            report = prebuild(spy, pc, [TEXT, "二つ目"], options=FAST, verify=verify)
            assert not report.failed
        assert report.cached == 2 and pc.verify().clean


def test_a_byte_flipped_in_the_sqlite_file_is_a_miss(spy, tmp_path):
    """Flip one byte of the record JSON inside the database file itself (sqlite keeps no
    checksum of a row's payload, so it reads the damaged text back without an error)."""
    d = tmp_path / "c"
    with PhraseCache(d) as pc:
        line, _ = pc.render(spy, TEXT, None, FAST)
    db = d / "index.sqlite3"
    assert not Path(str(db) + "-wal").exists() or Path(str(db) + "-wal").stat().st_size == 0
    data = bytearray(db.read_bytes())
    at = data.find(b'"schedule"')  # inside the record column's JSON text
    assert at > 0
    data[at] = ord("{")
    db.write_bytes(bytes(data))
    with PhraseCache(d) as pc:
        assert pc.lookup(spy, TEXT, None, FAST) is None
        assert pc.render(spy, TEXT, None, FAST)[0].audio.size == line.audio.size and spy.calls == 2


def test_verify_reports_and_drops_rotted_rows_and_the_command_exits_1(spy, tmp_path, capsys):
    from irodori_speaker.cli import main

    d = tmp_path / "c"
    with PhraseCache(d) as pc:
        good = pc.store(spy, "良い", None, FAST, np.full(4800, 0.1, np.float32))
        bad = pc.store(spy, "悪い", None, FAST, np.full(4800, 0.2, np.float32))
    rot(d, "identity = substr(identity, 1, 7)", key=bad.key)
    rot(d, "samples = 'x'", key=good.key)
    with PhraseCache(d) as pc:
        report = pc.verify(repair=False)
        assert {k for k, _, _ in report.bad} == {good.key, bad.key} and not report.clean
        assert all("index row is damaged" in why for _, _, why in report.bad)
        assert pc.stats().entries == 2  # repair=False keeps them
    assert main(["cache", "verify", "--cache-dir", str(d)]) == 1
    err = capsys.readouterr().err
    assert err.count("dropped: ") == 2 and "column 'identity'" in err and "column 'samples'" in err
    assert main(["cache", "verify", "--cache-dir", str(d)]) == 0
    assert "0 damaged" in capsys.readouterr().out
    assert main(["cache", "list", "--cache-dir", str(d)]) == 0


def test_list_stats_and_eviction_survive_rotted_rows(spy, tmp_path, capsys):
    from irodori_speaker.cli import main

    d = tmp_path / "c"
    with PhraseCache(d) as pc:
        for i in range(3):
            pc.store(spy, f"行{i}", None, FAST, np.full(4800, 0.1 * (i + 1), np.float32))
    rot(d, "bytes = 'many', key = X'07' || key, text = X'FF', created = 'x', file = '../../x'")
    assert main(["cache", "list", "--cache-dir", str(d)]) == 0
    assert main(["cache", "stats", "--cache-dir", str(d)]) == 0
    with PhraseCache(d) as pc:
        pc.evict(1)  # the victims' sizes are damaged: eviction still ends
        pc.store(spy, "新しい", None, FAST, np.full(4800, 0.5, np.float32))
        assert pc.lookup(spy, "新しい", None, FAST) is not None
        assert pc.clear()[0] >= 1


def test_say_with_the_cache_renders_past_a_rotted_row(irodori_home, tmp_path, capsys):
    from irodori_speaker.cli import main

    d = tmp_path / "c"
    args = ["say", TEXT, "-o", str(tmp_path / "a.wav"), "--tiny-random", "--backend", "cpu"]
    args += ["--steps", "2", "--seconds", "0.4", "--seed", "5", "--cache-dir", str(d)]
    assert main(args) == 0
    rot(d, "record = '#' || substr(record, 2)")
    assert main(args) == 0
    assert main(args) == 0
    assert "from the phrase cache" in capsys.readouterr().out  # stored again, then a hit


def starts_without_it_then_speaks(loop, speaker, synth, directory: Path) -> None:
    """A Speaker given this cache directory starts without the cache, with one warning line
    (issue 30: it used to be refused, and the bot did not start); it and the process's Speaker
    speak."""
    from irodori_speaker.outputs import NullOutput
    from irodori_speaker.speaker import Speaker

    with pytest.warns(RuntimeWarning, match="starting without the phrase cache") as w:
        s = Speaker(synth, output=NullOutput(speed=float("inf")), cache=str(directory))
    assert s.cache is None and all("\n" not in str(x.message) for x in w)

    async def both():
        async with s:
            await speaks_normally(s)
        await speaks_normally(speaker)

    run(loop, both())


def test_a_cache_dir_that_is_a_file_is_one_clear_error(tmp_path, hostile_loop, hostile_speaker, synth):
    f = tmp_path / "phrases"
    f.write_text("not a directory")
    with pytest.raises(CacheError) as e:
        PhraseCache(f)
    assert "\n" not in str(e.value) and str(f) in str(e.value)
    starts_without_it_then_speaks(hostile_loop, hostile_speaker, synth, f)


@pytest.mark.skipif(os.geteuid() == 0 if hasattr(os, "geteuid") else True, reason="root writes anywhere")
def test_a_read_only_cache_dir_is_one_clear_error(tmp_path, hostile_loop, hostile_speaker, synth):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    try:
        with pytest.raises(CacheError) as e:
            PhraseCache(d)
        assert "\n" not in str(e.value)
        starts_without_it_then_speaks(hostile_loop, hostile_speaker, synth, d)
    finally:
        d.chmod(0o700)
