"""The report's tables: p99 per application, policy comparisons, average speedups, CPU cost, NUMA locality.

Each returns the HTML of one table with its note (:func:`~tuna_lab.analysis._html.table`); every interval
is written by :func:`estimate` (:func:`~tuna_lab.analysis.stats.format_interval`'s way).
:mod:`~tuna_lab.analysis.report` lays them out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..errors import AnalysisError
from ..placement import POLICIES
from ._html import esc as _esc, fmt as _fmt, table as _table
from .stats import MACHINE, compare_policies, cpu_cost, format_interval
from .summary import front_note
from .tables import ordered

__all__ = ["BASELINES", "scenario_table", "comparisons", "estimate", "interval", "speedup_table", "one_row_per_cell",
           "cpu_table", "locality_table", "slot_names"]

#: The baselines every policy is compared with, in this order.
BASELINES = ("cfs", "round-robin")
_BASELINES = BASELINES


def scenario_table(scenarios):
    cell = interval(scenarios["mean_p99"] * 1e3, scenarios["ci_low"] * 1e3, scenarios["ci_high"] * 1e3)
    label = scenarios["workers"].astype(str) + "x" + scenarios["threads"].astype(str)
    table = scenarios.assign(configuration=label, cell=cell.to_numpy())
    index = [MACHINE] * (MACHINE in scenarios.columns) + ["model", "batch", "configuration", "cpus", "subscription",
                                                          "wait_policy", "spincount"]
    wide = table.pivot_table(index=index, columns="policy", values="cell", aggfunc="first", sort=False)
    wide = wide[ordered(wide.columns, POLICIES)].reset_index()
    wide.columns.name = None
    return _table(wide, "Mean over valid trials of each trial's p99 of server-side runtime; "
                        "[95% interval, on the log scale: never below zero]; '-' where a policy was not run.")


def comparisons(scenarios, single=False):
    """Every policy against each baseline present: p99 ratio and speedup (``single``: of one application)."""
    present = ordered(scenarios["policy"].unique(), POLICIES)
    rows = []
    for baseline in (b for b in _BASELINES if b in present):
        earlier = _BASELINES[:_BASELINES.index(baseline)]   # e.g. cfs vs round-robin is shown once
        for policy in (p for p in present if p != baseline and p not in earlier):
            try:
                r = compare_policies(scenarios, baseline, policy)
            except AnalysisError:
                continue
            rows.append({"policy": policy, "baseline": baseline, "applications": r["n_applications"],
                         "p99 ratio": r["ratio"], "ratio low": r["ci_low"], "ratio high": r["ci_high"],
                         "speedup": r["speedup"], "speedup low": r["speedup_ci_low"],
                         "speedup high": r["speedup_ci_high"]})
    if not rows:
        return '<p class="note">No policy ran alongside cfs or round-robin.</p>'
    table = pd.DataFrame(rows)
    out = table[["policy", "baseline", "applications"]].assign(**{
        "p99 ratio (policy / baseline)": interval(table["p99 ratio"], table["ratio low"],
                                                   table["ratio high"]),
        "speedup": interval(table["speedup"], table["speedup low"], table["speedup high"]),
    })
    return _table(out, "Ratio of the policy's mean p99 to the baseline's, each averaged over the applications both "
                       "ran (the slowest weigh most), and the speedup (its reciprocal); [95% interval from the "
                       "trials' spread, on the log scale: the speedup's is the reciprocal of the ratio's]."
                       + (" With one application, these speedups are also the averages over applications, so no "
                          "table of averages follows." if single else " The averages below take each "
                          "application's speedup first, as the article does: the two may differ, even in direction."))


def estimate(value, low, high, digits=2):
    """``"v [lo, hi]"``: the value and :func:`~tuna_lab.analysis.stats.format_interval`; ``"v"`` without one."""
    if not np.isfinite(value):
        return "-"
    interval = format_interval(low, high, digits)
    return f"{value:.{digits}f}" + (f" {interval}" if interval else "")


def interval(value, low, high, digits=2):
    """:func:`estimate` of every row."""
    return pd.Series([estimate(v, lo, hi, digits) for v, lo, hi in zip(value, low, high, strict=True)],
                     index=getattr(value, "index", None), dtype=object)


def speedup_table(summary, baseline):
    rows = summary[summary["baseline"].eq(baseline)]
    if rows.empty or rows["speedup"].notna().sum() == 0:
        return (f'<p class="note">No speedups over {_esc(baseline)}: '
                "it did not run alongside another policy.</p>")
    columns = [c for c in ("subscription", "model", "batch") if c in rows.columns]
    label = rows[columns].astype("string").fillna("").agg(" / ".join, axis=1).str.strip(" /")
    rows, label = one_row_per_cell(rows, label)
    cell = interval(rows["speedup"], rows["ci_low"], rows["ci_high"]) + " (n=" + rows["n"].astype(str) + ")"
    table = rows.assign(grouping=rows["group"], group_value=label.replace("", "all"), cell=cell.to_numpy())
    wide = table.pivot_table(index=["grouping", "group_value"], columns="policy", values="cell",
                             aggfunc="first", sort=False)
    wide = wide[ordered(wide.columns, POLICIES)].reset_index().rename(columns={"group_value": "group"})
    wide.columns.name = None
    return _table(wide, f"Mean over applications of ({baseline} mean p99) / (policy mean p99) [95% interval]; "
                        "above 1 the policy is faster; n = applications averaged. A grouping that splits the "
                        "applications as a coarser one does (a factor of one value) is not shown: its rows would "
                        "be that one's again.")


def one_row_per_cell(rows, label):
    """``rows`` (and labels) less each grouping that splits the applications as a coarser one does: its rows again.

    A grouping's rows average the same applications as a coarser grouping's
    (fewer of the factors subscription, model, batch; "all" has none) when
    it has no more groups than that one: the model and batch of one value
    make "subscription+model+batch" the rows of "subscription" again.

    Examples
    --------
    >>> rows = pd.DataFrame({"group": ["all", "subscription", "subscription", "subscription+model+batch",
    ...                                "subscription+model+batch", "model"]})
    >>> label = pd.Series(["", "over", "under", "over / medium / 100", "under / medium / 100", "medium"])
    >>> one_row_per_cell(rows, label)[0]["group"].tolist()
    ['all', 'subscription', 'subscription']
    """
    counts = label.groupby(rows["group"]).nunique().to_dict()
    counts.setdefault("all", 1)

    def factors(group):
        return frozenset() if group == "all" else frozenset(str(group).split("+"))

    repeated = {g for g in counts if g != "all"
                and any(factors(h) < factors(g) and counts[h] >= counts[g] for h in counts)}
    keep = ~rows["group"].isin(repeated)
    return rows[keep], label[keep]


def cpu_table(trials):
    try:
        cost = cpu_cost(trials)
    except AnalysisError:
        return '<p class="note">No CPU accounting in these results (they were recorded before it was added).</p>'
    label = cost["workers"].astype(str) + "x" + cost["threads"].astype(str)
    table = pd.DataFrame({
        **({"machine": cost[MACHINE]} if MACHINE in cost.columns else {}),
        "model": cost["model"], "batch": cost["batch"], "configuration": label, "wait_policy": cost["wait_policy"],
        "spincount": cost["spincount"],
        "policy": cost["policy"], "p99 ms": _fmt(cost["p99"] * 1e3, 1),
        "server CPU ms/req": _fmt(cost["cpu_per_request"] * 1e3, 2),
        # The master's, helpers' and front ends', where the trials recorded it (newer results).
        **({"front CPU ms/req": _fmt(cost["front_cpu_per_request"] * 1e3, 2)}
           if cost["front_cpu_per_request"].notna().any() else {}),
        "generator CPU ms/req": _fmt(cost["generator_cpu_per_request"] * 1e3, 2),
        "main CPU ms/req": _fmt(cost["cpu_main_per_request"] * 1e3, 2),
        "OpenMP CPU ms/req": _fmt(cost["cpu_openmp_per_request"] * 1e3, 2),
        "main idle share": _fmt(cost["idle_cpu_share_main"], 2),
        "OpenMP idle share": _fmt(cost["idle_cpu_share_openmp"], 2),
        "cores busy": _fmt(cost["cores_busy"], 2), "trials": cost["trials"]})
    note = front_note(trials)
    return _table(table, "Server CPU: CPU time of every worker thread per ok request, sampled during the load "
                         "(schedstat, else utime+stime). Front CPU: the same for the master, its helpers and "
                         "front ends (the server's CPU that is not its workers'; the whole server's is the sum). "
                         "Generator CPU: the load generator's own CPU time (user + "
                         "sys) per request sent - what measuring cost; on CPUs shared with the server it was "
                         "taken from the policy under test ('-': recorded before it was measured). Idle share: the part of a role's CPU time spent while its worker had "
                         "no request in flight - OpenMP threads spinning between requests, or the main thread "
                         "in Gunicorn's accept/parse/write loop. Cores busy: server CPU-seconds per second of "
                         "load. A lower p99 bought with many more busy cores only burns them.") + (
        f'\n<p class="note"><strong>{_esc(note)}</strong></p>' if note else "")


def locality_table(requests, threads):
    machine = [MACHINE] if MACHINE in threads.columns and MACHINE in requests.columns else []
    run = machine + ["cell", "policy", "trial", "pid"]
    workers = threads.drop_duplicates(run)
    ok = requests[requests["status"].eq(200)]
    p99 = (ok.groupby(run, observed=True)["server_seconds"].quantile(0.99)
           .rename("worker_p99").reset_index()) if "cell" in ok.columns else None
    if p99 is not None:
        workers = workers.merge(p99, on=run, how="left")
    else:
        workers = workers.assign(worker_p99=np.nan)
    table = (workers.groupby(machine + ["cell", "policy", "slot"], dropna=False, observed=True)
             .agg(node=("numa_node", "first"), locality=("numa_locality", "mean"),
                  worker_p99=("worker_p99", "mean"), trials=("trial", "nunique")).reset_index())
    table = table.assign(locality=_fmt(table["locality"], 3), worker_p99=_fmt(table["worker_p99"] * 1e3, 1),
                         slot=slot_names(table["slot"], workers))
    return _table(table.rename(columns={"cell": "application", "slot": "worker", "worker_p99": "worker p99 ms"}),
                  "Locality: share of a worker's resident pages (/proc/PID/numa_maps) on the NUMA node its "
                  "main thread runs on, read after the load; 1 on a single-node machine.")


def slot_names(slots, workers):
    """A worker by its slot number (``0``, not ``0.0``); a process of no slot (the master) by its role."""
    roles = workers.loc[workers["slot"].isna(), "role"].dropna().unique() if "role" in workers.columns else []
    return slots.map(lambda v: str(int(v)) if pd.notna(v) else "/".join(map(str, roles)) or "not a worker")
