"""The one cache integration: look a line up, synthesise it on a miss, store it by policy.

    cached = CachedRender(cache, synth, store="all", source="say")
    r = cached.render("いらっしゃい！", voice)          # r.hit, r.result, r.line
    stream = cached.stream(text, voice, options)      # a hit is one chunk; a miss stored at its end

Every caller goes through it: the Speaker's line worker (the lookup on its cache thread, the
stream on the model thread), `CachedSynthesizer`, `PhraseCache.render` (`say --cache`) and
`prebuild`. What is stored is one vocabulary, `StorePolicy`:

- ``"prebuilt"``: nothing (only prebuild, or your own `PhraseCache.store` / `render`, fills it);
- ``"marked"``: lines marked ``cache=True`` (`Speaker.enqueue(..., cache=True)`);
- ``"seeded"``: every line that rendered whole with a seed of its own (the server: a
  request with no seed is random, so it is rendered as asked and not stored);
- ``"all"``: every line that rendered whole.

A line that will be stored is rendered with the cache seed (`cache_options`: `DEFAULT_SEED`
when its seed is None), so the same line is found again. A stored line is always a whole
one: a cancelled or failed render stores nothing.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..cancel import CancelToken, check
from ..errors import InputError
from ..options import AudioStream, SynthesisOptions, SynthesisRecord, SynthesisResult
from .entries import CachedLine
from .keys import cache_options, identity_key, line_identity

log = logging.getLogger("irodori_speaker.cache")

__all__ = [
    "STORE_POLICIES",
    "CachedRender",
    "CachedSynthesizer",
    "LineStore",
    "Rendered",
    "Slot",
    "StorePolicy",
]

#: What is stored after a miss: nothing (only prebuild fills the cache), lines marked
#: `cache=True`, lines with a seed of their own, or every line.
STORE_POLICIES = ("prebuilt", "marked", "seeded", "all")


class StorePolicy(str, enum.Enum):
    PREBUILT = "prebuilt"
    MARKED = "marked"
    SEEDED = "seeded"
    ALL = "all"

    @classmethod
    def parse(cls, value: Any, name: str = "store") -> StorePolicy:
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value in STORE_POLICIES:
            return cls(value)
        raise InputError(f"{name} must be one of {STORE_POLICIES}, got {value!r}")

    def stores(self, marked: bool | None = None, options: Any = None) -> bool:
        """Is a line stored after it rendered? `marked`: the line's `cache=` (True: marked,
        None: as the policy says, False: never); `options`: its options (for "seeded")."""
        if marked is False:
            return False
        if self is StorePolicy.SEEDED:
            return SynthesisOptions.coerce(options).seed is not None
        return self is StorePolicy.ALL or (self is StorePolicy.MARKED and marked is True)


class LineStore(Protocol):
    """What the integration needs of a cache: lines by key (`PhraseCache` is one)."""

    def get(self, key: str) -> CachedLine | None: ...

    def put(
        self,
        key: str,
        audio: np.ndarray,
        record: SynthesisRecord | None = None,
        *,
        sample_rate: int = ...,
        identity: dict | None = None,
        text: str | None = None,
        source: str = ...,
    ) -> CachedLine: ...


@dataclass(frozen=True)
class Slot:
    """A line's place in the cache: its key, what the key covers, the options it renders with."""

    key: str
    identity: dict
    options: SynthesisOptions  # with the cache seed


@dataclass(frozen=True)
class Rendered:
    """What `CachedRender.render` did: the line's audio, whether it was a hit, and the cache
    entry (the hit, the line just stored, or None when nothing was stored)."""

    result: SynthesisResult
    hit: bool
    line: CachedLine | None


class CachedRender:
    """Lookup -> synthesise on a miss -> store by policy, for one cache and one synthesizer.

    `strict=False` (the Speaker, `CachedSynthesizer`): a lookup that fails is a miss and a
    store that fails is logged, so the cache never costs a line. `strict=True` (`render`,
    prebuild): both raise.
    """

    def __init__(
        self, cache: LineStore, synth: Any, *, store: Any = "marked", source: str, strict: bool = False
    ) -> None:
        self.cache = cache
        self.synth = synth
        self.policy = StorePolicy.parse(store)
        self.source = source  # stored with each entry: "speaker", "prebuild", "say", ...
        self.strict = strict

    def slot(
        self, text: str, voice: Any = None, options: SynthesisOptions | Mapping[str, Any] | None = None
    ) -> Slot:
        opts = cache_options(options)
        identity = line_identity(self.synth, text, voice, opts)
        return Slot(identity_key(identity), identity, opts)

    def lookup(self, text: str, voice: Any = None, options: Any = None) -> CachedLine | None:
        """The stored line, or None. No model work. A line the synthesizer refuses (an
        `InputError`) is the caller's error, raised even when not strict."""
        try:
            return self.cache.get(self.slot(text, voice, options).key)
        except InputError:
            raise
        except Exception as e:  # a synthesizer without render_identity, an unreadable index
            if self.strict:
                raise
            log.warning("phrase cache lookup failed (%s); rendering", e)
            return None

    def stores(self, marked: bool | None = None, options: Any = None) -> bool:
        if getattr(self.cache, "read_only", False) and not self.strict:  # served, not filled
            return False  # (strict callers, prebuild, are told "read-only" by the store)
        return self.policy.stores(marked, options)

    def store(self, slot: Slot, audio: np.ndarray, record: SynthesisRecord | None) -> CachedLine | None:
        """Store a line rendered with `slot.options`; None when it was not (non-strict)."""
        try:
            if record is not None and int(record.seed) != slot.options.seed:
                raise InputError(
                    f"audio rendered with seed {record.seed} cannot be stored under seed {slot.options.seed}",
                    hint="render with irodori_speaker.cache.cache_options(options)",
                )
            rate = int(self.synth.sample_rate)
            return self.cache.put(
                slot.key, audio, record, sample_rate=rate, identity=slot.identity, source=self.source
            )
        except Exception as e:  # a full disk must not cost the line
            if self.strict:
                raise
            log.warning("phrase cache: could not store a line (%s)", e)
            return None

    def render(
        self,
        text: str,
        voice: Any = None,
        options: Any = None,
        *,
        marked: bool | None = None,
        lookup: bool = True,
        slot: Slot | None = None,
        cancel: CancelToken | None = None,
        **kwargs: Any,
    ) -> Rendered:
        """The whole line: from the cache (`lookup`), else synthesised and stored by policy."""
        hit = self.lookup(text, voice, options) if lookup else None
        if hit is not None:
            return Rendered(hit.result(), True, hit)
        if not self.stores(marked, options):
            return Rendered(self.synth.synthesize(text, voice, options, cancel=cancel, **kwargs), False, None)
        slot = slot or self.slot(text, voice, options)
        result = self.synth.synthesize(text, voice, slot.options, cancel=cancel, **kwargs)
        stored = None
        if not (cancel is not None and cancel.cancelled) and (self.strict or len(result.audio)):
            stored = self.store(slot, np.ascontiguousarray(result.audio, dtype=np.float32), result.record)
        return Rendered(result, False, stored)

    def stream(
        self,
        text: str,
        voice: Any = None,
        options: Any = None,
        *,
        marked: bool | None = None,
        lookup: bool = True,
        cancel: CancelToken | None = None,
        **kwargs: Any,
    ) -> AudioStream:
        """The line's chunks: a hit as one chunk; a miss as the synthesizer streams it, stored
        by policy once its last chunk is out (a stream closed early stores nothing)."""
        hit = self.lookup(text, voice, options) if lookup else None
        if hit is not None:
            return AudioStream(iter([hit.audio]), hit.record)
        if not self.stores(marked, options):
            return self.synth.stream(text, voice, options, cancel=cancel, **kwargs)
        slot = self.slot(text, voice, options)
        inner = self.synth.stream(text, voice, slot.options, cancel=cancel, **kwargs)

        def chunks() -> Iterator[np.ndarray]:
            parts: list[np.ndarray] = []
            try:
                for x in inner:
                    parts.append(np.asarray(x, dtype=np.float32).reshape(-1))
                    yield x
                whole = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
                if len(whole) and not (cancel is not None and cancel.cancelled):
                    self.store(slot, whole, inner.record)
            finally:
                inner.close()

        return AudioStream(chunks(), inner.record)


class CachedSynthesizer:
    """A `SynthesizerLike` that serves cache hits without calling the model.

    Every line is looked up (a `seed=None` line under `DEFAULT_SEED`). A miss is rendered by
    the wrapped synthesizer and stored by `store` (a `StorePolicy`: "prebuilt" stores nothing,
    "marked" the calls given `cache=True`, "all" every line); a line to be stored is rendered
    with the cache seed. `Speaker(cache=...)` does the same before any model work.
    """

    def __init__(self, synth: Any, cache: LineStore, *, store: Any = "prebuilt") -> None:
        self._cached = CachedRender(cache, synth, store=store, source="speaker")
        self.synth = synth
        self.cache = cache
        self.store = self._cached.policy.value
        self.sample_rate = int(synth.sample_rate)

    def __getattr__(self, name: str) -> Any:  # preset, fingerprints, ...: the wrapped synthesizer's
        return getattr(self.synth, name)

    def resolve_options(
        self, options: SynthesisOptions | Mapping[str, Any] | None = None
    ) -> SynthesisOptions:
        return self.synth.resolve_options(options)

    def render_identity(self, text: str, voice: Any = None, options: SynthesisOptions | None = None) -> dict:
        return self.synth.render_identity(text, voice, options)

    def synthesize(
        self,
        text: str,
        voice: Any = None,
        options: SynthesisOptions | None = None,
        cancel: CancelToken | None = None,
        *,
        cache: bool | None = None,
        **kwargs: Any,
    ) -> SynthesisResult:
        rendered = self._cached.render(text, voice, options, marked=cache, cancel=cancel, **kwargs)
        if rendered.hit:
            check(cancel)
        return rendered.result

    def stream(
        self,
        text: str,
        voice: Any = None,
        options: SynthesisOptions | None = None,
        cancel: CancelToken | None = None,
        *,
        cache: bool | None = None,
        **kwargs: Any,
    ) -> AudioStream:
        stream = self._cached.stream(text, voice, options, marked=cache, cancel=cancel, **kwargs)
        check(cancel)
        return stream

    def prewarm(self, voice: Any = None, *, batch_voices: Sequence[Any] = ()) -> float:
        return float(self.synth.prewarm(voice, batch_voices=batch_voices))
