"""`prebuild` (render stock phrases into the phrase cache) and `cache stats|list|verify|clear`."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from typing import Any

from ..errors import InputError, IrodoriError
from .common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    add_cache_flags,
    add_model_flags,
    add_reading_flags,
    add_sampling_flags,
    add_voice_flags,
    build_options,
    check_caption,
    load_from_args,
    load_kwargs,
    open_cache,
    show_progress,
    sub_parser,
    voice_and_checks,
)
from .messages import Progress, phases_of

log = logging.getLogger("irodori_speaker.cli")


def cmd_prebuild(args: argparse.Namespace) -> int:
    from ..cache import format_bytes
    from ..cache.prebuild import load_phrases, prebuild

    phrases = load_phrases(args.phrases)
    if not phrases:
        raise InputError(f"{args.phrases} has no phrases", hint="one phrase per line; # starts a comment")
    voice = voice_and_checks(args)
    with open_cache(args.cache_dir, max_bytes=args.max_bytes, audio_format=args.audio_format) as cache:
        keys = _keys_without_model(args)
        load = (lambda: load_from_args(args)) if keys is not None else None
        if keys is None:
            keys = load_from_args(args)
        progress = Progress("prebuilding", enabled=show_progress(args))

        def show(done: int, total: int, eta: float | None, res: Any) -> None:
            note = "" if res is None else res.phrase.text
            progress(done, total, eta, note)

        try:
            report = prebuild(
                keys, cache, phrases, voice=voice, options=build_options(args), progress=show, load=load
            )
        finally:
            progress.close()
        stats = cache.stats()
    for r in report.failed:
        where = r.phrase.where or r.phrase.text
        print(f"failed: {where}: {r.error}", file=sys.stderr)
    print(report.summary())
    if load is not None and not report.loaded and not report.interrupted:
        if report.cached == report.total:
            print(f"all {report.total} phrases already cached; model not loaded")
        else:
            print("nothing to render; model not loaded")
    print(f"cache {stats.directory}: {stats.entries} entries, {format_bytes(stats.bytes)}")
    log.info("wall: %s", phases_of(args).summary())
    if report.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_OK if not report.failed else EXIT_ERROR


def _keys_without_model(args: argparse.Namespace) -> Any:
    """The phrase keys' model identity from the files and their headers, no weight read
    (synthesis/identity.py); None when it cannot be made so: the model then loads first and
    says why if it cannot."""
    phases = phases_of(args)
    with phases.phase("torch import"):
        from ..synthesis.identity import model_identity
    with phases.phase("model identity"):
        try:
            ident = model_identity(**load_kwargs(args))
        except (IrodoriError, OSError) as e:
            log.debug("phrase keys need the model loaded: %s", e)
            return None
    log.info(
        "model identity without its weights: %.2f s (files hashed, headers read)",
        phases.parts["model identity"],
    )
    check_caption(args, ident)
    return ident


def cmd_cache_stats(args: argparse.Namespace) -> int:
    from ..cache import format_bytes

    with open_cache(args.cache_dir, must_exist=True) as cache:
        s = cache.stats()
    if args.json:
        print(json.dumps(s.as_dict(), ensure_ascii=False, indent=2))
        return EXIT_OK
    rate = "n/a" if math.isnan(s.hit_rate) else f"{100 * s.hit_rate:.1f}%"
    print(f"directory   {s.directory}")
    print(f"entries     {s.entries} ({s.audio_seconds:.1f} s of audio)")
    print(f"size        {format_bytes(s.bytes)} of {format_bytes(s.max_bytes)}")
    print(f"lookups     {s.hits} hits, {s.misses} misses (hit rate {rate})")
    print(f"stores      {s.stores}; evicted {s.evictions}; dropped as damaged {s.dropped}")
    if s.read_only:
        print("mode        read-only (hits are served; nothing is stored, counted or repaired)")
    return EXIT_OK


def cmd_cache_list(args: argparse.Namespace) -> int:
    with open_cache(args.cache_dir, must_exist=True) as cache:
        rows = cache.entries(limit=args.limit, order=args.sort)
    for e in rows:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used))
        print(f"{e.key[:12]}  {e.seconds:6.2f} s  {e.hits:5d} hits  {used}  {e.source:<8}  {e.text}")
    return EXIT_OK


def cmd_cache_verify(args: argparse.Namespace) -> int:
    with open_cache(args.cache_dir, must_exist=True) as cache:
        progress = Progress("verifying", enabled=show_progress(args))
        try:
            report = cache.verify(repair=not args.no_repair, on_entry=progress)
        finally:
            progress.close()
    if cache.read_only and not args.no_repair:
        print(f"note: {cache.directory} is read-only: reporting only, nothing repaired", file=sys.stderr)
    for key, text, why in report.bad:
        action = "dropped" if report.repaired else "bad"
        print(f"{action}: {key[:12]} {text!r}: {why}", file=sys.stderr)
    extra = ""
    if report.repaired and (report.orphans_removed or report.temp_removed):
        extra = f"; removed {report.orphans_removed} orphan and {report.temp_removed} temp files"
    print(f"checked {report.checked} entries: {report.ok} ok, {len(report.bad)} damaged{extra}")
    return EXIT_OK if report.clean else EXIT_ERROR


def cmd_cache_clear(args: argparse.Namespace) -> int:
    from ..cache import format_bytes

    with open_cache(args.cache_dir, must_exist=True) as cache:
        if not args.yes:
            s = cache.stats()
            question = f"remove all {s.entries} entries ({format_bytes(s.bytes)}) from {cache.directory}?"
            if not sys.stdin.isatty():
                raise InputError(f"cache clear would {question[:-1]}", hint="add --yes to clear it")
            print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
            if sys.stdin.readline().strip().lower() not in ("y", "yes"):
                print("nothing removed", file=sys.stderr)
                return EXIT_OK
        n, size = cache.clear()
    print(f"removed {n} entries ({format_bytes(size)}) from {cache.directory}")
    return EXIT_OK


def register(sub: Any) -> None:
    p = sub_parser(
        sub,
        "prebuild",
        "render stock phrases into the phrase cache",
        "Render every phrase of PHRASES into the phrase cache, skipping those already there\n"
        "(and valid). PHRASES is a .txt file (one phrase a line, lines starting with # are\n"
        "comments) or a .yaml file (phrases with their own seed/steps/seconds/voice; see\n"
        "docs/cache.md). Cached lines use a fixed seed: the phrase's, --seed, else 0.\n"
        "Safe to interrupt and re-run: only what is missing is rendered, and a file\n"
        "whose every phrase is cached returns without loading the model. A phrase that\n"
        "fails is reported and the others go on; the exit status is 1 if any failed.\n\n"
        "  irodori-speaker prebuild phrases.txt --voice aoi.wav --cache-dir ./phrase-cache",
    )
    p.add_argument("phrases", help="phrase file: .txt (one a line) or .yaml/.yml")
    add_cache_flags(p)
    p.add_argument(
        "--max-bytes", help="size limit of the cache's audio, e.g. 500M, 2G (default: the cache's, 2 GiB)"
    )
    p.add_argument(
        "--audio-format",
        choices=["f32", "flac"],
        default="f32",
        help="how new entries are stored: f32 = exact raw float (default), "
        "flac = 24-bit, about half the size",
    )
    add_model_flags(p)
    add_voice_flags(p)
    add_sampling_flags(
        p, seed_help="seed for phrases that do not set one (default: 0; cached lines need one)"
    )
    add_reading_flags(p)
    p.set_defaults(func=cmd_prebuild)

    p = sub_parser(
        sub,
        "cache",
        "look into the phrase cache: stats, list, verify, clear",
        "Inspect or maintain a phrase cache directory (several processes may use it at once).",
    )
    add_cache_flags(p)
    csub = p.add_subparsers(dest="cache_command", metavar="ACTION")
    csub.required = True
    c = sub_parser(
        csub, "stats", "entries, size, hits and misses", "Entries, size and lifetime hit/miss counts."
    )
    add_cache_flags(c, inner=True)
    c.add_argument("--json", action="store_true", help="print the numbers as JSON")
    c.set_defaults(func=cmd_cache_stats)
    c = sub_parser(
        csub, "list", "the entries, most recently used first", "List entries (key, length, hits, text)."
    )
    add_cache_flags(c, inner=True)
    c.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    c.add_argument(
        "--sort", choices=["last_used", "hits", "bytes", "created"], default="last_used", help="order"
    )
    c.set_defaults(func=cmd_cache_list)
    c = sub_parser(
        csub,
        "verify",
        "check every entry's audio against its checksum",
        "Read every entry and check its size and sha256; drop damaged entries (they are\n"
        "re-rendered on next use) and remove leftover temp and orphan files.\n"
        "Exit status 1 if anything was damaged.",
    )
    add_cache_flags(c, inner=True)
    c.add_argument("--no-repair", action="store_true", help="only report; change nothing")
    c.set_defaults(func=cmd_cache_verify)
    c = sub_parser(
        csub,
        "clear",
        "remove every entry",
        "Remove every entry and reset the counters; asks first (--yes does not).",
    )
    add_cache_flags(c, inner=True)
    c.add_argument("-y", "--yes", action="store_true", help="do not ask (needed when not on a terminal)")
    c.set_defaults(func=cmd_cache_clear)
