"""``tuna-lab solve``: the Tuna ILP for W workers x T threads on a machine."""

import json

from .options import add_topology_options, positive_float_arg, topology_of

__all__ = ["add_parser"]


def add_parser(subparsers):
    """Add ``solve`` to a ``tuna-lab`` subparsers object; returns the new parser.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["solve", "-w", "2", "-t", "4", "--mode", "compact"])
    >>> args.workers, args.threads, args.mode, args.encoding
    (2, 4, 'compact', 'auto')
    """
    s = subparsers.add_parser("solve", help="solve the Tuna ILP for W workers x T threads")
    s.add_argument("-w", "--workers", type=int, required=True)
    s.add_argument("-t", "--threads", type=int, required=True)
    s.add_argument("--mode", choices=("scatter", "compact"), default="scatter")
    add_topology_options(s)
    s.add_argument("--encoding", choices=("auto", "counts", "pairwise"), default="auto")
    s.add_argument("--without", metavar="FAMILIES", default="",
                   help="comma-separated families to drop, e.g. 11-12,8p")
    s.add_argument("--time-limit", type=positive_float_arg, default=None, metavar="S")
    s.add_argument("--gap", type=float, default=None, help="relative MIP gap (HiGHS default 1e-4)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=_cmd_solve)
    return s


def _cmd_solve(args):
    from ..model import TunaModel

    topo = topology_of(args)
    model = TunaModel(args.workers, args.threads, topo, args.mode, encoding=args.encoding)
    if args.without:
        model = model.without(*[f for f in args.without.split(",") if f])
    mapping = model.solve(time_limit=args.time_limit, gap=args.gap)
    if args.json:
        print(json.dumps(mapping.to_dict()))
    else:
        print(mapping.describe())
    return 0
