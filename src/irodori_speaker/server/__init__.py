"""`irodori-speaker serve`: the VOICEVOX engine API and OpenAI's speech API on our model.

    from irodori_speaker.server import ServerParts, ServerSettings, build_app
    settings = ServerSettings(voices="voices.toml")
    app = build_app(settings, ServerParts.load(settings))   # any ASGI server can run it

`create_app(synth, settings, book=...)` builds the same app around a Synthesizer of your own.
Needs the `serve` extra (FastAPI, uvicorn, prometheus-client, PyAV). docs/server.md.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from .settings import ServerSettings

if TYPE_CHECKING:
    from .app import build_app, create_app
    from .config import VoiceBook, load_voice_book
    from .parts import ServerParts

__all__ = ["ServerParts", "ServerSettings", "VoiceBook", "build_app", "create_app", "load_voice_book"]

# Loaded on first use: the command line imports this package to register `serve` (the
# settings), and the rest brings numpy, the options pipeline and FastAPI.
_LAZY = {
    "ServerParts": ".parts",
    "VoiceBook": ".config",
    "load_voice_book": ".config",
    "build_app": ".app",
    "create_app": ".app",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(name)
