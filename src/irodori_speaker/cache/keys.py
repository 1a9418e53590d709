"""The phrase-cache key: what a line's sound depends on, hashed.

Key: sha256 of the canonical JSON of `Synthesizer.render_identity(text, voice, options)`
(normalised text, voice content hash and caption, the resolved options whose field says
`audio=True`, the model, codec and tokenizer content fingerprints, precision: each once)
plus the sample rate and `CACHE_FORMAT_VERSION`. A line with no seed is cached under
`DEFAULT_SEED` (0): a random seed cannot be reproduced, so it cannot be cached.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ..errors import CacheError
from ..options import SynthesisOptions

#: Bump when the stored audio for the same identity would differ (a key component).
CACHE_FORMAT_VERSION = 1
#: Seed used for cached lines whose options leave `seed=None`.
DEFAULT_SEED = 0


def canonical_json(obj: Any) -> str:
    """Sorted keys, no whitespace, no NaN: the same value always gives the same string."""
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise CacheError(f"a cache key component is not plain JSON: {e}") from e


def cache_options(options: SynthesisOptions | Mapping[str, Any] | None = None) -> SynthesisOptions:
    """`options` with the seed fixed: `DEFAULT_SEED` when it is None (the cache needs one)."""
    options = SynthesisOptions.coerce(options)
    return options if options.seed is not None else options.replace(seed=DEFAULT_SEED)


def line_identity(
    synth: Any,
    text: str,
    voice: Any = None,
    options: SynthesisOptions | None = None,
    *,
    format_version: int | None = None,
) -> dict:
    """Everything the key covers, as a JSON-able dict (the seed defaulted as the cache does)."""
    if not callable(getattr(synth, "render_identity", None)):  # a synthesizer, or a key-only ModelIdentity
        raise CacheError(
            f"{type(synth).__name__} cannot be cached: it is not a synthesizer (no render_identity())",
            hint="use irodori_speaker.synthesis.synthesizer.Synthesizer (load_synthesizer)",
        )
    return {
        "format": CACHE_FORMAT_VERSION if format_version is None else format_version,
        "line": synth.render_identity(text, voice, cache_options(options)),
        "sample_rate": int(synth.sample_rate),
    }


def identity_key(identity: dict) -> str:
    """sha256 (hex) of the identity's canonical JSON."""
    return hashlib.sha256(canonical_json(identity).encode("utf-8")).hexdigest()
