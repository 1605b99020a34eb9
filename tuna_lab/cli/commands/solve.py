"""``tuna-lab solve``: the Tuna ILP for W workers x T threads on a machine."""

import json

from . import COMMANDS
from ..options import (add_size_options, add_strict_families_option, add_topology_options, positive_float_arg,
                      topology_of)

__all__ = ["add_parser"]


def add_parser(subparsers, command=None):
    """Add ``solve`` to a ``tuna-lab`` subparsers object; returns the new parser.

    ``command``: None or ``"solve"``, this module's one command (:func:`tuna_lab.cli.build_parser`
    names the command it adds).

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["solve", "-w", "2", "-t", "4", "--mode", "compact"])
    >>> args.workers, args.threads, args.mode, args.encoding
    (2, 4, 'compact', 'auto')
    """
    s = subparsers.add_parser(
        "solve", help=COMMANDS["solve"].help,
        description="The article's 0-1 ILP (cvxpy + HiGHS): the thread-to-core mapping of W workers x T "
                    "threads that maximises f_main + f_mode on a machine (this one unless told).",
        epilog="examples:\n"
               "  tuna-lab solve -w 4 -t 4 --preset xeon-8272cl --mode compact --json\n"
               "  tuna-lab solve -w 2 -t 2                   this machine (the CPUs this process may use)\n"
               "  tuna-lab solve -w 24 -t 2 --preset xeon-8272cl --strict-families   fail if the families conflict\n")
    add_size_options(s)
    s.add_argument("--mode", choices=("scatter", "compact"), default="scatter", metavar="MODE",
                   help="scatter spreads each worker's threads over distant cores, compact packs them close")
    add_topology_options(s)
    s.add_argument("--encoding", choices=("auto", "counts", "pairwise"), default="auto", metavar="NAME",
                   help="counts (fast, exact), pairwise (the article's, slow), auto: counts where the caches nest")
    s.add_argument("--without", metavar="FAMILIES", default="",
                   help="comma-separated families to drop, e.g. 11-12,8p")
    s.add_argument("--time-limit", type=positive_float_arg, default=None, metavar="S",
                   help="answer within S seconds (imports included) with the best mapping found and its gap "
                        "(default: no limit)")
    s.add_argument("--gap", type=float, default=None, help="relative MIP gap (default: HiGHS's, 1e-4)")
    s.add_argument("--json", action="store_true",
                   help="print one JSON object (workers, threads, assignment, f_main, f_mode, objective, ...)")
    add_strict_families_option(s)
    s.set_defaults(func=_cmd_solve)
    return s


def _cmd_solve(args):
    from ...machine.procfs import process_age
    from ...model import TunaModel

    topo = topology_of(args)
    model = TunaModel(args.workers, args.threads, topo, args.mode, encoding=args.encoding)
    if args.without:
        model = model.without(*[f for f in args.without.split(",") if f])
    limit = args.time_limit
    if limit is not None:
        # the user's clock started with the command: what importing cvxpy
        # and building the model took (about 1 s) comes out of the limit
        limit = max(0.05, limit - process_age())
    mapping = model.solve(time_limit=limit, gap=args.gap, on_infeasible=args.on_infeasible)
    if args.json:
        print(json.dumps(mapping.to_dict()))
    else:
        print(mapping.describe())
    return 0
