"""One cache integration (cache/policy.py `CachedRender`): the Speaker, `CachedSynthesizer`,
`PhraseCache.render` and prebuild look a line up, render it on a miss and store it by one
policy, the same way. Real sqlite caches in tmp_path; the synthesizer is the Speaker tests'
fake (its calls are the model work)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from speaker_fakes import FakeSynth

from irodori_speaker.cache import DEFAULT_SEED, CachedRender, PhraseCache, StorePolicy
from irodori_speaker.cache.prebuild import prebuild
from irodori_speaker.errors import CacheError, InputError
from irodori_speaker.options import SynthesisOptions
from irodori_speaker.outputs import NullOutput
from irodori_speaker.speaker import Speaker, UtteranceState

OPTS = SynthesisOptions(seed=4)


def via_speaker(pc, fake, text, store="all", options=OPTS, **line):
    async def body():
        out = NullOutput(speed=float("inf"))
        async with Speaker(fake, output=out, cache=pc, cache_store=store, options=options) as s:
            return await s.say(text, **line)

    h = asyncio.run(body())
    assert h.state == UtteranceState.PLAYED
    return h.audio


def via_streaming_off(pc, fake, text, store="all", options=OPTS, **line):
    async def body():
        out = NullOutput(speed=float("inf"))
        async with Speaker(
            fake, output=out, cache=pc, cache_store=store, options=options, streaming=False
        ) as s:
            return await s.say(text, **line)

    return asyncio.run(body()).audio


def via_cached_synth(pc, fake, text, store="all", options=OPTS, **line):
    return pc.wrap(fake, store=store).synthesize(text, None, options, **line).audio


def via_cached_stream(pc, fake, text, store="all", options=OPTS, **line):
    return np.concatenate(list(pc.wrap(fake, store=store).stream(text, None, options, **line)))


def via_render(pc, fake, text, store="all", options=OPTS):
    return pc.render(fake, text, None, options, source="test")[0].audio


def via_prebuild(pc, fake, text, store="all", options=OPTS):
    report = prebuild(fake, pc, [text], options=options)
    assert not report.failed, report.failed
    return None


CALLERS = {
    "speaker": via_speaker,
    "speaker-whole": via_streaming_off,
    "cached_synth": via_cached_synth,
    "cached_stream": via_cached_stream,
    "render": via_render,
    "prebuild": via_prebuild,
}


def model_calls(fake: FakeSynth) -> int:
    return len([c for c in fake.calls if c.kind != "prewarm"])


@pytest.mark.parametrize("name", list(CALLERS))
def test_each_caller_misses_renders_stores_then_hits(tmp_path, name):
    fake = FakeSynth(steps=1, step_s=0.0)
    call = CALLERS[name]
    with PhraseCache(tmp_path / "c") as pc:
        key = CachedRender(pc, fake, source="t").slot("いらっしゃいませ", None, OPTS).key
        call(pc, fake, "いらっしゃいませ")
        assert model_calls(fake) == 1  # a miss: rendered once
        assert [e.key for e in pc.entries()] == [key]  # ...and stored under the one key
        got = call(pc, fake, "いらっしゃいませ")
        assert model_calls(fake) == 1  # a hit: no model work
        assert len(pc.entries()) == 1
        if got is not None:
            np.testing.assert_array_equal(got, fake.audio_for("いらっしゃいませ"))


@pytest.mark.parametrize("producer", list(CALLERS))
def test_what_one_caller_stored_is_a_hit_for_every_other(tmp_path, producer):
    for consumer, call in CALLERS.items():
        fake = FakeSynth(steps=1, step_s=0.0)
        with PhraseCache(tmp_path / f"{producer}-{consumer}") as pc:
            CALLERS[producer](pc, fake, "また来てね")
            before = model_calls(fake)
            call(pc, fake, "また来てね")
            assert model_calls(fake) == before, f"{producer} stored, {consumer} rendered again"


@pytest.mark.parametrize("name", ["speaker", "speaker-whole", "cached_synth", "cached_stream"])
def test_one_store_policy_for_the_speaker_and_the_wrapped_synthesizer(tmp_path, name):
    call = CALLERS[name]
    fake = FakeSynth(steps=1, step_s=0.0)
    with PhraseCache(tmp_path / "c") as pc:
        call(pc, fake, "一行目", store="prebuilt")  # nothing stored
        call(pc, fake, "二行目", store="marked")  # not marked: not stored
        call(pc, fake, "三行目", store="marked", cache=True)  # marked: stored
        call(pc, fake, "四行目", store="all", cache=False)  # cache=False: never
        call(pc, fake, "五行目", store="all")
        call(pc, fake, "六行目", store="seeded")  # a seed of its own: stored
        call(pc, fake, "七行目", store="seeded", options=SynthesisOptions())  # random: not
        assert sorted(e.text for e in pc.entries()) == ["三行目", "五行目", "六行目"]
    with pytest.raises(InputError, match="must be one of"):
        call(pc, fake, "x", store="sometimes")


@pytest.mark.parametrize("name", ["speaker", "cached_synth", "render", "prebuild"])
def test_a_line_without_a_seed_is_rendered_and_stored_under_the_cache_seed(tmp_path, name):
    fake = FakeSynth(steps=1, step_s=0.0)
    with PhraseCache(tmp_path / "c") as pc:
        CALLERS[name](pc, fake, "種なし", options=SynthesisOptions())
        (entry,) = pc.entries()
        assert [c.options.seed for c in fake.calls if c.kind != "prewarm"] == [DEFAULT_SEED]
        assert entry.key == CachedRender(pc, fake, source="t").slot("種なし", None, None).key
    # not stored: rendered with the caller's options, random seed and all
    fake2 = FakeSynth(steps=1, step_s=0.0)
    with PhraseCache(tmp_path / "d") as pc:
        via_cached_synth(pc, fake2, "種なし", store="prebuilt", options=SynthesisOptions())
        assert [c.options.seed for c in fake2.calls] == [None]


def test_a_store_that_fails_costs_the_speaker_nothing_and_is_an_error_for_render_and_prebuild(tmp_path):
    fake = FakeSynth(steps=1, step_s=0.0, seconds_per_char=0.2)
    with PhraseCache(tmp_path / "c", max_bytes=1000) as pc:  # no line fits
        text = "入りきらない長い台詞です"
        assert via_speaker(pc, fake, text) is not None
        assert len(via_cached_synth(pc, fake, text)) == fake.samples_for(text)
        with pytest.raises(CacheError, match="does not fit"):
            via_render(pc, fake, text)
        report = prebuild(fake, pc, [text], options=OPTS)
        assert len(report.failed) == 1 and "does not fit" in report.failed[0].error
        assert pc.entries() == []


def test_store_policy_words_are_one_vocabulary():
    assert [p.value for p in StorePolicy] == ["prebuilt", "marked", "seeded", "all"]
    assert StorePolicy.parse("marked").stores(True) and not StorePolicy.parse("marked").stores(None)
    assert StorePolicy.ALL.stores(None) and not StorePolicy.ALL.stores(False)
    assert not StorePolicy.PREBUILT.stores(True)
    # "seeded" (the server's): a line with a seed of its own, whatever its mark
    assert StorePolicy.SEEDED.stores(None, SynthesisOptions(seed=2))
    assert not StorePolicy.SEEDED.stores(True, SynthesisOptions())
