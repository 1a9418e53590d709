"""`dict add|list|remove|import|export`: the user dictionary (text/userdict.py) from the shell."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import InputError
from ..text.userdict import WORD_TYPES, BadRow, UserDictError, UserDictionary, default_user_dict_path
from .common import EXIT_OK, sub_parser

DESCRIPTION = f"""\
Edit the user dictionary every synthesis applies (Speaker, say, prebuild, serve): a
surface form is read as the given reading. Stored in a sqlite file (default
{default_user_dict_path()}; $IRODORI_DICT or --file moves it).

  irodori-speaker dict add VTuber ブイチューバー --accent 4
  irodori-speaker dict list
  irodori-speaker dict export > words.json      # VOICEVOX's user-dictionary JSON
  irodori-speaker dict import words.json"""


def register(sub: Any) -> None:
    p = sub_parser(sub, "dict", "the user dictionary: add, list, remove, import, export", DESCRIPTION)
    p.add_argument("--file", help="the dictionary file (default: $IRODORI_DICT or the user's)")
    dsub = p.add_subparsers(dest="dict_command", metavar="ACTION")
    dsub.required = True
    a = dsub.add_parser("add", help="add a word")
    a.add_argument("surface", help="the word as written, e.g. VTuber")
    a.add_argument("reading", help="its reading in katakana or hiragana, e.g. ブイチューバー")
    a.add_argument("--accent", type=int, default=0, help="accent type: 0 flat, n = falls after mora n")
    a.add_argument("--word-type", choices=list(WORD_TYPES), default="PROPER_NOUN")
    a.add_argument("--priority", type=int, default=5, help="0-10; where words overlap the higher wins")
    a.set_defaults(func=cmd_add)
    ls = dsub.add_parser("list", help="list the words")
    ls.add_argument("--json", action="store_true", help="VOICEVOX JSON instead of a table")
    ls.set_defaults(func=cmd_list)
    r = dsub.add_parser("remove", help="remove a word by UUID (or by surface when unique)")
    r.add_argument("word", help="the word's UUID (dict list shows it) or its surface")
    r.set_defaults(func=cmd_remove)
    i = dsub.add_parser("import", help="import VOICEVOX user-dictionary JSON")
    i.add_argument("path", help="a .json file ({uuid: word}, as VOICEVOX exports it)")
    i.add_argument("--keep", action="store_true", help="keep existing words with the same UUID")
    i.set_defaults(func=cmd_import)
    e = dsub.add_parser("export", help="print the dictionary as VOICEVOX JSON")
    e.add_argument("-o", "--output", help="write to this file instead of stdout")
    e.set_defaults(func=cmd_export)


def _dict(args: argparse.Namespace) -> UserDictionary:
    return UserDictionary(args.file)


def cmd_add(args: argparse.Namespace) -> int:
    w = _dict(args).add(args.surface, args.reading, args.accent, args.word_type, args.priority)
    print(f"added {w.surface} -> {w.pronunciation}  ({w.uuid})")
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    d = _dict(args)
    if args.json:
        print(json.dumps(d.export_voicevox(), ensure_ascii=False, indent=2))
        return EXIT_OK
    words, bad = d.words(), d.bad_rows()
    for w in words:
        print(
            f"{w.uuid}  {w.surface}\t{w.pronunciation}\taccent {w.accent_type}\t{w.word_type}\tp{w.priority}"
        )
    for b in bad:  # rows another tool or a hand edit broke: skipped by every line
        print(f"{_row_name(b)}  BAD {str(b.surface)[:40]!r}: {b.why}")
    note = f", {len(bad)} bad row(s) skipped (`dict remove` removes one)" if bad else ""
    print(f"{len(words)} word(s) in {d.path}{note}", file=sys.stderr)
    return EXIT_OK


def _row_name(b: BadRow) -> str:
    """What `dict remove` takes for a bad row: its uuid, or row:N when that is unusable."""
    return b.uuid if isinstance(b.uuid, str) and b.uuid.strip() else f"row:{b.rowid}"


def cmd_remove(args: argparse.Namespace) -> int:
    d = _dict(args)
    matches = [w for w in d.words() if args.word in (w.uuid, w.surface)]
    bad = [b for b in d.bad_rows() if args.word in (_row_name(b), b.surface)]
    if len(matches) + len(bad) != 1:
        raise InputError(
            f"{len(matches) + len(bad)} words match {args.word!r}",
            hint="give the UUID (or row:N) that `dict list` shows",
        )
    if bad:
        d.remove_row(bad[0].rowid)
        print(f"removed the bad row {_row_name(bad[0])} ({bad[0].why})")
        return EXIT_OK
    d.remove(matches[0].uuid)
    print(f"removed {matches[0].surface} ({matches[0].uuid})")
    return EXIT_OK


def cmd_import(args: argparse.Namespace) -> int:
    n = _dict(args).import_voicevox(args.path, override=not args.keep)
    print(f"imported {n} word(s)")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    text = json.dumps(_dict(args).export_voicevox(), ensure_ascii=False, indent=2)
    if args.output:
        try:
            with open(args.output, "w", encoding="utf-8") as f:
                f.write(text + "\n")
        except OSError as e:
            raise UserDictError(
                f"cannot write {args.output}: {e.strerror or e}", hint="choose a file you can write"
            ) from e
    else:
        print(text)
    return EXIT_OK
