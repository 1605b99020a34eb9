"""``tuna-lab bench``: the benchmarks (today the solver's, :mod:`tuna_lab.model.bench`).

A group of its own rather than a part of ``solve``'s module: ``tuna-lab
--help`` lists ``bench`` after the experiment commands, as it always has.
"""

__all__ = ["add_parser"]


def add_parser(subparsers):
    """Add ``bench`` to a ``tuna-lab`` subparsers object; returns the new parser.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["bench", "solver", "--quick"])
    >>> args.what, args.quick, args.out
    ('solver', True, 'bench/out/solver.csv')
    """
    b = subparsers.add_parser(
        "bench", help="benchmarks",
        description="The solver benchmark: the article's 72-model grid and the 384-core cases, solve times "
                    "and model sizes per encoding, into a CSV.",
        epilog="examples:\n"
               "  tuna-lab bench solver --quick                a smoke run of a small subset\n"
               "  tuna-lab bench solver --pairwise-limit 60 --doc docs/solver-bench.md\n")
    b.add_argument("what", choices=("solver",), help="the benchmark to run (today only the solver's)")
    b.add_argument("--out", default="bench/out/solver.csv", help="CSV to write")
    b.add_argument("--quick", action="store_true", help="a small subset (smoke run)")
    b.add_argument("--pairwise-limit", type=float, default=0.0, metavar="S",
                   help="also run the literal encoding on small models with this time limit (0: skip)")
    b.add_argument("--doc", default=None, metavar="FILE", help="also write a Markdown report")
    b.set_defaults(func=_cmd_bench)
    return b


def _cmd_bench(args):
    from ..model.bench import run_solver_bench

    return run_solver_bench(args)
