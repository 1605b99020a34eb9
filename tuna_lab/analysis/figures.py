"""Plotly figures of experiment results, after the Tuna article's figures.

* :func:`p99_by_configuration` - trial p99s (dots) and their mean (a dash
  per configuration, joined by a line) per policy over the server
  configurations ``W x T``, oversubscribed configurations shaded;
* :func:`stage_p99_bars` - average per-stage p99 of one configuration, one
  bar per policy;
* :func:`speedup_bars` - average speedups of the policies over the baselines
  within groups, on a log axis with 1 marked;
* :func:`paired_trials` - each trial's p99 under every policy, joined by a
  line per trial, so that a pair that crosses shows at once;
* :func:`race_rounds` - a tune's race as it narrows: each candidate's rate
  interval after every round.
* :func:`mechanism_bars` - the scheduler's evidence per policy (run-queue
  wait, migrations, involuntary switches, foreign CPU, IRQs) with intervals.

Every figure takes the tables of :mod:`tuna_lab.analysis` and returns a
:class:`plotly.graph_objects.Figure`; times are shown in milliseconds.
Speedups and ratios are drawn on a log axis (1.25x faster and 1.25x slower
lie as far from 1), and an error bar only where there is an interval (at
least :data:`~tuna_lab.analysis.stats.MIN_INTERVAL_TRIALS` trials).
:func:`verdict` and :func:`verdict_text` say in words what a figure of
speedups shows: faster, slower, no difference shown, or too few trials;
:func:`race_verdict` says it of a tune's race.
Policies keep one colour across figures, and a hover writes an interval as
:func:`~tuna_lab.analysis.stats.format_interval` does, as the report's tables
and the terminal write it.

Examples
--------
>>> import pandas as pd
>>> trials = pd.DataFrame({"workers": [4, 4, 16, 16], "threads": [4, 4, 16, 16], "cpus": 32,
...     "model": "medium", "batch": 100, "policy": "cfs", "trial": [0, 1, 0, 1],
...     "p99": [0.10, 0.12, 0.30, 0.34]})
>>> fig = p99_by_configuration(trials)
>>> [t.mode for t in fig.data], len(fig.layout.shapes)
(['markers', 'lines+markers'], 1)
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative

from ..errors import AnalysisError
from ..placement import POLICIES
from ..server.models import STAGES
from ._verdicts import p99_counts
from .stats import MIN_INTERVAL_TRIALS, TOO_FEW_TRIALS, format_interval, scenario_stats, speedup_summary
from .tables import APPLICATION, MODELS, check_table, ordered, valid_trials, with_defaults

__all__ = ["p99_by_configuration", "stage_p99_bars", "speedup_bars", "paired_trials", "race_rounds",
           "mechanism_bars", "FASTER", "SLOWER", "NO_DIFFERENCE", "verdict", "verdict_table", "verdict_text",
           "race_verdict"]

#: The words of a verdict on a speedup (baseline p99 / policy p99) with its interval.
FASTER, SLOWER, NO_DIFFERENCE = "faster", "slower", "no difference shown"

_MS = 1e3
_PALETTE = qualitative.Plotly
_TEMPLATE = "plotly_white"
_OVER_FILL = "rgba(120, 120, 120, 0.15)"


def _colors(policies):
    """A fixed colour per policy: known policies by their place in :data:`POLICIES`."""
    names = list(POLICIES) + sorted(set(policies) - set(POLICIES), key=str)
    return {p: _PALETTE[names.index(p) % len(_PALETTE)] for p in policies}


def _only(table, column, value):
    """Rows with ``column == value``; ``value=None`` requires the column to hold one value."""
    present = ordered(table[column].unique(), MODELS if column == "model" else ())
    if value is None:
        if len(present) > 1:
            raise AnalysisError(f"several values of {column} in the table ({', '.join(map(str, present))}): "
                                f"pass {column}=")
        return table, present[0]
    if value not in present:
        raise AnalysisError(f"{column} {value!r} is not in the table (have: {', '.join(map(str, present))})")
    return table[table[column].eq(value)], value


def _wait_only(table, wait_policy, spincount):
    """Rows of one wait policy and spin count (the runtime's default where the table has none).

    Cells that differ only by how OpenMP threads wait are different applications:
    a figure never draws them as one.
    """
    table = with_defaults(table)
    data, wait_policy = _only(table, "wait_policy", wait_policy)
    data, spincount = _only(data, "spincount", spincount)
    suffix = "" if wait_policy == "default" else f", wait {wait_policy}"
    suffix += "" if spincount in (-1, None) else f", spincount {spincount}"
    return data, suffix


def _config_labels(table):
    """``"WxT"`` per row (``"WxT/C"`` when several core counts are present)."""
    label = table["workers"].astype(str) + "x" + table["threads"].astype(str)
    if table["cpus"].nunique() > 1:
        label = label + "/" + table["cpus"].astype(str)
    return label


def _runs(mask):
    """``(start, stop)`` index pairs of the runs of True in a boolean array."""
    edges = np.diff(np.r_[0, np.asarray(mask, dtype=np.int8), 0])
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True))


def p99_by_configuration(trials_stats, model=None, batch=None, wait_policy=None, spincount=None):
    """Trial p99s and their mean per policy over the server configurations.

    Parameters
    ----------
    trials_stats : pandas.DataFrame
        The output of :func:`tuna_lab.analysis.trial_stats`.
    model, batch : optional
        The model and batch size to draw; may be left out when the table
        holds only one.

    Returns
    -------
    plotly.graph_objects.Figure
        Per policy, one ``markers`` trace (every valid trial's p99) and one
        ``lines+markers`` trace (the mean of the trials: a dash at each
        configuration, joined by a line), at configurations ``WxT`` ordered
        by workers then threads; each run of oversubscribed configurations
        (``W * T > C``) is one shaded rectangle. With one configuration there
        is no line to draw: the dashes still show each policy's mean, and the
        title says so.

    Raises
    ------
    AnalysisError
        If the table is malformed, the selection is ambiguous or holds no valid trial.

    Examples
    --------
    >>> import pandas as pd
    >>> trials = pd.DataFrame({"workers": [2, 16], "threads": [2, 16], "cpus": 32,
    ...     "model": "small", "batch": 100, "policy": "tuna-scatter", "trial": 0, "p99": [0.1, 0.3]})
    >>> fig = p99_by_configuration(trials)
    >>> list(fig.layout.xaxis.ticktext), fig.layout.shapes[0].x0
    (['2x2', '16x16'], 0.5)
    """
    check_table(trials_stats, "trials_stats", ("workers", "threads", "cpus", "model", "batch",
                                               "policy", "trial", "p99"), numeric=("p99",))
    data, model = _only(trials_stats, "model", model)
    data, batch = _only(data, "batch", batch)
    data, wait = _wait_only(data, wait_policy, spincount)
    data = data[valid_trials(data)]
    if data.empty:
        raise AnalysisError(f"no valid trial for model {model!r}, batch {batch!r}")
    keys = ["workers", "threads", "cpus"]
    configs = data[keys].drop_duplicates().sort_values(keys, ignore_index=True)
    configs["x"] = np.arange(len(configs))
    configs["label"] = _config_labels(configs)
    over = (configs["workers"] * configs["threads"] > configs["cpus"]).to_numpy()

    points = data.merge(configs, on=keys)
    means = scenario_stats(data).merge(configs, on=keys).sort_values("x")
    policies = ordered(points["policy"].unique(), POLICIES)
    colors = _colors(policies)
    spread = np.linspace(-0.15, 0.15, len(policies)) if len(policies) > 1 else [0.0]
    offsets = dict(zip(policies, spread, strict=True))

    fig = go.Figure()
    for policy in policies:
        pts = points[points["policy"].eq(policy)]
        avg = means[means["policy"].eq(policy)]
        fig.add_trace(go.Scatter(
            x=pts["x"] + offsets[policy], y=pts["p99"] * _MS, mode="markers", name=f"{policy} trials",
            legendgroup=policy, showlegend=False, marker={"color": colors[policy], "size": 7, "opacity": 0.6},
            customdata=np.c_[pts["label"], pts["trial"]],
            hovertemplate=f"{policy}<br>%{{customdata[0]}} trial %{{customdata[1]}}<br>p99 %{{y:.2f}} ms"
                          "<extra></extra>"))
        fig.add_trace(go.Scatter(
            x=avg["x"] + offsets[policy], y=avg["mean_p99"] * _MS, mode="lines+markers", name=policy,
            legendgroup=policy, line={"color": colors[policy], "width": 2},
            marker={"color": colors[policy], "symbol": "line-ew-open", "size": 18, "line": {"width": 3}},
            customdata=np.c_[avg["label"], avg["n_trials"]],
            hovertemplate=f"{policy}<br>%{{customdata[0]}}: mean p99 %{{y:.2f}} ms over "
                          "%{customdata[1]} trials<extra></extra>"))
    for start, stop in _runs(over):
        fig.add_vrect(x0=float(start) - 0.5, x1=float(stop) - 0.5, fillcolor=_OVER_FILL, line_width=0,
                      layer="below")
    single = "<br><sup>one configuration: a dash marks each mean, no line joins them</sup>" * (len(configs) == 1)
    fig.update_layout(
        template=_TEMPLATE,
        title=f"p99 server time per configuration - model {model}, batch {batch}{wait}{single}",
        xaxis={"title": "configuration (workers x threads); shaded: oversubscribed (W*T > cores)",
               "tickmode": "array", "tickvals": configs["x"].tolist(), "ticktext": configs["label"].tolist(),
               "range": [-0.5, len(configs) - 0.5]},
        yaxis={"title": "p99 server time (ms)", "rangemode": "tozero"},
        legend={"title": "policy (dots: trials; dash and line: their mean)"},
    )
    return fig


def stage_p99_bars(trials_stats, workers, threads, model=None, batch=None, wait_policy=None, spincount=None):
    """Average per-stage p99 of one configuration, one bar per policy and stage.

    Parameters
    ----------
    trials_stats : pandas.DataFrame
        The output of :func:`tuna_lab.analysis.trial_stats` (with the
        ``<stage>_p99`` columns).
    workers, threads : int
        The configuration ``W x T``.
    model, batch : optional
        May be left out when the table holds only one.

    Returns
    -------
    plotly.graph_objects.Figure
        Grouped bars: x = the five stages, one bar trace per policy whose
        heights are the mean over valid trials of the stage p99 (error bars:
        standard deviation over trials, drawn only for a bar of at least
        :data:`~tuna_lab.analysis.stats.MIN_INTERVAL_TRIALS` trials; a bar of
        fewer draws none, and its hover says
        :data:`~tuna_lab.analysis.stats.TOO_FEW_TRIALS`).

    Raises
    ------
    AnalysisError
        If the table is malformed or has no valid trial of that configuration.

    Examples
    --------
    >>> import pandas as pd
    >>> trials = pd.DataFrame({"workers": 4, "threads": 4, "cpus": 32, "model": "medium",
    ...     "batch": 100, "policy": ["cfs", "tuna-scatter"], "trial": 0, "p99": 0.1,
    ...     "deserialize_p99": 0.001, "convert_p99": 0.001, "dmatrix_p99": 0.01,
    ...     "predict_p99": 0.02, "shap_p99": [0.06, 0.04]})
    >>> fig = stage_p99_bars(trials, 4, 4)
    >>> [t.name for t in fig.data], fig.data[1].y.round(1).tolist()
    (['cfs', 'tuna-scatter'], [1.0, 1.0, 10.0, 20.0, 40.0])
    >>> fig.data[0].customdata[0]       # one trial per bar: no error bar, and the hover says why
    '1 trial: too few trials for an interval'
    """
    stage_columns = [f"{s}_p99" for s in STAGES]
    check_table(trials_stats, "trials_stats", ("workers", "threads", "cpus", "model", "batch", "policy",
                                               "trial", "p99", *stage_columns), numeric=stage_columns)
    data, model = _only(trials_stats, "model", model)
    data, batch = _only(data, "batch", batch)
    data, wait = _wait_only(data, wait_policy, spincount)
    data = data[data["workers"].eq(workers) & data["threads"].eq(threads) & valid_trials(data)]
    if data.empty:
        raise AnalysisError(f"no valid trial for {workers}x{threads}, model {model!r}, batch {batch!r}")
    cpus = sorted(data["cpus"].unique())
    if len(cpus) > 1:
        raise AnalysisError(f"{workers}x{threads} was run with several core counts {cpus}: filter the table")
    long = data.melt(id_vars=["policy"], value_vars=stage_columns, var_name="stage", value_name="seconds")
    summary = long.groupby(["policy", "stage"], sort=False, observed=True)["seconds"].agg(["mean", "std", "count"])
    summary[["mean", "std"]] *= _MS
    # The project's rule for every interval: none below MIN_INTERVAL_TRIALS trials. The standard deviation of
    # two trials is a bar as sure-looking as any other, drawn from almost nothing (NaN draws no bar).
    summary["std"] = summary["std"].where(summary["count"].ge(MIN_INTERVAL_TRIALS))
    policies = ordered(data["policy"].unique(), POLICIES)
    colors = _colors(policies)

    fig = go.Figure()
    for policy in policies:
        rows = summary.loc[policy].reindex(stage_columns)
        counts = rows["count"].fillna(0).astype(int)
        spread = [f"± {sd:.2f} ms (std over {n} trials)" if np.isfinite(sd) else f"{n} trial{'s' * (n != 1)}: "
                  f"{TOO_FEW_TRIALS}" for sd, n in zip(rows["std"], counts, strict=True)]
        fig.add_trace(go.Bar(
            x=list(STAGES), y=rows["mean"], name=policy, marker_color=colors[policy],
            error_y={"type": "data", "array": rows["std"], "visible": True}, customdata=spread,
            hovertemplate=f"{policy}<br>%{{x}}: mean p99 %{{y:.2f}} ms<br>%{{customdata}}<extra></extra>"))
    few = summary["count"].lt(MIN_INTERVAL_TRIALS).any()
    caption = (f"<br><sup>error bars: std over trials; none where fewer than {MIN_INTERVAL_TRIALS} trials "
               f"({TOO_FEW_TRIALS})</sup>") if few else "<br><sup>error bars: std over trials</sup>"
    state = "oversubscribed" if workers * threads > cpus[0] else "undersubscribed"
    fig.update_layout(
        template=_TEMPLATE, barmode="group",
        title=f"Per-stage p99 - {workers}x{threads} ({state}, {cpus[0]} cores), model {model}, batch {batch}{wait}"
              f"{caption}",
        xaxis={"title": "pipeline stage"},
        yaxis={"title": "mean p99 over trials (ms)", "rangemode": "tozero"},
        legend={"title": "policy"},
    )
    return fig


def _error_bars(rows):
    """Plotly ``error_y`` for the rows' ``ci_low``/``ci_high``, and each interval as text for the hover.

    The text is :func:`~tuna_lab.analysis.stats.format_interval`'s. An
    unbounded or missing interval (too few trials) draws no bar (plotly cannot draw infinity).
    """
    if "ci_low" not in rows.columns:
        return None, ["not computed"] * len(rows)
    low, high, mid = (rows[c].to_numpy(float) for c in ("ci_low", "ci_high", "speedup"))
    finite = np.isfinite(low) & np.isfinite(high)
    text = [format_interval(lo, hi) for lo, hi in zip(low, high, strict=True)]
    return ({"type": "data", "symmetric": False, "array": np.where(finite, high - mid, np.nan),
             "arrayminus": np.where(finite, mid - low, np.nan), "color": "black", "thickness": 1}, text)


def speedup_bars(summary, *, group=None, baseline=None):
    """Average speedups of the policies over the baselines within groups, on a log axis with 1 marked.

    Parameters
    ----------
    summary : pandas.DataFrame
        The output of :func:`tuna_lab.analysis.speedup_summary`.
    group : str, optional
        The grouping to draw (a value of the ``group`` column, e.g.
        ``"subscription+model+batch"``); default the finest one present.
    baseline : str, optional
        Draw only the speedups over this baseline; default all of them.

    Returns
    -------
    plotly.graph_objects.Figure
        One marker trace per ``policy vs baseline`` pair; x = the groups
        (``"over / small / 100"``); y on a log axis (a speedup of 2 and one
        of 1/2 lie as far from 1), a dashed line marks speedup 1. Error bars
        are the summary's 95% intervals (``ci_low``, ``ci_high``) where they
        are finite; the hover says when one is unbounded or there are too
        few trials for one. Markers, not bars: a bar on a log axis has no
        zero to stand on, and its length would mean nothing.

    Raises
    ------
    AnalysisError
        If the table is malformed or the selection is empty.

    Examples
    --------
    >>> import pandas as pd
    >>> summary = pd.DataFrame({"baseline": "cfs", "policy": "tuna-scatter", "group": "subscription",
    ...     "subscription": ["over", "under"], "n": 2, "speedup": [1.2, 1.1]})
    >>> fig = speedup_bars(summary)
    >>> fig.data[0].name, list(fig.data[0].x)
    ('tuna-scatter vs cfs', ['over', 'under'])
    """
    check_table(summary, "summary", ("baseline", "policy", "group", "n", "speedup"), numeric=("speedup",))
    if baseline is not None:
        summary = summary[summary["baseline"].eq(baseline)]
        if summary.empty:
            raise AnalysisError(f"no speedups over baseline {baseline!r} in the summary")
    groups = list(pd.unique(summary["group"]))
    if group is None:
        group = max(groups, key=lambda g: 0 if g == "all" else g.count("+") + 1)
    elif group not in groups:
        raise AnalysisError(f"group {group!r} is not in the summary (have: {', '.join(map(str, groups))})")
    rows = summary[summary["group"].eq(group)]
    columns = [] if group == "all" else group.split("+")
    missing = [c for c in columns if c not in rows.columns]
    if missing:
        raise AnalysisError(f"summary has no column(s) {', '.join(missing)} for group {group!r}")
    label = (rows[columns].astype(str).agg(" / ".join, axis=1) if columns
             else pd.Series("all", index=rows.index))
    rows = rows.assign(_label=label)
    colors = _colors(rows["policy"].unique())
    pairs = rows[["baseline", "policy"]].drop_duplicates()
    dashes = {b: i for i, b in enumerate(pd.unique(pairs["baseline"]))}

    fig = go.Figure()
    for b, policy in pairs.itertuples(index=False):
        sel = rows[rows["baseline"].eq(b) & rows["policy"].eq(policy)]
        error, interval = _error_bars(sel)
        fig.add_trace(go.Scatter(
            x=sel["_label"], y=sel["speedup"], name=f"{policy} vs {b}", customdata=list(zip(sel["n"], interval)),
            error_y=error, mode="markers",
            marker={"color": colors[policy], "size": 11,
                    "symbol": ["circle", "diamond", "square", "triangle-up"][dashes[b] % 4]},
            hovertemplate=f"{policy} vs {b}<br>%{{x}}: %{{y:.2f}}x over %{{customdata[0]}} applications"
                          "<br>95% interval %{customdata[1]}<extra></extra>"))
    fig.add_hline(y=1, line_dash="dash", line_color="grey")
    fig.update_layout(
        template=_TEMPLATE, scattermode="group",
        title=f"Average p99 speedup by {group.replace('+', ' x ')}"
              + (" (95% intervals from the trials)" if "ci_low" in rows.columns else ""),
        xaxis={"title": " / ".join(columns) if columns else ""},
        yaxis={"title": "mean speedup (baseline p99 / policy p99), log scale; dashed: 1", "type": "log"},
        legend={"title": "policy vs baseline"},
    )
    return fig


def verdict(speedup, low, high):
    """One speedup's verdict in words: :data:`FASTER`, :data:`SLOWER`, :data:`NO_DIFFERENCE` or too few trials.

    Parameters
    ----------
    speedup, low, high : float
        A speedup (baseline p99 / policy p99: above 1 the policy is
        faster) and its interval; a NaN side means there is none.

    Returns
    -------
    str
        ``"faster"`` when the whole interval lies above 1, ``"slower"``
        below 1, ``"no difference shown"`` when it holds 1, and
        :data:`~tuna_lab.analysis.stats.TOO_FEW_TRIALS` without an interval:
        never a verdict from the value alone.

    Examples
    --------
    >>> verdict(1.4, 1.1, 1.8), verdict(0.7, 0.5, 0.9), verdict(1.2, 0.9, 1.6)
    ('faster', 'slower', 'no difference shown')
    >>> verdict(3.0, float("nan"), float("nan"))
    'too few trials for an interval'
    """
    if not np.isfinite(speedup) or np.isnan(low) or np.isnan(high):
        return TOO_FEW_TRIALS
    return FASTER if low > 1 else SLOWER if high < 1 else NO_DIFFERENCE


def verdict_table(scenarios, baseline="cfs"):
    """Each application's speedup of every policy over ``baseline``, its interval and its :func:`verdict`.

    Parameters
    ----------
    scenarios : pandas.DataFrame
        :func:`~tuna_lab.analysis.stats.scenario_stats`' output (with ``std_p99`` and ``n_trials``).
    baseline : str, default "cfs"

    Returns
    -------
    pandas.DataFrame
        One row per application and policy: the application's keys,
        ``baseline``, ``policy``, ``n`` (1), ``speedup``, ``ci_low``,
        ``ci_high`` (the interval ``compare_policies`` gives that one
        application) and ``verdict``.

    Examples
    --------
    >>> import pandas as pd
    >>> scen = pd.DataFrame({"workers": 4, "threads": 4, "cpus": 32, "model": "medium", "batch": 100,
    ...     "policy": ["cfs", "tuna-scatter"], "mean_p99": [0.2, 0.1], "std_p99": 0.01, "n_trials": 5})
    >>> verdict_table(scen)[["policy", "speedup", "verdict"]].values.tolist()
    [['tuna-scatter', 2.0, 'faster']]
    """
    scenarios = with_defaults(scenarios)
    keys = tuple(c for c in ("machine",) if c in scenarios.columns) + APPLICATION
    out = speedup_summary(scenarios, baselines=(baseline,), by=(keys,))
    out = out[np.isfinite(out["speedup"])].reset_index(drop=True).drop(columns="group")
    out["verdict"] = [verdict(*r) for r in out[["speedup", "ci_low", "ci_high"]].to_numpy(float)]
    return out


#: How a factor's value is named in a verdict: each part says what it is ("batch 100", not a bare "100").
_NAMED = {"model": "model {}", "batch": "batch {}", "subscription": "{}subscribed", "machine": "on {}"}


def _where(row, columns):
    """``"2x2, model small, batch 100"``: an application (or a summary's group) in a few words."""
    parts = [f"{row['workers']}x{row['threads']}"] if {"workers", "threads"} <= set(columns) else []
    parts += [_NAMED.get(c, "{}").format(row[c]) for c in columns
              if c not in ("workers", "threads", "cpus", "wait_policy", "spincount") and c in row and pd.notna(row[c])]
    parts += [f"wait policy {row['wait_policy']}"] if row.get("wait_policy", "default") not in ("default", None) else []
    return ", ".join(parts) or "all"


def verdict_text(table, baseline=None):
    """What a table of speedups shows, in one or two sentences: the verdict under a figure of them.

    Parameters
    ----------
    table : pandas.DataFrame
        :func:`verdict_table`'s output, or rows of
        :func:`~tuna_lab.analysis.stats.speedup_summary` (``baseline``,
        ``policy``, ``speedup``, ``ci_low``, ``ci_high``; the rows drawn).
    baseline : str, optional
        Keep only the speedups over this baseline.

    Returns
    -------
    str
        Which policy was faster or slower than which baseline where, with
        its speedup and interval; how many showed no difference (their
        interval holds 1) and how many had too few trials. When every
        interval holds 1 it says that no policy's p99 differed (it speaks of
        p99, never of the policies as a whole: another quantity may still
        separate them). With five or more intervals it recalls that about 1
        in 20 clears 1 by chance, counting only the comparisons that have an
        interval (:func:`~tuna_lab.analysis._verdicts.p99_counts`, the count
        the first sentence uses too).

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"baseline": "cfs", "policy": ["round-robin", "tuna-scatter"], "workers": 2,
    ...     "threads": 2, "speedup": [1.1, 1.5], "ci_low": [0.8, 1.2], "ci_high": [1.5, 1.9]})
    >>> verdict_text(t)
    'tuna-scatter faster than cfs at 2x2: 1.50x [1.20, 1.90]. No difference shown in the other 1 of 2 (interval holds 1).'
    >>> verdict_text(t.assign(ci_low=0.9))
    "No policy's p99 differed from cfs's: both intervals hold 1."
    >>> verdict_text(t.assign(ci_low=0.9).head(1))
    "No policy's p99 differed from cfs's: its interval holds 1."
    """
    check_table(table, "speedups", ("baseline", "policy", "speedup"), numeric=("speedup",))
    if baseline is not None:
        table = table[table["baseline"].eq(baseline)]
    table = table[np.isfinite(table["speedup"].to_numpy(float))]
    if table.empty:
        return "No speedup to judge."
    low = table["ci_low"] if "ci_low" in table.columns else pd.Series(np.nan, index=table.index)
    high = table["ci_high"] if "ci_high" in table.columns else pd.Series(np.nan, index=table.index)
    words = [verdict(s, lo, hi) for s, lo, hi in zip(table["speedup"], low, high, strict=True)]
    table = table.assign(_verdict=words, _low=low, _high=high)
    where_columns = [c for c in table.columns if c in APPLICATION + ("subscription", "machine")]
    bases = " and ".join(f"{b}'s" for b in map(str, pd.unique(table["baseline"])))
    n = len(table)
    counts = table["_verdict"].value_counts()
    no_diff, few = int(counts.get(NO_DIFFERENCE, 0)), int(counts.get(TOO_FEW_TRIALS, 0))
    if few == n:
        return (f"No verdict: {TOO_FEW_TRIALS} (fewer than {MIN_INTERVAL_TRIALS} trials of a policy) "
                + ("in the one speedup." if n == 1 else f"in all {n} speedups."))
    if no_diff + few == n:
        # Of p99 only: the first sentence may have just said that migrations separate the same policies.
        held = ("its interval holds 1." if n == 1 else "both intervals hold 1." if n == 2
                else f"all {n} intervals hold 1.")
        text = f"No policy's p99 differed from {bases}: " + (held if not few else
                                                             f"{no_diff} of {n} intervals "
                                                             f"{'holds' if no_diff == 1 else 'hold'} 1, "
                                                             f"and {few} had {TOO_FEW_TRIALS}.")
        return text
    said = []
    for row in table[table["_verdict"].isin([FASTER, SLOWER])].to_dict("records"):
        where = _where(row, where_columns)
        said.append(f"{row['policy']} {row['_verdict']} than {row['baseline']}"
                    + ("" if where == "all" else f" at {where}")
                    + f": {row['speedup']:.2f}x {format_interval(row['_low'], row['_high'])}")
    shown = "; ".join(said[:4]) + (f"; and {len(said) - 4} more" if len(said) > 4 else "") + "."
    rest = []
    if no_diff:
        rest.append(f"No difference shown in the other {no_diff} of {n} (interval holds 1)")
    if few:
        rest.append(f"{few} had {TOO_FEW_TRIALS}")
    text = shown + ((" " + "; ".join(rest) + ".") if rest else "")
    k, m, _ = p99_counts(low, high)
    if m >= 5:
        # How often chance alone (every policy the same, each interval missing 1 with probability 5%)
        # gives at least this many: a rough guard against reading the one interval in twenty that misses.
        # Only the comparisons with an interval can clear 1 (one count with the first sentence's).
        chance = sum(math.comb(m, i) * 0.05**i * 0.95 ** (m - i) for i in range(k, m + 1))
        of = f"{k} of {m}" if m == n else f"{k} of the {m} with an interval"
        text += (f" At 95% each, chance alone clears 1 about once in 20: {of} would happen by chance "
                 f"{chance:.0%} of the time" + (", so read them with care." if chance > 0.05 else "."))
    return text


def race_verdict(table):
    """Whether a tune's race separated its winner, in one sentence (the verdict under :func:`race_rounds`).

    Parameters
    ----------
    table : pandas.DataFrame
        ``TuneResult.table``: one row per candidate, best first, with ``candidate``, ``rate``,
        ``rate_low`` and ``rate_high`` (requests/s).

    Returns
    -------
    str
        The winner is separated when its lower bound is at or above every
        other candidate's upper bound; else the sentence names the rival
        whose upper bound reaches highest.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"candidate": ["1x1 rr", "2x1 cfs"], "rate": [16.0, 8.0],
    ...                   "rate_low": [0.0, 0.0], "rate_high": [17.0, float("inf")]})
    >>> print(race_verdict(t))
    Not separated: 2x1 cfs (8.0 requests/s [0.0, inf]) may be as fast as the winner 1x1 rr (16.0 requests/s [0.0, 17.0]): its upper bound reaches above the winner's lower bound.
    """
    check_table(table, "tune table", ("candidate", "rate", "rate_low", "rate_high"),
                numeric=("rate", "rate_low", "rate_high"))
    top = table.iloc[0]
    said = f"{top['rate']:.1f} requests/s {format_interval(top['rate_low'], top['rate_high'], 1)}"
    if len(table) == 1:
        return f"One candidate, {top['candidate']}: {said}; nothing to separate it from."
    others = table.iloc[1:]
    rival = others.loc[others["rate_high"].idxmax()]
    rival_said = f"{rival['rate']:.1f} requests/s {format_interval(rival['rate_low'], rival['rate_high'], 1)}"
    if top["rate_low"] >= rival["rate_high"]:
        return (f"Separated: the winner {top['candidate']} ({said}) is at least as fast as every other "
                f"candidate's upper bound (the highest, {rival['candidate']}: {rival_said}).")
    return (f"Not separated: {rival['candidate']} ({rival_said}) may be as fast as the winner "
            f"{top['candidate']} ({said}): its upper bound reaches above the winner's lower bound.")


def paired_trials(trials_stats, policies=None):
    """Each trial's p99 under every policy, one line per (configuration, trial): the trials paired.

    A trial runs every policy once, in a random order, back to back; joining
    its p99s shows whether a policy wins in every trial or on average only
    (one outlier can make an average speedup).

    Parameters
    ----------
    trials_stats : pandas.DataFrame
        One row per (configuration, policy, trial) with ``workers``,
        ``threads``, ``policy``, ``trial`` and ``p99`` (seconds), as
        :func:`tuna_lab.analysis.trial_stats` or ``Result.trials`` give.
    policies : sequence of str, optional
        The policies and their order on the x axis; default as they appear.

    Returns
    -------
    plotly.graph_objects.Figure
        One panel per configuration ``W x T``; x = the policy, y = p99 (ms).

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"workers": 2, "threads": 2, "policy": ["cfs", "tuna-scatter"] * 2,
    ...                   "trial": [0, 0, 1, 1], "p99": [0.107, 0.074, 0.075, 0.078]})
    >>> fig = paired_trials(t)
    >>> [(tr.name, list(tr.y)) for tr in fig.data]
    [('2x2 trial 1', [107.0, 74.0]), ('2x2 trial 2', [75.0, 78.0])]
    """
    from plotly.subplots import make_subplots

    check_table(trials_stats, "trials", ("workers", "threads", "policy", "trial", "p99"), numeric=("p99",))
    order = list(policies) if policies is not None else list(pd.unique(trials_stats["policy"]))
    configs = sorted(set(zip(trials_stats["workers"], trials_stats["threads"])))
    fig = make_subplots(rows=1, cols=len(configs), shared_yaxes=False,
                        subplot_titles=[f"W={w} x T={t}" for w, t in configs])
    for col, (w, t) in enumerate(configs, start=1):
        cell = trials_stats[trials_stats["workers"].eq(w) & trials_stats["threads"].eq(t)]
        for trial, sel in cell.groupby("trial", sort=True):
            sel = sel.set_index("policy").reindex(order).dropna(subset=["p99"])
            fig.add_trace(go.Scatter(x=list(sel.index), y=(sel["p99"] * _MS).round(6).tolist(),
                                     mode="lines+markers", name=f"{w}x{t} trial {int(trial) + 1}",
                                     line={"color": _PALETTE[int(trial) % len(_PALETTE)]},
                                     hovertemplate="%{x}: p99 %{y:.1f} ms<extra>trial " + str(int(trial) + 1)
                                     + "</extra>"), row=1, col=col)
    fig.update_layout(template=_TEMPLATE, title="p99 per trial, paired: one line per trial",
                      height=340, margin={"l": 60, "r": 20, "t": 60, "b": 40})
    fig.update_yaxes(title_text="p99 (ms)", row=1, col=1, rangemode="tozero")
    return fig


_STATUS_COLORS = {"in race": _PALETTE[0], "winner": _PALETTE[2], "dropped": "rgb(170, 170, 170)"}


def race_rounds(history, sla_p99=None):
    """A tune's race as it narrows: each candidate's best rate within the target, with its interval, per round.

    Parameters
    ----------
    history : pandas.DataFrame
        ``TuneResult.history`` (:func:`tuna_lab.measure.tune.tuner.tune`): one row
        per (round, candidate) with ``rate``, ``rate_low``, ``rate_high``
        (requests/s; ``inf`` when no step has missed the target yet) and
        ``status`` (``in race``, ``dropped``).
    sla_p99 : float, optional
        The p99 target (seconds), for the title.

    Returns
    -------
    plotly.graph_objects.Figure
        One panel per round; y = the candidates, x = the rate, a bar from the
        lower to the upper bound. A candidate dropped in an earlier round is
        grey; an upper bound still unknown (no step missed) is drawn to the
        panel's edge and marked with an arrow.

    Examples
    --------
    >>> import pandas as pd
    >>> h = pd.DataFrame({"round": [1, 1, 2, 2], "candidate": ["1x1 cfs", "2x1 cfs"] * 2,
    ...                   "rate": [20.0, 9.0, 21.0, 9.0], "rate_low": [15.0, 6.0, 19.0, 6.0],
    ...                   "rate_high": [30.0, 12.0, 24.0, 12.0],
    ...                   "status": ["in race", "in race", "in race", "dropped"]})
    >>> fig = race_rounds(h, sla_p99=0.05)
    >>> last = fig.data[-1]                  # the best candidate at the top (plotly draws y from the bottom)
    >>> last.name, list(last.y), list(last.x)
    ('round 2', ['2x1 cfs', '1x1 cfs'], [9.0, 21.0])
    """
    from plotly.subplots import make_subplots

    check_table(history, "history", ("round", "candidate", "rate", "rate_low", "rate_high", "status"),
                numeric=("rate", "rate_low", "rate_high"))
    rounds = sorted(history["round"].unique())
    # Candidates from best to worst by their last estimate: the winner on top.
    last = history[history["round"] == rounds[-1]].sort_values("rate")
    order = list(last["candidate"]) + [c for c in pd.unique(history["candidate"]) if c not in set(last["candidate"])]
    finite = history["rate_high"].replace(np.inf, np.nan)
    edge = float(np.nanmax([finite.max(), history["rate"].max(), 1.0])) * 1.15
    fig = make_subplots(rows=1, cols=len(rounds), shared_yaxes=True, shared_xaxes=True,
                        subplot_titles=[f"after round {r}" for r in rounds])
    for col, rnd in enumerate(rounds, start=1):
        rows = history[history["round"] == rnd].set_index("candidate").reindex(order).dropna(subset=["rate"])
        high = rows["rate_high"].where(np.isfinite(rows["rate_high"]), edge)
        colors = [_STATUS_COLORS.get(s, _PALETTE[0]) for s in rows["status"]]
        symbols = ["triangle-right" if not np.isfinite(h) else "circle" for h in rows["rate_high"]]
        intervals = [format_interval(lo, hi, 1) for lo, hi in zip(rows["rate_low"], rows["rate_high"], strict=True)]
        fig.add_trace(go.Scatter(
            x=rows["rate"].round(6).tolist(), y=list(rows.index), mode="markers", name=f"round {rnd}",
            marker={"color": colors, "symbol": symbols, "size": 9}, customdata=intervals,
            error_x={"type": "data", "symmetric": False, "array": (high - rows["rate"]).round(6).tolist(),
                     "arrayminus": (rows["rate"] - rows["rate_low"]).round(6).tolist(), "thickness": 1.5},
            hovertemplate="%{y}: %{x:.1f} requests/s, interval %{customdata}<extra></extra>", showlegend=False),
            row=1, col=col)
    target = f" within a p99 of {sla_p99 * _MS:g} ms" if sla_p99 else ""
    fig.update_layout(template=_TEMPLATE, title=f"the race: best rate{target}, interval per round (grey: dropped)",
                      height=max(260, 40 + 24 * len(order)), margin={"l": 160, "r": 20, "t": 70, "b": 40})
    fig.update_xaxes(title_text="requests/s", range=[0, edge])
    return fig


def mechanism_bars(table):
    """The scheduler's evidence per policy, one panel per quantity, bars with their 95% intervals.

    Parameters
    ----------
    table : pandas.DataFrame
        :func:`tuna_lab.analysis.mechanism.mechanism_table`'s output.

    Returns
    -------
    plotly.graph_objects.Figure
        One panel per recorded quantity of
        :data:`~tuna_lab.analysis.mechanism.MECHANISM` (in its unit), one bar
        per policy (x: the policy, or ``"WxT model batch"`` with several
        applications); error bars where the interval is finite, and the
        interval written by :func:`~tuna_lab.analysis.stats.format_interval`
        in the hover. A quantity not recorded gets no panel: the title
        names it and says why.

    Examples
    --------
    >>> import pandas as pd
    >>> from tuna_lab.analysis.mechanism import mechanism_table
    >>> trials = pd.DataFrame({"workers": 2, "threads": 1, "cpus": 2, "model": "small", "batch": 10,
    ...     "policy": ["cfs", "cfs", "tuna-scatter", "tuna-scatter"], "trial": [0, 1, 0, 1],
    ...     "p99": 0.02, "run_delay_per_request": [0.004, 0.005, 0.001, 0.0012]})
    >>> fig = mechanism_bars(mechanism_table(trials))
    >>> [(t.name, list(t.y)) for t in fig.data]
    [('cfs', [4.5]), ('tuna-scatter', [1.1])]
    """
    from plotly.subplots import make_subplots

    from .mechanism import MECHANISM

    check_table(table, "mechanism table", ("policy", "evidence", "mean", "ci_low", "ci_high", "note"),
                numeric=("mean", "ci_low", "ci_high"))
    check_table(table, "mechanism table", ("workers", "threads", "cpus", "model", "batch"))
    apps = _config_labels(table) + " " + table["model"].astype(str) + " " + table["batch"].astype(str)
    table = table.assign(_x=(apps + " " if apps.nunique() > 1 else "") + table["policy"])
    drawn = [e for e in MECHANISM if table.loc[table["evidence"].eq(e.column), "note"].eq("").any()]
    missing = [e.label for e in MECHANISM if e not in drawn]
    fig = make_subplots(rows=1, cols=max(len(drawn), 1), subplot_titles=[
        e.label + (f" ({e.unit})" if e.unit else "") for e in drawn] or ["nothing recorded"])
    colors = _colors(table["policy"].unique())
    for col, evidence in enumerate(drawn, start=1):
        rows = table[table["evidence"].eq(evidence.column) & table["note"].eq("")]
        for policy in ordered(rows["policy"].unique(), POLICIES):
            sel = rows[rows["policy"].eq(policy)]
            mean, low, high = (sel[c].to_numpy(float) * evidence.scale for c in ("mean", "ci_low", "ci_high"))
            finite = np.isfinite(low) & np.isfinite(high)
            text = [format_interval(lo, hi) for lo, hi in zip(low, high, strict=True)]
            fig.add_trace(go.Bar(
                x=sel["_x"].tolist(), y=mean.round(9).tolist(), name=policy, legendgroup=policy, showlegend=col == 1,
                marker={"color": colors[policy]}, customdata=text,
                error_y={"type": "data", "symmetric": False, "array": np.where(finite, high - mean, np.nan),
                         "arrayminus": np.where(finite, mean - low, np.nan), "color": "black", "thickness": 1},
                hovertemplate=f"{policy}: %{{y:.3g}} {evidence.unit}<br>95% interval %{{customdata}}<extra></extra>"),
                row=1, col=col)
    fig.update_layout(template=_TEMPLATE, height=360, legend={"title": "policy"},
                      margin={"l": 60, "r": 20, "t": 90 if missing else 70, "b": 40},
                      title="Scheduler evidence per policy (mean over trials, 95% intervals)"
                            + (f"<br><sup>not recorded: {', '.join(missing)}</sup>" if missing else ""))
    fig.update_yaxes(rangemode="tozero")
    return fig
