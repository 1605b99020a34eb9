"""``tuna-lab topology``: a machine's cores, caches and distances, and what this process may use of it."""

import json

from . import COMMANDS
from ..options import add_topology_options, topology_of

__all__ = ["add_parser"]


def add_parser(subparsers, command=None):
    """Add ``topology`` to a ``tuna-lab`` subparsers object; returns the new parser.

    ``command``: None or ``"topology"``, this module's one command (:func:`tuna_lab.cli.build_parser`
    names the command it adds).

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> parser.parse_args(["topology", "--preset", "epyc-7313p", "--json"]).json
    True
    """
    t = subparsers.add_parser(
        "topology", help=COMMANDS["topology"].help,
        description="A machine's logical and physical cores, SMT siblings, caches and the cache distance "
                    "d(c, c') between cores; for this machine (or --fsroot) also the CPUs this process may "
                    "use and its CPU quota.",
        epilog="examples:\n"
               "  tuna-lab topology                          this machine, with its limits\n"
               "  tuna-lab topology --preset xeon-8272cl --json\n")
    add_topology_options(t)
    t.add_argument("--json", action="store_true",
                   help="print one JSON object (logical_cores, physical_core, distance, limits, ...)")
    t.set_defaults(func=_cmd_topology)
    return t


def _cmd_topology(args):
    topo = topology_of(args)
    limits = _limits_of(args)
    if args.json:
        # "limits" is null for a machine that no process of ours runs on (a preset, XML, a spec).
        print(json.dumps({**topo.to_dict(), "limits": None if limits is None else limits.to_dict()}))
        return 0
    print(_describe_topology(topo))
    if limits is not None:
        print(limits.describe())
    return 0


def _limits_of(args):
    """The :class:`~tuna_lab.machine.Limits` of this machine or of ``--fsroot``'s; None for other machines."""
    from ...machine import Limits

    if args.preset or args.hwloc_xml or args.synthetic:
        return None
    return Limits.read(args.fsroot or "/")


def _describe_topology(topo):
    import numpy as np

    from ..._checks import format_cpulist

    lines = [repr(topo)]
    lines.append(f"  logical cores (OS ids): {format_cpulist(topo.cpus)}")
    lines.append(f"  physical cores: {topo.n_physical}, threads per core: {topo.threads_per_core}")
    lines.append(f"  packages: {len(np.unique(topo.package))}, NUMA nodes: {len(np.unique(topo.numa))}")
    for level, labels in sorted(topo.caches.items()):
        lines.append(f"  {level}: {len(np.unique(labels))} domains")
    sib = topo.siblings()
    shown = ", ".join("(" + ",".join(map(str, s)) + ")" for s in sib[:8])
    lines.append(f"  SMT siblings: {shown}{' ...' if len(sib) > 8 else ''}")
    d = topo.distance()
    values, counts = np.unique(d[np.triu_indices_from(d, 1)], return_counts=True)
    lines.append("  distances between distinct cores: "
                 + ", ".join(f"{v:g} x{c}" for v, c in zip(values, counts)))
    if topo.n_logical <= 16:
        lines.append("  distance matrix:")
        for cpu, row in zip(topo.cpus, d):
            lines.append(f"    {cpu:>3}: " + " ".join(f"{v:>3g}" for v in row))
    return "\n".join(lines)
