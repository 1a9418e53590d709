"""Issue 30, tags and pause markup as hostile input: a line that is only a tag or only markup
is skipped (never failed), and unclosed pause markup (chat, an LLM stream cut inside a tag) is
dropped the same way on every path: what is said, what captions show, what the stream
segmenter emits, with `pause_markup` on or off. Each case bounds its cost in CPU time and ends
with the module's Speaker speaking a normal line (tests/hostile.py)."""

from __future__ import annotations

import pytest

from hostile import cpu_bound, one_line, run, speaks_normally
from irodori_speaker.speaker import UtteranceState
from irodori_speaker.synthesis.plan import caption_source, spoken_parts
from irodori_speaker.text.pauses import Pause, markup_spans, split_pauses, strip_markup
from irodori_speaker.text.segment import StreamSegmenter

pytestmark = pytest.mark.timeout(120)

# ---- 5: nothing to say is skipped -------------------------------------------------------------

NOTHING = {
    "emotion tag": ("[happy]", {}),
    "two tags": ("[happy] [sad]", {}),
    "stage word": ("（笑）", {}),
    "pause, markup off": ("[pause:1]", {"pause_markup": False}),
    "break, markup off": ('<break time="10s"/>', {"pause_markup": False}),
    "unclosed markup": ("[pause:0.5", {}),
    "tag and unclosed": ("[happy][pause:0.", {}),
    "url dropped": ("https://example.com/x", {"urls": "drop"}),
}


@pytest.mark.parametrize(("text", "line"), list(NOTHING.values()), ids=list(NOTHING))
def test_a_line_with_nothing_to_say_is_skipped_not_failed(hostile_loop, hostile_speaker, text, line) -> None:
    """Issue 30: `enqueue("[happy]")` ended FAILED with an InputError (the same line with a tag
    map ended SKIPPED); `enqueue("[pause:1]", pause_markup=False)` likewise."""

    async def case():
        with cpu_bound(1.0):
            h = hostile_speaker.enqueue(text, **line)
        await h
        assert h.state == UtteranceState.SKIPPED, (h.state, h.error)
        await speaks_normally(hostile_speaker)

    run(hostile_loop, case())


def test_a_line_of_valid_pauses_is_still_silence(hostile_loop, hostile_speaker) -> None:
    async def case():
        h = await hostile_speaker.say("[pause:0.3]", cache=False)
        assert h.state == UtteranceState.PLAYED, (h.state, h.error)
        await speaks_normally(hostile_speaker)

    run(hostile_loop, case())


# ---- 7: unclosed pause markup ------------------------------------------------------------------

UNCLOSED = {
    "pause, mid-line": ("こんにちは[pause:0.5テスト", "こんにちはテスト"),
    "break, mid-line": ('こんにちは<break time="500ms"テスト', "こんにちはテスト"),
    "cut at the end": ("こんにちは[pause:0.", "こんにちは"),
    "break cut at the end": ('こんにちは<break time="5', "こんにちは"),
    "bare opener": ("こんにちは<breakテスト", "こんにちはテスト"),
    "before a tag": ("こんにちは[pause:1[happy]テスト", "こんにちは[happy]テスト"),
    "upper case": ("こんにちは[PAUSE : 2sテスト", "こんにちはテスト"),
}


@pytest.mark.parametrize(("text", "shown"), list(UNCLOSED.values()), ids=list(UNCLOSED))
def test_unclosed_markup_is_dropped_the_same_way_everywhere(synth, text, shown) -> None:
    """Issue 30: `こんにちは[pause:0.5テスト` was read `[ポーズ:0.5テスト`."""
    opts = synth.resolve_options(None)
    with cpu_bound(2.0):
        assert split_pauses(text) == [shown]  # no pause, no error
        assert strip_markup(text) == shown  # pause_markup=False
        assert caption_source(text, opts.replace(tags="keep")) == shown  # captions
        said = spoken_parts(text, opts)
        assert said == spoken_parts(shown, opts)
        assert said == spoken_parts(text, opts.replace(pause_markup=False))
        assert not any("ポーズ" in p or "ブレイク" in p for p in said if isinstance(p, str))
        # the stream segmenter: whatever the chunking, the segments say the same
        seg = StreamSegmenter()
        out = [s for ch in text for s in seg.feed(ch)] + seg.flush()
        assert "".join(strip_markup(s) for s in out) == shown.replace(" ", "")


def test_fifty_unclosed_pauses_are_not_100_seconds_of_audio(synth, hostile_loop, hostile_speaker) -> None:
    """Issue 30: 50 unclosed `[pause:0.5` in a line gave 100 s of audio (read as text)."""
    text = "はい" + "[pause:0.5" * 50 + "どうぞ"
    with cpu_bound(2.0):
        assert spoken_parts(text, synth.resolve_options(None)) == spoken_parts("はいどうぞ", None)
        assert len(markup_spans(text)) == 50

    async def case():
        h = await hostile_speaker.say(text, cache=False)
        assert h.state == UtteranceState.PLAYED, (h.state, h.error)
        assert h.record.pieces == 1 and len(h.audio) < 48_000 * 3
        await speaks_normally(hostile_speaker)

    run(hostile_loop, case())


def test_closed_but_invalid_markup_stays_an_input_error(synth) -> None:
    """What docs/voices.md promises for the bot's own text: `[pause:abc]` is named, not guessed."""
    from irodori_speaker.errors import InputError

    with pytest.raises(InputError, match="pause:abc"):
        split_pauses("はい[pause:abc]どうぞ")
    assert split_pauses("はい[pause:0.5]どうぞ") == ["はい", Pause(0.5), "どうぞ"]


BAD_TAG_MAPS = {
    "missing voice file": ({"happy": {"voice": "nope.wav"}}, "no such file"),
    "empty name": ({"": {"text": "x"}}, "not a tag a line can carry"),
    "name no line can carry": ({"two words": {"text": "x"}}, "not a tag a line can carry"),
    "name not a string": ({5: {"text": "x"}}, "not a tag a line can carry"),
    "voice of a wrong type": ({"happy": {"voice": 3}}, "must be a Voice or a path"),
}


@pytest.mark.parametrize(("tags", "said"), list(BAD_TAG_MAPS.values()), ids=list(BAD_TAG_MAPS))
def test_a_bad_tag_map_is_refused_when_the_speaker_is_built(
    hostile_loop, hostile_speaker, tags, said
) -> None:
    """Issue 30 item 9: `tags={"happy": {"voice": "nope.wav"}}` built, then every [happy] line
    failed; `tags={"": ...}` was accepted. Both are one InputError when the Speaker is made (no
    model work), and the module's Speaker speaks on."""
    from irodori_speaker import InputError, Speaker

    with cpu_bound(1.0), pytest.raises(InputError) as err:
        Speaker(output="null", tags=tags)
    assert said in one_line(err.value)
    run(hostile_loop, speaks_normally(hostile_speaker))
