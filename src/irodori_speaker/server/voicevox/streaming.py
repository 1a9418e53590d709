"""POST /streaming_synthesis: the VOICEVOX engine's streamed synthesis, from our streamed decode.

The same request as /synthesis (an AudioQuery body, `speaker` in the query); the answer is a
WAV whose header leaves the length open (0xFFFFFFFF, as a stream's must) followed by 16-bit
samples as each chunk of the line is decoded, sent chunked. Input errors, a full queue or a
model failure before the first chunk are still an HTTP status; the engine manifest says
`supported_features.streaming_synthesis: true`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ...audio.signal import SAMPLE_RATE, StreamResampler
from ...errors import Cancelled
from .. import schemas as S
from ..audio_out import Encoder
from ..state import AppState
from .common import WAV_RESPONSE, Readings, StyleId
from .query import plan_query


def make_router(state: AppState) -> APIRouter:
    router = APIRouter()

    @router.post(
        "/streaming_synthesis",
        response_class=StreamingResponse,
        responses=WAV_RESPONSE,
        tags=["音声合成"],
        summary="音声合成する（ストリーミング）",
    )
    async def streaming_synthesis(
        query: S.AudioQuery,
        style_id: StyleId,
        request: Request,
        readings: Readings,
        enable_interrogative_upspeak: bool = True,
        core_version: str | None = None,
    ) -> StreamingResponse:
        """WAV を生成しながら返します (chunked; the header's sizes are 0xFFFFFFFF)."""
        voice = state.voice(style_id)
        plan = plan_query(state, query, readings)
        chunks: AsyncGenerator[np.ndarray, None] = state.service.stream(  # type: ignore[assignment,unused-ignore]
            plan.text,
            voice,
            plan.options,
            client=state.client_key(request),
            route="streaming_synthesis",
            is_disconnected=request.is_disconnected,
        )
        first = await anext(chunks, None)  # errors before any audio are still a status
        post = plan.post
        encoder = Encoder("wav", post.rate, 2 if post.stereo else 1)

        async def wav() -> AsyncIterator[bytes]:
            resampler = StreamResampler(SAMPLE_RATE, post.rate)
            samples = 0

            def encode(chunk: np.ndarray) -> bytes:
                nonlocal samples
                samples += len(chunk)
                x = resampler.feed(chunk)
                return encoder.encode(post.channels(np.clip(x, -1.0, 1.0))) if len(x) else b""

            try:
                yield encoder.start() + (encode(first) if first is not None else b"")
                async for chunk in chunks:
                    data = encode(chunk)
                    if data:
                        yield data
                tail = resampler.flush()
                if len(tail):
                    yield encoder.encode(post.channels(np.clip(tail, -1.0, 1.0)))
            except Cancelled:
                return  # the client went away mid-stream
            finally:
                await chunks.aclose()
                state.metrics.audio_seconds.inc(samples / SAMPLE_RATE)

        return StreamingResponse(wav(), media_type="audio/wav", headers=plan.headers())

    return router
