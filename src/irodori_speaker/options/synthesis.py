"""How to render one line: `SamplerConfig` (what `engine.sampler` reads) and `SynthesisOptions`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ..audio.controls import parse_loudness, parse_volume, require_pitch
from ..errors import InputError
from .checks import Check, _validate, did_you_mean, option, option_specs

SCHEDULES = ("linear", "sway")
GUIDANCE_MODES = ("independent", "joint", "alternating")

MAX_STEPS = 200  # upstream uses 40; beyond this nothing improves and a line takes minutes
MAX_SEED = 2**63  # seeds are drawn by torch.Generator.manual_seed (64-bit); exclusive bound
MAX_CHUNK_FRAMES = 750  # the longest utterance (30 s)


_O = TypeVar("_O", bound="SamplerConfig")


class Defaults(Protocol):
    """Where `None` options take their value from (a device `Preset` is one)."""

    @property
    def steps(self) -> int: ...
    @property
    def schedule(self) -> str: ...
    @property
    def sway_coeff(self) -> float: ...


@dataclass(frozen=True)
class SamplerDefaults:
    """Values for the sampler options left `None` (upstream's: 40 linear steps)."""

    steps: int = 40
    schedule: str = "linear"
    sway_coeff: float = -1.0


UPSTREAM_SAMPLER = SamplerDefaults()

#: The speaking rates the server's APIs take (OpenAI's `speed`, VOICEVOX's speedScale):
#: `speed` within its range, beyond it `duration_scale` takes the rest (server/state.py).
API_SPEED = Check(float, 0.25, 4.0)
_REAL_OPT = Check(float, nullable=True)
_UNIT = Check(float, 0.0, 1.0)
_POSITIVE_OPT = Check(float, 0.0, lo_open=True, nullable=True)


@dataclass(frozen=True)
class SamplerConfig:
    """The sampler's settings (`engine.sampler.sample`, `engine.fast.FastSampler.sample`).

    `None` in `steps`, `schedule` and `sway_coeff` takes the caller's default: the device
    preset's in the Synthesizer, upstream's (40 linear steps) in the bare engine.
    """

    steps: int | None = option(
        None,
        Check(int, 1, MAX_STEPS, nullable=True),
        "sampler steps (None: the preset's, 8); more is slower, rarely better past ~16",
        stage="sampler",
        preset="steps",
    )
    schedule: str | None = option(
        None,
        Check(str, choices=SCHEDULES, nullable=True),
        "time schedule: 'sway' spends more steps near the noise end (None: the preset's)",
        stage="sampler",
        preset="schedule",
    )
    sway_coeff: float | None = option(
        None,
        _REAL_OPT,
        "sway schedule coefficient, about [-1, 0] (None: the preset's, -1)",
        stage="sampler",
        preset="sway_coeff",
    )
    guidance: str = option(
        "independent",
        Check(str, choices=GUIDANCE_MODES),
        "classifier-free guidance: one drop per condition, all at once (equal scales), or alternating",
        stage="sampler",
    )
    cfg_scale_text: float = option(
        3.0, Check(float, 0.0, 100.0), "guidance strength of the text (0: off)", stage="sampler"
    )
    cfg_scale_speaker: float = option(
        5.0,
        Check(float, 0.0, 100.0),
        "guidance strength of the reference voice: higher sounds more like it (0: off)",
        stage="sampler",
    )
    cfg_scale_caption: float = option(
        3.0,
        Check(float, 0.0, 100.0),
        "guidance strength of the voice caption (VoiceDesign models; 0: off)",
        stage="sampler",
    )
    cfg_min_t: float = option(
        0.5, _UNIT, "guidance is applied for t in [cfg_min_t, cfg_max_t]", stage="sampler"
    )
    cfg_max_t: float = option(1.0, _UNIT, "upper end of the guided time window", stage="sampler")
    truncation_factor: float | None = option(
        None,
        _POSITIVE_OPT,
        "scale of the initial noise (< 1: calmer, less varied; None: 1)",
        stage="sampler",
    )
    rescale_k: float | None = option(
        None,
        _POSITIVE_OPT,
        "temporal score rescaling k (with rescale_sigma; None: off)",
        stage="sampler",
    )
    rescale_sigma: float | None = option(
        None, _POSITIVE_OPT, "temporal score rescaling sigma (with rescale_k)", stage="sampler"
    )
    speaker_kv_scale: float | None = option(
        None,
        _POSITIVE_OPT,
        "scale of the reference voice's keys/values early in sampling (> 1: closer to it; None: off)",
        stage="sampler",
    )
    speaker_kv_min_t: float = option(
        0.9, _UNIT, "speaker K/V scaling ends once t falls below this", stage="sampler"
    )
    speaker_kv_max_layers: int | None = option(
        None,
        Check(int, 1, 1024, nullable=True),
        "scale the speaker K/V in the first N layers only (None: all)",
        stage="sampler",
    )

    def __post_init__(self) -> None:
        _validate(self)
        if self.cfg_min_t > self.cfg_max_t:
            raise InputError(
                f"option cfg_min_t ({self.cfg_min_t:g}) must be <= cfg_max_t ({self.cfg_max_t:g})"
            )

    def scale(self, name: str) -> float:
        return float(getattr(self, f"cfg_scale_{name}"))

    def with_defaults(self: _O, defaults: Defaults | SamplerDefaults) -> _O:
        """A copy whose `None` preset-backed options take `defaults`' values (self if none is None)."""
        changes = {
            name: getattr(defaults, spec.preset)
            for name, spec in option_specs(self).items()
            if spec.preset is not None and getattr(self, name) is None and hasattr(defaults, spec.preset)
        }
        return dataclasses.replace(self, **changes) if changes else self

    def time_grid(self) -> tuple[int, str, float]:
        """(steps, schedule, sway_coeff), a `None` taking upstream's default."""
        d = UPSTREAM_SAMPLER
        return (
            self.steps if self.steps is not None else d.steps,
            self.schedule if self.schedule is not None else d.schedule,
            self.sway_coeff if self.sway_coeff is not None else d.sway_coeff,
        )


@dataclass(frozen=True)
class SynthesisOptions(SamplerConfig):
    """How to render one line: the sampler settings plus text, length and decode options.

    Every option is checked when the object is built (`InputError` naming it and its allowed
    values). `None` preset-backed options take the device preset's value in
    `Synthesizer.resolve_options`, which every stage, the CLI and the cache key read.
    """

    seconds: float | None = option(
        None,
        Check(float, 0.0, lo_open=True, nullable=True),
        "the line's length in seconds (> 30 is clamped to 30; None: the predictor or a text estimate)",
        stage="length",
    )
    speed: float = option(
        1.0,
        Check(float, 0.5, 2.0),
        "speaking rate (> 1: faster): the predicted or estimated length is divided by it, the "
        "pitch stays; not used with seconds",
        stage="length",
    )
    duration_scale: float = option(
        1.0,
        Check(float, 0.1, 10.0),
        "multiplies a predicted or estimated length (> 1: slower speech); not used with seconds",
        stage="length",
    )
    max_seconds: float | None = option(
        None,
        Check(float, 0.0, lo_open=True, nullable=True),
        "cap on a predicted or estimated length (None: 30 s)",
        stage="length",
    )
    predictor_cap: float | None = option(
        2.0,
        Check(float, 0.0, lo_open=True, nullable=True),
        "v3 models: cap the predicted length at this multiple of the text estimate (None: no cap)",
        stage="length",
    )
    seed: int | None = option(
        None,
        Check(int, 0, MAX_SEED, hi_open=True, nullable=True, shown_hi="2**63"),
        "noise seed: the same seed, text and voice give the same audio (None: a fresh one per line)",
        stage="sampler",
    )
    tail_trim: bool = option(
        True, Check(bool), "cut the line at the first quiet second at its end", stage="decode"
    )
    chunk_frames: int | None = option(
        None,
        Check(int, 1, MAX_CHUNK_FRAMES, nullable=True),
        "decode in chunks of this many frames (25 a second; exact: the sound is the same; "
        "None: the preset's)",
        stage="decode",
        audio=False,
    )
    pad_text_to: int | None = option(
        None,
        Check(int, 1, 4096, nullable=True),
        "pad the text tokens to this length (the reference pads to 256; None: no padding); "
        "at most the model's text length",
        stage="text",
        limit="max_text_len",
    )
    pitch: float = option(
        0.0,
        Check(float, -12.0, 12.0, unit="semitones"),
        "move the voice's pitch by this many semitones (WORLD via pyworld, the length stays; "
        "extra 'controls')",
        stage="output",
    )
    intonation: float = option(
        1.0,
        Check(float, 0.0, 2.0),
        "scale the f0 contour's rises and falls about its median (1: unchanged, 0: monotone, "
        "2: twice as lively; WORLD via pyworld like pitch, the length stays; VOICEVOX "
        "intonationScale)",
        stage="output",
    )
    loudness: float | None = option(
        None,
        Check(float, -70.0, 0.0, parse=parse_loudness, unit="LUFS", nullable=True),
        "scale each piece to this integrated loudness, e.g. -16 or '-16 LUFS' (None: as rendered)",
        stage="output",
    )
    volume: float = option(
        0.0,
        Check(float, -100.0, 24.0, parse=parse_volume, unit="dB"),
        "gain in dB after loudness, e.g. -6 or '-6 dB' (-100: silence); peaks over -1 dBFS are "
        "limited, with a warning",
        stage="output",
    )
    pre_silence: float = option(
        0.0, Check(float, 0.0, 60.0, unit="s"), "silence before the line, in seconds", stage="output"
    )
    post_silence: float = option(
        0.0, Check(float, 0.0, 60.0, unit="s"), "silence after the line, in seconds", stage="output"
    )

    # The readings pass (text/readings.py). audio=False: they change the sound only through the
    # text they produce, and the cache key holds that text (a line they leave alone keeps its key).
    tags: str = option(
        "strip",
        Check(str, choices=("strip", "keep")),
        "emotion/stage tags ([happy], (笑), *laughs*): stripped, or kept and read as text",
        stage="text",
        audio=False,
    )
    urls: str = option(
        "word",
        Check(str, choices=("word", "domain", "drop", "keep")),
        "URLs: said as 'URL', by host name, dropped, or kept (read letter by letter)",
        stage="text",
        audio=False,
    )
    laughter: str = option(
        "read",
        Check(str, choices=("read", "drop", "keep")),
        "chat laughter www: read as ワラワラ, dropped, or kept as letters",
        stage="text",
        audio=False,
    )
    read_numbers: bool = option(
        True,
        Check(bool),
        "read dates, times, units, currency and signs naturally (15:30 -> 15時30分)",
        stage="text",
        audio=False,
    )
    read_english: bool = option(
        True,
        Check(bool),
        "read Latin words in katakana (pyopenjtalk's dictionary, then e2k from the english extra)",
        stage="text",
        audio=False,
    )
    pause_markup: bool = option(
        True,
        Check(bool),
        'pause markup (<break time="500ms"/>, [pause:0.5], at most 10 s in a row) is exact '
        "silence; False (chat text): it is taken out, neither paused at nor read",
        stage="text",
        audio=False,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pitch != 0.0:
            require_pitch()  # before any model work: pyworld missing is a clear error
        if self.intonation != 1.0:
            require_pitch("intonation")

    @classmethod
    def coerce(cls, value: Any, *, name: str = "options") -> SynthesisOptions:
        """`value` as SynthesisOptions: None (defaults), SynthesisOptions, or a mapping of options."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            specs = option_specs(cls)
            for key in value:
                if key not in specs:
                    raise InputError(f"{name}: unknown option {key!r}", hint=did_you_mean(str(key), specs))
            return cls(**value)
        raise InputError(
            f"{name} must be SynthesisOptions or a mapping of options, got {type(value).__name__}",
            hint="e.g. options=SynthesisOptions(seed=3) or options={'seed': 3}",
        )

    def replace(self, **changes: Any) -> SynthesisOptions:
        """A copy with `changes` (checked); a misspelt name is an InputError naming it."""
        specs = option_specs(self)
        for key in changes:
            if key not in specs:
                raise InputError(f"unknown option {key!r}", hint=did_you_mean(key, specs))
        return dataclasses.replace(self, **changes) if changes else self

    def resolve(
        self, defaults: Defaults, limits: Mapping[str, int | float | None] | None = None
    ) -> SynthesisOptions:
        """The options as rendered: `None` preset-backed options filled from `defaults`, and
        each option with a `limit` checked against `limits` (e.g. the model's max_text_len).
        Idempotent; `Synthesizer.resolve_options` is the one caller in the product."""
        out = self.with_defaults(defaults)
        for name, spec in option_specs(out).items():
            value = getattr(out, name)
            bound = None if spec.limit is None or limits is None else limits.get(spec.limit)
            if value is not None and bound is not None and value > bound:
                raise InputError(
                    f"option {name}={value} is more than this model supports ({spec.limit} {bound})",
                    hint=f"use {name} <= {bound}",
                )
        return out

    def audio_identity(self) -> dict[str, Any]:
        """The options that change the sound, by name (the phrase-cache key takes these)."""
        return {name: getattr(self, name) for name, spec in option_specs(self).items() if spec.audio}


def describe_options(cls: Any = None) -> list[tuple[str, str, str, str]]:
    """(name, allowed values, stage, doc) of every option: the source of the docs' option table."""
    specs = option_specs(cls or SynthesisOptions)
    return [(name, s.check.allowed(), s.stage, s.doc) for name, s in specs.items()]
