"""``tuna-lab tune``: the workers x threads x policy that serve the most requests within a p99 target.

The search is :func:`tuna_lab.measure.tune.tuner.tune`; this module reads the
options, names the target (the lab server, a user's app tuna_lab starts, or a
running server, whose W and T cannot change) and prints the table, the
winner and its plan, or one ``--json`` object. Progress goes to stderr.
"""

import json
import sys

from . import COMMANDS

__all__ = ["add_parser"]


def add_parser(subparsers, command=None):
    """Add ``tune`` to a ``tuna-lab`` subparsers object; returns the new parser.

    ``command``: None or ``"tune"``, this module's one command (:func:`tuna_lab.cli.build_parser`
    names the command it adds).

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["tune", "--sla-p99", "50ms", "--configs", "1x1,2x1", "--budget", "90s"])
    >>> args.sla_p99, args.configs, args.budget
    ('50ms', '1x1,2x1', '90s')
    """
    from ..options import (WAIT_DEFAULT, add_client_cpus_option, add_target_options, policies_help,
                           positive_float_arg)

    p = subparsers.add_parser(
        "tune", help=COMMANDS["tune"].help,
        description="Race workers x threads x policy candidates on open-loop (Poisson) rate: for each, the "
                    "highest rate whose client p99 stays within --sla-p99. Short trials first; a candidate is "
                    "dropped once its upper bound on the rate is below the best lower bound, and the budget goes "
                    "to the close ones (docs/tune.md). Prints each candidate's rate with its interval, CPU per "
                    "request and why it was dropped, then the winner and its plan; every step is kept in --out.",
        epilog="examples:\n"
               "  tuna-lab tune --sla-p99 50ms --budget 15m --out results/tune\n"
               "  tuna-lab tune --sla-p99 200ms --model small --batch 10 --configs 1x1,2x1 --budget 2m --json\n"
               "  tuna-lab tune --sla-p99 80ms --app myapp:app --app-dir src --path /predict --body req.json\n"
               "  tuna-lab tune --sla-p99 80ms --pid MASTER --url http://127.0.0.1:8000/predict -t 2   "
               "policies only\n")
    p.add_argument("--sla-p99", required=True, metavar="DURATION",
                   help="the p99 target of the client's latency: 50ms, 0.2s")
    p.add_argument("--configs", default="auto", metavar="WxT,...",
                   help="W x T pairs; auto: under- and oversubscribed pairs for the effective CPUs (default: auto)")
    p.add_argument("--policies", default="cfs,round-robin,tuna-scatter", metavar="LIST",
                   help=policies_help("comma-separated policies"))
    p.add_argument("--wait-policies", default="default", metavar="LIST",
                   help=f"OMP_WAIT_POLICY values to race: default, passive, active {WAIT_DEFAULT}")
    p.add_argument("--budget", default="15m", metavar="DURATION", help="wall time of the search: 90s, 15m")
    p.add_argument("--model", default="medium", metavar="MODEL", help="the lab server's model: small, medium or large")
    p.add_argument("--batch", type=int, default=100, metavar="ROWS", help="the lab server's rows per request")
    p.add_argument("--out", default=None, metavar="DIR", help="folder for the records (a cell folder per W x T)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="seed of the arrivals and payloads")
    p.add_argument("--rounds", type=int, default=4, metavar="N",
                   help="most rounds (at least 1); round k's steps last --step-seconds x 2^k")
    p.add_argument("--step-seconds", type=positive_float_arg, default=2.0, metavar="S",
                   help="the first round's step length, in seconds")
    p.add_argument("--confidence", type=float, default=0.9, metavar="P",
                   help="one-sided confidence of the rate bounds")
    add_client_cpus_option(p)
    add_target_options(p, "tune")
    p.set_defaults(func=_cmd_tune)
    return p


def _target(args):
    """The user's target the options name (None: the lab server), read as ``run`` and ``sweep`` read it.

    For ``--app`` the function ``(W, T) -> AppTarget`` is called with
    placeholders: each candidate's run starts the app with its own W and T.
    """
    from ...errors import TuneError
    from ..options import target_of

    if args.app is not None and args.threads is not None:
        raise TuneError("with --app, W and T are searched (--configs): leave out -t")
    target = target_of(args, TuneError)
    return target(1, 1) if args.app is not None else target


def _unmeasured(result):
    """The policies none of whose candidates had a step measured: ``({"tune": failed}, not_run)``.

    ``failed``: some candidate of the policy ran, and every step failed; ``not_run``: none of its candidates
    ran at all (the budget ran out first). Both are empty when every policy has a measured step.
    """
    if result is None or not len(result.table):
        return {}, []
    measured = {row.policy for row in result.table.itertuples()
                if any(s.n and not s.error for s in result.steps.get(row.candidate, ()))}
    ran = {row.policy for row in result.table.itertuples() if result.steps.get(row.candidate)}
    lacking = set(result.table["policy"]) - measured
    failed = sorted(lacking & ran)
    return ({"tune": failed} if failed else {}), sorted(lacking - ran)


def _unmeasured_status(result):
    """Exit status 1, with one stderr line, when some policy was not measured (failed, or never run); else 0."""
    from ..options import no_valid_status

    failed, not_run = _unmeasured(result)
    if not_run:
        # Nothing of these failed: the budget ran out before their first run, and saying "failed" would mislead.
        print(f"tuna-lab: error: {', '.join(not_run)} not measured: the {result.budget:g} s budget ran out before "
              "the first run of any of its candidates; a larger --budget (or fewer candidates) measures it",
              file=sys.stderr)
    return max(no_valid_status(failed), 1 if not_run else 0)


def _cmd_tune(args):
    from ...errors import TuneError, UnmeetableTargetError
    from ..options import check_duration, check_measure_options, configs_arg

    check_measure_options(args, TuneError)
    sla = check_duration(args.sla_p99, "--sla-p99", TuneError)
    budget = check_duration(args.budget, "--budget", TuneError)
    if not 0 < args.confidence < 1:
        raise TuneError(f"--confidence must be in (0, 1), got {args.confidence}")
    if args.rounds < 1:
        raise TuneError(f"--rounds must be at least 1, got {args.rounds}")
    target = _target(args)
    if args.pid is not None and args.configs != "auto":
        raise TuneError("a running server keeps its W and T: leave out --configs (only policies are searched)")
    configs = "auto" if args.configs.strip() == "auto" else configs_arg(args.configs)
    try:
        result = _tune(args, sla, budget, configs, target)
    except UnmeetableTargetError as exc:
        # Nothing measured at all is a failed run (exit 1), not a target too tight (exit 2).
        if _unmeasured_status(exc.result):
            return 1
        raise
    if args.json:
        print(json.dumps(result.to_dict(), allow_nan=False, default=str))
    else:
        print(result.to_text())
    return _unmeasured_status(result)


def _tune(args, sla, budget, configs, target):
    """:func:`~tuna_lab.measure.tune.tuner.tune` with the options, its progress on stderr."""
    from ...measure.trial_spec import TrialSpec
    from ...measure.tune.tuner import tune
    from ..options import policies_arg

    return tune(sla, configs=configs, policies=policies_arg(args.policies),
                wait_policies=[w for w in args.wait_policies.split(",") if w], model=args.model,
                batch=args.batch, target=target, budget=budget, out=args.out,
                trial=TrialSpec(seed=args.seed, client_cpus=args.client_cpus), rounds=args.rounds, step_seconds=args.step_seconds, confidence=args.confidence,
                progress=lambda line: print(line, file=sys.stderr, flush=True))
