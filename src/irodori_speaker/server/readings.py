"""The readings options a request may set (docs/server.md, "Readings per request").

Both APIs take the readings pass's options per request, over the server's defaults (the
serve flags, then the voice config's `[readings]` table): the OpenAI route as extra JSON
fields (what the `openai` SDK sends with `extra_body`), the VOICEVOX routes as query
parameters of /audio_query, /accent_phrases and the synthesis routes (VOICEVOX clients send
none and ignore what they do not know). A value the option does not take is a 422 naming it
and its allowed values (`SynthesisOptions` checks it: one check for every path).
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import Query

from ..errors import InputError

__all__ = ["REQUEST_OPTIONS", "check_readings", "reading_query"]

# the options of stage "text" a request may set (not pad_text_to: a model limit, not a reading)
REQUEST_OPTIONS: Final = ("tags", "urls", "laughter", "read_numbers", "read_english", "pause_markup")


def _doc(name: str) -> str:
    from ..options import SynthesisOptions, option_specs

    spec = option_specs(SynthesisOptions)[name]
    return f"{spec.doc} ({spec.check.allowed()}; default: the server's)"


def check_readings(values: dict[str, Any], where: str = "readings") -> dict[str, Any]:
    """`values` (option name -> value, None: not set) as checked options; an unknown name or a
    bad value is an InputError naming it."""
    from ..options import SynthesisOptions

    out = {k: v for k, v in values.items() if v is not None}
    for key in out:
        if key not in REQUEST_OPTIONS:
            raise InputError(
                f"{where}: unknown readings option {key!r}", hint=f"known: {', '.join(REQUEST_OPTIONS)}"
            )
    SynthesisOptions(**out)  # the options' own checks: "option tags must be one of ..."
    return out


def reading_query(
    tags: Annotated[str | None, Query(description=_doc("tags"))] = None,
    urls: Annotated[str | None, Query(description=_doc("urls"))] = None,
    laughter: Annotated[str | None, Query(description=_doc("laughter"))] = None,
    read_numbers: Annotated[bool | None, Query(description=_doc("read_numbers"))] = None,
    read_english: Annotated[bool | None, Query(description=_doc("read_english"))] = None,
    pause_markup: Annotated[bool | None, Query(description=_doc("pause_markup"))] = None,
) -> dict[str, Any]:
    """The VOICEVOX routes' readings query parameters (a FastAPI dependency)."""
    return check_readings(
        {
            "tags": tags,
            "urls": urls,
            "laughter": laughter,
            "read_numbers": read_numbers,
            "read_english": read_english,
            "pause_markup": pause_markup,
        }
    )
