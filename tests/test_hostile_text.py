"""Issue 12, hangs: chat text the splitter cannot cut (spam, floods, long URLs) must come back as
a bounded number of pieces within the model's token limit, quickly; the module's Speaker plays the
line, and the same Speaker then speaks a normal line (tests/hostile.py). Each case runs under a
per-test timeout (a regression hangs, it would not merely be slow)."""

from __future__ import annotations

import numpy as np
import pytest

from hostile import real_audio, run, speaks_normally

HOSTILE = {
    "ascii word 5000": "a" * 5000,
    "url 400": "見て https://example.com/" + "x" * 400 + " だよ",
    "party emoji 70": "🎉" * 70,
    "ｗ 300": "ｗ" * 300,
    "family emoji 60": "👨\u200d👩\u200d👧" * 60,
    "flags 100": "🇯🇵" * 100,
    "spaced letters": "a " * 2000,
    "digits 3000": "1" * 3000,
    "mixed flood": ("草" * 50 + "w" * 200 + "😂" * 40) * 5,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("text", list(HOSTILE.values()), ids=list(HOSTILE))
def test_unbreakable_chat_text_becomes_bounded_pieces(
    synth, hostile_loop, hostile_speaker, text: str
) -> None:
    from irodori_speaker.speaker import UtteranceState

    max_len = synth.inference.max_text_len or 256
    for options in (None, {"seconds": 0.4}):  # a fixed length skips the first split: the re-split bounds it
        record = synth.stream(text, options=options).record  # text preparation only, no model work
        assert 1 <= record.pieces <= len(text) // 8 + 2, (options, record.pieces)
    pieces = synth._prepare_text(text, synth.resolve_options(None), type(record)())
    assert all(len(synth.tokenizer.encode(p.text)) <= max_len for p in pieces)

    async def case():
        h = await hostile_speaker.say(text, cache=False)
        assert h.state == UtteranceState.PLAYED, (h.state, h.error)
        real_audio(h.audio)
        await speaks_normally(hostile_speaker)

    run(hostile_loop, case())


@pytest.mark.timeout(120)
def test_the_same_synthesizer_speaks_a_spam_line_and_then_a_normal_one(synth) -> None:
    spam = synth.synthesize("ｗ" * 300, options={"seconds": None, "seed": 1})
    assert spam.audio.size > 0 and np.isfinite(spam.audio).all()
    normal = synth.synthesize("こんにちは。", options={"seed": 2})
    assert normal.audio.size > 0 and np.isfinite(normal.audio).all()
