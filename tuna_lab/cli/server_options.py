"""Options of the commands that act on a running server (``pin``, ``unpin``, ``status``, ``plan --pid``,
``audit``, ``run --pid``): its workers (``--worker-pids``/``--worker-match``), its front's CPUs
(``--front-cpus``) and the traffic that tells its threads by what they do (``--url``).

Only the standard library is imported here at module level (:mod:`tuna_lab.cli.options` re-exports them).
"""

import argparse

__all__ = ["add_front_cpus_option", "front_cpus_of", "add_worker_options", "worker_choice_of",
           "add_traffic_options", "traffic_of", "add_renamed", "worker_count_arg", "add_request_options",
           "requests_of"]

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
        which = (f"CPU {format_cpulist(stray)} is not one of" if len(stray) == 1 else
                 f"CPUs {format_cpulist(stray)} are not among")
        raise PlanError(f"--front-cpus: {which} the server's CPUs {format_cpulist(sorted(cpus))}")
    if set(cpus) <= set(front):
        raise PlanError(f"--front-cpus {format_cpulist(front)} leaves no CPU for the workers (the server's CPUs "
                        f"are {format_cpulist(sorted(cpus))})")
    return front


class _Renamed(argparse.Action):
    """An option's old spelling, refused in one line (exit 2) that names the new one, for one release; then it
    is an unknown option like any other. ``message`` is that line (``tuna-lab: error:`` is added)."""

    def __init__(self, option_strings, dest, message="", **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs=argparse.OPTIONAL, default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)
        self.message = message

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(self.message)


def add_renamed(parser, *old, new, what=None):
    """Refuse ``old`` (an option's spelling before 0.1.0) with a pointer to ``new``: ``what`` it is.

    Examples
    --------
    >>> import argparse
    >>> p = argparse.ArgumentParser()
    >>> add_renamed(p, "--connections", new="--concurrency", what="requests in flight")
    >>> p.parse_args(["--connections", "8"])  # doctest: +SKIP
    error: --connections is --concurrency (requests in flight), renamed in 0.1.0
    """
    message = (what if what and what.startswith(old[-1]) else
               f"{old[-1]} is {new}" + (f" ({what})" if what else "") + f", renamed in {RENAMED_IN}")
    parser.add_argument(*old, action=_Renamed, message=message)


#: The one line that refuses ``--workers`` (or ``-w``) as a list of worker PIDs.
WORKERS_POINTER = f"--workers is a worker count; a list of worker PIDs is --worker-pids (renamed in {RENAMED_IN})"


def worker_count_arg(text):
    """An argparse ``type``: ``-w/--workers W``, a count; a list of PIDs (``12,13``) gets the pointer to
    ``--worker-pids`` (``plan``, which has both).

    Examples
    --------
    >>> worker_count_arg("4")
    4
    >>> worker_count_arg("123,456")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: --workers is a worker count; a list of worker PIDs is --worker-pids (renamed in 0.1.0)
    """
    if "," in text:
        raise argparse.ArgumentTypeError(WORKERS_POINTER)
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None


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
        add_renamed(parser, "-w", "--workers", new="--worker-pids", what=WORKERS_POINTER)


def worker_choice_of(args):
    """The :class:`~tuna_lab.live.roles.WorkerChoice` of ``--worker-pids``/``--worker-match`` (None: discover)."""
    from ..live.roles import WorkerChoice

    choice = WorkerChoice.parse(getattr(args, "worker_pids", None), getattr(args, "worker_match", None))
    return choice or None


#: The requests' options, said one way wherever a command sends requests (pin, plan, status, run, sweep, tune).
REQUEST_HELP = {"method": "the HTTP method (default: POST with a body, else GET)",
                "header": "a request header, e.g. Content-Type:application/json; repeatable",
                "body": "the body of every request, read from FILE ('-': stdin)",
                "bodies": "bodies, one JSON document a line, sent in turn"}


def add_request_options(group, bodies=False):
    """Add ``--method``, ``--header`` and ``--body`` (and, ``bodies``, ``--bodies``) to ``group``, in one wording.

    Examples
    --------
    >>> import argparse
    >>> p = argparse.ArgumentParser()
    >>> add_request_options(p)
    >>> p.parse_args(["--header", "A: b", "--body", "-"]).body
    '-'
    """
    group.add_argument("--method", default=None, metavar="METHOD", help=REQUEST_HELP["method"])
    group.add_argument("--header", action="append", default=[], metavar="NAME:VALUE", help=REQUEST_HELP["header"])
    group.add_argument("--body", default=None, metavar="FILE", help=REQUEST_HELP["body"])
    if bodies:
        group.add_argument("--bodies", default=None, metavar="FILE.jsonl", help=REQUEST_HELP["bodies"])


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
    g.add_argument("--url", default=None, metavar="URL",
                   help="a loopback URL that runs the model, e.g. http://127.0.0.1:8000/predict")
    add_request_options(g)


def requests_of(args):
    """The :class:`~tuna_lab.measure.loadgen.requests.Requests` the traffic options describe, checked (a
    malformed header, an unreadable body); None without ``--url``. Read before any process is looked at."""
    from ..errors import PinError
    from ..measure.loadgen.requests import Requests

    if args.url is None:
        if args.method or args.header or args.body:
            raise PinError("--method, --header and --body describe the requests of --url: give --url too")
        return None
    # The one recipe of run and tune: --body - is read from stdin there too, and the headers are theirs.
    return Requests.from_options(args.url, args.method, args.header, args.body)


def traffic_of(args, master, requests=None):
    """The :class:`~tuna_lab.live.traffic.Activity` of ``--url`` requests to ``master``; None without ``--url``.

    The requests are built as ``run`` builds its own (:func:`requests_of`, or ``requests`` built by it
    already): a body goes as ``application/json`` unless a ``--header Content-Type:...`` says otherwise;
    and sent by the load generator (:func:`~tuna_lab.measure.loadgen.rounds.round_sender`).

    Raises
    ------
    PinError
        Options without ``--url``, or a request that fails.
    TargetError
        A malformed header, or an unreadable body file.
    """
    from ..errors import PinError
    from ..measure.loadgen.rounds import round_sender

    requests = requests if requests is not None else requests_of(args)
    if requests is None:
        return None
    send = round_sender(requests, error=PinError)
    from ..live.traffic import serve_requests

    return serve_requests(master, send, choice=worker_choice_of(args))
