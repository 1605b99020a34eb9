"""Should I pin? Predict each policy's p99 speedup over ``cfs`` from sweep results.

After MAO (Liu et al., "Machine learning approach for NUMA optimization in
Warehouse Scale Computers"), which predicts the gain of NUMA binding from
measurements taken *before* binding with an XGBoost regressor, compared with
a linear baseline by mean absolute error and R^2. Here the question is
thread-to-core pinning of a Gunicorn + XGBoost server, and the training data
is a ``tuna-lab sweep``:

* **one row** per configuration and pinning policy, where a *configuration*
  is ``(workers, threads, model, batch, wait_policy, spincount)`` measured on
  one machine;
* **features** known before pinning: ``W``, ``T``, ``W*T/cpus``, the model's
  size (input features, trees), batch, OpenMP wait policy and spin count, the
  machine's shape (cpus, physical cores, SMT ways, L3 domains, NUMA nodes),
  the median stage times of the configuration's requests under ``cfs`` and,
  when the results have them, the ``cfs`` trials' CPU and NUMA-locality
  columns, and the policy (one-hot);
* **target** the policy's p99 speedup over ``cfs`` in the same configuration,
  as :func:`tuna_lab.analysis.speedups` computes it (the article's
  definition, the one ``tuna-lab report`` shows): the mean over trials of
  the ``cfs`` p99 divided by the mean over trials of the policy's p99;
* **two regressors** of ``log(speedup)``: a small XGBoost model (the
  advisor's) and a linear baseline (ridge least squares, numpy only).

Both regressors are evaluated on held-out *configurations*: every fold
leaves whole configurations out (all their policies), so nothing measured
in a held-out configuration is seen in training. With few configurations
each is left out once.

Examples
--------
>>> from tuna_lab.advise import train
>>> advisor = train("results/sweep")                                # doctest: +SKIP
>>> advisor.evaluation[["model", "mae", "r2"]]                      # doctest: +SKIP
>>> rec = advisor.recommend(2, 2, "medium", batch=100)              # doctest: +SKIP
>>> rec.best_policy, rec.predicted_speedup, rec.pin, rec.covered    # doctest: +SKIP
"""

import math
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..stats import _with_defaults, scenario_stats, speedups
from ...server.models import STAGES
from ...server.openmp import WAIT_POLICIES
from ...errors import AdviseError, ModelError, TunaError
from ...measure.experiment import cell_key
from ...model.instance import check_positive_int

__all__ = ["Advisor", "Recommendation", "train", "feature_table", "grouped_folds", "add_parser"]

#: Where ``tuna-lab advise`` looks for results unless given ``--results``: the
#: folder the README's ``tuna-lab sweep ... --out results/sweep`` writes.
DEFAULT_RESULTS = os.path.join("results", "sweep")

#: Fewest configurations (with cfs and another policy) to train on and still hold some out.
MIN_CONFIGURATIONS = 4

#: Up to this many configurations, each is held out once; above, grouped K-fold.
_LEAVE_ONE_OUT_UP_TO = 12
_DEFAULT_FOLDS = 10

_CONFIG = ("workers", "threads", "model", "batch", "wait_policy", "spincount")
# How the OpenMP threads wait: factors of a configuration beyond W, T, model and batch.
_FACTORS = ("wait_policy", "spincount")
_APP = ("workers", "threads", "cpus", "model", "batch")
_KEY = _APP + _FACTORS
_IDS = ("cell", "policy", "workers", "threads", "cpus", "model", "batch", "wait_policy", "spincount")
_TOPOLOGY = ("cpus", "physical_cores", "smt_ways", "l3_domains", "numa_nodes")
_STAGE_VALUES = tuple(STAGES) + ("server_seconds",)
# Trial columns a newer runner writes (CPU cost per request, idle spinning, NUMA locality); their cfs
# medians are features when the results have them.
_OPTIONAL_TRIAL = ("cpu_per_request", "cpu_main_per_request", "cpu_openmp_per_request", "idle_cpu_share_main",
                   "idle_cpu_share_openmp", "numa_locality")
_REQUIRED_TRIAL = ("policy", "workers", "threads", "cpus", "model", "batch", "trial", "p99")

# A small booster for a small table (tens of configurations x a few policies):
# shallow trees, a slow learning rate, one thread (the machine is shared).
_XGB_PARAMS = {"objective": "reg:squarederror", "max_depth": 3, "eta": 0.15, "min_child_weight": 1.0,
               "subsample": 1.0, "lambda": 1.0, "tree_method": "exact", "seed": 0}
_XGB_ROUNDS = 100


# -- the feature table ----------------------------------------------------------------------


def feature_table(requests, trials, manifests=None):
    """One row per (configuration, pinning policy): the features and the measured speedup over cfs.

    Parameters
    ----------
    requests : pandas.DataFrame
        One row per request (``experiment.load_results``' first table); the
        ``cfs`` rows with HTTP 2xx give the stage medians. May be empty: the
        stage features are then missing (NaN).
    trials : pandas.DataFrame
        One row per (cell, policy, trial), with at least ``policy, workers,
        threads, cpus, model, batch, trial, p99``; ``cell``, ``trial_status``,
        ``wait_policy`` (missing means ``"default"``), ``spincount`` (missing
        means unset, -1) and the CPU columns are used when present.
    manifests : list of dict, optional
        The cells' manifests; their ``"topology"`` gives the machine's shape.
        A cell without one is taken as ``cpus`` single-threaded cores sharing
        one L3 and one NUMA node.

    Returns
    -------
    pandas.DataFrame
        Identification columns ``cell, policy, workers, threads, cpus, model,
        batch, wait_policy, spincount``, the feature columns (see :class:`Advisor`),
        ``cfs_p99``, ``policy_p99`` and ``speedup``. Configurations without a
        successful cfs scenario are left out.

    Raises
    ------
    AdviseError
        If a column is missing, or no trial ran under ``cfs`` and another policy.

    Examples
    --------
    >>> import pandas as pd
    >>> trials = pd.DataFrame({"policy": ["cfs", "tuna-scatter"] * 2, "workers": 2, "threads": 2,
    ...     "cpus": 2, "model": "small", "batch": 100, "trial": [0, 0, 1, 1],
    ...     "p99": [0.2, 0.1, 0.2, 0.1]})
    >>> table = feature_table(pd.DataFrame(), trials)
    >>> table[["policy", "oversubscription", "speedup"]].to_dict("records")
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
    cells = trials.drop_duplicates(list(_KEY))[list(_KEY) + ["cell"]]
    table = target.merge(cells, on=list(_KEY), how="left", validate="many_to_one")
    table["oversubscription"] = table["workers"] * table["threads"] / table["cpus"]
    table["model_features"] = table["model"].map(lambda m: _model_size(m)[0]).astype(float)
    table["model_trees"] = table["model"].map(lambda m: _model_size(m)[1]).astype(float)
    for policy in WAIT_POLICIES[1:]:
        table[f"wait_{policy}"] = table["wait_policy"].eq(policy).astype(float)
    table = table.merge(_topology_features(trials, manifests), on="cell", how="left")
    table = table.merge(_cfs_measurements(requests, trials), on="cell", how="left")
    for policy in sorted(table["policy"].unique()):
        table[f"policy_{policy}"] = table["policy"].eq(policy).astype(float)
    ids, values = list(_IDS), ["cfs_p99", "policy_p99", "speedup"]
    features = [c for c in table.columns if c not in ids + values]
    order = ["model", "batch", "wait_policy", "spincount", "workers", "threads", "policy"]
    return table[ids + features + values].sort_values(order, kind="stable").reset_index(drop=True)


def _normalise_trials(trials):
    if not isinstance(trials, pd.DataFrame):
        raise AdviseError(f"trials must be a pandas DataFrame, not {type(trials).__name__}")
    missing = [c for c in _REQUIRED_TRIAL if c not in trials.columns]
    if trials.empty or missing:
        raise AdviseError("the trials table is empty" if trials.empty else
                          f"the trials table is missing column(s): {', '.join(missing)}")
    # Results written before wait policies existed ran with the runtime's defaults.
    trials = _with_defaults(trials)
    return trials if "cell" in trials.columns else _with_cell(trials)


def _with_cell(frame):
    """``frame`` with the ``cell`` key the runner would have written (frames built by hand lack it)."""
    keys = _with_defaults(frame)[["workers", "threads", "model", "batch", "wait_policy", "spincount"]]
    return frame.assign(cell=[cell_key(*row) for row in keys.itertuples(index=False)])


def _speedups(trials):
    """The target, from :mod:`tuna_lab.analysis`, one wait policy and spin count at a time.

    ``analysis`` keys applications by wait policy and spin count too; grouping
    here as well keeps each group's baseline check (a cfs row) explicit.
    """
    parts = []
    for (wait, spin), group in trials.groupby(list(_FACTORS), sort=True):
        if not group["policy"].eq("cfs").any():
            continue
        table = speedups(scenario_stats(group), baseline="cfs").assign(wait_policy=wait, spincount=spin)
        parts.append(table)
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if out.empty:
        raise AdviseError("no configuration ran under both cfs and a pinning policy")
    out = out.rename(columns={"baseline_p99": "cfs_p99"})
    # A configuration whose cfs (or policy) trials all failed has no speedup to learn from.
    out = out[np.isfinite(out["speedup"]) & (out["speedup"] > 0)]
    return out[list(_KEY) + ["policy", "cfs_p99", "policy_p99", "speedup"]]


def _model_size(name):
    """``(input features, trees)`` of a served model, from its training recipe.

    Both are fixed by the recipe (XGBoost grows one tree per class per
    round), so they are known without the trained file. The total number of
    tree nodes is not: it would need the model cached wherever the results
    are analysed, and an advisor whose features change with the state of a
    cache gives different answers on the same results. With three models it
    would order them as these two already do.
    """
    from ...server.models import MODEL_FEATURES, model_trees

    if name not in MODEL_FEATURES:
        return np.nan, np.nan
    return float(MODEL_FEATURES[name]), float(model_trees(name))


def _topology_shape(topology, cpus=None):
    """``(cpus, physical_cores, smt_ways, l3_domains, numa_nodes)`` of a topology dict (``to_dict()``)."""
    def count(labels):
        return float(len(set(labels))) if labels is not None else np.nan

    caches = topology.get("caches") or {}
    n = topology.get("n_logical", len(topology.get("logical_cores", ())))
    return (float(cpus if cpus is not None else n), float(topology.get("n_physical", np.nan)),
            float(topology.get("threads_per_core", np.nan)),
            count(caches.get("L3")) if "L3" in caches else 0.0, count(topology.get("numa")))


def _topology_features(trials, manifests):
    by_cell = {}
    for m in manifests or ():
        if isinstance(m, dict) and isinstance(m.get("topology"), dict) and m.get("cell") is not None:
            by_cell.setdefault(m["cell"], m["topology"])
    rows = []
    for cell, cpus in trials.drop_duplicates("cell")[["cell", "cpus"]].itertuples(index=False):
        topo = by_cell.get(cell)
        # cpus is what the server could use (the affinity mask), which may be fewer than the machine's.
        shape = _topology_shape(topo, cpus) if topo is not None else (float(cpus), float(cpus), 1.0, 1.0, 1.0)
        rows.append((cell, *shape))
    return pd.DataFrame(rows, columns=["cell", *_TOPOLOGY]).drop(columns="cpus")


def _cfs_measurements(requests, trials):
    """Per cell: median stage times (ms) of the cfs requests and median CPU columns of the cfs trials."""
    cells = pd.DataFrame({"cell": trials["cell"].unique()})
    out = cells.assign(**{f"cfs_{s}_ms": np.nan for s in _STAGE_VALUES})
    if isinstance(requests, pd.DataFrame) and not requests.empty and {"policy", *_STAGE_VALUES} <= set(
            requests.columns):
        req = requests if "cell" in requests.columns else _with_cell(requests)
        ok = req["policy"].eq("cfs")
        if "status" in req.columns:
            ok &= req["status"].between(200, 299)
        med = (req.loc[ok, ["cell", *_STAGE_VALUES]].groupby("cell").median() * 1e3).add_prefix("cfs_").add_suffix(
            "_ms").reset_index()
        out = cells.merge(med, on="cell", how="left")
    cfs = trials[trials["policy"].eq("cfs")]
    if "trial_status" in cfs.columns:
        cfs = cfs[cfs["trial_status"].ne("failed")]
    for column in _OPTIONAL_TRIAL:
        if column in trials.columns:
            values = pd.to_numeric(cfs[column], errors="coerce").groupby(cfs["cell"]).median()
            # Missing where a cell predates the column or has no such thread (no
            # OpenMP thread when T = 1): XGBoost learns where missing values go,
            # the linear baseline fills in the training median.
            if values.notna().any():
                out[f"cfs_{column}"] = out["cell"].map(values).astype(float)
    return out


# -- grouped cross-validation -------------------------------------------------------------------


def grouped_folds(groups, n_splits=None, seed=0):
    """Train/test index pairs that never split a group (a configuration) between the two.

    Parameters
    ----------
    groups : array-like
        One label per row; rows with equal labels always land on the same side.
    n_splits : int, optional
        Number of folds. Default: one fold per group (leave one group out) up
        to 12 groups, else 10 folds of whole groups.
    seed : int
        Shuffles the groups before they are dealt into folds.

    Returns
    -------
    list of (numpy.ndarray, numpy.ndarray)
        Row indices ``(train, test)``; every row is in exactly one ``test``.

    Raises
    ------
    AdviseError
        If there are fewer than two groups or ``n_splits`` is not in ``2..n_groups``.

    Examples
    --------
    >>> folds = grouped_folds(["a", "a", "b", "c"])
    >>> [test.tolist() for _, test in folds]
    [[0, 1], [2], [3]]
    """
    labels = pd.Series(list(groups), dtype=object)
    codes, uniques = pd.factorize(labels, sort=True)
    k = len(uniques)
    if k < 2:
        raise AdviseError(f"cross-validation needs at least 2 configurations, got {k}")
    if n_splits is None:
        n_splits = k if k <= _LEAVE_ONE_OUT_UP_TO else _DEFAULT_FOLDS
    if isinstance(n_splits, bool) or not isinstance(n_splits, (int, np.integer)) or not 2 <= n_splits <= k:
        raise AdviseError(f"n_splits must be an integer from 2 to the number of configurations ({k}), "
                          f"got {n_splits!r}")
    order = np.arange(k) if n_splits == k else np.random.default_rng(seed).permutation(k)
    fold_of_group = np.empty(k, dtype=np.int64)
    fold_of_group[order] = np.arange(k) % n_splits       # deal groups round-robin: folds differ by <= 1
    fold = fold_of_group[codes]
    rows = np.arange(len(codes))
    return [(rows[fold != f], rows[fold == f]) for f in range(n_splits)]


# -- the two regressors ------------------------------------------------------------------------
# Both learn log(speedup): a ratio's log is symmetric (1.25x faster and 1.25x
# slower are +-0.22), so neither direction dominates the squared error.
# Predictions are reported back as speedups.


class _Linear:
    """Ridge regression on standardised features, its penalty chosen by generalised cross-validation.

    A small sweep has about as many features as configurations: plain least
    squares then interpolates its training rows and extrapolates without
    bound (held-out predictions of exp(700)x), which would make a straw man
    of the baseline. Two guards keep it a fair one: a ridge penalty
    ``alpha * |coef|^2`` (intercept not penalised), ``alpha`` picked from a
    grid by generalised cross-validation on the training rows only; and each
    feature held to its training range when predicting, as the trees are by
    construction (a column that only varied by noise in training, such as a
    stage time, would otherwise turn a held-out configuration 50 standard
    deviations away into any speedup at all). Numpy only; missing values are
    filled with the training median.
    """

    ALPHAS = 10.0 ** np.arange(-3, 4.5, 0.5)

    def fit(self, X, y):
        X, y = np.asarray(X, float), np.asarray(y, float)
        self.fill = np.array([np.median(col[~np.isnan(col)]) if (~np.isnan(col)).any() else 0.0 for col in X.T])
        X = self._filled(X)
        self.mean = X.mean(0)
        scale = X.std(0)
        self.scale = np.where(scale > 0, scale, 1.0)            # a constant column contributes nothing
        Z = (X - self.mean) / self.scale
        self.low, self.high = Z.min(0), Z.max(0)
        self.intercept = y.mean()
        U, sv, Vt = np.linalg.svd(Z, full_matrices=False)
        uy = U.T @ (y - self.intercept)
        n = len(y)

        def gcv(alpha):
            # GCV = n * RSS / (n - df)^2, with df the trace of the ridge hat matrix (+1 for the intercept).
            shrink = sv**2 / (sv**2 + alpha)
            fitted = U @ (shrink * uy)
            df = shrink.sum() + 1
            return n * np.sum((y - self.intercept - fitted) ** 2) / max(n - df, 1e-9) ** 2

        self.alpha = float(min(self.ALPHAS, key=gcv))
        self.coef = Vt.T @ (sv / (sv**2 + self.alpha) * uy)
        return self

    def _filled(self, X):
        return np.where(np.isnan(X), self.fill, X)

    def predict(self, X):
        Z = (self._filled(np.asarray(X, float)) - self.mean) / self.scale
        return self.intercept + np.clip(Z, self.low, self.high) @ self.coef


class _Boosted:
    """A small XGBoost regressor (native API: no scikit-learn needed); missing values handled natively."""

    def __init__(self, nthread=1, seed=0):
        self.nthread, self.seed = nthread, seed

    def fit(self, X, y):
        import xgboost

        params = dict(_XGB_PARAMS, nthread=self.nthread, seed=self.seed)
        dtrain = xgboost.DMatrix(np.asarray(X, float), label=np.asarray(y, float), nthread=self.nthread)
        self.booster = xgboost.train(params, dtrain, num_boost_round=_XGB_ROUNDS)
        return self

    def predict(self, X):
        import xgboost

        return self.booster.predict(xgboost.DMatrix(np.asarray(X, float), nthread=self.nthread))


def _mae(y, p):
    return float(np.mean(np.abs(np.asarray(y) - np.asarray(p))))


def _r2(y, p):
    y, p = np.asarray(y, float), np.asarray(p, float)
    total = np.sum((y - y.mean()) ** 2)
    return float(1 - np.sum((y - p) ** 2) / total) if total > 0 else float("nan")


# -- the advisor -------------------------------------------------------------------------------


def train(results=DEFAULT_RESULTS, n_splits=None, seed=0, nthread=1):
    """Train an :class:`Advisor` on sweep results and evaluate it on held-out configurations.

    Parameters
    ----------
    results : str or os.PathLike or tuple, default "results/sweep"
        A results folder (a sweep, or one cell), read with
        :func:`tuna_lab.experiment.load_results`; or the frames it returns,
        ``(requests, trials)`` or ``(requests, trials, manifests)``.
    n_splits : int, optional
        Folds of the grouped cross-validation (see :func:`grouped_folds`);
        default leave-one-configuration-out up to 12 configurations, else 10.
    seed : int
        Seeds the folds and XGBoost.
    nthread : int
        XGBoost threads (the data are small: one is enough).

    Returns
    -------
    Advisor

    Raises
    ------
    AdviseError
        If the folder is missing, the results have no cfs or no pinning
        policy, or fewer than 4 configurations have both.
    tuna_lab.experiment.ExperimentError
        If a cell in the folder cannot be read.

    Examples
    --------
    >>> advisor = train("results/sweep")       # doctest: +SKIP
    >>> advisor.evaluation                     # doctest: +SKIP
    """
    where = "the results"
    if isinstance(results, (str, os.PathLike)):
        from ...measure.experiment import load_results

        where = os.fspath(results)
        if not os.path.isdir(where):
            raise AdviseError(f"no results folder at {where}: the advisor learns from a sweep; make one with "
                              f"`tuna-lab sweep --policies cfs,round-robin,tuna-scatter --out {where}` "
                              "(or point --results at one)")
        requests, trials, manifests = load_results(where)
    elif isinstance(results, (tuple, list)) and len(results) in (2, 3):
        requests, trials, *rest = results
        manifests = rest[0] if rest else None
    else:
        raise AdviseError("results must be a results folder or a (requests, trials[, manifests]) tuple, "
                          f"not {type(results).__name__}")
    nthread = _positive("nthread", nthread)
    table = feature_table(requests, trials, manifests)
    configs = table[list(_CONFIG)].drop_duplicates()
    if len(configs) < MIN_CONFIGURATIONS:
        raise AdviseError(f"{where} has {len(configs)} configuration(s) measured under cfs and a pinning policy; "
                          f"the advisor needs at least {MIN_CONFIGURATIONS} to train and to test on held-out "
                          "ones: sweep more W x T, models, batches or wait policies")
    return Advisor(table, n_splits=n_splits, seed=seed, nthread=nthread)


def _positive(name, value):
    try:
        return check_positive_int(name, value)
    except ModelError as exc:
        raise AdviseError(str(exc)) from None


class Advisor:
    """Predicts the p99 speedup over cfs of every pinning policy the results measured.

    Build one with :func:`train`. The constructor fits both regressors on
    every row of ``table`` after the grouped cross-validation has measured
    how each does on configurations it did not see.

    Attributes
    ----------
    table : pandas.DataFrame
        The training rows (:func:`feature_table`).
    features : list of str
        The feature columns: ``workers, threads, oversubscription``
        (``W*T/cpus``), ``model_features, model_trees``,
        ``batch``, ``wait_passive, wait_active``, ``spincount`` (-1:
        unset), ``physical_cores,
        smt_ways, l3_domains, numa_nodes`` (with ``cpus``), the cfs medians
        ``cfs_<stage>_ms`` and ``cfs_server_seconds_ms`` (and ``cfs_<cpu
        column>`` when present), ``policy_<name>``.
    policies : list of str
        The pinning policies it can predict (cfs is the baseline, 1.0).
    evaluation : pandas.DataFrame
        One row per regressor (``xgboost``, ``linear``): ``mae`` and ``r2``
        of the predicted speedup over held-out configurations, ``rows``,
        ``configurations``, ``folds`` and ``scheme``.
    predictions : pandas.DataFrame
        The held-out predictions behind ``evaluation``: the table's
        identification columns, ``speedup`` (measured), ``xgboost``,
        ``linear`` and ``fold``.
    """

    def __init__(self, table, n_splits=None, seed=0, nthread=1):
        self.table = table.reset_index(drop=True)
        self.features = [c for c in table.columns if c not in (
            "cell", "policy", "model", "wait_policy", "cfs_p99", "policy_p99", "speedup")]
        self.policies = sorted(table["policy"].unique())
        self._seed, self._nthread = seed, nthread
        X, y = self.table[self.features].to_numpy(float), np.log(self.table["speedup"].to_numpy(float))
        groups = [cell_key(*r) for r in self.table[list(_CONFIG)].itertuples(index=False)]
        folds = grouped_folds(groups, n_splits, seed)
        held = {"xgboost": np.empty(len(y)), "linear": np.empty(len(y))}
        fold_of = np.empty(len(y), dtype=np.int64)
        for f, (tr, te) in enumerate(folds):
            for name, reg in self._regressors().items():
                held[name][te] = reg.fit(X[tr], y[tr]).predict(X[te])
            fold_of[te] = f
        self.predictions = self.table[list(_IDS) + ["speedup"]].assign(
            xgboost=np.exp(held["xgboost"]), linear=np.exp(held["linear"]), fold=fold_of)
        n_configs = len(set(groups))
        scheme = ("leave one configuration out" if len(folds) == n_configs
                  else f"{len(folds)}-fold, grouped by configuration")
        self.evaluation = pd.DataFrame([
            {"model": name, "mae": _mae(self.predictions["speedup"], self.predictions[name]),
             "r2": _r2(self.predictions["speedup"], self.predictions[name]), "rows": len(y),
             "configurations": n_configs, "folds": len(folds), "scheme": scheme}
            for name in ("xgboost", "linear")])
        self._fitted = {name: reg.fit(X, y) for name, reg in self._regressors().items()}
        self._ranges = self._coverage()
        self._configs = self._configurations()

    def _regressors(self):
        return {"xgboost": _Boosted(self._nthread, self._seed), "linear": _Linear()}

    def __repr__(self):
        e = self.evaluation.set_index("model")
        return (f"<Advisor: {len(self.table)} rows, {e.loc['xgboost', 'configurations']} configurations, "
                f"policies {', '.join(self.policies)}; held-out MAE xgboost {e.loc['xgboost', 'mae']:.3f}, "
                f"linear {e.loc['linear', 'mae']:.3f}>")

    @property
    def mae(self):
        """Held-out mean absolute error of the XGBoost regressor (speedup units)."""
        return float(self.evaluation.set_index("model").loc["xgboost", "mae"])

    def importance(self):
        """The XGBoost regressor's feature importance, highest first (MAO's figure 10 does the same).

        Returns
        -------
        pandas.DataFrame
            ``feature``, ``gain`` (total gain of the splits on it) and
            ``share`` (of all gain); features never split on have 0.

        Examples
        --------
        >>> advisor.importance().head(3)        # doctest: +SKIP
        """
        score = self._fitted["xgboost"].booster.get_score(importance_type="total_gain")
        # Trained from a numpy array, the booster names feature i "f{i}".
        gain = np.array([score.get(f"f{i}", 0.0) for i in range(len(self.features))])
        out = pd.DataFrame({"feature": self.features, "gain": gain,
                            "share": gain / gain.sum() if gain.sum() > 0 else gain})
        return out.sort_values("gain", ascending=False, kind="stable").reset_index(drop=True)

    def _coverage(self):
        t = self.table
        return {
            "workers": (int(t["workers"].min()), int(t["workers"].max())),
            "threads": (int(t["threads"].min()), int(t["threads"].max())),
            "oversubscription": (float(t["oversubscription"].min()), float(t["oversubscription"].max())),
            "batch": (int(t["batch"].min()), int(t["batch"].max())),
            "models": sorted(t["model"].unique()),
            "wait_policies": sorted(t["wait_policy"].unique()),
            "spincounts": sorted(int(v) for v in t["spincount"].unique()),
            "topologies": sorted({tuple(r) for r in t[list(_TOPOLOGY)].itertuples(index=False)}),
        }

    @property
    def coverage(self):
        """What the results cover: ranges of W, T, W*T/cpus, batch; models, wait policies, spin counts, machines."""
        return dict(self._ranges)

    def recommend(self, workers, threads, model, batch=100, wait_policy="default", spincount=None, topology=None,
                  stages=None, neighbours=3):
        """Should this configuration pin, and with which policy?

        Parameters
        ----------
        workers, threads : int
        model : {"small", "medium", "large"}
        batch : int, default 100
        wait_policy : {"default", "passive", "active"}
        spincount : int, optional
            ``GOMP_SPINCOUNT``; default unset.
        topology : tuna_lab.Topology or dict or str, optional
            The machine to advise for: a Topology, its ``to_dict()``, or a
            preset name. Default: this machine, with the CPUs this process
            may use.
        stages : dict, optional
            Median stage times in seconds measured under cfs for this very
            configuration (``deserialize, convert, dmatrix, predict, shap,
            server_seconds``). Default: those of the configuration itself if
            it was measured, else of the nearest measured one (said in
            ``notes``).
        neighbours : int, default 3
            Measured configurations to show as evidence.

        Returns
        -------
        Recommendation

        Raises
        ------
        AdviseError
            For a malformed question (non-positive sizes, unknown model or
            wait policy, bad topology).

        Examples
        --------
        >>> rec = advisor.recommend(2, 2, "medium", batch=100)     # doctest: +SKIP
        >>> print(rec)                                             # doctest: +SKIP
        """
        workers, threads, batch, spin = _check_question(workers, threads, model, batch, wait_policy, spincount)
        neighbours = _positive("neighbours", neighbours)
        shape = _asked_topology(topology)
        cpus = int(shape[0])
        asked = {"workers": workers, "threads": threads, "cpus": cpus, "model": model, "batch": batch,
                 "wait_policy": wait_policy, "spincount": spin, "oversubscription": workers * threads / cpus,
                 **dict(zip(_TOPOLOGY[1:], shape[1:]))}
        configs = self._configs
        distance = _distance(configs, asked)
        order = np.argsort(distance.to_numpy(), kind="stable")
        notes = []
        measured = self._measured_features(configs, distance, order, stages, notes)
        rows = self._rows(asked, measured)
        X = rows[self.features].to_numpy(float)
        predicted = pd.DataFrame({
            "policy": ["cfs", *self.policies],
            "xgboost": [1.0, *np.exp(self._fitted["xgboost"].predict(X))],
            "linear": [1.0, *np.exp(self._fitted["linear"].predict(X))]})
        predicted = predicted.sort_values("xgboost", ascending=False, kind="stable").reset_index(drop=True)
        pinning = predicted[predicted["policy"] != "cfs"].iloc[0]
        coverage = self._outside(asked)
        evidence = self._evidence(configs, distance, order[:neighbours])
        e = self.evaluation.set_index("model")
        if e.loc["linear", "mae"] < e.loc["xgboost", "mae"]:
            notes.append(f"the linear baseline did better than XGBoost on held-out configurations (MAE "
                         f"{e.loc['linear', 'mae']:.3f} vs {e.loc['xgboost', 'mae']:.3f}): the results may be too "
                         "few or too noisy for the boosted model")
        mae = self.mae
        return Recommendation(
            workers=workers, threads=threads, model=model, batch=batch, wait_policy=wait_policy,
            spincount=None if spin < 0 else spin, cpus=cpus,
            oversubscription=asked["oversubscription"], best_policy=str(pinning["policy"]),
            predicted_speedup=float(pinning["xgboost"]), pin=bool(pinning["xgboost"] > 1 + mae),
            mae=mae, predictions=predicted, evidence=evidence, covered=not coverage, coverage=coverage,
            notes=notes)

    # -- recommend's parts --

    def _configurations(self):
        """One row per measured configuration (and machine), with its feature values and measured speedups."""
        keys = ["cell", "cpus"]     # the cell key names the configuration; cpus the machine it ran on
        measured = self.table.pivot(index=keys, columns="policy", values="speedup")
        measured.columns = [f"measured {p}" for p in measured.columns]
        first = self.table.drop_duplicates(keys).set_index(keys)
        return first.join(measured).reset_index()

    def _measured_features(self, configs, distance, order, stages, notes):
        """The cfs-measured features (stage medians, CPU columns) to predict with."""
        columns = [c for c in self.features if c.startswith("cfs_")]
        near = configs.iloc[order[0]]
        values = {c: float(near[c]) for c in columns}
        if distance.iloc[order[0]] == 0:
            notes.append(f"this configuration was measured ({near['cell']}): its cfs stage times are used and "
                         "its measured speedups are in the evidence")
        else:
            notes.append(f"cfs stage times are those of the nearest measured configuration, {near['cell']}, "
                         "while the held-out MAE is for configurations with their own: run this one under cfs "
                         "and pass stages= for a prediction as good as that")
        if stages is not None:
            if not isinstance(stages, dict):
                raise AdviseError(f"stages must be a dict of stage -> seconds, not {type(stages).__name__}")
            unknown = sorted(set(stages) - set(_STAGE_VALUES))
            if unknown:
                raise AdviseError(f"unknown stage(s) {', '.join(map(str, unknown))}; "
                                  f"choose from {', '.join(_STAGE_VALUES)}")
            for stage, seconds in stages.items():
                if f"cfs_{stage}_ms" in values:
                    values[f"cfs_{stage}_ms"] = float(seconds) * 1e3
            notes[-1] = "cfs stage times as given" + ("" if set(stages) >= set(_STAGE_VALUES) else
                                                      f"; the others from {near['cell']}")
        return values

    def _rows(self, asked, measured):
        rows = []
        for policy in self.policies:
            own = ("workers", "threads", "cpus", "batch", "spincount", "oversubscription", *_TOPOLOGY[1:])
            row = {**{k: asked[k] for k in own}, **measured}
            row["model_features"], row["model_trees"] = _model_size(asked["model"])
            for wait in WAIT_POLICIES[1:]:
                row[f"wait_{wait}"] = float(asked["wait_policy"] == wait)
            for p in self.policies:
                row[f"policy_{p}"] = float(p == policy)
            rows.append(row)
        return pd.DataFrame(rows).reindex(columns=self.features)

    def _outside(self, asked):
        """Plain statements of every way the question lies outside the training data."""
        r, out = self._ranges, []
        for key, label, fmt in (("workers", "W", "{}"), ("threads", "T", "{}"),
                                ("oversubscription", "W*T/cpus", "{:g}"), ("batch", "batch", "{}")):
            lo, hi = r[key]
            value = asked[key]
            if not lo - 1e-9 <= value <= hi + 1e-9:
                out.append(f"{label} = {fmt.format(value)} is outside the measured range "
                           f"{fmt.format(lo)}-{fmt.format(hi)}")
        if asked["model"] not in r["models"]:
            out.append(f"model {asked['model']!r} was not measured (measured: {', '.join(r['models'])})")
        if asked["wait_policy"] not in r["wait_policies"]:
            out.append(f"wait policy {asked['wait_policy']!r} was not measured "
                       f"(measured: {', '.join(r['wait_policies'])})")
        if asked["spincount"] not in r["spincounts"]:
            out.append(f"spin count {_spin_text(asked['spincount'])} was not measured "
                       f"(measured: {', '.join(map(_spin_text, r['spincounts']))})")
        shape = tuple(float(asked[k]) for k in _TOPOLOGY)
        if not any(_same_shape(shape, s) for s in r["topologies"]):
            out.append(f"the machine ({_shape_text(shape)}) was not measured "
                       f"(measured: {'; '.join(_shape_text(s) for s in r['topologies'])})")
        return out

    def _evidence(self, configs, distance, index):
        near = configs.iloc[index]
        columns = ["cell", "workers", "threads", "cpus", "model", "batch", "wait_policy", "spincount",
                   "oversubscription"]
        measured = [c for c in configs.columns if c.startswith("measured ")]
        out = near[columns + measured].assign(distance=distance.iloc[index].to_numpy())
        return out[columns + ["distance"] + measured].reset_index(drop=True)


def _spin_text(spincount):
    return "unset" if spincount < 0 else str(spincount)


def _check_question(workers, threads, model, batch, wait_policy, spincount=None):
    """``(workers, threads, batch, spincount)`` as ints (-1: unset), or :class:`AdviseError`."""
    from ...server.models import MODEL_FEATURES

    workers, threads, batch = (_positive(n, v) for n, v in
                               (("workers", workers), ("threads", threads), ("batch", batch)))
    if model not in MODEL_FEATURES:
        raise AdviseError(f"unknown model {model!r}; choose from {', '.join(MODEL_FEATURES)}")
    if wait_policy not in WAIT_POLICIES:
        raise AdviseError(f"unknown wait policy {wait_policy!r}; choose from {', '.join(WAIT_POLICIES)}")
    if spincount is None:
        return workers, threads, batch, -1
    if isinstance(spincount, bool) or not isinstance(spincount, (int, np.integer)) or spincount < 0:
        raise AdviseError(f"spincount must be a non-negative integer or None, got {spincount!r}")
    return workers, threads, batch, int(spincount)


def _asked_topology(topology):
    """``(cpus, physical_cores, smt_ways, l3_domains, numa_nodes)`` of the machine a question is about."""
    from ...machine.topology import Topology

    if topology is None:
        return _topology_shape(Topology.from_sysfs().to_dict(), len(os.sched_getaffinity(0)))
    if isinstance(topology, str):
        try:
            topology = Topology.preset(topology)
        except TunaError as exc:
            raise AdviseError(str(exc)) from None
    if isinstance(topology, Topology):
        topology = topology.to_dict()
    if not isinstance(topology, dict):
        raise AdviseError(f"topology must be a Topology, its to_dict() or a preset name, not "
                          f"{type(topology).__name__}")
    shape = _topology_shape(topology)
    if not shape[0] >= 1:
        raise AdviseError("topology has no logical cores")
    return shape


def _same_shape(a, b):
    return all((x == y) or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


def _shape_text(shape):
    cpus, cores, smt, l3, numa = (("?" if math.isnan(v) else f"{v:g}") for v in shape)
    return f"{cpus} cpus, {cores} cores x {smt}-way SMT, {l3} L3, {numa} NUMA"


def _distance(configs, asked):
    """How far each measured configuration is from the question, in plain units.

    One unit per doubling (log2) of W, T, W*T/cpus and batch, plus 2 for a
    different model, 2 for a different machine shape and 1 for a different
    wait policy or spin count: a neighbour with the same model on the same machine beats
    one a factor of two closer in W.
    """
    d = sum(np.abs(np.log2(configs[k].astype(float) / asked[k]))
            for k in ("workers", "threads", "oversubscription", "batch"))
    d = d + 2.0 * configs["model"].ne(asked["model"])
    d = d + 1.0 * configs["wait_policy"].ne(asked["wait_policy"])
    d = d + 1.0 * configs["spincount"].ne(asked["spincount"])
    shape = tuple(float(asked[k]) for k in _TOPOLOGY)
    same = [_same_shape(tuple(r), shape) for r in configs[list(_TOPOLOGY)].astype(float).itertuples(index=False)]
    d = d + 2.0 * ~np.asarray(same, bool)
    return pd.Series(np.round(np.asarray(d, float), 6), index=configs.index)


# -- the answer --------------------------------------------------------------------------------


@dataclass
class Recommendation:
    """The advice for one configuration.

    Attributes
    ----------
    workers, threads, model, batch, wait_policy, spincount, cpus
        The question (``spincount`` None: unset; ``cpus`` of the machine asked about).
    oversubscription : float
        ``W*T/cpus``.
    best_policy : str
        The pinning policy with the highest predicted speedup over cfs.
    predicted_speedup : float
        Its predicted p99 speedup over cfs (XGBoost).
    pin : bool
        Whether that speedup exceeds 1 by more than the regressor's held-out
        MAE: below that, the gain is within the model's own error.
    mae : float
        The XGBoost regressor's held-out mean absolute error.
    predictions : pandas.DataFrame
        The predicted p99 speedup over cfs of cfs itself (1.0) and of every
        pinning policy, best first: ``policy``, ``xgboost`` and ``linear``
        (the baseline).
    evidence : pandas.DataFrame
        The nearest measured configurations, their ``distance`` and
        ``measured <policy>`` speedups.
    covered : bool
        False when the question lies outside what the results cover.
    coverage : list of str
        One plain statement per way it does (empty when covered).
    notes : list of str
        Where the cfs stage times came from, and other caveats.
    """

    workers: int
    threads: int
    model: str
    batch: int
    wait_policy: str
    spincount: int | None
    cpus: int
    oversubscription: float
    best_policy: str
    predicted_speedup: float
    pin: bool
    mae: float
    predictions: pd.DataFrame
    evidence: pd.DataFrame
    covered: bool
    coverage: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def verdict(self):
        """One sentence: pin (with what, and why) or do not."""
        speedup, error = f"{self.predicted_speedup:.2f}x", f"held-out MAE {self.mae:.2f}"
        if self.pin:
            text = f"pin with {self.best_policy}: predicted p99 speedup {speedup} over cfs ({error})"
        elif self.predicted_speedup <= 1:
            text = (f"do not pin: no policy is predicted faster than cfs (best: {self.best_policy} at {speedup}; "
                    f"{error})")
        else:
            text = (f"do not pin on this evidence: the best policy, {self.best_policy} at {speedup} over cfs, is "
                    f"within the model's error ({error})")
        return text + ("" if self.covered else "; outside what the results cover, so measure before trusting it")

    def to_dict(self):
        """A JSON-able dict (what ``tuna-lab advise --json`` prints)."""
        def records(frame):
            return [{k: (None if isinstance(v, float) and math.isnan(v) else
                         v.item() if isinstance(v, np.generic) else v) for k, v in r.items()}
                    for r in frame.to_dict("records")]

        return {
            "workers": self.workers, "threads": self.threads, "model": self.model, "batch": self.batch,
            "wait_policy": self.wait_policy, "spincount": self.spincount, "cpus": self.cpus,
            "oversubscription": self.oversubscription,
            "best_policy": self.best_policy, "predicted_speedup": self.predicted_speedup, "pin": self.pin,
            "verdict": self.verdict, "mae": self.mae, "predictions": records(self.predictions),
            "evidence": records(self.evidence), "covered": self.covered, "coverage": list(self.coverage),
            "notes": list(self.notes),
        }

    def __str__(self):
        spin = "" if self.spincount is None else f" (spin count {self.spincount})"
        lines = [f"Should I pin? W={self.workers} x T={self.threads}, model {self.model}, batch {self.batch}, "
                 f"wait policy {self.wait_policy}{spin}, {self.cpus} cpus (W*T/cpus = {self.oversubscription:g})",
                 f"  {self.verdict}", "  predicted p99 speedup over cfs (xgboost / linear baseline):"]
        for r in self.predictions.itertuples(index=False):
            lines.append(f"    {r.policy:<14}{r.xgboost:6.2f}x {r.linear:6.2f}x")
        lines.append("  evidence - nearest measured configurations (measured speedup over cfs):")
        measured = [c for c in self.evidence.columns if c.startswith("measured ")]
        for r in self.evidence.to_dict("records"):
            shown = "  ".join(f"{c[len('measured '):]} {r[c]:.2f}x" for c in measured if not pd.isna(r[c]))
            lines.append(f"    {r['cell']:<26} ({r['cpus']} cpus) distance {r['distance']:.2f}  {shown}")
        if self.covered:
            lines.append("  coverage: within what the results cover")
        else:
            lines.append("  coverage: OUTSIDE what the results cover:")
            lines += [f"    - {c}" for c in self.coverage]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


# -- the command line --------------------------------------------------------------------------


def add_parser(subparsers):
    """Add ``advise`` to a ``tuna-lab`` subparsers object; returns the new parser.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="tuna-lab")
    >>> _ = add_parser(parser.add_subparsers(dest="command"))
    >>> parser.parse_args(["advise", "-w", "2", "-t", "2", "--model", "small"]).results
    'results/sweep'
    """
    a = subparsers.add_parser(
        "advise", help="should I pin? predict each policy's p99 speedup over cfs from sweep results",
        description="Train on sweep results (XGBoost and a linear baseline, evaluated on held-out "
                    "configurations) and advise one configuration: the best policy, every policy's "
                    "predicted speedup, the nearest measured configurations, and whether the question "
                    "lies outside what the results cover.")
    a.add_argument("-w", "--workers", type=int, required=True)
    a.add_argument("-t", "--threads", type=int, required=True)
    a.add_argument("--model", required=True, help="small, medium or large")
    a.add_argument("--batch", type=int, default=100)
    a.add_argument("--wait-policy", default="default", choices=WAIT_POLICIES,
                   help="OMP_WAIT_POLICY of the server (default: unset)")
    a.add_argument("--spincount", type=int, default=None, metavar="N", help="GOMP_SPINCOUNT (default: unset)")
    a.add_argument("--results", default=DEFAULT_RESULTS, metavar="DIR",
                   help=f"sweep results to learn from (default: {DEFAULT_RESULTS})")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.set_defaults(func=_cmd_advise)
    return a


def _cmd_advise(args):
    import json

    # Check the question before learning from the results: a typo should not cost a training.
    _check_question(args.workers, args.threads, args.model, args.batch, args.wait_policy, args.spincount)
    advisor = train(args.results)
    rec = advisor.recommend(args.workers, args.threads, args.model, batch=args.batch,
                            wait_policy=args.wait_policy, spincount=args.spincount)
    e = advisor.evaluation.set_index("model")
    if args.json:
        out = rec.to_dict()
        out["evaluation"] = {name: {"mae": float(row["mae"]), "r2": None if math.isnan(row["r2"]) else
                                    float(row["r2"])} for name, row in e.iterrows()}
        out["evaluation"].update(configurations=int(e.loc["xgboost", "configurations"]),
                                 rows=int(e.loc["xgboost", "rows"]), scheme=str(e.loc["xgboost", "scheme"]))
        out["results"] = os.fspath(args.results)
        print(json.dumps(out))
        return 0
    print(rec)
    print(f"  learnt from {args.results}: {e.loc['xgboost', 'rows']} rows, "
          f"{e.loc['xgboost', 'configurations']} configurations; held out ({e.loc['xgboost', 'scheme']}): "
          f"xgboost MAE {e.loc['xgboost', 'mae']:.3f} R^2 {e.loc['xgboost', 'r2']:.2f}, "
          f"linear MAE {e.loc['linear', 'mae']:.3f} R^2 {e.loc['linear', 'r2']:.2f}")
    return 0
