"""``tuna-lab plan``: a placement plan you can take away, for any pre-fork server.

``plan`` prints one placement plan (JSON, ``OMP_PLACES``, per-slot OpenMP
environment, ONNX Runtime's ``session.intra_op_thread_affinities``,
``taskset`` lines or a Gunicorn config snippet); with ``--pid MASTER`` and
``--format taskset``, the ``taskset`` lines name a running server's threads.
``tuna-lab pin`` (:mod:`tuna_lab.cli.commands.pin`) applies a plan. ``--policy`` takes
any registered policy (:func:`tuna_lab.placement.register`); only those that
need the solver load it.
"""

import sys

from . import COMMANDS
# The one table of formats, from the tiny names module (not placement/plan.py, which this start need not load).
from ...placement.names import FORMATS
from ..options import (TIME_LIMIT_HELP, add_front_cpus_option, add_size_options, add_strict_families_option,
                      add_topology_options, add_traffic_options, add_worker_options, front_cpus_of, plan_for,
                      policies_help, positive_float_arg, requests_of, topology_of, traffic_of, worker_choice_of)

__all__ = ["add_parser"]


def add_parser(subparsers, command=None):
    """Add ``plan`` to a ``tuna-lab`` subparsers object; returns the new parser.

    ``command``: None or ``"plan"``, this module's one command (:func:`tuna_lab.cli.build_parser`
    names the command it adds).

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["plan", "-w", "2", "-t", "2", "--policy", "round-robin", "--format", "taskset"])
    >>> args.workers, args.threads, args.format, args.pid
    (2, 2, 'taskset', None)
    """
    p = subparsers.add_parser(
        "plan", help=COMMANDS["plan"].help,
        description="A placement plan for W workers x T threads under one policy, printed to take away: JSON "
                    "for `pin --plan`, OMP_PLACES, the OpenMP environment per slot, ONNX Runtime's thread "
                    "affinities, a Gunicorn config snippet, or taskset lines - with --pid, naming a running "
                    "server's threads. Nothing is bound; `pin` applies a plan.",
        epilog="examples:\n"
               "  tuna-lab plan -w 4 -t 4 --policy tuna-scatter > plan.json\n"
               "  tuna-lab plan -w 2 -t 4 --policy round-robin --format env           OMP_*/GOMP_*/KMP_* per slot\n"
               "  tuna-lab plan -w 2 -t 4 --policy round-robin --format onnxruntime   "
               "session.intra_op_thread_affinities\n"
               "  tuna-lab plan -w 2 -t 4 --format gunicorn --worker-class gthread     a gunicorn.conf.py snippet\n"
               "  tuna-lab plan -w 2 -t 2 --policy round-robin --format taskset --pid MASTER\n"
               "  tuna-lab plan -w 2 -t 2 --format taskset --pid MASTER --url http://127.0.0.1:8000/predict "
               "--body req.json   pools found by their activity\n")
    add_size_options(p, pids=True)
    p.add_argument("--policy", default="tuna-scatter", metavar="POLICY",
                   help=policies_help())
    p.add_argument("--format", choices=FORMATS, default="json", metavar="FORMAT",
                   help=f"what to print: {', '.join(FORMATS)}")
    p.add_argument("--worker-class", default=None, metavar="NAME",
                   help="for --format gunicorn: the worker_class to write, e.g. gthread (default: none, your "
                        "config's)")
    p.add_argument("--pid", type=int, default=None, metavar="MASTER",
                   help="for --format taskset: the running server whose threads (TIDs) to name")
    add_worker_options(p, renamed=False)
    add_front_cpus_option(p)
    # With --pid, pools that wait in libc (ONNX Runtime's) are found by their activity, as `pin` finds them.
    add_traffic_options(p)
    p.add_argument("--time-limit", type=positive_float_arg, default=None, metavar="S", help=TIME_LIMIT_HELP)
    add_strict_families_option(p)
    add_topology_options(p)
    p.set_defaults(func=_cmd_plan)
    return p


def _cmd_plan(args):
    from ...errors import PlanError

    if args.pid is None and (args.worker_pids or args.worker_match):
        raise PlanError("--worker-pids and --worker-match name the workers of --pid MASTER: give --pid too")
    if args.pid is not None and args.format != "taskset":
        raise PlanError(f"--pid names the threads of a running server for --format taskset; --format "
                        f"{args.format} names no threads")
    if args.pid is None and args.url is not None:
        raise PlanError("--url sends requests to the running server of --pid, to find its pool threads: give --pid")
    if args.worker_class is not None and args.format != "gunicorn":
        raise PlanError(f"--worker-class is a Gunicorn setting for --format gunicorn; --format {args.format} "
                        "has none")
    # The requests' options checked with the rest, before the running server is looked at.
    requests = requests_of(args) if args.pid is not None else None
    topology = topology_of(args)
    front = front_cpus_of(args, topology.cpus)
    if front is not None:
        # The workers' plan is made for the CPUs the front leaves; `pin --front-cpus` checks it against the same.
        topology = topology.restrict(sorted(set(topology.cpus) - set(front)))
    plan = plan_for(args.policy, args.workers, args.threads, topology, args.time_limit, args.on_infeasible)
    tids = None
    if args.pid is not None:
        from ...live.roles import check_server, server_roles
        from ...live.pin import server_threads

        choice = worker_choice_of(args)
        # PID 1, or a process that serves nothing, refused; the workers the user named, or found, once settled.
        check_server(args.pid, choice=choice)
        roles = server_roles(args.pid, choice)
        activity = traffic_of(args, args.pid, requests)
        # Every worker of the server gets a slot: a plan with fewer slots has no CPUs for some.
        count = len(roles.workers)
        if count != plan.workers:
            raise PlanError(f"server {args.pid} has {count} worker{'' if count == 1 else 's'} "
                            f"({', '.join(map(str, roles.worker_pids))}) but the plan has {plan.workers} slots: "
                            f"give -w {count}; left out as no workers: {roles.left_out()}")
        # Each worker's main thread is bound as `pin` binds it (pin.main_rule): never to fewer CPUs than
        # its pool where its runtime sizes the pool from the main thread's CPUs.
        # A threaded worker's threads placed by slot (live.threads: several calling threads, each with a
        # team) are named with the slot's CPUs, as `pin` binds them; they are no pool ranks of the plan.
        tids = [{"slot": w["slot"], "rank": t["rank"], "tid": t["tid"], "pid": w["pid"],
                 "exact_main": w["exact_main"], "main_note": t.get("note"), "level": t.get("level"),
                 "planned": t.get("planned")}
                for w in server_threads(args.pid, plan=plan, activity=activity, roles=roles)
                for t in w["threads"]
                if t["role"] != "other" or (t.get("level") == "slot" and t.get("planned") is not None)]
    text = plan.render(args.format, tids=tids, worker_class=args.worker_class)
    # Said on stderr too: a user who pipes the output into a file or a shell still reads what it cannot do.
    for note in plan.export_notes(args.format, args.worker_class):
        print(f"tuna-lab: note: {note}", file=sys.stderr)
    if args.worker_class is not None:
        from ...integrations.gunicorn import SUPPORTED_WORKER_CLASSES

        if args.worker_class not in SUPPORTED_WORKER_CLASSES:
            # Read from the hooks themselves, so that this stays true when they learn another class.
            print(f"tuna-lab: warning: the hooks place {' and '.join(SUPPORTED_WORKER_CLASSES)} workers and classes "
                  f"made from them; a {args.worker_class} worker that is neither is refused in one line when it "
                  "starts (`tuna-lab pin --pid MASTER` binds a running server's threads)", file=sys.stderr)
    print(text)
    if front is not None and args.pid is not None:
        from ..._checks import format_cpulist

        # What `pin --front-cpus` binds besides the workers: every thread (-a) of the master, helpers, front ends.
        cpus = format_cpulist(front).replace(" ", "")
        print(f"# --front-cpus {cpus}: every thread of the master, the helpers and the front ends")
        for proc in (roles.master, *roles.helpers):
            print(f"taskset -a -p -c {cpus} {proc.pid}")
    return 0
