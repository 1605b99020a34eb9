"""The report's verdicts in words: one sentence from the data under each figure, and the one count of p99 verdicts.

Each sentence claims only what the 95% intervals support (the intervals of
:func:`~tuna_lab.analysis.stats.scenario_stats`, on the log scale): two means
differ when their intervals do not overlap; below
:data:`~tuna_lab.analysis.stats.MIN_INTERVAL_TRIALS` trials there is no
interval, and the sentence says so rather than judge from the means.

:func:`p99_counts` is the one count of how many p99 speedups separate a policy
from its baseline, of how many have an interval: the report's first sentence
(:func:`~tuna_lab.analysis.summary.scope_sentence`) and its verdict
(:func:`~tuna_lab.analysis.figures.verdict_text`) both read it, so they cannot disagree.

Examples
--------
>>> p99_counts([1.02, 0.8, float("nan")], [1.35, 1.2, float("nan")])
(1, 2, 3)
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..server.models import STAGES
from .stats import MIN_INTERVAL_TRIALS, TOO_FEW_TRIALS, format_interval, scenario_stats
from .tables import valid_trials

__all__ = ["p99_counts", "configuration_verdict", "stage_verdict"]


def p99_counts(low, high):
    """``(separated, with an interval, all)`` of speedup intervals: the one count every sentence of p99 uses.

    Parameters
    ----------
    low, high : array-like of float
        The speedups' interval sides; a NaN side means there is none
        (fewer than :data:`~tuna_lab.analysis.stats.MIN_INTERVAL_TRIALS` trials).

    Returns
    -------
    tuple of int
        How many intervals exclude 1 (the policy was faster or slower), how
        many there are, and how many speedups in all (with or without one).

    Examples
    --------
    >>> p99_counts([0.9, 1.1], [1.2, 1.5])
    (1, 2, 2)
    """
    low, high = (pd.to_numeric(pd.Series(list(v)), errors="coerce").to_numpy(float) for v in (low, high))
    has = ~np.isnan(low) & ~np.isnan(high)
    return int(((low > 1) | (high < 1))[has].sum()), int(has.sum()), len(low)


def _ms(value, low, high):
    """``"105.1 ms [87.2, 126.8]"``: a mean p99 in ms with its interval (or why there is none)."""
    return f"{value * 1e3:.1f} ms {format_interval(low * 1e3, high * 1e3, digits=1)}"


def _apart(a, b):
    """Whether two rows' intervals (``ci_low``, ``ci_high``) exist and do not overlap."""
    sides = [a["ci_low"], a["ci_high"], b["ci_low"], b["ci_high"]]
    if any(not np.isfinite(v) for v in sides):
        return False
    return bool(a["ci_high"] < b["ci_low"] or b["ci_high"] < a["ci_low"])


def _widest_apart(rows):
    """The pair of ``rows`` with apart intervals whose means differ most (``(low row, high row)``), or None."""
    best = None
    records = rows.to_dict("records")
    for i, a in enumerate(records):
        for b in records[i + 1:]:
            if not _apart(a, b):
                continue
            lo, hi = (a, b) if a["mean_p99"] <= b["mean_p99"] else (b, a)
            ratio = hi["mean_p99"] / lo["mean_p99"]
            if best is None or ratio > best[0]:
                best = (ratio, lo, hi)
    return None if best is None else (best[1], best[2])


def _select(per_trial, model, batch, wait_policy, spincount):
    """The valid trials of one model, batch and wait setting (each left alone where ``None``)."""
    data = per_trial[valid_trials(per_trial)]
    for column, value in (("model", model), ("batch", batch), ("wait_policy", wait_policy),
                          ("spincount", spincount)):
        if value is not None and column in data.columns:
            data = data[data[column].eq(value)]
    return data


def _scope(model, batch, wait_policy):
    """``"model small, batch 100"``: the figure's selection, so that two figures' sentences tell which is which."""
    parts = [f"model {model}"] if model is not None else []
    parts += [f"batch {batch}"] if batch is not None else []
    parts += [f"wait policy {wait_policy}"] if wait_policy not in (None, "default") else []
    return ", ".join(parts)


def configuration_verdict(per_trial, model=None, batch=None, wait_policy=None, spincount=None):
    """The sentence under a p99-by-configuration figure: whether a policy's p99 differs between configurations.

    Per policy, of every pair of configurations whose intervals do not
    overlap, the one whose means differ most; a policy with no such pair is
    said to show no difference, and one with fewer than
    :data:`~tuna_lab.analysis.stats.MIN_INTERVAL_TRIALS` trials of a
    configuration to have too few trials for an interval.

    Parameters
    ----------
    per_trial : pandas.DataFrame
        :func:`~tuna_lab.analysis.stats.trial_stats`'s output.
    model, batch, wait_policy, spincount : optional
        The figure's selection.

    Returns
    -------
    str
        One sentence; ``""`` without valid trials.

    Examples
    --------
    >>> t = pd.DataFrame({"workers": [1] * 3 + [2] * 3, "threads": 1, "cpus": 2, "model": "medium",
    ...     "batch": 100, "policy": "cfs", "trial": [0, 1, 2] * 2, "p99": [0.10, 0.11, 0.10, 0.20, 0.21, 0.2]})
    >>> print(configuration_verdict(t))  # doctest: +NORMALIZE_WHITESPACE
    Between configurations, cfs's p99 differs: 103.3 ms [89.9, 118.7] at 1x1 against 203.3 ms [189.5, 218.2] at
    2x1 (intervals apart).
    >>> print(configuration_verdict(t[t["trial"] < 2]))  # doctest: +NORMALIZE_WHITESPACE
    Between configurations: too few trials for an interval (fewer than 3 trials of a policy at a configuration),
    so no verdict on cfs.
    """
    data = _select(per_trial, model, batch, wait_policy, spincount)
    if data.empty:
        return ""
    scen = scenario_stats(data)
    scen = scen.assign(_label=scen["workers"].astype(str) + "x" + scen["threads"].astype(str))
    if scen["_label"].nunique() < 2:
        return (f"One configuration ({scen['_label'].iloc[0]}): nothing to compare between configurations; "
                "the verdict at the top says whether the policies' p99s differ there.")
    differs, same, few = [], [], []
    for policy, rows in scen.groupby("policy", sort=False):
        if len(rows) < 2:
            continue
        pair = _widest_apart(rows)
        if pair is not None:
            lo, hi = pair
            differs.append(f"{policy}'s p99 differs: {_ms(lo['mean_p99'], lo['ci_low'], lo['ci_high'])} at "
                           f"{lo['_label']} against {_ms(hi['mean_p99'], hi['ci_low'], hi['ci_high'])} at "
                           f"{hi['_label']} (intervals apart)")
        elif rows["n_trials"].lt(MIN_INTERVAL_TRIALS).any() and rows["ci_low"].isna().all():
            few.append(str(policy))
        else:
            same.append(str(policy))
    said = []
    if differs:
        said.append("; ".join(differs))
    if same:
        said.append(f"{' and '.join(same)}: no difference shown between configurations (every pair of "
                    "intervals overlaps or has too few trials)")
    if few:
        said.append(f"{' and '.join(few)}: {TOO_FEW_TRIALS}")
    if not differs and not same and few:
        return (f"Between configurations: {TOO_FEW_TRIALS} (fewer than {MIN_INTERVAL_TRIALS} trials of a policy "
                f"at a configuration), so no verdict on {' and '.join(few)}.")
    scope = _scope(model, batch, wait_policy)
    return (f"{scope[:1].upper()}{scope[1:]}: between configurations, " if scope else "Between configurations, ") \
        + "; ".join(said) + "."


def stage_verdict(per_trial, workers, threads, model=None, batch=None, wait_policy=None, spincount=None):
    """The sentence under a per-stage figure: which stage's p99 moves most between policies, or that none does.

    Each stage's p99 per policy is averaged over the valid trials with the
    interval a p99 gets (:func:`~tuna_lab.analysis.stats.scenario_stats`);
    a stage moves when two policies' intervals do not overlap, and the one
    said is the stage whose apart means differ most.

    Returns
    -------
    str
        One sentence; ``""`` without the stage columns or valid trials.

    Examples
    --------
    >>> t = pd.DataFrame({"workers": 2, "threads": 2, "cpus": 2, "model": "medium", "batch": 100,
    ...     "policy": ["cfs"] * 3 + ["tuna-scatter"] * 3, "trial": [0, 1, 2] * 2, "p99": 0.1,
    ...     **{f"{s}_p99": 0.001 for s in STAGES[:-1]}, "shap_p99": [0.06, 0.061, 0.06, 0.03, 0.031, 0.03]})
    >>> print(stage_verdict(t, 2, 2))  # doctest: +NORMALIZE_WHITESPACE
    At 2x2, between policies, the shap stage moves most: tuna-scatter 30.3 ms [28.9, 31.8] against cfs 60.3 ms
    [58.9, 61.8] (intervals apart).
    """
    columns = [f"{s}_p99" for s in STAGES]
    if not set(columns) <= set(per_trial.columns):
        return ""
    data = _select(per_trial, model, batch, wait_policy, spincount)
    data = data[data["workers"].eq(workers) & data["threads"].eq(threads)]
    if data.empty or data["policy"].nunique() < 2:
        return ""
    # Which configuration the sentence is about: a report draws one per-stage figure per configuration.
    at = ", ".join(filter(None, (f"{workers}x{threads}", _scope(model, batch, wait_policy))))
    best, largest, few = None, None, False
    timed = [(stage, column) for stage, column in zip(STAGES, columns, strict=True) if data[column].notna().any()]
    if not timed:
        # Your own app's results: the stage columns are there, but nothing timed the lab server's stages.
        return ""
    for stage, column in timed:
        rows = scenario_stats(data.assign(p99=data[column])).dropna(subset=["mean_p99"])
        if rows.empty:
            continue
        few = few or rows["ci_low"].isna().any()
        pair = _widest_apart(rows)
        if pair is not None and (best is None or pair[1]["mean_p99"] / pair[0]["mean_p99"] > best[0]):
            best = (pair[1]["mean_p99"] / pair[0]["mean_p99"], stage, *pair)
        lo, hi = rows.loc[rows["mean_p99"].idxmin()], rows.loc[rows["mean_p99"].idxmax()]
        if lo["mean_p99"] > 0 and (largest is None or hi["mean_p99"] / lo["mean_p99"] > largest[0]):
            largest = (hi["mean_p99"] / lo["mean_p99"], stage, lo, hi)
    if best is not None:
        _, stage, lo, hi = best
        return (f"At {at}, between policies, the {stage} stage moves most: {lo['policy']} "
                f"{_ms(lo['mean_p99'], lo['ci_low'], lo['ci_high'])} against {hi['policy']} "
                f"{_ms(hi['mean_p99'], hi['ci_low'], hi['ci_high'])} (intervals apart).")
    if few and all(scenario_stats(data.assign(p99=data[c]))["ci_low"].isna().all() for _, c in timed):
        return (f"At {at}, between policies: {TOO_FEW_TRIALS} (fewer than {MIN_INTERVAL_TRIALS} trials of a policy), so no "
                "stage can be said to move.")
    gap = ""
    if largest is not None:
        _, stage, lo, hi = largest
        gap = (f" (the largest gap, {stage}: {lo['policy']} {_ms(lo['mean_p99'], lo['ci_low'], lo['ci_high'])} "
               f"against {hi['policy']} {_ms(hi['mean_p99'], hi['ci_low'], hi['ci_high'])})")
    why = "their intervals overlap or some have too few trials" if few else "their intervals overlap"
    return f"At {at}, no stage's p99 is shown to differ between policies: in every stage {why}{gap}."
