"""``tuna-lab serve``, ``status`` and ``stop``: the pinned Gunicorn + XGBoost server.

``status`` and ``stop`` import only :mod:`tuna_lab.server.launch`: they
answer in a fraction of a second and load no solver, XGBoost or plotting.
"""

import json

from ...errors import ServerError
from . import COMMANDS
from ..options import (add_client_cpus_option, add_size_options, add_strict_option, add_traffic_options,
                      add_wait_options, add_worker_options, check_cpu_quota, client_cpus_of, policies_help,
                      positive_float_arg, requests_of, traffic_of, worker_choice_of)

#: `serve`'s queue bound: seconds a request may wait for a worker before it is shed with 503.
DEFAULT_MAX_WAIT = 2.0

__all__ = ["add_parser"]


def add_parser(subparsers, command=None):
    """Add ``serve``, ``status`` and ``stop`` (or only ``command``, one of them) to a ``tuna-lab`` subparsers object.

    Returns
    -------
    list of argparse.ArgumentParser
        The new parsers, in that order.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["serve", "-w", "2", "-t", "1", "--detach"])
    >>> args.policy, args.port, args.detach, args.wait_policy
    ('tuna-scatter', 8000, True, 'default')
    >>> parser.parse_args(["status", "--pid", "123"]).pid
    123
    """
    adders = (("serve", _add_serve), ("status", _add_status), ("stop", _add_stop))
    return [add(subparsers) for name, add in adders if command in (None, name)]


def _add_serve(subparsers):
    # The bounds in the help: imported for `serve` only (status and stop stay light). The models' costs that
    # --max-work counts in are in docs/server.md.
    from ...server.limits import MAX_WORK, READ_TIMEOUT

    v = subparsers.add_parser(
        "serve", help=COMMANDS["serve"].help,
        description="Start tuna_lab's own server - Gunicorn workers serving an XGBoost model on 127.0.0.1 - "
                    "with every worker's threads pinned by a placement policy from the moment they start; in "
                    "the foreground until Ctrl-C, or --detach and end it with `tuna-lab stop`. What `run` "
                    "measures, for your own load generator.",
        epilog="examples:\n"
               "  tuna-lab serve -w 2 -t 2 --policy tuna-scatter            in the foreground until Ctrl-C\n"
               "  tuna-lab serve -w 2 -t 2 --model small --pidfile /tmp/t.pid --detach\n"
               "  tuna-lab serve -w 3 -t 2 --client-cpus 7 --detach   server off CPU 7: run your load "
               "generator there\n")
    add_size_options(v)
    v.add_argument("--model", choices=("small", "medium", "large"), default="medium", metavar="MODEL",
                   help="the XGBoost model served: small, medium or large, of 29, 155 or 784 features")
    v.add_argument("--policy", default="tuna-scatter", metavar="POLICY",
                   help=policies_help())
    v.add_argument("--places", choices=("cores", "threads"), default="cores", metavar="PLACES",
                   help="OMP_PLACES for omp-*: cores or threads")
    v.add_argument("--port", type=int, default=8000, metavar="PORT", help="TCP port on 127.0.0.1; 0 picks a free one")
    v.add_argument("--pidfile", default=None, metavar="FILE",
                   help="the master's PID, for `status` and `stop` (default: in a fresh temporary folder, printed)")
    v.add_argument("--max-requests", type=int, default=0, metavar="N",
                   help="recycle workers after N requests; 0 never does")
    v.add_argument("--request-log", default=None, metavar="DIR", help="per-request JSON lines")
    v.add_argument("--max-work", type=int, default=None, metavar="N",
                   help="rows x model cost a request may ask; more gets 413 "
                        f"(default: TUNA_LAB_MAX_WORK, else {MAX_WORK:,})")
    v.add_argument("--max-wait", type=positive_float_arg, default=DEFAULT_MAX_WAIT, metavar="S",
                   help="the queue bound: a request that waited longer for a worker gets 503")
    v.add_argument("--read-timeout", type=positive_float_arg, default=READ_TIMEOUT, metavar="S",
                   help="seconds a connection has to send its whole request once a worker takes it; then 408")
    v.add_argument("--timeout", type=positive_float_arg, default=None, metavar="S",
                   help="a request running longer is aborted, its worker replaced (default: "
                        "TUNA_LAB_TIMEOUT, else 120)")
    v.add_argument("--ready-timeout", type=positive_float_arg, default=180.0, metavar="S",
                   help="give up when the workers are not ready after S seconds")
    v.add_argument("--detach", action="store_true", help="return once ready; stop with `tuna-lab stop`")
    add_wait_options(v)
    add_strict_option(v)
    add_client_cpus_option(v)
    v.set_defaults(func=_cmd_serve)
    return v


def _add_status(subparsers):
    st = subparsers.add_parser(
        "status", help=COMMANDS["status"].help,
        description="A running server as tuna_lab sees it: its master, helpers and workers (each with the "
                    "reason it was taken for one), and per worker thread its role, TID and allowed CPUs, beside "
                    "the plan's; then any drift since the pin. --pidfile for a server `serve` started, --pid for "
                    "any pre-fork server. Changes nothing.",
        epilog="examples:\n"
               "  tuna-lab status --pidfile /tmp/t.pid\n"
               "  tuna-lab status --pid MASTER --plan plan.json --json\n"
               "  tuna-lab status --pid MASTER --url http://127.0.0.1:8000/   evidence from a few requests\n")
    which = st.add_mutually_exclusive_group(required=True)
    which.add_argument("--pidfile", metavar="FILE", help="a server started by `tuna-lab serve`")
    which.add_argument("--pid", type=int, metavar="MASTER", help="any pre-fork server, by its master's PID")
    st.add_argument("--plan", default=None, metavar="FILE", help="with --pid: show the plan's CPUs beside")
    st.add_argument("--json", action="store_true", help="print one JSON object")
    add_worker_options(st)
    add_traffic_options(st)
    st.set_defaults(func=_cmd_status)
    return st


def _add_stop(subparsers):
    sp = subparsers.add_parser("stop", help=COMMANDS["stop"].help,
                               description="Stop a server that `tuna-lab serve --detach` started, by its pidfile: "
                                           "its master and workers end, the pidfile is removed while it still "
                                           "names that server, and its CPUs are free again.",
                               epilog="example:\n  tuna-lab stop --pidfile /tmp/t.pid\n")
    sp.add_argument("--pidfile", required=True, metavar="FILE", help="the pidfile the server was started with")
    sp.set_defaults(func=_cmd_stop)
    return sp


def _cmd_serve(args):
    import signal
    import time

    from ..._checks import format_cpulist
    from ...server.launch import Server, signal_on_parent_death
    from ...server.limits import ServerLimits
    from ...server.openmp import OpenMPEnv

    import sys

    client = client_cpus_of(args, ServerError, threads=[args.threads])
    check_cpu_quota(args.workers * args.threads, args.strict, ServerError)
    # The server places on the CPUs left; with client CPUs kept, all of its processes start confined there.
    # In the foreground the server lives no longer than this process, even one killed outright.
    limits = ServerLimits(max_requests=args.max_requests, max_work=args.max_work, max_wait=args.max_wait,
                          read_timeout=args.read_timeout, request_timeout=args.timeout)
    server = Server(args.workers, args.threads, model=args.model, policy=args.policy, port=args.port,
                    pidfile=args.pidfile, request_log=args.request_log,
                    openmp=OpenMPEnv(places=args.places, wait_policy=args.wait_policy, spincount=args.spincount),
                    topology=client.server, die_with_parent=not args.detach, limits=limits)
    stopping = []
    if not args.detach:
        # SIGTERM, SIGHUP (a closed terminal) and the death of whoever started us all end the wait
        # loop below, so the server is stopped - and its CPUs given back - as after Ctrl-C.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, lambda *a: stopping.append(1))
        if signal_on_parent_death(signal.SIGHUP) is False:
            stopping.append(1)
    # Said once the input is known to be good (bad input stays one line). serve runs no load
    # generator: it says which CPUs are kept for the user's own, if any.
    if client.reserved:
        print(f"tuna-lab: {client.describe()}", file=sys.stderr, flush=True)
    else:
        print(f"tuna-lab: the server may use CPUs {format_cpulist(client.server.cpus)}, all this process may; "
              "--client-cpus CPULIST keeps some free for a load generator", file=sys.stderr, flush=True)
    server.start(ready_timeout=args.ready_timeout)
    print(f"serving {server.url} (policy {args.policy}, {args.workers} workers x {args.threads} threads, "
          f"model {args.model}); pidfile {server.pidfile}", flush=True)
    if client.reserved:
        print(f"  server on CPUs {format_cpulist(client.server.cpus)}; CPU{'' if len(client.cpus) == 1 else 's'} "
              f"{client.cpulist} kept free for your load generator, e.g. taskset -c {client.cpulist} wrk ...",
              flush=True)
    for rec in server.worker_records():
        cpus = " ".join(f"{t['role'][0]}{t['tid']}:{format_cpulist(t['cpus'])}" for t in rec["threads"])
        print(f"  worker slot {rec['slot']} pid {rec['pid']}: {cpus}", flush=True)
    if args.detach:
        # Leave it running; `tuna-lab stop --pidfile` ends it.
        server.proc = None
        return 0
    try:
        while not stopping and server.proc.poll() is None:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    print("stopped", flush=True)
    return 0


def _cmd_status(args):
    from ..._checks import format_cpulist

    if args.pid is not None:
        return _status_of_pid(args)
    if args.url is not None or args.worker_pids or args.worker_match:
        from ...errors import PinError

        raise PinError("--url, --worker-pids and --worker-match work with --pid (a server found by its master), not "
                       "with --pidfile")
    from ...server.launch import status

    info = status(args.pidfile)
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"{info['url']}  master {info['master']}  policy {info['policy']}  model {info['model']}  "
          f"{len(info['workers'])}/{info['workers_expected']} workers x {info['threads']} threads")
    if info.get("server_cpus"):
        print(f"  server confined to CPUs {format_cpulist(info['server_cpus'])} (master now on "
              f"{format_cpulist(info['master_cpus'])}); the others are kept for a load generator")
    for w in info["workers"]:
        print(f"  worker slot {w['slot']} pid {w['pid']} {'ready' if w['ready'] else 'starting'}")
        for t in w["threads"]:
            mark = "" if t["expected"] is None or t["expected"] == t["cpus"] else \
                f"  (expected {format_cpulist(t['expected'])})"
            print(f"    {t['role']:<6} tid {t['tid']:<8} cpus {format_cpulist(t['cpus'])}{mark}")
    return 0


def _status_of_pid(args):
    import sys

    from ...live.pin import PinReport, server_threads
    from ...live.roles import server_roles
    from ...placement.plan import Plan

    plan = Plan.read(args.plan) if args.plan else None
    requests = requests_of(args)           # checked, as the plan is, before the server is looked at
    roles = server_roles(args.pid, worker_choice_of(args))
    activity = traffic_of(args, args.pid, requests)
    report = PinReport(args.pid, plan, server_threads(args.pid, plan, activity, roles=roles),
                       roles=roles).add_activity(activity)
    from ...live.threads import threading_lines

    # The model run off the main thread (FastAPI sync, gthread, BentoML): the oversubscription and its knob.
    report.warnings += threading_lines(args.pid, report.workers, plan)
    drift = _drift(args.pid, plan, roles)
    if args.json:
        print(json.dumps({**report.to_dict(), "drift": [f.to_dict() for f in drift]}))
    else:
        print(report.describe())
        print("\n".join(f"drift: {f.what}\n  -> {f.advice}" for f in drift) if drift else
              "no drift: every thread placed is where the plan (or the pin) put it")
    for warning in report.warnings:
        print(f"tuna-lab: warning: {warning}", file=sys.stderr)
    return 0


def _drift(master, plan, roles):
    """Drift since the pin (a replaced worker, a mask someone else changed): ``audit``'s findings of those kinds.

    Read over a short interval: status shows masks, not rates.
    """
    from ...live import audit

    snap = audit.snapshot(master, plan, interval=0.05, roles=roles)
    return [f for f in audit.findings(snap) if f.kind in ("drift", "replaced")]


def _cmd_stop(args):
    from ...server.launch import stop

    done = stop(args.pidfile)
    print(f"stopped the server at {done['url']} (master {done['master']}, policy {done['policy']}, "
          f"{done['workers']} workers x {done['threads']} threads, model {done['model']})", flush=True)
    return 0
