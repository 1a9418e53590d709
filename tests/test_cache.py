"""The phrase cache: keys, integrity, crash safety, several processes, eviction, no model work on a hit."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from irodori_speaker import cache as cache_mod
from irodori_speaker.audio.lipsync import Envelope, mouth_levels
from irodori_speaker.audio.signal import SAMPLE_RATE
from irodori_speaker.cache import DEFAULT_SEED, PhraseCache, cache_options, canonical_json
from irodori_speaker.errors import CacheError, InputError
from irodori_speaker.options import SynthesisOptions, SynthesisRecord
from irodori_speaker.synthesis.voices import Voice

FAST = SynthesisOptions(steps=2, seconds=0.4, seed=5)  # cheap on a 2-core CPU
SR = SAMPLE_RATE
REPO = Path(__file__).resolve().parents[1]


class Spy:
    """A synthesizer that counts the calls that would do model work."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []
        self.sample_rate = inner.sample_rate
        self.fail: set[str] = set()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def synthesize(self, text, voice=None, options=None, cancel=None, **kw):
        self.calls.append(("synthesize", text))
        if text in self.fail:
            raise RuntimeError(f"model exploded on {text!r}")
        return self.inner.synthesize(text, voice, options, cancel, **kw)

    def stream(self, text, voice=None, options=None, cancel=None, **kw):
        self.calls.append(("stream", text))
        return self.inner.stream(text, voice, options, cancel, **kw)


@pytest.fixture
def spy(synth):
    return Spy(synth)


@pytest.fixture
def pc(tmp_path):
    c = PhraseCache(tmp_path / "phrases")
    yield c
    c.close()


def tone(n: int = 4800, f: float = 220.0, level: float = 0.3) -> np.ndarray:
    return (level * np.sin(2 * np.pi * f * np.arange(n) / SR)).astype(np.float32)


def write_wav(path: Path, f: float) -> Path:
    sf.write(str(path), tone(SR // 2, f), SR)
    return path


def reference_key(identity: dict) -> str:
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


# ---- keys -------------------------------------------------------------------------------------


def test_key_is_sha256_of_canonical_identity_with_format_version(synth, pc):
    ident = pc.identity(synth, "こんにちは", None, FAST)
    assert ident["format"] == cache_mod.CACHE_FORMAT_VERSION
    assert ident["line"] == synth.render_identity("こんにちは", None, FAST)
    tok = ident["line"]["tokenizer"]  # content hash of tokenizer.json
    assert tok and canonical_json(ident).count(tok) == 1  # each key component once
    assert set(ident) == {"format", "line", "sample_rate"}
    assert pc.key(synth, "こんにちは", None, FAST) == reference_key(ident)


def test_a_new_option_that_changes_the_sound_enters_the_key_by_its_field_alone(synth, pc):
    # the key takes the options whose field says audio=True (types.option), with no list to edit
    from irodori_speaker.options import Check, option

    extra = dataclasses.make_dataclass(
        "WithBreath",
        [
            ("breath", float, option(0.0, Check(float, 0.0, 1.0), "breathiness", stage="output")),
            ("label", str, option("", Check(str), "a name only", stage="output", audio=False)),
        ],
        bases=(SynthesisOptions,),
        frozen=True,
    )
    base = extra(steps=2, seconds=0.4, seed=5)
    key = pc.key(synth, "こんにちは", None, base)
    assert pc.identity(synth, "こんにちは", None, base)["line"]["options"]["breath"] == 0.0
    assert pc.key(synth, "こんにちは", None, dataclasses.replace(base, breath=0.5)) != key
    assert pc.key(synth, "こんにちは", None, dataclasses.replace(base, label="x")) == key
    # the options that do not change the sound are not in it either
    plain = pc.identity(synth, "こんにちは", None, FAST)["line"]["options"]
    assert "chunk_frames" not in plain and "laughter" not in plain and "steps" in plain


def test_a_caption_tokenizer_that_is_the_text_tokenizer_is_in_the_key_once(synth):
    same = copy.copy(synth)
    tok = synth.fingerprints["tokenizer"]
    same.fingerprints = {**synth.fingerprints, "caption_tokenizer": tok}  # v4: one tokenizer/ folder
    ident = same.render_identity("こんにちは", None, FAST)
    assert canonical_json(ident).count(tok) == 1 and ident["caption_tokenizer"] is None
    other = copy.copy(synth)
    other.fingerprints = {**synth.fingerprints, "caption_tokenizer": "3" * 64}
    assert other.render_identity("こんにちは", None, FAST)["caption_tokenizer"] == "3" * 64


def _variants(tmp_path: Path, synth):
    """(name, base kwargs, changed kwargs, synth for changed) for every key component."""
    wav_a = write_wav(tmp_path / "a.wav", 220.0)
    other_model = copy.copy(synth)
    other_model.fingerprints = {**synth.fingerprints, "model": "0" * 64}
    other_codec = copy.copy(synth)
    other_codec.fingerprints = {**synth.fingerprints, "codec": "1" * 64}
    other_tok = copy.copy(synth)
    other_tok.fingerprints = {**synth.fingerprints, "tokenizer": "2" * 64}
    base = dict(text="こんにちは", voice=Voice.from_wav(wav_a, caption="明るい声"), options=FAST)

    def opts(**kw):
        return dict(base, options=dataclasses.replace(FAST, **kw))

    return base, [
        ("text", dict(base, text="こんばんは"), synth),
        ("caption", dict(base, voice=Voice.from_wav(wav_a, caption="落ち着いた声")), synth),
        ("steps", opts(steps=3), synth),
        ("schedule", opts(schedule="linear"), synth),
        ("guidance", opts(guidance="joint"), synth),
        ("cfg scale", opts(cfg_scale_text=2.5), synth),
        ("seed", opts(seed=6), synth),
        ("seconds", opts(seconds=0.5), synth),
        ("model fingerprint", base, other_model),
        ("codec fingerprint", base, other_codec),
        ("tokenizer fingerprint", base, other_tok),
    ]


def test_each_key_component_changes_the_key_and_misses(synth, pc, tmp_path):
    base, variants = _variants(tmp_path, synth)
    pc.store(synth, base["text"], base["voice"], base["options"], tone())
    assert pc.lookup(synth, base["text"], base["voice"], base["options"]) is not None
    for name, changed, s in variants:
        assert pc.lookup(s, changed["text"], changed["voice"], changed["options"]) is None, name
    assert pc.lookup(synth, base["text"], base["voice"], base["options"]) is not None
    keys = {pc.key(s, c["text"], c["voice"], c["options"]) for _, c, s in variants}
    assert len(keys) == len(variants)  # all different from each other too


def test_voice_key_follows_content_not_path(synth, pc, tmp_path):
    a = write_wav(tmp_path / "a.wav", 220.0)
    b = tmp_path / "copy-of-a.wav"
    b.write_bytes(a.read_bytes())
    pc.store(synth, "こんにちは", str(a), FAST, tone())
    assert pc.lookup(synth, "こんにちは", str(b), FAST) is not None  # same content elsewhere: hit
    time.sleep(0.01)  # a new mtime, so the fingerprint memo sees the new content
    write_wav(a, 330.0)  # same path, different voice
    assert pc.lookup(synth, "こんにちは", str(a), FAST) is None


def test_format_version_change_misses(synth, pc, monkeypatch):
    pc.store(synth, "こんにちは", None, FAST, tone())
    assert pc.lookup(synth, "こんにちは", None, FAST) is not None
    monkeypatch.setattr(cache_mod.keys, "CACHE_FORMAT_VERSION", cache_mod.CACHE_FORMAT_VERSION + 1)
    assert pc.lookup(synth, "こんにちは", None, FAST) is None


def test_what_does_not_change_the_sound_does_not_change_the_key(synth, pc):
    k = pc.key(synth, "こんにちは！", None, FAST)
    assert pc.key(synth, "こんにちは!", None, FAST) == k  # the same text after normalisation
    assert pc.key(synth, "こんにちは！", None, dataclasses.replace(FAST, chunk_frames=8)) == k  # exact decode


def test_no_seed_means_the_default_cache_seed(synth, pc):
    assert cache_options(None).seed == DEFAULT_SEED == 0
    assert cache_options(dataclasses.replace(FAST, seed=None)).seed == 0
    no_seed = dataclasses.replace(FAST, seed=None)
    assert pc.key(synth, "はい", None, no_seed) == pc.key(
        synth, "はい", None, dataclasses.replace(FAST, seed=0)
    )
    with pytest.raises(InputError, match="seed"):  # audio of another (random) seed is refused
        pc.store(synth, "はい", None, no_seed, tone(), SynthesisRecord(text="はい", seed=123))


def test_uncacheable_synthesizer_is_a_clear_error(pc):
    class Bare:
        sample_rate = SR

    with pytest.raises(CacheError, match="render_identity"):
        pc.lookup(Bare(), "こんにちは", None, FAST)


# ---- hits: no model work, the same record and lip-sync ---------------------------------------


def test_hit_needs_no_synthesizer_call_and_returns_stored_audio_record_envelope(spy, pc):
    fresh = spy.inner.synthesize("いらっしゃい！", None, FAST)
    line, hit = pc.render(spy, "いらっしゃい！", None, FAST)
    assert not hit and len(spy.calls) == 1
    np.testing.assert_array_equal(line.audio, fresh.audio)  # deterministic seed: same render
    spy.calls.clear()
    for _ in range(3):
        got = pc.lookup(spy, "いらっしゃい！", None, FAST)
        assert got is not None
    assert spy.calls == []
    _, hit2 = pc.render(spy, "いらっしゃい！", None, FAST)
    assert hit2 and spy.calls == []
    np.testing.assert_array_equal(got.audio, fresh.audio)
    for f in ("text", "seed", "frames", "samples", "steps", "schedule", "pieces", "warnings"):
        assert getattr(got.record, f) == getattr(fresh.record, f), f
    assert got.record.timings == line.record.timings  # the stored render's own timings
    assert set(got.record.timings) == set(fresh.record.timings)
    assert got.record.extra["cache"]["hit"] is True and got.record.extra["cache"]["key"] == got.key
    assert got.duration == pytest.approx(len(fresh.audio) / SR)
    np.testing.assert_array_equal(got.levels, mouth_levels(fresh.audio, SR, hz=50.0))
    env_fresh = Envelope(SR)
    env_fresh.append(fresh.audio)
    env_cached = got.envelope()
    for t in np.arange(0.0, got.duration, 0.013):
        assert env_cached.raw_level(t) == env_fresh.raw_level(t)
    s = pc.stats()
    assert (s.hits, s.misses, s.stores, s.entries) == (4, 1, 1, 1)


def test_stats_count_hits_and_misses_across_processes_and_bytes(synth, tmp_path):
    with PhraseCache(tmp_path / "c") as a:
        a.store(synth, "一", None, FAST, tone(4800))
        a.store(synth, "二", None, FAST, tone(9600))
        a.lookup(synth, "一", None, FAST)
        a.lookup(synth, "三", None, FAST)
    with PhraseCache(tmp_path / "c") as b:  # another "process": lifetime counters live in the index
        s = b.stats()
    assert (s.entries, s.bytes, s.hits, s.misses, s.stores) == (2, 4 * (4800 + 9600), 1, 1, 2)
    assert s.audio_seconds == pytest.approx(0.3)
    assert (s.session_hits, s.session_misses) == (0, 0)


def test_flac_entries_round_trip_within_24_bit(synth, tmp_path):
    x = tone(24000, 440.0, 0.5)
    with PhraseCache(tmp_path / "f", audio_format="flac") as c:
        line = c.store(synth, "フラック", None, FAST, x)
        got = c.lookup(synth, "フラック", None, FAST)
        on_disk = (c.directory / c._index.row(line.key)[1]).stat().st_size
    assert got is not None and np.max(np.abs(got.audio - x)) < 2**-22
    np.testing.assert_array_equal(got.audio, line.audio)
    assert on_disk < 4 * len(x)


def test_cached_synthesizer_serves_hits_without_the_model(spy, pc):
    pc.render(spy, "ようこそ", None, FAST)
    spy.calls.clear()
    wrapped = pc.wrap(spy)
    res = wrapped.synthesize("ようこそ", None, FAST)
    chunks = list(wrapped.stream("ようこそ", None, FAST))
    assert spy.calls == []
    np.testing.assert_array_equal(np.concatenate(chunks), res.audio)
    wrapped.synthesize("はじめまして", None, FAST)  # miss: rendered, not stored ("prebuilt")
    assert spy.calls == [("synthesize", "はじめまして")]
    assert pc.lookup(spy, "はじめまして", None, FAST) is None
    store_all = pc.wrap(spy, store="all")
    no_seed = dataclasses.replace(FAST, seed=None)
    streamed = np.concatenate(list(store_all.stream("さようなら", None, no_seed)))
    got = pc.lookup(spy, "さようなら", None, no_seed)
    assert got is not None and got.record.seed == DEFAULT_SEED
    np.testing.assert_array_equal(got.audio, streamed)
    part = store_all.stream("途中でやめる文です", None, dataclasses.replace(FAST, chunk_frames=2))
    next(part)
    part.close()  # a cancelled line is never stored
    assert pc.lookup(spy, "途中でやめる文です", None, FAST) is None


# ---- damage: detected, dropped, re-rendered, never played -------------------------------------


def _audio_path(c: PhraseCache, key: str) -> Path:
    return c.directory / c._index.row(key)[1]


@pytest.mark.parametrize("damage", ["flip-a-byte", "truncate", "delete-file"])
def test_damaged_entry_is_dropped_and_re_rendered(spy, pc, damage):
    first, _ = pc.render(spy, "壊れた音声", None, FAST)
    path = _audio_path(pc, first.key)
    data = bytearray(path.read_bytes())
    if damage == "flip-a-byte":
        data[len(data) // 2] ^= 0x40
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 3]))
    else:
        path.unlink()
    assert pc.lookup(spy, "壊れた音声", None, FAST) is None  # never served
    assert pc._index.row(first.key) is None and pc.stats().dropped == 1
    assert not path.exists()
    spy.calls.clear()
    again, hit = pc.render(spy, "壊れた音声", None, FAST)
    assert not hit and spy.calls == [("synthesize", "壊れた音声")]
    np.testing.assert_array_equal(again.audio, first.audio)
    assert pc.lookup(spy, "壊れた音声", None, FAST) is not None


def test_verify_reports_and_drops_damage_and_sweeps_leftovers(synth, pc):
    good = pc.store(synth, "良い", None, FAST, tone())
    bad = pc.store(synth, "悪い", None, FAST, tone(4800, 330.0))
    p = _audio_path(pc, bad.key)
    p.write_bytes(p.read_bytes()[:-8])
    orphan = pc.directory / "audio" / "zz" / "orphan.f32"  # renamed into place, then the writer died
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"\0" * 64)
    torn = pc.directory / "tmp" / "x.part"  # a temp file of a writer killed mid-write
    torn.write_bytes(b"\1" * 10)
    report = pc.verify(repair=False)
    assert [k for k, _, _ in report.bad] == [bad.key] and report.ok == 1 and orphan.exists()
    report = pc.verify(repair=True, grace_s=0.0)
    assert [k for k, _, _ in report.bad] == [bad.key] and "truncated" in report.bad[0][2]
    assert (report.orphans_removed, report.temp_removed) == (1, 1)
    assert not orphan.exists() and not torn.exists()
    assert pc.verify().clean and pc.lookup(synth, "良い", None, FAST).key == good.key


def test_fresh_orphans_are_left_alone(synth, pc):
    orphan = pc.directory / "audio" / "zz" / "young.f32"  # could be a write about to commit
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"\0" * 64)
    assert pc.verify().orphans_removed == 0 and orphan.exists()


def test_a_destroyed_index_is_set_aside_and_the_cache_starts_afresh(synth, tmp_path):
    d = tmp_path / "c"
    with PhraseCache(d) as c:
        c.store(synth, "一", None, FAST, tone())
    for suffix in ("-wal", "-shm"):
        Path(str(d / "index.sqlite3") + suffix).unlink(missing_ok=True)
    (d / "index.sqlite3").write_bytes(b"this is not a database" * 100)
    with PhraseCache(d) as c:
        assert c.lookup(synth, "一", None, FAST) is None and c.stats().entries == 0
        c.store(synth, "一", None, FAST, tone())
        assert c.lookup(synth, "一", None, FAST) is not None
    assert list(d.glob("index.sqlite3.corrupt-*"))


def test_bad_input_is_refused(synth, pc):
    with pytest.raises(InputError):
        pc.store(synth, "一", None, FAST, np.zeros((2, 100), np.float32))
    with pytest.raises(InputError):
        pc.store(synth, "一", None, FAST, np.array([0.0, np.nan], np.float32))
    with pytest.raises(InputError):
        pc.store(synth, "   ", None, FAST, tone())  # nothing to say
    with pytest.raises(InputError):
        PhraseCache(pc.directory, audio_format="mp3")
    with pytest.raises(InputError):
        cache_mod.parse_size("lots")
    assert cache_mod.parse_size("1.5k") == 1536 and cache_mod.parse_size("2G") == 2 * 1024**3
    # the project's one size grammar (options.memory.parse_bytes, the GPU budget's too): MB decimal
    assert cache_mod.parse_size("500MB") == 500 * 10**6 and cache_mod.parse_size("500 MiB") == 500 * 2**20


# ---- size limit ---------------------------------------------------------------------------------


def test_eviction_keeps_the_limit_and_drops_least_recently_used(synth, tmp_path):
    entry = 4 * 4800
    with PhraseCache(tmp_path / "c", max_bytes=3 * entry + entry // 2) as c:
        for t in ("一", "二", "三"):
            c.store(synth, t, None, FAST, tone())
        c.lookup(synth, "一", None, FAST)  # 一 is now more recent than 二 and 三
        c.store(synth, "四", None, FAST, tone())
        assert c.lookup(synth, "二", None, FAST) is None  # the least recently used went
        for t in ("一", "三", "四"):
            assert c.lookup(synth, t, None, FAST) is not None, t
        for i in range(10):
            c.store(synth, f"追加{i}", None, FAST, tone())
            s = c.stats()
            assert s.bytes <= c.max_bytes and s.entries == 3
        assert c.stats().evictions == 11
        files = [p for p in (c.directory / "audio").rglob("*") if p.is_file()]
        assert len(files) == 3  # evicted audio is deleted, not just unlisted
        with pytest.raises(CacheError, match="limit"):
            c.store(synth, "長すぎる", None, FAST, tone(4 * 4800))
    with PhraseCache(tmp_path / "c") as c:
        assert c.max_bytes == 3 * entry + entry // 2  # the limit is remembered
        assert c.evict(entry) == 2 and c.stats().entries == 1  # shrink on demand
        assert c.max_bytes == 3 * entry + entry // 2


# ---- concurrency --------------------------------------------------------------------------------


def test_threads_share_one_cache(synth, pc):
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(15):
                text = f"スレッド{n}の{i}"
                x = tone(2400, 200.0 + 10 * n + i)
                pc.store(synth, text, None, FAST, x)
                got = pc.lookup(synth, text, None, FAST)
                assert got is not None and np.array_equal(got.audio, x)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and pc.stats().entries == 60


_PROC = textwrap.dedent(
    """
    import hashlib, json, random, sys, time
    from pathlib import Path
    import numpy as np
    from irodori_speaker.cache import PhraseCache

    role, directory, n, done = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])

    def key(i):
        return hashlib.sha256(f"entry-{i}".encode()).hexdigest()

    def audio(i):
        return np.random.default_rng(i).uniform(-0.5, 0.5, 2400 + 37 * i).astype(np.float32)

    c = PhraseCache(directory)
    out = {"hits": 0, "misses": 0, "bad": 0, "puts": 0, "errors": []}
    if role == "writer":
        for i in range(n):
            c.put(key(i), audio(i), text=f"entry {i}", source="writer")
            out["puts"] += 1
        done.write_text("done")
    else:
        rng = random.Random(role)
        end = time.monotonic() + 60
        while time.monotonic() < end and not done.exists():  # read for as long as the writer writes
            i = rng.randrange(n)
            try:
                line = c.get(key(i))
            except Exception as e:
                out["errors"].append(repr(e))
                continue
            if line is None:
                out["misses"] += 1
            elif np.array_equal(line.audio, audio(i)) and line.text == f"entry {i}":
                out["hits"] += 1
            else:
                out["bad"] += 1
    print(json.dumps(out))
    """
)


def test_one_writer_and_two_reader_processes_never_see_a_torn_entry(tmp_path):
    d = tmp_path / "shared-cache"
    n = 300
    done = tmp_path / "writer-done"
    with PhraseCache(d, max_bytes=40 * 4 * 8000):  # ~40 entries fit: eviction runs during the test
        pass
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1")
    script = tmp_path / "proc.py"
    script.write_text(_PROC)
    writer = subprocess.Popen(
        [sys.executable, str(script), "writer", str(d), str(n), str(done)], stdout=subprocess.PIPE, env=env
    )
    readers = [
        subprocess.Popen(
            [sys.executable, str(script), f"reader{i}", str(d), str(n), str(done)],
            stdout=subprocess.PIPE,
            env=env,
        )
        for i in range(2)
    ]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in [writer, *readers]]
    assert writer.returncode == 0 and all(r.returncode == 0 for r in readers)
    assert outs[0]["puts"] == n
    for r in outs[1:]:
        assert r["errors"] == [] and r["bad"] == 0
    assert sum(r["hits"] for r in outs[1:]) > 0  # they read while it wrote
    with PhraseCache(d) as c:
        s = c.stats()
        assert c.verify(grace_s=0.0).clean
        assert s.bytes <= c.max_bytes and s.entries + s.evictions == n
        files = [p for p in (d / "audio").rglob("*") if p.is_file()]
        assert len(files) == s.entries  # no orphan left by eviction under contention
        assert list((d / "tmp").iterdir()) == []


# ---- the Speaker ----------------------------------------------------------------------------------


def _speaker_run(synth, text: str, **speaker_kwargs):
    from irodori_speaker.outputs import NullOutput
    from irodori_speaker.speaker import Speaker

    async def body():
        # real-time paced: lip-sync events flow, and the jitter buffer's real-time plan holds (at x2 a
        # busy machine's stream underran and the played audio had a hole the hit's had not)
        out = NullOutput(speed=1.0, record=True)
        async with Speaker(synth, output=out, prewarm=False, options=FAST, **speaker_kwargs) as s:
            kinds: list[str] = []
            s.on(None, lambda e: kinds.append(e.kind))
            h = await asyncio.wait_for(s.say(text), 60)
        played = out.recorded()[:, 0]
        start = int(np.flatnonzero(played)[0])  # the paced sink records silence before the line
        return h, kinds, played[start : start + len(h.audio)]

    return asyncio.run(body())


def _same_events(fresh_kinds: list[str], cached_kinds: list[str]) -> None:
    """The same events, each as often; in the same order except where timing decides it: a fresh
    line streams (playback may start before its synthesis finishes), a hit is whole at once."""
    assert "mouth" in fresh_kinds and "mouth" in cached_kinds  # lip-sync for both
    fresh = [k for k in fresh_kinds if k != "mouth"]
    cached = [k for k in cached_kinds if k != "mouth"]
    assert sorted(fresh) == sorted(cached)
    racy = {"synthesis_finished"}
    assert [k for k in cached if k not in racy] == [k for k in fresh if k not in racy]
    for kinds in (fresh, cached):
        assert kinds.index("synthesis_started") < kinds.index("synthesis_finished") < kinds.index("closed")


def test_speaker_through_the_cached_synthesizer_plays_a_hit_without_model_work(spy, pc):
    text = "いつもありがとう！"
    fresh, fresh_kinds, fresh_audio = _speaker_run(spy, text)
    assert len(spy.calls) == 1
    pc.render(spy.inner, text, None, FAST)
    spy.calls.clear()
    hit, hit_kinds, hit_audio = _speaker_run(pc.wrap(spy), text)
    assert spy.calls == []
    np.testing.assert_array_equal(hit.audio, fresh.audio)
    np.testing.assert_array_equal(hit_audio, fresh_audio)
    _same_events(fresh_kinds, hit_kinds)
    assert hit.record.extra["cache"]["hit"] and hit.record.samples == fresh.record.samples


def test_speaker_cache_hit_plays_with_zero_synthesizer_calls_and_the_same_events(spy, pc):
    text = "また来てね！"
    _, fresh_kinds, fresh_audio = _speaker_run(spy, text)
    pc.render(spy.inner, text, None, FAST)
    spy.calls.clear()
    _, hit_kinds, hit_audio = _speaker_run(spy, text, cache=pc)
    assert spy.calls == []
    np.testing.assert_array_equal(hit_audio, fresh_audio)
    _same_events(fresh_kinds, hit_kinds)
    # marked lines are stored by the Speaker (cache_store="marked"), then served
    _speaker_run(spy, "覚えておく行", cache=pc, cache_store="marked")
    assert pc.lookup(spy.inner, "覚えておく行", None, FAST) is None  # not marked: not stored
    spy.calls.clear()
    from irodori_speaker.outputs import NullOutput
    from irodori_speaker.speaker import Speaker

    async def marked():
        async with Speaker(spy, output=NullOutput(speed=20.0), prewarm=False, options=FAST, cache=pc) as s:
            await s.say("覚えておく行", cache=True)

    asyncio.run(marked())
    assert len(spy.calls) == 1 and pc.lookup(spy.inner, "覚えておく行", None, FAST) is not None


class SlowSpy(Spy):
    """Model work takes `delay` seconds before the first audio."""

    delay = 1.0

    def stream(self, text, voice=None, options=None, cancel=None, **kw):
        self.calls.append(("stream", text))
        inner = self.inner.stream(text, voice, options, cancel, **kw)

        def chunks():
            time.sleep(self.delay)
            yield from inner

        from irodori_speaker.options import AudioStream

        return AudioStream(chunks(), inner.record)


def test_speaker_cache_hit_does_not_wait_for_the_model_worker(synth, pc):
    from irodori_speaker.outputs import NullOutput
    from irodori_speaker.speaker import Speaker

    pc.render(synth, "スパチャありがとう！", None, FAST)
    slow = SlowSpy(synth)

    async def body():
        async with Speaker(slow, output=NullOutput(speed=4.0), prewarm=False, options=FAST, cache=pc) as s:
            log: list[tuple[str, int]] = []
            s.on(["synthesis_finished", "playback_started"], lambda e: log.append((e.kind, e.utterance_id)))
            miss = s.enqueue("長く考える普通の行です。")  # the model worker is busy with it for 1 s
            await asyncio.sleep(0.1)
            hit = s.enqueue("スパチャありがとう！", priority="high")
            await asyncio.gather(miss, hit)
            return log, miss.id, hit.id

    log, miss_id, hit_id = asyncio.run(body())
    assert slow.calls == [("stream", "長く考える普通の行です。")]
    assert log.index(("playback_started", hit_id)) < log.index(("synthesis_finished", miss_id))
