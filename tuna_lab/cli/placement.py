"""``tuna-lab plan``, ``pin`` and ``unpin``: a placement you can take away, applied to any pre-fork server.

``plan`` prints one placement plan (JSON, ``OMP_PLACES``, ``taskset`` lines or
a Gunicorn config snippet); ``pin --pid MASTER`` binds every worker of a
running server to it, ``--watch`` keeps replacements pinned, and ``unpin``
gives the threads the master's CPUs back. ``status --pid`` (in
:mod:`tuna_lab.cli.server`) shows what is bound. Only the ``tuna-*`` policies
load the solver.
"""

import json
import sys

from .options import add_size_options, add_topology_options, positive_float_arg, topology_of

__all__ = ["add_parser", "plan_for"]

_FORMATS = ("json", "omp-places", "taskset", "gunicorn")
_POLICY_HELP = "the placement policy: cfs, round-robin, omp-spread, omp-close, numa, tuna-scatter, tuna-compact"


def add_parser(subparsers):
    """Add ``plan``, ``pin`` and ``unpin`` to a ``tuna-lab`` subparsers object.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["pin", "--pid", "1", "-t", "2", "--policy", "round-robin", "--dry-run"])
    >>> args.pid, args.threads, args.dry_run, args.watch
    (1, 2, True, False)
    """
    p = subparsers.add_parser(
        "plan", help="print a placement plan: JSON, OMP_PLACES, taskset lines or a Gunicorn config snippet",
        epilog="examples:\n"
               "  tuna-lab plan -w 4 -t 4 --policy tuna-scatter > plan.json\n"
               "  tuna-lab plan -w 2 -t 2 --policy round-robin --format taskset --pid MASTER\n")
    add_size_options(p)
    p.add_argument("--policy", default="tuna-scatter", help=_POLICY_HELP)
    p.add_argument("--format", choices=_FORMATS, default="json", help="what to print")
    p.add_argument("--pid", type=int, default=None, metavar="MASTER",
                   help="for --format taskset: the running server whose TIDs to name")
    p.add_argument("--time-limit", type=positive_float_arg, default=None, metavar="S",
                   help="solver time limit for the tuna-* policies")
    add_topology_options(p)
    p.set_defaults(func=_cmd_plan)

    n = subparsers.add_parser(
        "pin", help="pin every worker thread of a running pre-fork server by its master's PID",
        epilog="examples:\n"
               "  tuna-lab pin --pid MASTER -t 4 --policy tuna-scatter --dry-run\n"
               "  tuna-lab pin --pid MASTER --plan plan.json --watch   re-pin replacement workers until Ctrl-C\n")
    n.add_argument("--pid", type=int, required=True, metavar="MASTER", help="the server's master process")
    n.add_argument("-t", "--threads", type=int, default=None,
                   help="OpenMP threads per worker (with --policy; the workers are counted)")
    n.add_argument("--policy", default=None, help=_POLICY_HELP)
    n.add_argument("--plan", default=None, metavar="FILE", help="a plan from `tuna-lab plan` instead of "
                                                                "--policy/-t")
    n.add_argument("--force", action="store_true", help="apply a plan made on another machine")
    n.add_argument("--watch", action="store_true",
                   help="stay in the foreground and re-pin replacement workers until Ctrl-C/SIGTERM")
    n.add_argument("--dry-run", action="store_true", help="show what would be bound; bind nothing")
    n.add_argument("--json", action="store_true", help="print the report as JSON")
    n.set_defaults(func=_cmd_pin)

    u = subparsers.add_parser("unpin", help="give every worker thread of a running server the master's CPUs back",
                              epilog="example:\n  tuna-lab unpin --pid MASTER\n")
    u.add_argument("--pid", type=int, required=True, metavar="MASTER", help="the server's master process")
    u.add_argument("--json", action="store_true", help="print the report as JSON")
    u.set_defaults(func=_cmd_unpin)
    return [p, n, u]


def plan_for(policy, workers, threads, topology, time_limit=None):
    """The :class:`~tuna_lab.placement.plan.Plan` of ``policy`` for ``workers`` x ``threads`` on ``topology``."""
    from ..placement import placement

    return placement(policy, workers, threads, topology, time_limit=time_limit).plan()


def _cmd_plan(args):
    plan = plan_for(args.policy, args.workers, args.threads, topology_of(args), args.time_limit)
    tids = None
    if args.format == "taskset" and args.pid is not None:
        from ..placement.pin import server_threads

        tids = [{"slot": w["slot"], "rank": t["rank"], "tid": t["tid"]}
                for w in server_threads(args.pid) for t in w["threads"] if t["role"] != "other"]
    print(plan.render(args.format, tids=tids))
    return 0


def _plan_of(args, workers):
    """The plan to apply: ``--plan`` checked against this machine, else one made here."""
    from ..errors import PlanError
    from ..machine import topology_from
    from ..placement.plan import Plan

    here = topology_from(None)
    if args.plan:
        if args.policy or args.threads:
            raise PlanError("give either --plan or --policy/-t, not both")
        return Plan.read(args.plan).check_machine(here, force=args.force)
    if not args.policy or not args.threads:
        raise PlanError("say what to apply: --policy POLICY -t THREADS, or --plan FILE")
    return plan_for(args.policy, len(workers), args.threads, here)


def _cmd_pin(args):
    import threading

    from ..placement.pin import pin_server, watch_server, worker_pids

    plan = _plan_of(args, worker_pids(args.pid))
    report = pin_server(args.pid, plan, dry_run=args.dry_run)
    _show(report, args.json)
    if not args.watch or args.dry_run:
        return 0
    print(f"watching server {args.pid}: replacement workers are pinned to their slot; Ctrl-C to stop",
          file=sys.stderr, flush=True)
    stop = threading.Event()
    try:
        watch_server(args.pid, plan, stop, on_pin=lambda r: _show(r, args.json))
    except KeyboardInterrupt:
        stop.set()
    print("stopped watching; the pins stay in place", file=sys.stderr, flush=True)
    return 0


def _cmd_unpin(args):
    from ..placement.pin import unpin_server

    _show(unpin_server(args.pid), args.json)
    return 0


def _show(report, as_json):
    if as_json:
        print(json.dumps(report.to_dict()), flush=True)
    else:
        print(report.describe(), flush=True)
    for warning in report.warnings:
        print(f"tuna-lab: warning: {warning}", file=sys.stderr, flush=True)
