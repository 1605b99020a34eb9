"""The advisor: trained on sweep results, judged on held-out configurations, asked about one configuration.

:func:`train` reads the results, builds the :func:`~tuna_lab.analysis.advise.feature_table`
and calls :meth:`Advisor.fit`, which cross-validates the regressors (and the constant baseline) over
grouped folds (:func:`~tuna_lab.analysis.advise.grouped_folds`), then fits
them on every row. :meth:`Advisor.recommend` answers one question with a
:class:`~tuna_lab.analysis.advise.Recommendation`.

Where the results' requests carry the per-request scheduler evidence, the
tail's shares of the ``cfs`` requests (:data:`~tuna_lab.analysis.advise.features.ANATOMY_COLUMNS`)
are features too, and the cross-validation runs twice, with and without them,
on the same folds: :attr:`Advisor.tail_note` says in one line whether they
lowered the held-out error, against the constant baseline's.

Examples
--------
>>> # skipped: needs a sweep's results (tuna-lab sweep --out results/sweep)
>>> advisor = train("results/sweep")                                # doctest: +SKIP
>>> advisor.recommend(2, 2, "medium", batch=100).best_policy        # doctest: +SKIP
'tuna-scatter'
"""

import math
import os
from functools import cached_property

import numpy as np
import pandas as pd

from ..._checks import non_negative_int, positive_int
from ...errors import AdviseError, TopologyError
from ...machine import topology_from
from ...measure import cell_key
from ...server.models import MODEL_FEATURES
from ...server.openmp import WAIT_POLICIES
from ..stats import MACHINE
from . import DEFAULT_RESULTS
from .features import (
    ANATOMY_COLUMNS,
    CONFIGURATION,
    ID_COLUMNS,
    STAGE_COLUMNS,
    TOPOLOGY_COLUMNS,
    feature_columns,
    feature_table,
    has_anatomy,
    model_size,
    topology_shape,
)
from .folds import grouped_folds
from .recommendation import Recommendation
from .regressors import regressors

__all__ = ["Advisor", "train", "check_question", "tail_note", "MIN_CONFIGURATIONS", "NO_TAIL_FEATURES"]

#: Fewest configurations (with cfs and another policy) to train on and still hold some out.
MIN_CONFIGURATIONS = 4
#: :attr:`Advisor.tail_note` of results whose requests carry no per-request scheduler evidence.
NO_TAIL_FEATURES = ("the tail's shares are not features here: the results' requests carry no per-request "
                    "scheduler columns (the wait for a CPU and the backlog, which tuna_lab 0.1.0 records per request), so the advisor "
                    "learns from the features it had before")


def train(results=DEFAULT_RESULTS, n_splits=None, seed=0, nthread=1, skip_unreadable=False, left_out=None,
          name=None):
    """Train an :class:`Advisor` on sweep results and evaluate it on held-out configurations.

    Parameters
    ----------
    results : str or os.PathLike or tuple, default "results/sweep"
        A results folder (a sweep, or one cell), read with
        :func:`~tuna_lab.measure.store.load_results`; or the frames it returns,
        ``(requests, trials)`` or ``(requests, trials, manifests)``.
    n_splits : int, optional
        Folds of the grouped cross-validation (see :func:`grouped_folds`);
        default leave-one-configuration-out up to 12 configurations, else 10.
    seed : int
        Seeds the folds and XGBoost.
    nthread : int
        XGBoost threads (the data are small: one is enough).
    skip_unreadable, left_out : bool, dict, optional
        With a folder: learn without the cells that cannot be read, adding them to ``left_out``
        (``{cell: why}``), rather than raise (see :func:`~tuna_lab.measure.store.load_results`).
    name : str, optional
        With frames: what they were read from, for the errors (default "the results").

    Returns
    -------
    Advisor

    Raises
    ------
    AdviseError
        If the folder is missing, the results have no cfs or no pinning
        policy, or fewer than 4 configurations have both.
    tuna_lab.errors.UnreadableCellsError
        If a cell in the folder cannot be read (every such cell named), unless ``skip_unreadable``.

    Examples
    --------
    >>> # skipped: needs a sweep's results (tuna-lab sweep --out results/sweep)
    >>> advisor = train("results/sweep")       # doctest: +SKIP
    >>> advisor.evaluation                     # doctest: +SKIP
    """
    where = "the results" if name is None else os.fspath(name)
    if isinstance(results, (str, os.PathLike)):
        from ...measure import load_results

        where = os.fspath(results)
        if not os.path.isdir(where):
            raise AdviseError(f"no results folder at {where}: the advisor learns from a sweep; make one with "
                              f"`tuna-lab sweep --policies cfs,round-robin,tuna-scatter --out {where}` "
                              "(or give advise the folder of one: `tuna-lab advise DIR ...`)")
        requests, trials, manifests = load_results(where, skip_unreadable, left_out)
    elif isinstance(results, (tuple, list)) and len(results) in (2, 3):
        requests, trials, *rest = results
        manifests = rest[0] if rest else None
    else:
        raise AdviseError("results must be a results folder or a (requests, trials[, manifests]) tuple, "
                          f"not {type(results).__name__}")
    nthread = positive_int("nthread", nthread, AdviseError)
    table = feature_table(requests, trials, manifests)
    configs = table[list(CONFIGURATION)].drop_duplicates()
    if len(configs) < MIN_CONFIGURATIONS:
        raise AdviseError(f"{where} has {len(configs)} configuration(s) measured under cfs and a pinning policy; "
                          f"the advisor needs at least {MIN_CONFIGURATIONS} to train and to test on held-out "
                          "ones: sweep more W x T, models, batches or wait policies")
    return Advisor.fit(table, n_splits=n_splits, seed=seed, nthread=nthread)


def check_question(workers, threads, model, batch=None, wait_policy="default", spincount=None):
    """``(workers, threads, batch, spincount)`` of a well-formed question, as ints (spincount -1: unset).

    ``model`` is one of the lab server's models, or the label of a user's
    app (``run --app``/``sweep --app`` cells, whose requests are the user's
    own: their batch is 0). ``batch`` None means 100 for a lab model and 0
    for an app. :meth:`Advisor.recommend` checks its question with this; the
    CLI calls it before training, so that a typo does not cost a training.

    Raises
    ------
    AdviseError
        A size is not a positive integer, the model or wait policy is
        unknown, or ``spincount`` is neither None nor a non-negative integer.

    Examples
    --------
    >>> check_question(2, 2, "medium")
    (2, 2, 100, -1)
    >>> check_question(2, 1, "myapp")
    (2, 1, 0, -1)
    >>> check_question(2, 2, "huge model")
    Traceback (most recent call last):
    ...
    tuna_lab.errors.AdviseError: unknown model 'huge model'; choose from small, medium, large, or your app's label
    """
    workers, threads = (positive_int(n, v, AdviseError) for n, v in (("workers", workers), ("threads", threads)))
    if model in MODEL_FEATURES:
        batch = positive_int("batch", 100 if batch is None else batch, AdviseError)
    elif isinstance(model, str) and model and all(ch.isalnum() or ch in "_." for ch in model):
        # A user's app: its requests are its own, so its cells have no batch.
        if batch not in (None, 0):
            raise AdviseError(f"{model!r} is an app's label: its requests are its own and have no batch "
                              f"(leave out batch), got {batch!r}")
        batch = 0
    else:
        raise AdviseError(f"unknown model {model!r}; choose from {', '.join(MODEL_FEATURES)}, or your app's label")
    if wait_policy not in WAIT_POLICIES:
        raise AdviseError(f"unknown wait policy {wait_policy!r}; choose from {', '.join(WAIT_POLICIES)}")
    spin = -1 if spincount is None else non_negative_int("spincount", spincount, AdviseError)
    return workers, threads, batch, spin


def _held_out(table, features, n_splits, seed, nthread):
    """Held-out predictions of the regressors and the constant baseline over grouped folds, and their evaluation."""
    X, y = table[features].to_numpy(float), np.log(table["speedup"].to_numpy(float))
    groups = [cell_key(*r) for r in table[list(CONFIGURATION)].itertuples(index=False)]
    folds = grouped_folds(groups, n_splits, seed)
    held = {name: np.empty(len(y)) for name in regressors()}
    fold_of = np.empty(len(y), dtype=np.int64)
    for f, (tr, te) in enumerate(folds):
        for name, reg in regressors(nthread, seed).items():
            held[name][te] = reg.fit(X[tr], y[tr]).predict(X[te])
        fold_of[te] = f
    predictions = table[list(ID_COLUMNS) + ["speedup"]].assign(
        **{name: np.exp(values) for name, values in held.items()}, fold=fold_of)
    n_configs = len(set(groups))
    scheme = ("leave one configuration out" if len(folds) == n_configs
              else f"{len(folds)}-fold, grouped by configuration")
    measured = predictions["speedup"].to_numpy(float)
    spread = float(np.sum((measured - measured.mean()) ** 2))
    # R^2 is undefined when every measured speedup is the same.
    evaluation = pd.DataFrame([
        {"model": name, "mae": float(np.mean(np.abs(measured - predictions[name]))),
         "r2": 1 - float(np.sum((measured - predictions[name]) ** 2)) / spread if spread > 0 else math.nan,
         "rows": len(y), "configurations": n_configs, "folds": len(folds), "scheme": scheme}
        for name in held])
    return predictions, evaluation


def tail_note(evaluation, without=None):
    """One line: the held-out MAE with and without the tail's shares, beside the constant's, and what it means.

    Parameters
    ----------
    evaluation : pandas.DataFrame
        :attr:`Advisor.evaluation` (with the shares, where the results have them).
    without : pandas.DataFrame, optional
        The same evaluation without the shares; None: the results have none (:data:`NO_TAIL_FEATURES`).

    Examples
    --------
    >>> import pandas as pd
    >>> e = pd.DataFrame({"model": ["xgboost", "constant"], "mae": [0.81, 0.75]})
    >>> tail_note(e, e.assign(mae=[0.89, 0.75]))
    "held-out MAE (xgboost) 0.810 with the tail's shares, 0.890 without, constant 0.750: the tail's shares \
lower the error, but neither beats the constant: nothing is learnt on these data"
    """
    if without is None:
        return NO_TAIL_FEATURES
    e, w = evaluation.set_index("model")["mae"], without.set_index("model")["mae"]
    have, lack, constant = float(e["xgboost"]), float(w["xgboost"]), float(e["constant"])
    line = (f"held-out MAE (xgboost) {have:.3f} with the tail's shares, {lack:.3f} without, "
            f"constant {constant:.3f}: ")
    if not have < lack:
        return line + "the tail's shares do not help on these data"
    if not have < constant:
        return line + "the tail's shares lower the error, but neither beats the constant: nothing is learnt on " \
                      "these data"
    return line + "the tail's shares help on these data"


class Advisor:
    """Predicts the p99 speedup over cfs of every pinning policy the results measured.

    Build one with :func:`train` (from results) or :meth:`Advisor.fit` (from
    a :func:`feature_table`); the constructor only stores what they computed.

    Parameters
    ----------
    table : pandas.DataFrame
        The training rows (:func:`feature_table`).
    fitted : dict
        The regressors fitted on every row, by name (``xgboost``, ``linear``,
        ``constant``), predicting ``log(speedup)`` from the ``features`` columns.
    evaluation, predictions : pandas.DataFrame
        What the grouped cross-validation measured (see below).

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
        column>`` when present), the cfs requests' tail shares ``cfs_tail_<part>`` and
        ``cfs_median_<part>`` when the requests carry them, ``policy_<name>``.
    policies : list of str
        The pinning policies it can predict (cfs is the baseline, 1.0).
    machines : list of str
        The machines the results come from, when they are a sweep on a
        cluster (a ``machine`` column); empty for the results of one machine.
    evaluation : pandas.DataFrame
        One row per regressor (``xgboost``, ``linear``, and ``constant``: the
        training rows' geometric-mean speedup, the yardstick): ``mae`` and
        ``r2`` of the predicted speedup over held-out configurations, ``rows``,
        ``configurations``, ``folds`` and ``scheme``. All three are judged on
        the same folds.
    predictions : pandas.DataFrame
        The held-out predictions behind ``evaluation``: the table's
        identification columns, ``speedup`` (measured), ``xgboost``,
        ``linear``, ``constant`` and ``fold``.
    without_tail : pandas.DataFrame or None
        ``evaluation`` of the same regressors on the same folds without the
        tail's shares (:data:`~tuna_lab.analysis.advise.features.ANATOMY_COLUMNS`);
        None where the results have no shares, and then ``evaluation`` is without them.
    tail_note : str
        One line: the held-out MAE with and without the tail's shares beside
        the constant's, and whether they helped (:func:`tail_note`); or why
        there are none.
    """

    def __init__(self, table, fitted, evaluation, predictions, without_tail=None):
        self.table = table
        self.features = feature_columns(table)
        self.policies = sorted(table["policy"].unique())
        self.machines = sorted(table[MACHINE].unique()) if MACHINE in table.columns else []
        self.evaluation = evaluation
        self.predictions = predictions
        self.without_tail = without_tail
        self.tail_note = tail_note(evaluation, without_tail)
        self._fitted = fitted

    @classmethod
    def fit(cls, table, n_splits=None, seed=0, nthread=1):
        """Cross-validate the regressors and the constant baseline on grouped folds, then fit them on every row.

        Parameters
        ----------
        table : pandas.DataFrame
            A :func:`feature_table`.
        n_splits, seed, nthread
            As for :func:`train`.

        Returns
        -------
        Advisor

        Raises
        ------
        AdviseError
            If ``table`` has fewer than two configurations or ``n_splits`` is out of range, or
            scikit-learn is not installed (the ``advise`` extra).

        Examples
        --------
        >>> # skipped: needs a sweep's tables
        >>> advisor = Advisor.fit(feature_table(requests, trials, manifests))   # doctest: +SKIP
        """
        table = table.reset_index(drop=True)
        features = feature_columns(table)
        predictions, evaluation = _held_out(table, features, n_splits, seed, nthread)
        without = None
        if has_anatomy(table):
            # The same regressors on the same folds (same groups, same seed), less the tail's shares: the
            # difference in held-out error is theirs alone.
            without = _held_out(table, [c for c in features if c not in ANATOMY_COLUMNS], n_splits, seed,
                                nthread)[1]
        X, y = table[features].to_numpy(float), np.log(table["speedup"].to_numpy(float))
        fitted = {name: reg.fit(X, y) for name, reg in regressors(nthread, seed).items()}
        return cls(table, fitted, evaluation, predictions, without)

    def __repr__(self):
        e = self.evaluation.set_index("model")
        return (f"<Advisor: {len(self.table)} rows, {e.loc['xgboost', 'configurations']} configurations, "
                f"policies {', '.join(self.policies)}; held-out MAE xgboost {e.loc['xgboost', 'mae']:.3f}, "
                f"linear {e.loc['linear', 'mae']:.3f}, constant {e.loc['constant', 'mae']:.3f}>")

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
        >>> # skipped: needs a trained advisor
        >>> advisor.importance().head(3)        # doctest: +SKIP
        """
        score = self._fitted["xgboost"].booster.get_score(importance_type="total_gain")
        # Trained from a numpy array, the booster names feature i "f{i}".
        gain = np.array([score.get(f"f{i}", 0.0) for i in range(len(self.features))])
        out = pd.DataFrame({"feature": self.features, "gain": gain,
                            "share": gain / gain.sum() if gain.sum() > 0 else gain})
        return out.sort_values("gain", ascending=False, kind="stable").reset_index(drop=True)

    @cached_property
    def _ranges(self):
        t = self.table
        return {
            "workers": (int(t["workers"].min()), int(t["workers"].max())),
            "threads": (int(t["threads"].min()), int(t["threads"].max())),
            "oversubscription": (float(t["oversubscription"].min()), float(t["oversubscription"].max())),
            "batch": (int(t["batch"].min()), int(t["batch"].max())),
            "models": sorted(t["model"].unique()),
            "wait_policies": sorted(t["wait_policy"].unique()),
            "spincounts": sorted(int(v) for v in t["spincount"].unique()),
            "topologies": sorted({tuple(r) for r in t[list(TOPOLOGY_COLUMNS)].itertuples(index=False)}),
        }

    @property
    def coverage(self):
        """What the results cover: ranges of W, T, W*T/cpus, batch; models, wait policies, spin counts, machines."""
        return dict(self._ranges)

    @cached_property
    def _configs(self):
        """One row per measured configuration (and machine), with its feature values and measured speedups."""
        # The cell key names the configuration; the machine it ran on is named, or known by its cpus.
        keys = ["cell", MACHINE] if self.machines else ["cell", "cpus"]
        measured = self.table.pivot(index=keys, columns="policy", values="speedup")
        measured.columns = [f"measured {p}" for p in measured.columns]
        first = self.table.drop_duplicates(keys).set_index(keys)
        return first.join(measured).reset_index()

    def recommend(self, workers, threads, model, batch=None, wait_policy="default", spincount=None, topology=None,
                  stages=None, neighbours=3):
        """Should this configuration pin, and with which policy?

        Parameters
        ----------
        workers, threads : int
        model : str
            ``"small"``, ``"medium"``, ``"large"``, or the label of a user's
            app the results measured (``sweep --app``).
        batch : int, optional
            Rows per request; default 100 (a user's app: none, 0).
        wait_policy : {"default", "passive", "active"}
        spincount : int, optional
            ``GOMP_SPINCOUNT``; default unset.
        topology : tuna_lab.Topology or dict or str, optional
            The machine to advise for: a Topology, its ``to_dict()``, or
            anything :func:`tuna_lab.machine.topology_from` reads (a preset
            name, a synthetic spec, hwloc XML). Default: this machine, with
            the CPUs this process may use.
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
        >>> # skipped: needs a trained advisor
        >>> rec = advisor.recommend(2, 2, "medium", batch=100)     # doctest: +SKIP
        >>> print(rec)                                             # doctest: +SKIP
        """
        workers, threads, batch, spin = check_question(workers, threads, model, batch, wait_policy, spincount)
        if model not in MODEL_FEATURES and model not in self._ranges["models"]:
            # Nothing is known of an app that was not measured: no neighbour can stand in for it.
            raise AdviseError(f"unknown model {model!r}: not one of {', '.join(MODEL_FEATURES)}, and the results have "
                              f"no app of that label (measured: {', '.join(self._ranges['models'])})")
        neighbours = positive_int("neighbours", neighbours, AdviseError)
        shape = _asked_shape(topology)
        cpus = int(shape[0])
        asked = {"workers": workers, "threads": threads, "cpus": cpus, "model": model, "batch": batch,
                 "wait_policy": wait_policy, "spincount": spin, "oversubscription": workers * threads / cpus,
                 **dict(zip(TOPOLOGY_COLUMNS[1:], shape[1:]))}
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
            "linear": [1.0, *np.exp(self._fitted["linear"].predict(X))],
            "constant": [1.0, *np.exp(self._fitted["constant"].predict(X))]})
        predicted = predicted.sort_values("xgboost", ascending=False, kind="stable").reset_index(drop=True)
        pinning = predicted[predicted["policy"] != "cfs"].iloc[0]
        coverage = self._outside(asked)
        evidence = self._evidence(configs, distance, order[:neighbours])
        if self.machines:
            shown = list(dict.fromkeys(evidence[MACHINE]))
            notes.append(f"learnt from {len(self.machines)} machine(s): {', '.join(self.machines)}; the evidence "
                         f"below was measured on {', '.join(shown)}")
        e = self.evaluation.set_index("model")
        learnt = bool(e.loc["xgboost", "mae"] < e.loc["constant", "mae"])
        notes.append(self.tail_note)
        measured = None
        if not learnt:
            notes.append(f"XGBoost did no better than a constant (the training speedups' geometric mean) on held-out "
                         f"configurations (MAE {e.loc['xgboost', 'mae']:.3f} vs {e.loc['constant', 'mae']:.3f}): "
                         "the results show no effect of the features it could learn")
            if distance.iloc[order[0]] == 0:
                measured = self._measured_best(configs.iloc[order[0]])
        if e.loc["linear", "mae"] < e.loc["xgboost", "mae"]:
            notes.append(f"the linear baseline did better than XGBoost on held-out configurations (MAE "
                         f"{e.loc['linear', 'mae']:.3f} vs {e.loc['xgboost', 'mae']:.3f}): the results may be too "
                         "few or too noisy for the boosted model")
        mae = self.mae
        if measured is not None:
            pinning = predicted[predicted["policy"] == measured[0]].iloc[0]
        # A model no better than a constant cannot tell placements apart: its word never advises pinning.
        pin = measured is not None if not learnt else bool(pinning["xgboost"] > 1 + mae)
        return Recommendation(
            workers=workers, threads=threads, model=model, batch=batch, wait_policy=wait_policy,
            spincount=None if spin < 0 else spin, cpus=cpus,
            oversubscription=asked["oversubscription"], best_policy=str(pinning["policy"]),
            predicted_speedup=float(pinning["xgboost"]), pin=pin,
            mae=mae, predictions=predicted, evidence=evidence, covered=not coverage, coverage=coverage,
            notes=notes, learnt=learnt, measured=measured)

    # -- recommend's parts --

    def _measured_features(self, configs, distance, order, stages, notes):
        """The cfs-measured features (stage medians, CPU columns) to predict with."""
        columns = [c for c in self.features if c.startswith("cfs_")]
        near = configs.iloc[order[0]]
        values = {c: float(near[c]) for c in columns}
        where = near["cell"] + (f" on {near[MACHINE]}" if self.machines else "")
        if distance.iloc[order[0]] == 0:
            notes.append(f"this configuration was measured ({where}): its cfs stage times are used and "
                         "its measured speedups are in the evidence")
        else:
            notes.append(f"cfs stage times are those of the nearest measured configuration, {where}, "
                         "while the held-out MAE is for configurations with their own: run this one under cfs "
                         "and pass stages= for a prediction as good as that")
        if stages is not None:
            if not isinstance(stages, dict):
                raise AdviseError(f"stages must be a dict of stage -> seconds, not {type(stages).__name__}")
            unknown = sorted(set(stages) - set(STAGE_COLUMNS))
            if unknown:
                raise AdviseError(f"unknown stage(s) {', '.join(map(str, unknown))}; "
                                  f"choose from {', '.join(STAGE_COLUMNS)}")
            for stage, seconds in stages.items():
                if f"cfs_{stage}_ms" in values:
                    values[f"cfs_{stage}_ms"] = float(seconds) * 1e3
            notes[-1] = "cfs stage times as given" + ("" if set(stages) >= set(STAGE_COLUMNS) else
                                                      f"; the others from {where}")
        return values

    def _measured_best(self, config):
        """``(policy, speedup, low, high)`` of a configuration's fastest policy whose interval lies above 1, or None.

        ``config`` is one row of :attr:`_configs`; the speedups and their
        intervals over the trials are the training table's.
        """
        keys = [MACHINE, "cell"] if self.machines else ["cell", "cpus"]
        rows = self.table
        for k in keys:
            rows = rows[rows[k] == config[k]]
        faster = rows[rows["speedup_low"] > 1]
        if faster.empty:
            return None
        best = faster.sort_values(["speedup", "policy"], ascending=[False, True], kind="stable").iloc[0]
        return str(best["policy"]), float(best["speedup"]), float(best["speedup_low"]), float(best["speedup_high"])

    def _rows(self, asked, measured):
        rows = []
        for policy in self.policies:
            own = ("workers", "threads", "cpus", "batch", "spincount", "oversubscription", *TOPOLOGY_COLUMNS[1:])
            row = {**{k: asked[k] for k in own}, **measured}
            row["model_features"], row["model_trees"] = model_size(asked["model"])
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
        shape = tuple(float(asked[k]) for k in TOPOLOGY_COLUMNS)
        if not any(_same_shape(shape, s) for s in r["topologies"]):
            out.append(f"the machine ({_shape_text(shape)}) was not measured "
                       f"(measured: {'; '.join(_shape_text(s) for s in r['topologies'])})")
        return out

    def _evidence(self, configs, distance, index):
        near = configs.iloc[index]
        columns = [MACHINE] * bool(self.machines) + ["cell", "workers", "threads", "cpus", "model", "batch",
                                                     "wait_policy", "spincount", "oversubscription"]
        measured = [c for c in configs.columns if c.startswith("measured ")]
        out = near[columns + measured].assign(distance=distance.iloc[index].to_numpy())
        # -1 is the features' code for an unset GOMP_SPINCOUNT; a reader (and --json) sees "default",
        # the word every table of the lab uses for a setting left alone.
        out["spincount"] = [_spin_text(v) if v < 0 else int(v) for v in out["spincount"]]
        return out[columns + ["distance"] + measured].reset_index(drop=True)


def _spin_text(spincount):
    return "default" if spincount < 0 else str(spincount)


def _asked_shape(topology):
    """``(cpus, physical_cores, smt_ways, l3_domains, numa_nodes)`` of the machine a question is about."""
    if isinstance(topology, dict):
        shape = topology_shape(topology)
    else:
        try:
            # None is this machine, restricted to the CPUs this process may use.
            shape = topology_shape(topology_from(topology).to_dict())
        except TopologyError as exc:
            raise AdviseError(str(exc)) from None
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
            for k in ("workers", "threads", "oversubscription"))
    # An app's cells have batch 0 (the user's requests): equal batches are 0 apart, a lab batch from none 1.
    batch = configs["batch"].astype(float).to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        d = d + np.where((batch > 0) & (asked["batch"] > 0), np.abs(np.log2(batch / max(asked["batch"], 1))),
                         (batch != asked["batch"]).astype(float))
    d = d + 2.0 * configs["model"].ne(asked["model"])
    d = d + 1.0 * configs["wait_policy"].ne(asked["wait_policy"])
    d = d + 1.0 * configs["spincount"].ne(asked["spincount"])
    shape = tuple(float(asked[k]) for k in TOPOLOGY_COLUMNS)
    same = [_same_shape(tuple(r), shape)
            for r in configs[list(TOPOLOGY_COLUMNS)].astype(float).itertuples(index=False)]
    d = d + 2.0 * ~np.asarray(same, bool)
    return pd.Series(np.round(np.asarray(d, float), 6), index=configs.index)
