"""Sweeps: a grid of cells, each run and written as soon as it is done, here or on a Dask cluster.

A re-run skips the cells already finished (:func:`~tuna_lab.measure.store.is_finished`).
This module sits above both runners - :func:`tuna_lab.measure.experiment.run`
(one cell, here) and :func:`tuna_lab.measure.cluster.sweep_on` (cells on a
cluster's machines) - so that neither imports the other's caller.

Examples
--------
>>> from tuna_lab.measure.sweeps import sweep
>>> from tuna_lab.measure.experiment import Config
>>> sweep([Config(1, 2, "small", 10)], ["cfs"], "results/sweep", trials=1, requests=50)   # doctest: +SKIP
'results/sweep'
"""

import os
import time

from ..errors import ExperimentError
from ..machine.reserve import reserve_client_cpus
from .experiment import check_policies, check_resources, run
from .store import check_out, finished_keys, lock_folder
from .target import LabTarget

__all__ = ["sweep"]


def sweep(configs, policies, out, trials=5, requests=1000, progress=None, client=None, per_machine=False,
          any_machine=False, worker_wait=60, target=None, **run_options):
    """Run every config not already finished under ``out``; each cell is written as soon as it is done.

    Parameters
    ----------
    configs : iterable of Config
    policies : list of str
    out : str
        The sweep's folder: ``<out>/<cell>``, or ``<out>/<machine>/<cell>`` on a cluster.
    trials, requests : int
        As for :func:`~tuna_lab.measure.experiment.run`.
    progress : callable, optional
        Called with one line of text at a time.
    client : distributed.Client, optional
        Run the cells on the machines of this Dask cluster, one cell per
        machine at a time (:func:`tuna_lab.measure.cluster.sweep_on`, which
        ``per_machine``, ``any_machine`` and ``worker_wait`` are passed to).
        Default: here, one cell after the other.
    target : callable, optional
        ``target(config) -> Target``: what serves each cell, for a user's own
        app (an :class:`~tuna_lab.measure.target.AppTarget` of the config's W
        and T, whose ``label`` and ``kind`` the configs carry). Default: the
        lab server of each config. Not with ``client``: the app is on this
        machine.
    **run_options
        ``concurrency``, ``seed``, ``warmup``, ``csv``, ``client_cpus``: as for
        :func:`~tuna_lab.measure.experiment.run`. ``client_cpus`` is chosen once here, or on each machine
        of a cluster (CPU ids are per machine).

    Returns
    -------
    str
        ``out``.

    Examples
    --------
    >>> sweep([Config(1, 2, "small", 10), Config(2, 1, "small", 10)], ["cfs", "round-robin"],
    ...       "results/sweep", trials=3, requests=200)                        # doctest: +SKIP
    'results/sweep'
    >>> from tuna_lab.measure.target import AppTarget                         # doctest: +SKIP
    >>> sweep([Config(w, t, "myapp", 0, target="app") for w, t in [(1, 2), (2, 1)]], ["cfs", "tuna-scatter"],
    ...       "results/myapp", target=lambda c: AppTarget("myapp:app", c.workers, c.threads))  # doctest: +SKIP
    'results/myapp'
    >>> from dask.distributed import Client                                   # doctest: +SKIP
    >>> sweep(configs, ["cfs", "round-robin"], "results/cluster", client=Client("tcp://10.0.0.5:8786"),
    ...       per_machine=True)                                              # doctest: +SKIP
    """
    policies = check_policies(policies)
    check_out(out)
    configs = list(configs)
    if not configs:
        raise ExperimentError("the sweep has no configurations")
    if target is not None and client is not None:
        raise ExperimentError("a user's app is measured on this machine: sweep it without a cluster")
    if client is None and (per_machine or any_machine):
        raise ExperimentError("per_machine and any_machine spread a sweep over a cluster's machines: "
                              "give a Dask client too")
    # One sweep per folder: a second one would measure under this one's load and redo its cells.
    with lock_folder(out):
        if client is not None:
            # The client CPUs (a cpulist, "none" or the default) are chosen on each machine by its run().
            from ..machine.reserve import ClientCpus
            from .cluster import sweep_on

            if isinstance(run_options.get("client_cpus"), ClientCpus):
                raise ExperimentError("on a cluster, give client_cpus as a cpulist, 'none' or None: each machine "
                                      "chooses its own CPUs")

            return sweep_on(client, configs, policies, out, trials=trials, requests=requests, progress=progress,
                            per_machine=per_machine, any_machine=any_machine, worker_wait=worker_wait, **run_options)
        os.makedirs(out, exist_ok=True)
        configs = list(configs)
        # Here the client CPUs are chosen, checked against every cell and said once, before any cell runs.
        given = run_options.get("client_cpus")
        split = reserve_client_cpus(given, error=ExperimentError)
        for config in configs:
            split.check_threads(config.threads, ExperimentError)
            if target is None:
                # Every cell's limits before the first server starts, not when its turn comes.
                check_resources(LabTarget(config), requests, run_options.get("concurrency"), run_options.get("rate"))
        run_options["client_cpus"] = split
        finished = finished_keys(out)
        done = [c for c in configs if c.key in finished]
        todo = [c for c in configs if c not in done]
        if progress:
            progress(f"sweep: {len(done)} of {len(configs)} cells already finished, {len(todo)} to run")
            progress(split.describe())
        t0 = time.monotonic()
        for i, config in enumerate(todo):
            # A user's app: its cell is the target's (W, T and label), as run() names it.
            run(None if target else config, policies, trials=trials, requests=requests,
                out=os.path.join(out, config.key), progress=progress, target=target(config) if target else None,
                **run_options)
            if progress:
                per = (time.monotonic() - t0) / (i + 1)
                progress(f"sweep: cell {len(done) + i + 1}/{len(configs)} done ({config.key}); "
                         f"~{per * (len(todo) - i - 1):.0f} s left")
        return out
