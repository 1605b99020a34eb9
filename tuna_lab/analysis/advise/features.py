"""The advisor's training table: one row per (configuration, pinning policy), features and target.

A *configuration* is ``(workers, threads, model, batch, wait_policy,
spincount)`` measured on one machine. Its **features** are known before
pinning: ``W``, ``T``, ``W*T/cpus``, the model's size (input features,
trees), batch, OpenMP wait policy and spin count, the machine's shape (cpus,
physical cores, SMT ways, L3 domains, NUMA nodes), the median stage times of
its requests under ``cfs`` and, when the results have them, the ``cfs``
trials' CPU and NUMA-locality columns and the anatomy of the ``cfs``
requests' latency (:data:`ANATOMY_COLUMNS`), and the policy (one-hot). Its
**target** is the policy's p99 speedup over ``cfs``, as
:func:`tuna_lab.analysis.speedups` computes it.

Results from several machines (a ``machine`` column: a sweep on a cluster)
give one row per (machine, configuration, policy): each row's topology
features are those of its own machine, its cfs measurements are its
machine's, and its speedup is over cfs on that machine.

Examples
--------
>>> import pandas as pd
>>> trials = pd.DataFrame({"policy": ["cfs", "round-robin"], "workers": 2, "threads": 1, "cpus": 2,
...     "model": "small", "batch": 100, "trial": 0, "p99": [0.3, 0.2]})
>>> table = feature_table(pd.DataFrame(), trials)
>>> round(float(table["speedup"].iloc[0]), 3), "policy_round-robin" in feature_columns(table)
(1.5, True)
"""

import numpy as np
import pandas as pd

from ...errors import AdviseError, AnalysisError
from ...measure import cell_key
from ...server.models import MODEL_FEATURES, STAGES, model_trees
from ...server.openmp import WAIT_POLICIES
from ..anatomy import MEDIAN, PARTS, TAIL, anatomy
from ..stats import MACHINE, scenario_stats, speedup_summary, speedups
from ..tables import APPLICATION, WAIT_FACTORS, with_defaults

__all__ = ["feature_table", "feature_columns", "model_size", "topology_shape", "CONFIGURATION", "ID_COLUMNS",
           "TOPOLOGY_COLUMNS", "STAGE_COLUMNS", "ANATOMY_COLUMNS", "has_anatomy"]

#: The columns that make one configuration (the parts of its cell key): never split between train and test.
CONFIGURATION = ("workers", "threads", "model", "batch") + WAIT_FACTORS
#: The identification columns of a training row.
ID_COLUMNS = ("cell", "policy", "workers", "threads", "cpus", "model", "batch") + WAIT_FACTORS
#: The machine's shape, as features (``cpus`` is an identification column too).
TOPOLOGY_COLUMNS = ("cpus", "physical_cores", "smt_ways", "l3_domains", "numa_nodes")
#: The request times whose cfs medians are features (``cfs_<name>_ms``).
STAGE_COLUMNS = tuple(STAGES) + ("server_seconds",)
# The groups of requests the anatomy splits, by their short names in a feature's name.
_ANATOMY_GROUPS = {"tail": TAIL, "median": MEDIAN}
#: The tail's shares as features: ``cfs_<group>_<part>``, the share of the ``cfs`` requests' latency
#: (slowest 1%: ``tail``; median requests: ``median``) spent waiting for a CPU, running, in the backlog and
#: the rest (:func:`tuna_lab.analysis.anatomy.anatomy`). Present only where the requests carry the
#: per-request scheduler evidence (results since issue 50).
ANATOMY_COLUMNS = tuple(f"cfs_{g}_{p}" for g in _ANATOMY_GROUPS for p in PARTS)

# The target, what it is computed from, and its interval over the trials (never a feature: they are measured
# after pinning).
_TARGET = ("cfs_p99", "policy_p99", "speedup", "speedup_low", "speedup_high")
# Columns of a training row that are not features: names and the target.
_NOT_FEATURES = ("cell", MACHINE, "policy", "model", "wait_policy") + _TARGET
# Trial columns a newer runner writes (CPU cost per request, idle spinning, NUMA locality); their cfs
# medians are features when the results have them.
_OPTIONAL_TRIAL = ("cpu_per_request", "cpu_main_per_request", "cpu_openmp_per_request", "idle_cpu_share_main",
                   "idle_cpu_share_openmp", "numa_locality")
_REQUIRED_TRIAL = ("policy", "workers", "threads", "cpus", "model", "batch", "trial", "p99")


def feature_table(requests, trials, manifests=None):
    """One row per (configuration, pinning policy): the features and the measured speedup over cfs.

    Parameters
    ----------
    requests : pandas.DataFrame
        One row per request (``measure.load_results``' first table); may be empty.
    trials : pandas.DataFrame
        One row per (cell, policy, trial): ``policy, workers, threads, cpus, model, batch, trial, p99``.
    manifests : list of dict, optional
        The cells' manifests; their ``"topology"`` gives each machine's shape.

    Returns
    -------
    pandas.DataFrame
        Identification columns, the feature columns (see :class:`~tuna_lab.analysis.advise.Advisor`),
        ``cfs_p99``, ``policy_p99``, ``speedup``, ``speedup_low`` and ``speedup_high``.

    Raises
    ------
    AdviseError
        If a column is missing, or no trial ran under ``cfs`` and another policy.

    Notes
    -----
    See docs/measure-your-server.md, section "The advisor's table".

    Examples
    --------
    >>> import pandas as pd
    >>> trials = pd.DataFrame({"policy": ["cfs", "tuna-scatter"] * 2, "workers": 2, "threads": 2,
    ...     "cpus": 2, "model": "small", "batch": 100, "trial": [0, 0, 1, 1],
    ...     "p99": [0.2, 0.1, 0.2, 0.1]})
    >>> feature_table(pd.DataFrame(), trials)[["policy", "oversubscription", "speedup"]].to_dict("records")
    [{'policy': 'tuna-scatter', 'oversubscription': 2.0, 'speedup': 2.0}]
    """
    trials = _normalise_trials(trials)
    if not trials["policy"].eq("cfs").any():
        raise AdviseError("the results have no cfs runs: speedups are measured against cfs, so sweep with "
                          "cfs among the policies (e.g. --policies cfs,round-robin,tuna-scatter)")
    if trials["policy"].eq("cfs").all():
        raise AdviseError("the results have only cfs runs: sweep with at least one pinning policy too "
                          "(e.g. --policies cfs,round-robin,tuna-scatter)")
    target = _speedups(trials)
    app = _machine(trials) + list(APPLICATION)
    cells = trials.drop_duplicates(app)[app + ["cell"]]
    table = target.merge(cells, on=app, how="left", validate="many_to_one")
    table["oversubscription"] = table["workers"] * table["threads"] / table["cpus"]
    table["model_features"] = table["model"].map(lambda m: model_size(m)[0]).astype(float)
    table["model_trees"] = table["model"].map(lambda m: model_size(m)[1]).astype(float)
    for policy in WAIT_POLICIES[1:]:
        table[f"wait_{policy}"] = table["wait_policy"].eq(policy).astype(float)
    units = _machine(trials) + ["cell"]
    table = table.merge(_topology_features(trials, manifests), on=units, how="left")
    table = table.merge(_cfs_measurements(requests, trials), on=units, how="left")
    shares = _cfs_anatomy(requests, trials)
    if shares is not None:
        table = table.merge(shares, on=units, how="left")
    for policy in sorted(table["policy"].unique()):
        table[f"policy_{policy}"] = table["policy"].eq(policy).astype(float)
    ids, values = ["cell", *_machine(trials), *ID_COLUMNS[1:]], list(_TARGET)
    features = [c for c in table.columns if c not in ids + values]
    order = _machine(trials) + ["model", "batch", "wait_policy", "spincount", "workers", "threads", "policy"]
    return table[ids + features + values].sort_values(order, kind="stable").reset_index(drop=True)


def feature_columns(table):
    """The feature columns of a :func:`feature_table`, in its order.

    Every column but the names (``cell``, ``policy``, ``model``,
    ``wait_policy``) and the target with what it is computed from
    (``cfs_p99``, ``policy_p99``, ``speedup``, ``speedup_low``,
    ``speedup_high``); the numeric identification
    columns (``workers``, ``threads``, ``cpus``, ``batch``, ``spincount``)
    are features too.

    Examples
    --------
    >>> import pandas as pd
    >>> feature_columns(pd.DataFrame(columns=["cell", "policy", "workers", "oversubscription", "speedup"]))
    ['workers', 'oversubscription']
    """
    return [c for c in table.columns if c not in _NOT_FEATURES]


def _machine(frame):
    """``["machine"]`` when ``frame`` has the results of several machines (a cluster sweep), else ``[]``."""
    return [MACHINE] if MACHINE in frame.columns else []


def _normalise_trials(trials):
    if not isinstance(trials, pd.DataFrame):
        raise AdviseError(f"trials must be a pandas DataFrame, not {type(trials).__name__}")
    missing = [c for c in _REQUIRED_TRIAL if c not in trials.columns]
    if trials.empty or missing:
        raise AdviseError("the trials table is empty" if trials.empty else
                          f"the trials table is missing column(s): {', '.join(missing)}")
    # Results written before wait policies existed ran with the runtime's defaults.
    trials = with_defaults(trials)
    return trials if "cell" in trials.columns else _with_cell(trials)


def _with_cell(frame):
    """``frame`` with the ``cell`` key the runner would have written (frames built by hand lack it)."""
    keys = with_defaults(frame)[list(CONFIGURATION)]
    return frame.assign(cell=[cell_key(*row) for row in keys.itertuples(index=False)])


def _speedups(trials):
    """The target, from :func:`~tuna_lab.analysis.speedups`, one wait policy and spin count at a time.

    ``analysis`` keys applications by wait policy and spin count too; grouping
    here as well keeps each group's baseline check (a cfs row) explicit.
    """
    parts = []
    for (wait, spin), group in trials.groupby(list(WAIT_FACTORS), sort=True):
        if not group["policy"].eq("cfs").any():
            continue
        scenarios = scenario_stats(group)
        table = speedups(scenarios, baseline="cfs")
        # Each application's own interval: a summary grouped by every application key has one application
        # per group, whose interval is compare_policies' (the one `run` and the report show).
        app = [c for c in table.columns if c in _machine(group) + list(APPLICATION)]
        spread = speedup_summary(scenarios, baselines="cfs", by=[tuple(app)])
        spread = spread[app + ["policy", "ci_low", "ci_high"]].rename(
            columns={"ci_low": "speedup_low", "ci_high": "speedup_high"})
        spread[app] = spread[app].astype(table[app].dtypes.to_dict())
        table = table.merge(spread, on=app + ["policy"], how="left", validate="one_to_one")
        parts.append(table.assign(wait_policy=wait, spincount=spin))
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if out.empty:
        raise AdviseError("no configuration ran under both cfs and a pinning policy")
    out = out.rename(columns={"baseline_p99": "cfs_p99"})
    # A configuration whose cfs (or policy) trials all failed has no speedup to learn from.
    out = out[np.isfinite(out["speedup"]) & (out["speedup"] > 0)]
    return out[_machine(trials) + list(APPLICATION) + ["policy", *_TARGET]]


def model_size(name):
    """``(input features, trees)`` of a served model, from its training recipe; NaNs for an unknown one.

    Both are fixed by the recipe (XGBoost grows one tree per class per
    round), so they are known without the trained file. The total number of
    tree nodes is not: it would need the model cached wherever the results
    are analysed, and an advisor whose features change with the state of a
    cache gives different answers on the same results. With three models it
    would order them as these two already do.

    Examples
    --------
    >>> model_size("small")[0], model_size("huge")
    (29.0, (nan, nan))
    """
    if name not in MODEL_FEATURES:
        return np.nan, np.nan
    return float(MODEL_FEATURES[name]), float(model_trees(name))


def topology_shape(topology, cpus=None):
    """``(cpus, physical_cores, smt_ways, l3_domains, numa_nodes)`` of a topology.

    Parameters
    ----------
    topology : dict, Topology, preset name or spec
        A :meth:`tuna_lab.Topology.to_dict` (as a cell's manifest stores it),
        or anything :func:`~tuna_lab.machine.topology_from` reads.
    cpus : int, optional
        The logical cores the server could use (its affinity mask), which
        may be fewer than the machine's; default all of them.

    Examples
    --------
    >>> from tuna_lab import Topology
    >>> topology_shape(Topology.synthetic("core:4 pu:2").to_dict())
    (8.0, 4.0, 2.0, 0.0, 1.0)
    """
    def count(labels):
        return float(len(set(labels))) if labels is not None else np.nan

    if not isinstance(topology, dict):
        from ...machine import topology_from

        topology = topology_from(topology).to_dict()
    caches = topology.get("caches") or {}
    n = topology.get("n_logical", len(topology.get("logical_cores", ())))
    return (float(cpus if cpus is not None else n), float(topology.get("n_physical", np.nan)),
            float(topology.get("threads_per_core", np.nan)),
            count(caches.get("L3")) if "L3" in caches else 0.0, count(topology.get("numa")))


def _topology_features(trials, manifests):
    """Per cell (per machine and cell for several machines): the shape of the machine it ran on."""
    units = _machine(trials) + ["cell"]
    by_unit = {}
    for m in manifests or ():
        if isinstance(m, dict) and isinstance(m.get("topology"), dict) and m.get("cell") is not None:
            by_unit.setdefault(tuple(m.get(k) for k in units), m["topology"])
    rows = []
    for *unit, cpus in trials.drop_duplicates(units)[units + ["cpus"]].itertuples(index=False):
        topo = by_unit.get(tuple(unit))
        # cpus is what the server could use (the affinity mask), which may be fewer than the machine's.
        shape = topology_shape(topo, cpus) if topo is not None else (float(cpus), float(cpus), 1.0, 1.0, 1.0)
        rows.append((*unit, *shape))
    return pd.DataFrame(rows, columns=[*units, *TOPOLOGY_COLUMNS]).drop(columns="cpus")


def _cfs_measurements(requests, trials):
    """Per cell (and machine): median stage times (ms) of the cfs requests, median CPU columns of the cfs trials."""
    units = _machine(trials) + ["cell"]
    cells = trials[units].drop_duplicates().reset_index(drop=True)
    out = cells.assign(**{f"cfs_{s}_ms": np.nan for s in STAGE_COLUMNS})
    if isinstance(requests, pd.DataFrame) and not requests.empty and {"policy", *STAGE_COLUMNS, *units[:-1]} <= set(
            requests.columns):
        req = requests if "cell" in requests.columns else _with_cell(requests)
        ok = req["policy"].eq("cfs")
        if "status" in req.columns:
            ok &= req["status"].between(200, 299)
        med = (req.loc[ok, [*units, *STAGE_COLUMNS]].groupby(units).median() * 1e3).add_prefix("cfs_").add_suffix(
            "_ms").reset_index()
        out = cells.merge(med, on=units, how="left")
    cfs = trials[trials["policy"].eq("cfs")]
    if "trial_status" in cfs.columns:
        cfs = cfs[cfs["trial_status"].ne("failed")]
    for column in _OPTIONAL_TRIAL:
        if column in trials.columns:
            values = pd.to_numeric(cfs[column], errors="coerce").groupby([cfs[u] for u in units]).median()
            # Missing where a cell predates the column or has no such thread (no
            # OpenMP thread when T = 1): XGBoost learns where missing values go,
            # the linear baseline fills in the training median.
            if values.notna().any():
                out[f"cfs_{column}"] = (values.reindex(pd.MultiIndex.from_frame(out[units])).to_numpy(float)
                                        if len(units) > 1 else out["cell"].map(values).astype(float))
    return out


def has_anatomy(table):
    """Whether a :func:`feature_table` has the tail's shares as features (some value of one recorded).

    Examples
    --------
    >>> import pandas as pd
    >>> has_anatomy(pd.DataFrame({"cfs_tail_cpu_wait": [float("nan")]})), has_anatomy(pd.DataFrame({"w": [1]}))
    (False, False)
    """
    columns = [c for c in ANATOMY_COLUMNS if c in table.columns]
    return bool(columns) and bool(table[columns].notna().to_numpy().any())


def _cfs_anatomy(requests, trials):
    """Per cell (and machine): the anatomy's shares of the cfs requests' latency; None where none is recorded.

    Measured under cfs, as the stage medians are: known before pinning, so
    they can stand for a configuration whatever policy is asked about. A
    policy's own shares are measured under that policy, like its p99: they
    would hand the target to the model.
    """
    if not isinstance(requests, pd.DataFrame) or "rq_wait_main" not in requests.columns \
            or "policy" not in requests.columns or not requests["rq_wait_main"].notna().any():
        return None
    units = _machine(trials) + ["cell"]
    app = _machine(trials) + list(APPLICATION)
    req = requests if "cell" in requests.columns else _with_cell(requests)
    req = with_defaults(req[req["policy"].eq("cfs")])
    if not set(app) <= set(req.columns):
        return None
    try:
        # Only the cfs trials that count (valid_trials) count here too, as for the speedup.
        table = anatomy(req.drop(columns="cell"), trials[trials["policy"].eq("cfs")])
    except AnalysisError:
        return None                      # no successful cfs request: nothing to take apart
    table = table.assign(feature="cfs_" + table["group"].map({v: k for k, v in _ANATOMY_GROUPS.items()})
                         + "_" + table["part"])
    wide = table.pivot_table(index=app, columns="feature", values="share", aggfunc="first", dropna=False)
    wide = wide.reindex(columns=list(ANATOMY_COLUMNS)).reset_index()
    cells = trials.drop_duplicates(app)[app + ["cell"]]
    wide[app] = wide[app].astype(cells[app].dtypes.to_dict())
    out = cells.merge(wide, on=app, how="left")[units + list(ANATOMY_COLUMNS)]
    return out if out[list(ANATOMY_COLUMNS)].notna().to_numpy().any() else None
