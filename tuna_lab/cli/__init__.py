"""``tuna-lab``: the command line.

Every user error ends in one line on stderr and exit status 2; nothing else
is printed to stdout in that case, so ``--json`` output is either a whole
object or nothing.
"""

import argparse
import json
import os
import sys

import numpy as np

from ..errors import TunaError

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
    from ..machine.topology import Topology

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
    from ..model import TunaModel

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
    from ..measure.experiment import Config, run
    from ..model import solve
    from ..analysis.report import write_report
    from ..machine.topology import Topology

    here = Topology.from_sysfs()
    C = here.n_logical
    # Sized to this machine: one worker per CPU, two OpenMP threads each - twice
    # as many threads as cores, the oversubscribed regime where placement matters.
    W, T = max(2, C), min(2, C)
    print("== 1. The offline phase: the Tuna mapping\n")
    for title, topo, w, t in ((f"This machine ({C} CPUs)", here, W, T),
                              ("The article's machine, Azure D32ds_v4 (xeon-8272cl)",
                               Topology.preset("xeon-8272cl"), 4, 8)):
        print(f"-- {title}: {topo!r}")
        for mode in ("scatter", "compact"):
            mapping = solve(w, t, topo, mode, time_limit=60)
            print(mapping.describe())
            bad = mapping.verify()
            print(f"  every family's check: {'passed' if not bad else f'{len(bad)} violations'}\n")
    if args.offline:
        return 0
    print(f"== 2. The online phase: pin and measure ({W} workers x {T} threads, medium model, batch 100, "
          f"3 trials x {args.requests} concurrent requests)\n", flush=True)
    out = os.path.join(args.out, "demo")
    config = Config(W, T, "medium", 100)
    result = run(config, ["cfs", "round-robin", "tuna-scatter"], trials=args.trials, requests=args.requests,
                 out=os.path.join(out, config.key), progress=lambda line: print("  " + line, flush=True))
    print()
    print(_trial_table(result.trials))
    print("\n".join(_comparisons(result.requests, result.trials)))
    report = write_report(result.requests, result.trials, os.path.join(out, "report.html"),
                          title="tuna_lab demo", manifest=result.manifest)
    print(f"\nraw records: {result.path}\nreport: {report}")
    return 0


def _cmd_serve(args):
    import signal
    import time

    from ..server.launch import Server

    server = Server(args.workers, args.threads, model=args.model, policy=args.policy, port=args.port,
                    pidfile=args.pidfile, max_requests=args.max_requests,
                    request_log=args.request_log, places=args.places, wait_policy=args.wait_policy,
                    spincount=args.spincount)
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
    from ..server.launch import status

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
    from ..server.launch import stop

    stop(args.pidfile)
    return 0


def _nonnegative_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def _add_wait_options(p):
    from ..server.openmp import WAIT_POLICIES

    p.add_argument("--wait-policy", choices=WAIT_POLICIES, default="default",
                   help="OMP_WAIT_POLICY of the workers (default: the OpenMP runtime's own, spin then sleep)")
    p.add_argument("--spincount", type=_nonnegative_int, default=None,
                   help="GOMP_SPINCOUNT: spins before an idle OpenMP thread sleeps")


def _configs_arg(text):
    pairs = []
    for item in text.split(","):
        w, sep, t = item.strip().lower().partition("x")
        if not (sep and w.isdecimal() and t.isdecimal() and w.isascii() and t.isascii()
                and int(w) > 0 and int(t) > 0):
            raise TunaError(f"--configs wants WxT pairs like 2x2,4x1, got {item.strip()!r}")
        pairs.append((int(w), int(t)))
    return pairs


def _policies_arg(text):
    return [p.strip() for p in text.split(",") if p.strip()]


def _cmd_run(args):
    from ..measure.experiment import Config, run

    config = Config(args.workers, args.threads, args.model, args.batch, wait_policy=args.wait_policy,
                    spincount=args.spincount)
    out = os.path.join(args.out, config.key) if args.out else None
    result = run(config, _policies_arg(args.policies), trials=args.trials, requests=args.requests, out=out,
                 concurrency=args.concurrency, seed=args.seed, progress=lambda line: print(line, flush=True),
                 csv=args.csv)
    print(_trial_table(result.trials))
    print("\n".join(_comparisons(result.requests, result.trials)))
    if out:
        print(f"wrote {out}")
    return 0


def _comparisons(requests, trials, against="cfs"):
    """Lines "policy vs cfs: p99 speedup X [lo, hi] (95% CI, Fieller)" for every other policy."""
    from ..analysis.stats import compare_policies, scenario_stats, trial_stats
    from ..errors import TunaError

    try:
        scen = scenario_stats(trial_stats(requests, trials))
    except TunaError:
        return []
    lines = []
    for policy in sorted(set(scen["policy"]) - {against}):
        if against not in set(scen["policy"]):
            break
        c = compare_policies(scen, against, policy)
        lines.append(f"{policy} vs {against}: p99 speedup {c['speedup']:.2f}x "
                     f"[{c['speedup_ci_low']:.2f}, {c['speedup_ci_high']:.2f}] (95% CI, Fieller)")
    return lines


def _trial_table(trials):
    """p50/p99 per policy (mean over trials) and the p99 speedup over cfs."""
    ok = trials[trials["trial_status"] == "ok"]
    if ok.empty:
        return "no successful trials"
    cpu = [c for c in ("cpu_per_request", "idle_cpu_share_openmp") if c in ok.columns]
    t = ok.groupby("policy")[["p50", "p99", *cpu]].mean()
    lines = [f"{'policy':<14}{'p50 ms':>9}{'p99 ms':>9}{'p99 speedup vs cfs':>21}"
             + (f"{'CPU ms/req':>12}{'OpenMP idle':>13}" if cpu else "")]
    base = t["p99"].get("cfs")
    for policy, row in t.iterrows():
        sp = f"{base / row['p99']:.2f}x" if base is not None and row["p99"] > 0 else "-"
        line = f"{policy:<14}{row['p50'] * 1e3:>9.1f}{row['p99'] * 1e3:>9.1f}{sp:>21}"
        if cpu:
            line += f"{row['cpu_per_request'] * 1e3:>12.2f}{row['idle_cpu_share_openmp']:>13.0%}"
        lines.append(line)
    return "\n".join(lines)


def _cmd_sweep(args):
    from ..measure.experiment import Config, grid, sweep

    pairs = _configs_arg(args.configs) if args.configs else grid(args.grid)
    models = [m for m in args.models.split(",") if m]
    batches = [int(b) for b in args.batches.split(",") if b]
    waits = [w for w in args.wait_policies.split(",") if w]
    configs = [Config(w, t, m, b, wait_policy=wp, spincount=args.spincount)
               for (w, t) in pairs for m in models for b in batches for wp in waits]
    sweep(configs, _policies_arg(args.policies), args.out, trials=args.trials, requests=args.requests,
          progress=lambda line: print(line, flush=True), seed=args.seed)
    print(f"sweep results in {args.out}; `tuna-lab report {args.out} -o report.html` analyses them")
    return 0


def _cmd_report(args):
    from ..measure.experiment import load_results, load_thread_cpu
    from ..analysis.report import write_report

    requests, trials, manifests = load_results(args.results)
    threads = load_thread_cpu(args.results)
    path = write_report(requests, trials, args.output, title=f"tuna_lab: {args.results}",
                        threads=threads if len(threads) else None,
                        manifest=manifests[0] if len(manifests) == 1 else {"cells": len(manifests),
                                                                           **manifests[0]})
    print(f"wrote {path}")
    return 0


def _cmd_bench(args):
    from ..model.bench import run_solver_bench

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
    _add_wait_options(v)
    v.set_defaults(func=_cmd_serve)

    st = sub.add_parser("status", help="worker -> thread (role, TID) -> allowed CPUs of a running server")
    st.add_argument("--pidfile", required=True)
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_cmd_status)

    sp = sub.add_parser("stop", help="stop a server started with --detach")
    sp.add_argument("--pidfile", required=True)
    sp.set_defaults(func=_cmd_stop)

    r = sub.add_parser("run", help="measure one configuration under several policies")
    r.add_argument("-w", "--workers", type=int, required=True)
    r.add_argument("-t", "--threads", type=int, required=True)
    r.add_argument("--model", default="medium")
    r.add_argument("--batch", type=int, default=100)
    r.add_argument("--policies", default="cfs,round-robin,tuna-scatter")
    r.add_argument("--trials", type=int, default=5)
    r.add_argument("--requests", type=int, default=1000)
    r.add_argument("--concurrency", type=int, default=None, help="in flight (default: all, as the article)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--out", default=None, help="results folder (a cell folder is written inside)")
    r.add_argument("--csv", action="store_true", help="also write CSV copies of the tables")
    _add_wait_options(r)
    r.set_defaults(func=_cmd_run)

    sw = sub.add_parser("sweep", help="a resumable grid of configurations x policies")
    sw.add_argument("--grid", choices=("machine", "article"), default="machine")
    sw.add_argument("--configs", default=None, metavar="WxT,...",
                    help="explicit workers x threads pairs instead of --grid, e.g. 1x2,2x2,4x1")
    sw.add_argument("--models", default="medium")
    sw.add_argument("--batches", default="100")
    sw.add_argument("--policies", default="cfs,round-robin,tuna-scatter")
    sw.add_argument("--trials", type=int, default=5)
    sw.add_argument("--requests", type=int, default=1000)
    sw.add_argument("--seed", type=int, default=0)
    sw.add_argument("--out", required=True)
    sw.add_argument("--wait-policies", default="default",
                    help="comma-separated OMP_WAIT_POLICY values to sweep: default,passive,active")
    sw.add_argument("--spincount", type=_nonnegative_int, default=None, help="GOMP_SPINCOUNT for every cell")
    sw.set_defaults(func=_cmd_sweep)

    rp = sub.add_parser("report", help="analyse results into a self-contained HTML report")
    rp.add_argument("results")
    rp.add_argument("-o", "--output", default="report.html")
    rp.set_defaults(func=_cmd_report)

    d = sub.add_parser("demo", help="the Tuna mapping, then a short live pin-and-measure experiment")
    d.add_argument("--out", default="results")
    d.add_argument("--trials", type=int, default=3)
    d.add_argument("--requests", type=int, default=200)
    d.add_argument("--offline", action="store_true", help="only the mappings, no server")
    d.set_defaults(func=_cmd_demo)

    b = sub.add_parser("bench", help="benchmarks")
    b.add_argument("what", choices=("solver",))
    b.add_argument("--out", default="bench/out/solver.csv", help="CSV to write")
    b.add_argument("--quick", action="store_true", help="a small subset (smoke run)")
    b.add_argument("--pairwise-limit", type=float, default=0.0, metavar="S",
                   help="also run the literal encoding on small models with this time limit (0: skip)")
    b.add_argument("--doc", default=None, metavar="FILE", help="also write a Markdown report")
    b.set_defaults(func=_cmd_bench)
    from ..analysis.advise import add_parser as _add_advise

    _add_advise(sub)
    return p


def _terminate_as_interrupt(signum, frame):
    # SIGTERM (kill, a CI timeout) unwinds like Ctrl-C, so every server the
    # command started is stopped by its context manager instead of orphaned.
    raise KeyboardInterrupt


def main(argv=None):
    import signal
    import threading

    parser = _build_parser()
    args = parser.parse_args(argv)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate_as_interrupt)
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
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
