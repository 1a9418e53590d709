"""`serve`: the VOICEVOX- and OpenAI-compatible speech server (irodori_speaker.server)."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from typing import Any

from ..errors import InputError
from ..server.settings import DEFAULT_HOST, DEFAULT_PORT, ServerSettings, check_port
from .common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    add_model_flags,
    add_option_flag,
    add_reading_flags,
    build_readings,
    load_kwargs,
    sub_parser,
)
from .messages import extra_hint

DESCRIPTION = """\
Serve the VOICEVOX engine API and OpenAI's speech API on one loaded model.

  irodori-speaker serve                           # 127.0.0.1:50021, VOICEVOX's port
  irodori-speaker serve --voices voices.toml      # styles from a config file (docs/server.md)
  IRODORI_API_KEY=... irodori-speaker serve --host 0.0.0.0   # beyond this machine: a key is required

VOICEVOX clients (AITuberKit, AIAvatarKit, voicevox-client) need only the URL; the OpenAI
SDK takes base_url=http://127.0.0.1:50021/v1. Stop with Ctrl-C: running lines get
--shutdown-grace seconds, then are cancelled; the exit status is then 130."""


def register(sub: Any) -> None:
    p = sub_parser(sub, "serve", "VOICEVOX- and OpenAI-compatible speech server", DESCRIPTION)
    g = p.add_argument_group("network")
    g.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    g.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    g.add_argument(
        "--api-key",
        help="require 'Authorization: Bearer KEY' (required beyond localhost); visible in `ps`: "
        "prefer $IRODORI_API_KEY or --api-key-file",
    )
    g.add_argument("--api-key-file", metavar="FILE", help="read the API key from FILE (its first line)")
    g.add_argument(
        "--cors-policy",
        choices=["localapps", "all"],
        default="localapps",
        help="localapps (default, as VOICEVOX): app:// and localhost pages; all: any page",
    )
    g.add_argument("--allow-origin", action="append", default=[], help="also allow this web origin (repeat)")
    g = p.add_argument_group("voices and limits")
    g.add_argument("--voices", help="voice config (.toml/.yaml): speakers, styles, ids (docs/server.md)")
    g.add_argument(
        "--max-text-chars", type=int, default=1000, help="longest VOICEVOX text per request (default 1000)"
    )
    g.add_argument(
        "--max-input-chars", type=int, default=4096, help="longest OpenAI input (default 4096, as OpenAI)"
    )
    g.add_argument("--max-queue", type=int, default=512, help="lines waiting before 503 (default 512)")
    g.add_argument(
        "--max-connections",
        type=_positive,
        default=1024,
        help="open connections (default 1024; at the cap an idle one is closed to make room)",
    )
    g.add_argument(
        "--read-timeout",
        type=_positive_seconds,
        default=10.0,
        metavar="SECONDS",
        help="a request must arrive whole within this of its first byte; a silent connection is "
        "closed after it (default 10)",
    )
    g.add_argument(
        "--strict-speakers",
        action="store_true",
        help="an unknown VOICEVOX style id is a 422 (default: the default voice speaks it)",
    )
    g.add_argument("--presets", metavar="FILE", help="keep VOICEVOX presets in this JSON file")
    g.add_argument(
        "--streams",
        type=_positive,
        help="lines in synthesis at once, their sampling batched (default: the backend preset's "
        "serve_streams: 16 on CUDA, 1 on the CPU and MPS; docs/server.md)",
    )
    g.add_argument("--max-body-bytes", type=int, default=1_000_000, help="largest body (default 1 MB)")
    add_option_flag(g, "seed", doc="noise seed: fixed by default, so a request repeats", default=0)
    add_option_flag(g, "steps")
    g.add_argument("--shutdown-grace", type=float, default=10.0, help="seconds running lines get at shutdown")
    g.add_argument("--cache-dir", metavar="DIR", help="phrase cache dir (default: the user's)")
    g.add_argument("--no-cache", action="store_true", help="no phrase cache lookups or stores")
    g.add_argument("--user-dict", metavar="FILE", help="user dictionary (default $IRODORI_DICT)")
    g.add_argument("--no-prewarm", action="store_true", help="skip the warm-up synthesis at start")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    g = p.add_argument_group("on screen (docs/overlay.md)")
    g.add_argument(
        "--play",
        metavar="OUTPUT",
        help="run a Speaker of the server's own on this output ('null', a sound device, a file) for "
        "lines from /studio; /feed and /overlay follow it",
    )
    g.add_argument("--overlay-dir", metavar="DIR", help="the overlay's own CSS and fonts (overlay.css loads)")
    g = p.add_argument_group("scale-out (Ray Serve)")
    g.add_argument("--ray", action="store_true", help="run on Ray Serve (needs ray[serve])")
    g.add_argument("--replicas", type=_positive, default=1, help="Ray Serve replicas (one per GPU)")
    add_reading_flags(p, tag_map=False)
    add_model_flags(p)
    p.set_defaults(func=run)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text}")
    return value


def api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key-file, --api-key or $IRODORI_API_KEY (in that order)."""
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                key = f.readline().strip()
        except OSError as e:
            raise InputError(f"cannot read --api-key-file {args.api_key_file}: {e.strerror}") from None
        if not key:
            raise InputError(f"--api-key-file {args.api_key_file} is empty")
        return key
    return args.api_key or os.environ.get("IRODORI_API_KEY") or None


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """The server's settings from serve's flags: all `serve` hands the server."""
    return ServerSettings(
        host=args.host,
        port=args.port,
        api_key=api_key(args),
        cors_policy=args.cors_policy,
        allow_origins=tuple(args.allow_origin),
        max_text_chars=args.max_text_chars,
        max_input_chars=args.max_input_chars,
        max_connections=args.max_connections,
        read_timeout_s=args.read_timeout,
        strict_speakers=args.strict_speakers,
        presets=args.presets,
        max_body_bytes=args.max_body_bytes,
        max_queue=args.max_queue,
        streams=args.streams,
        seed=args.seed,
        steps=args.steps,
        shutdown_grace_s=args.shutdown_grace,
        readings=tuple(build_readings(args).items()),
        load=load_kwargs(args),
        voices=args.voices,
        user_dict=args.user_dict,
        cache=not args.no_cache,
        cache_dir=args.cache_dir,
        prewarm=not args.no_prewarm,
        replicas=args.replicas,
        play=args.play,
        overlay_dir=args.overlay_dir,
    )


def run(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ModuleNotFoundError as e:
        raise InputError(f"the server needs {e.name}", hint=extra_hint("serve")) from None
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args)
    if args.api_key:
        print(
            "warning: --api-key is visible to every user in `ps`; use $IRODORI_API_KEY or --api-key-file",
            file=sys.stderr,
        )
    for warning in settings.check():  # refuses unsafe settings before the model loads
        print(f"warning: {warning}", file=sys.stderr)
    check_port(settings.host, settings.port, ray=args.ray)
    # the server's modules (numpy, FastAPI, Ray) load only when serving, not with the command line
    from ..server.config import load_voice_book

    book = load_voice_book(settings.voices)  # a bad voice config fails here, before any model loads
    if args.ray:
        try:
            from ..server.ray_app import serve_ray
        except ModuleNotFoundError as e:
            if not (e.name or "").startswith("ray"):
                raise
            raise InputError("--ray needs Ray Serve", hint=extra_hint("ray")) from None
        if not serve_ray(settings):  # blocks until Ctrl-C or SIGTERM has stopped it
            print("stopped (SIGTERM)", file=sys.stderr)
            return EXIT_OK
        print("stopped (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
    from ..server.parts import ServerParts
    from ..server.run import serve

    parts = ServerParts.load(settings, book=book)
    try:
        serve(settings, parts)
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown
        print("stopped (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


def ray_app() -> Any:
    """The Ray Serve application of $IRODORI_SERVE_ARGS (serve's flags), for Ray's own CLI."""
    parser = argparse.ArgumentParser(prog="irodori-speaker")
    register(parser.add_subparsers())
    args = parser.parse_args(["serve", *shlex.split(os.environ.get("IRODORI_SERVE_ARGS", ""))])
    from ..server.ray_app import build_deployment

    return build_deployment(settings_from_args(args))


def __getattr__(name: str) -> Any:  # `serve run irodori_speaker.cli.serve:app`
    if name == "app":
        return ray_app()
    raise AttributeError(name)
