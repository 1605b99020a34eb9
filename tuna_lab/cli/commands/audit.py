"""``tuna-lab audit``: a running server's placement as the kernel shows it, and what is wrong with it.

One screen: the server's processes and threads (role, mask, last CPU, run-queue
wait and migrations per second over ``--interval``), then the findings of
:func:`tuna_lab.live.audit.findings`, each with its evidence and what to
do. Exit status 0: clean; 1: findings; 2: bad input. ``audit`` changes nothing
unless ``--isolate --apply``, which moves other processes' threads and IRQs off
the serving CPUs and records it for ``tuna-lab unpin --isolate``.
"""

import json
import sys

from . import COMMANDS
from ..options import add_worker_options, positive_float_arg

__all__ = ["add_parser"]


def add_parser(subparsers, command=None):
    """Add ``audit`` to a ``tuna-lab`` subparsers object; returns a list of the new parser.

    ``command``: None or ``"audit"``, this module's one command (:func:`tuna_lab.cli.build_parser`
    names the command it adds).

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> a = parser.parse_args(["audit", "--pid", "7", "--interval", "0.5", "--isolate"])
    >>> a.pid, a.interval, a.isolate, a.apply
    (7, 0.5, True, False)
    """
    a = subparsers.add_parser(
        "audit", help=COMMANDS["audit"].help,
        description="A running server's placement as the kernel shows it: each thread's role, CPU mask, last "
                    "CPU, run-queue wait and migrations per second, beside its plan; then what is wrong (drift, "
                    "replaced workers, overlapping pools, foreign load, IRQs, throttling), each with its "
                    "evidence and what to do. Without --pid: which processes are pinned where. Changes nothing "
                    "unless --isolate --apply.",
        epilog="examples:\n"
               "  tuna-lab audit --pid MASTER                        the server, its threads and the findings\n"
               "  tuna-lab audit --pid MASTER --plan plan.json --json\n"
               "  tuna-lab audit                                     machine-wide: which processes are pinned "
               "where\n"
               "  tuna-lab audit --pid MASTER --isolate              print the commands that move other load off "
               "the serving CPUs\n"
               "  tuna-lab audit --pid MASTER --isolate --apply      do it; `tuna-lab unpin --isolate` puts it "
               "back\n"
               "exit status: 0 clean, 1 findings, 2 bad input\n")
    a.add_argument("--pid", type=int, default=None, metavar="MASTER",
                   help="the server's master process (default: the machine-wide view)")
    a.add_argument("--plan", default=None, metavar="FILE",
                   help="the plan the server should follow (default: the hooks' plan, or the masks `pin` set)")
    a.add_argument("--interval", type=positive_float_arg, default=1.0, metavar="S",
                   help="seconds over which the rates (CPU, run-queue wait, migrations, IRQs) are measured")
    a.add_argument("--json", action="store_true", help="print one JSON object: the snapshot and the findings")
    a.add_argument("--isolate", action="store_true",
                   help="print the commands that move other processes' busy threads and movable IRQs off the "
                        "serving CPUs")
    a.add_argument("--apply", action="store_true", help="with --isolate: make those moves, and record them")
    add_worker_options(a)
    a.set_defaults(func=_cmd_audit)
    return [a]


def _cmd_audit(args):
    from ..._checks import format_cpulist
    from ...errors import PinError
    from ...live import audit
    from ...placement.plan import Plan, comment_text
    from ..options import worker_choice_of

    if args.apply and not args.isolate:
        raise PinError("--apply makes the moves of --isolate: give --isolate too")
    if args.pid is None and (args.plan or args.isolate or args.worker_pids or args.worker_match):
        raise PinError("--plan, --isolate, --worker-pids and --worker-match need a server: give --pid MASTER")
    if args.interval > 60:
        raise PinError(f"--interval {args.interval:g} is more than 60 s")
    if args.interval < audit.MIN_INTERVAL:
        # CPU time is counted in clock ticks: a rate over less time than a few of them is no figure.
        raise PinError(f"--interval {args.interval:g} is too short to measure: at least {audit.MIN_INTERVAL:g} s")
    if args.isolate and args.interval < audit.SOUND_INTERVAL:
        raise PinError(f"--isolate acts on rates measured over at least {audit.SOUND_INTERVAL:g} s; --interval "
                       f"{args.interval:g} is shorter")
    plan = Plan.read(args.plan) if args.plan else None
    snap = audit.snapshot(args.pid, plan, args.interval, worker_choice_of(args))
    found = audit.findings(snap)
    moves = audit.isolation_moves(snap, found) if args.isolate else []
    failed = audit.apply_isolation(moves) if args.apply and moves else []
    faults = [f for f in found if f.severity == "fault"]
    if args.json:
        print(json.dumps({"snapshot": snap.to_dict(), "findings": [f.to_dict() for f in found],
                          "isolate": [m.command() for m in moves], "applied": bool(args.apply),
                          "failed": failed}))
    else:
        print(_describe(snap, format_cpulist))
        print()
        if not found:
            print("no findings")
        for f in found:
            print(f"{f.severity}: {f.kind}: {f.what}\n  -> {f.advice}")
        if args.isolate:
            print()
            if not moves:
                print("nothing to isolate")
            for m in moves:
                # why names a thread's comm, which its owner sets to anything (a newline too): one comment line
                print(("applied: " if args.apply else "") + m.command() + f"   # {comment_text(m.why)}")
            if args.apply and moves:
                print("recorded: `tuna-lab unpin --isolate` puts back what was changed")
    # irqbalance undoes IRQ moves: said whether or not --apply made any (a later apply would be undone too).
    for line in failed + (audit.isolation_warnings(snap.serving) if args.isolate else []):
        print(f"tuna-lab: warning: {line}", file=sys.stderr)
    return 1 if faults else 0


def _rate(value, fmt):
    return "-" if value is None else format(value, fmt)


def _describe(snap, cpulist):
    """The one screen of a snapshot: the server's threads, or the machine's pinned processes."""
    if snap.master is None:
        lines = [f"machine: CPUs {cpulist(snap.online)} online" + (f", {cpulist(snap.isolated)} isolated"
                                                                   if snap.isolated else "")]
        if not snap.pinned:
            lines.append("  no user process is pinned: every thread may run on every CPU")
        for p in snap.pinned:
            masks = "  ".join(f"{m} ({len(t)} thread{'s' if len(t) > 1 else ''})" for m, t in p["masks"].items())
            lines.append(f"  pid {p['pid']:<8} {p['cpu_rate']:5.2f} CPUs  {masks}  {p['command'][:60]}")
        return "\n".join(lines)
    plan = f"; plan: {snap.plan_source}" if snap.plan_source else "; no plan known (--plan FILE)"
    lines = [f"server {snap.master}: serving CPUs {cpulist(snap.serving)}{plan}; rates over {snap.interval:g} s"
             + ("" if snap.migrations_note is None else f" (migrations: {snap.migrations_note})"),
             f"  {'process':<10}{'pid':>8} {'tid':>8} {'role':<7}{'mask':<9}{'plan':<9}{'last':>4} "
             f"{'cpu':>6} {'wait/s':>7} {'migr/s':>7}  name"]
    for t in snap.threads:
        lines.append(f"  {t['process']:<10}{t['pid']:>8} {t['tid']:>8} {t['role']:<7}{cpulist(t['cpus']):<9}"
                     f"{cpulist(t['planned']) if t['planned'] is not None else '-':<9}{t['last_cpu']:>4} "
                     f"{_rate(t['cpu_rate'], '6.2f')} {_rate(t['run_delay_rate'], '7.3f')} "
                     f"{_rate(t['migration_rate'], '7.1f')}  {t['comm']}")
    return "\n".join(lines)
