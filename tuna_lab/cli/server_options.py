"""Options of the commands that act on a running server (``pin``, ``unpin``, ``status``, ``plan --pid``,
``audit``, ``run --pid``): its workers (``--worker-pids``/``--worker-match``), its front's CPUs
(``--front-cpus``) and the traffic that tells its threads by what they do (``--url``).

Only the standard library is imported here at module level (:mod:`tuna_lab.cli.options` re-exports them).
"""

import argparse

__all__ = ["add_front_cpus_option", "front_cpus_of", "add_worker_options", "worker_choice_of",
           "add_traffic_options", "traffic_of"]

#: Where the help of these options points for what they do in full (said once, there).
CLI_DOCS = "docs/cli.md"

#: The release that gave a list of worker PIDs its one name, ``--worker-pids`` (``--workers`` is a count).
RENAMED_IN = "0.1.0"



def add_front_cpus_option(parser, help=None):
    """Add ``--front-cpus CPULIST``: the master, helpers and front ends on CPUs of their own, the workers on the rest.

    ``help``: the command's own words for it (default: ``pin``'s and ``plan``'s).

    Examples
    --------
    >>> import argparse
    >>> p = argparse.ArgumentParser()
    >>> add_front_cpus_option(p)
    >>> p.parse_args(["--front-cpus", "0"]).front_cpus
    '0'
    """
    parser.add_argument("--front-cpus", default=None, metavar="CPULIST",
                        help=help or "CPUs (e.g. 0) for all threads of the master, helpers and front ends; the "
                                     f"workers get the rest ({CLI_DOCS})")


def front_cpus_of(args, cpus):
    """The CPUs ``--front-cpus`` names (a sorted tuple), each one of ``cpus`` and leaving some; None without it."""
    from .._checks import format_cpulist, parse_cpulist
    from ..errors import PlanError

    text = getattr(args, "front_cpus", None)
    if text is None:
        return None
    front = tuple(sorted(set(parse_cpulist(text, "--front-cpus", PlanError))))
    if not front:
        raise PlanError(f"--front-cpus names no CPU: {text!r}")
    stray = sorted(set(front) - set(cpus))
    if stray:
        raise PlanError(f"--front-cpus: CPU {format_cpulist(stray)} is not one of the server's CPUs "
                        f"{format_cpulist(sorted(cpus))}")
    if set(cpus) <= set(front):
        raise PlanError(f"--front-cpus {format_cpulist(front)} leaves no CPU for the workers (the server's CPUs "
                        f"are {format_cpulist(sorted(cpus))})")
    return front


class _Renamed(argparse.Action):
    """``--workers`` where it used to be a list of worker PIDs: refused in one line (exit 2), pointing to
    ``--worker-pids``, for one release; then it is an unknown option like any other."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs=argparse.OPTIONAL, default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is a worker count; a list of worker PIDs is --worker-pids "
                     f"(renamed in {RENAMED_IN})")


def add_worker_options(parser, renamed=True):
    """Add ``--worker-pids PID,PID`` and ``--worker-match REGEX``: name the workers instead of discovering them.

    ``renamed``: refuse ``--workers``, these commands' old name of ``--worker-pids``
    (``pin``, ``unpin``, ``status``, ``audit``); ``plan`` passes False: its
    ``-w/--workers`` is W, a count, as everywhere.

    Examples
    --------
    >>> import argparse
    >>> p = argparse.ArgumentParser()
    >>> add_worker_options(p)
    >>> a = p.parse_args(["--worker-match", "inference"])
    >>> a.worker_pids, a.worker_match
    (None, 'inference')
    """
    g = parser.add_argument_group(f"which processes are the workers (discovered unless named; see {CLI_DOCS})")
    which = g.add_mutually_exclusive_group()
    which.add_argument("--worker-pids", default=None, metavar="PIDS",
                       help="the workers' PIDs, comma-separated (under the master); slots go in their start order")
    which.add_argument("--worker-match", default=None, metavar="REGEX",
                       help="the workers: the processes under the master whose command line REGEX matches")
    if renamed:
        parser.add_argument("--workers", action=_Renamed)


def worker_choice_of(args):
    """The :class:`~tuna_lab.live.roles.WorkerChoice` of ``--worker-pids``/``--worker-match`` (None: discover)."""
    from ..live.roles import WorkerChoice

    choice = WorkerChoice.parse(getattr(args, "worker_pids", None), getattr(args, "worker_match", None))
    return choice or None


def add_traffic_options(parser):
    """Add ``--url``, ``--method``, ``--header`` and ``--body``: the few requests that show which threads work.

    Examples
    --------
    >>> import argparse
    >>> p = argparse.ArgumentParser()
    >>> add_traffic_options(p)
    >>> a = p.parse_args(["--url", "http://127.0.0.1:8000/", "--header", "A: b", "--header", "C:d"])
    >>> a.url, a.method, a.header
    ('http://127.0.0.1:8000/', None, ['A: b', 'C:d'])
    """
    g = parser.add_argument_group(f"finding pool threads by their activity (see {CLI_DOCS})")
    g.add_argument("--url", default=None, help="a loopback URL that runs the model, e.g. http://127.0.0.1:8000/predict")
    g.add_argument("--method", default=None, help="the HTTP method (default: POST with --body, else GET)")
    g.add_argument("--header", action="append", default=[], metavar="K:V", help="a request header; repeatable")
    g.add_argument("--body", default=None, metavar="FILE", help="the request body, read from FILE ('-': stdin)")


def traffic_of(args, master):
    """The :class:`~tuna_lab.live.traffic.Activity` of ``--url`` requests to ``master``; None without ``--url``.

    The requests are built as ``run`` builds its own
    (:meth:`~tuna_lab.measure.loadgen.requests.Requests.from_options`): a body goes
    as ``application/json`` unless a ``--header Content-Type:...`` says otherwise;
    and sent by the load generator (:func:`~tuna_lab.measure.loadgen.rounds.round_sender`).

    Raises
    ------
    PinError
        Options without ``--url``, or a request that fails.
    TargetError
        A malformed header, or an unreadable body file.
    """
    from ..errors import PinError
    from ..measure.loadgen.requests import Requests
    from ..measure.loadgen.rounds import round_sender

    if args.url is None:
        if args.method or args.header or args.body:
            raise PinError("--method, --header and --body describe the requests of --url: give --url too")
        return None
    # The one recipe of run and tune: --body - is read from stdin there too, and the headers are theirs.
    requests = Requests.from_options(args.url, args.method, args.header, args.body)
    send = round_sender(requests, error=PinError)
    from ..live.traffic import serve_requests

    return serve_requests(master, send, choice=worker_choice_of(args))
