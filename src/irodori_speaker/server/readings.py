"""The readings options a request may set (docs/server.md, "Readings per request").

Both APIs take the readings pass's options per request, over the server's defaults (the
serve flags, then the voice config's `[readings]` table): the OpenAI route as extra JSON
fields (what the `openai` SDK sends with `extra_body`), the VOICEVOX routes as query
parameters (`voicevox/common.py`; VOICEVOX clients send none and ignore what they do not
know). A value the option does not take is a 422 naming it and its allowed values
(`SynthesisOptions` checks it: one check for every path).
"""

from __future__ import annotations

from typing import Any, Final

from ..errors import InputError
from ..options import SynthesisOptions, option_specs

__all__ = ["REQUEST_OPTIONS", "check_readings", "describe"]

# the options of stage "text" a request may set (not pad_text_to: a model limit, not a reading)
REQUEST_OPTIONS: Final = ("tags", "urls", "laughter", "read_numbers", "read_english", "pause_markup")


def describe(name: str) -> str:
    """A request option's description for the API document."""
    spec = option_specs(SynthesisOptions)[name]
    return f"{spec.doc} ({spec.check.allowed()}; default: the server's)"


def check_readings(values: dict[str, Any], where: str = "readings") -> dict[str, Any]:
    """`values` (option name -> value, None: not set) as checked options; an unknown name or a
    bad value is an InputError naming it."""
    out = {k: v for k, v in values.items() if v is not None}
    for key in out:
        if key not in REQUEST_OPTIONS:
            raise InputError(
                f"{where}: unknown readings option {key!r}", hint=f"known: {', '.join(REQUEST_OPTIONS)}"
            )
    SynthesisOptions(**out)  # the options' own checks: "option tags must be one of ..."
    return out
