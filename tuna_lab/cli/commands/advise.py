"""``tuna-lab advise``: should I pin? Train on sweep results and advise one configuration.

The advisor itself is :mod:`tuna_lab.analysis.advise`; this module only turns
options into a question and the answer into text or one JSON object. Building
the parser loads neither pandas nor scikit-learn nor XGBoost.

Examples
--------
>>> import argparse
>>> parser = argparse.ArgumentParser(prog="tuna-lab")
>>> _ = add_parser(parser.add_subparsers(dest="command"))
>>> parser.parse_args(["advise", "-w", "2", "-t", "2", "--model", "small"]).results
'results/sweep'
>>> parser.parse_args(["advise", "results/myapp", "-w", "2", "-t", "2", "--model", "myapp"]).results
'results/myapp'
"""

import argparse
import json
import math
import os
import sys

from ...analysis.advise import DEFAULT_RESULTS
from . import COMMANDS
from ..options import add_size_options, add_wait_options
from ..server_options import RENAMED_IN, add_renamed

__all__ = ["add_parser"]


def add_parser(subparsers, command=None):
    """Add ``advise`` to a ``tuna-lab`` subparsers object; returns the new parser.

    ``command``: None or ``"advise"``, this module's one command (:func:`tuna_lab.cli.build_parser`
    names the command it adds).

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> parser.parse_args(["advise", "-w", "2", "-t", "2", "--model", "small", "--json"]).json
    True
    """
    a = subparsers.add_parser(
        "advise", help=COMMANDS["advise"].help,
        description="Train on sweep results (XGBoost, a linear and a constant baseline, evaluated on held-out "
                    "configurations) and advise one configuration: the best policy, every policy's "
                    "predicted speedup, the nearest measured configurations, and whether the question "
                    "lies outside what the results cover. Where XGBoost does no better than the constant, "
                    "it does not advise pinning on the model's word.",
        epilog="examples:\n"
               "  tuna-lab advise -w 2 -t 2 --model medium\n"
               "  tuna-lab advise results/sweep -w 4 -t 1 --model small --batch 500 --json\n"
               "  tuna-lab advise results/myapp -w 2 -t 1 --model myapp    after `sweep --app myapp:app`\n")
    add_size_options(a)
    # The results' model column: the lab server's model, or the name `sweep --app` recorded (its --label).
    a.add_argument("--model", required=True, metavar="MODEL",
                   help="small, medium or large; for results of `sweep --app`, the --label they were recorded "
                        "under")
    a.add_argument("--batch", type=int, default=None, metavar="ROWS",
                   help="rows per request; none for your app, whose requests are its own (default: 100)")
    add_wait_options(a)
    # The folder read is a positional, as report's; --results DIR, its spelling before 0.1.0, is refused
    # with a pointer for one release.
    a.add_argument("results", nargs="?", default=DEFAULT_RESULTS, metavar="RESULTS",
                   help=f"the sweep results to learn from (default: {DEFAULT_RESULTS})")
    add_renamed(a, "--results", new="RESULTS",
                what=f"--results DIR is now the positional RESULTS, as in report: tuna-lab advise DIR -w W -t T "
                     f"(renamed in {RENAMED_IN})")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.add_argument("--skip-unreadable", action="store_true",
                   help="skip the cells that cannot be read, naming each on stderr; else they end it with exit 1")
    a.set_defaults(func=_cmd_advise)
    return a


def _cmd_advise(args):
    # An AdviseError (a malformed question, unusable results) reaches cli.main: one line, status 2.
    from ...analysis.advise import check_question, train
    from ...analysis.report import cells_without_valid_trial
    from ...errors import UnreadableCellsError
    from .report import say_left_out, unreadable_status

    # Check the question before learning from the results: a typo should not cost a training.
    check_question(args.workers, args.threads, args.model, args.batch, args.wait_policy, args.spincount)
    left_out, no_valid = {}, {}
    try:
        if os.path.isdir(args.results):
            from ...measure import load_results

            # Read once: the advisor learns from these frames, and the cells without a valid trial are
            # found in the same trials (issue 46): cells passed over (their manifest counts no valid trial)
            # and cells read whose trials hold none (a manifest that says otherwise).
            frames = load_results(args.results, args.skip_unreadable, left_out)
            advisor = train(frames, name=args.results)
            no_valid = cells_without_valid_trial(args.results, frames[1])
        else:
            advisor = train(args.results)     # says there is no results folder there, and how to make one
    except UnreadableCellsError as exc:
        return unreadable_status(exc)
    say_left_out(left_out, args.results)
    # A cell whose every trial failed teaches the advisor nothing: said, as report says it.
    for cell, why in no_valid.items():
        print(f"tuna-lab: warning: {cell} has no valid trial and is left out of what advise learns from: {why}",
              file=sys.stderr)
    rec = advisor.recommend(args.workers, args.threads, args.model, batch=args.batch,
                            wait_policy=args.wait_policy, spincount=args.spincount)
    e = advisor.evaluation.set_index("model")
    if args.json:
        out = rec.to_dict()
        out["evaluation"] = {name: {"mae": float(row["mae"]), "r2": None if math.isnan(row["r2"]) else
                                    float(row["r2"])} for name, row in e.iterrows()}
        out["evaluation"].update(configurations=int(e.loc["xgboost", "configurations"]),
                                 rows=int(e.loc["xgboost", "rows"]), scheme=str(e.loc["xgboost", "scheme"]))
        out["results"] = os.fspath(args.results)
        out["left_out"] = {os.path.relpath(c, args.results): why for c, why in left_out.items()}
        out["no_valid_trial"] = no_valid
        print(json.dumps(out))
        return 0
    print(rec)
    # The constant baseline is the yardstick: a regressor no better than it has learnt nothing.
    scores = ", ".join(f"{name} MAE {row['mae']:.3f} R^2 " + ("undefined" if math.isnan(row["r2"]) else
                                                              f"{row['r2']:.2f}")
                       for name, row in e.loc[["xgboost", "linear", "constant"]].iterrows())
    print(f"  learnt from {args.results}: {e.loc['xgboost', 'rows']} rows, "
          f"{e.loc['xgboost', 'configurations']} configurations; held out ({e.loc['xgboost', 'scheme']}): {scores}")
    return 0
