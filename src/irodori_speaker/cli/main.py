"""The `irodori-speaker` command line: the parser and the dispatch; each command group is a module.

Errors print as one line (plus a hint when there is one) and exit with status 1;
usage errors exit with 2 (argparse); Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from .. import __version__
from ..errors import IrodoriError
from . import bench, cache, devices, models, say, serve, userdict
from .common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, add_log_flags
from .messages import Phases, cli_hint

EPILOG = """\
exit status: 0 done; 1 an error (one line on stderr, with a hint), or some phrases failed
(prebuild), or problems found (cache verify); 2 bad usage; 130 interrupted (Ctrl-C).
Run `irodori-speaker COMMAND --help` for a command's options. Everything runs offline
with --tiny-random (a small random model: the output is noise)."""


#: Each module adds its subcommands to the parser with `register(sub)`, in this order.
COMMAND_MODULES = (say, cache, devices, bench, models, serve, userdict)


class Parser(argparse.ArgumentParser):
    """Usage errors as two lines (the error, where the help is) instead of the whole usage block
    before them; the subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(
            EXIT_USAGE, f"error: {self.prog}: {message}\nhint: `{self.prog} --help` lists the options\n"
        )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="irodori-speaker",
        description="Japanese speech for livestream bots, on our own PyTorch Irodori-TTS engine.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"irodori-speaker {__version__}")
    add_log_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (a test's capture, a redirected stream)."""

    @property  # type: ignore[override]
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it
        pass


class _LineFormatter(logging.Formatter):
    """`warning: message` like the CLI's `error:` lines; with -v the logger's name too."""

    def __init__(self, with_name: bool) -> None:
        super().__init__()
        self.with_name = with_name

    def format(self, record: logging.LogRecord) -> str:
        line = f"{record.levelname.lower()}: {record.getMessage()}"
        if self.with_name:
            line += f" [{record.name}]"
        if record.exc_info and self.with_name:
            line += "\n" + self.formatException(record.exc_info)
        return line


def setup_logging(quiet: int, verbose: int) -> None:
    """The package's loggers ("irodori_speaker.*") on stderr: warnings by default, -v info, -vv debug."""
    level = logging.ERROR if quiet else {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    logger = logging.getLogger("irodori_speaker")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        logger.addHandler(_StderrHandler())
    for h in logger.handlers:
        if isinstance(h, _StderrHandler):
            h.setFormatter(_LineFormatter(with_name=bool(verbose)))
    logger.setLevel(level)


def run(argv: Sequence[str] | None = None) -> int:
    """Parse and run one command; errors propagate (main() turns them into a line and a status)."""
    phases = Phases()
    args = build_parser().parse_args(argv)
    args.phases = phases
    if getattr(args, "log_level", None) is None:
        setup_logging(args.quiet, args.verbose)
    elif args.quiet or args.verbose:  # a command with its own --log-level (serve): -q / -v set it
        args.log_level = "error" if args.quiet else "info" if args.verbose == 1 else "debug"
    return int(args.func(args))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return run(argv)
    except IrodoriError as e:
        msg = " ".join(super(IrodoriError, e).__str__().split("\n"))  # one line, always
        print(f"error: {msg}", file=sys.stderr)
        if e.hint:
            print(f"hint: {cli_hint(e.hint)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `irodori-speaker cache list | head`
        with_devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(with_devnull, sys.stdout.fileno())
        return EXIT_OK
