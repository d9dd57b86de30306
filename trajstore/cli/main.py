"""The ``trajstore`` command's entry point: parse, run the command, turn any error into one line.

Exit status: 0 done, 1 ``check`` found problems, 2 any error (bad usage, a run the store does not hold, an
unreachable store, …), 130 interrupted (``serve`` exits 0: Ctrl-C is how it stops). Errors are printed as one line
(``trajstore: error: …``), without terminal colour codes, naming the command's flags where the library's message
names its arguments (``run_id`` is ``--run``). Set ``TRAJSTORE_DEBUG=1`` to see a traceback.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from typing import Mapping, Sequence

from trajstore.cli.parser import build_parser
from trajstore.errors import TrajstoreError, one_line
from trajstore.settings import Settings

log = logging.getLogger(__name__)

EXIT_ERROR = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(_attach_negative_values(given))
    except SystemExit as exc:  # a usage error, said in one line (--help and --version exit 0: they stay exits)
        if exc.code == EXIT_ERROR:
            return EXIT_ERROR
        raise
    args.argv = given  # as typed: what a command tells to run again
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("trajstore: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:
        if Settings.from_env().debug:
            raise
        print(f"trajstore: error: {_message(exc, _flags(args))}", file=sys.stderr)
        return EXIT_ERROR


def _attach_negative_values(argv: list[str]) -> list[str]:
    """``--order-by -episode_return`` means descending order, not an unknown option."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--order-by" and arg.startswith("-"):
            out[-1] = f"--order-by={arg}"
        else:
            out.append(arg)
    return out


# "run_id: …", "gamma must …" and "give run_id= …": where a library message names an argument
ARGUMENT = re.compile(r"^(\w+)(?=(?:\[[^\]]*\])?: | must )|\b(\w+)=(?!\w)")


def _flags(args: argparse.Namespace) -> Mapping[str, str]:
    return getattr(args, "flags", None) or {}


def _flag(m: re.Match[str], flags: Mapping[str, str]) -> str:
    """The flag for a library argument name ``m`` found in a message (``where=`` becomes ``--where ``: the value
    that follows stays apart), or the name as it was."""
    name = m.group(1) or m.group(2)
    if name not in flags:
        return m.group(0)
    value_follows = m.group(2) is not None and m.string[m.end():m.end() + 1] not in ("", " ", ";", ",", ")", ".")
    return flags[name] + (" " if value_follows else "")


def _message(exc: BaseException, flags: Mapping[str, str] = {}) -> str:
    """``exc`` as one line: no colour codes, and the command's flags for the argument names it starts with."""
    text = one_line(exc)  # no terminal codes (deltalake's errors carry some), one line
    if isinstance(exc, (TrajstoreError, OSError)):
        return ARGUMENT.sub(lambda m: _flag(m, flags), text)
    return f"{type(exc).__name__}: {text} (set TRAJSTORE_DEBUG=1 for a traceback)"
