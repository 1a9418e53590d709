"""The server's phrase cache goes through the one integration, `CachedRender` (issue 13 point 4):
a hit is answered at once without queueing, misses are queued fairly per client and stored by
the "seeded" policy, and the metrics count hits. In process: `SpeechService` with a fake
synthesizer and a real sqlite cache in tmp_path (the routes on a real server: test_guards.py)."""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

pytest.importorskip("prometheus_client")

from irodori_speaker.audio.signal import SAMPLE_RATE
from irodori_speaker.cache import CachedRender, PhraseCache, StorePolicy
from irodori_speaker.cancel import check
from irodori_speaker.errors import InputError
from irodori_speaker.options import (
    AudioStream,
    SamplerDefaults,
    SynthesisOptions,
    SynthesisRecord,
    SynthesisResult,
)
from irodori_speaker.server.service import SpeechService

SR = SAMPLE_RATE
SEEDED = SynthesisOptions(seed=0)  # the server's default (`serve --seed 0`)


class Fake:
    """A synthesizer whose line is a constant level from its text, in three chunks. Lines whose
    text is in `hold` wait for `release` before their first chunk (the worker is busy)."""

    sample_rate = SR

    def __init__(self) -> None:
        self.calls: list[tuple[str, SynthesisOptions]] = []
        self.hold: set[str] = set()
        self.release = threading.Event()
        self.started = threading.Event()

    def resolve_options(self, options: Any = None) -> SynthesisOptions:
        return SynthesisOptions.coerce(options).resolve(SamplerDefaults(4, "sway", -1.0))

    def spoken_text(self, text: str, options: Any = None) -> str:
        if not text.strip():
            raise InputError("text is empty")
        return text

    def render_identity(self, text: str, voice: Any = None, options: Any = None) -> dict:
        return {"text": text, "voice": repr(voice), "options": self.resolve_options(options).audio_identity()}

    def audio_for(self, text: str) -> np.ndarray:
        level = 0.01 * (10 + zlib.crc32(text.encode()) % 64)
        return np.full(SR // 10, level, dtype=np.float32)

    def _record(self, text: str, options: Any) -> SynthesisRecord:
        seed = SynthesisOptions.coerce(options).seed
        return SynthesisRecord(text=text, seed=12345 if seed is None else seed, steps=4)

    def stream(self, text, voice=None, options=None, cancel=None, progress=None) -> AudioStream:
        self.calls.append((text, SynthesisOptions.coerce(options)))
        record = self._record(text, options)
        audio = self.audio_for(text)

        def chunks():
            self.started.set()
            if text in self.hold:
                assert self.release.wait(10), "the held line was never released"
            for i in range(4):
                check(cancel)
                if progress is not None:
                    progress(i + 1, 4)
            yield from np.array_split(audio, 3)
            record.samples = len(audio)

        return AudioStream(chunks(), record)

    def prewarm(self, voice: Any = None, *, batch_voices: Sequence[Any] = ()) -> float:
        return 0.0

    def synthesize(self, text, voice=None, options=None, cancel=None, progress=None) -> SynthesisResult:
        stream = self.stream(text, voice, options, cancel, progress)
        audio = np.concatenate(list(stream))
        return SynthesisResult(audio, stream.record)


def run(coro, timeout: float = 20.0):
    async def guarded():
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(guarded())


async def serve(fake: Fake, cache: Any, body):
    service = SpeechService(fake, cache=cache)
    service.start()
    try:
        return await body(service)
    finally:
        fake.release.set()
        await service.stop(grace_s=5.0)


def metric(service: SpeechService, name: str) -> float:
    return service.metrics.registry.get_sample_value(name) or 0.0


def model_calls(fake: Fake) -> list[str]:
    return [text for text, _ in fake.calls]


@pytest.fixture
def spied(monkeypatch):
    """Every CachedRender lookup and stream the server makes; the store's own `lookup` / `store`
    refuse to be called (the server must not go around CachedRender)."""
    seen: dict[str, list[str]] = {"lookup": [], "stream": []}
    lookup, stream = CachedRender.lookup, CachedRender.stream

    def spy_lookup(self, text, *a, **kw):
        if self.source == "server":
            seen["lookup"].append(text)
        return lookup(self, text, *a, **kw)

    def spy_stream(self, text, *a, **kw):
        if self.source == "server":
            seen["stream"].append(text)
        return stream(self, text, *a, **kw)

    def bypass(*a, **kw):
        raise AssertionError("the server called the phrase cache around CachedRender")

    monkeypatch.setattr(CachedRender, "lookup", spy_lookup)
    monkeypatch.setattr(CachedRender, "stream", spy_stream)
    monkeypatch.setattr(PhraseCache, "lookup", bypass)
    monkeypatch.setattr(PhraseCache, "store", bypass)
    return seen


def test_a_miss_is_rendered_and_stored_through_cached_render_and_then_a_hit(tmp_path, spied):
    fake = Fake()
    with PhraseCache(tmp_path / "c") as pc:

        async def body(service: SpeechService):
            first = await service.render("いらっしゃい", None, SEEDED)
            again = await service.render("いらっしゃい", None, SEEDED)
            return service, first, again

        service, first, again = run(serve(fake, pc, body))
        np.testing.assert_array_equal(first, fake.audio_for("いらっしゃい"))
        np.testing.assert_array_equal(again, first)
        assert model_calls(fake) == ["いらっしゃい"]  # the second was a hit: no model work
        assert spied == {"lookup": ["いらっしゃい", "いらっしゃい"], "stream": ["いらっしゃい"]}
        (entry,) = pc.entries()
        assert entry.source == "server"
        assert entry.key == CachedRender(pc, fake, source="t").slot("いらっしゃい", None, SEEDED).key
        assert metric(service, "irodori_cache_hits_total") == 1
        assert metric(service, "irodori_sampler_steps_total") == 4  # the miss's steps, none for the hit


def test_a_hit_is_answered_while_the_worker_is_busy_without_queueing(tmp_path):
    fake = Fake()
    fake.hold = {"長い台詞"}
    with PhraseCache(tmp_path / "c") as pc:
        pc.render(fake, "こんにちは", None, SEEDED)  # stored by another caller of CachedRender
        fake.calls.clear()
        fake.started.clear()

        async def body(service: SpeechService):
            busy = asyncio.create_task(service.render("長い台詞", None, SEEDED))
            assert await asyncio.to_thread(fake.started.wait, 10)
            hit = await asyncio.wait_for(service.render("こんにちは", None, SEEDED), 5)
            assert not busy.done() and service.queue_length == 0  # answered beside the held line
            fake.release.set()
            await busy
            return service, hit

        service, hit = run(serve(fake, pc, body))
        np.testing.assert_array_equal(hit, fake.audio_for("こんにちは"))
        assert model_calls(fake) == ["長い台詞"]
        assert metric(service, "irodori_cache_hits_total") == 1
        # what the server stored is a hit for every other caller (PhraseCache.render here)
        _, was_hit = pc.render(fake, "長い台詞", None, SEEDED)
        assert was_hit and model_calls(fake) == ["長い台詞"]


def test_misses_are_queued_round_robin_per_client(tmp_path):
    fake = Fake()
    fake.hold = {"先"}
    with PhraseCache(tmp_path / "c") as pc:

        async def body(service: SpeechService):
            first = asyncio.create_task(service.render("先", None, SEEDED, client="a"))
            assert await asyncio.to_thread(fake.started.wait, 10)
            lines = []
            for n, (text, client) in enumerate([("A0", "a"), ("A1", "a"), ("A2", "a"), ("B0", "b")]):
                lines.append(asyncio.create_task(service.render(text, None, SEEDED, client=client)))
                while service.queue_length < n + 1:  # queued in this order (each after its lookup)
                    await asyncio.sleep(0.01)
            fake.release.set()
            await asyncio.gather(first, *lines)

        run(serve(fake, pc, body))
        assert model_calls(fake) == ["先", "A0", "B0", "A1", "A2"]  # b is not behind a's burst


def test_a_line_without_a_seed_is_rendered_random_and_not_stored(tmp_path, spied, caplog):
    fake = Fake()
    with PhraseCache(tmp_path / "c") as pc:

        async def body(service: SpeechService):
            await service.render("ランダム", None, SynthesisOptions())
            await service.render("ランダム", None, SynthesisOptions())

        run(serve(fake, pc, body))
        assert [o.seed for _, o in fake.calls] == [None, None]  # not forced to the cache seed
        assert pc.entries() == []
        assert spied["stream"] == ["ランダム", "ランダム"]
        assert "could not store" not in caplog.text  # not a failed store: not stored by policy


def test_input_errors_come_before_the_queue_and_the_lookup(tmp_path, spied):
    fake = Fake()
    with PhraseCache(tmp_path / "c") as pc:

        async def body(service: SpeechService):
            with pytest.raises(InputError, match="empty"):
                await service.render("  ", None, SEEDED)
            return service

        service = run(serve(fake, pc, body))
        assert fake.calls == [] and spied["lookup"] == [] and service.queue_length == 0


def test_the_seeded_policy_is_in_the_one_vocabulary():
    assert StorePolicy.parse("seeded") is StorePolicy.SEEDED
    assert StorePolicy.SEEDED.stores(None, SynthesisOptions(seed=3))
    assert not StorePolicy.SEEDED.stores(None, SynthesisOptions())
    assert not StorePolicy.SEEDED.stores(False, SynthesisOptions(seed=3))
