"""Every background task of a Speaker has one owner (speaker/tasks.py) and none outlives it."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

from speaker_fakes import FakeSynth

import irodori_speaker.speaker as speaker_pkg
from irodori_speaker.outputs import NullOutput
from irodori_speaker.speaker import Speaker, UtteranceState

PACKAGE = Path(speaker_pkg.__file__).parent


def _ours() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("irodori-speaker:")]


def test_tasks_are_started_only_through_the_task_scope():
    calls = []
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            if call and node.func.attr in ("create_task", "ensure_future"):  # type: ignore[attr-defined]
                calls.append(f"{path.name}:{node.lineno}")
    assert calls and all(c.startswith("tasks.py:") for c in calls), calls


def test_no_task_of_the_speaker_outlives_it_in_any_state(run):
    fake = FakeSynth(steps=400, step_s=0.005)  # a line that would synthesise for 2 s

    async def body():
        states = []
        for stop_while in ("idle", "synthesising", "playing"):
            async with Speaker(fake, output=NullOutput(speed=1.0)) as s:
                assert {t.get_name() for t in _ours()} == {"irodori-speaker:scheduler"}
                if stop_while != "idle":
                    h = s.enqueue("閉じるときに動いている台詞")
                    want = UtteranceState.PLAYING if stop_while == "playing" else UtteranceState.SYNTHESIZING
                    if stop_while == "playing":
                        fake.steps = 2
                    while h.state != want:
                        await asyncio.sleep(0.005)
                    states.append(h.state)
                    if stop_while == "synthesising":  # the line's task, owned by the same scope
                        assert f"irodori-speaker:line-{h.id}" in {t.get_name() for t in _ours()}
                    s.drain_on_exit = False
            await asyncio.sleep(0)
            assert _ours() == [], _ours()
        return states

    assert run(body(), timeout=60) == [UtteranceState.SYNTHESIZING, UtteranceState.PLAYING]
