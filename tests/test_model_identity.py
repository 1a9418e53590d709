"""The phrase-cache key without the weights (synthesis/identity.py) equals the loaded model's.

`model_identity(...)` reads the files' headers and hashes them; `load_synthesizer(...)` loads
them. Every tiny family, int4 (quantised at load, and an int4 file), a reference voice, a
caption, pauses, options that change the sound and options that do not: the same key.
"""

from __future__ import annotations

import contextlib

import pytest

from irodori_speaker.cache.keys import identity_key, line_identity
from irodori_speaker.engine.tiny import tiny_random_files
from irodori_speaker.errors import IrodoriError
from irodori_speaker.options import SynthesisOptions
from irodori_speaker.synthesis.identity import model_identity
from irodori_speaker.synthesis.loading import load_synthesizer
from irodori_speaker.synthesis.voices import Voice

LINES = [
    ("こんにちは！", SynthesisOptions(seed=0)),
    ("今日は3月5日です。[pause:0.5]またね", SynthesisOptions(seed=3, steps=2, seconds=0.8)),
    ("ありがとう", SynthesisOptions(seed=1, speed=1.2, cfg_scale_text=4.0, schedule="linear")),
]
CAPTIONED = ("v2-voicedesign", "v4", "v4.1-mf", "v4-large")


def keys(synth, voices) -> list[str]:
    return [identity_key(line_identity(synth, text, voice, opts)) for text, opts in LINES for voice in voices]


def voices_for(kind: str) -> list:
    voices = [None, Voice.sample()]
    if kind in CAPTIONED:
        voices += [Voice.sample(caption="明るく元気な声"), Voice.designed("落ち着いた低い声")]
    return voices


@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        ("v2", {}),
        ("v3", {}),
        ("v2-voicedesign", {}),
        ("v4", {}),
        ("v4.1-mf", {}),
        ("v4-large", {}),
        ("v2", {"int4": True}),  # a float file quantised at load: "int4" in the precision
    ],
)
def test_the_key_without_the_model_equals_the_loaded_models(irodori_home, kind, fields):
    load = dict(tiny_random=kind, backend="cpu", voice_cache_dir=False, **fields)
    ident = model_identity(**load)
    with pytest.warns(UserWarning, match="RTN at load") if fields else contextlib.nullcontext():
        synth = load_synthesizer(**load)
    assert ident.config.family == synth.config.family
    assert ident.identity == synth.identity
    assert ("int4" in ident.identity["precision"]) == bool(fields)
    voices = voices_for(kind)
    assert keys(ident, voices) == keys(synth, voices)
    assert len(set(keys(ident, voices))) == len(LINES) * len(voices)  # each line its own key


def test_an_int4_file_and_its_float_file_have_their_own_keys(irodori_home, tmp_path):
    from irodori_speaker.engine.quant.quantize import quantize_checkpoint

    files = tiny_random_files("v2")
    int4 = tmp_path / "dit-int4.safetensors"
    quantize_checkpoint(files.model, int4, method="rtn", report_errors=False)
    load = dict(
        model=int4, codec=files.codec, tokenizer=files.tokenizer, backend="cpu", voice_cache_dir=False
    )
    ident = model_identity(**load)
    synth = load_synthesizer(**load)
    voices = voices_for("v2")
    assert keys(ident, voices) == keys(synth, voices)
    floats = model_identity(tiny_random="v2", backend="cpu")
    assert keys(floats, voices) != keys(ident, voices)  # other weights, other sound


def test_the_user_dictionary_enters_the_key_without_the_model(irodori_home, tmp_path):
    from irodori_speaker.text.userdict import UserDictionary

    d = UserDictionary(tmp_path / "words.sqlite3")
    d.add("明日", "アシタ")
    load = dict(tiny_random="v2", backend="cpu", voice_cache_dir=False, user_dict=tmp_path / "words.sqlite3")
    ident, synth = model_identity(**load), load_synthesizer(**load)
    line = [("明日です", None, SynthesisOptions(seed=0))]
    with_dict = [identity_key(line_identity(s, *x)) for s in (ident, synth) for x in line]
    plain = model_identity(tiny_random="v2", backend="cpu", user_dict=False)
    assert with_dict[0] == with_dict[1] != identity_key(line_identity(plain, *line[0]))


def test_bad_input_is_the_loaders_error_before_any_weight(irodori_home, tmp_path):
    wav = tmp_path / "voice.wav"
    wav.write_bytes(b"RIFF....WAVE")
    cases = [
        ({"model": wav, "backend": "cpu"}, "not a model checkpoint"),
        ({"model": wav, "tiny_random": True}, "tiny_random builds its own"),
        ({"tiny_random": True, "threads": 0}, "threads must be"),
        ({"tiny_random": True, "backend": "tpu"}, "unknown backend"),
    ]
    for bad, match in cases:
        with pytest.raises(IrodoriError, match=match) as mine:
            model_identity(**bad)
        with pytest.raises(IrodoriError) as loaders:
            load_synthesizer(**bad)
        assert (type(mine.value), str(mine.value)) == (type(loaders.value), str(loaders.value))
