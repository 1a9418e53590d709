"""The phrase cache: rendered lines on disk, keyed by everything that changes their sound.

    cache = PhraseCache("~/.cache/irodori-speaker/phrases")
    line, hit = cache.render(synth, "いらっしゃい！", voice)   # renders once, then served from disk
    line = cache.lookup(synth, "いらっしゃい！", voice)        # CachedLine or None; never touches the model

The key covers everything that changes a line's sound, each once (`keys.py`); change any
of it and the old entry is simply not found (it ages out through the size limit).

Modules, bottom-up: `keys.py` (the key), `entries.py` (what the cache hands out),
`files.py` (`AudioFiles`: the audio files, written atomically), `rows.py` (an index row read
back, checked with its file), `index.py` (`Index`: the sqlite file, its schema, counters and
queries), `policy.py` (the one integration: lookup -> synthesise on a miss -> store by policy,
and `CachedSynthesizer`; it needs only a cache's `get` / `put`), `verify.py` (every entry
against its file), `store.py` (`PhraseCache`: composes the index and the files; its
`render` / `store` / `wrap` use `policy.py`, its `verify` `verify.py`), `prebuild.py`.

Storage (sqlite index + audio files, crash-safe, several processes, thread-safe): `store.py`.
"""

from ..options.memory import format_bytes
from .entries import CachedLine, CacheStats, EntryInfo, VerifyReport, record_from_json, record_to_json
from .files import AUDIO_FORMATS, default_cache_dir, parse_size
from .index import INDEX_NAME, SCHEMA_VERSION
from .keys import (
    CACHE_FORMAT_VERSION,
    DEFAULT_SEED,
    cache_options,
    canonical_json,
    identity_key,
    line_identity,
)
from .policy import STORE_POLICIES, CachedRender, CachedSynthesizer, Rendered, Slot, StorePolicy
from .store import DEFAULT_MAX_BYTES, LIPSYNC_HZ, ORPHAN_GRACE_S, TMP_GRACE_S, PhraseCache

__all__ = [
    "AUDIO_FORMATS",
    "CACHE_FORMAT_VERSION",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_SEED",
    "INDEX_NAME",
    "LIPSYNC_HZ",
    "ORPHAN_GRACE_S",
    "SCHEMA_VERSION",
    "STORE_POLICIES",
    "TMP_GRACE_S",
    "CacheStats",
    "CachedLine",
    "CachedRender",
    "CachedSynthesizer",
    "EntryInfo",
    "PhraseCache",
    "Rendered",
    "Slot",
    "StorePolicy",
    "VerifyReport",
    "cache_options",
    "canonical_json",
    "default_cache_dir",
    "format_bytes",
    "identity_key",
    "line_identity",
    "parse_size",
    "record_from_json",
    "record_to_json",
]
