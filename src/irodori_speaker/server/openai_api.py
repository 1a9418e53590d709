"""OpenAI's audio API: POST /v1/audio/speech (streamed) and GET /v1/models.

The response streams: the first bytes leave as soon as the first chunk of the line is
decoded (wav with an open-ended header, raw pcm, and mp3 / opus / aac through FFmpeg's
encoders); flac is sent when complete (docs/server.md says why). Audio is 24 kHz mono, as
OpenAI's is, so clients that assume 24 kHz pcm play it right. `stream_format: "sse"` sends the
same bytes as server-sent events, OpenAI's `speech.audio.delta` (base64 `audio`) then one
`speech.audio.done` (its `usage`: input characters and output 40 ms audio frames, as we have
no tokens). Errors are OpenAI's: 400 with {"error": {"message", "type", "param", "code"}}.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ..audio.signal import SAMPLE_RATE, StreamResampler
from ..errors import Cancelled, InputError
from .audio_out import Encoder
from .readings import REQUEST_OPTIONS, check_readings
from .schemas import SpeechRequest
from .state import AppState

OPENAI_RATE = 24_000
FRAME = OPENAI_RATE // 25  # samples of one 40 ms frame: the `usage` unit of output
MODEL_IDS = ("irodori-speaker", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")


def make_router(state: AppState) -> APIRouter:
    """The speech route reads the server's options, voices and limits and streams from its service."""
    router = APIRouter(prefix="/v1", tags=["OpenAI"])

    @router.get("/models", summary="List models")
    def models() -> dict:
        created = int(time.time())
        return {
            "object": "list",
            "data": [
                {"id": m, "object": "model", "created": created, "owned_by": "irodori"} for m in MODEL_IDS
            ],
        }

    @router.post(
        "/audio/speech",
        response_class=StreamingResponse,
        responses={
            200: {
                "content": {
                    t: {"schema": {"type": "string", "format": "binary"}}
                    for t in ("audio/mpeg", "audio/ogg", "audio/aac", "audio/flac", "audio/wav", "audio/pcm")
                }
            }
        },
        summary="Create speech",
    )
    async def speech(body: SpeechRequest, request: Request) -> StreamingResponse:
        limit = state.settings.max_input_chars
        if len(body.input) > limit:
            error = InputError(
                f"input is {len(body.input)} characters; at most {limit}",
                hint="split it, or start the server with a larger --max-input-chars",
            )
            error.param = "input"  # type: ignore[attr-defined]
            raise error
        voice_name = body.voice if isinstance(body.voice, str) else str(body.voice.get("id", ""))
        style = state.book.resolve_openai(voice_name)
        voice = style.voice()
        readings = check_readings({k: getattr(body, k) for k in REQUEST_OPTIONS}, "extra field")
        options = state.options(speed=body.speed, **readings)
        started = time.perf_counter()
        chunks: AsyncGenerator[np.ndarray, None] = state.service.stream(  # type: ignore[assignment,unused-ignore]
            body.input,
            voice,
            options,
            client=state.client_key(request),
            route="openai",
            is_disconnected=request.is_disconnected,
        )
        # the first chunk is awaited here: input errors, a full queue or a model failure are
        # still an HTTP error status, not a broken stream
        first = await anext(chunks, None)
        encoder = Encoder(body.response_format, OPENAI_RATE)

        samples_sent = 0

        async def audio() -> AsyncIterator[bytes]:
            nonlocal samples_sent
            resampler = StreamResampler(SAMPLE_RATE, OPENAI_RATE)
            samples, sent = 0, False

            def encode(chunk: np.ndarray) -> bytes:
                nonlocal samples, samples_sent
                samples += len(chunk)
                samples_sent += round(len(chunk) * OPENAI_RATE / SAMPLE_RATE)
                return encoder.encode(resampler.feed(chunk))

            def first_byte() -> None:
                nonlocal sent
                if not sent:
                    state.metrics.ttfb.labels("openai").observe(time.perf_counter() - started)
                    sent = True

            try:
                data = encoder.start() + (encode(first) if first is not None else b"")
                if data:
                    first_byte()
                    yield data
                async for chunk in chunks:
                    data = encode(chunk)
                    if data:
                        first_byte()
                        yield data
                first_byte()
                yield encoder.encode(resampler.flush()) + encoder.finish()
                state.metrics.total.labels("openai").observe(time.perf_counter() - started)
            except Cancelled:
                return  # the client went away mid-stream: nobody is left to tell
            finally:
                await chunks.aclose()
                state.metrics.audio_seconds.inc(samples / SAMPLE_RATE)

        if body.stream_format == "sse":
            return StreamingResponse(
                sse(audio(), len(body.input), lambda: samples_sent),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache"},
            )
        return StreamingResponse(audio(), media_type=encoder.media_type)

    return router


async def sse(
    audio: AsyncIterator[bytes], characters: int, samples: Callable[[], int]
) -> AsyncIterator[bytes]:
    """`audio` as OpenAI's speech events: a `speech.audio.delta` per piece, then `speech.audio.done`."""

    def event(payload: dict) -> bytes:
        return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()

    async for data in audio:
        if data:
            yield event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})
    frames = -(-samples() // FRAME)
    usage = {"input_tokens": characters, "output_tokens": frames, "total_tokens": characters + frames}
    yield event({"type": "speech.audio.done", "usage": usage})
