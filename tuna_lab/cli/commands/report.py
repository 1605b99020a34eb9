"""``tuna-lab report``: the article's analysis of ``run`` or ``sweep`` results, in one HTML file."""

import os
import sys

from ...errors import ExperimentError, TunaError, UnreadableCellsError
from . import COMMANDS
from ..options import add_renamed, print_json

__all__ = ["add_parser"]


def add_parser(subparsers, command=None):
    """Add ``report`` to a ``tuna-lab`` subparsers object; returns the new parser.

    ``command``: None or ``"report"``, this module's one command (:func:`tuna_lab.cli.build_parser`
    names the command it adds).

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["report", "results/sweep", "--json"])
    >>> args.results, args.out, args.json
    ('results/sweep', 'report.html', True)
    """
    rp = subparsers.add_parser(
        "report", help=COMMANDS["report"].help,
        description="The article's analysis of the results of `run` or `sweep`: p99 per application and policy "
                    "with confidence intervals, average speedups over cfs and round-robin (overall and by "
                    "subscription, model and batch), figures, CPU cost and failures, in one HTML file.",
        epilog="examples:\n"
               "  tuna-lab report results/sweep -o report.html\n"
               "  tuna-lab report results/ --json\n")
    rp.add_argument("results", metavar="RESULTS", help="a results folder written by `run --out` or `sweep --out`")
    rp.add_argument("-o", "--out", default="report.html", metavar="FILE", help="the HTML file to write")
    add_renamed(rp, "--output", new="-o/--out", what="the HTML file to write")
    rp.add_argument("--json", action="store_true",
                    help="print one JSON object: the report's path and the average speedups over cfs and "
                         "round-robin")
    rp.add_argument("--skip-unreadable", action="store_true",
                    help="skip the cells that cannot be read, naming each on stderr and in the report; else "
                         "they end it with exit 1")
    rp.set_defaults(func=_cmd_report)
    return rp


def _cmd_report(args):
    from ...analysis.report import cells_without_valid_trial, check_report_path, write_report
    from ...analysis.summary import summarize
    from ...analysis.tables import valid_trials
    from ...measure.store import load_cells, read_sweep_file

    # Before the results are read: a path that would replace a measurement is refused at once.
    check_report_path(args.out)
    try:
        requests, trials, manifests, threads, left_out = load_cells(args.results, args.skip_unreadable)
    except UnreadableCellsError as exc:
        return unreadable_status(exc)
    except ExperimentError:
        # Nothing read, but cells whose every trial failed are there: said as that (issue 46), not as "no results".
        if os.path.isdir(args.results) and (no_valid := cells_without_valid_trial(args.results)):
            return _no_valid_status(no_valid, args.results)
        raise
    say_left_out(left_out, args.results)
    no_valid = cells_without_valid_trial(args.results, trials)
    if not valid_trials(trials).any():
        return _no_valid_status(no_valid, args.results)
    for cell, why in no_valid.items():      # one line each: every average below lacks the cell
        print(f"tuna-lab: warning: {cell} has no valid trial and is left out of the report: {why}", file=sys.stderr)
    # A sweep on a cluster: one description per machine; the header names the machines, not the first one's CPU.
    machines = {m["machine"]: m for m in manifests} if "machine" in trials.columns else None
    header = manifests[0] if len(manifests) == 1 else {"cells": len(manifests), **manifests[0]}
    if machines:
        header = {"cells": len(manifests), "machines": sorted(machines),
                  **{k: manifests[0][k] for k in ("git_commit", "command", "started") if k in manifests[0]}}
    # A sweep of the article's design (sweep --grid article): the report sets its figures beside the article's.
    settings = read_sweep_file(args.results) if os.path.isdir(args.results) else None
    try:
        path = write_report(requests, trials, args.out, title=f"tuna_lab: {args.results}",
                            threads=threads if len(threads) else None, manifest=header, machines=machines,
                            article=(settings or {}).get("design"), left_out=left_out, no_valid=no_valid)
    except OSError as exc:      # a folder, /proc, no such parent: what _files.write_atomic refused, one line
        raise ExperimentError(f"--out {args.out}: {exc.strerror or exc}" if not isinstance(exc, TunaError)
                              else str(exc)) from None
    if args.json:
        summary = summarize(requests, trials).to_dict()
        print_json({"report": os.fspath(path), "results": args.results, "cells": len(manifests),
                    "left_out": {os.path.relpath(c, args.results): why for c, why in left_out.items()},
                    "no_valid_trial": no_valid,
                     "speedups": summary["headline"], "cpu": summary["cpu"],
                     "mechanism": summary["mechanism"], "mechanism_correlations": summary["correlations"],
                     "anatomy": summary["anatomy"]})
        return 0
    print(f"wrote {path}")
    return 0


def unreadable_status(exc):
    """Exit status 1, with one line naming every cell that cannot be read (``report`` and ``advise`` alike)."""
    print(f"tuna-lab: error: {exc}; --skip-unreadable reads the others and names these", file=sys.stderr)
    return 1


def _no_valid_status(no_valid, results):
    """Exit status 1 (measurements that ran and failed), one line: not one cell has a valid trial to report."""
    listed = "; ".join(f"{cell} ({why})" for cell, why in no_valid.items()) or "every trial failed"
    print(f"tuna-lab: error: no cell under {results} has a valid trial, so there is nothing to report: {listed}",
          file=sys.stderr)
    return 1


def say_left_out(left_out, results):
    """With ``--skip-unreadable``: one line naming the cells left out, so that no average changes in silence."""
    if left_out:
        from ..._checks import printable

        names = "; ".join(printable(f"{os.path.relpath(c, results)}: {why}") for c, why in left_out.items())
        print(f"tuna-lab: warning: {len(left_out)} cell{'s' * (len(left_out) != 1)} left out (--skip-unreadable): "
              f"{names}", file=sys.stderr)
