"""Captions from line timings: cues, SRT and WebVTT files, and a caption file for OBS.

A cue is a run of words of one line (`estimate.LineTiming`), cut after sentence and clause
punctuation and before it grows past `max_chars`, with the text between its words as written
in the spoken text (punctuation kept). `srt()` / `webvtt()` format cues; `CaptionFile` keeps a
text file holding the cue being heard, which an OBS "Text (GDI+/FreeType 2)" source with
"Read from file" shows live (written atomically: OBS never reads half a line).

Captions show the line as written (`LineTiming.shown`: "VTuberの配信で草", the timing being
of what the model read, ブイチューバーの...), less its pause markup and the tags stripped from
speech; a timing without a source (`estimate_timing` given none) shows the spoken text.
"""

from __future__ import annotations

import errno
import math
import os
import stat
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import IrodoriError
from .estimate import LineTiming

__all__ = ["CaptionError", "CaptionFile", "Cue", "cues", "srt", "webvtt"]


class CaptionError(IrodoriError):
    """A caption or subtitle file cannot be written (a full disk, a directory, no permission)."""


# text.split's SENTENCE_END_CHARS | CLAUSE_CHARS (not imported: the text package imports torch)
_BREAKS = frozenset("。．.!?！？…‥\n、，,､；;")


@dataclass(frozen=True)
class Cue:
    """One caption: `text` shown from `start` to `end` (seconds)."""

    start: float
    end: float
    text: str


def cues(timing: LineTiming, *, max_chars: int = 24, offset: float = 0.0) -> list[Cue]:
    """The line's cues, `offset` seconds later (e.g. the line's start in a longer file)."""
    words = timing.words
    text = timing.text
    shown_of = timing.shown
    out: list[Cue] = []
    first = 0
    for i, w in enumerate(words):
        nxt = words[i + 1].char_start if i + 1 < len(words) else len(text)
        between = text[w.char_end : nxt]
        size = len(shown_of(words[first].char_start, nxt).strip())
        last = i + 1 == len(words)
        grows_past = not last and size + len(shown_of(nxt, words[i + 1].char_end)) > max_chars
        if last or any(c in _BREAKS for c in between) or grows_past:
            a = words[first].char_start if out else 0  # the first cue takes what precedes it
            shown = shown_of(a, nxt).strip()
            if shown:
                out.append(Cue(offset + words[first].start, offset + w.end, shown))
            first = i + 1
    return out


def _stamp(seconds: float, sep: str) -> str:
    if not math.isfinite(seconds):
        raise CaptionError(
            f"a cue time of {seconds} s cannot be written", hint="cue times are finite seconds"
        )
    ms = max(0, round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def srt(items: Iterable[Cue]) -> str:
    """SubRip text: numbered cues, `HH:MM:SS,mmm --> HH:MM:SS,mmm`."""
    blocks = [
        f"{n}\n{_stamp(c.start, ',')} --> {_stamp(c.end, ',')}\n{c.text}\n" for n, c in enumerate(items, 1)
    ]
    return "\n".join(blocks)


def webvtt(items: Iterable[Cue]) -> str:
    """WebVTT text: the header, then `HH:MM:SS.mmm --> HH:MM:SS.mmm` cues."""
    blocks = [f"{_stamp(c.start, '.')} --> {_stamp(c.end, '.')}\n{c.text}\n" for c in items]
    return "WEBVTT\n\n" + "\n".join(blocks)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Replace the file's contents in one step (a reader sees the old text or the new).

    A symlink is written through (its target is replaced; an OBS text source is often a link);
    something that is not a regular file (a device, a FIFO) is written into, never renamed over;
    every failure (a full disk, a directory, no permission) is one `CaptionError`."""
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise _caption_error(path, e) from e
    if mode is not None and stat.S_ISDIR(mode):
        raise CaptionError(f"cannot write the caption file {path}: it is a directory", hint=_HINT_NAME)
    try:
        if mode is not None and not stat.S_ISREG(mode):
            with open(target, "w", encoding="utf-8") as f:  # /dev/stdout, a FIFO: write into it
                f.write(text)
            return
        fd, tmp = tempfile.mkstemp(prefix=".caption-", dir=target.parent)
    except OSError as e:
        raise _caption_error(path, e) from e
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        # the file's own permissions kept; a new one readable by others (mkstemp makes 0600)
        os.chmod(tmp, stat.S_IMODE(mode) if mode is not None else 0o644)
        os.replace(tmp, target)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise _caption_error(path, e) from e
        raise


_HINT_NAME = "give a file name, e.g. captions.txt"


def _caption_error(path: str | os.PathLike[str], e: OSError) -> CaptionError:
    hint = {
        errno.ENOSPC: "free some disk space, or write the captions elsewhere",
        errno.EISDIR: _HINT_NAME,
        errno.ENOENT: "create the folder first, or give a path in an existing one",
        errno.ENOTDIR: "a part of the path is a file, not a folder",
        errno.EACCES: "choose a place you can write to",
        errno.EROFS: "the file system is read-only: choose a place you can write to",
    }.get(e.errno or 0, "check the path and the free disk space")
    return CaptionError(f"cannot write the caption file {path}: {e.strerror or e}", hint=hint)


class CaptionFile:
    """A text file that holds the caption being heard (for an OBS text source).

    `attach(speaker)` follows a Speaker's events: the cue of each word as it is heard, the
    file emptied when a line ends (or kept until the next line with `keep_last=True`).
    `show(cue_text)` / `clear()` write it by hand.
    """

    def __init__(self, path: str | os.PathLike[str], *, max_chars: int = 24, keep_last: bool = False) -> None:
        self.path = Path(path)
        self.max_chars = max_chars
        self.keep_last = keep_last
        self.shown: str | None = None
        self._cues: dict[int, list[Cue]] = {}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _caption_error(path, e) from e
        self.clear()

    def show(self, text: str) -> None:
        if text != self.shown:
            write_text_atomic(self.path, text)
            self.shown = text

    def clear(self) -> None:
        self.show("")

    def attach(self, speaker: Any) -> Any:
        """Follow `speaker`'s events; returns the function that stops following."""
        offs = [
            speaker.on("line_timing", self._on_line),
            speaker.on("word", self._on_word),
            speaker.on(("playback_finished", "playback_interrupted"), self._on_end),
        ]

        def off() -> None:
            for f in offs:
                f()

        return off

    def _on_line(self, event: Any) -> None:
        self._cues[event.utterance_id] = cues(event.timing, max_chars=self.max_chars)

    def _on_word(self, event: Any) -> None:
        for c in self._cues.get(event.utterance_id, ()):
            if c.start <= event.time + 1e-6 and event.time < c.end + 1e-6:
                self.show(c.text)
                return

    def _on_end(self, event: Any) -> None:
        self._cues.pop(event.utterance_id, None)
        if not self.keep_last:
            self.clear()


def line_cues(timings: Sequence[tuple[float, LineTiming]], *, max_chars: int = 24) -> list[Cue]:
    """Cues of several lines, each (its start in seconds, its timing), in order."""
    return [c for start, tm in timings for c in cues(tm, max_chars=max_chars, offset=start)]
