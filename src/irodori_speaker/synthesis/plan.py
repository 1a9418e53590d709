"""A line's plan: the text as the model reads it, cut into pieces that fit, and the silences
between them. No model work (the synthesizer renders the plan: synthesizer.py).

    parts = spoken_parts(text, opts, user_dict)        # "text", Pause(0.5), "text", ...
    plan = plan_line(text, opts, record, tokenizer, max_len, user_dict)
    for piece in plan: ...                              # piece.ids / mask; piece.after: silence

The spoken text is the reference's normalisation, the user dictionary and the readings pass
(text/readings.py), then the normalisation again; pause markup (text/pauses.py) becomes exact
silence. A part longer than one utterance is split at sentence, then clause boundaries
(text/split.py), and again while a piece is over the model's token limit (every re-split
shrinks, so the plan always ends). `LineProgress` counts the plan's sampler steps and
decodes as one bar for the whole line.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InputError
from ..options import SynthesisOptions, SynthesisRecord
from ..text.normalize import drop_lone_surrogates, normalize_or_raise, normalize_text
from ..text.pauses import Pause, split_pauses, strip_markup
from ..text.readings import apply_readings
from ..text.split import check_line_text, measure, split_for_synthesis
from ..text.tags import strip_tags

__all__ = [
    "PIECE_GAP_S",
    "LineProgress",
    "Piece",
    "Plan",
    "caption_source",
    "plan_line",
    "split_to_token_limit",
    "spoken_parts",
]

PIECE_GAP_S = 0.12  # silence between the pieces of a split long text


@dataclass
class Piece:
    text: str
    ids: Any  # (1, L) LongTensor
    mask: Any
    after: float = 0.0  # seconds of exact silence after it (PIECE_GAP_S, or a pause's)


class Plan(list[Piece]):
    """A line's pieces in order (each with the silence after it), and `lead`: the silence
    before the first one (all of a line that is only pauses)."""

    lead: float = 0.0


# ---------------------------------------------------------------------------------------------
# what the model reads
# ---------------------------------------------------------------------------------------------


def spoken(text: str, opts: SynthesisOptions, user_dict: Any = None) -> str:
    """One text part: the reference normalisation, the user dictionary, the readings pass of
    `opts` (tags, URLs, laughter, numbers, English: text/readings.py), then the reference
    normalisation again, so the model always reads text in the form it was trained on."""
    normalized = normalize_or_raise(text)
    if user_dict is not None:
        normalized = user_dict.apply(normalized)
    said = apply_readings(normalized, opts)
    if said != normalized:
        said = normalize_text(said)
        if not said.strip():
            raise InputError(
                f"text {text[:40]!r} has nothing to say once tags and URLs are taken out",
                hint="options tags='keep' / urls='keep' read them as text",
            )
    return said


def spoken_parts(
    text: str, options: SynthesisOptions | Mapping[str, Any] | None = None, user_dict: Any = None
) -> list[str | Pause]:
    """`text` split at its pause markup (`text/pauses.py`): each text part as the model reads
    it (`spoken`), and the Pauses between them. Without markup: `[spoken(text)]`. A part with
    nothing to say between pauses is dropped; a line of only pauses is silence."""
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got {type(text).__name__}")
    opts = options if isinstance(options, SynthesisOptions) else SynthesisOptions.coerce(options)
    if not opts.pause_markup:  # chat text: no silence from markup, and nothing read of it
        text = strip_markup(text)
    parts = split_pauses(text)
    if len(parts) == 1 and isinstance(parts[0], str):
        return [spoken(parts[0], opts, user_dict)]  # less any unclosed markup
    out: list[str | Pause] = []
    for part in parts:
        if isinstance(part, Pause):
            out.append(part)
        elif part.strip():
            with contextlib.suppress(InputError):  # e.g. only a bracket between two pauses
                out.append(spoken(part, opts, user_dict))
    return out


def caption_source(text: str, options: SynthesisOptions) -> str:
    """`text` as captions show it: as written, less what is neither said nor shown (pause
    markup, and the tags `options.tags="strip"` takes out; lone surrogates, which no file or
    database can hold, as the normalisation drops them); `source_spans.SourceMap` aligns the
    spoken text to it."""
    shown = strip_markup(drop_lone_surrogates(text))
    return strip_tags(shown) if options.tags == "strip" else shown


# ---------------------------------------------------------------------------------------------
# the pieces
# ---------------------------------------------------------------------------------------------


def plan_line(
    text: str, opts: SynthesisOptions, record: SynthesisRecord, tokenizer: Any, max_len: int, user_dict: Any
) -> Plan:
    """The line as pieces to render with the silences between them: a long text split into
    pieces joined by PIECE_GAP_S, pause markup as its exact silence. Fills the record's
    text, source, pieces and tokenize time."""
    t0 = time.perf_counter()
    parts = spoken_parts(check_line_text(text), opts, user_dict)
    record.text = "".join(p for p in parts if isinstance(p, str))
    record.source = caption_source(text, opts)
    plan: list[Piece | float] = []
    for part in parts:
        if isinstance(part, Pause):
            plan.append(part.seconds)
            continue
        queue = split_for_synthesis(part) if opts.seconds is None else [part]
        first = True
        while queue:
            piece = queue.pop(0)
            if len(tokenizer.encode(piece)) > max_len:  # over the token limit: split further
                queue[:0] = split_to_token_limit(piece, max_len, tokenizer, record)
                continue
            tok_ids, tok_mask = tokenizer.batch([piece], max_len=max_len, pad_to=opts.pad_text_to)
            if not first:
                plan.append(PIECE_GAP_S)
            plan.append(Piece(piece, tok_ids, tok_mask))
            first = False
    pieces = Plan()
    for entry in plan:
        if isinstance(entry, Piece):
            pieces.append(entry)
        elif pieces:
            pieces[-1].after += entry
        else:
            pieces.lead += entry
    record.pieces = len(pieces)
    record.timings["tokenize"] = time.perf_counter() - t0
    return pieces


def split_to_token_limit(part: str, max_len: int, tokenizer: Any, record: SynthesisRecord) -> list[str]:
    """Pieces of `part` that each strictly shrink it, so the caller's loop ends (issue 12:
    a run the splitter cannot cut used to come back unchanged forever). The splitter at
    half the length first; where that makes no progress (a piece too short for it, or
    whitespace it does not count), the longest character prefix within the token limit."""
    # halve what the splitter counts (non-whitespace): halving len() let "a " * 2000 come
    # back as itself minus a space, 1,874 pieces in all where `seconds` skips the first split
    size = measure(part)
    half = size // 2
    if half >= 8:
        split = split_for_synthesis(part, max_chars=half)
        if len(split) > 1 and all(measure(p) < size for p in split):
            return split
    lo, hi = 1, len(part) - 1  # longest prefix part[:n] that fits (n >= 1 always progresses)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tokenizer.encode(part[:mid])) <= max_len:
            lo = mid
        else:
            hi = mid - 1
    if len(part) == 1 or len(tokenizer.encode(part[:lo])) > max_len:
        # one character over the limit on its own: dropped, and said
        record.warnings.append(f"text cut to the model's {max_len}-token limit")
        return [part[1:]] if len(part) > 1 else []
    return [p for p in (part[:lo], part[lo:]) if p.strip()]


# ---------------------------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------------------------


class LineProgress:
    """The sampler's progress(step, steps) of each piece as progress(done, total) of the whole line.

    Units: every sampler step of every piece, plus one per piece for its decode; so one bar runs
    once across a long text (the splitter's pieces are of similar length) and reaches the end
    when the audio does.
    """

    def __init__(self, progress: Any, pieces: list[Piece]) -> None:
        self.progress = progress
        self.pieces = len(pieces)
        self.steps = 0

    def _report(self, i: int, units_done: int) -> None:
        per_piece = self.steps + 1
        self.progress(i * per_piece + units_done, self.pieces * per_piece)

    def step(self, i: int) -> Any:
        def report(done: int, steps: int) -> None:
            self.steps = steps
            self._report(i, done)

        return report

    def decoded(self, i: int) -> None:
        if self.steps:
            self._report(i, self.steps + 1)
