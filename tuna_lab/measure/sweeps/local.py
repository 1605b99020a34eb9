"""Sweeps: a grid of cells, each run and written as soon as it is done, here or on a Dask cluster.

A re-run skips the cells already finished (:func:`~tuna_lab.measure.store.is_finished`: every policy has
its valid trials), completes the unfinished ones (only their missing trials run), and redoes whole those
whose manifest is corrupt, saying so for each.
Before its first cell a sweep writes its settings to ``<out>/sweep.json``
(:func:`sweep_settings`): a re-run with other settings is refused, naming
them, since its cells would not compare with those already there.
This module sits above both runners - :func:`tuna_lab.measure.experiment.run`
(one cell, here) and :func:`tuna_lab.measure.sweeps.cluster.sweep_on` (cells on a
cluster's machines) - so that neither imports the other's caller.

Examples
--------
>>> from tuna_lab.measure.sweeps.local import sweep
>>> from tuna_lab.measure.experiment import Config
>>> sweep([Config(1, 2, "small", 10)], ["cfs"], "results/sweep", trials=1, requests=50)   # doctest: +SKIP
'results/sweep'
"""

import os
import time
from dataclasses import dataclass

from ... import __version__
from ..._checks import positive_number
from ...errors import ExperimentError
from ...machine.reserve import reserve_client_cpus
from ..experiment import check_policies, check_resources, run
from ..claims import check_cell_name, check_claim
from ..store import SWEEP_FILE, cell_state, check_out, finished_keys, lock_folder, read_sweep_file, write_sweep_file
from ..target import LabTarget
from ..trial_spec import specs_of

__all__ = ["sweep", "sweep_settings", "ClusterSpec", "COMPARED_SETTINGS"]

#: The settings a resume must share with the sweep already in its folder; the rest of sweep.json is a record.
COMPARED_SETTINGS = ("configs", "policies", "trials", "requests", "seed", "concurrency", "wait_policies", "target")


def sweep_settings(configs, policies, trials=5, requests=1000, seed=0, concurrency=None, budget=None, cuts=(),
                   design=None):
    """What ``<out>/sweep.json`` records: the settings that make a sweep's cells comparable, and how it was cut.

    :data:`COMPARED_SETTINGS` must match for a re-run to resume a sweep;
    ``budget``, ``cuts`` (lines such as ``"requests 1000 -> 200"``),
    ``design`` (a dict, e.g. :meth:`ArticleDesign.to_dict
    <tuna_lab.measure.sweeps.article.ArticleDesign.to_dict>`) and ``version`` (tuna_lab's) are recorded only.

    Examples
    --------
    >>> from tuna_lab.measure.experiment import Config
    >>> s = sweep_settings([Config(2, 1, "small", 10)], ["cfs"], trials=3, requests=100)
    >>> s["configs"], s["wait_policies"], s["target"]
    (['w2-t1-small-b10'], ['default'], 'lab')
    """
    configs = list(configs)
    waits = sorted({c.wait_policy if c.spincount is None else f"{c.wait_policy}-spin{c.spincount}" for c in configs})
    targets = sorted({c.target if c.target == "lab" else f"{c.target}:{c.model}" for c in configs})
    return {"configs": sorted(c.key for c in configs), "policies": list(policies), "trials": trials,
            "requests": requests, "seed": seed, "concurrency": concurrency, "wait_policies": waits,
            "target": ",".join(targets), "budget": budget, "cuts": [str(c) for c in cuts], "design": design,
            "version": __version__}


def _differences(old, new):
    """The compared settings on which ``old`` (the folder's) and ``new`` (this run's) differ, in words."""
    out = []
    for key in COMPARED_SETTINGS:
        a, b = old.get(key), new.get(key)
        if a == b:
            continue
        if key == "configs" and isinstance(a, list) and isinstance(b, list):
            gone, added = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            parts = ([f"{len(gone)} not given now (e.g. {gone[0]})"] if gone else []) + \
                    ([f"{len(added)} new (e.g. {added[0]})"] if added else [])
            out.append(f"configs: {', '.join(parts)}")
        else:
            out.append(f"{key} {a} there, {b} now")
    return out


def _check_identity(out, settings):
    """Refuse (:class:`ExperimentError`) a resume whose compared settings differ from ``out``'s sweep.json."""
    old = read_sweep_file(out)
    if old is None:
        return
    if old.get("kind", "sweep") != "sweep":
        raise ExperimentError(f"{out} holds a {old.get('kind')} ({SWEEP_FILE}), not a sweep: give another folder")
    diff = _differences(old, settings)
    if diff:
        raise ExperimentError(f"{out} holds a sweep with other settings ({'; '.join(diff)}): resume it with its "
                              "own settings (sweep.json) or give another folder")


@dataclass(frozen=True)
class ClusterSpec:
    """Where a sweep's cells run when not here: a Dask cluster's client and how cells go to its machines.

    Parameters
    ----------
    client : distributed.Client
        A client of a scheduler whose workers offer ``machine=1``
        (:data:`~tuna_lab.measure.sweeps.cluster.WORKER_COMMAND`).
    per_machine, any_machine : bool
        Every cell on every machine; any machine, not only the first one's shape.
    worker_wait : float
        Seconds to wait for a first machine, and for one to run the cells left.

    Examples
    --------
    >>> ClusterSpec(client=None, per_machine=True).worker_wait
    60
    """

    client: object
    per_machine: bool = False
    any_machine: bool = False
    worker_wait: float = 60


# What sweep() took before ClusterSpec and ArticleDesign carried them: refused at once, not by run() mid-sweep.
_MOVED = {"client": "cluster=ClusterSpec(client, ...)", "per_machine": "cluster=ClusterSpec(client, per_machine=True)",
          "any_machine": "cluster=ClusterSpec(client, any_machine=True)",
          "worker_wait": "cluster=ClusterSpec(client, worker_wait=...)", "cuts": "design=ArticleDesign(...)"}


def sweep(configs, policies, out, trials=5, requests=1000, progress=None, cluster=None, target=None, budget=None,
          design=None, estimate=None, **run_options):
    """Run every config not already finished under ``out``; each cell is written as soon as it is done.

    Parameters
    ----------
    configs, policies : iterable of Config, list of str
        The cells and the policies each runs.
    out : str
        The sweep's folder: ``<out>/<cell>``, or ``<out>/<machine>/<cell>`` on a cluster.
    trials, requests : int
        As for :func:`~tuna_lab.measure.experiment.run`.
    progress : callable, optional
        Called with one line of text at a time.
    cluster : ClusterSpec, optional
        Run the cells on this Dask cluster (:func:`tuna_lab.measure.sweeps.cluster.sweep_on`).
    target : callable, optional
        ``target(config) -> Target`` for a user's own app; default the lab server. Not with ``cluster``.
    budget, estimate : float, callable, optional
        Seconds this call may take (not with ``cluster``); ``estimate(config) -> seconds`` of a cell.
    design : ArticleDesign, optional
        The design the configs come from (:func:`~tuna_lab.measure.sweeps.article.article_design`): it and
        how it was cut to the budget are recorded in ``sweep.json`` (:func:`sweep_settings`).
    **run_options
        ``concurrency``, ``rate``, ``duration`` (a :class:`~tuna_lab.measure.trial_spec.LoadSpec`'s),
        ``seed``, ``warmup``, ``max_error_rate``, ``client_cpus`` (a
        :class:`~tuna_lab.measure.trial_spec.TrialSpec`'s), ``csv``, ``strict``: as for
        :func:`~tuna_lab.measure.experiment.run`, which takes them in its specs.

    Returns
    -------
    str
        ``out``.

    Raises
    ------
    ExperimentError
        Bad input, or ``out`` holds a sweep whose settings differ (named); nothing is written then.

    Notes
    -----
    See docs/experiment.md: the "Sweep identity" item of its opening list, and section "Reproducing
    the article" (the budget and its estimates).

    Examples
    --------
    >>> sweep([Config(1, 2, "small", 10), Config(2, 1, "small", 10)], ["cfs", "round-robin"],
    ...       "results/sweep", trials=3, requests=200)                        # doctest: +SKIP
    'results/sweep'
    """
    moved = sorted(set(run_options) & set(_MOVED))
    if moved:
        raise ExperimentError(f"sweep() takes {moved[0]} as {_MOVED[moved[0]]}")
    policies = check_policies(policies)
    check_out(out)
    configs = list(configs)
    if not configs:
        raise ExperimentError("the sweep has no configurations")
    if cluster is not None and not isinstance(cluster, ClusterSpec):
        raise ExperimentError(f"cluster must be a ClusterSpec, got {type(cluster).__name__}")
    client = None if cluster is None else cluster.client
    if target is not None and client is not None:
        raise ExperimentError("a user's app is measured on this machine: sweep it without a cluster")
    if cluster is not None and client is None and (cluster.per_machine or cluster.any_machine):
        raise ExperimentError("per_machine and any_machine spread a sweep over a cluster's machines: "
                              "give a Dask client too")
    if budget is not None:
        budget = positive_number("budget", budget, ExperimentError)
        if client is not None:
            raise ExperimentError("a budget is kept on this machine: sweep on a cluster without one")
    cuts, design = (), _design(design)
    if design is not None:
        cuts, design = design.cuts, design.to_dict()
    settings = sweep_settings(configs, policies, trials, requests, run_options.get("seed", 0),
                              run_options.get("concurrency"), budget, cuts, design)
    # Refused before the lock file or anything else is written, and again once the folder is held.
    _check_identity(out, settings)
    # Nor inside another sweep, tune or cell; and every cell's name fits the file system, before any runs.
    check_claim(out, "sweep", {"cells": [c.key for c in configs]})
    for config in configs:
        check_cell_name(os.path.join(out, config.key))
    # One sweep per folder: a second one would measure under this one's load and redo its cells.
    with lock_folder(out):
        _check_identity(out, settings)
        if client is not None:
            # The client CPUs (a cpulist, "none" or the default) are chosen on each machine by its run().
            from ...machine.reserve import ClientCpus
            from .cluster import sweep_on

            if isinstance(run_options.get("client_cpus"), ClientCpus):
                raise ExperimentError("on a cluster, give client_cpus as a cpulist, 'none' or None: each machine "
                                      "chooses its own CPUs")
            write_sweep_file(out, settings)
            return sweep_on(client, configs, policies, out, trials=trials, requests=requests, progress=progress,
                            per_machine=cluster.per_machine, any_machine=cluster.any_machine,
                            worker_wait=cluster.worker_wait, **run_options)
        os.makedirs(out, exist_ok=True)
        # Here the client CPUs are chosen, checked against every cell and said once, before any cell runs.
        given = run_options.get("client_cpus")
        split = reserve_client_cpus(given, error=ExperimentError)
        for config in configs:
            split.check_threads(config.threads, ExperimentError)
            if target is None:
                # Every cell's limits before the first server starts, not when its turn comes.
                check_resources(LabTarget(config), requests, run_options.get("concurrency"), run_options.get("rate"))
        run_options["client_cpus"] = split
        load, trial, rest = specs_of(requests, run_options)
        write_sweep_file(out, settings)
        finished = finished_keys(out)
        done = [c for c in configs if c.key in finished]
        todo = [c for c in configs if c not in done]
        if progress:
            progress(f"sweep: {len(done)} of {len(configs)} cells already finished, {len(todo)} to run")
            for config in todo:
                # A cell that is there but not finished: say why, before it is completed or redone.
                state = cell_state(os.path.join(out, config.key))
                if state.status == "incomplete":
                    progress(f"sweep: {config.key} is not finished ({state.reason}): its missing trials run")
                elif state.status == "corrupt":
                    progress(f"sweep: {config.key} is redone whole: {state.reason}")
            progress(split.describe())
            if budget is not None or cuts:
                # Every cut on one line, as the design says it: what this sweep is not.
                line = (design or {}).get("summary") or "; ".join(
                    ([f"budget {budget:.0f} s"] if budget is not None else []) + [str(c) for c in cuts])
                progress(f"sweep: {line}")
        if budget is not None and estimate is None:
            from .article import estimate_cell

            def estimate(config):
                return estimate_cell(config, policies, trials, requests, split.server.n_logical)
        t0 = time.monotonic()
        spent = estimated = 0.0
        skipped = []
        for i, config in enumerate(todo):
            if budget is not None:
                # The estimates, rescaled by what this machine's cells really took so far.
                guess = estimate(config) * (spent / estimated if estimated else 1.0)
                if time.monotonic() - t0 + guess > budget:
                    skipped.append(config)
                    continue
            started = time.monotonic()
            # A user's app: its cell is the target's (W, T and label), as run() names it.
            run(None if target else config, policies, trials=trials, load=load, trial=trial,
                out=os.path.join(out, config.key), progress=progress, target=target(config) if target else None,
                **rest)
            if budget is not None:
                spent += time.monotonic() - started
                estimated += estimate(config)
            if progress:
                per = (time.monotonic() - t0) / (i + 1 - len(skipped))
                progress(f"sweep: cell {len(done) + i + 1 - len(skipped)}/{len(configs)} done ({config.key}); "
                         f"~{per * (len(todo) - i - 1):.0f} s left")
        if skipped and progress:
            progress(f"sweep: budget {budget:.0f} s: {len(skipped)} cells not run "
                     f"({', '.join(c.key for c in skipped)}); run the same command again to resume with them")
        return out


def _design(design):
    """``design`` checked: None or an :class:`~tuna_lab.measure.sweeps.article.ArticleDesign`."""
    from .article import ArticleDesign

    if design is not None and not isinstance(design, ArticleDesign):
        raise ExperimentError(f"design must be an ArticleDesign (article_design()), got {type(design).__name__}")
    return design
