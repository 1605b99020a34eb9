"""``tuna-lab pin`` and ``unpin``: a placement applied to a running pre-fork server, and taken away.

``pin --pid MASTER`` binds every worker of a running server to a plan (from
``--plan``, made by ``tuna-lab plan``, or from ``--policy``); ``--url`` sends a
few requests first, to find pool threads that wait in libc by the CPU time
they run, ``--watch`` keeps replacements pinned, and ``unpin`` gives the
threads it bound back the masks they had before the pin, where their mask is
still the one it set. Only the server's workers are pinned
(``--worker-pids``/``--worker-match`` name them where the discovery cannot).
``status --pid`` (in :mod:`tuna_lab.cli.commands.serve`) shows what is bound.
"""

import argparse
import json
import sys

from . import COMMANDS
from ..options import (THREADS_HELP, add_front_cpus_option, add_strict_families_option, add_traffic_options,
                      add_worker_options, front_cpus_of, plan_for, policies_help, requests_of, traffic_of,
                      worker_choice_of)
from ..server_options import add_renamed

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
        description="Bind every worker thread of a running pre-fork server (Gunicorn, uvicorn, MLServer, ...) "
                    "to a plan, by its master's PID: the plan from --plan (`tuna-lab plan`) or made here from "
                    "--policy and -t for the server's CPUs. Only the workers are pinned; the masks from before "
                    "are recorded, so that `unpin` gives them back. --watch keeps replacement workers pinned.",
        epilog="examples:\n"
               "  tuna-lab pin --pid MASTER -t 4 --policy tuna-scatter --dry-run\n"
               "  tuna-lab pin --pid MASTER --plan plan.json --watch   re-pin replacement workers until Ctrl-C\n"
               "  tuna-lab pin --pid MASTER -t 2 --policy round-robin --url http://127.0.0.1:8000/predict "
               "--body req.json --header Content-Type:application/json\n"
               "      finds pool threads that wait in libc (ONNX Runtime's) by the CPU time they run during "
               "a few requests\n")
    n.add_argument("--pid", type=int, required=True, metavar="MASTER", help="the server's master process")
    n.add_argument("-t", "--threads", type=int, default=None, metavar="T",
                   help=f"with --policy: {THREADS_HELP}; the workers are counted")
    n.add_argument("--policy", default=None, metavar="POLICY", help=policies_help())
    n.add_argument("--plan", default=None, metavar="FILE", help="a plan from `tuna-lab plan` instead of --policy/-t")
    n.add_argument("--force", action="store_true",
                   help="apply a plan made on another machine, or pin under a process that is no recognised "
                        "pre-fork master (PID 1)")
    n.add_argument("--watch", action="store_true",
                   help="stay and re-pin replacement workers until Ctrl-C; a mask someone else changed is "
                        "reported once and left")
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
    u = subparsers.add_parser(
        "unpin", help=COMMANDS["unpin"].help,
        description="Give the threads `pin --pid` bound the CPU masks they had before the pin, where a mask is "
                    "still the one tuna_lab set (one someone changed since is left, and said); with --isolate, "
                    "also put back what `audit --isolate --apply` moved. Nothing else is touched.",
        epilog="examples:\n  tuna-lab unpin --pid MASTER\n  tuna-lab unpin --isolate\n")
    u.add_argument("--pid", type=int, default=None, metavar="MASTER", help="the server's master process")
    # As --pid undoes `pin --pid`, --isolate undoes `audit --isolate`: one name. --isolation, its spelling
    # before 0.1.0, is refused with a pointer for one release.
    u.add_argument("--isolate", dest="isolation", action="store_true",
                   help="put back the masks and IRQ affinities `audit --isolate --apply` changed (those still as "
                        "it set them)")
    add_renamed(u, "--isolation", new="--isolate", what="what `audit --isolate --apply` changed")
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
        plan = Plan.read(args.plan)
        if front is not None:
            check_front_cpus(plan, front)          # said as such, before the fingerprint of the CPUs left
        return plan.check_machine(here, force=args.force), front
    return plan_for(args.policy, len(workers), args.threads, here, on_infeasible=args.on_infeasible), front


def _check_pin(args):
    """``pin``'s options checked together, before the process is looked at: what is wrong is said as such."""
    from ..._checks import positive_int
    from ...errors import PinError, PlanError

    if args.enforce and not args.watch:
        raise PinError("--enforce puts back, while --watch runs, masks someone else changed: give --watch too")
    if args.plan:
        if args.policy or args.threads is not None:
            raise PlanError("give either --plan or --policy/-t, not both")
        return
    if not args.policy and args.threads is None:
        raise PlanError("say what to apply: --policy POLICY -t T, or --plan FILE")
    if not args.policy:
        raise PlanError("-t needs --policy POLICY (the placement of those threads), or give --plan FILE")
    if args.threads is None:
        raise PlanError(f"--policy needs -t T ({THREADS_HELP}); the workers are counted")
    positive_int("-t", args.threads, PlanError)
    from ...placement.policies import get_policy

    get_policy(args.policy)                # an unknown name, with the list of the known ones


def _cmd_pin(args):
    import threading

    from ...live.roles import check_server
    from ...live.pin import pin_server, watch_server

    _check_pin(args)
    requests = requests_of(args)           # a malformed header or an unreadable body, said first too
    choice = worker_choice_of(args)
    plan, front = _plan_of(args, check_server(args.pid, force=args.force, choice=choice))
    # Measured before anything is bound: a request that fails leaves every mask as it was.
    activity = traffic_of(args, args.pid, requests)
    if not args.watch or args.dry_run:
        _show(pin_server(args.pid, plan, dry_run=args.dry_run, activity=activity, choice=choice, front_cpus=front),
              args.json)
        return 0
    from ...live.ledger import Signalled, signals_give_back

    stop = threading.Event()
    try:
        # Ctrl-C is the user's own end of the watch: the pins stay, as `pin` leaves them. A watch whose
        # terminal or service is gone (SIGTERM, SIGHUP, SIGUSR1) has no one to unpin after it: it gives back -
        # from before its first pin on, so that no such signal finds a mask set and no one to give it back.
        with signals_give_back(("SIGTERM", "SIGHUP", "SIGUSR1")):
            report = pin_server(args.pid, plan, activity=activity, choice=choice, front_cpus=front)
            _show(report, args.json)
            print(f"watching server {args.pid}: replacement workers are pinned to their slot, pool threads found "
                  "by their activity under live traffic; Ctrl-C to stop (the pins stay); SIGTERM or SIGHUP (a "
                  "closed terminal) gives every mask back", file=sys.stderr, flush=True)
            watch_server(args.pid, plan, stop, on_pin=lambda r: _show(r, args.json), activity=activity,
                         choice=choice, enforce=args.enforce, pinned=report)
    except Signalled as exc:
        stop.set()
        return _give_back_on(exc.signal, args.pid)
    except KeyboardInterrupt:
        stop.set()
    print("stopped watching; the pins stay in place", file=sys.stderr, flush=True)
    return 0


def _give_back_on(name, master):
    """After ``name`` ended a watch: every mask given back by the ledger's rule; 1 if some could not be."""
    import signal

    from ...live.ledger import FATAL_SIGNALS
    from ...live.pin import unpin_server

    # A second signal must not stop the give-back half-way: ignored until it is done.
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (getattr(signal, n) for n in FATAL_SIGNALS)}
    try:
        report = unpin_server(master)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for line in report.warnings:
        print(f"tuna-lab: warning: {line}", file=sys.stderr, flush=True)
    print(f"tuna-lab: {name}: stopped watching and gave the masks back", file=sys.stderr, flush=True)
    return 1 if report.failed or report.record else 128 + _signum(name)


def _signum(name):
    import signal

    return int(getattr(signal, name))


def _cmd_unpin(args):
    from ...live.roles import check_server
    from ...live.pin import unpin_server

    if args.pid is None and not args.isolation:
        from ...errors import PinError

        raise PinError("say what to unpin: --pid MASTER, or --isolate")
    if args.pid is not None:
        check_server(args.pid, force=args.force, choice=worker_choice_of(args))
    given = _undo_isolation() if args.isolation else None
    report = unpin_server(args.pid) if args.pid is not None else None
    if args.json:
        # One JSON object, whatever was asked: the pin report's fields, and "isolation" where it was asked for.
        out = report.to_dict() if report is not None else {}
        if given is not None:
            out["isolation"] = {"restored": given.done, "left": given.left, "malformed": given.malformed,
                                "record": given.path}
        print(json.dumps(out), flush=True)
    elif given is not None:
        print("\n".join(given.done) if given.done else "nothing to put back: no isolation of tuna_lab's is "
              "recorded, or none is still as it set it", flush=True)
    if given is not None:
        for line in given.left + given.malformed:
            print(f"tuna-lab: warning: {line}", file=sys.stderr, flush=True)
        if given.path:
            print(f"tuna-lab: what could not be put back is kept in {given.path}", file=sys.stderr, flush=True)
    if report is not None:
        _show(report, args.json, printed=args.json)
    # A malformed entry or a mask that could not be given back: said above, kept in the record, exit 1.
    return 1 if (report is not None and report.failed) or (given is not None and not given.ok) else 0


def _undo_isolation():
    """``unpin --isolate``: what ``audit --isolate --apply`` changed, given back
    (:func:`~tuna_lab.live.audit.undo_isolation`)."""
    from ...live.audit import undo_isolation

    return undo_isolation()


def _show(report, as_json, printed=False):
    if printed:
        pass                                   # the caller printed it, in its one JSON object
    elif as_json:
        print(json.dumps(report.to_dict()), flush=True)
    else:
        print(report.describe(), flush=True)
    # Once, on stderr: stdout keeps only the report (or the JSON object, whose "warnings" hold them too).
    for warning in report.warnings:
        print(f"tuna-lab: warning: {warning}", file=sys.stderr, flush=True)
    if report.note and as_json:
        print(f"tuna-lab: {report.note}", file=sys.stderr, flush=True)
