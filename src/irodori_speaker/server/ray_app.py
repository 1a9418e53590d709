"""The same app as a Ray Serve deployment: one replica per GPU, Ray's proxy in front.

    irodori-speaker serve --ray --replicas 2          # or, with Ray's own CLI:
    IRODORI_SERVE_ARGS="--replicas 2" serve run irodori_speaker.cli.serve:app

Each replica is handed the driver's `ServerSettings` (plain values: they pickle), loads its
parts (`ServerParts.load`: the model once) and runs the whole FastAPI app (`build_app`:
VOICEVOX and OpenAI routes, its own fair queue and lifespan: prewarm at start, a graceful
stop) through `serve.ingress` with an app builder, so the driver never loads a model. Ray
Serve's HTTP proxy spreads the requests over the replicas and its autoscaler can add them
(`autoscaling_config` in a Serve config file, docs/server.md). The load balancing is Ray's,
not ours.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

# Ray Serve gives its HTTP proxy 5 s to answer each readiness check and restarts it after three
# misses; on a machine busy with a stream (OBS, an LLM) or a loaded CI runner it missed them and
# `serve --ray` failed to start ("The actor died unexpectedly"). Read by Ray's workers at import,
# so set before Ray starts; a value the user set wins.
os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30")

import ray  # type: ignore[import-not-found,unused-ignore]
from fastapi import FastAPI
from ray import serve  # type: ignore[import-not-found,unused-ignore]

from ..errors import BackendError
from .app import build_app
from .parts import ServerParts
from .settings import ServerSettings

log = logging.getLogger(__name__)


def build_deployment(settings: ServerSettings) -> Any:
    """A bound Ray Serve application: `settings.replicas` replicas, each serving `build_app`."""
    gpus = 1.0 if settings.load.get("backend") == "cuda" else 0.0

    def builder() -> FastAPI:  # a plain function: Ray calls it in each replica at start
        return build_app(settings, ServerParts.load(settings))

    deployment = serve.deployment(
        serve.ingress(builder)(),
        name="irodori",
        num_replicas=settings.replicas,
        ray_actor_options={"num_gpus": gpus, "num_cpus": 1},
        # the app keeps its own fair queue (--max-queue, 503 beyond it); Ray may hand a replica
        # as many requests as that queue holds plus the lines running (--streams; unset, the
        # replica's preset decides, 16 at most today: a bound that is too high only means the
        # app's own 503 answers first)
        max_ongoing_requests=settings.max_queue + (settings.streams or 16),
    )
    # Ray's decorator types hide .bind
    return deployment.bind()  # type: ignore[attr-defined]


class _Terminated(KeyboardInterrupt):
    """SIGTERM: stop like Ctrl-C (the bounded shutdown runs), but as a service asked to stop."""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def serve_ray(settings: ServerSettings) -> bool:
    """Start a local Ray instance (or join $RAY_ADDRESS), deploy, serve until Ctrl-C or SIGTERM.
    Returns whether Ctrl-C stopped it (False: SIGTERM, a service manager's normal stop)."""
    try:
        ray.init(ignore_reinit_error=True)
        serve.start(http_options={"host": settings.host, "port": settings.port})
    except Exception as e:  # a node that fails to start raises a plain Exception (OSError...), not RayError
        if ray.is_initialized():  # (serve.shutdown without Ray would start one, to fail again)
            _bounded(serve.shutdown, 30)
            _bounded(ray.shutdown, 30)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BackendError(
            f"Ray Serve did not start: {first}", hint="see Ray's log above; try again, or serve without --ray"
        ) from None
    # ray.init replaced SIGTERM's handler with sys.exit, which skipped the shutdown below and
    # left Ray's processes running (and the process ended 134): stop as on Ctrl-C instead
    signal.signal(signal.SIGTERM, _interrupt)
    interrupted = True
    try:
        serve.run(build_deployment(settings), route_prefix="/", blocking=True)
    except _Terminated:
        interrupted = False
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the stop short
        # bounded: a Ctrl-C must end the process, whatever state Ray's actors are in
        _bounded(serve.shutdown, settings.shutdown_grace_s + 30)
        _bounded(ray.shutdown, 30)
    return interrupted


def _bounded(fn: Callable[[], Any], seconds: float) -> None:
    """`fn()` in a daemon thread, waited for at most `seconds` (then left behind, with a warning)."""
    name = getattr(fn, "__name__", "stop")

    def run() -> None:
        try:
            fn()
        except Exception as e:  # a stop that fails is not the user's error: one line, then exit
            log.warning("%s failed: %s", name, str(e).strip().splitlines()[0] if str(e).strip() else e)

    t = threading.Thread(target=run, name=f"irodori-{name}", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        log.warning("%s did not finish in %.0f s: exiting anyway", name, seconds)
