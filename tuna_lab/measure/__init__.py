"""Measurement: load generation, per-thread CPU accounting, and the experiment runner.

:mod:`~tuna_lab.measure.load` drives a server with closed- or open-loop load,
:mod:`~tuna_lab.measure.cpu` accounts each thread's CPU time, and
:mod:`~tuna_lab.measure.experiment` runs trials and sweeps and writes the
per-request records to disk.
"""

import lazy_loader as _lazy

__all__ = ["Config", "Result", "run", "sweep", "grid", "load_results", "load_thread_cpu", "cell_key",
           "payload", "closed_loop", "open_loop", "summary"]

__getattr__, __dir__, _ = _lazy.attach(__name__, submodules=["load", "cpu", "experiment"], submod_attrs={
    "experiment": ["Config", "Result", "run", "sweep", "grid", "load_results", "load_thread_cpu", "cell_key"],
    "load": ["payload", "closed_loop", "open_loop", "summary"],
})
