"""The contract between the engine and the runtime; importing it loads no torch.

- `SynthesisOptions`: how to render one line. Every option is one dataclass field that
  carries its own check (type, bounds, choices), its one-line doc, the stage that reads it,
  whether it changes the sound (the phrase-cache key is made of those), and, when `None`
  means "the device preset's", the preset attribute it falls back to. Options are checked
  when the object is built and resolved against the preset once (`resolve`).
- `SamplerConfig`: the sampler part of those options; `engine.sampler` reads it.
- `SynthesisRecord`, `SynthesisResult`, `AudioStream`: what a synthesizer gives back.
- `SynthesizerLike`: everything the Speaker, the phrase cache and prebuild call on a
  synthesizer (`synthesizer.Synthesizer` is the real one; the Speaker tests have a fake).

Adding an option: one field with `option(...)` in the class whose stage reads it, then read
it in that stage. Its check runs at construction; its range, default and doc make its command
line flag (`cli.common.add_option_flag`), the server's bounds (`server/schemas.py`) and the
table of docs/options.md (`scripts/gen_options_doc.py`); with `audio=True` it enters the
cache key by itself.

`checks.py` holds the option machinery (`Check`, `option`, `option_specs`), `synthesis.py` the
options themselves, `records.py` what comes back and the `SynthesizerLike` protocol.
"""

from ..audio.signal import SAMPLE_RATE
from .checks import STAGES, Check, OptionSpec, did_you_mean, option, option_specs
from .records import AudioStream, SynthesisRecord, SynthesisResult, SynthesizerLike
from .synthesis import (
    API_SPEED,
    GUIDANCE_MODES,
    MAX_CHUNK_FRAMES,
    MAX_SEED,
    MAX_STEPS,
    SCHEDULES,
    UPSTREAM_SAMPLER,
    Defaults,
    SamplerConfig,
    SamplerDefaults,
    SynthesisOptions,
    describe_options,
)

__all__ = [
    "API_SPEED",
    "GUIDANCE_MODES",
    "MAX_CHUNK_FRAMES",
    "MAX_SEED",
    "MAX_STEPS",
    "SAMPLE_RATE",
    "SCHEDULES",
    "STAGES",
    "UPSTREAM_SAMPLER",
    "AudioStream",
    "Check",
    "Defaults",
    "OptionSpec",
    "SamplerConfig",
    "SamplerDefaults",
    "SynthesisOptions",
    "SynthesisRecord",
    "SynthesisResult",
    "SynthesizerLike",
    "describe_options",
    "did_you_mean",
    "option",
    "option_specs",
]
