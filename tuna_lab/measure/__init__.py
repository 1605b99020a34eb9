"""Measurement, in four rooms: the load generator, the runner, sweeps and tune.

- :mod:`~tuna_lab.measure.loadgen`: what is sent and how (requests, the wire,
  the clock, schedules, closed and open loops);
- the runner, here: :mod:`~tuna_lab.measure.target` is what is measured (the
  lab server, a user's app started by tuna_lab, or a server already running),
  :mod:`~tuna_lab.measure.experiment` runs one cell's trials against it
  (:mod:`~tuna_lab.measure.trials` one trial), :mod:`~tuna_lab.measure.cpu`
  accounts each thread's CPU time, :mod:`~tuna_lab.measure.cpulock` keeps two
  measurements off the same CPUs, :mod:`~tuna_lab.measure.store` writes the
  records and reads them back and :mod:`~tuna_lab.measure.schema` says what
  they are (file and column names, cell names, percentiles);
- :mod:`~tuna_lab.measure.sweeps`: a grid of cells, the article's design cut to
  a budget, and a sweep on the machines of a Dask cluster;
- :mod:`~tuna_lab.measure.tune`: W x T raced to a p99 target.
"""

import lazy_loader as _lazy

__all__ = ["Config", "Result", "run", "LoadSpec", "TrialSpec", "sweep", "grid", "article_design", "load_results",
           "load_thread_cpu", "cell_key", "payload", "closed_loop", "open_loop", "summary"]

__getattr__, __dir__, _ = _lazy.attach(
    __name__, submodules=["loadgen", "sweeps", "tune", "cpu", "experiment", "store", "schema", "target", "trial_spec"],
    submod_attrs={
        "experiment": ["Config", "Result", "run", "grid"],
        # run's load and trial settings (measure/trial_spec.py, light: no pandas).
        "trial_spec": ["LoadSpec", "TrialSpec"],
        "sweeps": ["sweep", "article_design"],
        "store": ["load_results", "load_thread_cpu"],
        "loadgen": ["payload", "closed_loop", "open_loop", "summary"],
        # The light module: naming a cell loads no pandas.
        "schema": ["cell_key"],
    })
