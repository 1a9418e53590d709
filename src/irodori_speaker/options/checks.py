"""One option = one dataclass field whose metadata holds its check, doc, stage and role."""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError

STAGES = ("sampler", "text", "length", "decode", "output")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class Check:
    """What values an option takes: a kind (int, float, str, bool), bounds or choices."""

    kind: type
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # lo < value (else lo <= value)
    hi_open: bool = False
    choices: tuple[str, ...] = ()
    nullable: bool = False
    shown_hi: str | None = None  # how to print `hi` (e.g. "2**63")
    parse: Callable[[Any], Any] | None = None  # turns another spelling into the value ("-16 LUFS")
    unit: str = ""  # shown after the bounds, e.g. "dB"

    def allowed(self, nullable: bool | None = None) -> str:
        """The allowed values in words, e.g. 'an integer in [1, 200] or None' (`nullable`
        False: without 'or None', as a command line flag takes them)."""
        if self.choices:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.kind is bool:
            text = "True or False"
        else:
            text = {int: "an integer", float: "a number", str: "a string"}[self.kind]
            if self.lo is not None and self.hi is not None:
                hi = self.shown_hi or f"{self.hi:g}"
                text += f" in {'(' if self.lo_open else '['}{self.lo:g}, {hi}{')' if self.hi_open else ']'}"
            elif self.lo is not None:
                text += f" {'>' if self.lo_open else '>='} {self.lo:g}"
            elif self.kind is float:
                text = "a finite number"
            if self.unit:
                text += f" {self.unit}"
        return text + (" or None" if (self.nullable if nullable is None else nullable) else "")

    def clamp(self, value: float) -> float:
        """`value` moved into [lo, hi] (the bounds that are set)."""
        value = value if self.hi is None else min(value, self.hi)
        return value if self.lo is None else max(value, self.lo)

    def __call__(self, name: str, value: Any, hint: str | None = None) -> Any:
        """The value in its canonical Python type (numpy scalars become int/float), or InputError."""
        if value is None and self.nullable:
            return None
        ok, out = self._coerce(self.parse(value) if self.parse is not None else value)
        if ok and not self.choices and self.kind in (int, float):
            if self.lo is not None and (out < self.lo or (self.lo_open and out == self.lo)):
                ok = False
            if self.hi is not None and (out > self.hi or (self.hi_open and out == self.hi)):
                ok = False
        if not ok:
            raise InputError(f"option {name} must be {self.allowed()}, got {_short(value)}", hint=hint)
        return out

    def _coerce(self, value: Any) -> tuple[bool, Any]:
        if isinstance(value, (bool, np.bool_)):
            return (True, bool(value)) if self.kind is bool else (False, None)
        if self.kind is bool:
            return False, None
        if self.kind is int:
            return (True, int(value)) if isinstance(value, numbers.Integral) else (False, None)
        if self.kind is float:
            if isinstance(value, numbers.Real) and math.isfinite(float(value)):
                return True, float(value)
            return False, None
        if not isinstance(value, str):
            return False, None
        return (value in self.choices, value) if self.choices else (True, value)


@dataclass(frozen=True)
class OptionSpec:
    """The metadata of one option field (see `option`)."""

    check: Check
    doc: str
    default: Any
    stage: str
    audio: bool  # changes the sound: part of the phrase-cache key
    preset: str | None  # None means the device preset's value of this attribute
    limit: str | None  # name of a model limit the value may not exceed (see `resolve`)


def option(
    default: Any,
    check: Check,
    doc: str,
    *,
    stage: str,
    audio: bool = True,
    preset: str | None = None,
    limit: str | None = None,
) -> Any:
    """A dataclass field that is an option: its check, doc, stage and role in one place."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}")
    spec = OptionSpec(check, doc, default, stage, audio, preset, limit)
    return field(default=default, metadata={"option": spec})


def option_specs(cls_or_obj: Any) -> dict[str, OptionSpec]:
    """Field name -> OptionSpec of every option of a dataclass (in field order)."""
    return {f.name: f.metadata["option"] for f in dataclasses.fields(cls_or_obj) if "option" in f.metadata}


def _validate(obj: Any) -> None:
    for name, spec in option_specs(obj).items():
        object.__setattr__(obj, name, spec.check(name, getattr(obj, name), hint=f"{name}: {spec.doc}"))


def did_you_mean(name: str, known: Mapping[str, Any] | list[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
