"""The scheduler's own evidence, per policy: what a placement did to the threads, beside what it did to p99.

A placement changes p99 through the scheduler: threads that wait on a run
queue for a core, that migrate between CPUs and lose their caches, that are
preempted by a thread sharing their core, or that share their CPUs with
other processes and interrupts. Every trial records these
(:data:`tuna_lab.measure.schema.EVIDENCE_COLUMNS`); this module reduces the
per-request ones (:data:`MECHANISM`) two ways:

1. :func:`mechanism_table` - per application and policy, the mean over the
   valid trials with its 95% interval: the very interval of a p99
   (:func:`~tuna_lab.analysis.stats.scenario_stats`, on the log scale, never
   below zero; :data:`~tuna_lab.analysis.stats.INTERVALS`);
2. :func:`mechanism_correlations` - per application, over all its trials
   (every policy), Spearman's rank correlation of each with the trial's p99
   and a percentile bootstrap interval, with a plain sentence that says when
   it is weak: the interval holds 0, or fewer than
   :data:`MIN_CORRELATION_TRIALS` trials.

A quantity the results lack (recorded before the evidence was, or NaN in
every trial: a kernel that hides migrations) is reported as *not recorded*
with the reason, never as 0. :func:`mechanism_lines` writes both tables as
the lines ``tuna-lab run`` prints.

Where p99 cannot tell the policies apart, the mechanism often can:
:func:`separation` asks, of p99 and of every quantity, which policy-vs-baseline
comparisons its intervals separate (a p99 speedup's interval excludes 1; an
evidence interval excludes the baseline's), and :func:`lead_sentence` says
in words what separates them, with p99 beside it.

A correlation across trials says that the two move together in these
trials, not that one causes the other: trials of different policies differ
in more than one way.

Examples
--------
>>> import pandas as pd
>>> trials = pd.DataFrame({"workers": 2, "threads": 1, "cpus": 2, "model": "small", "batch": 10,
...     "policy": ["cfs"] * 3 + ["tuna-scatter"] * 3, "trial": [0, 1, 2] * 2,
...     "p99": [0.030, 0.034, 0.032, 0.020, 0.022, 0.021],
...     "run_delay_per_request": [0.004, 0.005, 0.0045, 0.001, 0.0012, 0.0011]})
>>> table = mechanism_table(trials)
>>> table.loc[table["evidence"].eq("run_delay_per_request"), ["policy", "mean"]].round(4).values.tolist()
[['cfs', 0.0045], ['tuna-scatter', 0.0011]]
>>> table.loc[table["evidence"].eq("migrations_per_request"), "note"].iloc[0]
'not recorded: these results were recorded before the scheduler evidence was'
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import pandas as pd

from ..errors import AnalysisError
from .stats import MACHINE, MIN_INTERVAL_TRIALS, TOO_FEW_TRIALS, compare_policies, format_interval, scenario_stats
from .tables import APPLICATION, check_table, shown_defaults, sort_table, valid_trials, with_defaults

__all__ = ["Evidence", "MECHANISM", "MIN_CORRELATION_TRIALS", "NOT_RECORDED", "has_evidence", "evidence_notes",
           "mechanism_table", "mechanism_correlations", "mechanism_lines", "format_evidence", "separation",
           "lead_sentence"]


class Evidence(NamedTuple):
    """One per-trial quantity of the scheduler's evidence, and how text shows it."""

    #: Its column in the trial table (:data:`tuna_lab.measure.schema.EVIDENCE_COLUMNS`).
    column: str
    #: What it is, in words.
    label: str
    #: The unit text shows it in (``""``: a count).
    unit: str
    #: Factor from the column's unit to ``unit`` (seconds to ms: 1000).
    scale: float
    #: The most it can be (a share: 1), where its interval stops; None: unbounded.
    bound: float | None = None


#: The per-request evidence reported per policy, in this order.
MECHANISM = (
    Evidence("run_delay_per_request", "run-queue wait per request", "ms", 1e3),
    Evidence("migrations_per_request", "migrations per request", "", 1.0),
    Evidence("involuntary_per_request", "involuntary switches per request", "", 1.0),
    Evidence("foreign_cpu_share", "foreign CPU share on the serving CPUs", "%", 100.0, 1.0),
    Evidence("irqs_per_request", "IRQs per request on the serving CPUs", "", 1.0),
)

#: Fewer trials than this (of one application) give no rank correlation: a bootstrap of so few says nothing.
MIN_CORRELATION_TRIALS = 6

#: The reasons a quantity is not reported, by what the results lack.
NOT_RECORDED = {
    "missing": "not recorded: these results were recorded before the scheduler evidence was",
    "empty": "not recorded: no valid trial has a value (this kernel or cgroup does not expose it)",
}

# Bootstrap resamples of a correlation, and the seed that makes a report the same every time it is written.
_RESAMPLES = 2000
_SEED = 0
_TABLE_COLUMNS = ["policy", "evidence", "label", "trials", "mean", "ci_low", "ci_high", "note"]
_CORRELATION_COLUMNS = ["evidence", "label", "trials", "rho", "ci_low", "ci_high", "weak", "sentence"]


def _keys(trials):
    """The application's keys, led by the machine for a cluster sweep's results."""
    return ([MACHINE] if MACHINE in trials.columns else []) + list(APPLICATION)


def _valid(trials, name="trials"):
    """The valid trials of a checked trial table, with the wait factors filled in."""
    trials = with_defaults(trials)
    keys = _keys(trials) if isinstance(trials, pd.DataFrame) else list(APPLICATION)
    check_table(trials, name, tuple(keys) + ("policy", "trial", "p99"), numeric=("p99",), keys=keys + ["policy"])
    return trials[valid_trials(trials)], keys


def _recorded(trials, column):
    """Whether some row of ``trials`` has a value of ``column``."""
    return column in trials.columns and pd.to_numeric(trials[column], errors="coerce").notna().any()


def has_evidence(trials):
    """Whether ``trials`` recorded the scheduler's evidence: some quantity of :data:`MECHANISM` has a value.

    Results written before the evidence have no such column, or (as
    :func:`~tuna_lab.measure.store.load_results` fills them in) NaN in all of them.

    Examples
    --------
    >>> import pandas as pd
    >>> has_evidence(pd.DataFrame({"p99": [0.1], "run_delay_per_request": [float("nan")]}))
    False
    >>> has_evidence(pd.DataFrame({"p99": [0.1], "run_delay_per_request": [0.002]}))
    True
    """
    return isinstance(trials, pd.DataFrame) and any(_recorded(trials, e.column) for e in MECHANISM)


def _reason(trials, column, notes, evidence=True):
    """Why ``column`` is not reported ("" when it is): absent, or NaN in every valid trial.

    ``evidence`` False: the results predate the evidence, whatever the columns say.
    """
    if not evidence or column not in trials.columns:
        return NOT_RECORDED["missing"]
    if _recorded(trials, column):
        return ""
    own = (notes or {}).get(column)
    return f"not recorded: {own}" if own else NOT_RECORDED["empty"]


def evidence_notes(manifests):
    """``{column: reason}`` for the evidence a run's manifest says this machine did not expose.

    The runner writes why migrations are NaN (a kernel that hides
    ``se.nr_migrations``) as the manifest's ``migrations_note``
    (:data:`tuna_lab.measure.schema.EVIDENCE_COLUMNS`).

    Parameters
    ----------
    manifests : mapping, sequence of mappings or None
        One manifest or those of several cells (:func:`~tuna_lab.measure.store.load_results`'
        third value); the first cell that gives a reason gives it.

    Returns
    -------
    dict

    Examples
    --------
    >>> evidence_notes({"migrations_note": "this kernel has no se.nr_migrations"})
    {'migrations_per_request': 'this kernel has no se.nr_migrations'}
    >>> evidence_notes(None)
    {}
    """
    if isinstance(manifests, Mapping):
        manifests = [manifests]
    notes = (m.get("migrations_note") for m in manifests or () if isinstance(m, Mapping))
    reason = next((n for n in notes if isinstance(n, str) and n), None)
    return {"migrations_per_request": reason} if reason else {}


def _check_notes(notes):
    if notes is not None and not isinstance(notes, Mapping):
        raise AnalysisError(f"notes must map a column to its reason, not {type(notes).__name__}")


def mechanism_table(trials, notes=None, confidence=0.95):
    """Per application and policy, each quantity of :data:`MECHANISM`: its mean over the trials, with its interval.

    Parameters
    ----------
    trials : pandas.DataFrame
        The runner's trial table (application keys, ``policy``, ``trial``,
        ``p99``, ``trial_status`` where written, and the evidence columns
        it has). Failed trials are left out, as everywhere.
    notes : mapping, optional
        ``{column: reason}``: why a column is NaN in every trial (say, the
        manifest's note that this kernel hides migrations); the default
        reason is :data:`NOT_RECORDED` ``["empty"]``.
    confidence : float, default 0.95
        Level of the intervals.

    Returns
    -------
    pandas.DataFrame
        One row per application, policy and quantity: the application's
        keys, ``policy``, ``evidence`` (the column), ``label``, ``trials``
        (valid trials with a value), ``mean`` (in the column's unit),
        ``ci_low``, ``ci_high`` (the interval of
        :func:`~tuna_lab.analysis.stats.scenario_stats`: on the log scale,
        NaN with fewer than :data:`~tuna_lab.analysis.stats.MIN_INTERVAL_TRIALS` trials; ``[0, 0]`` when every trial
        measured 0; a share's stops at 1) and ``note``: ``""``, or why the quantity is not
        recorded (then ``mean`` is NaN, never 0).

    Raises
    ------
    AnalysisError
        If the table is empty or misses a key column, or ``notes`` is not a mapping.

    Examples
    --------
    >>> import pandas as pd
    >>> trials = pd.DataFrame({"workers": 1, "threads": 1, "cpus": 2, "model": "small", "batch": 10,
    ...     "policy": "cfs", "trial": [0, 1, 2], "p99": [0.02, 0.03, 0.02], "migrations_per_request": 0.0})
    >>> row = mechanism_table(trials).iloc[1]
    >>> row["evidence"], float(row["mean"]), format_interval(row["ci_low"], row["ci_high"])
    ('migrations_per_request', 0.0, '[0.00, 0.00]')
    """
    _check_notes(notes)
    valid, keys = _valid(trials)
    scenario_keys = keys + ["policy"]
    scenarios = valid[scenario_keys].drop_duplicates()
    recorded = has_evidence(valid)
    parts = []
    for evidence in MECHANISM:
        reason = _reason(valid, evidence.column, notes, recorded)
        if reason:
            parts.append(scenarios.assign(evidence=evidence.column, label=evidence.label, trials=0, mean=np.nan,
                                          ci_low=np.nan, ci_high=np.nan, note=reason))
            continue
        values = pd.to_numeric(valid[evidence.column], errors="coerce")
        # The quantity takes the p99's place, so its interval is the p99's, from the one machinery.
        per = scenario_stats(valid[scenario_keys + ["trial"]].assign(p99=values), confidence=confidence)
        zero = per["mean_p99"].eq(0) & per["std_p99"].eq(0) & per["n_trials"].ge(MIN_INTERVAL_TRIALS)
        high = per["ci_high"].mask(zero, 0.0)
        per = per.assign(ci_low=per["ci_low"].mask(zero, 0.0),
                         ci_high=high if evidence.bound is None else high.clip(upper=evidence.bound))
        part = scenarios.merge(per[scenario_keys + ["n_trials", "mean_p99", "ci_low", "ci_high"]],
                               on=scenario_keys, how="left")
        parts.append(part.rename(columns={"n_trials": "trials", "mean_p99": "mean"}).assign(
            evidence=evidence.column, label=evidence.label,
            note=np.where(part["n_trials"].fillna(0).gt(0), "", "not recorded: no valid trial of this policy "
                                                                "has a value")))
    out = pd.concat(parts, ignore_index=True)
    out["trials"] = out["trials"].fillna(0).astype(np.int64)
    out["_e"] = out["evidence"].map({e.column: i for i, e in enumerate(MECHANISM)})
    out = sort_table(out, keys + ["_e", "policy"])
    return out[keys + _TABLE_COLUMNS]


def _spearman(x, y, axis=-1):
    """Spearman's rho along ``axis``; 0 where a resample is constant (no order: no relation to count)."""
    from scipy import stats     # here: scipy.stats takes most of a second to load, and few runs correlate
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        rho = stats.spearmanrho(x, y, axis=axis).statistic
    return np.nan_to_num(rho, nan=0.0)


def _correlation(x, y, label, confidence, resamples, seed):
    """``(rho, ci_low, ci_high, weak, sentence)`` of one quantity ``x`` against p99 ``y`` over ``len(x)`` trials."""
    n = len(x)
    if n < MIN_CORRELATION_TRIALS:
        return (np.nan, np.nan, np.nan, True,
                f"too few trials to tell: {n} with a value (a rank correlation needs {MIN_CORRELATION_TRIALS})")
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return (np.nan, np.nan, np.nan, True,
                f"no relation to measure: every one of the {n} trials had the same "
                + (label if np.ptp(x) == 0 else "p99"))
    from scipy import stats

    rho = float(_spearman(x, y))
    ci = stats.bootstrap((x, y), _spearman, paired=True, vectorized=True, method="percentile",
                         n_resamples=resamples, confidence_level=confidence,
                         rng=np.random.default_rng(seed)).confidence_interval
    low, high = float(ci.low), float(ci.high)
    said = f"Spearman {rho:.2f} {format_interval(low, high)}, {n} trials"
    if low <= 0 <= high:
        return rho, low, high, True, f"weak: its interval holds 0, so these trials cannot tell ({said})"
    return rho, low, high, False, f"trials with more of it had a {'higher' if rho > 0 else 'lower'} p99 ({said})"


def mechanism_correlations(trials, notes=None, confidence=0.95, resamples=_RESAMPLES, seed=_SEED):
    """Per application, Spearman's correlation of each quantity of :data:`MECHANISM` with p99 across its trials.

    Parameters
    ----------
    trials : pandas.DataFrame
        The runner's trial table (see :func:`mechanism_table`).
    notes, confidence : mapping, float, optional
        ``{column: reason}`` for a column NaN in every trial; the interval's level (default 0.95).
    resamples, seed : int, default 2000, 0
        Bootstrap resamples; the resampling seed (the same results give the same interval).

    Returns
    -------
    pandas.DataFrame
        One row per application and quantity: its keys, ``evidence``, ``label``, ``trials``, ``rho``,
        ``ci_low``, ``ci_high``, ``weak`` and ``sentence``, which says it in words.

    Raises
    ------
    AnalysisError
        A malformed table, ``notes`` not a mapping, or ``resamples`` not a positive integer.

    Notes
    -----
    See docs/experiment.md, section "Which evidence goes with the p99".

    Examples
    --------
    >>> import numpy as np, pandas as pd
    >>> p99 = np.linspace(0.02, 0.04, 9)
    >>> trials = pd.DataFrame({"workers": 2, "threads": 1, "cpus": 2, "model": "small", "batch": 10,
    ...     "policy": "cfs", "trial": range(9), "p99": p99, "run_delay_per_request": p99 / 10})
    >>> mechanism_correlations(trials).iloc[0]["sentence"]
    'trials with more of it had a higher p99 (Spearman 1.00 [1.00, 1.00], 9 trials)'
    """
    _check_notes(notes)
    if isinstance(resamples, bool) or not isinstance(resamples, (int, np.integer)) or resamples < 1:
        raise AnalysisError(f"resamples must be a positive integer, got {resamples!r}")
    valid, keys = _valid(trials)
    recorded = has_evidence(valid)
    rows = []
    for app, group in valid.groupby(keys, sort=True, observed=True):
        for evidence in MECHANISM:
            reason = _reason(group, evidence.column, notes, recorded)
            if reason:
                rows.append((*app, evidence.column, evidence.label, 0, np.nan, np.nan, np.nan, True, reason))
                continue
            pair = pd.DataFrame({"x": pd.to_numeric(group[evidence.column], errors="coerce"),
                                 "y": group["p99"]}).dropna()
            rows.append((*app, evidence.column, evidence.label, len(pair),
                         *_correlation(pair["x"].to_numpy(float), pair["y"].to_numpy(float), evidence.label,
                                       confidence, resamples, seed)))
    return pd.DataFrame(rows, columns=keys + _CORRELATION_COLUMNS)


def format_evidence(value, low, high, evidence, unit=True):
    """One estimate of ``evidence`` in its unit: ``"v [lo, hi] unit"``, or ``"v unit (too few trials ...)"``.

    The interval is :func:`~tuna_lab.analysis.stats.format_interval`'s, and
    the value follows its rule: two decimals, or two significant digits
    where two decimals would write a positive value as 0.

    Examples
    --------
    >>> format_evidence(0.0123, 0.01, 0.015, MECHANISM[0])
    '12.30 [10.00, 15.00] ms'
    >>> format_evidence(0.0011, 1.5e-05, 0.08, MECHANISM[1])
    '0.0011 [1.5e-05, 0.08]'
    >>> format_evidence(0.0066, 0.0022, 0.0098, MECHANISM[1])     # not '0.01 [0.0022, 0.01]'
    '0.007 [0.002, 0.010]'
    >>> format_evidence(0.0123, float("nan"), float("nan"), MECHANISM[0])
    '12.30 ms (too few trials for an interval)'
    """
    value, scale = value * evidence.scale, evidence.scale
    low, high = low * scale, high * scale
    digits = 2
    # One more decimal while the value would read as equal to a bound it is not equal to ("0.01 [0.0022,
    # 0.01]" for 0.0065 [0.0022, 0.0098]): a reader takes such a value for one at the edge of its interval.
    while digits < 6 and any(np.isfinite(b) and not np.isclose(b, value, rtol=1e-9, atol=0)
                             and _decimals(b, digits) == _decimals(value, digits) for b in (low, high)):
        digits += 1
    interval = format_interval(low, high, digits)
    text = _decimals(value, digits)
    unit = f" {evidence.unit}" if unit and evidence.unit else ""
    return text + (f"{unit} {interval}" if np.isnan(low) or np.isnan(high) else f" {interval}{unit}")


def _decimals(value, digits):
    """``value`` with ``digits`` decimals, or two significant digits where those would write a positive value
    as 0 (:func:`~tuna_lab.analysis.stats.format_interval`'s rule for its sides)."""
    return f"{value:.2g}" if 0 < abs(value) < 0.5 * 10.0**-digits else f"{value:.{digits}f}"


def mechanism_lines(table, correlations=None):
    """The per-policy evidence and its relation to p99 as text lines, as ``tuna-lab run`` prints them.

    Parameters
    ----------
    table : pandas.DataFrame
        :func:`mechanism_table`'s output.
    correlations : pandas.DataFrame, optional
        :func:`mechanism_correlations`' output; each quantity's line is then
        followed by its relation to p99.

    Returns
    -------
    list of str
        One heading, then per application (named when there are several)
        and quantity: ``"  label: policy v [lo, hi] unit; ..."`` or
        ``"  label: not recorded: why"``, and ``"    vs p99: ..."``.

    Examples
    --------
    >>> import pandas as pd
    >>> trials = pd.DataFrame({"workers": 1, "threads": 1, "cpus": 2, "model": "small", "batch": 10,
    ...     "policy": ["cfs"] * 3 + ["tuna-scatter"] * 2, "trial": [0, 1, 2, 0, 1],
    ...     "p99": [0.03, 0.031, 0.03, 0.02, 0.021], "run_delay_per_request": [0.004, 0.005, 0.0045, 0.001, 0.0012]})
    >>> print("\\n".join(mechanism_lines(mechanism_table(trials), mechanism_correlations(trials))[:3]))
    scheduler evidence per policy (mean over trials [95% interval]):
      run-queue wait per request: cfs 4.50 [3.41, 5.93] ms; tuna-scatter 1.10 ms (too few trials for an interval)
        vs p99: too few trials to tell: 5 with a value (a rank correlation needs 6)
    """
    keys = [c for c in _keys(table) if c in table.columns]
    several = len(table[keys].drop_duplicates()) > 1
    lines = ["scheduler evidence per policy (mean over trials [95% interval]):"]
    for app, rows in table.groupby(keys, sort=False, observed=True):
        indent = "  "
        if several:
            # As every table shows an application: an unset spin count is "default", not its stored -1.
            shown = shown_defaults(pd.DataFrame([app], columns=keys)).iloc[0].tolist()
            lines.append("  " + ", ".join(f"{k}={v}" for k, v in zip(keys, shown, strict=True)) + ":")
            indent = "    "
        for evidence in MECHANISM:
            own = rows[rows["evidence"].eq(evidence.column)]
            if own.empty or own["note"].ne("").all():
                reason = own["note"].iloc[0] if len(own) else NOT_RECORDED["missing"]
                lines.append(f"{indent}{evidence.label}: {reason}")
                continue
            cells = [f"{r.policy} " + (format_evidence(r.mean, r.ci_low, r.ci_high, evidence) if not r.note
                                       else "not recorded") for r in own.itertuples(index=False)]
            lines.append(f"{indent}{evidence.label}: " + "; ".join(cells))
            if correlations is not None:
                match = correlations[correlations["evidence"].eq(evidence.column)]
                for k, v in zip(keys, app, strict=True):
                    match = match[match[k].eq(v)] if k in match.columns else match
                if len(match) and not match["sentence"].iloc[0].startswith("not recorded"):
                    lines.append(f"{indent}  vs p99: {match['sentence'].iloc[0]}")
    return lines


# -- what separates the policies ------------------------------------------------------------

_SEPARATION_COLUMNS = ["measure", "label", "baseline", "policy", "baseline_estimate", "policy_estimate", "state"]
#: The states of one comparison in :func:`separation`.
SEPARATED, OVERLAP = "separated", "intervals overlap"


def _p99_rows(valid, app, baseline, confidence):
    """One p99 comparison per policy of one application: the speedup's interval against 1."""
    scenarios = scenario_stats(valid, confidence=confidence)
    rows = []
    for policy in sorted(set(valid["policy"]) - {baseline}):
        c = compare_policies(scenarios, baseline, policy, confidence)
        low, high = c["speedup_ci_low"], c["speedup_ci_high"]
        state = (TOO_FEW_TRIALS if np.isnan(low) or np.isnan(high)
                 else SEPARATED if low > 1 or high < 1 else OVERLAP)
        said = f"p99 speedup {c['speedup']:.2f}x {format_interval(low, high)}"
        rows.append((*app, "p99", "p99", baseline, policy, "", said, state))
    return rows


def separation(trials, baseline="cfs", notes=None, confidence=0.95):
    """Which measure tells each policy apart from ``baseline``: p99, and each quantity of :data:`MECHANISM`.

    Parameters
    ----------
    trials : pandas.DataFrame
        The runner's trial table (see :func:`mechanism_table`).
    baseline : str, default "cfs"
    notes, confidence : optional
        As :func:`mechanism_table` takes them.

    Returns
    -------
    pandas.DataFrame
        One row per application, measure and policy: the application's
        keys, ``measure`` (``"p99"`` or the evidence column), ``label``,
        ``baseline``, ``policy``, ``baseline_estimate`` and
        ``policy_estimate`` as text, and ``state``: ``"separated"`` (p99:
        the speedup's interval excludes 1; a quantity: the policy's interval
        and the baseline's do not overlap), ``"intervals overlap"``,
        :data:`~tuna_lab.analysis.stats.TOO_FEW_TRIALS` or the reason it is
        not recorded.

    Raises
    ------
    AnalysisError
        A malformed table, or ``baseline`` not among its policies.

    Examples
    --------
    >>> import pandas as pd
    >>> trials = pd.DataFrame({"workers": 2, "threads": 1, "cpus": 2, "model": "small", "batch": 10,
    ...     "policy": ["cfs"] * 3 + ["tuna-scatter"] * 3, "trial": [0, 1, 2] * 2,
    ...     "p99": [0.030, 0.020, 0.032, 0.022, 0.031, 0.021],
    ...     "migrations_per_request": [0.1, 0.2, 0.15, 0.0, 0.0, 0.0]})
    >>> sep = separation(trials)
    >>> sep.loc[sep["measure"].isin(["p99", "migrations_per_request"]), ["measure", "state"]].values.tolist()
    [['p99', 'intervals overlap'], ['migrations_per_request', 'separated']]
    """
    valid, keys = _valid(trials)
    if not valid["policy"].eq(baseline).any():
        raise AnalysisError(f"baseline {baseline!r} has no valid trial (have: "
                            f"{', '.join(sorted(map(str, valid['policy'].unique())))})")
    table = mechanism_table(trials, notes, confidence)
    units = {e.column: e for e in MECHANISM}
    rows = []
    for app, group in valid.groupby(keys, sort=True, observed=True):
        if not group["policy"].eq(baseline).any():
            continue
        rows += _p99_rows(group, app, baseline, confidence)
        own = table.merge(pd.DataFrame([app], columns=keys), on=keys)
        for evidence in MECHANISM:
            part = own[own["evidence"].eq(evidence.column)].set_index("policy")
            base = part.loc[baseline]
            for policy, r in part.drop(index=baseline).iterrows():
                if base["note"] or r["note"]:
                    state = base["note"] or r["note"]
                elif np.isnan([base["ci_low"], base["ci_high"], r["ci_low"], r["ci_high"]]).any():
                    state = TOO_FEW_TRIALS
                else:
                    apart = r["ci_high"] < base["ci_low"] or r["ci_low"] > base["ci_high"]
                    state = SEPARATED if apart else OVERLAP
                est = [format_evidence(x["mean"], x["ci_low"], x["ci_high"], units[evidence.column])
                       if not x["note"] else "not recorded" for x in (base, r)]
                rows.append((*app, evidence.column, evidence.label, baseline, policy, *est, state))
    return pd.DataFrame(rows, columns=keys + _SEPARATION_COLUMNS)


def _rank(sep):
    """Measures by how many comparisons they separate, most first; p99 first among equals."""
    order = {"p99": -1, **{e.column: i for i, e in enumerate(MECHANISM)}}
    counts = (sep.assign(_sep=sep["state"].eq(SEPARATED)).groupby(["measure", "label"], sort=False)
              .agg(separated=("_sep", "sum"), compared=("_sep", "size")).reset_index())
    counts["_o"] = counts["measure"].map(order)
    return counts.sort_values(["separated", "_o"], ascending=[False, True]).drop(columns="_o")


def _at(row, keys, varies):
    """Where a comparison was made (`` at 2x2 medium``): W x T, then the model, batch and wait policy where
    they vary, and the machine of a cluster sweep where it does."""
    if not varies or not {"workers", "threads"} <= set(keys):
        return ""
    place = f" at {row['workers']}x{row['threads']}" + "".join(
        f" {row[k]}" for k in ("model", "batch", "wait_policy") if k in varies)
    return place + (f" on {row[MACHINE]}" if MACHINE in varies else "")


def lead_sentence(trials, baseline="cfs", notes=None, confidence=0.95):
    """The first thing to say about these trials: what separates the policies from ``baseline``, p99 beside it.

    Parameters
    ----------
    trials : pandas.DataFrame
        The runner's trial table.
    baseline : str, default "cfs"
    notes, confidence : optional
        As :func:`mechanism_table` takes them.

    Returns
    -------
    str
        Led by p99 where p99 separates at least as many comparisons as any
        quantity of the evidence, with the quantities that separate after it;
        else led by the quantity that separates most (:func:`separation`),
        its estimates and intervals against the baseline's, then the other
        quantities that separate, then p99's speedups and intervals; or that
        nothing measured here separates them. Never more than the intervals
        show.

    Examples
    --------
    >>> import pandas as pd
    >>> trials = pd.DataFrame({"workers": 2, "threads": 1, "cpus": 2, "model": "small", "batch": 10,
    ...     "policy": ["cfs"] * 3 + ["tuna-scatter"] * 3, "trial": [0, 1, 2] * 2,
    ...     "p99": [0.030, 0.020, 0.032, 0.022, 0.031, 0.021],
    ...     "migrations_per_request": [0.1, 0.2, 0.15, 0.0, 0.0, 0.0]})
    >>> print(lead_sentence(trials))
    Migrations per request separates 1 of 1 policy comparison with cfs: tuna-scatter 0.00 [0.00, 0.00] against cfs 0.15 [0.07, 0.34]. p99 does not: its speedup intervals hold 1 in 1 of 1 (tuna-scatter p99 speedup 1.11x [0.66, 1.86]).
    """
    sep = separation(trials, baseline, notes, confidence)
    if sep.empty:
        return f"No application has both {baseline} and another policy: nothing to compare."
    keys = [c for c in _keys(sep) if c in sep.columns]
    # The keys that differ between the applications compared: a place names W x T, and the model and batch
    # where those differ too (two models at 2x2 are two places).
    varies = {k for k in keys if sep[k].nunique() > 1}
    ranked = _rank(sep)
    p99 = sep[sep["measure"].eq("p99")]
    p99_sep = int(p99["state"].eq(SEPARATED).sum())
    best = ranked.iloc[0]
    if p99["state"].eq(TOO_FEW_TRIALS).all() and best["separated"] == 0:
        return (f"These trials cannot separate anything: {TOO_FEW_TRIALS} "
                f"(fewer than {MIN_INTERVAL_TRIALS} valid trials of a policy).")

    def listed(rows, with_base):
        said = [f"{r['policy']}{_at(r, keys, varies)} " + (f"{r['policy_estimate']} against {r['baseline']} "
                                                           f"{r['baseline_estimate']}" if with_base
                                                           else r["policy_estimate"])
                for r in rows.to_dict("records")]
        return "; ".join(said[:4]) + (f"; and {len(said) - 4} more" if len(said) > 4 else "")

    p99_said = listed(p99, False)
    if best["measure"] == "p99" and p99_sep:
        text = (f"p99 separates {p99_sep} of {len(p99)} {_comparisons(len(p99))} with {baseline}: "
                + listed(p99[p99["state"].eq(SEPARATED)], False) + ".")
        holds, few = int(p99["state"].eq(OVERLAP).sum()), int(p99["state"].eq(TOO_FEW_TRIALS).sum())
        text += f" In {holds} more the interval holds 1." if holds else ""
        text += f" {few} had {TOO_FEW_TRIALS}." if few else ""
        mech = ranked[ranked["measure"].ne("p99") & ranked["separated"].gt(0)]
        if len(mech):
            # Every quantity that separates, not just the first: a reader looks for the mechanism among them.
            also = "; also " + ", ".join(f"{r['label']} ({int(r['separated'])})"
                                         for r in mech.iloc[1:].to_dict("records"))
            text += (f" Of the scheduler's evidence, {mech.iloc[0]['label']} separates {int(mech.iloc[0]['separated'])}"
                     + (also if len(mech) > 1 else "") + ".")
        elif not has_evidence(trials):
            text += " The scheduler's evidence was not recorded in these results."
        return text
    if best["separated"] == 0:
        return (f"Nothing measured here separates the policies from {baseline}: no p99 speedup interval excludes 1 "
                f"({p99_said}), and no interval of the scheduler's evidence excludes {baseline}'s.")
    # The quantity that separates most leads, with its intervals; the others that separate, then p99, follow.
    shown = sep[sep["measure"].eq(best["measure"]) & sep["state"].eq(SEPARATED)]
    text = (f"{_capital(best['label'])} separates {int(best['separated'])} of {int(best['compared'])} "
            f"{_comparisons(int(best['compared']))} with {baseline}: {listed(shown, True)}.")
    others = ranked[ranked["measure"].ne("p99") & ranked["measure"].ne(best["measure"]) & ranked["separated"].gt(0)]
    if len(others):
        text += " Also separating: " + ", ".join(f"{r['label']} ({int(r['separated'])} of {int(r['compared'])})"
                                                 for r in others.to_dict("records")) + "."
    holds, few = int(p99["state"].eq(OVERLAP).sum()), int(p99["state"].eq(TOO_FEW_TRIALS).sum())
    if p99_sep:
        # The comparisons p99 does separate, by name; the others by their count.
        text += (f" p99 separates only {p99_sep} of {len(p99)}: " + listed(p99[p99["state"].eq(SEPARATED)], False)
                 + (f"; in the other {holds} its interval holds 1" if holds else "") + ".")
    else:
        text += f" p99 does not: its speedup intervals hold 1 in {holds} of {len(p99)} ({p99_said})."
    return text + (f" {few} p99 {'comparison' if few == 1 else 'comparisons'} had {TOO_FEW_TRIALS}." if few else "")


def _comparisons(n):
    """``policy comparison`` or ``policy comparisons``, to agree with ``n``."""
    return "policy comparison" if n == 1 else "policy comparisons"


def _capital(label):
    """A label that opens a sentence, capitalised (``Migrations per request``); ``p99`` and the like stay as
    they are written."""
    return label if label[:1].lower() == "p" and label[1:2].isdigit() else label[:1].upper() + label[1:]
