"""``tuna-lab plan``, ``pin`` and ``unpin``: a placement you can take away, applied to any pre-fork server.

``plan`` prints one placement plan (JSON, ``OMP_PLACES``, per-slot OpenMP
environment, ONNX Runtime's ``session.intra_op_thread_affinities``,
``taskset`` lines or a Gunicorn config snippet); ``pin --pid MASTER`` binds every worker of a
running server to it (``--url`` sends a few requests first, to find pool
threads that wait in libc by the CPU time they run), ``--watch`` keeps
replacements pinned, and ``unpin`` gives the threads it bound back the masks
they had before the pin, where their mask is still the one it set. Only the
server's workers are pinned (``--workers``/``--worker-match`` name them where
the discovery cannot). ``status --pid`` (in
:mod:`tuna_lab.cli.server`) shows what is bound. ``--policy`` takes any
registered policy (:func:`tuna_lab.placement.register`); only those that need
the solver load it.
"""

import json
import sys

from .options import (add_front_cpus_option, add_size_options, add_strict_families_option, add_topology_options,
                      front_cpus_of, policies_help, positive_float_arg, topology_of)

__all__ = ["add_parser", "plan_for", "add_traffic_options", "traffic_of", "add_worker_options", "worker_choice_of"]

_FORMATS = ("json", "omp-places", "env", "onnxruntime", "taskset", "gunicorn")


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
        "plan", help="print a placement plan: JSON, OMP_PLACES, OpenMP environment, ONNX Runtime affinities, "
                     "taskset lines or a Gunicorn config snippet",
        epilog="examples:\n"
               "  tuna-lab plan -w 4 -t 4 --policy tuna-scatter > plan.json\n"
               "  tuna-lab plan -w 2 -t 4 --policy round-robin --format env           OMP_*/GOMP_*/KMP_* per slot\n"
               "  tuna-lab plan -w 2 -t 4 --policy round-robin --format onnxruntime   "
               "session.intra_op_thread_affinities\n"
               "  tuna-lab plan -w 2 -t 2 --policy round-robin --format taskset --pid MASTER\n"
               "  tuna-lab plan -w 2 -t 2 --format taskset --pid MASTER --url http://127.0.0.1:8000/predict "
               "--body req.json   pools found by their activity\n")
    add_size_options(p)
    p.add_argument("--policy", default="tuna-scatter", metavar="POLICY",
                   help=policies_help())
    p.add_argument("--format", choices=_FORMATS, default="json", help="what to print")
    p.add_argument("--pid", type=int, default=None, metavar="MASTER",
                   help="for --format taskset: the running server whose TIDs to name (each worker's main thread "
                        "bound as `pin` binds it)")
    add_worker_options(p, flag="--worker-pids")
    add_front_cpus_option(p)
    # With --pid, pools that wait in libc (ONNX Runtime's) are found by their activity, as `pin` finds them.
    add_traffic_options(p)
    p.add_argument("--time-limit", type=positive_float_arg, default=None, metavar="S",
                   help="solver time limit for the policies that need the solver (tuna-*)")
    add_strict_families_option(p)
    add_topology_options(p)
    p.set_defaults(func=_cmd_plan)

    n = subparsers.add_parser(
        "pin", help="pin every worker thread of a running pre-fork server by its master's PID",
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

    u = subparsers.add_parser("unpin", help="give the threads `pin --pid` bound their masks from before the pin back, "
                                           "where the mask is still the one it set",
                              epilog="example:\n  tuna-lab unpin --pid MASTER\n")
    u.add_argument("--pid", type=int, default=None, metavar="MASTER", help="the server's master process")
    u.add_argument("--isolation", action="store_true",
                   help="put back the masks and IRQ affinities `audit --isolate --apply` changed (those still as it "
                        "set them); with --pid, unpin that server too")
    u.add_argument("--force", action="store_true",
                   help="unpin the children of a process that is not recognised as a pre-fork server's master")
    u.add_argument("--json", action="store_true", help="print the report as JSON")
    add_worker_options(u)
    u.set_defaults(func=_cmd_unpin)
    return [p, n, u]


def add_worker_options(parser, flag="--workers"):
    """Add ``--workers PID,PID`` and ``--worker-match REGEX``: name the workers instead of discovering them.

    ``flag`` names the first option (``plan`` says ``--worker-pids``: its
    ``-w/--workers`` is W, a count).

    Examples
    --------
    >>> import argparse
    >>> p = argparse.ArgumentParser()
    >>> add_worker_options(p)
    >>> a = p.parse_args(["--worker-match", "inference"])
    >>> a.workers_pids, a.worker_match
    (None, 'inference')
    """
    g = parser.add_argument_group(
        "which processes are the workers",
        "By default the workers are the master's children that run an inference runtime (XGBoost, ONNX Runtime, "
        "PyTorch, LightGBM, OpenMP) - those that hold no socket when a front end passes requests to them - or, "
        "with no runtime loaded, that hold the server's socket; the rest (a multiprocessing Manager, a front end, "
        "a metrics exporter) are helpers, listed with the reason by `status --pid`, never pinned.")
    which = g.add_mutually_exclusive_group()
    which.add_argument(flag, dest="workers_pids", default=None, metavar="PID,PID",
                       help="the worker processes (children or descendants of the master); slots go in their start order")
    which.add_argument("--worker-match", default=None, metavar="REGEX",
                       help="the workers are the processes under the master whose command line REGEX matches")


def worker_choice_of(args):
    """The :class:`~tuna_lab.placement.pin.WorkerChoice` of ``--workers``/``--worker-match`` (None: discover)."""
    from ..placement.pin import WorkerChoice

    choice = WorkerChoice.parse(getattr(args, "workers_pids", None), getattr(args, "worker_match", None))
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
    g = parser.add_argument_group(
        "finding pool threads by their activity",
        "A thread that waits in libc (ONNX Runtime's own pool, a PyTorch inter-op thread) is told from "
        "helper threads by the CPU time it runs while its worker serves requests: --url sends a few "
        "(at least 8, at most 64, within 15 s; as many at once as there are workers) and measures.")
    g.add_argument("--url", default=None, help="a loopback URL of a request that runs the model, "
                                                "e.g. http://127.0.0.1:8000/predict")
    g.add_argument("--method", default=None, help="HTTP method (default: POST with --body, else GET)")
    g.add_argument("--header", action="append", default=[], metavar="K:V", help="a request header; repeatable")
    g.add_argument("--body", default=None, metavar="FILE", help="the request body, read from FILE ('-': stdin)")


def traffic_of(args, master):
    """The :class:`~tuna_lab.placement.pin.Activity` of ``--url`` requests to ``master``; None without ``--url``.

    The requests are built as ``run`` builds its own
    (:meth:`~tuna_lab.measure.loadgen.requests.Requests.from_options`): a body goes
    as ``application/json`` unless a ``--header Content-Type:...`` says otherwise.

    Raises
    ------
    PinError
        Options without ``--url``, or a request that fails.
    TargetError
        A malformed header, or an unreadable body file.
    """
    from ..errors import PinError
    from ..measure.loadgen.requests import Requests

    if args.url is None:
        if args.method or args.header or args.body:
            raise PinError("--method, --header and --body describe the requests of --url: give --url too")
        return None
    # The one recipe of run and tune: --body - is read from stdin there too, and the headers are theirs.
    requests = Requests.from_options(args.url, args.method, args.header, args.body)
    from ..placement.pin import serve_requests

    return serve_requests(master, args.url, method=requests.method, headers=requests.send_headers(),
                          body=requests.bodies[0] if requests.bodies else None, choice=worker_choice_of(args))


def plan_for(policy, workers, threads, topology, time_limit=None, on_infeasible="relax"):
    """The :class:`~tuna_lab.placement.plan.Plan` of ``policy`` for ``workers`` x ``threads`` on ``topology``.

    ``on_infeasible``: see :func:`~tuna_lab.placement.policies.placement`.
    """
    from ..placement import placement

    return placement(policy, workers, threads, topology, time_limit=time_limit, on_infeasible=on_infeasible).plan()


def _cmd_plan(args):
    from ..errors import PlanError

    if args.pid is None and (args.workers_pids or args.worker_match):
        raise PlanError("--workers and --worker-match name the workers of --pid MASTER: give --pid too")
    if args.pid is not None and args.format != "taskset":
        raise PlanError(f"--pid names the threads of a running server for --format taskset; --format "
                        f"{args.format} names no threads")
    if args.pid is None and args.url is not None:
        raise PlanError("--url sends requests to the running server of --pid, to find its pool threads: give --pid")
    topology = topology_of(args)
    front = front_cpus_of(args, topology.cpus)
    if front is not None:
        # The workers' plan is made for the CPUs the front leaves; `pin --front-cpus` checks it against the same.
        topology = topology.restrict(sorted(set(topology.cpus) - set(front)))
    plan = plan_for(args.policy, args.workers, args.threads, topology, args.time_limit, args.on_infeasible)
    tids = None
    if args.pid is not None:
        from ..placement.pin import check_server, server_roles, server_threads

        check_server(args.pid)                          # PID 1, or a process that serves nothing: refused
        roles = server_roles(args.pid, worker_choice_of(args))
        activity = traffic_of(args, args.pid)
        # Every worker of the server gets a slot: a plan with fewer slots has no CPUs for some.
        count = len(roles.workers)
        if count != plan.workers:
            raise PlanError(f"server {args.pid} has {count} worker{'' if count == 1 else 's'} "
                            f"({', '.join(map(str, roles.worker_pids))}) but the plan has {plan.workers} slots: "
                            f"give -w {count}; left out as no workers: {roles.left_out()}")
        # Each worker's main thread is bound as `pin` binds it (pin.main_rule): never to fewer CPUs than
        # its pool where its runtime sizes the pool from the main thread's CPUs.
        tids = [{"slot": w["slot"], "rank": t["rank"], "tid": t["tid"], "pid": w["pid"],
                 "exact_main": w["exact_main"], "main_note": t.get("note")}
                for w in server_threads(args.pid, activity=activity, roles=roles)
                for t in w["threads"] if t["role"] != "other"]
    print(plan.render(args.format, tids=tids))
    if front is not None and args.pid is not None:
        from .._checks import format_cpulist

        # What `pin --front-cpus` binds besides the workers: every thread (-a) of the master, helpers, front ends.
        cpus = format_cpulist(front).replace(" ", "")
        print(f"# --front-cpus {cpus}: every thread of the master, the helpers and the front ends")
        for proc in (roles.master, *roles.helpers):
            print(f"taskset -a -p -c {cpus} {proc.pid}")
    return 0


def _plan_of(args, workers):
    """``(plan, front CPUs)``: ``--plan`` checked against the server's CPUs, else one made for them.

    The server's CPUs are those its master may use, not this tool's: a server
    confined to some CPUs (taskset, a cpuset) is planned on those, less the
    ``--front-cpus``.
    """
    from ..errors import PlanError
    from ..machine import Topology
    from ..placement.pin import check_front_cpus, server_cpus
    from ..placement.plan import Plan

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

    from ..errors import PinError
    from ..placement.pin import check_server, pin_server, watch_server

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
    from ..placement.pin import check_server, unpin_server

    if args.isolation:
        _undo_isolation(args.json)
        if args.pid is None:
            return 0
    elif args.pid is None:
        from ..errors import PinError

        raise PinError("say what to unpin: --pid MASTER, or --isolation")
    check_server(args.pid, force=args.force, choice=worker_choice_of(args))
    _show(unpin_server(args.pid), args.json)
    return 0


def _undo_isolation(as_json):
    """``unpin --isolation``: what ``audit --isolate --apply`` changed, put back (:func:`~tuna_lab.placement.audit.undo_isolation`)."""
    from ..placement.audit import undo_isolation

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
