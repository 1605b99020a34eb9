"""The anatomy of the tail: what the slowest requests waited on, per policy, from per-request scheduler evidence.

The lab server reads its serving threads' scheduler counters at the start and
end of every request and sends the deltas in its ``Server-Timing`` header;
the load generator stores them per request (``rq_wait_main``,
``backlog_seconds`` and the rest of
:data:`~tuna_lab.measure.schema.REQUEST_SCHED_COLUMNS`). Here the latency a
client saw (``client_seconds``) of a trial's slowest 1% of requests, and of
its median requests, is split into four parts:

* **waiting for a CPU** - the run-queue wait of the thread that served the
  request (runnable, not running: ``rq_wait_main``);
* **running** - that thread's on-CPU time (``cpu_main``);
* **waiting in the backlog** - from the client's send to the worker's start
  of the request (``backlog_seconds``: the accept queue, the transfer, the
  worker's read);
* **the rest** - everything else: the thread blocked or slept (waiting for
  its OpenMP team at a barrier - the team's own run-queue wait is in
  ``rq_wait`` - or for I/O), the answer's way back, the client's own delay.

Each share is the part's sum over the group's requests divided by their
summed latency, per trial; per policy it is the mean over the valid trials
with the interval every p99 gets (:func:`~tuna_lab.analysis.stats.scenario_stats`:
95%, on the log scale, none below :data:`~tuna_lab.analysis.stats.MIN_INTERVAL_TRIALS`
trials) and is written the one way (:func:`~tuna_lab.analysis.stats.format_interval`).
:func:`what_moves` says which share differs most between policies, and
whether their intervals are apart. :func:`probe_cost` measures what the
server's reads cost per request.

Examples
--------
>>> import numpy as np, pandas as pd
>>> rng = np.random.default_rng(1)
>>> n = 400
>>> def trials(policy, wait, run):
...     lat = rng.uniform(0.01, 0.02, n)
...     return pd.DataFrame({"policy": policy, "trial": np.arange(n) % 3, "status": 200,
...                          "client_seconds": lat, "cpu_main": run * lat, "rq_wait_main": wait * lat,
...                          "backlog_seconds": 0.1 * lat})
>>> table = anatomy(pd.concat([trials("cfs", 0.3, 0.5), trials("tuna-scatter", 0.05, 0.6)]))
>>> tail = table[(table["group"] == TAIL) & (table["part"] == "cpu_wait")]
>>> [round(float(s), 2) for s in tail["share"]]
[0.3, 0.05]
>>> moved = what_moves(table).iloc[0]
>>> moved["group"], moved["part"], bool(moved["apart"])
('slowest 1%', 'cpu_wait', True)
"""

from __future__ import annotations

import re
import threading
import time

import numpy as np
import pandas as pd

from ..errors import AnalysisError
from ..machine.sched import MIGRATIONS_NOTE, KeptCounters
from ..placement import POLICIES
from .stats import MACHINE, format_interval, scenario_stats
from .tables import APPLICATION, sort_table, valid_trials

__all__ = ["PARTS", "TAIL", "MEDIAN", "NOT_RECORDED", "anatomy", "what_moves", "anatomy_line", "anatomy_lines",
           "anatomy_note", "anatomy_notes", "probe_cost"]

#: The parts of a request's latency: column -> label. ``rest`` is what the other three leave.
PARTS = {"cpu_wait": "waiting for a CPU", "running": "running", "backlog": "waiting in the backlog",
         "rest": "the rest"}
#: The groups of requests, per trial: its slowest 1% (at or above its p99) and its median requests.
TAIL, MEDIAN = "slowest 1%", "median"
#: Why a share is missing: the requests carry no per-request scheduler evidence.
NOT_RECORDED = ("not recorded: these requests carry no per-request scheduler evidence (results recorded before "
                "the lab server sent its threads' counters with each answer, or a server that sends none in its "
                "Server-Timing header)")
# The median requests: those between these quantiles of their trial's latency.
_MEDIAN_BAND = (0.45, 0.55)
_TAIL_Q = 0.99
_SOURCES = {"cpu_wait": "rq_wait_main", "running": "cpu_main", "backlog": "backlog_seconds"}
_COLUMNS = ["policy", "group", "part", "label", "trials", "requests", "share", "ci_low", "ci_high", "note"]


def _keys(requests):
    keys = [c for c in (MACHINE, *APPLICATION) if c in requests.columns]
    return keys


def _groups(trial):
    """``{group: bool mask}`` of one trial's ok requests by latency."""
    lat = trial["client_seconds"].to_numpy(float)
    tail = lat >= np.quantile(lat, _TAIL_Q)
    low, high = np.quantile(lat, _MEDIAN_BAND)
    median = (lat >= low) & (lat <= high)
    return {TAIL: tail, MEDIAN: median}


def _trial_shares(requests, keys):
    """One row per (keys, policy, trial, group, part): the part's share of the group's summed latency."""
    rows = []
    for key, trial in requests.groupby(keys + ["policy", "trial"], sort=False, observed=True):
        for group, mask in _groups(trial).items():
            chosen = trial[mask]
            total = chosen["client_seconds"].sum()
            shares, known = {}, 0.0
            for part, column in _SOURCES.items():
                values = chosen[column] if column in chosen.columns else pd.Series(np.nan, index=chosen.index)
                # A part counts only where every request of the group has it: a partly sent header is no share.
                shares[part] = values.sum() / total if values.notna().all() and total > 0 else np.nan
                known += 0.0 if np.isnan(shares[part]) else shares[part]
            recorded = not np.isnan(shares["cpu_wait"]) and not np.isnan(shares["running"])
            # Clock granularity can make the parts overshoot a fast request by microseconds: the rest is >= 0.
            shares["rest"] = max(0.0, 1.0 - known) if recorded else np.nan
            for part, share in shares.items():
                rows.append((*key, group, part, min(share, 1.0), int(mask.sum())))
    return pd.DataFrame(rows, columns=keys + ["policy", "trial", "group", "part", "share", "requests"])


def anatomy(requests, trials=None, confidence=0.95):
    """Per application and policy, the shares of the slowest 1% and the median requests' latency.

    Parameters
    ----------
    requests : pandas.DataFrame
        The per-request table (``policy``, ``trial``, ``status``,
        ``client_seconds``, ``cpu_main`` and the per-request scheduler columns
        where recorded; the application's keys where present).
    trials : pandas.DataFrame, optional
        The trial table: only its valid trials count (as everywhere).
    confidence : float, default 0.95

    Returns
    -------
    pandas.DataFrame
        One row per application, policy, group (:data:`TAIL`, :data:`MEDIAN`)
        and part (:data:`PARTS`): ``label``, ``trials``, ``requests`` (per
        trial, on average), ``share`` (mean over trials, 0-1), ``ci_low``,
        ``ci_high`` (NaN with too few trials; ``[0, 0]`` when every trial had
        0) and ``note`` (``""``, or why the share is missing: then ``share``
        is NaN, never 0).

    Raises
    ------
    AnalysisError
        A table that is not a frame, or misses ``policy``, ``trial`` or
        ``client_seconds``, or has no successful request.
    """
    if not isinstance(requests, pd.DataFrame):
        raise AnalysisError(f"anatomy needs the request table (a DataFrame), not {type(requests).__name__}")
    missing = [c for c in ("policy", "trial", "client_seconds") if c not in requests.columns]
    if missing:
        raise AnalysisError(f"the request table lacks the column(s) {', '.join(missing)}")
    keys = _keys(requests)
    ok = requests["client_seconds"].notna()
    if "status" in requests.columns:
        ok &= requests["status"].between(200, 299)
    work = requests[ok]
    if trials is not None and len(trials):
        tk = [c for c in keys + ["policy", "trial"] if c in trials.columns]
        valid = trials.loc[valid_trials(trials), tk].drop_duplicates()
        work = work.merge(valid, on=tk, how="inner")
    if not len(work):
        raise AnalysisError("no successful request to take apart")
    per = _trial_shares(work, keys)
    # scenario_stats keys on the whole application: a hand-made table without some keys gets stand-ins
    # (the wait factors get their defaults there).
    filled = {k: "" if k == "model" else 0 for k in ("workers", "threads", "cpus", "model", "batch")
              if k not in keys}
    parts = []
    for (group, part), sub in per.groupby(["group", "part"], sort=False):
        scen = scenario_stats(sub.assign(**filled, p99=sub["share"]), confidence=confidence)
        zero = scen["mean_p99"].eq(0) & scen["std_p99"].fillna(0).eq(0)
        counts = sub.groupby(keys + ["policy"], observed=True)["requests"].mean().rename("requests").reset_index()
        scen = scen.assign(ci_low=scen["ci_low"].mask(zero, 0.0), ci_high=scen["ci_high"].mask(zero, 0.0).clip(
            upper=1.0)).merge(counts, on=keys + ["policy"], how="left")
        parts.append(scen[keys + ["policy", "n_trials", "requests", "mean_p99", "ci_low", "ci_high"]].assign(
            group=group, part=part))
    out = pd.concat(parts, ignore_index=True).rename(columns={"n_trials": "trials", "mean_p99": "share"})
    out["label"] = out["part"].map(PARTS)
    out["note"] = np.where(out["share"].isna(), NOT_RECORDED, "")
    # Backlog missing alone (no server start time): the rest then holds it, and says so.
    out.loc[out["part"].eq("rest") & out["share"].notna(), "note"] = ""
    out["_g"] = out["group"].map({TAIL: 0, MEDIAN: 1})
    out["_p"] = out["part"].map({p: i for i, p in enumerate(PARTS)})
    out = sort_table(out, keys + ["_g", "_p", "policy"])
    return out[keys + _COLUMNS]


def what_moves(table):
    """Per application and group, the share that differs most between policies.

    Returns
    -------
    pandas.DataFrame
        One row per application and group: ``part``, ``label``, ``low`` and
        ``high`` (the policies with the smallest and largest share), their
        shares and ``apart`` (their intervals do not overlap and the shares
        differ as written, to the percent; False without intervals). Empty
        when fewer than two policies have shares.
    """
    keys = [c for c in table.columns if c in (MACHINE, *APPLICATION)]
    rows = []
    recorded = table[table["share"].notna()]
    for key, sub in recorded.groupby(keys + ["group"], sort=False, observed=True):
        best = None
        for part, one in sub.groupby("part", sort=False):
            if one["policy"].nunique() < 2:
                continue
            lo, hi = one.loc[one["share"].idxmin()], one.loc[one["share"].idxmax()]
            # Apart only where the intervals are and the shares read differently: never 100% vs 100% "apart".
            apart = bool(lo["ci_high"] < hi["ci_low"]) and _percent(lo["share"]) != _percent(hi["share"])
            spread = hi["share"] - lo["share"]
            if best is None or spread > best[0]:
                best = (spread, part, lo, hi, apart)
        if best is None:
            continue
        spread, part, lo, hi, apart = best
        key = key if isinstance(key, tuple) else (key,)
        rows.append((*key, part, PARTS[part], lo["policy"], lo["share"], lo["ci_low"], lo["ci_high"],
                     hi["policy"], hi["share"], hi["ci_low"], hi["ci_high"], apart))
    columns = keys + ["group", "part", "label", "low", "low_share", "low_ci_low", "low_ci_high", "high",
                      "high_share", "high_ci_low", "high_ci_high", "apart"]
    return pd.DataFrame(rows, columns=columns)


def _pct(share, low, high):
    """A share and its interval, both in percent and to the same precision.

    :func:`~tuna_lab.analysis.stats.format_interval` keeps two significant
    digits of a side below 0.5 (a positive bound never reads as 0): the share
    gets the same rule, or 0.19% would read "0% [0.16, 0.22]".

    Examples
    --------
    >>> _pct(0.19, 0.16, 0.23), _pct(0.0019, 0.0016, 0.0022)
    ('19% [16, 23]', '0.19% [0.16, 0.22]')
    """
    interval = format_interval(low * 100, high * 100, digits=0)
    return f"{_percent(share)}% {interval}"


def _percent(share):
    """A share as a number of percent: whole, or two significant digits below 0.5% (as the intervals)."""
    value = share * 100
    return f"{value:.2g}" if 0 < abs(value) < 0.5 else f"{value:.0f}"


def anatomy_line(table):
    """One line: what the slowest 1% of requests waited on under each policy, and which share moves.

    Examples
    --------
    >>> t = pd.DataFrame({"policy": ["cfs", "tuna-scatter"] * 4, "group": TAIL,
    ...     "part": np.repeat(list(PARTS), 2), "label": np.repeat(list(PARTS.values()), 2), "trials": 2,
    ...     "requests": 3, "share": [0.4, 0.1, 0.3, 0.5, 0.1, 0.1, 0.2, 0.3], "ci_low": np.nan,
    ...     "ci_high": np.nan, "note": ""})
    >>> print(anatomy_line(t))   # doctest: +NORMALIZE_WHITESPACE
    Anatomy of the slowest 1% (share of latency: waiting for a CPU / running / backlog, from the send until a worker
    starts the request / rest): cfs 40/30/10/20%, tuna-scatter 10/50/10/30%; no share shown to differ between
    policies: the largest gap, waiting for a CPU (tuna-scatter 10% (too few trials for an interval) vs cfs 40% (too
    few trials for an interval)), lies within what the trials can tell.
    """
    tail = table[table["group"] == TAIL]
    if not len(tail) or tail["share"].isna().all():
        return f"Anatomy of the slowest 1%: {NOT_RECORDED}."
    keys = [c for c in tail.columns if c in (MACHINE, *APPLICATION)]
    more = ""
    if keys:
        first = tail[keys].drop_duplicates()
        if len(first) > 1:
            # The report's section draws every application's line (anatomy_lines): this claim is kept true there.
            more = f" (the first of {len(first)} applications; the report has all)"
        tail = tail.merge(first.iloc[:1], on=keys)
    return _line(tail, more)


def anatomy_lines(table):
    """:func:`anatomy_line` of every application, each naming its application (the report's section).

    Returns
    -------
    list of str
        One line per application (in the table's order); a table of one
        application, or without the application's columns, gives
        ``[anatomy_line(table)]``.

    Examples
    --------
    >>> t = pd.DataFrame({"workers": np.repeat([2, 4], 8), "threads": 1, "cpus": 2, "model": "medium",
    ...     "batch": 100, "policy": ["cfs", "tuna-scatter"] * 8, "group": TAIL,
    ...     "part": np.tile(np.repeat(list(PARTS), 2), 2), "label": "", "trials": 2, "requests": 3,
    ...     "share": 0.25, "ci_low": np.nan, "ci_high": np.nan, "note": ""})
    >>> [line[:50] for line in anatomy_lines(t)]
    ['Anatomy of the slowest 1% at 2x1, model medium, ba', 'Anatomy of the slowest 1% at 4x1, model medium, ba']
    """
    tail = table[table["group"] == TAIL]
    keys = [c for c in tail.columns if c in (MACHINE, *APPLICATION)]
    if not keys or not len(tail) or tail[keys].drop_duplicates().shape[0] < 2:
        return [anatomy_line(table)]
    lines = []
    for key, one in tail.groupby(keys, sort=False, observed=True, dropna=False):
        app = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        if one["share"].isna().all():
            lines.append(f"Anatomy of the slowest 1% at {_application(app)}: {NOT_RECORDED}.")
        else:
            lines.append(_line(one, f" at {_application(app)}"))
    return lines


def _application(app):
    """``"2x1, model medium, batch 100"`` (and the wait settings and machine where they are not the default)."""
    words = []
    if "workers" in app and "threads" in app:
        words.append(f"{app['workers']}x{app['threads']}")
    words += [f"{k} {app[k]}" for k in ("model", "batch") if k in app]
    if app.get("wait_policy") not in (None, "default"):
        words.append(f"wait {app['wait_policy']}")
    if app.get("spincount") not in (None, -1):
        words.append(f"spincount {app['spincount']}")
    if app.get(MACHINE) is not None:
        words.append(f"machine {app[MACHINE]}")
    return ", ".join(map(str, words)) or "this application"


def _line(tail, more):
    """The line of one application's slowest 1% (``more``: what follows "the slowest 1%" in it)."""
    per = []
    for policy in [p for p in POLICIES if p in set(tail["policy"])] + sorted(set(tail["policy"]) - set(POLICIES)):
        one = tail[tail["policy"] == policy].set_index("part")["share"]
        per.append(f"{policy} " + "/".join("-" if np.isnan(one.get(p, np.nan)) else f"{one[p] * 100:.0f}"
                                            for p in PARTS) + "%")
    line = (f"Anatomy of the slowest 1%{more} (share of latency: waiting for a CPU / running / backlog, from the "
            "send until a worker starts the request / rest): " + ", ".join(per))
    moved = what_moves(tail)
    if len(moved):
        m = moved.iloc[0]
        low = _pct(m["low_share"], m["low_ci_low"], m["low_ci_high"])
        high = _pct(m["high_share"], m["high_ci_low"], m["high_ci_high"])
        if m["apart"]:
            return line + (f"; moves most between policies: {m['label']} ({m['low']} {low} vs {m['high']} {high}, "
                           "intervals apart).")
        if _percent(m["low_share"]) == _percent(m["high_share"]):
            return line + ("; no share differs between policies: each reads the same, to the percent, under every "
                           "policy.")
        gap = f"{m['label']} ({m['low']} {low} vs {m['high']} {high})"
        # A smaller gap may still be apart: said, or the line would claim that nothing differs.
        apart = [r for part in PARTS for r in what_moves(tail[tail["part"].eq(part)]).to_dict("records")
                 if r["apart"]]
        if not apart:
            return line + (f"; no share shown to differ between policies: the largest gap, {gap}, lies within what "
                           "the trials can tell.")
        r = max(apart, key=lambda r: r["high_share"] - r["low_share"])
        line += (f"; the largest gap, {gap}, lies within what the trials can tell, but {r['label']} differs between "
                 f"policies ({r['low']} {_pct(r['low_share'], r['low_ci_low'], r['low_ci_high'])} vs {r['high']} "
                 f"{_pct(r['high_share'], r['high_ci_low'], r['high_ci_high'])}, intervals apart)")
    return line + "."


def anatomy_note(requests, trials=None, say_why=False):
    """:func:`anatomy_line` of results whose requests carry the per-request evidence; ``""`` otherwise.

    For the summaries (``run``'s, ``demo``'s): results recorded before the
    requests carried the evidence, or of a server that sends none, get no
    line. With ``say_why`` (the report's section) they get one that says why
    there is no anatomy (:data:`NOT_RECORDED`, or what the analysis refused),
    never a blank.

    Examples
    --------
    >>> anatomy_note(pd.DataFrame({"policy": ["cfs"], "trial": [0], "client_seconds": [0.1]}))
    ''
    >>> anatomy_note(pd.DataFrame({"policy": ["cfs"], "trial": [0], "client_seconds": [0.1]}), say_why=True)[:53]
    'Not shown, not recorded: these requests carry no per-'
    """
    table, why = _recorded(requests, trials)
    if why:
        return why if say_why else ""
    line = anatomy_line(table)
    sampled = _sampled(trials)
    if sampled and not line.endswith(f"{NOT_RECORDED}."):
        # A server with no hook (run --pid): its evidence is an estimate, and the line must say how it was got.
        line = (f"{line[:-1]}; the scheduler's counters {sampled} and split among the requests in flight "
                "(a server with no per-request hook).")
    return line


def anatomy_notes(requests, trials=None):
    """The report's anatomy: :func:`anatomy_lines` (one per application), or the one line saying why there is none.

    :func:`anatomy_note` with ``say_why``, but every application's line: the
    summaries show the first and say "the report has all"; here they are.

    Examples
    --------
    >>> anatomy_notes(pd.DataFrame({"policy": ["cfs"], "trial": [0], "client_seconds": [0.1]}))[0][:26]
    'Not shown, not recorded: t'
    """
    table, why = _recorded(requests, trials)
    if why:
        return [why]
    lines = anatomy_lines(table)
    sampled = _sampled(trials)
    if sampled:
        # As anatomy_note: an estimate must say how it was got (once, after the lines).
        lines.append(f"The scheduler's counters were {sampled} and split among the requests in flight (a server "
                     "with no per-request hook).")
    return lines


def _recorded(requests, trials):
    """``(anatomy table, "")`` of requests that carry the per-request evidence, or ``(None, why there is none)``."""
    if not isinstance(requests, pd.DataFrame) or "rq_wait_main" not in requests.columns \
            or not requests["rq_wait_main"].notna().any():
        return None, f"Not shown, {NOT_RECORDED}: a new `tuna-lab run` records it."
    try:
        return anatomy(requests, trials), ""
    except AnalysisError as exc:
        return None, f"Not shown: {exc}"


def _sampled(trials):
    """``"sampled at N Hz"`` (the rates, joined) where a trial's requests got sampled evidence; ``""`` otherwise.

    Examples
    --------
    >>> _sampled(pd.DataFrame({"sched_evidence": ["sampled at 100 Hz", "", "sampled at 100 Hz"]}))
    'sampled at 100 Hz'
    >>> _sampled(None), _sampled(pd.DataFrame({"policy": ["cfs"]}))
    ('', '')
    """
    if not isinstance(trials, pd.DataFrame) or "sched_evidence" not in trials.columns:
        return ""
    found = sorted({m for text in trials["sched_evidence"].dropna().astype(str)
                    for m in re.findall(r"sampled at [0-9.e+]+ Hz", text)})
    return " and ".join(found)


def probe_cost(threads=2, requests=2000, server_cpu=None):
    """What the lab server's per-request reads of its threads' scheduler counters cost, in CPU.

    Runs, ``requests`` times, what a worker does per request: two readings
    of ``threads`` threads (this one and ``threads - 1`` idle ones, as an
    OpenMP team between requests) on kept descriptors, their delta and the
    header's text.

    Parameters
    ----------
    threads : int
        The serving threads (the calling thread and its team).
    requests : int
    server_cpu : float, optional
        The server's CPU seconds per request (say the median ``cpu_main +
        cpu_openmp`` of a trial): the cost is then also given as its share.

    Returns
    -------
    dict
        ``seconds_per_request`` (CPU of this thread), ``threads``,
        ``migrations`` (whether the kernel counts them), and ``share`` of
        ``server_cpu`` where given.
    """
    from ..server.app import sched_delta, sched_timing   # the worker's own functions, timed as it runs them

    if threads < 1 or requests < 1:
        raise AnalysisError("probe_cost needs threads >= 1 and requests >= 1")
    stop = threading.Event()
    team = [threading.Thread(target=stop.wait, daemon=True) for _ in range(threads - 1)]
    for t in team:
        t.start()
    kept = KeptCounters()
    try:
        tids = [threading.get_native_id(), *(t.native_id for t in team)]
        me = tids[0]
        kept.read(tids)     # the descriptors are opened once per worker, not per request
        start = time.thread_time()
        for _ in range(requests):
            before = kept.read(tids)
            delta = sched_delta(before, kept.read(tids), me)
            sched_timing(0.01, 0.01, delta)
        seconds = (time.thread_time() - start) / requests
    finally:
        stop.set()
        kept.close()
        for t in team:
            t.join()
    out = {"seconds_per_request": seconds, "threads": threads, "migrations": MIGRATIONS_NOTE is None}
    if server_cpu:
        out["share"] = seconds / server_cpu
    return out
