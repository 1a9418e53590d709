"""`irodori-speaker serve`: the VOICEVOX engine API and OpenAI's speech API on our model.

    from irodori_speaker.server import create_app, ServerSettings
    app = create_app(load_synthesizer(), ServerSettings())   # any ASGI server can run it

Needs the `serve` extra (FastAPI, uvicorn, prometheus-client, PyAV). docs/server.md.
"""

from typing import Any

from .config import ServerSettings, VoiceBook, load_voice_book

__all__ = ["ServerSettings", "VoiceBook", "create_app", "load_voice_book"]


def __getattr__(name: str) -> Any:
    # create_app needs FastAPI; importing this package must not (`serve --help` and the
    # settings work on an install without the extra).
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)
