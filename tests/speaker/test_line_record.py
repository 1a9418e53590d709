"""A line's handle (`Utterance`) over its record (`LineRecord`): only the record changes itself,
through named steps, and its state machine refuses an illegal move (speaker/record.py)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import numpy as np
import pytest

import irodori_speaker.speaker as speaker_pkg
from irodori_speaker.speaker.lines import Priority
from irodori_speaker.speaker.playback import Chunk
from irodori_speaker.speaker.record import LineRecord
from irodori_speaker.speaker.utterance import Utterance, UtteranceState

PACKAGE = Path(speaker_pkg.__file__).parent
SR = 24_000
S = UtteranceState


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _others_private(node: ast.expr) -> ast.Attribute | None:
    """The first `x._name` (x not self) on the way from a written target to its root."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value):
            return node
        node = node.value
    return None


def private_writes(source: str) -> list[str]:
    """Writes into another object's private fields: `x._a = ...`, `x._a[k] += ...`, `del x._a`,
    `x._a.b = ...`, a call of a method of `x._a` (`x._a.append(...)`), `setattr(x, "_a", ...)`."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute):
                targets = [f.value]
            elif isinstance(f, ast.Name) and f.id == "setattr" and len(node.args) >= 2:
                name, obj = node.args[1], node.args[0]
                if isinstance(name, ast.Constant) and _private(str(name.value)) and not _own(obj):
                    found.append(f"{node.lineno}: setattr(..., {name.value!r})")
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
                continue
            hit = _others_private(t)
            if hit is not None:
                found.append(f"{node.lineno}: {ast.unparse(hit)}")
    return found


def test_the_checker_sees_every_kind_of_write():
    bad = """
utt._state = 1
utt._timings["x"] = 2
a, utt._item = 1, 2
utt._n += 1
del utt._x
utt._feed.started_t = 3
utt._chunks.append(4)
self._tracker._lines.clear()
setattr(utt, "_y", 5)
"""
    assert len(private_writes(bad)) == 9, private_writes(bad)
    ok = """
self._state = 1
self._timings["x"] = 2
utt.played(3.0)
self._tracker.counts["queued"] += 1
self._speaker._cancel(self._line, "cancelled")
x = utt._token
"""
    assert private_writes(ok) == []


def test_no_module_of_the_speaker_writes_another_objects_private_fields():
    found = {
        path.name: hits
        for path in sorted(PACKAGE.glob("*.py"))
        if (hits := private_writes(path.read_text(encoding="utf-8")))
    }
    assert found == {}


class _Owner:
    sample_rate = SR

    def __init__(self) -> None:
        self.cancelled: list[tuple[LineRecord, str]] = []

    def _cancel(self, line: LineRecord, reason: str) -> None:
        self.cancelled.append((line, reason))


def _line(text: str = "台詞", owner: _Owner | None = None) -> LineRecord:
    return LineRecord(owner or _Owner(), 7, text, Priority.NORMAL, None, None, None, 1.0)


def test_a_line_goes_from_queued_to_played_and_its_handle_shows_it(run):
    async def go() -> None:
        owner = _Owner()
        line = _line(owner=owner)
        h = line.handle
        assert isinstance(h, Utterance) and h.state == S.QUEUED and not h.done
        assert (h.id, h.text, h.priority, h.sample_rate, h.deadline) == (7, "台詞", Priority.NORMAL, SR, None)
        line.synthesising()
        assert line.synthesis_started(1.5) == 0.5  # waited in line
        assert line.chunk_arrived(Chunk(np.ones(SR, dtype=np.float32)), 2.0, SR) == 0.5
        assert line.chunk_arrived(Chunk(np.ones(SR, dtype=np.float32)), 2.5, SR) is None
        assert h.audio is None  # not all in yet
        line.synthesised(None, 3.0)  # type: ignore[arg-type]
        assert h.state == S.READY and h.audio is not None and len(h.audio) == 2 * SR
        line.playing(4.0)
        line.played(6.0)
        line.end(S.PLAYED)
        assert h.done and h.played_fraction == 1.0 and h.heard_text == "台詞"
        assert list(h.timings) == [
            "enqueued", "synthesis_started", "first_chunk", "synthesis_finished",
            "playback_started", "playback_finished",
        ]  # fmt: skip
        assert await asyncio.wait_for(h, 1.0) is h
        h.interrupt()  # the Speaker decides (an ended line is left alone there)
        assert owner.cancelled == [(line, "cancelled")]

    run(go())


def test_the_handle_is_read_only_and_its_timings_a_copy():
    h = _line().handle
    for name in ("state", "text", "id", "record", "error", "played_fraction", "heard_text", "timings"):
        with pytest.raises(AttributeError):
            setattr(h, name, None)
    h.timings["enqueued"] = 99.0
    assert h.timings["enqueued"] == 1.0


def test_an_illegal_move_is_a_bug_and_raises(run):
    line = _line()
    with pytest.raises(AssertionError, match="queued to playing"):
        line.playing(1.0)
    with pytest.raises(AssertionError, match="queued to ready"):
        line._move(S.READY)
    line.synthesising()
    with pytest.raises(AssertionError, match="synthesizing to synthesizing"):
        line.synthesising()
    with pytest.raises(AssertionError, match="synthesizing to played"):
        line._move(S.PLAYED)  # heard to its end without ever being ready or playing

    async def ended_twice() -> None:
        line.end(S.CANCELLED)
        with pytest.raises(AssertionError, match="cancelled to failed"):
            line.end(S.FAILED)
        with pytest.raises(AssertionError):
            line.end(S.QUEUED)  # not an end

    run(ended_twice())


def test_a_preempted_prefetch_goes_back_to_queued_with_a_fresh_token():
    line = _line()
    line.synthesising()
    line.synthesis_started(2.0)
    line.chunk_arrived(Chunk(np.ones(10, dtype=np.float32)), 2.1, SR)
    first = line.token
    line.preempt("a higher lane")
    assert line.preempted and first.cancelled
    line.requeued()
    assert line.state == S.QUEUED and not line.preempted and not line.chunks
    assert line.token is not first and not line.token.cancelled
    assert "synthesis_started" not in line.timings and "first_chunk" not in line.timings
