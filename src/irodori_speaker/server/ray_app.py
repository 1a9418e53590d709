"""The same app as a Ray Serve deployment: one replica per GPU, Ray's proxy in front.

    irodori-speaker serve --ray --replicas 2          # or, with Ray's own CLI:
    IRODORI_SERVE_ARGS="--replicas 2" serve run irodori_speaker.server.ray_app:app

Each replica loads the model once and runs the whole FastAPI app (VOICEVOX and OpenAI
routes, its own fair queue) through `serve.ingress`; Ray Serve's HTTP proxy spreads the
requests over the replicas and its autoscaler can add them (`autoscaling_config` in a
Serve config file). The load balancing is Ray's, not ours.
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any


def build_deployment(args: argparse.Namespace, settings: Any) -> Any:
    """A bound Ray Serve application serving `create_app` on `args`' model."""
    from ray import serve  # type: ignore[import-not-found,unused-ignore]

    gpus = 1.0 if args.backend == "cuda" else 0.0
    # the app object of the ingress is built in each replica, where the model loads
    factory = _AppFactory(args, settings)

    @serve.deployment(
        num_replicas=args.replicas,
        ray_actor_options={"num_gpus": gpus, "num_cpus": 1},
        max_ongoing_requests=settings.max_queue,
    )
    @serve.ingress(factory.app)
    class IrodoriReplica:
        def __init__(self) -> None:
            factory.load()

    return IrodoriReplica.bind()  # type: ignore[attr-defined]


class _AppFactory:
    """An app whose synthesizer loads in the replica (the driver never loads a model)."""

    def __init__(self, args: argparse.Namespace, settings: Any) -> None:
        from fastapi import FastAPI

        from .app import create_app

        self.args, self.settings = args, settings
        self._inner: Any = None
        self.app = FastAPI(title="irodori-speaker (Ray Serve)")
        self.app.mount("/", self._forward)
        self._create_app = create_app
        self._started = False

    async def _forward(self, scope: Any, receive: Any, send: Any) -> None:
        if not self._started:  # a mounted app gets no lifespan events: start it on first use
            self._started = True
            await self._inner.router.lifespan_context(self._inner).__aenter__()
        await self._inner(scope, receive, send)

    def load(self) -> None:
        from ..cache import PhraseCache, default_cache_dir
        from ..cli.common import load_kwargs
        from ..synthesizer import load_synthesizer
        from .config import load_voice_book

        a = self.args
        synth = load_synthesizer(**load_kwargs(a), user_dict=a.user_dict)
        cache = None if a.no_cache else PhraseCache(a.cache_dir or default_cache_dir())
        self._inner = self._create_app(synth, self.settings, book=load_voice_book(a.voices), cache=cache)


def serve_ray(args: argparse.Namespace, settings: Any) -> int:
    try:
        import ray  # type: ignore[import-not-found,unused-ignore]
        from ray import serve  # type: ignore[import-not-found,unused-ignore]
    except ModuleNotFoundError:
        from ..errors import InputError

        raise InputError("--ray needs Ray Serve", hint="pip install 'ray[serve]'") from None
    ray.init(ignore_reinit_error=True)
    serve.start(http_options={"host": settings.host, "port": settings.port})
    serve.run(build_deployment(args, settings), blocking=True)
    return 0


def _app_from_env() -> Any:
    from ..cli import build_parser
    from ..cli.serve import settings_from_args

    args = build_parser().parse_args(["serve", *shlex.split(os.environ.get("IRODORI_SERVE_ARGS", ""))])
    return build_deployment(args, settings_from_args(args))


def __getattr__(name: str) -> Any:  # `serve run irodori_speaker.server.ray_app:app`
    if name == "app":
        return _app_from_env()
    raise AttributeError(name)
