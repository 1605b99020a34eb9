"""``tuna-lab sweep``: ``run`` for every configuration of a grid, resumable, here or on a Dask cluster.

Each cell's folder is written as soon as the cell is done; the paths (or the
``--json`` object) go to stdout, progress (one line per trial and per cell)
to stderr.
"""

import os
import sys

from ...errors import ExperimentError
from . import COMMANDS
from ..options import (MEASURE_HELP, SPINCOUNT_HELP, WAIT_DEFAULT, add_client_cpus_option, add_strict_option,
                      add_target_options, check_cpu_quota, check_measure_options, client_cpus_of, configs_arg, list_arg, no_valid_status_of,
                      non_negative_int_arg, policies_arg, policies_help, positive_float_arg, print_json, progress,
                      target_of)

__all__ = ["add_parser"]


def add_parser(subparsers, command=None):
    """Add ``sweep`` to a ``tuna-lab`` subparsers object; returns the new parser.

    ``command``: None or ``"sweep"``, this module's one command (:func:`tuna_lab.cli.build_parser`
    names the command it adds).

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["sweep", "--out", "results/sweep", "--configs", "1x2,2x1"])
    >>> args.grid, args.configs, args.trials          # None: the default (5), or the article design's trials
    ('machine', '1x2,2x1', None)
    """
    sw = subparsers.add_parser(
        "sweep", help=COMMANDS["sweep"].help,
        description="`run` for every configuration of a grid (workers x threads x model x batch x wait "
                    "policy), one cell folder each, written as soon as it is done: run it again after an "
                    "interruption and the finished cells are skipped.",
        epilog="examples:\n"
               "  tuna-lab sweep --grid machine --models small,medium --batches 100,500 --out results/sweep\n"
               "  tuna-lab sweep --configs 1x2,2x2,4x1 --trials 3 --requests 500 --out results/sweep --json\n"
               "  tuna-lab sweep --grid article --budget 10m --out results/article   the article's experiment, cut "
               "to 10 minutes\n"
               "  tuna-lab sweep --app myapp:app --app-dir src --configs 1x2,2x1 --body req.json --out results/myapp\n")
    sw.add_argument("--grid", choices=("machine", "article"), default="machine", metavar="GRID",
                    help="machine: the article's pairs, scaled; article: its whole experiment, cut to --budget "
                         "(default: machine)")
    sw.add_argument("--configs", default=None, metavar="WxT,...",
                    help="W x T pairs instead of --grid, e.g. 1x2,2x2,4x1; article: the article's 36, unscaled")
    sw.add_argument("--budget", default=None, metavar="DURATION",
                    help="wall time the sweep may take (90s, 10m, 2h); a cell that does not fit is left for a re-run")
    sw.add_argument("--models", default=None, metavar="LIST",
                    help="comma-separated models: small, medium, large (default: medium)")
    sw.add_argument("--batches", default=None, metavar="LIST",
                    help="comma-separated rows per request (default: 100)")
    sw.add_argument("--policies", default=None, metavar="LIST", help=policies_help("comma-separated policies")
                    + " (default: cfs,round-robin,tuna-scatter)")
    sw.add_argument("--trials", type=int, default=None, metavar="N", help=MEASURE_HELP["trials"] + " (default: 5)")
    sw.add_argument("--requests", type=int, default=None, metavar="N",
                    help=MEASURE_HELP["requests"] + " (default: 1000)")
    sw.add_argument("--seed", type=int, default=0, metavar="N", help=MEASURE_HELP["seed"])
    sw.add_argument("--concurrency", type=int, default=None, metavar="N",
                    help="requests in flight (default: all, as the article)")
    sw.add_argument("--max-error-rate", type=float, default=0.01, metavar="R", help=MEASURE_HELP["errors"])
    sw.add_argument("--out", required=True, metavar="DIR", help="the sweep's folder: a cell folder per configuration")
    sw.add_argument("--json", action="store_true", help="print one JSON object: the cells run, skipped, not run")
    sw.add_argument("--wait-policies", default="default", metavar="LIST",
                    help=f"OMP_WAIT_POLICY values to sweep: default, passive, active {WAIT_DEFAULT}")
    sw.add_argument("--spincount", type=non_negative_int_arg, default=None, metavar="N",
                    help=SPINCOUNT_HELP.replace("GOMP_SPINCOUNT", "GOMP_SPINCOUNT of every cell"))
    add_strict_option(sw)
    add_client_cpus_option(sw)
    _add_cluster_options(sw)
    add_target_options(sw, "sweep")
    sw.set_defaults(func=_cmd_sweep)
    return sw


def _add_cluster_options(parser):
    """``--cluster`` and how a sweep spreads over the cluster's machines (see docs/cluster.md)."""
    g = parser.add_argument_group("on a Dask cluster (pip install 'tuna_lab[cluster]'; see docs/cluster.md)")
    g.add_argument("--cluster", metavar="ADDRESS", default=None,
                   help="run the cells on a Dask scheduler's machines (tcp://host:8786, or local), into "
                        "OUT/<machine>/<cell>")
    spread = g.add_mutually_exclusive_group()
    spread.add_argument("--per-machine", action="store_true", help="every machine runs every cell")
    spread.add_argument("--spread", action="store_true",
                        help="each cell runs once, on a machine of the first one's topology (as without either)")
    g.add_argument("--any-machine", action="store_true",
                   help="with --spread: on any machine, whatever its topology")
    g.add_argument("--wait-for-workers", type=positive_float_arg, default=60.0, metavar="S",
                   help="seconds to wait for a first machine (or one to return) before giving up")


def _cmd_sweep(args):
    from ...measure.store import check_out
    from ...measure.sweeps.local import sweep

    if args.cluster is None and (args.per_machine or args.spread or args.any_machine):
        raise ExperimentError("--per-machine, --spread and --any-machine spread a sweep over the machines of "
                              "a Dask cluster: give --cluster ADDRESS too")
    if args.per_machine and args.any_machine:
        raise ExperimentError("--any-machine is for --spread: --per-machine runs every cell on every machine")
    check_out(args.out, "--out")
    check_measure_options(args, ExperimentError)
    budget = None
    if args.budget is not None:
        from ..options import check_duration

        budget = check_duration(args.budget, "--budget", ExperimentError)
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
          progress=progress, seed=args.seed, client_cpus=client, concurrency=args.concurrency,
          max_error_rate=args.max_error_rate,
          target=None if target is None else (lambda c: target(c.workers, c.threads)), budget=budget,
          design=design)
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
    from ...machine import Limits
    from ...measure.experiment import Config, grid

    cpus = Limits.read().effective_cpus
    cpus = cpus if server_cpus is None else min(cpus, server_cpus)
    pairs = None
    if args.configs:
        pairs = grid("article") if args.configs.strip().lower() == "article" else configs_arg(args.configs)
    waits = list_arg(args.wait_policies, "--wait-policies")
    if args.grid == "article" and args.app is None:
        from ...measure.sweeps.article import article_design

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
    from ...measure.store import finished_cells

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
    print_json({"out": args.out, "configurations": len(configs), "policies": _sweep_sizes(args, design)[2],
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
    return no_valid_status_of(args.out, {c.key for c in configs})


def _sweep_on_cluster(args, configs, design=None):
    """The sweep on the machines of a Dask cluster (each machine's CPU quota is checked where it runs).

    ``--client-cpus`` goes to every machine as typed (or None for the default)
    and is resolved by each machine's run of a cell, which says what it kept.
    """
    from ..._checks import parse_cpulist
    from ...measure.sweeps.cluster import connect
    from ...measure.sweeps.local import ClusterSpec, sweep

    before = _finished_cells(args.out)
    if args.client_cpus is not None and args.client_cpus.strip().lower() != "none":
        # Only the syntax here: which CPUs exist is each machine's to say.
        parse_cpulist(args.client_cpus, "--client-cpus", ExperimentError)
    trials, requests, policies = _sweep_sizes(args, design)
    with connect(args.cluster) as client:
        sweep(configs, policies, args.out, trials=trials, requests=requests,
              progress=progress, seed=args.seed, client_cpus=args.client_cpus,
              concurrency=args.concurrency, max_error_rate=args.max_error_rate,
              cluster=ClusterSpec(client, per_machine=args.per_machine, any_machine=args.any_machine,
                                  worker_wait=args.wait_for_workers),
              design=design)
    return _sweep_done(args, configs, before, f"sweep results in {args.out} (one folder per machine); "
                                              f"`tuna-lab report {args.out} -o report.html` compares them", design)
