"""``tuna-lab run``, ``sweep``, ``report`` and ``demo``: measure policies and analyse the results."""

import os

from ..errors import ExperimentError, TunaError
from .options import (add_strict_option, add_wait_options, check_cpu_quota, configs_arg, non_negative_int_arg,
                      policies_arg)

__all__ = ["add_parser"]


def add_parser(subparsers):
    """Add ``run``, ``sweep``, ``report`` and ``demo`` to a ``tuna-lab`` subparsers object.

    Returns
    -------
    list of argparse.ArgumentParser
        The four new parsers, in that order.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["sweep", "--out", "results/sweep", "--configs", "1x2,2x1"])
    >>> args.grid, args.configs, args.trials
    ('machine', '1x2,2x1', 5)
    """
    r = subparsers.add_parser("run", help="measure one configuration under several policies")
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
    add_wait_options(r)
    add_strict_option(r)
    r.set_defaults(func=_cmd_run)

    sw = subparsers.add_parser("sweep", help="a resumable grid of configurations x policies")
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
    sw.add_argument("--spincount", type=non_negative_int_arg, default=None,
                    help="GOMP_SPINCOUNT for every cell")
    add_strict_option(sw)
    sw.set_defaults(func=_cmd_sweep)

    rp = subparsers.add_parser("report", help="analyse results into a self-contained HTML report")
    rp.add_argument("results")
    rp.add_argument("-o", "--output", default="report.html")
    rp.set_defaults(func=_cmd_report)

    d = subparsers.add_parser("demo", help="the Tuna mapping, then a short live pin-and-measure experiment")
    d.add_argument("--out", default="results")
    d.add_argument("--trials", type=int, default=3)
    d.add_argument("--requests", type=int, default=200)
    d.add_argument("--offline", action="store_true", help="only the mappings, no server")
    d.set_defaults(func=_cmd_demo)
    return [r, sw, rp, d]


def _cmd_run(args):
    from ..measure.experiment import Config, run

    config = Config(args.workers, args.threads, args.model, args.batch, wait_policy=args.wait_policy,
                    spincount=args.spincount)
    check_cpu_quota(config.workers * config.threads, args.strict, ExperimentError)
    out = os.path.join(args.out, config.key) if args.out else None
    result = run(config, policies_arg(args.policies), trials=args.trials, requests=args.requests, out=out,
                 concurrency=args.concurrency, seed=args.seed, progress=lambda line: print(line, flush=True),
                 csv=args.csv)
    print(_trial_table(result.trials))
    print("\n".join(_comparisons(result.requests, result.trials)))
    if out:
        print(f"wrote {out}")
    return 0


def _cmd_sweep(args):
    from ..measure.experiment import Config, grid, sweep

    pairs = configs_arg(args.configs) if args.configs else grid(args.grid)
    models = [m for m in args.models.split(",") if m]
    batches = [int(b) for b in args.batches.split(",") if b]
    waits = [w for w in args.wait_policies.split(",") if w]
    configs = [Config(w, t, m, b, wait_policy=wp, spincount=args.spincount)
               for (w, t) in pairs for m in models for b in batches for wp in waits]
    # Checked once, before any cell runs, for the largest cell.
    check_cpu_quota(max((c.workers * c.threads for c in configs), default=0), args.strict, ExperimentError)
    sweep(configs, policies_arg(args.policies), args.out, trials=args.trials, requests=args.requests,
          progress=lambda line: print(line, flush=True), seed=args.seed)
    print(f"sweep results in {args.out}; `tuna-lab report {args.out} -o report.html` analyses them")
    return 0


def _cmd_report(args):
    from ..analysis.report import write_report
    from ..measure.experiment import load_results, load_thread_cpu

    requests, trials, manifests = load_results(args.results)
    threads = load_thread_cpu(args.results)
    path = write_report(requests, trials, args.output, title=f"tuna_lab: {args.results}",
                        threads=threads if len(threads) else None,
                        manifest=manifests[0] if len(manifests) == 1 else {"cells": len(manifests),
                                                                           **manifests[0]})
    print(f"wrote {path}")
    return 0


def _cmd_demo(args):
    from ..analysis.report import write_report
    from ..machine import Limits, topology_from
    from ..measure.experiment import Config, run
    from ..model import solve

    here = topology_from(None)
    C = here.n_logical
    # Sized to what this process may really use (a CPU quota caps it): one worker per
    # CPU, two OpenMP threads each - twice as many threads as cores, the
    # oversubscribed regime where placement matters.
    usable = Limits.read().effective_cpus
    W, T = max(2, usable), min(2, usable)
    print("== 1. The offline phase: the Tuna mapping\n")
    for title, topo, w, t in ((f"This machine ({C} CPUs)", here, W, T),
                              ("The article's machine, Azure D32ds_v4 (xeon-8272cl)",
                               topology_from("xeon-8272cl"), 4, 8)):
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


def _comparisons(requests, trials, against="cfs"):
    """Lines "policy vs cfs: p99 speedup X [lo, hi] (95% CI, Fieller)" for every other policy."""
    from ..analysis.stats import compare_policies, scenario_stats, trial_stats

    try:
        scen = scenario_stats(trial_stats(requests, trials))
    except TunaError:
        # Too few successful trials to compare: the table above already says what ran.
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
