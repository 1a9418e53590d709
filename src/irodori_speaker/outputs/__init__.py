"""Where the Speaker's audio goes: one file per sink over one base.

`base.py` the contract (Output, Track, Block: the hand-off between the event loop and a render
thread), `paced.py` the clock-paced sinks (PacedOutput, NullOutput), `files.py` sound files,
`device.py` PortAudio devices, `clock.py` the sound card's sample clock, `specs.py` what
`output=` may be.
"""

from .base import Block, Output, Track
from .device import SoundDeviceOutput, find_output_device, list_output_devices
from .files import FILE_FORMATS, FileOutput, check_writable, file_format, write_sound_file
from .paced import NullOutput, PacedOutput
from .specs import OutputSpec, make_output

__all__ = [
    "FILE_FORMATS",
    "Block",
    "FileOutput",
    "NullOutput",
    "Output",
    "OutputSpec",
    "PacedOutput",
    "SoundDeviceOutput",
    "Track",
    "check_writable",
    "file_format",
    "find_output_device",
    "list_output_devices",
    "make_output",
    "write_sound_file",
]
