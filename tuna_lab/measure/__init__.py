"""Measurement: load generation, per-thread CPU accounting, and the experiment runner.

:mod:`~tuna_lab.measure.load` drives a server with closed- or open-loop load,
:mod:`~tuna_lab.measure.cpu` accounts each thread's CPU time,
:mod:`~tuna_lab.measure.target` is what is measured (the lab server, a
user's app started by tuna_lab, or a server already running),
:mod:`~tuna_lab.measure.experiment` runs one cell's trials against a target,
:mod:`~tuna_lab.measure.store` writes the per-request records to disk and
reads them back, :mod:`~tuna_lab.measure.sweeps` runs a grid of cells
(:mod:`~tuna_lab.measure.article`: the article's design, cut to a budget) and
:mod:`~tuna_lab.measure.cluster` a sweep's cells on the machines of a Dask
cluster, :mod:`~tuna_lab.measure.tune` races configurations to a p99 target, and :mod:`~tuna_lab.measure.schema`
defines what those records are: file and column names, cell names, latency
percentiles.
"""

import lazy_loader as _lazy

__all__ = ["Config", "Result", "run", "sweep", "grid", "article_design", "load_results", "load_thread_cpu", "cell_key",
           "payload", "closed_loop", "open_loop", "summary"]

__getattr__, __dir__, _ = _lazy.attach(
    __name__, submodules=["load", "cpu", "experiment", "sweeps", "store", "cluster", "schema", "target", "article"],
    submod_attrs={
        "experiment": ["Config", "Result", "run", "grid"],
        "sweeps": ["sweep"],
        "article": ["article_design"],
        "store": ["load_results", "load_thread_cpu"],
        "load": ["payload", "closed_loop", "open_loop", "summary"],
        # The light module: naming a cell loads no pandas.
        "schema": ["cell_key"],
    })
