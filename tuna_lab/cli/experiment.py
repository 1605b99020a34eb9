"""``tuna-lab run``, ``sweep``, ``report`` and ``demo``: measure policies and analyse the results.

Results (tables, the ``--json`` object, the paths written) go to stdout;
progress (one line per trial and per cell) goes to stderr.
"""

import json
import math
import os
import sys

from .._checks import format_cpulist
from ..errors import ExperimentError, TunaError
from .options import (add_client_cpus_option, add_front_cpus_option, add_size_options, add_strict_option,
                      add_wait_options, check_cpu_quota, check_measure_options, client_cpus_of, configs_arg, list_arg,
                      no_valid_status, non_negative_int_arg, policies_arg, policies_help, positive_float_arg,
                      target_of)

__all__ = ["add_parser"]

# run --pid's requests in flight per worker by default: a running server is someone's live service.
_PID_CONCURRENCY = 2

# Help of the options that several of these commands share.
_HELP = {
    "model": "the XGBoost model served: small, medium or large (29, 155, 784 features); trained once on "
             "first use",
    "batch": "rows per request",
    "trials": "trials; in each, every policy runs once, in a random order, on a fresh server",
    "requests": "concurrent requests per policy and trial",
    "seed": "seed of the random policy order and of the request payloads",
}


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
    >>> args.grid, args.configs, args.trials          # None: the default (5), or the article design's trials
    ('machine', '1x2,2x1', None)
    """
    r = subparsers.add_parser(
        "run", help="measure one configuration under several policies: the lab server, your app, or a running server",
        description="Measure a server once per policy and trial, with its threads pinned by the policy, and record "
                    "every request; prints p50/p99 per policy and the p99 speedups over cfs (the article's method). "
                    "The server is tuna_lab's own Gunicorn + XGBoost server (the default), your app started by "
                    "tuna_lab (--app), or a server already running (--pid with --url), pinned live and given back "
                    "its CPU masks at the end.",
        epilog="examples:\n"
               "  tuna-lab run -w 2 -t 2 --model small --trials 3 --requests 200\n"
               "  tuna-lab run -w 2 -t 2 --policies cfs,tuna-scatter --out results/ --json > run.json\n"
               "  tuna-lab run -w 4 -t 2 --client-cpus 6-7        load generator on CPUs 6-7, server on the rest\n"
               "  tuna-lab run --app myapp:app --app-dir src -w 2 -t 2 --path /predict --body req.json\n"
               "  tuna-lab run --app api:app --server uvicorn -w 2 -t 2 --bodies reqs.jsonl --rate 50 --duration 10\n"
               "  tuna-lab run --pid MASTER --url http://127.0.0.1:8000/predict -t 2 --body req.json "
               "--policies cfs,round-robin,tuna-scatter\n")
    add_size_options(r, required=False)
    r.add_argument("--model", default="medium", help=_HELP["model"])
    r.add_argument("--batch", type=int, default=100, help=_HELP["batch"])
    r.add_argument("--policies", default="cfs,round-robin,tuna-scatter",
                   help=policies_help("comma-separated placement policies"))
    r.add_argument("--trials", type=int, default=5, help=_HELP["trials"])
    r.add_argument("--requests", type=int, default=None,
                   help="requests per policy and trial (default 1000; with --rate: as many as --duration holds)")
    r.add_argument("--concurrency", type=int, default=None,
                   help="in flight (default: all, as the article; with --pid: %d per worker - a running server is "
                        "a live service, and %d per worker keeps each worker busy with one more waiting, where "
                        "all at once would measure the queue rather than the serving)" % (_PID_CONCURRENCY,
                                                                                          _PID_CONCURRENCY))
    r.add_argument("--rate", type=positive_float_arg, default=None, metavar="PER_S",
                   help="open loop: Poisson arrivals at this many requests per second (with --duration)")
    r.add_argument("--duration", type=positive_float_arg, default=None, metavar="S",
                   help="open loop: seconds of arrivals per trial")
    r.add_argument("--max-error-rate", type=float, default=0.01, metavar="SHARE",
                   help="a trial with a larger share of failed requests (non-2xx, timeouts) is marked failed "
                        "(default 0.01)")
    r.add_argument("--seed", type=int, default=0, help=_HELP["seed"])
    r.add_argument("--out", default=None,
                   help="results folder (a cell folder is written inside; default: nothing is written)")
    r.add_argument("--csv", action="store_true", help="also write CSV copies of the tables")
    r.add_argument("--json", action="store_true",
                   help="print one JSON object: the summary rows, the speedups and the files written")
    add_wait_options(r)
    add_strict_option(r)
    add_client_cpus_option(r)
    _add_target_options(r)
    r.set_defaults(func=_cmd_run)

    sw = subparsers.add_parser(
        "sweep", help="a resumable grid of configurations x policies",
        description="`run` for every configuration of a grid (workers x threads x model x batch x wait "
                    "policy), one cell folder each, written as soon as it is done: run it again after an "
                    "interruption and the finished cells are skipped.",
        epilog="examples:\n"
               "  tuna-lab sweep --grid machine --models small,medium --batches 100,500 --out results/sweep\n"
               "  tuna-lab sweep --configs 1x2,2x2,4x1 --trials 3 --requests 500 --out results/sweep --json\n"
               "  tuna-lab sweep --grid article --budget 10m --out results/article   the article's experiment, cut "
               "to 10 minutes\n"
               "  tuna-lab sweep --app myapp:app --app-dir src --configs 1x2,2x1 --body req.json --out results/myapp\n")
    sw.add_argument("--grid", choices=("machine", "article"), default="machine",
                    help="machine: the article's 36 W x T pairs scaled to this machine's CPUs, keeping their "
                         "over/undersubscription; article: the article's whole experiment on this machine - those "
                         "pairs, models small,medium,large, batches 100,500,1000, policies cfs,round-robin,"
                         "tuna-scatter, 5 trials x 1,000 requests - cut to --budget (options given explicitly win; "
                         "the article's 36 unscaled pairs are --configs article)")
    sw.add_argument("--configs", default=None, metavar="WxT,...",
                    help="explicit workers x threads pairs instead of --grid, e.g. 1x2,2x2,4x1; 'article': the "
                         "article's 36 pairs as they are, unscaled")
    sw.add_argument("--budget", default=None, metavar="DURATION",
                    help="wall time the sweep may take (90s, 10m, 2h): with --grid article the design is cut to "
                         "fit, in a fixed order (docs/experiment.md); a cell whose estimate does not fit is not "
                         "started (a re-run resumes with it)")
    sw.add_argument("--models", default=None, help="comma-separated models: small, medium, large (default medium)")
    sw.add_argument("--batches", default=None,
                    help="comma-separated batch sizes (rows per request; default 100)")
    sw.add_argument("--policies", default=None, help=policies_help("comma-separated placement policies")
                    + " (default cfs,round-robin,tuna-scatter)")
    sw.add_argument("--trials", type=int, default=None, help=_HELP["trials"] + " (default 5)")
    sw.add_argument("--requests", type=int, default=None, help=_HELP["requests"] + " (default 1000)")
    sw.add_argument("--seed", type=int, default=0, help=_HELP["seed"])
    sw.add_argument("--concurrency", type=int, default=None, help="in flight (default: all, as the article)")
    sw.add_argument("--max-error-rate", type=float, default=0.01, metavar="SHARE",
                    help="a trial with a larger share of failed requests (non-2xx, timeouts) is marked failed "
                         "(default 0.01)")
    sw.add_argument("--out", required=True, help="the sweep's folder: one cell folder per configuration")
    sw.add_argument("--json", action="store_true",
                    help="print one JSON object: the cells run now and those skipped, with their folders")
    sw.add_argument("--wait-policies", default="default",
                    help="comma-separated OMP_WAIT_POLICY values to sweep: default,passive,active")
    sw.add_argument("--spincount", type=non_negative_int_arg, default=None,
                    help="GOMP_SPINCOUNT for every cell")
    add_strict_option(sw)
    add_client_cpus_option(sw)
    _add_cluster_options(sw)
    _add_target_options(sw, running=False)
    sw.set_defaults(func=_cmd_sweep)

    rp = subparsers.add_parser(
        "report", help="analyse results into a self-contained HTML report",
        description="The article's analysis of the results of `run` or `sweep`: p99 per scenario with "
                    "confidence intervals, average speedups over cfs and round-robin (overall and by "
                    "subscription, model and batch), figures, CPU cost and failures, in one HTML file.",
        epilog="examples:\n"
               "  tuna-lab report results/sweep -o report.html\n"
               "  tuna-lab report results/ --json\n")
    rp.add_argument("results", help="a results folder written by `run --out` or `sweep --out`")
    rp.add_argument("-o", "--output", default="report.html", help="the HTML file to write")
    rp.add_argument("--json", action="store_true",
                    help="print one JSON object: the report's path and the average speedups over cfs and "
                         "round-robin")
    rp.set_defaults(func=_cmd_report)

    d = subparsers.add_parser(
        "demo", help="the Tuna mapping, then a short live pin-and-measure experiment",
        description="The Tuna mapping for this machine and the article's (scatter and compact), then a "
                    "short live experiment sized to this machine (cfs, round-robin, tuna-scatter) with a "
                    "report: what `make demo` runs.",
        epilog="examples:\n"
               "  tuna-lab demo\n"
               "  tuna-lab demo --offline                    only the mappings, in seconds\n")
    d.add_argument("--out", default="results", help="results folder; the demo writes OUT/demo")
    d.add_argument("--trials", type=int, default=3, help=_HELP["trials"])
    d.add_argument("--requests", type=int, default=200, help=_HELP["requests"])
    d.add_argument("--offline", action="store_true", help="only the mappings, no server")
    d.set_defaults(func=_cmd_demo)
    return [r, sw, rp, d]


def _add_target_options(parser, running=True):
    """The options that name the user's own server and requests (``run``; ``sweep`` has all but ``--url``)."""
    t = parser.add_argument_group("your own server (docs/measure-your-server.md)")
    t.add_argument("--app", default=None, metavar="MODULE:APP",
                   help="your WSGI/ASGI app, started by tuna_lab once per policy and trial (with -w and -t)"
                   if running else "your WSGI/ASGI app, started by tuna_lab for every cell, policy and trial")
    t.add_argument("--app-dir", default=None, metavar="DIR", help="the folder --app's module is in (default: here)")
    t.add_argument("--server", choices=("gunicorn", "uvicorn"), default="gunicorn",
                   help="what serves --app (default gunicorn)")
    t.add_argument("--server-conf", default=None, metavar="FILE",
                   help="your gunicorn.conf.py: every setting kept, tuna_lab's bind, -w and hooks added")
    t.add_argument("--python", default=None, metavar="PATH",
                   help="with --app: the interpreter to run your server with (your venv's python; default "
                        "tuna-lab's own); the app is imported there first")
    t.add_argument("--pid", type=int, default=None, metavar="MASTER",
                   help="a server already running: its master's PID (with --url and -t); never restarted"
                   if running else "not for a sweep: a running server keeps its W and T (use `run --pid`)")
    if running:
        t.add_argument("--url", default=None, help="where the requests go (a loopback URL); with --pid")
        t.add_argument("--force", action="store_true",
                       help="with --pid: measure the children of PID 1 or of a process that is no recognised "
                            "pre-fork master (refused otherwise)")
        add_front_cpus_option(t, help="with --pid: CPUs (e.g. 0) for every thread of the master, the helpers and "
                                      "the front ends under each pinning policy; the workers are placed on the "
                                      "server's other CPUs, and cfs leaves every mask as it was. For a master or "
                                      "API front end that parses requests itself (MLServer, LitServe)")
    t.add_argument("--path", default="/", help="with --app: the path the requests go to (default /)")
    t.add_argument("--method", default=None,
                   help="the requests' HTTP method (default POST with a body, GET without)")
    t.add_argument("--header", action="append", default=[], metavar="NAME:VALUE",
                   help="a request header (repeatable)")
    t.add_argument("--body", default=None, metavar="FILE", help="the body of every request")
    t.add_argument("--bodies", default=None, metavar="FILE.jsonl",
                   help="bodies, one JSON document per line, sent in turn")
    t.add_argument("--server-timing", default=None, metavar="METRIC",
                   help="the Server-Timing metric taken as the server-side runtime (default: the first with a "
                        "duration); without the header, latency is the client's")
    t.add_argument("--label", default=None, help="the name of your server in the results (default: the module, "
                                                 "or pid<MASTER>)")


def _cmd_run(args):
    from ..analysis.summary import scale_note, summarize
    from ..machine import Limits
    from ..measure.experiment import Config, check_policies, run
    from ..measure.store import check_out

    check_measure_options(args, ExperimentError)
    target = _run_target(args)
    if (args.rate is None) != (args.duration is None):
        raise ExperimentError("the open loop needs both --rate and --duration")
    if args.requests is None and args.rate is None:
        args.requests = 1000
    if args.concurrency is None and args.pid is not None:
        args.concurrency = _PID_CONCURRENCY * target.workers       # bounded: see --concurrency's help
    if target is None:
        config = Config(args.workers, args.threads, args.model, args.batch, wait_policy=args.wait_policy,
                        spincount=args.spincount)
    else:
        config = Config(target.workers, target.threads, target.label, 0, target=target.kind)
    policies = check_policies(policies_arg(args.policies))
    if args.out:
        check_out(args.out, "--out")
    # A running server's are the CPUs its master may use, less --front-cpus: the load generator's come from those.
    machine = target.machine() if target is not None and target.kind == "attached" else None
    client = client_cpus_of(args, ExperimentError, threads=[config.threads], topology=machine)
    check_cpu_quota(config.workers * config.threads, args.strict, ExperimentError)
    out = os.path.join(args.out, config.key) if args.out else None
    result = run(config if target is None else None, policies, trials=args.trials, requests=args.requests, out=out,
                 concurrency=args.concurrency, seed=args.seed, progress=_noted(f"tuna-lab: {client.describe()}"),
                 csv=args.csv,
                 client_cpus=client, target=target, rate=args.rate, duration=args.duration,
                 max_error_rate=args.max_error_rate, strict=args.strict)
    run_summary = summarize(result)
    summary = run_summary.to_dict()
    latency = _latency_words(result.trials)
    if args.json:
        _print_json({"cell": config.key, "config": result.manifest.get("config"), "summary": summary["summary"],
                     "speedups": summary["speedups"], "latency": latency, "target": result.manifest.get("target"),
                     "failed_trials": summary["failed"],
                     "mechanism": summary["mechanism"], "mechanism_correlations": summary["correlations"],
                     "client_cpus": result.manifest.get("client_cpus"),
                     "generator": result.manifest.get("generator"), "path": result.path,
                     "files": sorted(os.path.join(result.path, f) for f in os.listdir(result.path))
                     if result.path else []})
        return _no_valid_status(result)
    print(run_summary.to_text())
    # Right under the speedups, as the demo says it: on a small machine they are not the article's.
    note = scale_note(Limits.read().effective_cpus)
    if note:
        print(note)
    print(f"latency: {latency}")
    if run_summary.mechanism_text():
        print(run_summary.mechanism_text())
    if target is not None and target.kind == "attached":
        if target.front_cpus:
            print(f"front end: the master, helpers and front ends on CPUs {format_cpulist(target.front_cpus)} "
                  "under the pinning policies (--front-cpus); their CPU per request is the table's front column")
        advice = _front_advice(result.trials, target.front_cpus)
        if advice:
            print(f"tuna-lab: warning: {advice}", file=sys.stderr)
    for failure in summary["failed"]:
        print(f"failed: {failure['policy']} trial {failure['trial'] + 1}: {failure['reason']}")
    if out:
        print(f"wrote {out}")
    return _no_valid_status(result)


def _front_advice(trials, front_cpus=None):
    """The ``--front-cpus`` advice for ``run --pid``, or None.

    The summary already shows the front end's CPU per request and says where
    it is a large share (:func:`~tuna_lab.analysis.summary.front_note`); where
    it is and ``--front-cpus`` was not given, this says what to do about it.

    Examples
    --------
    >>> import pandas as pd
    >>> _front_advice(pd.DataFrame()) is None      # nothing recorded: nothing to say
    True
    """
    from ..analysis.summary import front_note

    if front_cpus or not front_note(trials):
        return None
    return ("the master and front ends do real work, on the workers' CPUs; --front-cpus CPULIST keeps them (all "
            "their threads) on CPUs of their own under the pinning policies and places the workers on the rest")


def _run_target(args):
    """``run``'s target (None: the lab server), from the options every measuring command reads alike."""
    target = target_of(args, ExperimentError)
    if target is None:
        if args.workers is None or args.threads is None:
            raise ExperimentError("give -w and -t (the lab server's size)")
        return None
    if args.pid is not None:
        return target
    if args.workers is None or args.threads is None:
        raise ExperimentError("--app needs -w and -t")
    return target(args.workers, args.threads)


def _no_valid_status(source, keys=None):
    """:func:`~tuna_lab.cli.options.no_valid_status` of a run's result or a results folder (its cells ``keys``)."""
    from ..measure.store import no_valid_trial

    return no_valid_status(no_valid_trial(source, keys))


# What each value of a trial's ``latency`` column means, in the words ``run`` prints.
_LATENCY_WORDS = {"server": "server-side (the lab server's own timing of each request)",
                  "server-timing": "server-side (the responses' Server-Timing duration)",
                  "client": "client-side (send to the last byte of the response; the server sent no Server-Timing)"}


def _latency_words(trials):
    kinds = sorted(set(trials["latency"])) if "latency" in trials.columns and len(trials) else ["server"]
    return "; ".join(f"{_LATENCY_WORDS.get(k, k)}" for k in kinds)


def _progress(line):
    """Progress goes to stderr: stdout carries only results (a table, or the one ``--json`` object)."""
    print(line, file=sys.stderr, flush=True)


def _noted(note):
    """:func:`_progress`, saying ``note`` first: once the run holds its folder and CPUs, so that a refusal
    of either (a planted lock file, CPUs in use) stays the one line on stderr."""
    pending = [note]

    def progress(line):
        while pending:
            _progress(pending.pop())
        _progress(line)
    return progress


def _print_json(obj):
    """``obj`` as one line of strict JSON: NaN and infinities (a speedup without a baseline) become null."""
    def clean(value):
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, dict):
            return {str(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    print(json.dumps(clean(obj), allow_nan=False, default=str))


def _add_cluster_options(parser):
    """``--cluster`` and how a sweep spreads over the cluster's machines (see docs/cluster.md)."""
    g = parser.add_argument_group("on a Dask cluster (pip install 'tuna_lab[cluster]')")
    g.add_argument("--cluster", metavar="ADDRESS", default=None,
                   help="run the cells on the machines of a Dask scheduler (tcp://host:8786), one cell per machine "
                        "at a time, or 'local' for a LocalCluster; each machine runs `dask worker ADDRESS "
                        "--nthreads 1 --nworkers 1 --resources machine=1`; cells go to OUT/<machine>/<cell>")
    spread = g.add_mutually_exclusive_group()
    spread.add_argument("--per-machine", action="store_true", help="every machine runs every cell")
    spread.add_argument("--spread", action="store_true",
                        help="each cell runs once, on a machine of the first machine's topology (the default)")
    g.add_argument("--any-machine", action="store_true",
                   help="with --spread: on any machine, whatever its topology")
    g.add_argument("--wait-for-workers", type=positive_float_arg, default=60.0, metavar="SECONDS",
                   help="how long to wait for a first machine (and for one to return) before giving up "
                        "(default: 60)")


def _cmd_sweep(args):
    from ..measure.store import check_out
    from ..measure.sweeps.local import sweep

    if args.cluster is None and (args.per_machine or args.spread or args.any_machine):
        raise ExperimentError("--per-machine, --spread and --any-machine spread a sweep over the machines of "
                              "a Dask cluster: give --cluster ADDRESS too")
    if args.per_machine and args.any_machine:
        raise ExperimentError("--any-machine is for --spread: --per-machine runs every cell on every machine")
    check_out(args.out, "--out")
    check_measure_options(args, ExperimentError)
    budget = None
    if args.budget is not None:
        from ..measure.tune.tuner import parse_duration

        budget = parse_duration(args.budget, "--budget", ExperimentError)
        if args.cluster is not None:
            raise ExperimentError("--budget is kept on this machine: sweep on a cluster without it")
    if args.grid == "article" and args.app is not None:
        raise ExperimentError("--grid article runs the lab server's models and batches: sweep your app with "
                              "--grid machine or --configs")
    target = _sweep_target(args)
    if args.cluster is not None:
        if target is not None:
            raise ExperimentError("--app is measured on this machine: sweep it without --cluster")
        # CPU ids are per machine: each machine chooses (and checks) its client CPUs where it runs.
        configs, design = _configs(args)
        return _sweep_on_cluster(args, configs, design)
    configs, designs = [], []

    def threads(split):
        # The machine grid is sized by the CPUs the server will have, once the client's are kept.
        cells, design = _configs(args, split.server.n_logical, budget)
        configs.extend(cells)
        designs.append(design)
        return {c.threads for c in configs}

    # Chosen here, to size the grid; sweep() checks the rest of the input and then says what was kept.
    client = client_cpus_of(args, ExperimentError, threads=threads)
    # Checked once, before any cell runs, for the largest cell.
    check_cpu_quota(max((c.workers * c.threads for c in configs), default=0), args.strict, ExperimentError)
    design = designs[-1]
    trials, requests, policies = _sweep_sizes(args, design)
    before = _finished_cells(args.out)
    sweep(configs, policies, args.out, trials=trials, requests=requests,
          progress=_progress, seed=args.seed, client_cpus=client, concurrency=args.concurrency,
          max_error_rate=args.max_error_rate,
          target=None if target is None else (lambda c: target(c.workers, c.threads)), budget=budget,
          cuts=design.cuts if design else (), design=design.to_dict() if design else None)
    return _sweep_done(args, configs, before,
                       f"sweep results in {args.out}; `tuna-lab report {args.out} -o report.html` analyses them",
                       design)


def _sweep_sizes(args, design):
    """``(trials, requests, policies)`` of a sweep: the options given, else the article design's, else defaults."""
    if design is not None:
        return design.trials, design.requests, list(design.policies)
    return (5 if args.trials is None else args.trials, 1000 if args.requests is None else args.requests,
            policies_arg("cfs,round-robin,tuna-scatter" if args.policies is None else args.policies))


def _sweep_target(args):
    """``(W, T) -> AppTarget`` for ``sweep --app`` (None: the lab server); its options checked."""
    target = target_of(args, ExperimentError, sweep=True)
    if target is None:
        return None
    # The lab server's factors mean nothing to the user's app: refused rather than ignored.
    for option, default in (("models", None), ("batches", None), ("wait_policies", "default")):
        if getattr(args, option) != default:
            raise ExperimentError(f"--{option.replace('_', '-')} is for the lab server; your app serves its own "
                                  "model (its requests are --body/--bodies)")
    if args.spincount is not None:
        raise ExperimentError("--spincount is for the lab server; set GOMP_SPINCOUNT in your app's environment")
    return target


def _configs(args, server_cpus=None, budget=None):
    """The sweep's cells and its article design (None unless ``--grid article``).

    The cells: ``--configs`` or the grid (sized by at most ``server_cpus``) x
    models x batches x waits; with ``--grid article``, the cells of
    :func:`~tuna_lab.measure.sweeps.article.article_design` (its factors cut to
    ``budget``, those given explicitly kept) x waits. With ``--app`` a cell is
    a W x T pair of the user's app (labelled as ``run --app`` labels it).
    """
    from ..machine import Limits
    from ..measure.experiment import Config, grid

    cpus = Limits.read().effective_cpus
    cpus = cpus if server_cpus is None else min(cpus, server_cpus)
    pairs = None
    if args.configs:
        pairs = grid("article") if args.configs.strip().lower() == "article" else configs_arg(args.configs)
    waits = list_arg(args.wait_policies, "--wait-policies")
    if args.grid == "article" and args.app is None:
        from ..measure.sweeps.article import article_design

        design = article_design(
            cpus, budget, pairs=pairs, models=None if args.models is None else list_arg(args.models, "--models"),
            batches=None if args.batches is None else list_arg(args.batches, "--batches", int),
            policies=None if args.policies is None else policies_arg(args.policies), trials=args.trials,
            requests=args.requests)
        return [Config(c.workers, c.threads, c.model, c.batch, wait_policy=wp, spincount=args.spincount)
                for c in design.configs for wp in waits], design
    if pairs is None:
        pairs = grid(args.grid, cpus=cpus)
    if args.app is not None:
        label = target_of(args, ExperimentError, sweep=True)(1, 1).label
        return [Config(w, t, label, 0, target="app") for (w, t) in pairs], None
    # An empty option is refused by list_arg, not taken for the default.
    models = list_arg("medium" if args.models is None else args.models, "--models")
    batches = list_arg("100" if args.batches is None else args.batches, "--batches", int)
    return [Config(w, t, m, b, wait_policy=wp, spincount=args.spincount)
            for (w, t) in pairs for m in models for b in batches for wp in waits], None


def _finished_cells(out):
    """The finished cell folders under ``out`` (``<cell>`` or, on a cluster, ``<machine>/<cell>``), sorted."""
    from ..measure.store import finished_cells

    try:
        return sorted(folder for folder, _ in finished_cells(out))
    except ExperimentError:         # no folder yet, or nothing finished in it
        return []


def _sweep_done(args, configs, before, message, design=None):
    """Print what the sweep did: ``message``, or with ``--json`` the cells run now, skipped and not run.

    ``not_run``: the cells a budget left out (a re-run resumes with them);
    ``cuts``: how the article design was cut to the budget (empty without one).
    """
    cells = _finished_cells(args.out)
    finished = {os.path.basename(c) for c in cells}
    not_run = [os.path.join(args.out, c.key) for c in configs if c.key not in finished] if args.cluster is None \
        else []
    if not args.json:
        if not_run:
            message += f" ({len(not_run)} of {len(configs)} cells not run within the budget: run it again to resume)"
        print(message)
        return _sweep_status(args, not_run, configs)
    _print_json({"out": args.out, "configurations": len(configs), "policies": _sweep_sizes(args, design)[2],
                 "done": [c for c in cells if c not in before], "skipped": [c for c in cells if c in before],
                 "not_run": not_run, "cuts": [c.to_dict() for c in design.cuts] if design else [],
                 "design": design.to_dict() if design else None,
                 "report": f"tuna-lab report {args.out} -o report.html"})
    return _sweep_status(args, not_run, configs)


def _sweep_status(args, not_run, configs):
    """1 with one stderr line when the sweep ran none of its cells, or a policy of one has no valid trial; else 0."""
    configurations = len(configs)
    if not_run and len(not_run) == configurations:
        print(f"tuna-lab: error: no cell ran: none of the {configurations} fits the budget {args.budget} "
              "(give a larger --budget)" if args.budget else
              f"tuna-lab: error: no cell of the {configurations} ran", file=sys.stderr)
        return 1
    return _no_valid_status(args.out, {c.key for c in configs})


def _sweep_on_cluster(args, configs, design=None):
    """The sweep on the machines of a Dask cluster (each machine's CPU quota is checked where it runs).

    ``--client-cpus`` goes to every machine as typed (or None for the default)
    and is resolved by each machine's run of a cell, which says what it kept.
    """
    from .._checks import parse_cpulist
    from ..measure.sweeps.cluster import connect
    from ..measure.sweeps.local import sweep

    before = _finished_cells(args.out)
    if args.client_cpus is not None and args.client_cpus.strip().lower() != "none":
        # Only the syntax here: which CPUs exist is each machine's to say.
        parse_cpulist(args.client_cpus, "--client-cpus", ExperimentError)
    trials, requests, policies = _sweep_sizes(args, design)
    with connect(args.cluster) as client:
        sweep(configs, policies, args.out, trials=trials, requests=requests,
              progress=_progress, seed=args.seed, client=client, client_cpus=args.client_cpus,
              concurrency=args.concurrency, max_error_rate=args.max_error_rate,
              per_machine=args.per_machine, any_machine=args.any_machine, worker_wait=args.wait_for_workers,
              cuts=design.cuts if design else (), design=design.to_dict() if design else None)
    return _sweep_done(args, configs, before, f"sweep results in {args.out} (one folder per machine); "
                                              f"`tuna-lab report {args.out} -o report.html` compares them", design)


def _cmd_report(args):
    from ..analysis.report import write_report
    from ..analysis.summary import summarize
    from ..measure.experiment import load_results, load_thread_cpu
    from ..measure.store import read_sweep_file

    requests, trials, manifests = load_results(args.results)
    threads = load_thread_cpu(args.results)
    # A sweep on a cluster: one description per machine; the header names the machines, not the first one's CPU.
    machines = {m["machine"]: m for m in manifests} if "machine" in trials.columns else None
    header = manifests[0] if len(manifests) == 1 else {"cells": len(manifests), **manifests[0]}
    if machines:
        header = {"cells": len(manifests), "machines": sorted(machines),
                  **{k: manifests[0][k] for k in ("git_commit", "command", "started") if k in manifests[0]}}
    # A sweep of the article's design (sweep --grid article): the report sets its figures beside the article's.
    settings = read_sweep_file(args.results) if os.path.isdir(args.results) else None
    try:
        path = write_report(requests, trials, args.output, title=f"tuna_lab: {args.results}",
                            threads=threads if len(threads) else None, manifest=header, machines=machines,
                            article=(settings or {}).get("design"))
    except OSError as exc:      # a folder, /proc, no such parent: what _files.write_atomic refused, one line
        raise ExperimentError(f"-o {args.output}: {exc.strerror or exc}" if not isinstance(exc, TunaError)
                              else str(exc)) from None
    if args.json:
        summary = summarize(requests, trials).to_dict()
        _print_json({"report": os.fspath(path), "results": args.results, "cells": len(manifests),
                     "speedups": summary["headline"], "cpu": summary["cpu"],
                     "mechanism": summary["mechanism"], "mechanism_correlations": summary["correlations"]})
        return 0
    print(f"wrote {path}")
    return 0


def _cmd_demo(args):
    from ..analysis.report import write_report
    from ..analysis.summary import scale_note, summarize
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
          f"{args.trials} trials x {args.requests} concurrent requests)\n", flush=True)
    out = os.path.join(args.out, "demo")
    config = Config(W, T, "medium", 100)
    result = run(config, ["cfs", "round-robin", "tuna-scatter"], trials=args.trials, requests=args.requests,
                 out=os.path.join(out, config.key), progress=lambda line: _progress("  " + line))
    print()
    run_summary = summarize(result)
    print(run_summary.to_text())
    # Right under the speedups: on a small machine they are not the article's, and the reader must know why.
    note = scale_note(usable)
    if note:
        print(note)
    if run_summary.mechanism_text():
        print(run_summary.mechanism_text())
    report = write_report(result.requests, result.trials, os.path.join(out, "report.html"),
                          title="tuna_lab demo", manifest=result.manifest)
    print(f"\nraw records: {result.path}\nreport: {report}")
    return 0
