"""`irodori-speaker serve`: the VOICEVOX engine API and OpenAI's speech API on our model.

    from irodori_speaker.server import create_app, ServerSettings
    app = create_app(load_synthesizer(), ServerSettings())   # any ASGI server can run it

Needs the `serve` extra (FastAPI, uvicorn, prometheus-client, PyAV). docs/server.md.
"""

from .app import create_app
from .config import ServerSettings, VoiceBook, load_voice_book

__all__ = ["ServerSettings", "VoiceBook", "create_app", "load_voice_book"]
