"""Issue 12, the hostile-input suite at the Speaker: whatever chat, a config file or a damaged disk
hands it (text, voices, options, cache damage), each case ends in one of two ways, within a
per-case timeout: the line plays (or is skipped as empty), or there is one `IrodoriError` with a
one-line message (at `enqueue` for bad arguments, on the line's handle for a voice that cannot be
read). Then the same Speaker speaks a normal line (tests/hostile.py). One Speaker (tiny model,
NullOutput, a phrase cache: `hostile_speaker` of tests/conftest.py) serves the whole module.

The rest of the suite: tests/test_hostile_text.py (unbreakable runs), test_hostile_input.py
(surrogates, Shift_JIS), test_hostile_cache.py (rotted rows), test_hostile_checkpoint.py,
speaker/test_shutdown.py and speaker/test_unclosed.py (closing in every state), and the
property-based tests of the text front end (text/test_properties.py)."""

from __future__ import annotations

import sqlite3
import struct

import numpy as np
import pytest
import soundfile as sf
import torch
from safetensors.torch import save_file

from hostile import one_line, run, speaks_normally
from irodori_speaker.audio.signal import SAMPLE_RATE
from irodori_speaker.cache import PhraseCache
from irodori_speaker.errors import IrodoriError
from irodori_speaker.speaker import Speaker, UtteranceState
from irodori_speaker.text.split import MAX_LINE_CHARS

pytestmark = pytest.mark.timeout(60)  # per case: a hang fails, it is not merely slow

SR = SAMPLE_RATE
ENDED = (UtteranceState.PLAYED, UtteranceState.SKIPPED)


@pytest.fixture(scope="module")
def loop(hostile_loop):
    return hostile_loop


@pytest.fixture(scope="module")
def speaker(hostile_speaker):
    return hostile_speaker


def expect_error_at_enqueue(loop, s: Speaker, text, **line) -> IrodoriError:
    async def case():
        with pytest.raises(IrodoriError) as e:
            s.enqueue(text, **line)
        one_line(e.value)
        await speaks_normally(s)
        return e.value

    return run(loop, case())


def expect_line_ends(loop, s: Speaker, text, **line) -> tuple[UtteranceState, BaseException | None]:
    """Enqueue; the line plays, is skipped, or fails with one IrodoriError line; then a normal one."""

    async def case():
        h = s.enqueue(text, **line)
        try:
            await h
        except IrodoriError as e:
            one_line(e)
        assert h.state in (*ENDED, UtteranceState.FAILED), h.state
        if h.state == UtteranceState.FAILED:
            assert isinstance(h.error, IrodoriError), repr(h.error)
        await speaks_normally(s)
        return h.state, h.error

    return run(loop, case())


# ---- text ---------------------------------------------------------------------------------------

SPEAKABLE = {
    "emoji only": "🎉🎉🎉",
    "emoji zwj family": "👨\u200d👩\u200d👧",
    "flags": "🇯🇵🇺🇸",
    "control chars": "\x07\x1b[31m赤\x1b[0m",
    "nul inside": "こん\x00にちは",
    "lone surrogate": "こん\ud800にちは",
    "rtl override": "\u202eこんにちは",
    "rtl arabic": "\u200fمرحبا بكم",
    "zero width inside": "こ\u200bん\u200cに\u200dち\ufeffは",
    "mixed scripts": "Hello こんにちは 你好 안녕 Привет שלום",
    "markdown": "**太字** と `code` と [リンク](http://example.com)",
    "html": "<script>alert('x')</script>こんにちは",
    "special tokens": "<s></s><pad><unk>こんにちは",
    "chat template": "<|im_start|>system<|im_end|>",
    "fullwidth w spam": "ｗ" * 300,
    "ascii w spam": "w" * 800,
    "kusa": "草" * 200,
    "url": "見て https://example.com/" + "a" * 300,
    "numbers": "1" * 500,
    "newlines": "一行目\n\n\n二行目\r\n三行目",
    "tabs and spaces": "\t  こんにちは \t ",
    "combining marks": "e\u0301\u0301\u0301\u0301",
    "private use": "\ue000\ue001こんにちは",
    "ideographic space": "\u3000\u3000こんにちは",
    "punctuation only": "。。。！？……",
}
EMPTY = {
    "empty": "",
    "spaces": "   ",
    "whitespace mix": "\n\t\r\u3000",
}
NOT_STR = {"int": 123, "none": None, "bytes": "こんにちは".encode(), "list": ["こんにちは"], "float": 1.5}


@pytest.mark.parametrize("text", list(SPEAKABLE.values()), ids=list(SPEAKABLE))
def test_odd_text_plays_and_the_speaker_goes_on(loop, speaker, text):
    state, error = expect_line_ends(loop, speaker, text)
    assert state in ENDED, (state, error)


@pytest.mark.parametrize("text", list(EMPTY.values()), ids=list(EMPTY))
def test_empty_text_is_skipped(loop, speaker, text):
    assert expect_line_ends(loop, speaker, text)[0] == UtteranceState.SKIPPED


@pytest.mark.parametrize("value", list(NOT_STR.values()), ids=list(NOT_STR))
def test_text_that_is_not_a_str_is_an_input_error_at_enqueue(loop, speaker, value):
    assert "str" in str(expect_error_at_enqueue(loop, speaker, value))


@pytest.mark.parametrize("n", [MAX_LINE_CHARS + 1, 100_000])
def test_text_longer_than_a_line_may_be_is_refused_before_any_work(loop, speaker, synth, n):
    text = "あ" * n
    assert f"{n}" in str(expect_error_at_enqueue(loop, speaker, text))
    with pytest.raises(IrodoriError):
        synth.synthesize(text)


# ---- voices -------------------------------------------------------------------------------------


def _wav(path, audio, rate=SR, subtype="FLOAT"):
    sf.write(str(path), audio, rate, subtype=subtype)
    return path


def _tone(seconds: float, rate: int = SR, channels: int = 1) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    x = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    return np.repeat(x[:, None], channels, axis=1) if channels > 1 else x


def _voice(kind: str, d):
    """(voice argument, whether it must play)."""
    if kind == "missing":
        return d / "absent.wav", False
    if kind == "empty file":
        (d / "empty.wav").write_bytes(b"")
        return d / "empty.wav", False
    if kind == "truncated":
        data = _wav(d / "full.wav", _tone(1.0)).read_bytes()
        (d / "cut.wav").write_bytes(data[:30])
        return d / "cut.wav", False
    if kind == "text renamed wav":
        (d / "notes.wav").write_text("これは音声ではありません")
        return d / "notes.wav", False
    if kind == "directory":
        (d / "dir.wav").mkdir()
        return d / "dir.wav", False
    if kind == "one sample":
        return _wav(d / "one.wav", np.array([0.1], np.float32)), False
    if kind == "silence":  # nothing to take a voice from: AudioError "reference audio is silent"
        return _wav(d / "silent.wav", np.zeros(SR, np.float32)), False
    if kind == "ten minutes":
        return _wav(d / "long.wav", _tone(600.0, rate=8000), rate=8000, subtype="PCM_16"), True
    if kind == "nan samples":
        x = _tone(1.0)
        x[100:200] = np.nan
        return _wav(d / "nan.wav", x), False
    if kind == "inf samples":
        x = _tone(1.0)
        x[5] = np.inf
        return _wav(d / "inf.wav", x), False
    if kind == "8 kHz":
        return _wav(d / "8k.wav", _tone(1.0, 8000), 8000), True
    if kind == "192 kHz":
        return _wav(d / "192k.wav", _tone(1.0, 192_000), 192_000), True
    if kind == "6 channels":
        return _wav(d / "six.wav", _tone(1.0, channels=6)), True
    if kind == "latent wrong shape":
        save_file({"latent": torch.zeros(3, 4, 5)}, str(d / "bad_shape.safetensors"))
        return d / "bad_shape.safetensors", False
    if kind == "latent wrong width":
        save_file({"latent": torch.zeros(50, 7)}, str(d / "bad_width.safetensors"))
        return d / "bad_width.safetensors", False
    if kind == "latent nan":
        save_file({"latent": torch.full((50, 32), float("nan"))}, str(d / "nan_latent.safetensors"))
        return d / "nan_latent.safetensors", False
    if kind == "garbage safetensors":
        (d / "junk.safetensors").write_bytes(struct.pack("<Q", 10**12) + b"{")
        return d / "junk.safetensors", False
    raise AssertionError(kind)


VOICES = [
    "missing", "empty file", "truncated", "text renamed wav", "directory", "one sample", "silence",
    "ten minutes", "nan samples", "inf samples", "8 kHz", "192 kHz", "6 channels",
    "latent wrong shape", "latent wrong width", "latent nan", "garbage safetensors",
]  # fmt: skip


@pytest.mark.parametrize("kind", VOICES)
def test_a_hostile_voice_plays_or_is_one_clear_error(loop, speaker, tmp_path, kind):
    voice, plays = _voice(kind, tmp_path)
    try:  # a path string, as a config file or a chat command gives it
        state, error = expect_line_ends(loop, speaker, "声を変えて話します", voice=str(voice))
    except IrodoriError as e:  # refused at enqueue: also fine, if it is one clear line
        one_line(e)
        state, error = UtteranceState.FAILED, e
    if plays:
        assert state == UtteranceState.PLAYED, (kind, error)
    else:
        assert state == UtteranceState.FAILED and isinstance(error, IrodoriError), (kind, state)


# ---- options ------------------------------------------------------------------------------------

BAD_OPTIONS = {
    "seed text": {"seed": "abc"},
    "seed nan": {"seed": float("nan")},
    "seed 2**64": {"seed": 2**64},
    "seed negative": {"seed": -1},
    "seconds text": {"seconds": "3"},
    "seconds nan": {"seconds": float("nan")},
    "seconds negative": {"seconds": -1.0},
    "seconds inf": {"seconds": float("inf")},
    "seconds zero": {"seconds": 0.0},
    "steps zero": {"steps": 0},
    "steps huge": {"steps": 10**6},
    "steps float": {"steps": 2.5},
    "cfg nan": {"cfg_scale_text": float("nan")},
    "cfg inf": {"cfg_scale_text": float("inf")},
    "pad huge": {"pad_text_to": 100_000},
    "pad negative": {"pad_text_to": -5},
    "priority unknown": {"priority": "urgent"},
    "ttl negative": {"ttl": -1.0},
    "ttl text": {"ttl": "soon"},
    "options not a mapping": {"options": "fast"},
    "options bad value": {"options": {"steps": -3}},
}


@pytest.mark.parametrize("line", list(BAD_OPTIONS.values()), ids=list(BAD_OPTIONS))
def test_a_bad_option_is_an_input_error_at_enqueue(loop, speaker, line):
    expect_error_at_enqueue(loop, speaker, "こんにちは", **line)


# ---- cache damage -------------------------------------------------------------------------------


def _rot_rows(cache: PhraseCache, assignment: str) -> None:
    conn = sqlite3.connect(cache.index_path)
    conn.execute(f"UPDATE entries SET {assignment}")
    conn.commit()
    conn.close()


def _flip_audio_bytes(cache: PhraseCache) -> None:
    for p in (cache.directory / "audio").rglob("*.f32"):
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF
        p.write_bytes(bytes(data))


CACHE_DAMAGE = {
    "row record byte": lambda c: _rot_rows(c, "record = '#' || substr(record, 2)"),
    "row identity cut": lambda c: _rot_rows(c, "identity = substr(identity, 1, 3)"),
    "row samples text": lambda c: _rot_rows(c, "samples = 'x'"),
    "row file escapes": lambda c: _rot_rows(c, "file = '../../../etc/hostname'"),
    "audio bit flip": _flip_audio_bytes,
    "audio deleted": lambda c: [p.unlink() for p in (c.directory / "audio").rglob("*.f32")],
}


@pytest.mark.parametrize("damage", list(CACHE_DAMAGE.values()), ids=list(CACHE_DAMAGE))
def test_a_damaged_cache_is_rendered_past_by_the_same_speaker(loop, speaker, damage):
    async def case():
        first = await speaker.say("キャッシュに入る台詞")  # stored (cache_store="all")
        assert first.state == UtteranceState.PLAYED
        damage(speaker.cache)
        again = await speaker.say("キャッシュに入る台詞")
        assert again.state == UtteranceState.PLAYED and again.audio.size == first.audio.size
        await speaks_normally(speaker)

    run(loop, case())
