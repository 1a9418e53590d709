"""Issue 12: a high-priority line enqueued while a normal line is being prefetched (synthesised
ahead while the previous line plays) does not wait for that prefetch: the prefetch is cancelled
and its line requeued in place (nothing lost, the order within each lane kept). It waited for the
whole prefetch before (640 ms of extra silence at RTF 0.8).

The synthesizer is the real tiny model behind a test double that makes each line's synthesis
slow (cancellable every 10 ms, like the real sampler's steps), on NullOutput at real-time pace."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from irodori_speaker.cancel import check
from irodori_speaker.options import SynthesisOptions
from irodori_speaker.outputs import NullOutput
from irodori_speaker.speaker import Speaker, UtteranceState

pytestmark = pytest.mark.timeout(120)

OPTS = SynthesisOptions(steps=2, seconds=1.0, seed=1)


class Slow:
    """The real synthesizer, `delay_s` slower per line; records which lines started and ended."""

    def __init__(self, inner, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.sample_rate = inner.sample_rate
        self.log: list[tuple[str, str]] = []  # ("start" | "cancelled" | "done", text)
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _note(self, what: str, text: str) -> None:
        with self._lock:
            self.log.append((what, text))

    def _wait(self, text: str, cancel) -> None:
        self._note("start", text)
        end = time.monotonic() + self.delay_s
        try:
            while time.monotonic() < end:
                check(cancel)
                time.sleep(0.01)
        except BaseException:
            self._note("cancelled", text)
            raise

    def synthesize(self, text, voice=None, options=None, cancel=None, **kw):
        self._wait(text, cancel)
        out = self.inner.synthesize(text, voice, options, cancel=cancel, **kw)
        self._note("done", text)
        return out

    def stream(self, text, voice=None, options=None, cancel=None, **kw):
        self._wait(text, cancel)
        out = self.inner.stream(text, voice, options, cancel=cancel, **kw)
        self._note("done", text)
        return out

    def prewarm(self, voice=None):
        return self.inner.prewarm(voice)


@pytest.mark.parametrize("streaming", [True, False])
def test_a_high_line_pre_empts_a_normal_prefetch_which_is_requeued_in_order(run, synth, streaming):
    slow = Slow(synth, delay_s=0.3)

    async def body():
        async with Speaker(slow, output=NullOutput(speed=1.0), options=OPTS, streaming=streaming) as s:
            a = s.enqueue("一つ目")
            await asyncio.wait_for(_until(lambda: a.state == UtteranceState.PLAYING), 30)
            slow.delay_s = 30.0  # the prefetch of b1 would take 30 s
            b1, b2 = s.enqueue("二つ目"), s.enqueue("三つ目")
            await asyncio.wait_for(_until(lambda: ("start", "二つ目") in slow.log), 30)
            slow.delay_s = 0.3
            h = s.enqueue("至急の台詞", priority="high")
            await asyncio.wait_for(asyncio.gather(a.wait(), h.wait(), b1.wait(), b2.wait()), 60)
            return [x.state for x in (a, h, b1, b2)], [
                x.timings.get("playback_started") for x in (a, h, b1, b2)
            ]

    states, started = run(body(), timeout=100)
    assert states == [UtteranceState.PLAYED] * 4  # nothing lost
    assert slow.log[slow.log.index(("start", "二つ目")) + 1] == ("cancelled", "二つ目")  # pre-empted
    assert slow.log.index(("start", "至急の台詞")) > slow.log.index(("cancelled", "二つ目"))
    assert slow.log.count(("start", "二つ目")) == 2 and ("done", "二つ目") in slow.log  # requeued
    assert all(t is not None for t in started) and started == sorted(started)  # a, h, b1, b2


async def _until(pred, step: float = 0.01) -> None:
    while not pred():
        await asyncio.sleep(step)
