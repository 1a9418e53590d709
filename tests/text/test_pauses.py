"""Pause markup (issue 16): parsed, never read as text, exact silence in synthesize, stream,
Speaker.say and LLM streams whose markup arrives over two chunks."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from irodori_speaker.audio.signal import SAMPLE_RATE
from irodori_speaker.errors import InputError
from irodori_speaker.text.pauses import Pause, canonical, partial_markup_start, split_pauses
from irodori_speaker.text.segment import StreamSegmenter

SR = SAMPLE_RATE


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("こんにちは", ["こんにちは"]),
        ('あ<break time="500ms"/>い', ["あ", Pause(0.5), "い"]),
        ("あ<break time='1s'/>い", ["あ", Pause(1.0), "い"]),
        ('あ< BREAK time = "1.5s" / >い', ["あ", Pause(1.5), "い"]),
        ("あ[pause:0.25]い", ["あ", Pause(0.25), "い"]),
        ("あ[ Pause : 300ms ]い", ["あ", Pause(0.3), "い"]),
        ("[pause:1]あ[pause:0.5][pause:0.5]", [Pause(1.0), "あ", Pause(1.0)]),
        ("[happy]あ<b>い", ["[happy]あ<b>い"]),  # other brackets are not pauses
    ],
)
def test_split_pauses(text, want):
    assert split_pauses(text) == want


@pytest.mark.parametrize(
    "text",
    [
        '<break time="x"/>',
        "<break/>",
        "[pause:]",
        "[pause:abc]",
        "[pause:11]",
        '<break time="5m"/>',
        "[pause:6][pause:5]",
    ],
)
def test_bad_markup_is_a_clear_error_not_text(text, synth):
    with pytest.raises(InputError, match="pause") as e:
        split_pauses("あ" + text)
    assert e.value.hint and "break time" in e.value.hint
    with pytest.raises(InputError, match="pause"):
        synth.synthesize("あ" + text, options={"seed": 0})


def test_partial_markup_start():
    for text, at in (
        ("です<", 2),
        ("です<bre", 2),
        ('です<break time="1', 2),
        ("です[pa", 2),
        ("です[pause:0.", 2),
        ("です<b>", None),
        ("です[happy", None),
        ('です<break time="1s"/>', None),
        ("です", None),
    ):
        assert partial_markup_start(text) == at, text


@pytest.fixture
def tokenized(synth, monkeypatch) -> list[str]:
    """Every text the model's tokenizer is given from now on (what the model reads)."""
    seen: list[str] = []
    real = synth.tokenizer.batch

    def spy(texts, **kw):
        seen.extend(texts)
        return real(texts, **kw)

    monkeypatch.setattr(synth.tokenizer, "batch", spy)
    return seen


def test_markup_never_reaches_the_model(synth, tokenized):
    seen = tokenized
    res = synth.synthesize('こんにちは<break time="200ms"/>元気？[pause:0.1]はい', options={"seed": 0})
    assert len(seen) == 3 and res.record.pieces == 3
    assert not any(mark in t for t in seen for mark in ("<", ">", "[", "]", "break", "pause", "ms"))
    assert "break" not in res.record.text and "pause" not in res.record.text


def _silence_between(synth, markup: str, gap_samples: int) -> None:
    a = synth.synthesize("こんにちは", options={"seed": 3}).audio
    b = synth.synthesize("さようなら", options={"seed": 3}).audio
    res = synth.synthesize(f"こんにちは{markup}さようなら", options={"seed": 3})
    out = res.audio
    assert len(out) == len(a) + gap_samples + len(b) == res.record.samples
    assert not out[len(a) : len(a) + gap_samples].any()
    # the pieces are the lines rendered alone, up to the 8 ms fade at the cut
    fade = int(0.008 * SR)
    np.testing.assert_array_equal(out[: len(a) - fade], a[: len(a) - fade])
    np.testing.assert_array_equal(out[len(a) + gap_samples + fade :], b[fade:])
    streamed = np.concatenate(list(synth.stream(f"こんにちは{markup}さようなら", options={"seed": 3})))
    np.testing.assert_array_equal(streamed, out)


@pytest.mark.parametrize(
    ("markup", "samples"),
    [('<break time="500ms"/>', 24_000), ("[pause:0.25]", 12_000), ('<break time="1s"/>', 48_000)],
)
def test_pause_is_exact_silence(synth, markup, samples):
    _silence_between(synth, markup, samples)


def test_leading_and_trailing_pauses_and_a_line_of_only_pauses(synth):
    plain = synth.synthesize("はい", options={"seed": 1}).audio
    res = synth.synthesize("[pause:0.1]はい[pause:0.2]", options={"seed": 1, "pre_silence": 0.05})
    assert len(res.audio) == 2_400 + 4_800 + len(plain) + 9_600
    np.testing.assert_array_equal(res.audio[7_200 : 7_200 + len(plain)], plain)
    only = synth.synthesize("[pause:0.3]", options={"seed": 1})
    assert len(only.audio) == 14_400 and not only.audio.any() and only.record.pieces == 0


def test_identity_has_pauses_in_one_spelling():
    assert canonical(0.5) == '<break time="500ms"/>' and canonical(1.25) == '<break time="1250ms"/>'


# ---- LLM streams --------------------------------------------------------------------------------


def segments(chunks, stall_after=None):
    sg = StreamSegmenter()
    out = []
    for i, chunk in enumerate(chunks):
        out += sg.feed(chunk)
        if stall_after == i:
            out += sg.flush(final=False)
    return out + sg.flush()


@pytest.mark.parametrize("stall", [None, 0])
def test_markup_split_over_chunks_stays_whole(stall):
    for chunks in (
        ["こんにちは<bre", 'ak time="500ms"/>さようなら。'],
        ["こんにちは<break time=", '"500ms"/>さようなら。'],
        ["こんにちは[pau", "se:0.5]さようなら。"],
        ["こんにちは[pause:0.", "5]さようなら。"],
    ):
        segs = segments(chunks, stall)
        joined = "".join(segs)
        assert (
            joined.replace("[pause:0.5]", '<break time="500ms"/>')
            == 'こんにちは<break time="500ms"/>さようなら。'
        )
        for seg in segs:  # every segment's markup is whole
            split_pauses(seg)


def test_a_pause_alone_goes_with_the_next_segment():
    assert segments(["今日はいい天気ですね。[pause:1]", "明日も晴れるかな。"]) == [
        "今日はいい天気ですね。",
        "[pause:1]明日も晴れるかな。",
    ]
    # a segment is not cut inside the markup, even at a "." that would end a sentence
    assert segments(["あいうえおかきくけこ[pause:.5]さしすせそ。"]) == [
        "あいうえおかきくけこ[pause:.5]さしすせそ。"
    ]


def test_say_stream_with_markup_over_two_chunks_gives_exact_silence(synth):
    from irodori_speaker.speaker import Speaker

    async def llm():
        for chunk in ("こんにちは<break ti", 'me="500ms"/>さようなら。'):
            yield chunk

    async def body():
        async with Speaker(synth, output="null", prewarm=False, seed=3) as s:
            hs = await s.say_stream(llm())
            await asyncio.gather(*hs)
            said = await s.say('こんにちは<break time="500ms"/>さようなら。')
            return hs, said

    hs, said = asyncio.run(asyncio.wait_for(body(), 120))
    assert len(hs) == 1 and hs[0].text == 'こんにちは<break time="500ms"/>さようなら。'
    np.testing.assert_array_equal(hs[0].audio, said.audio)
    a = synth.synthesize("こんにちは", options={"seed": 3}).audio
    assert not said.audio[len(a) : len(a) + 24_000].any()


# ---- the bound and the switch (chat text) -------------------------------------------------------


def test_pauses_up_to_the_bound_are_allowed_and_over_it_are_an_error_not_clamped():
    assert split_pauses("あ[pause:10]い") == ["あ", Pause(10.0), "い"]
    assert split_pauses('あ[pause:6]<break time="4000ms"/>い') == ["あ", Pause(10.0), "い"]
    with pytest.raises(InputError, match=r"longer than 10 s") as e:
        split_pauses('あ<break time="10.5s"/>い')
    assert "pre_silence" in e.value.hint
    with pytest.raises(InputError, match=r"add up to 12 s"):
        split_pauses("あ[pause:6][pause:6]い")


CHAT = 'こんにちは<break time="10s"/>[pause:9]さようなら<break time="nonsense"/>[pause:99]'


def test_pause_markup_off_takes_every_markup_out_and_reads_none_of_it(synth, tokenized):
    seen = tokenized
    off = {"seed": 2, "pause_markup": False}
    assert synth.spoken_text(CHAT, off) == synth.spoken_text("こんにちはさようなら")
    res = synth.synthesize(CHAT, options=off)  # invalid or too long markup: no error either
    plain = synth.synthesize("こんにちはさようなら", options={"seed": 2})
    np.testing.assert_array_equal(res.audio, plain.audio)  # no silence, nothing read
    assert len(seen) == 2 and seen[0] == seen[1] and "break" not in seen[0]
    # the same line as its plain text in the phrase cache: one entry for both
    assert synth.render_identity(CHAT, None, off) == synth.render_identity("こんにちはさようなら", None, off)
    with pytest.raises(InputError, match="pause"):  # on (the default), the same text is refused
        synth.synthesize(CHAT, options={"seed": 2})
    with pytest.raises(InputError):  # only markup: nothing to say
        synth.synthesize("[pause:3]", options=off)


def test_pause_markup_off_per_speaker_and_per_line(synth):
    from irodori_speaker.speaker import Speaker

    line = "はい[pause:0.5]どうぞ"

    async def body():
        async with Speaker(synth, output="null", prewarm=False, seed=4, pause_markup=False) as s:
            chat = await s.say(line)
            bot = await s.say(line, pause_markup=True)
        return chat, bot

    chat, bot = asyncio.run(asyncio.wait_for(body(), 120))
    joined = synth.synthesize("はいどうぞ", options={"seed": 4}).audio
    np.testing.assert_array_equal(chat.audio, joined)
    a = synth.synthesize("はい", options={"seed": 4}).audio
    assert len(bot.audio) > len(a) + 24_000 and not bot.audio[len(a) : len(a) + 24_000].any()


def test_cli_no_pause_markup(tmp_path, irodori_home):
    import soundfile as sf

    from irodori_speaker import cli

    out, plain = tmp_path / "a.wav", tmp_path / "b.wav"
    base = ["--tiny-random", "--backend", "cpu", "--seed", "1"]
    assert cli.main(["say", "はい[pause:2]どうぞ", "-o", str(out), *base, "--no-pause-markup"]) == 0
    assert cli.main(["say", "はいどうぞ", "-o", str(plain), *base]) == 0
    np.testing.assert_array_equal(sf.read(out, dtype="float32")[0], sf.read(plain, dtype="float32")[0])
