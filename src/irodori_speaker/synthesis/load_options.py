"""What to load and how: the one value `load_synthesizer` and `Speaker` both take. Torch-free.

    load_synthesizer(model="v4", backend="cpu")          # keywords: the common case
    load_synthesizer(LoadOptions(model="v4", backend="cpu"))
    Speaker(model="v4", backend="cpu")                   # or Speaker(load=LoadOptions(...))

Keywords and a whole `LoadOptions` build the same value, checked once where it is given
(before any model work); `loading.load_synthesizer` reads it. `model_dir` is where model files
download (the Hugging Face cache), not the phrase cache (`Speaker(cache=...)`): a `cache_dir=`
is refused with that hint, as is any misspelt name.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..options.memory import parse_memory_budget

__all__ = ["LOAD_FIELDS", "LoadOptions", "unexpected_keyword"]

_PATH = (str, os.PathLike)


@dataclass(frozen=True)
class LoadOptions:
    """Where the model, codec and tokenizer come from and how they run.

    `model` / `codec` / `tokenizer`: a path, hf:// URI, repo id or alias (None: the default
    release); `tokenizer` may also be a tokenizer object (`encode` and `batch`). `backend`:
    auto, cuda, mps or cpu; `device` (a torch device, e.g. "cuda:1") and `dtype` (fp32, bf16,
    fp16) override its preset, as does `preset`: a `Preset`, or preset fields by name
    (`{"int4": True}`); whether they exist here is checked at load. `tiny_random`: True (the
    default model's family, v4.1-MF) or a kind ("v2", "v4", ...) for a small random model,
    offline (its output is noise); it builds its own files, so `model` / `codec` / a tokenizer
    path with it are refused.
    `threads`: torch's CPU threads (None: $IRODORI_THREADS, else half the CPUs this process
    may use, leaving the rest to OBS, a game or an LLM; the startup log says which).
    `max_gpu_memory`: the GPU memory budget, e.g. "3GiB", "3000MB" or a fraction of the card
    such as 0.25 (None: $IRODORI_MAX_GPU_MEMORY, else none); on CUDA the allocator, the batch
    size and the graphs stay within it; elsewhere it is accepted and logged as not applicable.
    `model_dir`: where models download (default: the Hugging Face cache). `voice_cache_dir`:
    encoded reference voices (None/True: the default folder; False: memory only).
    `user_dict`: None (the default file), a path, or False.
    """

    model: str | os.PathLike[str] | None = None
    codec: str | os.PathLike[str] | None = None
    tokenizer: Any = None
    backend: str = "auto"
    device: str | None = None
    dtype: Any = None  # "fp32", "bf16", "fp16" (or a torch.dtype)
    tiny_random: bool | str = False
    threads: int | None = None
    max_gpu_memory: str | int | float | None = None
    model_dir: str | os.PathLike[str] | None = None
    voice_cache_dir: str | os.PathLike[str] | bool | None = None
    user_dict: Any = None
    preset: Any = None

    def __post_init__(self) -> None:
        for name in ("model", "codec", "model_dir"):
            _require(name, getattr(self, name), _PATH, "a path or a source")
        tok = self.tokenizer
        duck = all(callable(getattr(tok, m, None)) for m in ("encode", "batch"))
        if not (tok is None or isinstance(tok, _PATH) or duck):
            raise InputError(
                f"tokenizer must be a path, a source or a tokenizer object, got {type(tok).__name__}",
                hint="a tokenizer object needs encode(text) and batch(texts, max_len=, pad_to=)",
            )
        _require("backend", self.backend, str, "a backend name (auto, cuda, mps, cpu)", nullable=False)
        _require("device", self.device, str, "a torch device name (cpu, cuda:1, ...)")
        _require("tiny_random", self.tiny_random, (bool, str), "True, False or a tiny kind", nullable=False)
        threads = self.threads
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise InputError(
                f"threads must be a whole number >= 1 or None, got {threads!r}",
                hint="None picks half the CPUs this process may use",
            )
        parse_memory_budget(self.max_gpu_memory)
        _require("voice_cache_dir", self.voice_cache_dir, (*_PATH, bool), "a path, True or False")
        if self.tiny_random:
            given = [n for n in ("model", "codec", "tokenizer") if isinstance(getattr(self, n), _PATH)]
            if given:
                raise InputError(
                    f"tiny_random builds its own random model: {', '.join(f'{n}=' for n in given)} "
                    "would be ignored",
                    hint=f"leave out tiny_random to load {given[0]}=, or leave out {given[0]}=",
                )
        preset = self.preset
        if not (preset is None or isinstance(preset, Mapping) or hasattr(preset, "with_overrides")):
            raise InputError(
                f"preset must be a Preset or a mapping of preset fields, got {type(preset).__name__}",
                hint="e.g. preset={'int4': True}",
            )

    def replace(self, **fields: Any) -> LoadOptions:
        """A copy with `fields` replaced (checked again); an unknown name is a TypeError."""
        for name in fields:
            if name not in LOAD_FIELDS:
                raise unexpected_keyword("LoadOptions.replace", name, LOAD_FIELDS)
        return dataclasses.replace(self, **fields) if fields else self

    def with_preset_fields(self, **fields: Any) -> LoadOptions:
        """A copy whose `preset` also sets these preset fields (`None` keeps the preset's value):
        merged into a mapping, or through a `Preset`'s own `with_overrides`."""
        if not fields:
            return self
        if self.preset is None or isinstance(self.preset, Mapping):
            return dataclasses.replace(self, preset={**(self.preset or {}), **fields})
        return dataclasses.replace(self, preset=self.preset.with_overrides(**fields))

    def given(self) -> dict[str, Any]:
        """The fields set to other than their defaults, by name."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        }


LOAD_FIELDS: frozenset[str] = frozenset(f.name for f in dataclasses.fields(LoadOptions))


def _require(name: str, value: Any, kinds: Any, what: str, *, nullable: bool = True) -> None:
    if (value is None and nullable) or isinstance(value, kinds):
        return
    raise InputError(f"{name} must be {what}, got {type(value).__name__}")


def unexpected_keyword(caller: str, name: str, known: Iterable[str]) -> TypeError:
    """The TypeError Python gives an unknown keyword, with what was probably meant: `cache_dir`
    names both folders a user may mean, a preset field points at `preset=`, else the closest
    known name."""
    if name == "cache_dir":
        hint = "did you mean cache= (the phrase cache folder) or model_dir= (where models download)?"
    elif name in _preset_fields():
        hint = f"preset fields go in preset={{{name!r}: ...}}"
    else:
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"did you mean {close[0]!r}?" if close else ""
    return TypeError(
        f"{caller}() got an unexpected keyword argument {name!r}" + (f"; {hint}" if hint else "")
    )


def _preset_fields() -> set[str]:
    """The device preset's field names (imports torch: only on the way to an error)."""
    try:
        from ..engine.hardware.presets import Preset
    except ImportError:  # no torch installed: no preset field to point at
        return set()
    return {f.name for f in dataclasses.fields(Preset)}
