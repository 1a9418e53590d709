"""Prebuild: render a list of stock phrases into the phrase cache ahead of a stream.

Phrase files:

- `.txt`: one phrase per line; blank lines and lines whose first non-blank character is
  `#` are skipped (a `#` later in a line is text: hashtags stay).
- `.yaml` / `.yml`: a list of phrases, or a mapping with `defaults:` (options, `voice`,
  `caption`, applied to every phrase) and `phrases:`. A phrase is a string or a mapping
  with `text` and any `SynthesisOptions` field (`seed`, `steps`, `schedule`, `seconds`,
  ...), `voice` (a path, relative to the file), `caption` and `name`.

Every phrase is rendered with a fixed seed (its own, the defaults', else
`cache.DEFAULT_SEED` = 0), so it can be found again. Already valid entries are skipped
(with `load=`, their keys come from the model's files alone and the model loads only when
some phrase is missing); a phrase that fails is reported and the run goes on; Ctrl-C stops
after the entry being written is either complete or absent, so a re-run renders only what
is left.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import Cancelled, InputError, IrodoriError
from ..options import SynthesisOptions, option_specs
from .policy import CachedRender, Slot
from .store import PhraseCache

log = logging.getLogger("irodori_speaker.cache.prebuild")

PHRASE_KEYS = ("text", "voice", "caption", "name")


@dataclass(frozen=True)
class Phrase:
    """One line to prebuild: text plus its own settings (None: the run's defaults)."""

    text: str
    options: dict[str, Any] = field(default_factory=dict)  # SynthesisOptions overrides
    voice: str | None = None  # path of a reference (wav or latent .safetensors)
    caption: str | None = None
    name: str | None = None
    where: str = ""  # "phrases.txt:12", for messages


@dataclass
class LineResult:
    phrase: Phrase
    status: str  # "rendered" | "cached" | "duplicate" | "failed"
    key: str | None = None
    audio_seconds: float = 0.0
    compute_seconds: float = 0.0
    error: str | None = None


@dataclass
class PrebuildReport:
    results: list[LineResult] = field(default_factory=list)
    total: int = 0
    interrupted: bool = False
    seconds: float = 0.0
    loaded: bool = False  # `load` was called: some phrase needed rendering

    def _count(self, status: str) -> int:
        return sum(1 for r in self.results if r.status == status)

    @property
    def rendered(self) -> int:
        return self._count("rendered")

    @property
    def cached(self) -> int:
        return self._count("cached") + self._count("duplicate")

    @property
    def failed(self) -> list[LineResult]:
        return [r for r in self.results if r.status == "failed"]

    @property
    def remaining(self) -> int:
        return self.total - len(self.results)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.interrupted

    def summary(self) -> str:
        parts = [f"{self.rendered} rendered", f"{self.cached} already cached", f"{len(self.failed)} failed"]
        if self.interrupted:
            parts.append(f"{self.remaining} not done (interrupted; run again to continue)")
        return f"{self.total} phrases: " + ", ".join(parts) + f" in {self.seconds:.1f} s"


# ---------------------------------------------------------------------------------------------
# Phrase files
# ---------------------------------------------------------------------------------------------


def _check_value(name: str, value: Any, where: str) -> Any:
    """A phrase's option value, checked by the option's own check (types.SynthesisOptions)."""
    specs = option_specs(SynthesisOptions)
    if name not in specs:
        known = ", ".join(sorted([*specs, *PHRASE_KEYS]))
        raise InputError(f"{where}: unknown phrase setting {name!r}", hint=f"known: {known}")
    check = specs[name].check
    try:
        return check(name, value)
    except InputError:
        raise InputError(
            f"{where}: {name} must be {check.allowed()}, got {value!r}", hint=specs[name].doc
        ) from None


def _split_settings(d: dict, where: str, base_dir: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """A phrase/defaults mapping -> (SynthesisOptions overrides, phrase fields)."""
    options: dict[str, Any] = {}
    fields: dict[str, Any] = {}
    for k, v in d.items():
        k = str(k)
        if k in PHRASE_KEYS:
            if v is not None and not isinstance(v, str):
                raise InputError(f"{where}: {k} must be a string, got {v!r}")
            if k == "voice" and v and base_dir is not None and not os.path.isabs(v):
                v = str(base_dir / v)
            fields[k] = v
        else:
            options[k] = _check_value(k, v, where)
    return options, fields


def parse_text(text: str, source: str = "<text>") -> list[Phrase]:
    """One phrase per line; blank lines and `#` comment lines skipped."""
    out = []
    for i, line in enumerate(text.lstrip("\ufeff").splitlines(), 1):
        s = line.strip()
        if s and not s.startswith("#"):
            out.append(Phrase(s, where=f"{source}:{i}"))
    return out


def parse_yaml(text: str, source: str = "<yaml>", base_dir: Path | None = None) -> list[Phrase]:
    """A YAML phrase list (see the module docstring); errors name the phrase."""
    try:
        import yaml
    except ImportError as e:
        raise InputError(
            "YAML phrase files need PyYAML", hint="pip install pyyaml, or use a .txt file (one phrase a line)"
        ) from e
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InputError(f"{source}: not valid YAML: {e}") from e
    defaults: dict[str, Any] = {}
    if isinstance(doc, dict):
        unknown = sorted(set(map(str, doc)) - {"defaults", "phrases"})
        if unknown:
            raise InputError(
                f"{source}: unknown top-level key(s) {unknown}", hint="use defaults: and phrases:"
            )
        defaults = doc.get("defaults") or {}
        items = doc.get("phrases")
        if not isinstance(defaults, dict):
            raise InputError(f"{source}: defaults must be a mapping")
    else:
        items = doc
    if items is None:
        return []
    if not isinstance(items, list):
        raise InputError(f"{source}: phrases must be a list, got {type(items).__name__}")
    base_opts, base_fields = _split_settings(defaults, f"{source}: defaults", base_dir)
    if "text" in base_fields:
        raise InputError(f"{source}: defaults cannot set text")
    out = []
    for i, item in enumerate(items, 1):
        where = f"{source}: phrase {i}"
        opts: dict[str, Any]
        fields: dict[str, Any]
        if isinstance(item, str):
            opts, fields = {}, {"text": item}
        elif isinstance(item, dict):
            opts, fields = _split_settings(item, where, base_dir)
        else:
            raise InputError(f"{where}: a phrase is a string or a mapping with text:, got {item!r}")
        phrase_text = fields.get("text")
        if not isinstance(phrase_text, str) or not phrase_text.strip():
            raise InputError(f"{where}: text is missing or empty")
        merged = {**base_fields, **{k: v for k, v in fields.items() if k != "text"}}
        out.append(
            Phrase(
                phrase_text.strip(),
                options={**base_opts, **opts},
                voice=merged.get("voice"),
                caption=merged.get("caption"),
                name=merged.get("name"),
                where=where if fields.get("name") is None else f"{where} ({fields['name']})",
            )
        )
    return out


def load_phrases(path: str | os.PathLike[str]) -> list[Phrase]:
    """Phrases from a .txt or .yaml/.yml file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise InputError(
            f"phrase file {p} does not exist", hint="a .txt file (one phrase a line) or .yaml (docs/cache.md)"
        ) from e
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read phrase file {p}: {e}", hint="phrase files are UTF-8 text") from e
    if p.suffix.lower() in (".yaml", ".yml"):
        return parse_yaml(text, p.name, p.parent)
    return parse_text(text, p.name)


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


class _Voices:
    """Voice objects by path, built once per run."""

    def __init__(self) -> None:
        self._by: dict[tuple[str | None, str | None], Any] = {}

    def get(self, path: str | None, caption: str | None, default: Any) -> Any:
        from ..synthesis.voices import Voice  # imports torch: only when a phrase names a voice

        if path is None and caption is None:
            return default
        if path is None and default is not None:
            path_obj = getattr(default, "reference", None) or getattr(default, "latent", None)
            path = None if path_obj is None else str(path_obj)
        key = (path, caption)
        if key not in self._by:
            if path is None:
                self._by[key] = Voice.designed(caption) if caption else None
            elif Path(path).suffix.lower() == ".safetensors":
                self._by[key] = Voice.from_latent(path, caption=caption)
            else:
                self._by[key] = Voice.from_wav(path, caption=caption)
        return self._by[key]


ProgressFn = Callable[[int, int, float | None, LineResult | None], None]


def prebuild(
    synth: Any,
    cache: PhraseCache,
    phrases: Iterable[Phrase | str],
    *,
    voice: Any = None,
    options: Any = None,
    progress: ProgressFn | None = None,
    cancel: Any = None,
    verify: bool = True,
    load: Callable[[], Any] | None = None,
) -> PrebuildReport:
    """Render every phrase that is not validly cached yet; never stops at a failing phrase.

    `synth`: the synthesizer; or, with `load`, what makes the keys alone (a
    `synthesis.identity.ModelIdentity`: no weights), and `load()` gives the synthesizer, called
    once and only when some phrase is missing (`report.loaded`). `voice` / `options`: defaults
    under each phrase's own settings. `progress(done, total, eta_s, result)` is called before
    the first render and after each phrase that needed rendering (`done`/`total` count those
    only). Ctrl-C (or `cancel`) ends the run with `report.interrupted`; what was stored stays
    stored.
    """
    t_start = time.perf_counter()
    items = [p if isinstance(p, Phrase) else Phrase(str(p)) for p in phrases]
    base = SynthesisOptions.coerce(options)
    report = PrebuildReport(total=len(items))
    voices = _Voices()
    seen: set[str] = set()
    todo: list[tuple[Phrase, Any, Slot]] = []
    cached = CachedRender(cache, synth, store="all", source="prebuild", strict=True)
    try:
        # Pass 1: keys, validity, duplicates (fast: no model work), so progress counts real work.
        for ph in items:
            try:
                v = voices.get(ph.voice, ph.caption, voice)
                slot = cached.slot(ph.text, v, base.replace(**ph.options))
                key = slot.key
            except (IrodoriError, OSError, TypeError, ValueError) as e:
                report.results.append(LineResult(ph, "failed", error=_message(e)))
                continue
            if key in seen:
                report.results.append(LineResult(ph, "duplicate", key))
                continue
            seen.add(key)
            if cache.contains(key, verify=verify):
                report.results.append(LineResult(ph, "cached", key))
                continue
            todo.append((ph, v, slot))
        if todo and load is not None:  # something to render: now the model
            cached, todo = _loaded(cached, load(), todo, report)
            report.loaded = True
        # Pass 2: render what is missing.
        spent = 0.0
        if progress is not None and todo:
            progress(0, len(todo), None, None)
        for i, (ph, v, slot) in enumerate(todo):
            if cancel is not None and getattr(cancel, "cancelled", False):
                raise Cancelled("prebuild cancelled")
            t0 = time.perf_counter()
            if cache.contains(slot.key):  # another process stored it meanwhile
                res = LineResult(ph, "cached", slot.key)
            else:
                res = _render_one(cached, ph, v, slot, cancel)
            spent += time.perf_counter() - t0
            report.results.append(res)
            if progress is not None:
                done = i + 1
                progress(done, len(todo), spent / done * (len(todo) - done), res)
    except (KeyboardInterrupt, Cancelled):
        report.interrupted = True
    report.seconds = time.perf_counter() - t_start
    return report


def _loaded(
    keys_only: CachedRender, synth: Any, todo: list[tuple[Phrase, Any, Slot]], report: PrebuildReport
) -> tuple[CachedRender, list[tuple[Phrase, Any, Slot]]]:
    """The render policy of the loaded synthesizer, and the missing phrases' slots made by it:
    the loaded model's key is the one stored (a key-only key that differs is a bug, logged)."""
    cached = CachedRender(keys_only.cache, synth, store="all", source="prebuild", strict=True)
    out = []
    for ph, v, slot in todo:
        try:
            mine = cached.slot(ph.text, v, slot.options)
        except (IrodoriError, OSError, TypeError, ValueError) as e:
            report.results.append(LineResult(ph, "failed", error=_message(e)))
            continue
        if mine.key != slot.key:
            log.warning("prebuild: %s: the key without the model differs from the loaded model's", ph.where)
        out.append((ph, v, mine))
    return cached, out


def _render_one(cached: CachedRender, ph: Phrase, voice: Any, slot: Slot, cancel: Any) -> LineResult:
    t0 = time.perf_counter()
    try:  # the lookup was done in pass 1 (without counting it as a hit or a miss)
        line = cached.render(ph.text, voice, slot.options, lookup=False, slot=slot, cancel=cancel).line
        assert line is not None  # strict: a line that is not stored raises
    except Cancelled:
        raise
    except Exception as e:  # a failing phrase is reported; the run goes on
        log.debug("prebuild: %s failed", ph.where or ph.text, exc_info=True)
        return LineResult(ph, "failed", slot.key, error=_message(e), compute_seconds=time.perf_counter() - t0)
    return LineResult(ph, "rendered", slot.key, line.duration, time.perf_counter() - t0)


def _message(e: BaseException) -> str:
    if isinstance(e, IrodoriError):
        return super(IrodoriError, e).__str__() + (f" ({e.hint})" if e.hint else "")
    return f"{type(e).__name__}: {e}"


def phrases_from(values: Sequence[str]) -> list[Phrase]:
    """Phrases from plain strings (e.g. a bot's stock lines)."""
    return [Phrase(v) for v in values]
