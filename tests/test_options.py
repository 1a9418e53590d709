"""The options pipeline: each option checked where it is defined, resolved against the preset
once, read by every stage and by the cache key; the contract module loads no torch."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from irodori_speaker.errors import InputError
from irodori_speaker.options import (
    MAX_SEED,
    SamplerConfig,
    SynthesisOptions,
    SynthesizerLike,
    describe_options,
    option_specs,
)
from irodori_speaker.synthesis.voices import Voice


def test_importing_the_runtime_loads_no_torch():
    code = textwrap.dedent(
        """
        import sys
        import irodori_speaker
        from irodori_speaker import Speaker, SynthesisOptions, SynthesisRecord, PhraseCache, CancelToken
        import irodori_speaker.speaker, irodori_speaker.speaker.events, irodori_speaker.cache
        import irodori_speaker.cache.prebuild, irodori_speaker.options, irodori_speaker.outputs
        SynthesisOptions(seed=3, steps=4)
        heavy = ("torch", "irodori_speaker.engine", "irodori_speaker.synthesis.synthesizer")
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "torch" or m.startswith(heavy))
        print(loaded)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---- every option is checked where it is defined ----------------------------------------------

BAD = [
    ("seconds", "3", "a number > 0"),
    ("seconds", float("nan"), "a number > 0"),
    ("seconds", -1.0, "a number > 0"),
    ("seed", "abc", "an integer in [0, 2**63)"),
    ("seed", float("nan"), "an integer in [0, 2**63)"),
    ("seed", 2**64, "an integer in [0, 2**63)"),
    ("seed", -1, "an integer in [0, 2**63)"),
    ("seed", True, "an integer in [0, 2**63)"),
    ("steps", 0, "an integer in [1, 200]"),
    ("steps", 10**6, "an integer in [1, 200]"),
    ("steps", 8.0, "an integer in [1, 200]"),
    ("schedule", "cosine", "one of 'linear', 'sway'"),
    ("guidance", "both", "one of 'independent', 'joint', 'alternating'"),
    ("cfg_scale_text", float("inf"), "a number in [0, 100]"),
    ("cfg_scale_speaker", -1, "a number in [0, 100]"),
    ("cfg_min_t", 1.5, "a number in [0, 1]"),
    ("duration_scale", 0.0, "a number in [0.1, 10]"),
    ("pad_text_to", 100000, "an integer in [1, 4096]"),
    ("pad_text_to", 0, "an integer in [1, 4096]"),
    ("chunk_frames", 0, "an integer in [1, 750]"),
    ("tail_trim", "yes", "True or False"),
    ("truncation_factor", 0.0, "a number > 0"),
]


@pytest.mark.parametrize("name, value, allowed", BAD, ids=[f"{n}={v!r}" for n, v, _ in BAD])
def test_a_bad_option_is_an_input_error_naming_it_and_its_allowed_values(name, value, allowed):
    with pytest.raises(InputError) as e:
        SynthesisOptions(**{name: value})
    message = str(e.value)
    assert f"option {name} must be {allowed}" in message
    assert "\n" not in message and e.value.hint and e.value.hint.startswith(f"{name}: ")


def test_cross_field_and_misspelt_options():
    with pytest.raises(InputError, match=r"cfg_min_t .* must be <= cfg_max_t"):
        SynthesisOptions(cfg_min_t=0.9, cfg_max_t=0.5)
    with pytest.raises(TypeError, match="sed"):  # a misspelt keyword, as Python reports it
        SynthesisOptions(sed=3)  # type: ignore[call-arg]
    with pytest.raises(InputError, match="unknown option 'sed'") as e:
        SynthesisOptions().replace(sed=3)
    assert e.value.hint == "did you mean 'seed'?"


def test_values_come_out_in_their_canonical_types():
    o = SynthesisOptions(seed=np.int64(7), seconds=2, cfg_scale_text=np.float32(2.5), tail_trim=np.bool_(0))
    assert [type(v) for v in (o.seed, o.seconds, o.cfg_scale_text, o.tail_trim)] == [int, float, float, bool]
    assert SynthesisOptions(seed=MAX_SEED - 1).seed == 2**63 - 1


def test_options_may_be_a_mapping_and_nothing_else():
    assert SynthesisOptions.coerce({"seed": 3, "steps": 2}) == SynthesisOptions(seed=3, steps=2)
    assert SynthesisOptions.coerce(None) == SynthesisOptions()
    with pytest.raises(InputError, match="unknown option 'sed'"):
        SynthesisOptions.coerce({"sed": 3})
    with pytest.raises(InputError, match="options must be SynthesisOptions or a mapping"):
        SynthesisOptions.coerce("seed=3")


def test_every_option_has_a_doc_a_stage_and_says_whether_it_changes_the_sound():
    rows = describe_options()
    assert [r[0] for r in rows] == [f.name for f in dataclasses.fields(SynthesisOptions)]
    assert all(allowed and stage and doc for _, allowed, stage, doc in rows)
    specs = option_specs(SynthesisOptions)
    assert not specs["chunk_frames"].audio  # chunked decode is exact
    assert all(specs[n].audio for n in ("seed", "steps", "seconds", "cfg_scale_text", "pad_text_to"))
    # the sampler's settings are a part of the options, defined once
    assert set(option_specs(SamplerConfig)) < set(specs)


def test_voice_from_array_refuses_a_path_and_odd_shapes():
    with pytest.raises(InputError, match=r"Voice\.from_array takes samples, got a str") as e:
        Voice.from_array("path.wav", 48_000)  # type: ignore[arg-type]
    assert "from_wav" in (e.value.hint or "")
    with pytest.raises(InputError, match="shape"):
        Voice.from_array(np.zeros((2, 2, 2)), 48_000)
    with pytest.raises(InputError, match="shape"):
        Voice.from_array(np.zeros(0), 48_000)
    with pytest.raises(InputError, match="sample_rate"):
        Voice.from_array(np.zeros(10), 0)
    assert Voice.from_array([0.0, 0.1], 16_000).has_reference


# ---- resolved once against the preset; read by the stages, the key and the CLI ------------------


def test_the_real_synthesizer_implements_the_protocol(synth):
    assert isinstance(synth, SynthesizerLike)


def test_resolve_fills_the_preset_and_bounds_sizes_by_the_model(synth):
    r = synth.resolve_options(SynthesisOptions(seed=1))
    assert (r.steps, r.schedule, r.sway_coeff) == (synth.preset.steps, synth.preset.schedule, -1.0)
    assert synth.resolve_options(r) == r  # idempotent
    assert synth.resolve_options({"steps": 3}).steps == 3
    with pytest.raises(
        InputError, match=r"pad_text_to=1000 is more than this model supports \(max_text_len 256"
    ):
        synth.resolve_options(SynthesisOptions(pad_text_to=1000))


def test_the_key_reads_the_resolved_options_once(synth):
    explicit = SynthesisOptions(seed=1, steps=synth.preset.steps, schedule=synth.preset.schedule)
    a = synth.render_identity("こんにちは。", None, SynthesisOptions(seed=1))
    assert a == synth.render_identity("こんにちは。", None, explicit)  # a preset default == its value
    assert "chunk_frames" not in a["options"] and a["options"]["seed"] == 1
    assert a != synth.render_identity("こんにちは。", None, SynthesisOptions(seed=1, duration_scale=1.1))


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.synthesize("こんにちは。", options={"sed": 1}),
        lambda s: s.synthesize("こんにちは。", options=42),
        lambda s: s.synthesize("こんにちは。", options=SynthesisOptions(pad_text_to=100000 // 25)),
        lambda s: s.stream("こんにちは。", options={"seconds": "3"}),
    ],
    ids=["misspelt-mapping", "not-options", "pad-beyond-model", "string-seconds"],
)
def test_bad_options_fail_before_model_work_and_the_synthesizer_still_speaks(synth, call, monkeypatch):
    def no_model_work(*a, **k):
        raise AssertionError("model work started for a line with bad options")

    with monkeypatch.context() as m, pytest.raises(InputError) as e:
        for name in ("_prepare_text", "_conditions"):  # pad_text_to=100000 ran 34 s
            m.setattr(synth, name, no_model_work)
        m.setattr(synth.voices, "reference", no_model_work)
        call(synth)
    assert "\n" not in str(e.value) and e.value.hint
    res = synth.synthesize("こんにちは。", options={"seed": 1, "seconds": 0.5})
    assert len(res.audio) > 0 and np.isfinite(res.audio).all()


def test_a_mapping_renders_like_the_options_it_spells(synth):
    a = synth.synthesize("はい。", options={"seed": 2, "seconds": 0.5}).audio
    b = synth.synthesize("はい。", options=SynthesisOptions(seed=2, seconds=0.5)).audio
    np.testing.assert_array_equal(a, b)


def test_docs_options_md_is_what_the_generator_writes():
    """docs/options.md is scripts/gen_options_doc.py's output from the option specs (issue 26):
    every option's range, default, flag and doc as the fields' own metadata has them."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).parent.parent
    spec = importlib.util.spec_from_file_location("gen_options_doc", root / "scripts" / "gen_options_doc.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    expected = gen.render()
    assert (root / "docs" / "options.md").read_text(encoding="utf-8") == expected, (
        "docs/options.md is out of date: run python scripts/gen_options_doc.py"
    )
    for name, allowed, stage, doc in describe_options():
        assert f"| `{name}` | {allowed} |" in expected and doc in expected and stage in expected


# ---- the sampler settings: defined once, resolved once, read from that one object ---------------

SAMPLER_FIELDS = [f.name for f in dataclasses.fields(SamplerConfig)]


def test_every_sampler_setting_is_defined_once_in_sampler_config():
    """SynthesisOptions nests the sampler settings by inheriting SamplerConfig: a field declared
    again in the subclass would silently replace the sampler's check, doc or default."""
    import inspect

    assert not set(inspect.get_annotations(SynthesisOptions)) & set(SAMPLER_FIELDS)
    specs, sampler_specs = option_specs(SynthesisOptions), option_specs(SamplerConfig)
    assert all(specs[name] is sampler_specs[name] for name in SAMPLER_FIELDS)
    # every other option of the sampler stage lives there too, except the seed of the initial
    # noise, which the synthesizer draws before the sampler runs (the sampler never reads it)
    outside = [name for name, spec in specs.items() if spec.stage == "sampler" and name not in SAMPLER_FIELDS]
    assert outside == ["seed"]


def test_every_preset_fallback_names_a_setting_of_the_preset_and_of_the_engine_defaults():
    from irodori_speaker.engine.hardware.presets import Preset
    from irodori_speaker.options import SamplerDefaults

    backed = {name: spec.preset for name, spec in option_specs(SynthesisOptions).items() if spec.preset}
    assert set(backed) == {"steps", "schedule", "sway_coeff"}
    for attr in backed.values():
        assert attr in {f.name for f in dataclasses.fields(Preset)}
        assert attr in {f.name for f in dataclasses.fields(SamplerDefaults)}
    filled = SynthesisOptions().with_defaults(SamplerDefaults(steps=7, schedule="sway", sway_coeff=-0.5))
    assert (filled.steps, filled.schedule, filled.sway_coeff) == (7, "sway", -0.5)
    given = SynthesisOptions(steps=3).with_defaults(SamplerDefaults(steps=7))
    assert given.steps == 3  # a value the caller gave is never replaced


def test_the_sampler_gets_the_resolved_options_and_reads_only_its_own_fields(synth, monkeypatch):
    """The synthesizer hands the sampler the object `resolve_options` returns (no second
    fallback on the way), and the sampler reads nothing but SamplerConfig's fields of it: a bare
    SamplerConfig with the same settings gives the same latent."""
    import torch

    seen = []
    real = synth.sample_latent

    def spy(conds, noise, cfg, **kw):
        seen.append((conds, noise.clone(), cfg))
        return real(conds, noise, cfg, **kw)

    monkeypatch.setattr(synth, "sample_latent", spy)
    opts = SynthesisOptions(seed=3, seconds=0.4, cfg_scale_text=2.0, truncation_factor=0.8)
    synth.synthesize("こんにちは。", options=opts)
    conds, noise, cfg = seen[0]
    assert cfg == synth.resolve_options(opts) and cfg.steps == synth.preset.steps
    bare = SamplerConfig(**{name: getattr(cfg, name) for name in SAMPLER_FIELDS})
    with torch.inference_mode():
        assert torch.equal(real(conds, noise, cfg), real(conds, noise, bare))


def test_the_command_line_leaves_the_preset_fallback_to_the_synthesizer():
    """The CLI builds options from its flags only; an unset --steps / --schedule stays None, to
    be resolved against the preset once, by `resolve_options`."""
    from irodori_speaker.cli.common import build_options
    from irodori_speaker.cli.main import build_parser

    parser = build_parser()
    unset = build_options(parser.parse_args(["say", "こんにちは", "-o", "x.wav"]))
    assert (unset.steps, unset.schedule, unset.sway_coeff) == (None, None, None)
    given = build_options(parser.parse_args(["say", "こんにちは", "-o", "x.wav", "--steps", "3"]))
    assert given.steps == 3
