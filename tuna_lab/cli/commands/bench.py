"""``tuna-lab bench``: the benchmarks (:mod:`tuna_lab.bench.solver`, the solver's;
:mod:`tuna_lab.bench.load`, the load generator's against Debian's wrk).

A module of its own rather than a part of ``solve``'s: ``tuna-lab --help``
lists ``bench`` after the experiment commands, as it always has.
"""

from . import COMMANDS
from ..options import THREADS_HELP, add_renamed, configs_arg, policies_arg

__all__ = ["add_parser"]

# Where each benchmark writes its CSV unless --out says otherwise.
_DEFAULT_OUT = {"solver": "bench/out/solver.csv", "load": "bench/out/load.csv", "tune": "bench/out/tune.csv",
                "sampler": "bench/out/sampler.csv"}


def add_parser(subparsers, command=None):
    """Add ``bench`` to a ``tuna-lab`` subparsers object; returns the new parser.

    ``command``: None or ``"bench"``, this module's one command (:func:`tuna_lab.cli.build_parser`
    names the command it adds).

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["bench", "solver", "--quick"])
    >>> args.what, args.quick, args.out
    ('solver', True, None)
    >>> args = parser.parse_args(["bench", "load", "--duration", "2", "--rounds", "1"])
    >>> args.what, args.connections, args.duration, args.model       # --concurrency, kept as the bench reads it
    ('load', 8, 2.0, 'small')
    """
    b = subparsers.add_parser(
        "bench", help=COMMANDS["bench"].help,
        description="Four benchmarks, each with its own options (`tuna-lab bench NAME --help`): the solver's "
                    "times and model sizes, `tune` against an exhaustive search, tuna_lab's load generator "
                    "beside Debian's wrk, and the CPU `run --pid`'s sampler takes from a loaded server. Each "
                    "writes a CSV, and with --doc a Markdown report.",
        epilog="examples:\n"
               "  tuna-lab bench solver --quick                a smoke run of a small subset\n"
               "  tuna-lab bench load --doc docs/load-bench.md  tuna_lab's generator vs wrk\n"
               "  tuna-lab bench tune --doc docs/tune-bench.md  tune vs an exhaustive search (medium, batch 100)\n"
               "  tuna-lab bench sampler                        run --pid's sampler: its share of the server's CPU\n")
    which = b.add_subparsers(title="benchmarks", dest="what", required=True, metavar="NAME",
                             help="the benchmark to run", parser_class=type(b))
    for name, add in (("solver", _add_solver), ("load", _add_load), ("tune", _add_tune), ("sampler", _add_sampler)):
        sub = add(which)
        sub.add_argument("--out", default=None, metavar="FILE", help=f"the CSV to write (default: {_DEFAULT_OUT[name]})")
        sub.add_argument("--doc", default=None, metavar="FILE", help="also write a Markdown report")
        sub.set_defaults(func=_cmd_bench)
    return b


def _add_solver(which):
    solver = which.add_parser(
        "solver", help="solve times and model sizes per encoding",
        description="The solver benchmark: the article's 72-model grid and the 384- and 768-core cases, solve "
                    "times and model sizes per encoding, and the relaxed placements where the families conflict, "
                    "into a CSV (docs/solver-bench.md).",
        epilog="examples:\n"
               "  tuna-lab bench solver --quick                a smoke run of a small subset\n"
               "  tuna-lab bench solver --pairwise-limit 60 --doc docs/solver-bench.md\n")
    solver.add_argument("--quick", action="store_true", help="a small subset (smoke run)")
    solver.add_argument("--pairwise-limit", type=float, default=0.0, metavar="S",
                        help="seconds for the literal encoding on small models too; 0 leaves it out")
    solver.add_argument("--scale-only", "--scale", dest="scale_only", action="store_true",
                        help="only the scale cases; with --doc, replace only their section")
    solver.add_argument("--relaxed-only", action="store_true",
                        help="only the relaxed placements; with --doc, replace only their section")
    return solver


def _add_lab_server(parser, concurrency):
    """The lab server the load and sampler benches measure against, and the requests they keep in flight
    (``--concurrency``, as ``run`` and ``sweep`` call them; read by the benches as ``args.connections``)."""
    parser.add_argument("-w", "--workers", type=int, default=2, metavar="W", help="worker processes, a count")
    parser.add_argument("-t", "--threads", type=int, default=1, metavar="T", help=THREADS_HELP)
    parser.add_argument("--model", default="small", choices=("small", "medium", "large"), metavar="MODEL",
                        help="the server's model: small, medium or large")
    parser.add_argument("--batch", type=int, default=10, metavar="ROWS", help="rows per request")
    parser.add_argument("--concurrency", dest="connections", type=int, default=8, metavar="N", help=concurrency)
    add_renamed(parser, "--connections", new="--concurrency", what="requests in flight, as in run and sweep")


def _add_load(which):
    load = which.add_parser(
        "load", help="tuna_lab's load generator beside Debian's wrk",
        description="tuna_lab's load generator side by side with Debian's wrk (installed if missing and root) "
                    "against one real server: requests/s, p50, p99 and generator CPU per request, in alternating "
                    "rounds, and an open loop's send lag at 1,000 requests/s (docs/load-bench.md).",
        epilog="examples:\n"
               "  tuna-lab bench load --doc docs/load-bench.md  tuna_lab's generator vs wrk\n"
               "  tuna-lab bench load --duration 2 --rounds 1   a short run\n")
    _add_lab_server(load, concurrency="requests in flight, for both tools")
    load.add_argument("--policy", default="cfs", metavar="POLICY", help="the server's placement policy")
    load.add_argument("--duration", type=float, default=5, metavar="S",
                      help="seconds of each wrk run; tuna_lab's runs send what the last rate gives in that time")
    load.add_argument("--requests", type=int, default=None, metavar="N",
                      help="a fixed number of requests for tuna_lab's runs instead")
    load.add_argument("--rounds", type=int, default=5, metavar="N", help="rounds of both tools, in alternating order")
    load.add_argument("--open-duration", type=float, default=3, metavar="S",
                      help="seconds of the open loop at 1,000 requests/s against a trivial endpoint")
    load.add_argument("--no-install", action="store_true", help="do not apt-get install wrk if it is missing")
    return load


def _add_tune(which):
    tune = which.add_parser(
        "tune", help="`tune` against an exhaustive search of the same candidates",
        description="`tune` against an exhaustive search of the same candidates at the same trial lengths: the "
                    "lab server, medium model, batch 100, a p99 target twice the best single-request latency "
                    "(docs/tune-bench.md).",
        epilog="example:\n  tuna-lab bench tune --doc docs/tune-bench.md\n")
    # --rounds as tune's (read by the bench as args.race_rounds).
    tune.add_argument("--rounds", dest="race_rounds", type=int, default=4, metavar="N",
                      help="most rounds of both searches (at least 1); round k's steps last --step-seconds x 2^k")
    add_renamed(tune, "--race-rounds", new="--rounds", what="as tune's")
    tune.add_argument("--step-seconds", type=float, default=1, metavar="S",
                      help="the first round's step length, in seconds")
    tune.add_argument("--configs", default="auto", metavar="WxT,...", help="the candidates' W x T pairs, or auto")
    tune.add_argument("--policies", default="cfs,round-robin,tuna-scatter", metavar="LIST",
                      help="the candidates' policies")
    return tune


def _add_sampler(which):
    sampler = which.add_parser(
        "sampler", help="run --pid's sampler of scheduler counters: its share of a loaded server's CPU",
        description="The CPU `run --pid`'s sampler of the workers' scheduler counters takes, against a loaded lab "
                    "server: closed loops with and without it, in alternating rounds; its CPU over the workers' "
                    "per request, against the 2% of it the sampler may take (docs/anatomy.md). About 40 s.",
        epilog="examples:\n"
               "  tuna-lab bench sampler                      50 Hz, 3 rounds of 4 s\n"
               "  tuna-lab bench sampler --sample-hz 200 --rounds 1\n")
    _add_lab_server(sampler, concurrency="requests in flight")
    sampler.add_argument("--duration", type=float, default=4, metavar="S", help="seconds of each run")
    sampler.add_argument("--rounds", type=int, default=3, metavar="N",
                         help="rounds of one run with the sampler and one without")
    sampler.add_argument("--sample-hz", type=float, default=None, metavar="HZ",
                         help="samples a second (default: run --pid's, 50)")
    return sampler


def _cmd_bench(args):
    from ..._files import check_output

    if args.out is None:
        args.out = _DEFAULT_OUT[args.what]
    # Before minutes of work, and as root too: never through a link someone planted, never into a FIFO,
    # a device or /proc (the files are written whole at the end, by the one file layer).
    check_output(args.out, "--out")
    if args.doc:
        if args.doc == args.out:
            from ...errors import UnsafeFileError

            raise UnsafeFileError(f"--doc and --out are the same file ({args.out}); give two")
        check_output(args.doc, "--doc")
        if args.what == "solver":
            import os

            from ..._files import read_text

            # The solver bench replaces a section of the report that is there: read it now (size cap, UTF-8),
            # not after the work.
            if os.path.lexists(args.doc):
                read_text(args.doc, follow=False)
    if args.what == "tune":
        from ...bench.tune import run_tune_bench
        from ...errors import TuneError

        if args.race_rounds < 1:                        # as tune refuses it
            raise TuneError(f"--rounds must be at least 1, got {args.race_rounds}")

        # Parsed here: the bench (in measure/) takes lists, not the command line's text.
        if args.configs != "auto":
            args.configs = configs_arg(args.configs)
        args.policies = policies_arg(args.policies)
        return run_tune_bench(args)
    if args.what == "load":
        from ...bench.load import run_load_bench

        return run_load_bench(args)
    if args.what == "sampler":
        from ...bench.sampler import run_sampler_bench

        return run_sampler_bench(args)
    from ...bench.solver import run_solver_bench

    return run_solver_bench(args)
