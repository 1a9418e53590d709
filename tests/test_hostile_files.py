"""Issue 30, the file system as hostile input: a phrase cache on a read-only file system (the
shipped-in-a-container case), caption files on a full disk, in a directory's place, through a
symlink or onto a device node, and values that cannot be written (an infinite duration, a
caption that is not text). Each case ends in one `IrodoriError` with a one-line message and a
hint (or works), its cost bounded in CPU time, and the module's Speaker then speaks a normal
line (tests/hostile.py).

Read-only is real: the tests mount a small tmpfs of their own and remount it read-only (they
run as root here, where chmod stops no write). Where that cannot be done (not root, no mount)
those cases skip saying so; `test_a_cache_opened_read_only_by_request_*` covers the same paths
with sqlite's `mode=ro` asked for, on any machine."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import subprocess
import warnings

import numpy as np
import pytest

from hostile import OPTS, cpu_bound, one_line, run, speaks_normally
from irodori_speaker.cache import PhraseCache
from irodori_speaker.errors import CacheError, InputError, IrodoriError
from irodori_speaker.speaker import UtteranceState

pytestmark = pytest.mark.timeout(300)

TEXT = "読み取り専用です。"
SAY = ["--tiny-random", "--backend", "cpu", "--steps", "2", "--seconds", "0.4", "--seed", "5"]


class Mount:
    """A tmpfs of `size` at `path`; `seal()` remounts it read-only."""

    def __init__(self, path, size: str) -> None:
        self.path = path
        path.mkdir()
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        )
        if r.returncode:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.decode().strip()}")

    def seal(self) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True, capture_output=True)
        with pytest.raises(OSError):  # really read-only, also for root
            (self.path / "probe").write_text("x")

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


@pytest.fixture
def mount(tmp_path):
    made: list[Mount] = []

    def make(size: str = "16m") -> Mount:
        m = Mount(tmp_path / f"mnt{len(made)}", size)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()


def _fill(synth, directory, texts=(TEXT,)) -> None:
    with PhraseCache(directory) as pc:
        for t in texts:
            pc.render(synth, t, options=synth.resolve_options(OPTS))


# ---- 1: a read-only phrase cache ---------------------------------------------------------------


def test_a_prebuilt_cache_on_a_read_only_file_system_serves_hits(
    synth, mount, hostile_loop, hostile_speaker, caplog
) -> None:
    """Issue 30: stats / list / verify, a Speaker given the cache all failed "unable to open
    database file"; the bot did not start."""
    from irodori_speaker.outputs import NullOutput
    from irodori_speaker.speaker import Speaker

    m = mount()
    d = m.path / "phrases"
    _fill(synth, d)
    m.seal()
    with caplog.at_level(logging.WARNING, "irodori_speaker.cache"), cpu_bound(5.0):
        pc = PhraseCache(d)
    notes = [r.getMessage() for r in caplog.records if "read-only" in r.getMessage()]
    assert pc.read_only and len(notes) == 1 and "\n" not in notes[0]
    with pc, cpu_bound(5.0):
        assert pc.lookup(synth, TEXT, options=synth.resolve_options(OPTS)) is not None
        s = pc.stats()
        assert s.read_only and s.entries == 1 and s.session_hits == 1
        assert pc.entries()[0].text and pc.verify().clean
        for change in (lambda: pc.clear(), lambda: pc.evict(1), lambda: pc.put("ab" * 16, np.ones(48))):
            with pytest.raises(CacheError, match="read-only") as e:
                change()
            one_line(e.value)
        line, hit = pc.render(synth, "ここにはない行です。", options=synth.resolve_options(OPTS))
        assert not hit and line.audio.size and pc.stats().entries == 1  # rendered, not stored

    async def speaker_on_it():
        s = Speaker(synth, output=NullOutput(speed=float("inf")), options=OPTS, cache=str(d))
        async with s:
            h = await s.say(TEXT)
            assert h.state == UtteranceState.PLAYED and h.record.extra["cache"]["hit"]
            await speaks_normally(s)  # a miss: rendered, nothing stored
        await speaks_normally(hostile_speaker)

    run(hostile_loop, speaker_on_it())


def test_the_commands_work_on_a_read_only_cache(synth, mount, tmp_path, capsys) -> None:
    """`cache stats / list / verify`, `say --cache` (a hit and a miss) and `prebuild` with every
    phrase present, on a read-only file system; `prebuild` of a missing phrase says read-only."""
    from irodori_speaker.cli import main

    m = mount()
    d = m.path / "phrases"
    phrases = tmp_path / "phrases.txt"
    phrases.write_text(TEXT + "\n", encoding="utf-8")
    assert main(["prebuild", str(phrases), "--cache-dir", str(d), *SAY]) == 0
    m.seal()
    capsys.readouterr()
    assert main(["cache", "stats", "--cache-dir", str(d)]) == 0
    assert "read-only" in capsys.readouterr().out
    assert main(["cache", "list", "--cache-dir", str(d)]) == 0
    assert TEXT in capsys.readouterr().out
    assert main(["cache", "verify", "--cache-dir", str(d)]) == 0
    assert "read-only" in capsys.readouterr().err
    assert main(["prebuild", str(phrases), "--cache-dir", str(d), *SAY]) == 0
    for text in (TEXT, "ない行です。"):
        assert main(["say", text, "-o", str(tmp_path / "a.wav"), "--cache-dir", str(d), *SAY]) == 0
    out = capsys.readouterr()
    assert "from the phrase cache" in out.out and "Traceback" not in out.err
    phrases.write_text(TEXT + "\nない行です。\n", encoding="utf-8")
    assert main(["prebuild", str(phrases), "--cache-dir", str(d), *SAY]) == 1
    err = capsys.readouterr().err
    assert "read-only" in err and "Traceback" not in err


def test_a_speaker_whose_cache_cannot_be_opened_starts_without_it(synth, mount, hostile_loop) -> None:
    from irodori_speaker.outputs import NullOutput
    from irodori_speaker.speaker import Speaker

    m = mount()
    m.seal()
    with pytest.warns(RuntimeWarning, match="starting without the phrase cache") as w:
        s = Speaker(synth, output=NullOutput(speed=float("inf")), options=OPTS, cache=str(m.path / "none"))
    assert all("\n" not in str(x.message) for x in w) and s.cache is None

    async def case():
        async with s:
            await speaks_normally(s)

    run(hostile_loop, case())


def test_a_cache_opened_read_only_by_request_serves_hits_and_stores_nothing(synth, tmp_path) -> None:
    """The same paths without a mount (sqlite mode=ro asked for): the fallback on any machine."""
    d = tmp_path / "phrases"
    _fill(synth, d)
    before = sorted(p.name for p in (d / "audio").rglob("*"))
    with PhraseCache(d, read_only=True) as pc:
        assert pc.lookup(synth, TEXT, options=synth.resolve_options(OPTS)) is not None
        assert pc.verify().clean and pc.stats().read_only
        with pytest.raises(CacheError, match="read-only"):
            pc.put("cd" * 16, np.ones(48))
    assert sorted(p.name for p in (d / "audio").rglob("*")) == before
    with pytest.raises(CacheError, match="read-only and has no index"):
        PhraseCache(tmp_path / "empty", read_only=True)


# ---- 6 and 9: caption files ------------------------------------------------------------------


def _caption_error(path, text: str = "字幕") -> IrodoriError:
    from irodori_speaker.timing.captions import write_text_atomic

    with pytest.raises(IrodoriError) as e, cpu_bound(1.0):
        write_text_atomic(path, text)
    one_line(e.value)
    assert e.value.hint
    return e.value


def test_captions_onto_a_full_disk_are_one_error(
    mount, tmp_path, hostile_loop, hostile_speaker, capsys
) -> None:
    """Issue 30: `say --srt / --vtt / --caption-file` onto a full disk raised OSError (ENOSPC)."""
    from irodori_speaker.cli import main

    m = mount("64k")
    full = tmp_path / "full"  # our own /dev/full: never point a test at the real one
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    assert "No space left" in str(_caption_error(full))  # a device: written into, not replaced
    assert stat.S_ISCHR(os.lstat(full).st_mode)
    with contextlib.suppress(OSError), open(m.path / "filler", "wb") as f:
        f.write(b"\0" * 1024 * 1024)
    assert "No space left" in str(_caption_error(m.path / "captions.txt", "字幕" * 50_000))
    assert not [p for p in m.path.iterdir() if p.name.startswith(".caption-")]  # no temp file left
    for flag in ("--srt", "--vtt", "--caption-file"):
        args = ["say", TEXT, "-o", str(tmp_path / "a.wav"), flag, str(m.path / "c.txt"), *SAY]
        assert main(args) == 1
        err = capsys.readouterr().err
        assert "Traceback" not in err and "hint:" in err
    run(hostile_loop, speaks_normally(hostile_speaker))


def test_a_caption_file_in_a_directory_place_or_under_a_file_is_one_error(
    tmp_path, hostile_loop, hostile_speaker
) -> None:
    """Issue 30: CaptionFile(<a directory>) raised IsADirectoryError; an unwritable place
    FileNotFoundError / NotADirectoryError."""
    from irodori_speaker.timing.captions import CaptionFile

    (tmp_path / "a-file").write_text("x")
    for where in (tmp_path, tmp_path / "a-file" / "c.txt"):
        with pytest.raises(IrodoriError) as e:
            CaptionFile(where)
        one_line(e.value)
        assert e.value.hint
        _caption_error(where)
    run(hostile_loop, speaks_normally(hostile_speaker))


def test_captions_write_through_a_symlink_and_never_replace_a_device(
    tmp_path, hostile_loop, hostile_speaker
) -> None:
    """Issue 30: a symlink (an OBS text source often is one) was replaced by a 0600 file;
    a device node was renamed over when run as root."""
    from irodori_speaker.timing.captions import write_text_atomic

    real = tmp_path / "real.txt"
    real.write_text("old")
    real.chmod(0o644)
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    with cpu_bound(1.0):
        write_text_atomic(link, "新しい字幕")
    assert link.is_symlink() and real.read_text(encoding="utf-8") == "新しい字幕"
    assert stat.S_IMODE(real.stat().st_mode) == 0o644
    if os.geteuid() == 0:
        node = tmp_path / "null"
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        with contextlib.suppress(IrodoriError):  # a nodev mount refuses to open it: one error
            write_text_atomic(node, "字幕")
        assert stat.S_ISCHR(os.lstat(node).st_mode)  # still the device, never renamed over
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, so writing does not block
    try:
        write_text_atomic(fifo, "字幕")
        assert os.read(fd, 100).decode() == "字幕" and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    finally:
        os.close(fd)
    run(hostile_loop, speaks_normally(hostile_speaker))


def test_an_infinite_duration_and_a_caption_that_is_not_text_are_input_errors(
    hostile_loop, hostile_speaker
) -> None:
    """Issue 30: estimate_timing(text, inf) was accepted, then srt() raised OverflowError;
    Voice(caption=5) raised AttributeError on a v4 model."""
    from irodori_speaker.synthesis.voices import Voice
    from irodori_speaker.timing.captions import Cue, srt
    from irodori_speaker.timing.estimate import estimate_timing

    with cpu_bound(1.0):
        for bad in (float("inf"), float("nan"), -float("inf")):
            with pytest.raises(InputError, match="finite") as e:
                estimate_timing("こんにちは", bad)
            one_line(e.value)
        with pytest.raises(IrodoriError, match="cannot be written") as e:
            srt([Cue(0.0, float("inf"), "x")])
        one_line(e.value)
        for caption in (5, b"voice", ["a"]):
            with pytest.raises(InputError, match="caption must be a str") as e:
                Voice(caption=caption)
            one_line(e.value)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run(hostile_loop, speaks_normally(hostile_speaker))
