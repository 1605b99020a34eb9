"""The ``tuna-lab`` commands: one module each here (named for its command), and the table of them.

The table is this package's only content, imported by :mod:`tuna_lab.cli`
and by every command's module, so that ``tuna-lab --help`` lists every
command without importing their modules, and each help is written once.

Examples
--------
>>> COMMANDS["status"].module, COMMANDS["stop"].help
('serve', 'stop a server started with --detach')
"""

import collections

__all__ = ["COMMANDS", "Command"]

Command = collections.namedtuple("Command", "module help")
Command.__doc__ = """A ``tuna-lab`` command: the module of :mod:`tuna_lab.cli` that adds it (``module``), and its
one-line help (``help``)."""

#: Every command, in the order of `tuna-lab --help`'s list: its module and one-line help. The help is
#: written here only (each module's ``add_parser`` takes it from here), so that the list needs no module.
COMMANDS = {
    "topology": Command("topology", "show a machine's cores, caches and distances"),
    "solve": Command("solve", "solve the Tuna ILP for W workers x T threads"),
    "plan": Command("plan", "print a placement plan: JSON, OMP_PLACES, OpenMP environment, ONNX Runtime "
                            "affinities, taskset lines or a Gunicorn config snippet"),
    "pin": Command("pin", "pin every worker thread of a running pre-fork server by its master's PID"),
    "unpin": Command("pin", "give the threads `pin --pid` pinned back the CPU masks they had before, where the "
                            "mask is still the one it set"),
    "serve": Command("serve", "start the Gunicorn + XGBoost server with every thread pinned"),
    "status": Command("serve", "a running server's master, helpers and workers (with the reason for each), and "
                               "per worker thread (role, TID) its allowed CPUs"),
    "stop": Command("serve", "stop a server started with --detach"),
    "audit": Command("audit", "what a running server's placement looks like now, beside its plan, and what is "
                              "wrong with it (drift, replaced workers, overlapping pools, foreign load, IRQs, "
                              "throttling); changes nothing"),
    "run": Command("run", "measure one configuration under several policies: the lab server, your app, or a "
                          "running server"),
    "sweep": Command("sweep", "a resumable grid of configurations x policies"),
    "report": Command("report", "analyse results into a self-contained HTML report"),
    "demo": Command("run", "the Tuna mapping, then a short live pin-and-measure experiment"),
    "tune": Command("tune", "size to a latency target: the W x T x policy serving the most requests within a p99"),
    "bench": Command("bench", "benchmarks: the solver, tune against an exhaustive search, the load generator "
                              "against wrk"),
    "advise": Command("advise", "should I pin? predict each policy's p99 speedup over cfs from sweep results"),
}
