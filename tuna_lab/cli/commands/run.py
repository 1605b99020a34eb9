"""``tuna-lab run`` and ``demo``: measure policies on one configuration, and the whole story in one command.

Results (tables, the ``--json`` object, the paths written) go to stdout;
progress (one line per trial) goes to stderr.
"""

import argparse
import os
import sys

from ..._checks import format_cpulist, one_line
from ...errors import ExperimentError, TunaError
from . import COMMANDS
from ..options import (MEASURE_HELP, add_client_cpus_option, add_size_options, add_strict_option, add_target_options,
                      add_wait_options, check_cpu_quota, check_measure_options, client_cpus_of, no_valid_status_of,
                      policies_arg, policies_help, positive_float_arg, print_json, progress, target_of)

__all__ = ["add_parser"]

# run --pid's requests in flight per worker by default: a running server is someone's live service.
_PID_CONCURRENCY = 2


def add_parser(subparsers, command=None):
    """Add ``run`` and ``demo`` (or only ``command``, one of them) to a ``tuna-lab`` subparsers object.

    Returns
    -------
    list of argparse.ArgumentParser
        The new parsers, in that order.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["run", "-w", "2", "-t", "2", "--policies", "cfs,round-robin"])
    >>> args.workers, args.threads, args.policies, args.trials
    (2, 2, 'cfs,round-robin', 5)
    """
    return [add(subparsers) for name, add in (("run", _add_run), ("demo", _add_demo)) if command in (None, name)]


def _add_run(subparsers):
    r = subparsers.add_parser(
        "run", help=COMMANDS["run"].help,
        description="Measure a server under each policy, once per trial, its threads pinned by the policy: p50 "
                    "and p99 per policy and the p99 speedups over cfs, the article's way. The server is your app "
                    "with --app, one already running with --pid and --url (given back its CPU masks at the end), "
                    "else tuna_lab's own.",
        epilog="examples:\n"
               "  tuna-lab run -w 2 -t 2 --model small --trials 3 --requests 200\n"
               "  tuna-lab run -w 2 -t 2 --policies cfs,tuna-scatter --out results/ --json > run.json\n"
               "  tuna-lab run -w 4 -t 2 --client-cpus 6-7        load generator on CPUs 6-7, server on the rest\n"
               "  tuna-lab run --app myapp:app --app-dir src -w 2 -t 2 --path /predict --body req.json\n"
               "  tuna-lab run --app api:app --server uvicorn -w 2 -t 2 --bodies reqs.jsonl --rate 50 --duration 10\n"
               "  tuna-lab run --pid MASTER --url http://127.0.0.1:8000/predict -t 2 --body req.json "
               "--policies cfs,round-robin,tuna-scatter\n")
    add_size_options(r, required=False)
    r.add_argument("--model", default="medium", metavar="MODEL", help=MEASURE_HELP["model"])
    r.add_argument("--batch", type=int, default=100, metavar="ROWS", help=MEASURE_HELP["batch"])
    r.add_argument("--policies", default="cfs,round-robin,tuna-scatter", metavar="LIST",
                   help=policies_help("comma-separated placement policies"))
    r.add_argument("--trials", type=int, default=5, metavar="N", help=MEASURE_HELP["trials"])
    r.add_argument("--requests", type=int, default=None, metavar="N",
                   help="requests per policy and trial (default: 1000; with --rate: what --duration holds)")
    # With --pid, a live service: two per worker keep each busy with one more waiting; all at once would
    # measure the queue rather than the serving.
    r.add_argument("--concurrency", type=int, default=None, metavar="N",
                   help="requests in flight (default: all, as the article; with --pid: %d per worker)"
                        % _PID_CONCURRENCY)
    r.add_argument("--rate", type=positive_float_arg, default=None, metavar="PER_S",
                   help="open loop: Poisson arrivals a second (with --duration)")
    r.add_argument("--duration", type=positive_float_arg, default=None, metavar="S",
                   help="open loop: seconds of arrivals per trial")
    r.add_argument("--max-error-rate", type=float, default=0.01, metavar="R", help=MEASURE_HELP["errors"])
    r.add_argument("--seed", type=int, default=0, metavar="N", help=MEASURE_HELP["seed"])
    r.add_argument("--out", default=None, metavar="DIR",
                   help="results folder, a cell folder inside (default: none)")
    r.add_argument("--csv", action="store_true", help="also write CSV copies of the tables")
    r.add_argument("--json", action="store_true", help="print one JSON object")
    add_wait_options(r)
    add_strict_option(r)
    add_client_cpus_option(r)
    add_target_options(r)
    # One of the "your own server" group (said in docs/cli.md with the rest of it).
    r.add_argument("--sample-hz", type=positive_float_arg, default=None, metavar="HZ", help=argparse.SUPPRESS)
    r.set_defaults(func=_cmd_run)
    return r


def _add_demo(subparsers):
    d = subparsers.add_parser(
        "demo", help=COMMANDS["demo"].help,
        description="The Tuna mapping for this machine and the article's (scatter and compact), then a "
                    "short live experiment sized to this machine (cfs, round-robin, tuna-scatter) with a "
                    "report: what `make demo` runs.",
        epilog="examples:\n"
               "  tuna-lab demo\n"
               "  tuna-lab demo --offline                    only the mappings, in seconds\n")
    d.add_argument("--out", default="results", metavar="DIR", help="results folder; the demo writes DIR/demo")
    d.add_argument("--trials", type=int, default=3, metavar="N", help=MEASURE_HELP["trials"])
    d.add_argument("--requests", type=int, default=200, metavar="N", help=MEASURE_HELP["requests"])
    d.add_argument("--offline", action="store_true", help="only the mappings, no server")
    d.set_defaults(func=_cmd_demo)
    return d


def _cmd_run(args):
    from ...measure.experiment import Config, check_policies, run
    from ...measure.store import check_out
    from ...measure.trial_spec import LoadSpec, TrialSpec

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
    load = LoadSpec(args.requests, args.concurrency, args.rate, args.duration)
    trial = TrialSpec(seed=args.seed, max_error_rate=args.max_error_rate, client_cpus=client)
    result = run(config if target is None else None, policies, trials=args.trials, load=load, trial=trial, out=out,
                 progress=_noted(f"tuna-lab: {client.describe()}"), csv=args.csv, target=target, strict=args.strict)
    try:
        return _report_run(args, result, config, target, out)
    except TunaError as exc:
        # The measurement ran (its records are written): what failed after it is no bad input, so not status 2.
        print(f"tuna-lab: error: {one_line(exc)}", file=sys.stderr)
        return 1


def _report_run(args, result, config, target, out):
    """Print what ``run`` measured (a table, or the ``--json`` object); its exit status."""
    from ...analysis.summary import scale_note, summarize
    from ...machine import Limits

    run_summary = summarize(result)
    summary = run_summary.to_dict()
    latency = _latency_words(result.trials)
    if args.json:
        print_json({"cell": config.key, "config": result.manifest.get("config"), "scope": summary["scope"],
                     "verdict": summary["verdict"], "summary": summary["summary"],
                     "speedups": summary["speedups"], "latency": latency, "target": result.manifest.get("target"),
                     "failed_trials": summary["failed"], "notes": summary["notes"],
                     "mechanism": summary["mechanism"], "mechanism_correlations": summary["correlations"],
                     "client_cpus": result.manifest.get("client_cpus"),
                     "generator": result.manifest.get("generator"), "path": result.path,
                     "files": sorted(os.path.join(result.path, f) for f in os.listdir(result.path))
                     if result.path else []})
        return no_valid_status_of(result)
    _print_summary(run_summary, scale_note(Limits.read().effective_cpus))
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
    return no_valid_status_of(result)


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
    from ...analysis.summary import front_note

    if front_cpus or not front_note(trials):
        return None
    return ("the master and front ends do real work, on the workers' CPUs; --front-cpus CPULIST keeps them (all "
            "their threads) on CPUs of their own under the pinning policies and places the workers on the rest")


def _run_target(args):
    """``run``'s target (None: the lab server), from the options every measuring command reads alike."""
    if args.sample_hz is not None and args.pid is None:
        raise ExperimentError("--sample-hz is for a running server (--pid): tuna_lab's server and --app's hooks "
                              "send their scheduler counters per request")
    target = target_of(args, ExperimentError)
    if target is None:
        if args.workers is None or args.threads is None:
            raise ExperimentError("give -w and -t (the lab server's size)")
        return None
    if args.pid is not None:
        return target.sampled_at(args.sample_hz)
    if args.workers is None or args.threads is None:
        raise ExperimentError("--app needs -w and -t")
    return target(args.workers, args.threads)


# What each value of a trial's ``latency`` column means, in the words ``run`` prints.
_LATENCY_WORDS = {"server": "server-side (the lab server's own timing of each request)",
                  "server-timing": "server-side (the responses' Server-Timing duration)",
                  "client": "client-side (send to the last byte of the response; the server sent no Server-Timing)"}


def _latency_words(trials):
    kinds = sorted(set(trials["latency"])) if "latency" in trials.columns and len(trials) else ["server"]
    return "; ".join(f"{_LATENCY_WORDS.get(k, k)}" for k in kinds)


def _noted(note):
    """:func:`~tuna_lab.cli.options.progress`, saying ``note`` first: once the run holds its folder and CPUs,
    so that a refusal of either (a planted lock file, CPUs in use) stays the one line on stderr."""
    pending = [note]

    def noted(line):
        while pending:
            progress(pending.pop())
        progress(line)
    return noted


def _print_summary(run_summary, note):
    """What a run can tell first, then its table and speedups, the machine's scale, and the verdict in words."""
    if run_summary.scope:
        print(f"What this run can tell: {run_summary.scope}")
    print(run_summary.to_text())
    # Right under the speedups: on a small machine they are not the article's, and the reader must know why.
    if note:
        print(note)
    if run_summary.verdict:
        print(f"verdict: {run_summary.verdict}")


# What each mode asks of a worker's threads, in words (docs/model.md): its f_mode term counts their distance
# for it (scatter) or against it (compact).
_MODE_WORDS = {"scatter": "each worker's threads spread apart", "compact": "each worker's threads packed together"}
_MODE_SIGN = {"scatter": "scatter rewards it", "compact": "compact counts it against"}


def _topology_words(topo):
    """``"2 logical CPUs on 2 physical cores, 1 package, 1 L3 cache"``: a topology in words, not its repr."""
    def n(k, word):
        return f"{k} {word}{'' if k == 1 else 's'}"
    caches = int(topo.caches["L3"].max()) + 1 if "L3" in topo.caches else 0
    return (f"{n(topo.n_logical, 'logical CPU')} on {n(topo.n_physical, 'physical core')}, "
            f"{n(int(topo.package.max()) + 1, 'package')}" + (f", {n(caches, 'L3 cache')}" if caches else ""))


def _mapping_words(mapping, violations):
    """A mapping in plain words: the layout, each worker's CPUs, the score and whether it is proven the best.

    ``Mapping.describe()`` speaks the article's notation (L, U, r, scenario 2, the certificate's lattice step);
    the demo's reader meets the mapping first, so it is said in words, and ``tuna-lab solve`` has the rest.
    """
    inst = mapping.instance
    wt = inst.W * inst.T
    spread = ("fewer threads than CPUs" if wt < inst.C else
              f"{inst.U} thread{'' if inst.U == 1 else 's'} on every CPU" if inst.r == 0
              else f"{inst.L} or {inst.U} threads per CPU")
    lines = [f"{inst.mode} ({_MODE_WORDS.get(inst.mode, inst.mode)}): {inst.W} workers x {inst.T} threads on "
             f"{inst.C} CPUs, {spread}"]
    width = len(str(max(int(c) for row in mapping.assignment for c in row)))
    for w, row in enumerate(mapping.assignment):
        lines.append(f"  worker {w}: main thread on CPU {int(row[0]):>{width}}, its threads on CPUs "
                     + " ".join(f"{int(c):>{width}}" for c in row))
    proven = ("proven the best possible (a bound equals it)" if mapping.proven_optimal else
              "the best found within the time limit" + (f", at most {mapping.gap:.1%} from the best"
                                                          if mapping.gap is not None else ""))
    sign = "-" if mapping.f_mode < 0 else "+"
    lines.append(f"  score {mapping.objective:g} = {mapping.f_main:g} for main threads far apart {sign} "
                 f"{abs(mapping.f_mode):g} for the distance between each worker's threads "
                 f"({_MODE_SIGN.get(inst.mode, inst.mode)}); {proven}")
    lines += [f"  relaxed: {r}" for r in mapping.relaxed] + [f"  note: {note}" for note in mapping.notes]
    lines.append("  every constraint of the model, checked on this mapping: "
                 + ("holds" if not violations else f"{len(violations)} violated"))
    return "\n".join(lines)


def _next_steps(report, out):
    """The demo's last lines: where to go next (the report, the notebooks), with the commands."""
    lines = ["" if report is not None else None, "Where to go next:"]
    if report is not None:
        lines.append(f"  the report:    open {report} in a browser; `tuna-lab report {out} -o {report}` "
                     "writes it again from the records")
    lines += ["  the lessons:   `make lab` opens the notebooks in JupyterLab; start with notebook 01 "
              "(notebooks/01_topology_and_distances.ipynb: topology and cache distances)",
              "  your machine:  `tuna-lab run -w W -t T --out results/` measures another size; "
              "docs/getting-started.md says more"]
    return "\n".join(line for line in lines if line is not None)


# What the scheduler's quantities mean, said once before the demo prints them (the report explains them too).
_DEMO_GLOSS = ("(run-queue wait: time a thread was ready to run but waited for a CPU; migrations: moves of a thread "
               "between CPUs; involuntary switches: a thread taken off its CPU before it was done; foreign CPU "
               "share: the serving CPUs' time used by anything else; IRQs: interrupts those CPUs handled; "
               "Spearman: rank correlation with the trial's p99, -1 to 1, weak where its interval holds 0)")


def _check_demo(args):
    """Refuse bad --trials, --requests or --out (:class:`ExperimentError`) before the demo prints anything."""
    from ...measure.store import check_out

    check_measure_options(args, ExperimentError)
    if not args.offline:
        folder = os.path.join(args.out, "demo")
        check_out(folder, "--out")
        try:
            os.makedirs(folder, exist_ok=True)      # as the run would, minutes later: a folder /proc refuses now
        except OSError as exc:
            raise ExperimentError(f"--out {args.out}: cannot create {folder}: {exc.strerror or exc}") from None


def _modes_alike(scatter, compact):
    """The line the demo prints where scatter and compact are one mapping: why (``None`` where they differ)."""
    import numpy as np

    if not np.array_equal(scatter.assignment, compact.assignment):
        return None
    from ...model.modes import difference      # the mode explorer's own words, not a second copy

    return f"  why scatter and compact are one mapping here: {difference(scatter, compact)}"


def _cmd_demo(args):
    from ...analysis.report import write_report
    from ...analysis.summary import demo_opening, scale_note, summarize
    from ...machine import Limits, topology_from
    from ...measure.experiment import Config, run
    from ...measure.trial_spec import LoadSpec
    from ...model import solve

    _check_demo(args)                       # bad input: one line on stderr, nothing on stdout
    here = topology_from(None)
    C = here.n_logical
    # Sized to what this process may really use (a CPU quota caps it): one worker per
    # CPU, two OpenMP threads each - twice as many threads as cores, the
    # oversubscribed regime where placement matters.
    usable = Limits.read().effective_cpus
    W, T = max(2, usable), min(2, usable)
    # The first sentence says what the run can and cannot tell, before minutes of output (issue 49).
    print(demo_opening(usable, *((None, None) if args.offline else (args.trials, args.requests))) + "\n")
    print("== 1. The offline phase: the Tuna mapping\n")
    for title, topo, w, t in ((f"This machine ({C} CPUs)", here, W, T),
                              ("The article's machine, Azure D32ds_v4 (xeon-8272cl)",
                               topology_from("xeon-8272cl"), 4, 8)):
        print(f"-- {title}: {_topology_words(topo)}")
        mappings = []
        for mode in ("scatter", "compact"):
            mappings.append(solve(w, t, topo, mode, time_limit=60))
            print(_mapping_words(mappings[-1], mappings[-1].verify()) + "\n")
        alike = _modes_alike(*mappings)
        if alike:
            print(alike + "\n")
    if args.offline:
        print(_next_steps(None, None))
        return 0
    print(f"== 2. The online phase: pin and measure ({W} workers x {T} threads, medium model, batch 100, "
          f"{args.trials} trials x {args.requests} concurrent requests)\n", flush=True)
    out = os.path.join(args.out, "demo")
    config = Config(W, T, "medium", 100)
    result = run(config, ["cfs", "round-robin", "tuna-scatter"], trials=args.trials,
                 load=LoadSpec(requests=args.requests), out=os.path.join(out, config.key),
                 progress=lambda line: progress("  " + line))
    print()
    run_summary = summarize(result)
    _print_summary(run_summary, scale_note(usable))
    if run_summary.mechanism_text():
        print(_DEMO_GLOSS)
        print(run_summary.mechanism_text())
    # As run prints them: on a loaded machine a trial may fail, and the table alone would not say why.
    for failure in run_summary.failed.itertuples(index=False):
        print(f"failed: {failure.policy} trial {failure.trial + 1}: {failure.reason}")
    report = write_report(result.requests, result.trials, os.path.join(out, "report.html"),
                          title="tuna_lab demo", manifest=result.manifest)
    print(f"\nraw records: {result.path}\nreport: {report}")
    print(_next_steps(report, out))
    # As run: a demo whose every trial of some policy failed ran, and says so with exit 1.
    return no_valid_status_of(result)
