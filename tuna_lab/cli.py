"""``tuna-lab``: the command line.

Every user error ends in one line on stderr and exit status 2; nothing else
is printed to stdout in that case, so ``--json`` output is either a whole
object or nothing.
"""

import argparse
import json
import sys

import numpy as np

from .errors import TunaError

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (not usage + error) and exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _add_topology_options(p):
    g = p.add_mutually_exclusive_group()
    g.add_argument("--preset", metavar="NAME",
                   help="a machine from the seeds: xeon-8272cl, xeon-8260-2s, epyc-7313p, epyc-9654, "
                        "epyc-9654-2s")
    g.add_argument("--hwloc-xml", metavar="FILE", help="XML written by `lstopo --of xml`")
    g.add_argument("--synthetic", metavar="SPEC", help='hwloc synthetic spec, e.g. "pack:2 l3:2 core:4 pu:2"')


def _topology(args):
    from .topology import Topology

    if args.preset:
        return Topology.preset(args.preset)
    if args.hwloc_xml:
        return Topology.from_hwloc_xml(args.hwloc_xml)
    if args.synthetic:
        return Topology.synthetic(args.synthetic)
    return Topology.from_sysfs()


def _positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text!r}")
    return value


def _cmd_topology(args):
    topo = _topology(args)
    if args.json:
        print(json.dumps(topo.to_dict()))
        return 0
    print(_describe_topology(topo))
    return 0


def _describe_topology(topo):
    lines = [repr(topo)]
    lines.append(f"  logical cores (OS ids): {_ranges(topo.cpus)}")
    lines.append(f"  physical cores: {topo.n_physical}, threads per core: {topo.threads_per_core}")
    lines.append(f"  packages: {len(set(np.asarray(topo.package).tolist()))}, "
                 f"NUMA nodes: {len(set(np.asarray(topo.numa).tolist()))}")
    for level, labels in sorted(topo.caches.items()):
        lines.append(f"  {level}: {len(set(np.asarray(labels).tolist()))} domains")
    sib = topo.siblings()
    shown = ", ".join("(" + ",".join(map(str, s)) + ")" for s in sib[:8])
    lines.append(f"  SMT siblings: {shown}{' ...' if len(sib) > 8 else ''}")
    d = topo.distance()
    values, counts = np.unique(d[np.triu_indices_from(d, 1)], return_counts=True)
    lines.append("  distances between distinct cores: "
                 + ", ".join(f"{v:g} x{c}" for v, c in zip(values, counts)))
    if topo.n_logical <= 16:
        lines.append("  distance matrix:")
        for cpu, row in zip(topo.cpus, d):
            lines.append(f"    {cpu:>3}: " + " ".join(f"{v:>3g}" for v in row))
    return "\n".join(lines)


def _ranges(ids):
    ids = sorted(ids)
    out, start, prev = [], None, None
    for i in ids:
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
    return ",".join(out)


def _cmd_solve(args):
    from .model import TunaModel

    topo = _topology(args)
    model = TunaModel(args.workers, args.threads, topo, args.mode, encoding=args.encoding)
    if args.without:
        model = model.without(*[f for f in args.without.split(",") if f])
    mapping = model.solve(time_limit=args.time_limit, gap=args.gap)
    if args.json:
        print(json.dumps(mapping.to_dict()))
    else:
        print(mapping.describe())
    return 0


def _cmd_demo(args):
    from .model import solve
    from .topology import Topology

    here = Topology.from_sysfs()
    print("The Tuna mapping - offline phase (online serving and load tests arrive with later releases)\n")
    for title, topo, w, t in (("This machine", here, 2, 2),
                              ("The article's machine, Azure D32ds_v4 (xeon-8272cl)",
                               Topology.preset("xeon-8272cl"), 4, 8)):
        print(f"== {title}: {topo!r}")
        for mode in ("scatter", "compact"):
            mapping = solve(w, t, topo, mode, time_limit=60)
            print(mapping.describe())
            bad = mapping.verify()
            print(f"  every family's check: {'passed' if not bad else f'{len(bad)} violations'}\n")
    return 0


def _cmd_serve(args):
    import signal
    import time

    from .server.launch import Server

    server = Server(args.workers, args.threads, model=args.model, policy=args.policy, port=args.port,
                    pidfile=args.pidfile, max_requests=args.max_requests,
                    request_log=args.request_log, places=args.places)
    server.start(ready_timeout=args.ready_timeout)
    print(f"serving {server.url} (policy {args.policy}, {args.workers} workers x {args.threads} threads, "
          f"model {args.model}); pidfile {server.pidfile}", flush=True)
    for rec in server.worker_records():
        cpus = " ".join(f"{t['role'][0]}{t['tid']}:{_ranges(t['cpus'])}" for t in rec["threads"])
        print(f"  worker slot {rec['slot']} pid {rec['pid']}: {cpus}", flush=True)
    if args.detach:
        # Leave it running; `tuna-lab stop --pidfile` ends it.
        server.proc = None
        return 0
    stopping = []
    signal.signal(signal.SIGTERM, lambda *a: stopping.append(1))
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
    from .server.launch import status

    info = status(args.pidfile)
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"{info['url']}  master {info['master']}  policy {info['policy']}  model {info['model']}  "
          f"{len(info['workers'])}/{info['workers_expected']} workers x {info['threads']} threads")
    for w in info["workers"]:
        print(f"  worker slot {w['slot']} pid {w['pid']} {'ready' if w['ready'] else 'starting'}")
        for t in w["threads"]:
            mark = "" if t["expected"] is None or t["expected"] == t["cpus"] else \
                f"  (expected {_ranges(t['expected'])})"
            print(f"    {t['role']:<6} tid {t['tid']:<8} cpus {_ranges(t['cpus'])}{mark}")
    return 0


def _cmd_stop(args):
    from .server.launch import stop

    stop(args.pidfile)
    return 0


def _cmd_bench(args):
    from .bench import run_solver_bench

    return run_solver_bench(args)


def _build_parser():
    p = _Parser(prog="tuna-lab", description="Static thread-to-core mapping after the Tuna article.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("topology", help="show a machine's cores, caches and distances")
    _add_topology_options(t)
    t.add_argument("--json", action="store_true", help="print one JSON object")
    t.set_defaults(func=_cmd_topology)

    s = sub.add_parser("solve", help="solve the Tuna ILP for W workers x T threads")
    s.add_argument("-w", "--workers", type=int, required=True)
    s.add_argument("-t", "--threads", type=int, required=True)
    s.add_argument("--mode", choices=("scatter", "compact"), default="scatter")
    _add_topology_options(s)
    s.add_argument("--encoding", choices=("auto", "counts", "pairwise"), default="auto")
    s.add_argument("--without", metavar="FAMILIES", default="",
                   help="comma-separated families to drop, e.g. 11-12,8p")
    s.add_argument("--time-limit", type=_positive_float, default=None, metavar="S")
    s.add_argument("--gap", type=float, default=None, help="relative MIP gap (HiGHS default 1e-4)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=_cmd_solve)

    v = sub.add_parser("serve", help="start the Gunicorn + XGBoost server with every thread pinned")
    v.add_argument("-w", "--workers", type=int, required=True)
    v.add_argument("-t", "--threads", type=int, required=True)
    v.add_argument("--model", choices=("small", "medium", "large"), default="medium")
    v.add_argument("--policy", default="tuna-scatter",
                   help="cfs, round-robin, omp-spread, omp-close, numa, tuna-scatter, tuna-compact")
    v.add_argument("--places", choices=("cores", "threads"), default="cores", help="OMP_PLACES for omp-*")
    v.add_argument("--port", type=int, default=8000)
    v.add_argument("--pidfile", default=None)
    v.add_argument("--max-requests", type=int, default=0, help="recycle workers after N requests")
    v.add_argument("--request-log", default=None, metavar="DIR", help="per-request JSON lines")
    v.add_argument("--ready-timeout", type=_positive_float, default=180.0, metavar="S")
    v.add_argument("--detach", action="store_true", help="return once ready; stop with `tuna-lab stop`")
    v.set_defaults(func=_cmd_serve)

    st = sub.add_parser("status", help="worker -> thread (role, TID) -> allowed CPUs of a running server")
    st.add_argument("--pidfile", required=True)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_cmd_status)

    sp = sub.add_parser("stop", help="stop a server started with --detach")
    sp.add_argument("--pidfile", required=True)
    sp.set_defaults(func=_cmd_stop)

    d = sub.add_parser("demo", help="the Tuna mapping for this machine and the article's")
    d.set_defaults(func=_cmd_demo)

    b = sub.add_parser("bench", help="benchmarks")
    b.add_argument("what", choices=("solver",))
    b.add_argument("--out", default="bench/out/solver.csv", help="CSV to write")
    b.add_argument("--quick", action="store_true", help="a small subset (smoke run)")
    b.add_argument("--pairwise-limit", type=float, default=0.0, metavar="S",
                   help="also run the literal encoding on small models with this time limit (0: skip)")
    b.add_argument("--doc", default=None, metavar="FILE", help="also write a Markdown report")
    b.set_defaults(func=_cmd_bench)
    return p


def main(argv=None):
    parser = _build_parser()
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
