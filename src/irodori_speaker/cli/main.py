"""The `irodori-speaker` command line: the parser and the dispatch; each command group is a module.

Errors print as one line (plus a hint when there is one) and exit with status 1;
usage errors exit with 2 (argparse); Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..errors import IrodoriError
from . import bench, cache, devices, models, say
from .common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, add_model_flags

EPILOG = """\
exit status: 0 done; 1 an error (one line on stderr, with a hint), or some phrases failed
(prebuild), or problems found (cache verify); 2 bad usage; 130 interrupted (Ctrl-C).
Run `irodori-speaker COMMAND --help` for a command's options. Everything runs offline
with --tiny-random (a small random model: the output is noise)."""


#: Each module adds its subcommands to the parser with `register(sub)`, in this order.
COMMAND_MODULES = (say, cache, devices, bench, models)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="irodori-speaker",
        description="Japanese speech for livestream bots, on our own PyTorch Irodori-TTS engine.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in COMMAND_MODULES:
        module.register(sub)

    from ..server.command import add_parser as add_serve_parser
    from ..text.dict_command import add_parser as add_dict_parser

    add_serve_parser(sub, add_model_flags)
    add_dict_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except IrodoriError as e:
        msg = super(IrodoriError, e).__str__()
        print(f"error: {msg}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `irodori-speaker cache list | head`
        with_devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(with_devnull, sys.stdout.fileno())
        return EXIT_OK
