"""Shared by the hostile-input suite (issue 12): the checks every case ends with.

Each case asserts the error type, a one-line message (`one_line`), that nothing hangs (a
per-case timeout: `run` and the modules' `pytest.mark.timeout`; where a case has a cost to bound,
`cpu_bound` measures it in CPU time, which a loaded machine does not inflate), and that the same Speaker then
speaks a normal line (`speaks_normally`: real, finite audio out of that Speaker). The Speaker is
`hostile_speaker` of tests/conftest.py, one per module (tiny model, NullOutput, a phrase cache).
Where no Speaker can exist (a checkpoint that does not load), `loads_and_speaks` asserts that the
process then loads a good model and speaks."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from irodori_speaker.options import SynthesisOptions

#: Cheap options for the tiny model: two sampler steps, 0.4 s of audio.
OPTS = SynthesisOptions(steps=2, seconds=0.4, seed=1)
NORMAL_LINE = "普通の台詞です。"


def one_line(e: BaseException) -> str:
    text = str(e)
    assert text and "\n" not in text, repr(text)
    return text


@contextlib.contextmanager
def cpu_bound(seconds: float) -> Iterator[None]:
    """The block uses under `seconds` of this process's CPU time (all its threads)."""
    t0 = time.process_time()
    yield
    used = time.process_time() - t0
    assert used < seconds, f"{used:.2f} s of CPU, over the case's bound of {seconds} s"


def run(loop: asyncio.AbstractEventLoop, coro: Any, timeout: float = 45.0) -> Any:
    return loop.run_until_complete(asyncio.wait_for(coro, timeout))


def real_audio(audio: Any) -> None:
    assert audio is not None and audio.size > 0 and np.isfinite(audio).all()


async def speaks_normally(s: Any) -> None:
    """The same Speaker plays a normal line: its handle is PLAYED with finite samples."""
    from irodori_speaker.speaker import UtteranceState

    h = await s.say(NORMAL_LINE)
    assert h.state == UtteranceState.PLAYED, (h.state, h.error)
    real_audio(h.audio)


def loads_and_speaks() -> None:
    """After a checkpoint that did not load, the process loads the good one (the tiny-random
    files of this test module's IRODORI_CACHE, through the real loader) and speaks."""
    from irodori_speaker.synthesis.loading import load_synthesizer

    synth = load_synthesizer(tiny_random=True, backend="cpu", voice_cache_dir=False)
    real_audio(synth.synthesize(NORMAL_LINE, options=OPTS).audio)
