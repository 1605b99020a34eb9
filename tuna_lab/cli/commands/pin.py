"""``tuna-lab pin`` and ``unpin``: a placement applied to a running pre-fork server, and taken away.

``pin --pid MASTER`` binds every worker of a running server to a plan (from
``--plan``, made by ``tuna-lab plan``, or from ``--policy``); ``--url`` sends a
few requests first, to find pool threads that wait in libc by the CPU time
they run, ``--watch`` keeps replacements pinned, and ``unpin`` gives the
threads it bound back the masks they had before the pin, where their mask is
still the one it set. Only the server's workers are pinned
(``--workers``/``--worker-match`` name them where the discovery cannot).
``status --pid`` (in :mod:`tuna_lab.cli.commands.serve`) shows what is bound.
"""

import json
import sys

from . import COMMANDS
from ..options import (add_front_cpus_option, add_strict_families_option, add_traffic_options, add_worker_options,
                      front_cpus_of, plan_for, policies_help, traffic_of, worker_choice_of)

__all__ = ["add_parser"]


def add_parser(subparsers, command=None):
    """Add ``pin`` and ``unpin`` (or only ``command``, one of them) to a ``tuna-lab`` subparsers object.

    Returns
    -------
    list of argparse.ArgumentParser
        The new parsers, in that order.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["pin", "--pid", "1", "-t", "2", "--policy", "round-robin", "--dry-run"])
    >>> args.pid, args.threads, args.dry_run, args.watch
    (1, 2, True, False)
    """
    return [add(subparsers) for name, add in (("pin", _add_pin), ("unpin", _add_unpin)) if command in (None, name)]


def _add_pin(subparsers):
    n = subparsers.add_parser(
        "pin", help=COMMANDS["pin"].help,
        epilog="examples:\n"
               "  tuna-lab pin --pid MASTER -t 4 --policy tuna-scatter --dry-run\n"
               "  tuna-lab pin --pid MASTER --plan plan.json --watch   re-pin replacement workers until Ctrl-C\n"
               "  tuna-lab pin --pid MASTER -t 2 --policy round-robin --url http://127.0.0.1:8000/predict "
               "--body req.json --header Content-Type:application/json\n"
               "      finds pool threads that wait in libc (ONNX Runtime's) by the CPU time they run during "
               "a few requests\n")
    n.add_argument("--pid", type=int, required=True, metavar="MASTER", help="the server's master process")
    n.add_argument("-t", "--threads", type=int, default=None,
                   help="OpenMP threads per worker (with --policy; the workers are counted)")
    n.add_argument("--policy", default=None, metavar="POLICY", help=policies_help())
    n.add_argument("--plan", default=None, metavar="FILE", help="a plan from `tuna-lab plan` instead of "
                                                                "--policy/-t")
    n.add_argument("--force", action="store_true",
                   help="apply a plan made on another machine, or pin the children of a process that is not "
                        "recognised as a pre-fork server's master (PID 1, or one whose children run another "
                        "program than it)")
    n.add_argument("--watch", action="store_true",
                   help="stay in the foreground and re-pin replacement workers until Ctrl-C/SIGTERM; a mask "
                        "someone else changed on a pinned thread is reported once and left as it is")
    n.add_argument("--enforce", action="store_true",
                   help="with --watch: put back a mask someone else changed on a thread tuna_lab pinned")
    n.add_argument("--dry-run", action="store_true", help="show what would be bound; bind nothing")
    n.add_argument("--json", action="store_true", help="print the report as JSON")
    add_strict_families_option(n)
    add_worker_options(n)
    add_front_cpus_option(n)
    add_traffic_options(n)
    n.set_defaults(func=_cmd_pin)
    return n


def _add_unpin(subparsers):
    u = subparsers.add_parser("unpin", help=COMMANDS["unpin"].help, epilog="example:\n  tuna-lab unpin --pid MASTER\n")
    u.add_argument("--pid", type=int, default=None, metavar="MASTER", help="the server's master process")
    u.add_argument("--isolation", action="store_true",
                   help="put back the masks and IRQ affinities `audit --isolate --apply` changed (those still as it "
                        "set them); with --pid, unpin that server too")
    u.add_argument("--force", action="store_true",
                   help="unpin the children of a process that is not recognised as a pre-fork server's master")
    u.add_argument("--json", action="store_true", help="print the report as JSON")
    add_worker_options(u)
    u.set_defaults(func=_cmd_unpin)
    return u


def _plan_of(args, workers):
    """``(plan, front CPUs)``: ``--plan`` checked against the server's CPUs, else one made for them.

    The server's CPUs are those its master may use, not this tool's: a server
    confined to some CPUs (taskset, a cpuset) is planned on those, less the
    ``--front-cpus``.
    """
    from ...errors import PlanError
    from ...machine import Topology
    from ...live.pin import check_front_cpus, server_cpus
    from ...placement.plan import Plan

    # The master's mask from before a `pin --front-cpus` moved it, if one did.
    allowed = server_cpus(args.pid)
    front = front_cpus_of(args, allowed)
    if front is not None:
        allowed = sorted(set(allowed) - set(front))
    here = Topology.from_sysfs(allowed=allowed)
    if args.plan:
        if args.policy or args.threads:
            raise PlanError("give either --plan or --policy/-t, not both")
        plan = Plan.read(args.plan)
        if front is not None:
            check_front_cpus(plan, front)          # said as such, before the fingerprint of the CPUs left
        return plan.check_machine(here, force=args.force), front
    if not args.policy or not args.threads:
        raise PlanError("say what to apply: --policy POLICY -t THREADS, or --plan FILE")
    return plan_for(args.policy, len(workers), args.threads, here, on_infeasible=args.on_infeasible), front


def _cmd_pin(args):
    import threading

    from ...errors import PinError
    from ...live.roles import check_server
    from ...live.pin import pin_server, watch_server

    if args.enforce and not args.watch:
        raise PinError("--enforce puts back, while --watch runs, masks someone else changed: give --watch too")
    choice = worker_choice_of(args)
    plan, front = _plan_of(args, check_server(args.pid, force=args.force, choice=choice))
    # Measured before anything is bound: a request that fails leaves every mask as it was.
    activity = traffic_of(args, args.pid)
    report = pin_server(args.pid, plan, dry_run=args.dry_run, activity=activity, choice=choice, front_cpus=front)
    _show(report, args.json)
    if not args.watch or args.dry_run:
        return 0
    print(f"watching server {args.pid}: replacement workers are pinned to their slot, pool threads found by "
          "their activity under live traffic; Ctrl-C to stop", file=sys.stderr, flush=True)
    stop = threading.Event()
    try:
        watch_server(args.pid, plan, stop, on_pin=lambda r: _show(r, args.json), activity=activity, choice=choice,
                     enforce=args.enforce, pinned=report)
    except KeyboardInterrupt:
        stop.set()
    print("stopped watching; the pins stay in place", file=sys.stderr, flush=True)
    return 0


def _cmd_unpin(args):
    from ...live.roles import check_server
    from ...live.pin import unpin_server

    if args.isolation:
        _undo_isolation(args.json)
        if args.pid is None:
            return 0
    elif args.pid is None:
        from ...errors import PinError

        raise PinError("say what to unpin: --pid MASTER, or --isolation")
    check_server(args.pid, force=args.force, choice=worker_choice_of(args))
    _show(unpin_server(args.pid), args.json)
    return 0


def _undo_isolation(as_json):
    """``unpin --isolation``: what ``audit --isolate --apply`` changed, put back (:func:`~tuna_lab.live.audit.undo_isolation`)."""
    from ...live.audit import undo_isolation

    done, left = undo_isolation()
    if as_json:
        print(json.dumps({"isolation": {"restored": done, "left": left}}), flush=True)
    else:
        print("\n".join(done) if done else "nothing to put back: no isolation of tuna_lab's is recorded, or none "
                                         "is still as it set it", flush=True)
    for line in left:
        print(f"tuna-lab: warning: {line}", file=sys.stderr, flush=True)


def _show(report, as_json):
    if as_json:
        print(json.dumps(report.to_dict()), flush=True)
    else:
        print(report.describe(), flush=True)
    # Once, on stderr: stdout keeps only the report (or the JSON object, whose "warnings" hold them too).
    for warning in report.warnings:
        print(f"tuna-lab: warning: {warning}", file=sys.stderr, flush=True)
    if report.note and as_json:
        print(f"tuna-lab: {report.note}", file=sys.stderr, flush=True)
