"""The server's settings: one plain object that says what a server process loads and how it serves.

`irodori-speaker serve` turns its flags into a `ServerSettings` and nothing else; every way of
running the server starts from one (`ServerParts.load(settings)` loads the model, the voices
and the cache; `build_app(settings, parts)` builds the app), a Ray Serve replica too: the
settings are plain values, so they pickle. Standard library only: the command line imports
this module to register `serve`.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 50021  # the VOICEVOX engine's port: its clients find us without settings
# the fixed ports a local Ray instance takes (ray/_private/ray_constants.py, Ray 2.x): its GCS,
# its dashboard and its dashboard agent, bound by `ray.init` before Serve's proxy binds ours
RAY_PORTS = {6379: "GCS", 8265: "dashboard", 52365: "dashboard agent"}


# web pages the server answers (CORS "localapps", as the VOICEVOX engine does): local apps and
# localhost origins, browser extensions, plus the allow-list
LOCAL_ORIGIN = re.compile(
    r"^[a-zA-Z][a-zA-Z0-9+\-.]*://(([^/]+\.)?localhost|127\.0\.0\.1|\[::1\])(:[0-9]+)?$"
)
EXTENSION_ORIGINS = ("chrome-extension://", "moz-extension://", "safari-web-extension://")


def origin_allowed(origin: str, settings: ServerSettings) -> bool:
    """Whether a page of `origin` may call the server (always, with CORS policy "all")."""
    if settings.cors_policy == "all":
        return True
    allowed = ("app://.", *settings.allow_origins)
    return origin in allowed or bool(LOCAL_ORIGIN.fullmatch(origin)) or origin.startswith(EXTENSION_ORIGINS)


def loopback_host(host: str) -> bool:
    """Whether a Host header names this machine (a DNS-rebinding page's does not)."""
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return name in ("localhost", "testserver") or is_loopback(name.strip("[]"))


def is_loopback(host: str) -> bool:
    """Whether binding to `host` keeps the server on this machine."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class ServerSettings:
    """Everything `irodori-speaker serve` can be told. Limits protect the one model."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    cors_policy: str = "localapps"  # "localapps" (VOICEVOX's default) or "all"
    allow_origins: tuple[str, ...] = ()
    max_text_chars: int = 1000  # VOICEVOX text; a query's audio is capped in proportion (QUERY_S_PER_CHAR)
    max_input_chars: int = 4096  # OpenAI's `input` (OpenAI's own limit)
    max_body_bytes: int = 1_000_000
    max_queue: int = 512  # waiting syntheses (a 200-request burst queues); more -> 503 with Retry-After
    # connections (server/connections.py): a slow or idle socket never locks a client out
    read_timeout_s: float = 10.0  # from a request's first byte (or the connection's start) to its headers
    keep_alive_s: int = 20  # longer than common clients' pool expiry (httpx 5 s, aiohttp 15 s)
    max_connections: int = 1024  # at the cap an idle connection makes room; all busy -> 503
    max_client_connections: int = 256  # per client address (every local app shares 127.0.0.1)
    strict_speakers: bool = False  # unknown VOICEVOX style ids: 422 (True) or the default voice
    streams: int | None = None  # lines in synthesis at once (None: the preset's max_batch)
    max_batch: int = 16  # queries per /multi_synthesis
    seed: int | None = 0  # fixed: the same request gives the same audio (VOICEVOX-like), cacheable
    steps: int | None = None  # sampler steps (None: the backend preset's)
    shutdown_grace_s: float = 10.0  # in-flight syntheses get this long at shutdown, then are cancelled
    # the readings options of every request (tags, urls, laughter, read_numbers, read_english:
    # docs/text-and-readings.md), as (name, value) pairs; empty: the defaults. The voice
    # config's [readings] table lies under them (create_app).
    readings: tuple[tuple[str, Any], ...] = ()
    # what each server process loads (ServerParts.load)
    load: dict[str, Any] = field(default_factory=dict)  # load_synthesizer's arguments (model, backend...)
    voices: str | None = None  # the voice config file (None: the model's own voice as style 0)
    user_dict: str | None = None  # the user dictionary (None: $IRODORI_DICT or the user's)
    presets: str | None = None  # VOICEVOX presets, a JSON file (None: in memory until the server stops)
    cache: bool = True  # phrase cache lookups and stores
    cache_dir: str | None = None  # the phrase cache's directory (None: the user's)
    prewarm: bool = True  # a warm-up synthesis before the first request
    replicas: int = 1  # Ray Serve replicas (server/ray_app.py; one per GPU)
    # on screen (docs/overlay.md): where the server's own Speaker plays lines from the studio
    # (an output: "null", a device name, a file; None: no Speaker), and the user's overlay folder
    play: str | None = None
    overlay_dir: str | None = None

    def check(self) -> list[str]:
        """Raise on unsafe settings; return warnings to print."""
        warnings: list[str] = []
        if self.cors_policy not in ("localapps", "all"):
            raise InputError(f"cors policy must be 'localapps' or 'all', got {self.cors_policy!r}")
        if not is_loopback(self.host):
            if not self.api_key:
                raise InputError(
                    f"listening on {self.host} (beyond this machine) needs an API key",
                    hint="set $IRODORI_API_KEY or pass --api-key-file FILE; "
                    "clients send 'Authorization: Bearer KEY'",
                )
            warnings.append(
                f"listening on {self.host}: reachable from other machines; every request needs the API key"
            )
        if self.overlay_dir is not None and not os.path.isdir(os.path.expanduser(self.overlay_dir)):
            raise InputError(
                f"--overlay-dir {self.overlay_dir} is not a folder",
                hint="make it and put overlay.css (and the fonts it names) in it",
            )
        if self.cors_policy == "all":
            warnings.append("CORS policy 'all': any web page may call this server")
        return warnings


def check_port(host: str, port: int, *, ray: bool = False) -> None:
    """Refuse a port the server could not listen on, before any model loads: out of range, one
    of a local Ray instance's own ports (`ray`), or in use (a VOICEVOX engine on 50021, a
    second server)."""
    if not 1 <= port <= 65535:
        raise InputError(f"--port {port} is not a TCP port", hint="pick one from 1 to 65535")
    if ray and port in RAY_PORTS:
        raise InputError(
            f"--port {port} is Ray's {RAY_PORTS[port]} port", hint="pick another port with --port"
        )
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise InputError(
            f"--host {host!r} is not an address of this machine: {e.strerror}",
            hint="--host 127.0.0.1 for this machine, 0.0.0.0 for every interface",
        ) from None
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            s.bind(addr)
        except OSError as e:
            hints = {
                errno.EADDRINUSE: "another server (a VOICEVOX engine?) has the port: stop it or pass --port",
                errno.EADDRNOTAVAIL: "--host must be an address of this machine (127.0.0.1, 0.0.0.0)",
                errno.EACCES: "ports below 1024 need privileges: pass --port above 1023",
            }
            raise InputError(
                f"cannot listen on {host}:{port}: {e.strerror}",
                hint=hints.get(e.errno or 0, "pass another --host / --port"),
            ) from None
