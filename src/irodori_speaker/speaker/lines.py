"""Per-line options: one list, shared by `enqueue`, `say`, `feed`, `say_stream` and
`enqueue_threadsafe`.

    s.enqueue("こんにちは", priority="high", ttl=10, seed=3)

A line takes the `LineOptions` fields (priority, voice, ttl, interrupt, cache, options) and,
by name, any `SynthesisOptions` field: those override the line's (or the Speaker's) options
for this line only. A misspelt name is a `TypeError`, as Python reports an unexpected keyword
argument; a bad value an `InputError` naming it. Both are raised where the line is given.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..options import SynthesisOptions, option_specs


class Priority(enum.IntEnum):
    """Lanes: every HIGH line plays before any NORMAL one, every NORMAL before any LOW."""

    HIGH = 0  # super chats, moderator lines
    NORMAL = 1  # chat answers
    LOW = 2  # idle talk

    @classmethod
    def parse(cls, value: Priority | str | int) -> Priority:
        if isinstance(value, Priority):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1, 2):
            return cls(value)
        raise InputError(f"unknown priority {value!r}", hint="'high', 'normal' or 'low'")


class _Unset:
    """The Speaker's value (its voice, the lane's ttl, its options)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


@dataclass(frozen=True)
class LineOptions:
    """How one line is queued and rendered. `UNSET` / None fields take the Speaker's value."""

    priority: Priority = Priority.NORMAL
    voice: Any = UNSET  # a Voice, a path, None (the model's own voice); UNSET: the Speaker's
    ttl: float | None = UNSET  # seconds it may wait to start playing; UNSET: its lane's
    interrupt: bool = False  # stop the line now playing so this one goes next
    cache: bool | None = None  # phrase cache: None looked up, True also stored, False skipped
    options: SynthesisOptions | None = None  # None: the Speaker's options
    overrides: Mapping[str, Any] = field(default_factory=dict)  # SynthesisOptions fields by name

    def __post_init__(self) -> None:
        object.__setattr__(self, "priority", Priority.parse(self.priority))
        ttl = self.ttl
        if ttl is not UNSET and ttl is not None:
            number = isinstance(ttl, (int, float)) and not isinstance(ttl, bool)
            if not (number and ttl > 0 and math.isfinite(ttl)):
                raise InputError(f"ttl must be > 0 seconds or None, got {ttl!r}")
            object.__setattr__(self, "ttl", float(ttl))
        if not isinstance(self.interrupt, bool):
            raise InputError(f"interrupt must be True or False, got {self.interrupt!r}")
        if self.cache is not None and not isinstance(self.cache, bool):
            raise InputError(f"cache must be True, False or None, got {self.cache!r}")
        if self.options is not None:
            object.__setattr__(self, "options", SynthesisOptions.coerce(self.options))
        if self.overrides:
            SynthesisOptions().replace(**self.overrides)  # each value checked now, by its option

    @classmethod
    def parse(cls, kwargs: Mapping[str, Any], caller: str = "enqueue") -> LineOptions:
        """Keyword arguments of a line call -> LineOptions. An unknown name is a TypeError."""
        own = {f.name for f in dataclasses.fields(cls)} - {"overrides"}
        specs = option_specs(SynthesisOptions)
        for name in kwargs:
            if name not in own and name not in specs:
                close = difflib.get_close_matches(name, [*own, *specs], n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}{hint}")
        mine = {k: v for k, v in kwargs.items() if k in own}
        return cls(**mine, overrides={k: v for k, v in kwargs.items() if k in specs})

    def synthesis_options(self, default: SynthesisOptions | None) -> SynthesisOptions | None:
        """The line's options: its own (else `default`), with the per-line overrides applied."""
        base = self.options if self.options is not None else default
        if not self.overrides:
            return base
        return (base if base is not None else SynthesisOptions()).replace(**self.overrides)


class Reply:
    """The segments of one streamed reply (a `say_stream` call, a `feed` turn) under one time-to-live.

    The first segment's deadline (its lane's TTL, or `ttl=`) is the whole reply's: once any of
    its segments is handed to the player, the reply is on its way and none of it expires any
    more (a reply never loses its middle); when the deadline passes first, every segment expires
    together, those still to come included: the reply is dropped whole (docs/speaker.md).
    """

    def __init__(self) -> None:
        self._deadline: float | None = None
        self._deadline_set = False
        self.started = False  # a segment was handed to the player
        self.expired = False  # its deadline passed before that: every segment is dropped

    def deadline(self, first: float | None) -> float | None:
        """The deadline of a segment queued now: the first segment's (`first`, for the first)."""
        if not self._deadline_set:
            self._deadline, self._deadline_set = first, True
        return None if self.started else self._deadline

    def on_its_way(self) -> None:
        self.started = True

    def expire(self) -> None:
        if not self.started:
            self.expired = True


LINE_FIELDS = tuple(f.name for f in dataclasses.fields(LineOptions) if f.name != "overrides")
