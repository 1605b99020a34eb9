"""``tuna-lab``: the command line.

One module per command group, each with ``add_parser(subparsers)`` and its
commands: :mod:`~tuna_lab.cli.machine` (``topology``),
:mod:`~tuna_lab.cli.model` (``solve``), :mod:`~tuna_lab.cli.server`
(``serve``, ``status``, ``stop``), :mod:`~tuna_lab.cli.experiment` (``run``,
``sweep``, ``report``, ``demo``), :mod:`~tuna_lab.cli.bench` (``bench``) and
:mod:`~tuna_lab.cli.advise` (``advise``); the options they share are in
:mod:`~tuna_lab.cli.options`. A command imports what it needs when it runs,
so building the parser stays cheap and ``tuna-lab topology``, ``status`` and
``stop`` load no solver.

Every user error ends in one line on stderr and exit status 2; nothing else
is printed to stdout in that case, so ``--json`` output is either a whole
object or nothing.
"""

import argparse
import sys

from ..errors import TunaError
from . import advise, bench, experiment, machine, model, placement, server

__all__ = ["main", "build_parser"]

# The order of `tuna-lab --help`'s list of commands.
_GROUPS = (machine, model, placement, server, experiment, bench, advise)


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (not usage + error) and exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser():
    """The ``tuna-lab`` argument parser, every command group registered (what the docs render)."""
    p = _Parser(prog="tuna-lab", description="Static thread-to-core mapping after the Tuna article.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for group in _GROUPS:
        group.add_parser(sub)
    return p


def _terminate_as_interrupt(signum, frame):
    # SIGTERM (kill, a CI timeout) unwinds like Ctrl-C, so every server the
    # command started is stopped by its context manager instead of orphaned.
    raise KeyboardInterrupt


def main(argv=None):
    """Run ``tuna-lab`` with ``argv`` (default: the process's arguments); returns the exit status.

    0 on success, 2 on bad input (one line on stderr), 130 when interrupted
    (Ctrl-C or SIGTERM).

    Examples
    --------
    >>> main(["topology", "--synthetic", "core:2 pu:1", "--json"])  # doctest: +ELLIPSIS
    {"name": "synthetic:core:2 pu:1", ...}
    0
    """
    import signal
    import threading

    parser = build_parser()
    args = parser.parse_args(argv)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    try:
        return args.func(args)
    except TunaError as exc:
        print(f"tuna-lab: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tuna-lab: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `tuna-lab ... --json | head`: the reader left; that is not an error of ours.
        sys.stderr.close()
        return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
