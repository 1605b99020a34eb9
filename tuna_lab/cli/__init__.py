"""``tuna-lab``: the command line.

The commands' modules are in :mod:`tuna_lab.cli.commands`, each named for its
command(s) and with ``add_parser(subparsers, command=None)``: ``topology``,
``solve``, ``plan``, ``pin`` (``pin``, ``unpin``), ``serve`` (``serve``,
``status``, ``stop``), ``audit``, ``run`` (``run``, ``demo``), ``sweep``,
``report``, ``tune``, ``bench`` and ``advise``; the options and helpers several
share are in :mod:`~tuna_lab.cli.options`.
:data:`~tuna_lab.cli.commands.COMMANDS` names each command's module and its
one-line help, so that :func:`main` imports only the module of the command being
run (``tuna-lab --help`` lists them all and imports none), and a command imports
what it needs when it runs: ``tuna-lab topology``, ``status`` and ``stop`` load
no solver, server or analysis.

Every user error ends in one line on stderr and exit status 2; nothing else
is printed to stdout in that case, so ``--json`` output is either a whole
object or nothing. A measurement that ran and failed exits 1, and so does
output that could not be written (a full disk, ``> /dev/full``): one line on
stderr, never a traceback, ``--help`` and ``--version`` included. Results go to stdout, progress (trials, cells, a model's
first training) to stderr, so ``tuna-lab run ... --json > run.json`` keeps
only the object.
"""

import argparse
import errno
import importlib
import os
import re
import sys
import textwrap

from .. import __version__
from ..errors import TunaError
from .commands import COMMANDS

__all__ = ["main", "build_parser"]


def _module(command):
    """The module of ``command`` (a :data:`~tuna_lab.cli.commands.COMMANDS` entry), imported when first used:
    main() imports only the one of the command it runs."""
    return importlib.import_module(f"{__name__}.commands.{command.module}")


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, in one style for every command.

    * A default is written one way, ``(default: X)`` at the end of the help:
      added here when the option has a meaningful one (not None, False or
      empty; ``argparse.ArgumentDefaultsHelpFormatter`` would add "(default:
      None)" to every option without one), and not when the help says it
      already, in those words (tests/test_cli_names.py holds every help to it).
    * An option is shown as ``-w, --workers W``, not ``-w W, --workers W``.
    * The usage line names the required options and the positionals, then
      ``[options]``: the options are listed below it, each once.
    * Description and epilog paragraphs are wrapped as usual, but indented
      lines (the examples) are kept as written, as ``RawDescriptionHelpFormatter``
      would keep them.
    """

    def _get_help_string(self, action):
        help = action.help or ""
        default = action.default
        shown = (default is not None and default is not False and default is not argparse.SUPPRESS
                 and not (isinstance(default, (str, list, tuple)) and not default)
                 and "(default" not in help and "%(default)" not in help)
        if shown and (action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)):
            # A float as a number is written (5, not 5.0): one way of writing a default.
            value = f"{default:g}" if isinstance(default, float) else str(default)
            help += f" (default: {value.replace('%', '%%')})"
        return help

    def _format_action_invocation(self, action):
        if not action.option_strings or action.nargs == 0:
            return super()._format_action_invocation(action)
        value = self._format_args(action, self._get_default_metavar_for_optional(action))
        return f"{', '.join(action.option_strings)} {value}"

    def add_usage(self, usage, actions, groups, prefix=None):
        if usage is None and actions:
            actions = list(actions)
            required = {a for g in groups if getattr(g, "required", False) for a in g._group_actions}
            shown = [a for a in actions if a.required or not a.option_strings or a in required]
            if any(a not in shown and a.help is not argparse.SUPPRESS and a.dest not in ("help", "version")
                   for a in actions):
                # A positional that stands for the rest: argparse writes an optional one as "[options]".
                shown.append(argparse.Action([], "options", nargs=argparse.OPTIONAL))
            actions = shown
        super().add_usage(usage, actions, groups, prefix)

    def _split_lines(self, text, width):
        # Not at hyphens: "tuna-scatter" and "--time-limit" stay whole.
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _fill_text(self, text, width, indent):
        lines, paragraph = [], []

        def flush():
            if paragraph:
                lines.append(textwrap.fill(" ".join(paragraph), width, initial_indent=indent,
                                           subsequent_indent=indent, break_on_hyphens=False))
                paragraph.clear()

        for line in textwrap.dedent(text).splitlines():
            if line[:1].isspace() or not line.strip():
                flush()
                lines.append(indent + line.rstrip() if line.strip() else "")
            else:
                paragraph.append(line.strip())
        flush()
        return "\n".join(lines)


#: A value that looks like a negative number or duration (-1, -1m, -.5s): argparse would take it for an option.
_SIGNED = re.compile(r"-\.?[0-9]")
#: argparse's "argument -w/--workers: " before a message that names its option itself.
_NAMED = re.compile(r"^argument [^ :]+: (?=--?[a-z])")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (not usage + error) and exit status 2.

    Every parser shows defaults and keeps its examples as written (:class:`_HelpFormatter`).
    No option is taken by a prefix of its name (``--model`` is not ``--models``), and an
    option's value may start with a minus (``--budget -1m`` is refused as a value, not
    read as an unknown option). Every error starts ``tuna-lab: error:``, as those of the
    commands themselves do.
    """

    def __init__(self, *args, formatter_class=_HelpFormatter, allow_abbrev=False, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, allow_abbrev=allow_abbrev, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        return super().parse_known_args(None if args is None else self._signed_values(list(args)), namespace)

    def _signed_values(self, args):
        """``--opt -1m`` as ``--opt=-1m`` where ``--opt`` takes one value: the value is the option's to judge."""
        out, i = [], 0
        while i < len(args):
            word = args[i]
            if word == "--":
                return out + args[i:]
            action = self._option_string_actions.get(word)
            if (action is not None and action.nargs is None and i + 1 < len(args)
                    and isinstance(args[i + 1], str) and _SIGNED.match(args[i + 1])):
                out.append(f"{word}={args[i + 1]}")
                i += 2
                continue
            out.append(word)
            i += 1
        return out

    def error(self, message):
        self.exit(2, f"tuna-lab: error: {_NAMED.sub('', message)}\n")


_EPILOG = """\
examples:
  tuna-lab solve -w 4 -t 4 --preset xeon-8272cl      the Tuna mapping on the article's machine
  tuna-lab run -w 2 -t 2 --model small --out results  measure policies on this machine
  tuna-lab demo                                       both, sized to this machine

`tuna-lab COMMAND --help` explains a command's options.
"""


def build_parser():
    """The ``tuna-lab`` argument parser, every command fully built (what the docs render).

    Examples
    --------
    >>> build_parser().parse_args(["solve", "-w", "2", "-t", "2"]).command
    'solve'
    """
    return _parser(COMMANDS)


def _parser(built):
    """The ``tuna-lab`` parser with the commands ``built`` built by their modules.

    Every other command is listed with its help (:data:`~tuna_lab.cli.commands.COMMANDS`) and
    nothing else: its module is not imported.
    """
    p = _Parser(prog="tuna-lab", epilog=_EPILOG,
                description="Static thread-to-core mapping for multi-worker, multi-threaded CPU inference "
                            "servers, after the Tuna article: solve the mapping, pin a real server's "
                            "threads, measure and analyse.")
    # The version is the package's own attribute: no metadata lookup, nothing else imported.
    p.add_argument("--version", action="version", version=f"tuna-lab {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(title="commands", dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for name, command in COMMANDS.items():
        if name in built:
            _module(command).add_parser(sub, name)
        else:
            sub.add_parser(name, help=command.help)
    return p


def _command_in(argv):
    """The command ``argv`` names: its first word that is not an option (``tuna-lab`` itself takes no values)."""
    return next((word for word in argv if not word.startswith("-")), None)


def _terminate_as_interrupt(signum, frame):
    # SIGTERM (kill, a CI timeout) and SIGHUP (a closed terminal, a dropped ssh session) unwind like
    # Ctrl-C, so every server the command started is stopped by its context manager, its pins given
    # back and its finished trials kept, instead of the process dying where it stood.
    raise KeyboardInterrupt


# live.ledger.signals_give_back takes over a handler so marked (and leaves a caller's own alone):
# under `pin --watch` a SIGHUP gives every mask back rather than unwinding as Ctrl-C, which keeps them.
_terminate_as_interrupt.unwinds_as_interrupt = True


class _Unwritable(BaseException):
    """stdout could not take what a command printed (a full disk, ``> /dev/full``).

    A BaseException, as KeyboardInterrupt is: no command's ``except Exception``
    may take it for a failure of its own and go on printing.
    """

    def __init__(self, error):
        super().__init__(error)
        self.error = error


class _Stdout:
    """A command's stdout: a write or flush the stream cannot take raises :class:`_Unwritable`.

    Told apart there, at the stream, from any other OSError a command may
    meet; the rest of the stream (``fileno``, ``isatty``, ...) is the stream's.
    A broken pipe stays a BrokenPipeError (the reader left: see :func:`main`).
    """

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _Unwritable(exc) from None

    def flush(self):
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise _Unwritable(exc) from None

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _drop_pending(stream):
    """Point the process's stdout at /dev/null once it failed, so that what is still buffered in ``stream``
    goes nowhere at exit rather than fail again there (a second message, exit status 120)."""
    if stream is not sys.__stdout__:
        return                                     # in-process (a test's StringIO): nothing flushes it at exit
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)
    except (OSError, ValueError, AttributeError):
        pass


def main(argv=None):
    """Run ``tuna-lab`` with ``argv`` (default: the process's arguments); returns the exit status.

    0 on success, 1 when something ran but some policy has no valid trial,
    nothing ran, or stdout could not take the output (a full disk; one line
    on stderr), 2 on bad input (one line on stderr), 130 when interrupted
    (Ctrl-C, SIGTERM, or SIGHUP unless it is ignored, as under ``nohup``).

    Examples
    --------
    >>> main(["topology", "--synthetic", "core:2 pu:1", "--json"])  # doctest: +ELLIPSIS
    {"name": "synthetic:core:2 pu:1", ...}
    0
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    stream = sys.stdout
    sys.stdout = _Stdout(stream)
    try:
        try:
            status = _main(argv)
        except SystemExit as exc:              # argparse: --help, --version, a usage error
            status = exc
        # What is still buffered must reach stdout before the status says it did.
        sys.stdout.flush()
    except _Unwritable as exc:
        from .._checks import one_line as first_line

        print(f"tuna-lab: error: cannot write the output to stdout: {exc.error.strerror or first_line(exc.error)}",
              file=sys.stderr)
        _drop_pending(stream)
        return 1
    except BrokenPipeError:
        # `tuna-lab ... --json | head`: the reader left; that is not an error of ours.
        _drop_pending(stream)
        sys.stderr.close()
        return 0
    finally:
        sys.stdout = stream
    if isinstance(status, SystemExit):
        raise status
    return status


def _main(argv):
    """:func:`main` but for what stdout could not take."""
    import signal
    import threading
    import warnings

    from ..errors import RelaxedMappingWarning, ThrottlingWarning

    # Only the module of the command run is imported (a start in a tenth of a second); an unknown or
    # missing command gets the list of them all, as `tuna-lab --help` shows it.
    args = _parser({_command_in(argv)}).parse_args(argv)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, _terminate_as_interrupt)
        # Not where SIGHUP is ignored: `nohup tuna-lab sweep ...` asked to outlive its terminal.
        if signal.getsignal(signal.SIGHUP) is signal.SIG_DFL:
            previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, _terminate_as_interrupt)
    shown = warnings.showwarning

    def one_line(message, category, filename, lineno, file=None, line=None):
        # a relaxed Tuna mapping (plan, pin, serve, run, sweep): one line, said once
        if issubclass(category, RelaxedMappingWarning):
            print(f"tuna-lab: note: {message}", file=sys.stderr, flush=True)
        elif issubclass(category, ThrottlingWarning):
            # a command that starts servers without checking the quota first (tune, bench)
            print(f"tuna-lab: warning: {message}", file=sys.stderr, flush=True)
        else:
            shown(message, category, filename, lineno, file, line)

    try:
        # The filters and showwarning are the command's own, restored after it (check_cpu_quota
        # silences a warning it has already said).
        with warnings.catch_warnings():
            warnings.showwarning = one_line
            return args.func(args)
    except TunaError as exc:        # UnsafeFileError too: a TunaError before it is an OSError
        from .._checks import one_line as first_line

        print(f"tuna-lab: error: {first_line(exc)}", file=sys.stderr)
        return 2
    except (MemoryError, RecursionError, OverflowError) as exc:
        # A net, not the fix: input too large or too deeply nested that no check caught still ends in one line.
        from .._checks import one_line as first_line

        print(f"tuna-lab: error: the input is too large or too deeply nested ({type(exc).__name__}: "
              f"{first_line(exc)})", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tuna-lab: interrupted", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
