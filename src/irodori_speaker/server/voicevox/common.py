"""What the VOICEVOX routers share: the style id and readings query parameters, the placeholder image,
the OpenAPI description of a binary answer."""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import Depends, Query

from ..readings import check_readings, describe

# A 1x1 transparent PNG: VOICEVOX clients expect an icon and portraits to decode.
PNG_1X1 = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d4944415478da63f8ffff3f0005fe02fea7d6a5d50000000049454e44ae426082"
    )
).decode()


def binary_response(media_type: str) -> dict[int | str, dict[str, Any]]:
    """`responses=` of a route answering 200 with a file of `media_type` (its OpenAPI schema)."""
    return {200: {"content": {media_type: {"schema": {"type": "string", "format": "binary"}}}}}


WAV_RESPONSE = binary_response("audio/wav")


def reading_query(
    tags: Annotated[str | None, Query(description=describe("tags"))] = None,
    urls: Annotated[str | None, Query(description=describe("urls"))] = None,
    laughter: Annotated[str | None, Query(description=describe("laughter"))] = None,
    read_numbers: Annotated[bool | None, Query(description=describe("read_numbers"))] = None,
    read_english: Annotated[bool | None, Query(description=describe("read_english"))] = None,
    pause_markup: Annotated[bool | None, Query(description=describe("pause_markup"))] = None,
) -> dict[str, Any]:
    """The readings options of a request to /audio_query, /accent_phrases and the synthesis
    routes, as query parameters (a FastAPI dependency; server/readings.py)."""
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


StyleId = Annotated[int, Query(alias="speaker", description="style id (GET /speakers)")]
Readings = Annotated[dict[str, Any], Depends(reading_query)]  # the request's readings options
