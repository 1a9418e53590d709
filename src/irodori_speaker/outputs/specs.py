"""What `output=` may be (an Output, 'null', a device name, a file path) and the Output it makes."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import InputError
from .base import Output
from .device import SoundDeviceOutput
from .files import FILE_FORMATS, FileOutput
from .paced import NullOutput

OutputSpec = Output | str | os.PathLike[str] | None


def _looks_like_a_file(spec: str) -> bool:
    """A path (a separator, or `name.ext` without spaces: `x.m4a` too, so an extension we cannot
    write is an "unknown file extension", not a missing device) rather than a device name
    ("CABLE Input")."""
    suffix = Path(spec).suffix
    if suffix.lower() in FILE_FORMATS:
        return True
    if any(c.isspace() for c in spec):
        return False
    return "/" in spec or os.sep in spec or (2 <= len(suffix) <= 6 and suffix[1:].isalnum())


def make_output(spec: OutputSpec) -> Output:
    """An `Output` from a spec: an Output, "null", a device name, a path (FILE_FORMATS), None."""
    if isinstance(spec, Output):
        return spec
    if spec is None:
        return SoundDeviceOutput(None)
    if isinstance(spec, os.PathLike):
        return FileOutput(spec)
    if isinstance(spec, str):
        if spec == "null":
            return NullOutput()
        if _looks_like_a_file(spec):
            return FileOutput(spec)
        return SoundDeviceOutput(spec)
    raise InputError(f"not an output: {spec!r}", hint="an Output, 'null', a device name or a file path")
