"""The same app as a Ray Serve deployment: one replica per GPU, Ray's proxy in front.

    irodori-speaker serve --ray --replicas 2          # or, with Ray's own CLI:
    IRODORI_SERVE_ARGS="--replicas 2" serve run irodori_speaker.server.ray_app:app

Each replica loads the model once and runs the whole FastAPI app (VOICEVOX and OpenAI
routes, its own fair queue and lifespan: prewarm at start, a graceful stop) through
`serve.ingress` with an app builder, so the driver never loads a model. Ray Serve's HTTP
proxy spreads the requests over the replicas and its autoscaler can add them
(`autoscaling_config` in a Serve config file, docs/server.md). The load balancing is
Ray's, not ours.
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any


def build_app(args: argparse.Namespace, settings: Any) -> Any:
    """The server app of one replica: load the model, open the cache, `create_app`."""
    from ..cache import PhraseCache, default_cache_dir
    from ..cli.common import load_kwargs
    from ..synthesis.loading import load_synthesizer
    from .app import create_app
    from .config import load_voice_book

    synth = load_synthesizer(**load_kwargs(args), user_dict=args.user_dict, max_batch=args.streams)
    cache = None if args.no_cache else PhraseCache(args.cache_dir or default_cache_dir())
    book = load_voice_book(args.voices)
    return create_app(synth, settings, book=book, cache=cache, prewarm=not args.no_prewarm)


def build_deployment(args: argparse.Namespace, settings: Any) -> Any:
    """A bound Ray Serve application serving `create_app` on `args`' model."""
    from ray import serve  # type: ignore[import-not-found,unused-ignore]

    gpus = 1.0 if args.backend == "cuda" else 0.0

    def builder() -> Any:  # a plain function: Ray calls it in each replica at start
        return build_app(args, settings)

    deployment = serve.deployment(
        serve.ingress(builder)(),
        name="irodori",
        num_replicas=args.replicas,
        ray_actor_options={"num_gpus": gpus, "num_cpus": 1},
        # the app keeps its own fair queue (--max-queue, 503 beyond it); Ray may hand a replica
        # as many requests as that queue holds plus the lines running (--streams; unset, the
        # replica's preset decides, 16 at most today: a bound that is too high only means the
        # app's own 503 answers first)
        max_ongoing_requests=settings.max_queue + (settings.streams or 16),
    )
    # Ray's decorator types hide .bind
    return deployment.bind()  # type: ignore[attr-defined]


def serve_ray(args: argparse.Namespace, settings: Any) -> int:
    """Start a local Ray instance (or join $RAY_ADDRESS), deploy, serve until Ctrl-C."""
    try:
        import ray  # type: ignore[import-not-found,unused-ignore]
        from ray import serve  # type: ignore[import-not-found,unused-ignore]
    except ModuleNotFoundError:
        from ..errors import InputError

        raise InputError("--ray needs Ray Serve", hint="pip install 'ray[serve]'") from None
    from ..errors import BackendError

    try:
        ray.init(ignore_reinit_error=True)
        serve.start(http_options={"host": settings.host, "port": settings.port})
    except ray.exceptions.RayError as e:  # e.g. its proxy failing its health checks on a busy machine
        _bounded(serve.shutdown, 30)
        _bounded(ray.shutdown, 30)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BackendError(
            f"Ray Serve did not start: {first}", hint="see Ray's log above; try again, or serve without --ray"
        ) from None
    try:
        serve.run(build_deployment(args, settings), route_prefix="/", blocking=True)
    except KeyboardInterrupt:
        pass
    finally:
        # bounded: a Ctrl-C must end the process, whatever state Ray's actors are in
        _bounded(serve.shutdown, settings.shutdown_grace_s + 30)
        _bounded(ray.shutdown, 30)
    return 0


def _bounded(fn: Any, seconds: float) -> None:
    """`fn()` in a daemon thread, waited for at most `seconds` (then left behind, with a warning)."""
    import logging
    import threading

    t = threading.Thread(target=fn, name=f"irodori-{getattr(fn, '__name__', 'stop')}", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        log = logging.getLogger(__name__)
        log.warning("%s did not finish in %.0f s: exiting anyway", fn.__name__, seconds)


def _app_from_env() -> Any:
    from ..cli import build_parser
    from ..cli.serve import settings_from_args

    args = build_parser().parse_args(["serve", *shlex.split(os.environ.get("IRODORI_SERVE_ARGS", ""))])
    return build_deployment(args, settings_from_args(args))


def __getattr__(name: str) -> Any:  # `serve run irodori_speaker.server.ray_app:app`
    if name == "app":
        return _app_from_env()
    raise AttributeError(name)
