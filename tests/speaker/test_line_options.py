"""One list of per-line options for enqueue / say / feed / say_stream / enqueue_threadsafe, and
the Speaker's explicit loading options: a misspelt name fails where it is given, with its name."""

from __future__ import annotations

import asyncio
import threading

import pytest
from speaker_fakes import FakeSynth

from irodori_speaker import LineOptions, LoadOptions, Priority
from irodori_speaker.errors import BackendError, InputError
from irodori_speaker.options import SynthesisOptions
from irodori_speaker.outputs import NullOutput
from irodori_speaker.speaker import Speaker, UtteranceState


def fast() -> NullOutput:
    return NullOutput(speed=float("inf"))


async def chunks(parts):
    for p in parts:
        await asyncio.sleep(0)
        yield p


# ---- the Speaker's constructor ----------------------------------------------------------------


def test_a_misspelt_constructor_option_is_a_type_error_naming_it():
    with pytest.raises(
        TypeError, match=r"unexpected keyword argument 'lookahed_lines'; did you mean 'lookahead_lines'"
    ):
        Speaker(FakeSynth(), lookahed_lines=3)
    with pytest.raises(TypeError, match="'spede'"):
        Speaker(spede=1.2)


def test_a_sound_card_given_as_the_torch_device_points_to_output():
    with pytest.raises(BackendError) as e:
        Speaker(device="CABLE Input")
    assert "not a torch device" in str(e.value) and "output=" in (e.value.hint or "")
    assert "\n" not in str(e.value)
    Speaker(device="cuda:1", tiny_random=True)  # a torch device: checked for existence at load


def test_loading_options_are_one_value_given_by_name_or_whole():
    s = Speaker(tiny_random=True, backend="cpu", preset={"prewarm_seconds": 3.0})
    want = LoadOptions(tiny_random=True, backend="cpu", preset={"prewarm_seconds": 3.0})
    assert s._load_options == want
    assert Speaker(load=want)._load_options == want
    assert Speaker(load=want, backend="cuda")._load_options == want.replace(backend="cuda")  # names win
    with pytest.raises(InputError, match="a synthesizer and loading options"):
        Speaker(FakeSynth(), backend="cpu")
    with pytest.raises(InputError, match="a synthesizer and loading options"):
        Speaker(FakeSynth(), load=LoadOptions(model="v4"))
    assert Speaker(FakeSynth(), load=LoadOptions())._load_options is None


def test_preset_fields_and_cache_dir_are_not_loading_options():
    with pytest.raises(TypeError, match=r"'prewarm_seconds'; preset fields go in preset=\{'prewarm_seconds'"):
        Speaker(tiny_random=True, backend="cpu", prewarm_seconds=3.0)
    with pytest.raises(TypeError, match=r"'cache_dir'; did you mean cache= .* or model_dir="):
        Speaker(cache_dir="phrases")


# ---- one list of line options -----------------------------------------------------------------


def test_line_options_parse_own_fields_and_synthesis_overrides():
    line = LineOptions.parse({"priority": "high", "ttl": 5, "seed": 3, "steps": 2}, "say")
    assert (line.priority, line.ttl, dict(line.overrides)) == (Priority.HIGH, 5.0, {"seed": 3, "steps": 2})
    assert line.synthesis_options(SynthesisOptions(seed=1, seconds=1.0)) == SynthesisOptions(
        seed=3, steps=2, seconds=1.0
    )
    assert LineOptions.parse({}).synthesis_options(None) is None
    with pytest.raises(
        TypeError, match=r"say\(\) got an unexpected keyword argument 'sed'; did you mean 'seed'"
    ):
        LineOptions.parse({"sed": 3}, "say")
    with pytest.raises(InputError, match="option seed must be an integer"):
        LineOptions.parse({"seed": "abc"})
    with pytest.raises(InputError, match="cache must be True, False or None"):
        LineOptions(cache="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("method", ["enqueue", "say", "feed", "say_stream", "enqueue_threadsafe"])
def test_every_line_call_refuses_a_misspelt_option_and_keeps_speaking(run, method):
    async def body():
        async with Speaker(FakeSynth(), output=fast()) as s:
            call = {
                "enqueue": lambda **kw: s.enqueue("はい。", **kw),
                "say": lambda **kw: s.say("はい。", **kw),
                "feed": lambda **kw: s.feed("はい。", **kw),
                "say_stream": lambda **kw: s.say_stream(["はい。"], **kw),
                "enqueue_threadsafe": lambda **kw: s.enqueue_threadsafe("はい。", **kw),
            }[method]
            with pytest.raises(
                TypeError, match=f"{method}\\(\\) got an unexpected keyword argument 'priorty'"
            ):
                await _maybe(call(priorty="high"))
            with pytest.raises(InputError, match="option seed must be"):
                await _maybe(call(seed=float("nan")))
            return await s.say("次の行です。")

    assert run(body()).state == UtteranceState.PLAYED


async def _maybe(x):
    return await x if asyncio.iscoroutine(x) else x


def test_per_line_overrides_reach_the_synthesizer(run):
    fake = FakeSynth()

    async def body():
        async with Speaker(fake, output=fast(), options={"seed": 1, "steps": 4}) as s:
            await s.say("一つ目。", seed=3)
            await s.say("二つ目。")
            await s.say_stream(chunks(["三つ", "目。"]), seed=5, priority="high")
            await s.say("四つ目。", options={"steps": 2}, seed=6)

    run(body())
    got = {c.text: c.options for c in fake.calls if c.kind != "prewarm"}
    assert got["一つ目。"] == SynthesisOptions(seed=3, steps=4)
    assert got["二つ目。"] == SynthesisOptions(seed=1, steps=4)
    assert got["三つ目。"] == SynthesisOptions(seed=5, steps=4)
    assert got["四つ目。"] == SynthesisOptions(seed=6, steps=2)  # options= replaces the Speaker's


def test_say_stream_and_feed_skip_none_chunks_and_take_cache(run, tmp_path):
    fake = FakeSynth()

    async def body():
        async with Speaker(fake, output=fast(), cache=tmp_path / "phrases") as s:
            first = await s.say_stream(chunks([None, "いらっしゃい", None, "ませ。"]), cache=True)
            assert [h.state for h in first] == [UtteranceState.PLAYED]
            calls = len(fake.calls)
            again = await s.say_stream(chunks(["いらっしゃい", "ませ。", None]), cache=True)
            assert len(fake.calls) == calls  # stored by the first turn, a hit now: no model work
            assert again[0].record.extra["cache"]["hit"] is True
            assert s.feed(None) == []
            s.feed("はい、", cache=False)
            s.feed(None)
            handles = s.feed("どうぞ。")
            handles += s.end_feed()
            await asyncio.gather(*handles)
            return handles

    handles = run(body())
    assert "".join(h.text for h in handles) == "はい、どうぞ。"
    assert all(h.state == UtteranceState.PLAYED for h in handles)


def test_enqueue_threadsafe_raises_a_misspelt_option_in_the_calling_thread(run):
    async def body():
        async with Speaker(FakeSynth(), output=fast()) as s:
            errors: list[BaseException] = []

            def reader():
                try:
                    s.enqueue_threadsafe("はい。", sedd=1)
                except TypeError as e:
                    errors.append(e)

            t = threading.Thread(target=reader)
            t.start()
            await asyncio.to_thread(t.join)
            fut = s.enqueue_threadsafe("はい。", seed=2)
            utt = await asyncio.wrap_future(fut)
            await utt
            return errors, utt

    errors, utt = run(body())
    assert len(errors) == 1 and "sedd" in str(errors[0])
    assert utt.options == SynthesisOptions(seed=2) and utt.state == UtteranceState.PLAYED
