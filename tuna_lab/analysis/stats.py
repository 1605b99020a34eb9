"""Analysis of experiment tables: trial and scenario p99s, speedups, policy comparisons.

The experiment runner writes two tidy tables: ``requests`` (one row per
request) and ``trials`` (one row per cell, policy and trial). This module
reduces them the way the Tuna article does:

1. :func:`trial_stats` - per trial, the p99 of the server-side runtime of the
   trial's successful requests (the article's figure of merit), plus p50,
   p95, mean, client p99, throughput and the p99 of each pipeline stage;
2. :func:`scenario_stats` - per scenario (one application under one policy),
   the average of the trial p99s with its confidence interval;
3. :func:`speedups` / :func:`speedup_summary` - baseline mean p99 over policy
   mean p99 per application, averaged overall and within groups (the
   article's 1.15x over CFS and 1.13x over Round Robin are such averages);
4. :func:`compare_policies` - one ratio of mean p99s with its confidence
   interval.

Intervals. Everything here is positive (a p99, a ratio of p99s), so every
interval is taken on the log scale: ``value */ factor`` with ``factor =
exp(t * s)``, ``s`` the standard error of ``log(value)`` from the trials'
spread (the delta method) and ``t`` the Student quantile at the
Welch-Satterthwaite degrees of freedom. It never goes below zero, is as
wide in ratio above the value as below, and the interval of a speedup is
exactly the reciprocal of the interval of its p99 ratio. With fewer than
:data:`MIN_INTERVAL_TRIALS` trials there is none (NaN): two trials give a t
quantile of 12.7, an "interval" of a factor of thousands that says nothing.
:func:`format_interval` writes an interval, the one way every table, figure,
terminal line and notebook shows it, and says :data:`TOO_FEW_TRIALS` instead.

An *application* is one ``(workers, threads, cpus, model, batch)``: a server
configuration ``W x T`` on ``C`` usable logical cores serving one model with
one batch size. It is *oversubscribed* when ``W * T > C``. Times are seconds.

The results of a sweep on a cluster (:func:`~tuna_lab.measure.store.load_results`
of ``<out>/<machine>/<cell>``) have a ``machine`` column. The machine is then
a key of every table here, before the others: nothing measured on one
machine is averaged with another's, speedups compare policies on the same
machine, and ``speedup_summary(..., by=("machine",))`` compares the machines.

Examples
--------
>>> import numpy as np, pandas as pd
>>> rng = np.random.default_rng(0)
>>> requests = pd.DataFrame({
...     "policy": np.repeat(["cfs", "tuna-scatter"], 200), "trial": np.tile(np.repeat([0, 1], 100), 2),
...     "workers": 4, "threads": 4, "cpus": 32, "model": "medium", "batch": 100, "status": 200,
...     "server_seconds": np.r_[rng.uniform(0.1, 0.2, 200), rng.uniform(0.05, 0.1, 200)],
...     "client_seconds": 0.3, "sent_at": np.tile(np.arange(100.0), 4),
...     "deserialize": 0.001, "convert": 0.001, "dmatrix": 0.01, "predict": 0.02, "shap": 0.05})
>>> scenarios = scenario_stats(trial_stats(requests))
>>> summary = speedup_summary(scenarios, baselines=("cfs",), by=(None,))
>>> round(float(summary["speedup"].iloc[0]), 1)
2.0
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pandas.api.types import is_integer_dtype
# Student's t quantile: scipy.special's, not scipy.stats's t.ppf, which is the same function but loads
# all of scipy.stats (most of a second) into every `tuna-lab run` that prints a summary.
from scipy.special import stdtrit

from ..errors import AnalysisError
from ..measure.schema import PERCENTILES
from ..placement import POLICIES
from ..server.models import STAGES
from .tables import APPLICATION, check_table, ordered, sort_table, valid_trials, with_defaults

__all__ = [
    "MACHINE",
    "UNBOUNDED",
    "INTERVALS",
    "MIN_INTERVAL_TRIALS",
    "TOO_FEW_TRIALS",
    "format_interval",
    "trial_stats",
    "quantile_rank_interval",
    "scenario_stats",
    "speedups",
    "speedup_summary",
    "compare_policies",
    "cpu_cost",
]


#: The column that names the machine a row was measured on (results of a sweep on a cluster).
MACHINE = "machine"
#: How text writes a side of an interval that nothing bounds (JSON writes null).
UNBOUNDED = "inf"
#: What every interval of a p99 or a speedup is, in the words the report, README.md and notebook 06 use.
INTERVALS = ("Every interval of a p99 or a speedup is a 95% interval taken on the log scale from the trials' "
             "spread, value */ factor: it never goes below zero, a speedup's interval is the reciprocal of its "
             f"p99 ratio's, and a side that nothing bounds is written {UNBOUNDED} (null in JSON).")
#: The fewest trials (per policy) that give an interval: below, t's quantile (12.7 at 2) makes it meaningless.
MIN_INTERVAL_TRIALS = 3
#: What text writes where there is no interval (a NaN side: fewer than :data:`MIN_INTERVAL_TRIALS` trials).
TOO_FEW_TRIALS = "too few trials for an interval"

_SCENARIO = APPLICATION + ("policy",)
_TRIAL = _SCENARIO + ("trial",)
_REQUEST_VALUES = ("status", "server_seconds", "client_seconds", "sent_at") + STAGES
_DEFAULT_BY = (None, "subscription", "model", "batch", ("subscription", "model", "batch"))
# The server-time percentiles every trial reports, as quantile levels -> column names (p50, p95, p99).
_LEVELS = {p / 100: f"p{p}" for p in PERCENTILES}


# -- validation ----------------------------------------------------------------------


def _check_unique(table, name, keys):
    dup = table.duplicated(list(keys))
    if dup.any():
        first = ", ".join(f"{k}={v}" for k, v in table.loc[dup, list(keys)].iloc[0].items())
        raise AnalysisError(f"{name} has {int(dup.sum())} duplicate row(s) for one "
                            f"{'/'.join(keys)}, e.g. {first}")


def _check_confidence(confidence):
    if not (isinstance(confidence, (int, float)) and 0 < confidence < 1):
        raise AnalysisError(f"confidence must be a number strictly between 0 and 1, got {confidence!r}")


def _check_policy(table, policy, what):
    if not isinstance(policy, str):
        raise AnalysisError(f"{what} must be a policy name (str), got {policy!r}")
    if what != "baseline" and not table["policy"].eq(policy).any():
        have = ", ".join(map(str, ordered(table["policy"].unique(), POLICIES)))
        raise AnalysisError(f"{what} policy {policy!r} is not in the table (have: {have})")


# -- small vectorised helpers ----------------------------------------------------------


def _by(table, keys):
    """``keys``, led by :data:`MACHINE` when ``table`` has that column (a cluster sweep's results)."""
    keys = tuple(keys)
    return (MACHINE,) + keys if isinstance(table, pd.DataFrame) and MACHINE in table.columns else keys


def _is_ok(status):
    """Successful requests: HTTP 2xx."""
    return status.ge(200) & status.lt(300)


def _subscription(table):
    """``"over"`` where ``workers * threads > cpus``, else ``"under"``."""
    over = table["workers"].to_numpy() * table["threads"].to_numpy() > table["cpus"].to_numpy()
    return pd.Series(np.where(over, "over", "under"), index=table.index, dtype=object)


# -- intervals ------------------------------------------------------------------------------


def format_interval(low, high, digits=2):
    """An interval as text: the one way tables, figure hovers, the terminal and notebooks write it.

    Parameters
    ----------
    low, high : float or None
        The bounds. A side that nothing bounds (infinite, or None as
        :func:`quantile_rank_interval` gives it) is written :data:`UNBOUNDED`
        (``-inf`` for a lower side); JSON writes ``null`` there instead.
    digits : int, default 2
        Decimals of both sides; a side too small for them keeps two
        significant digits, so that a positive bound never reads as 0.

    Returns
    -------
    str
        ``"[low, high]"``; ``"(too few trials for an interval)"`` when it was
        not computed (a NaN side: fewer than :data:`MIN_INTERVAL_TRIALS` trials).

    Examples
    --------
    >>> format_interval(0.5243, 2.1)
    '[0.52, 2.10]'
    >>> format_interval(0.0, float("inf"), digits=1)
    '[0.0, inf]'
    >>> format_interval(0.0031, 31.69)
    '[0.0031, 31.69]'
    >>> format_interval(195, None, digits=0)
    '[195, inf]'
    >>> format_interval(float("nan"), float("nan"))
    '(too few trials for an interval)'
    """
    def side(value, unbounded):
        value = unbounded if value is None else value
        if np.isinf(value):
            return ("-" if value < 0 else "") + UNBOUNDED
        return f"{value:.2g}" if 0 < abs(value) < 0.5 * 10.0**-digits else f"{value:.{digits}f}"

    if any(v is not None and np.isnan(v) for v in (low, high)):
        return f"({TOO_FEW_TRIALS})"
    return f"[{side(low, -np.inf)}, {side(high, np.inf)}]"


def _dof(n):
    """``n - 1`` degrees of freedom of a mean of ``n`` trials; NaN (no interval) below :data:`MIN_INTERVAL_TRIALS`."""
    n = np.asarray(n, dtype=float)
    return np.where(n >= MIN_INTERVAL_TRIALS, n - 1, np.nan)


def _log_bounds(value, rel_var, dof, confidence):
    """``value */ exp(q * sqrt(rel_var))``: a Student t interval on the log scale, mapped back.

    ``rel_var`` is the variance of ``log(value)`` (by the delta method, the
    squared relative standard error) and ``q`` the two-sided Student
    quantile at ``dof`` (the normal one at infinity). Arrays broadcast; NaN
    where ``value`` is not positive or ``rel_var`` or ``dof`` is missing.

    Examples
    --------
    >>> low, high = _log_bounds(2.0, 0.01, np.inf, 0.95)
    >>> round(float(low * high), 12), round(float(high / 2.0), 4)
    (4.0, 1.2165)
    """
    value, rel_var, dof = np.broadcast_arrays(*(np.asarray(x, dtype=float) for x in (value, rel_var, dof)))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        q = stdtrit(np.where(dof > 0, dof, np.nan), 0.5 + confidence / 2)
        factor = np.exp(q * np.sqrt(rel_var))
        usable = (value > 0) & (rel_var >= 0) & np.isfinite(q)
        return np.where(usable, value / factor, np.nan), np.where(usable, value * factor, np.nan)


def _ratio_interval(num, den, var_num, var_den, dof_num, dof_den, confidence):
    """``(low, high, dof)`` of ``num / den``, two independent positive means with variances ``var_*``.

    The variance of ``log(num / den)`` is ``var_num / num**2 + var_den / den**2``;
    its degrees of freedom ``dof`` are Welch-Satterthwaite's over the two
    parts (a part without variance adds none; none at all: infinite), and
    the bounds are :func:`_log_bounds`'. Swapping ``num`` and ``den`` gives
    the reciprocal interval.

    Examples
    --------
    >>> low, high, dof = _ratio_interval(0.2, 0.1, 0.02**2 / 5, 0.01**2 / 5, 4, 4, 0.95)
    >>> back = _ratio_interval(0.1, 0.2, 0.01**2 / 5, 0.02**2 / 5, 4, 4, 0.95)
    >>> bool(low < 2.0 < high), bool(np.allclose([1 / high, 1 / low], back[:2])), float(dof)
    (True, True, 8.0)
    """
    num, den, var_num, var_den, dof_num, dof_den = (
        np.asarray(x, dtype=float) for x in (num, den, var_num, var_den, dof_num, dof_den))
    with np.errstate(invalid="ignore", divide="ignore"):
        rel_num, rel_den = var_num / num**2, var_den / den**2
        rel = rel_num + rel_den
        spread = np.where(rel_num > 0, rel_num**2 / dof_num, 0.0) + np.where(rel_den > 0, rel_den**2 / dof_den, 0.0)
        dof = np.where(spread > 0, rel**2 / spread, np.where(rel == 0, np.inf, np.nan))
        return (*_log_bounds(num / den, rel, dof, confidence), dof)


# -- per trial ------------------------------------------------------------------------------


def trial_stats(requests, trials=None):
    """Per-trial statistics of the server-side runtime.

    Percentiles are numpy's default (linear interpolation) over the trial's
    successful (HTTP 2xx) requests; NaN values are skipped. The server-time
    percentiles are those every summary reports,
    :data:`tuna_lab.measure.schema.PERCENTILES`.

    Parameters
    ----------
    requests : pandas.DataFrame
        One row per request, with at least ``workers, threads, cpus, model,
        batch, policy, trial, status, server_seconds, client_seconds,
        sent_at`` and the stage columns :data:`STAGES`.
    trials : pandas.DataFrame, optional
        The runner's trial table; when given, its ``trial_status`` (and
        ``reason``) columns are attached, so that :func:`scenario_stats`
        leaves failed trials out.

    Returns
    -------
    pandas.DataFrame
        One row per ``(workers, threads, cpus, model, batch, policy, trial)``
        with ``subscription``, ``n``, ``ok``, ``failed`` (request counts),
        ``p50, p95, p99, mean`` of ``server_seconds`` (of ``client_seconds``
        for the requests whose ``latency`` column, where there is one, says
        ``"client"``: a user's server that reports no timing), ``client_p99``,
        ``throughput`` (ok requests per second from the first send to the
        last response) and ``<stage>_p99`` for every stage.

    Raises
    ------
    AnalysisError
        If a table is empty, misses a column or has a non-numeric value column.

    Examples
    --------
    >>> import pandas as pd
    >>> requests = pd.DataFrame({"workers": 2, "threads": 2, "cpus": 4, "model": "small",
    ...     "batch": 100, "policy": "cfs", "trial": 0, "status": [200, 200, 500],
    ...     "server_seconds": [0.1, 0.3, float("nan")], "client_seconds": [0.2, 0.4, 0.5],
    ...     "sent_at": [0.0, 0.0, 0.5], "deserialize": 0.01, "convert": 0.01,
    ...     "dmatrix": 0.01, "predict": 0.01, "shap": 0.01})
    >>> trial_stats(requests)[["n", "ok", "p50", "throughput"]].round(3).to_dict("records")
    [{'n': 3, 'ok': 2, 'p50': 0.2, 'throughput': 2.0}]
    """
    requests = with_defaults(requests)
    keys = _by(requests, _TRIAL)
    check_table(requests, "requests", keys + _REQUEST_VALUES,
                numeric=("workers", "threads", "cpus") + _REQUEST_VALUES, keys=keys)
    by = list(keys)
    ok = _is_ok(requests["status"])
    work = requests[by + list(_REQUEST_VALUES)].assign(
        _ok=ok, _end=requests["sent_at"] + requests["client_seconds"])
    if "latency" in requests.columns:
        # A user's server that gave no server-side timing: its trials' percentiles are the client's
        # (the runner's ``latency`` column says so, per request, as the trial row does).
        work["server_seconds"] = work["server_seconds"].where(requests["latency"].ne("client"),
                                                              requests["client_seconds"])
    counts = work.groupby(by, sort=True, observed=True).agg(
        n=("status", "size"), ok=("_ok", "sum"), _start=("sent_at", "min"), _end=("_end", "max"))

    good = work[ok].groupby(by, sort=True, observed=True)
    server = good["server_seconds"]
    # Every level in one grouped pass; reindex keeps the columns when no trial has a successful request.
    values = (server.quantile(list(_LEVELS)).unstack().reindex(columns=list(_LEVELS)).rename(columns=_LEVELS)
              .assign(mean=server.mean(), client_p99=good["client_seconds"].quantile(0.99)))
    per_stage = good[list(STAGES)].quantile(0.99).add_suffix("_p99")

    out = counts.join(values).join(per_stage)
    out["ok"] = out["ok"].astype(np.int64)
    out["failed"] = out["n"] - out["ok"]
    duration = out["_end"] - out["_start"]
    out["throughput"] = (out["ok"] / duration).where(duration > 0)
    out = out.reset_index()
    out.insert(len(by), "subscription", _subscription(out))
    columns = by + ["subscription", "n", "ok", "failed", *_LEVELS.values(), "mean",
                    "client_p99", "throughput"] + [f"{s}_p99" for s in STAGES]
    out = out[columns]
    if trials is not None:
        out = _attach_trial_status(out, trials)
    return sort_table(out, by)


def _attach_trial_status(table, trials):
    trials = with_defaults(trials)
    keys = list(_by(table, _TRIAL))
    check_table(trials, "trials", tuple(keys) + ("trial_status",), keys=keys)
    extra = ["trial_status"] + (["reason"] if "reason" in trials.columns else [])
    info = trials[keys + extra].drop_duplicates(keys, keep="last")
    try:
        return table.merge(info, on=keys, how="left", validate="one_to_one")
    except (ValueError, TypeError) as exc:
        raise AnalysisError(f"trials table does not match requests on {', '.join(keys)}: {exc}") from None


# -- per scenario ------------------------------------------------------------------------


def scenario_stats(trial_table, confidence=0.95):
    """Average trial p99 per scenario, with a confidence interval that never goes below zero.

    A scenario is one application under one policy. Trials without a p99 (no
    successful request) or marked ``trial_status == "failed"`` are left out
    of the averages and counted in ``n_failed``.

    Parameters
    ----------
    trial_table : pandas.DataFrame
        The output of :func:`trial_stats` (at least the scenario keys,
        ``trial`` and ``p99``).
    confidence : float, default 0.95
        Level of the interval ``mean */ exp(t_{(1+confidence)/2, n-1} * std / (mean * sqrt(n)))``:
        a Student t interval of ``log(mean)`` by the delta method, mapped back (the module's
        "Intervals"). A t interval of the p99s themselves, ``mean +- t * std / sqrt(n)``, reaches
        below zero with a few spread trials; this one never does.

    Returns
    -------
    pandas.DataFrame
        One row per ``(workers, threads, cpus, model, batch, policy)`` with
        ``subscription`` ("over" if ``workers * threads > cpus``), ``n_trials``,
        ``n_failed``, ``mean_p99``, ``std_p99`` (ddof 1), ``ci_low``, ``ci_high``
        (NaN with fewer than :data:`MIN_INTERVAL_TRIALS` trials), and the trial averages
        ``mean_<stage>_p99`` and ``mean_throughput`` where those columns exist.

    Raises
    ------
    AnalysisError
        If the table is empty or misses a column, or ``confidence`` is not in (0, 1).

    Examples
    --------
    >>> import pandas as pd
    >>> trials = pd.DataFrame({"workers": 4, "threads": 4, "cpus": 32, "model": "medium",
    ...     "batch": 100, "policy": "cfs", "trial": [0, 1, 2], "p99": [0.1, 0.2, 0.3]})
    >>> row = scenario_stats(trials).iloc[0]
    >>> row["subscription"], round(float(row["mean_p99"]), 6), bool(row["ci_low"] < 0.2 < row["ci_high"])
    ('under', 0.2, True)
    """
    _check_confidence(confidence)
    trial_table = with_defaults(trial_table)
    keys = _by(trial_table, _SCENARIO)
    check_table(trial_table, "trial_table", keys + ("trial", "p99"),
                numeric=("workers", "threads", "cpus", "p99"), keys=keys)
    by = list(keys)
    valid = valid_trials(trial_table)
    averaged = [c for c in [f"{s}_p99" for s in STAGES] + ["throughput"] if c in trial_table.columns]
    work = trial_table[by].assign(
        _valid=valid, p99=trial_table["p99"].where(valid),
        **{c: trial_table[c].where(valid) for c in averaged})
    grouped = work.groupby(by, sort=True, observed=True)
    out = grouped.agg(n_trials=("_valid", "sum"), _size=("_valid", "size"),
                      mean_p99=("p99", "mean"), std_p99=("p99", "std"))
    out = out.join(grouped[averaged].mean().add_prefix("mean_"))
    n = out["n_trials"].astype(np.int64)
    out["n_trials"] = n
    out["n_failed"] = out.pop("_size") - n
    with np.errstate(invalid="ignore", divide="ignore"):
        rel_var = out["std_p99"] ** 2 / (n * out["mean_p99"] ** 2)
    out["ci_low"], out["ci_high"] = _log_bounds(out["mean_p99"], rel_var, _dof(n), confidence)
    out = out.reset_index()
    out.insert(len(by), "subscription", _subscription(out))
    columns = by + ["subscription", "n_trials", "n_failed", "mean_p99", "std_p99", "ci_low",
                    "ci_high"] + [f"mean_{c}" for c in averaged]
    return sort_table(out[columns], by)


# -- speedups -------------------------------------------------------------------------------


def speedups(scenarios, baseline="cfs"):
    """Speedup of every policy over ``baseline`` for every application.

    ``speedup = baseline mean p99 / policy mean p99``: above 1 the policy is
    faster. Applications the baseline did not run get NaN.

    Parameters
    ----------
    scenarios : pandas.DataFrame
        The output of :func:`scenario_stats` (at least the scenario keys and
        ``mean_p99``), one row per application and policy.
    baseline : str, default "cfs"
        The policy the others are compared with.

    Returns
    -------
    pandas.DataFrame
        One row per application and non-baseline policy: the application
        keys, ``subscription``, ``policy``, ``baseline``, ``policy_p99``,
        ``baseline_p99`` and ``speedup``.

    Raises
    ------
    AnalysisError
        If the table is malformed or has two rows for one application and policy.

    Examples
    --------
    >>> import pandas as pd
    >>> scen = pd.DataFrame({"workers": 4, "threads": 4, "cpus": 32, "model": "medium",
    ...     "batch": 100, "policy": ["cfs", "tuna-scatter"], "mean_p99": [0.2, 0.1]})
    >>> speedups(scen)[["policy", "baseline", "speedup"]].to_dict("records")
    [{'policy': 'tuna-scatter', 'baseline': 'cfs', 'speedup': 2.0}]
    """
    scenarios = with_defaults(scenarios)
    keys = _by(scenarios, _SCENARIO)
    check_table(scenarios, "scenarios", keys + ("mean_p99",),
                numeric=("workers", "threads", "cpus", "mean_p99"), keys=keys)
    _check_policy(scenarios, baseline, "baseline")
    _check_unique(scenarios, "scenarios", keys)
    app = list(_by(scenarios, APPLICATION))
    is_base = scenarios["policy"].eq(baseline)
    base = scenarios.loc[is_base, app + ["mean_p99"]].rename(columns={"mean_p99": "baseline_p99"})
    other = scenarios.loc[~is_base, app + ["policy", "mean_p99"]].rename(columns={"mean_p99": "policy_p99"})
    out = other.merge(base, on=app, how="left", validate="many_to_one")
    out["subscription"] = _subscription(out)
    out["baseline"] = baseline
    with np.errstate(divide="ignore", invalid="ignore"):
        out["speedup"] = out["baseline_p99"] / out["policy_p99"]
    columns = app + ["subscription", "policy", "baseline", "policy_p99", "baseline_p99", "speedup"]
    return sort_table(out[columns], [MACHINE, "model", "batch", "workers", "threads", "cpus", "policy"])


def _grouping(spec, available):
    """``(label, columns)`` of one ``by`` entry: None, a column name or a sequence of them."""
    if spec is None:
        columns = ()
    elif isinstance(spec, str):
        columns = (spec,)
    else:
        columns = tuple(spec)
    unknown = [c for c in columns if c not in available]
    if unknown or not all(isinstance(c, str) for c in columns):
        raise AnalysisError(f"cannot group speedups by {spec!r}: choose from {', '.join(available)}")
    return ("+".join(columns) or "all"), columns


_CPU = ("cpu_main_per_request", "cpu_openmp_per_request", "idle_cpu_share_main", "idle_cpu_share_openmp",
        "cpu_seconds", "load_seconds")
# Reported when present (newer results): the workers' total per request, the load generator's own, and the
# master's, helpers' and front ends' (the scheduler evidence's), per request and per trial.
_CPU_OPTIONAL = ("cpu_per_request", "generator_cpu_per_request", "front_cpu_per_request", "front_cpu_seconds")


def cpu_cost(trials):
    """Latency next to CPU cost, per application, wait policy and policy.

    Parameters
    ----------
    trials : pandas.DataFrame
        The runner's trial table with its CPU columns (see
        :data:`tuna_lab.measure.schema.CPU_COLUMNS`); failed trials are left out.

    Returns
    -------
    pandas.DataFrame
        One row per scenario: ``p99`` (mean over trials, seconds),
        ``cpu_main_per_request`` and ``cpu_openmp_per_request`` (CPU-seconds),
        ``idle_cpu_share_main`` and ``idle_cpu_share_openmp`` (share of the
        role's CPU time spent while its worker had no request in flight),
        ``cores_busy`` (server CPU-seconds per second of load),
        ``cpu_per_request`` (every worker thread, per ok request),
        ``generator_cpu_per_request`` (the load generator's own CPU per
        request sent), ``front_cpu_per_request`` and ``front_cpu_seconds``
        (the master's, helpers' and front ends' CPU, per ok request and per
        trial: the server's CPU that is not its workers') - each NaN for
        results recorded before it was - and ``trials``.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"workers": 2, "threads": 2, "cpus": 2, "model": "small", "batch": 10,
    ...     "policy": "cfs", "trial": [0, 1], "trial_status": "ok", "p99": [0.02, 0.04],
    ...     "cpu_main_per_request": 0.01, "cpu_openmp_per_request": 0.02,
    ...     "idle_cpu_share_main": 0.1, "idle_cpu_share_openmp": 0.5,
    ...     "cpu_seconds": [3.0, 3.0], "load_seconds": [2.0, 2.0]})
    >>> cpu_cost(t)[["p99", "cores_busy", "idle_cpu_share_openmp"]].to_dict("records")
    [{'p99': 0.03, 'cores_busy': 1.5, 'idle_cpu_share_openmp': 0.5}]
    """
    trials = with_defaults(trials)
    keys = list(_by(trials, _SCENARIO))
    check_table(trials, "trials", tuple(keys) + ("trial", "p99") + _CPU, numeric=("p99",) + _CPU, keys=keys)
    valid = trials[valid_trials(trials)].assign(cores_busy=trials["cpu_seconds"] / trials["load_seconds"])
    # Older results lack them: NaN, not an error (a mixed sweep keeps its newer cells' values).
    valid = valid.assign(**{c: pd.to_numeric(valid[c], errors="coerce") if c in valid.columns else np.nan
                            for c in _CPU_OPTIONAL})
    values = ["p99"] + list(_CPU[:4]) + ["cores_busy", *_CPU_OPTIONAL]
    out = valid.groupby(keys, sort=True, observed=True)[values].mean()
    out["trials"] = valid.groupby(keys, sort=True, observed=True).size()
    return sort_table(out.reset_index(), keys)


def speedup_summary(scenarios, baselines=("cfs", "round-robin"), by=_DEFAULT_BY):
    """Average speedup of each policy over each baseline, overall and within groups.

    Parameters
    ----------
    scenarios : pandas.DataFrame
        The output of :func:`scenario_stats`.
    baselines : str or sequence of str, default ("cfs", "round-robin")
        The policies to compare with.
    by : sequence, default (None, "subscription", "model", "batch", ("subscription", "model", "batch"))
        Groupings: ``None`` for all applications, a column name, or a tuple of them.

    Returns
    -------
    pandas.DataFrame
        Per baseline, policy, grouping and group: ``baseline``, ``policy``, ``group``, the grouping
        columns, ``n``, ``speedup`` (the article's arithmetic mean), ``geomean``, ``ci_low``, ``ci_high``.

    Raises
    ------
    AnalysisError
        If the table is malformed or a grouping names an unknown column.

    Notes
    -----
    See docs/experiment.md, section "Intervals and speedups" (the interval of a mean speedup).

    Examples
    --------
    >>> import pandas as pd
    >>> scen = pd.DataFrame({"workers": [4, 4, 16, 16], "threads": [4, 4, 16, 16], "cpus": 32,
    ...     "model": "medium", "batch": 100, "policy": ["cfs", "tuna-scatter"] * 2,
    ...     "mean_p99": [0.2, 0.1, 0.3, 0.3]})
    >>> s = speedup_summary(scen, baselines="cfs", by=(None, "subscription"))
    >>> s[["group", "subscription", "speedup"]].values.tolist()
    [['all', nan, 1.5], ['subscription', 'over', 1.0], ['subscription', 'under', 2.0]]
    """
    if isinstance(baselines, str):
        baselines = (baselines,)
    if not baselines:
        raise AnalysisError("speedup_summary needs at least one baseline")
    table = pd.concat([speedups(scenarios, b) for b in baselines], ignore_index=True)
    available = [c for c in table.columns if c not in ("policy", "baseline", "policy_p99",
                                                       "baseline_p99", "speedup")]
    if isinstance(by, str) or by is None:
        by = (by,)
    groupings = [_grouping(spec, available) for spec in by]
    if not groupings:
        raise AnalysisError("speedup_summary needs at least one grouping in by")
    with np.errstate(divide="ignore", invalid="ignore"):
        table["_log"] = np.log(table["speedup"])
    parts = []
    for label, columns in groupings:
        part = (table.groupby(["baseline", "policy", *columns], sort=False, dropna=False, observed=True)
                .agg(n=("speedup", "count"), speedup=("speedup", "mean"), _log=("_log", "mean"))
                .reset_index())
        part.insert(2, "group", label)
        parts.append(part)
    out = pd.concat(parts, ignore_index=True)
    out["geomean"] = np.exp(out.pop("_log"))
    out["ci_low"], out["ci_high"] = _summary_intervals(scenarios, table, groupings)
    grouped = list(dict.fromkeys(c for _, columns in groupings for c in columns))
    for c in grouped:
        if is_integer_dtype(table[c]):
            out[c] = out[c].astype("Int64")
    out["_g"] = pd.Categorical(out["group"], categories=[label for label, _ in groupings]).codes
    out = sort_table(out, ["baseline", "_g", "policy", *grouped]).drop(columns="_g")
    return out[["baseline", "policy", "group", *grouped, "n", "speedup", "geomean", "ci_low", "ci_high"]]


def _summary_intervals(scenarios, table, groupings, confidence=0.95):
    """``(ci_low, ci_high)`` of every row of the summary, in the order :func:`speedup_summary` builds them."""
    n_rows = sum(len(table.groupby(["baseline", "policy", *columns], sort=False, dropna=False, observed=True))
                 for _, columns in groupings)
    if not {"std_p99", "n_trials"} <= set(scenarios.columns):
        return np.full(n_rows, np.nan), np.full(n_rows, np.nan)
    scenarios = with_defaults(scenarios)
    app = list(_by(scenarios, APPLICATION))
    spread = scenarios[app + ["policy", "std_p99", "n_trials"]]
    t = table.merge(spread, on=app + ["policy"], how="left").merge(
        spread.rename(columns={"policy": "baseline", "std_p99": "base_std", "n_trials": "base_n"}),
        on=app + ["baseline"], how="left")
    with np.errstate(divide="ignore", invalid="ignore"):
        # Each application's speedup b/p: delta-method variance of a ratio of two independent means.
        t["_var_p"] = t["std_p99"] ** 2 / t["n_trials"]
        t["_var_b"] = t["base_std"] ** 2 / t["base_n"]
        part_b = t["speedup"] ** 2 * t["_var_b"] / t["baseline_p99"] ** 2
        part_p = t["speedup"] ** 2 * t["_var_p"] / t["policy_p99"] ** 2
        t["_var"] = part_b + part_p
        t["_wsd"] = part_b ** 2 / (t["base_n"] - 1) + part_p ** 2 / (t["n_trials"] - 1)
    low, high = [], []
    for _, columns in groupings:
        for _, g in t.groupby(["baseline", "policy", *columns], sort=False, dropna=False, observed=True):
            g = g[np.isfinite(g["speedup"])]
            n = len(g)
            if n == 1:
                row = g.iloc[0]
                # The same call, with the same numbers, as compare_policies makes for one application.
                lo, hi, _ = _ratio_interval(row["baseline_p99"], row["policy_p99"], row["_var_b"], row["_var_p"],
                                            _dof(row["base_n"]), _dof(row["n_trials"]), confidence)
                if min(row["base_n"], row["n_trials"]) < MIN_INTERVAL_TRIALS:
                    lo = hi = np.nan     # a part without spread adds no dof: refuse by the count itself
            elif (n > 1 and np.isfinite(g["_var"]).all()
                  and (g[["n_trials", "base_n"]] >= MIN_INTERVAL_TRIALS).all(axis=None)):
                mean, var = g["speedup"].mean(), g["_var"].sum() / n**2
                dof = (g["_var"].sum() ** 2 / g["_wsd"].sum()) if g["_wsd"].sum() > 0 else np.inf
                lo, hi = _log_bounds(mean, var / mean**2, dof, confidence)
            else:
                lo = hi = np.nan
            low.append(float(lo))
            high.append(float(hi))
    return np.asarray(low), np.asarray(high)


# -- one comparison with an interval -----------------------------------------------------


def compare_policies(scenarios, a, b, confidence=0.95):
    """Ratio of the mean p99 of policy ``b`` over policy ``a``, over the applications both ran, with its interval.

    Parameters
    ----------
    scenarios : pandas.DataFrame
        The output of :func:`scenario_stats` (``mean_p99``, ``std_p99``, ``n_trials``).
    a, b : str
        The reference policy and the compared one.
    confidence : float, default 0.95
        Level of the interval.

    Returns
    -------
    dict
        ``a``, ``b``, ``ratio`` (below 1: ``b`` is faster), ``ci_low``, ``ci_high``, ``speedup``, ``speedup_ci_low`` /
        ``speedup_ci_high``, ``mean_a``, ``mean_b``, ``n_applications``, ``dof``, ``confidence``, ``method``.

    Raises
    ------
    AnalysisError
        If a policy is missing, ``a == b`` or no application has both.

    Notes
    -----
    See docs/experiment.md, section "Intervals and speedups" (the log-scale interval, and why not Fieller's).

    Examples
    --------
    >>> import pandas as pd
    >>> scen = pd.DataFrame({"workers": 4, "threads": 4, "cpus": 32, "model": "medium",
    ...     "batch": 100, "policy": ["cfs", "tuna-scatter"], "mean_p99": [0.2, 0.1],
    ...     "std_p99": [0.01, 0.01], "n_trials": 5})
    >>> r = compare_policies(scen, "cfs", "tuna-scatter")
    >>> r["ratio"], r["ci_low"] < 0.5 < r["ci_high"], r["speedup"]
    (0.5, True, 2.0)
    """
    _check_confidence(confidence)
    columns = ("mean_p99", "std_p99", "n_trials")
    scenarios = with_defaults(scenarios)
    keys = _by(scenarios, _SCENARIO)
    check_table(scenarios, "scenarios", keys + columns,
                numeric=("workers", "threads", "cpus") + columns, keys=keys)
    _check_policy(scenarios, a, "a")
    _check_policy(scenarios, b, "b")
    if a == b:
        raise AnalysisError(f"compare_policies needs two different policies, got {a!r} twice")
    _check_unique(scenarios, "scenarios", keys)
    app = list(_by(scenarios, APPLICATION))
    rows_a, rows_b = (scenarios.loc[scenarios["policy"].eq(p), app + list(columns)] for p in (a, b))
    both = rows_a.merge(rows_b, on=app, suffixes=("_a", "_b")).dropna(subset=["mean_p99_a", "mean_p99_b"])
    k = len(both)
    if k == 0:
        raise AnalysisError(f"no application has a mean p99 for both {a!r} and {b!r}")
    mean_a, mean_b = both["mean_p99_a"].mean(), both["mean_p99_b"].mean()
    var_a, dof_a = _average_variance(both["std_p99_a"], both["n_trials_a"], k)
    var_b, dof_b = _average_variance(both["std_p99_b"], both["n_trials_b"], k)
    # The speedup A / B first, with the arguments speedup_summary gives one application: the same numbers.
    low, high, dof = _ratio_interval(mean_a, mean_b, var_a, var_b, dof_a, dof_b, confidence)
    with np.errstate(divide="ignore"):
        ratio_low, ratio_high = np.reciprocal(high), np.reciprocal(low)
    ratio = mean_b / mean_a
    return {
        "a": a,
        "b": b,
        "ratio": float(ratio),
        "ci_low": float(ratio_low),
        "ci_high": float(ratio_high),
        "speedup": float(1 / ratio),
        "speedup_ci_low": float(low),
        "speedup_ci_high": float(high),
        "mean_a": float(mean_a),
        "mean_b": float(mean_b),
        "n_applications": k,
        "dof": float(dof),
        "confidence": confidence,
        "method": "log",
    }


def _average_variance(std, n, k):
    """Variance of the average of ``k`` independent means, and its Welch-Satterthwaite dof."""
    n = n.to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        parts = std.to_numpy(dtype=float) ** 2 / n / k**2
        var = float(parts.sum())
        if not np.isfinite(var) or np.any(n < MIN_INTERVAL_TRIALS):
            return np.nan, np.nan
        if var == 0:
            return 0.0, np.inf
        return var, float(var**2 / np.sum(parts**2 / (n - 1)))


def quantile_rank_interval(n, q=0.99, confidence=0.95):
    """Distribution-free interval of the ``q`` quantile from ``n`` values, as 1-based ranks of the sorted values.

    The number of values below the true quantile is Binomial(``n``, ``q``),
    so ranks ``(lo, hi)`` with ``P(lo <= X < hi) >= confidence`` bound it,
    whatever the distribution. A side that ``n`` values cannot bound is
    ``None``: with 200 requests the p99 has no upper bound at 95%, because
    all 200 lie below it with probability ``0.99**200 = 13%``.

    Returns
    -------
    tuple of (int or None, int or None)
        ``(lo, hi)``: the interval runs from the ``lo``-th smallest to the
        ``hi``-th smallest value.

    Examples
    --------
    >>> quantile_rank_interval(200)
    (195, None)
    >>> quantile_rank_interval(1000)
    (983, 997)
    """
    from scipy.stats import binom

    _check_confidence(confidence)
    tail = (1 - confidence) / 2
    lo = int(binom.ppf(tail, n, q))                      # P(X < lo) <= tail
    while lo > 0 and binom.cdf(lo - 1, n, q) > tail:
        lo -= 1
    hi = int(binom.ppf(1 - tail, n, q)) + 1              # P(X >= hi) <= tail
    return (lo if lo >= 1 else None), (hi if hi <= n else None)
