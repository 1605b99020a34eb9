"""A run's summary as DataFrames: the tables ``tuna-lab run``, ``demo`` and ``report --json`` print.

:func:`summarize` reduces a run's ``requests`` and ``trials`` (a
:class:`~tuna_lab.measure.experiment.Result`, or the two tables as
:func:`~tuna_lab.measure.store.load_results` reads them) to a :class:`RunSummary`:
one row per policy (mean p50/p99, the p99 speedup over cfs, CPU per
request), each policy's p99 speedup over cfs with its 95% interval, the
headline averages over cfs and round-robin (the report's), the CPU cost per
application and policy, and the failed trials. The command line prints these
tables; a notebook gets the same numbers as frames. :func:`scale_note` is the
line ``run`` and ``demo`` print on a machine too small for the article's
effect.

Examples
--------
>>> from tuna_lab.measure import load_results
>>> requests, trials, _ = load_results("notebooks/data/sweep-2cpu")   # the sweep notebook 08 reads
>>> summarize(requests, trials).headline[["baseline", "policy", "applications"]].values.tolist()  # doctest: +NORMALIZE_WHITESPACE
[['cfs', 'round-robin', 10], ['cfs', 'tuna-scatter', 10],
 ['round-robin', 'cfs', 10], ['round-robin', 'tuna-scatter', 10]]
"""

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..errors import AnalysisError, TunaError
from ._verdicts import p99_counts
from .anatomy import anatomy_note
from .mechanism import evidence_notes, has_evidence, mechanism_correlations, mechanism_lines, mechanism_table
from .stats import (MIN_INTERVAL_TRIALS, TOO_FEW_TRIALS, compare_policies, cpu_cost, format_interval, scenario_stats,
                    speedup_summary, trial_stats)
from .tables import APPLICATION, valid_trials

__all__ = ["RunSummary", "summarize", "scope_sentence", "fault_note", "balance_note", "front_note", "scale_note",
           "demo_opening", "ARTICLE_MIN_CPUS"]

#: Below this many usable CPUs a run cannot show the article's effect (the article measured 32 logical CPUs).
ARTICLE_MIN_CPUS = 16

# The policy the per-policy speedups compare with, as the article does.
_BASELINE = "cfs"
# Columns of each table, also when it is empty (a run whose trials all failed).
_SPEEDUP_COLUMNS = ["policy", "baseline", "speedup", "ci_low", "ci_high"]
_HEADLINE_COLUMNS = ["baseline", "policy", "applications", "speedup", "geomean"]
_FAILED_COLUMNS = ["policy", "trial", "reason"]
# Per-policy CPU columns, shown when the run recorded them.
_POLICY_CPU = ("cpu_per_request", "front_cpu_per_request", "idle_cpu_share_openmp", "generator_cpu_per_request")
# What names one application in the CPU table, in this order, where present.
_CPU_KEYS = ("machine", "workers", "threads", "cpus", "model", "batch", "wait_policy", "spincount", "policy")


@dataclass(frozen=True)
class RunSummary:
    """What a run (or a sweep) comes to, as DataFrames.

    Attributes
    ----------
    summary : pandas.DataFrame
        One row per policy over its successful trials: ``policy``, ``trials``,
        ``p50`` and ``p99`` (means, seconds), ``p99_speedup_vs_cfs`` (cfs's
        mean p99 over the policy's; NaN without cfs) and, when recorded,
        ``cpu_per_request`` (the workers'), ``front_cpu_per_request`` (the
        master's, helpers' and front ends'), ``idle_cpu_share_openmp`` and
        ``generator_cpu_per_request``.
    speedups : pandas.DataFrame
        Each other policy's p99 speedup over cfs with its 95% interval
        (:func:`~tuna_lab.analysis.stats.compare_policies`: on the log scale,
        never below zero): ``policy``, ``baseline``, ``speedup``, ``ci_low``,
        ``ci_high``. Empty when too few trials succeeded to compare.
    headline : pandas.DataFrame
        Each policy's average p99 speedup over cfs and round-robin over all
        applications (:func:`~tuna_lab.analysis.stats.speedup_summary`):
        ``baseline``, ``policy`` (``machine`` for each machine of a sweep on a
        cluster), ``applications``, ``speedup`` and ``geomean``.
    cpu : pandas.DataFrame
        Per application and policy: the application's keys, ``p99``,
        ``server_cpu_per_request`` (every worker thread, per ok request),
        ``front_cpu_per_request`` (the master, helpers and front ends, per
        ok request), ``generator_cpu_per_request`` (the load generator's,
        per request sent) - NaN for results recorded before it was - and
        ``trials``. Empty when the results have no CPU accounting.
    failed : pandas.DataFrame
        The trials not counted: ``policy``, ``trial`` (from 0), ``reason``.
    notes : tuple of str
        Lines about how the trials were measured that a reader must know:
        :func:`fault_note`, when a worker was replaced or a master restarted
        during some trial; :func:`balance_note`, when the load of some trial
        did not reach every worker; :func:`front_note`, when the master, helpers and
        front ends used a large share of the workers' CPU.
    same_placement : dict
        ``{policy: other}`` for a policy whose plan is the same as the
        baseline's or an earlier policy's (the same ``sha256`` in the
        manifest's ``plans``): its trials measured that placement again,
        and it is reported as "same placement", never as a ratio.
    mechanism : pandas.DataFrame
        The scheduler's evidence per application and policy, with intervals
        (:func:`~tuna_lab.analysis.mechanism.mechanism_table`); empty for
        results recorded before it was.
    correlations : pandas.DataFrame
        How each quantity of the evidence relates to p99 across the trials
        (:func:`~tuna_lab.analysis.mechanism.mechanism_correlations`); empty
        as ``mechanism``.
    anatomy : str
        What the slowest 1% of requests waited on under each policy, in one
        line (:func:`~tuna_lab.analysis.anatomy.anatomy_note`); ``""`` for
        requests without per-request scheduler evidence.
    scope : str
        What these trials can and cannot tell, in one sentence
        (:func:`scope_sentence`): the first thing ``run`` and ``demo`` say.
    verdict : str
        The speedups' verdict in words
        (:func:`~tuna_lab.analysis.figures.verdict_text`): which policy was
        faster or slower than cfs, or that none differed; ``""`` without speedups.
    """

    summary: pd.DataFrame
    speedups: pd.DataFrame
    headline: pd.DataFrame
    cpu: pd.DataFrame
    failed: pd.DataFrame
    notes: tuple = ()
    same_placement: dict = field(default_factory=dict)
    mechanism: pd.DataFrame = field(default_factory=pd.DataFrame)
    correlations: pd.DataFrame = field(default_factory=pd.DataFrame)
    anatomy: str = ""
    scope: str = ""
    verdict: str = ""

    def to_dict(self):
        """Every table as a list of plain rows (``tuna-lab run --json`` and ``report --json`` print them).

        A headline row not about one machine has no ``machine`` key; NaN stays NaN.

        Examples
        --------
        >>> import pandas as pd
        >>> trials = pd.DataFrame({"policy": ["cfs"], "trial": 0, "trial_status": "ok", "p50": 0.01, "p99": 0.02})
        >>> summarize(None, trials).to_dict()["summary"]
        [{'policy': 'cfs', 'trials': 1, 'p50': 0.01, 'p99': 0.02, 'p99_speedup_vs_cfs': 1.0}]
        """
        out = {name: getattr(self, name).to_dict("records") for name in ("summary", "speedups", "cpu", "failed",
                                                                          "mechanism", "correlations")}
        out["notes"] = list(self.notes)
        out["anatomy"] = self.anatomy
        out["scope"], out["verdict"] = self.scope, self.verdict
        out["same_placement"] = dict(self.same_placement)
        out["headline"] = [{k: v for k, v in row.items() if k != "machine" or isinstance(v, str)}
                           for row in self.headline.to_dict("records")]
        return out

    def to_text(self):
        """The per-policy table and the speedup lines, as ``tuna-lab run`` and ``demo`` print them (ms).

        Examples
        --------
        >>> import pandas as pd
        >>> trials = pd.DataFrame({"policy": ["cfs", "tuna-scatter"], "trial": 0, "trial_status": "ok",
        ...                        "p50": [0.010, 0.008], "p99": [0.030, 0.020]})
        >>> print(summarize(None, trials).to_text())
        policy           p50 ms   p99 ms   p99 speedup vs cfs
        cfs                10.0     30.0                1.00x
        tuna-scatter        8.0     20.0                1.50x
        <BLANKLINE>
        """
        same = self.same_placement
        return (_summary_table(self.summary, same) + "\n"
                + "\n".join([*(_speedup_line(r) if r["policy"] not in same else
                                f"{r['policy']} vs {r['baseline']}: same placement as {same[r['policy']]} "
                                "(the plans are identical: no speedup to report)"
                                for _, r in self.speedups.iterrows()), *self.notes]))

    def mechanism_text(self):
        """The scheduler's evidence per policy and its relation to p99, as ``run`` and ``demo`` print it.

        :func:`~tuna_lab.analysis.mechanism.mechanism_lines`, then the
        anatomy of the tail in one line (:attr:`anatomy`); ``""`` for results
        recorded before the evidence was. The commands print it after the
        speedups and the line on the machine's scale.

        Examples
        --------
        >>> import pandas as pd
        >>> summarize(None, pd.DataFrame({"policy": ["cfs"], "trial": 0, "trial_status": "ok",
        ...                               "p50": 0.01, "p99": 0.02})).mechanism_text()
        ''
        """
        lines = mechanism_lines(self.mechanism, self.correlations) if len(self.mechanism) else []
        return "\n".join([*lines, *([self.anatomy] if self.anatomy else [])])


def summarize(requests, trials=None, plans=None):
    """The summary of a run (or of a sweep's results) as :class:`RunSummary`.

    Parameters
    ----------
    requests : pandas.DataFrame, Result or None
        The per-request table, or a :class:`~tuna_lab.measure.experiment.Result`
        (its ``requests`` and ``trials`` are used, and ``trials`` must be
        left out). None: only the trial table is summarized (no speedup
        intervals, no headline).
    trials : pandas.DataFrame
        The per-trial table.
    plans : dict, optional
        The manifest's ``plans`` (``{policy: {"sha256": ...}}``); default
        the Result's. A policy whose plan is another's is reported as "same
        placement" (:attr:`RunSummary.same_placement`).

    Returns
    -------
    RunSummary

    Raises
    ------
    AnalysisError
        No trial table, or a trial table without ``policy`` and ``trial_status``.

    Examples
    --------
    >>> import pandas as pd
    >>> trials = pd.DataFrame({"policy": ["cfs", "cfs", "round-robin"], "trial": [0, 1, 0],
    ...                        "trial_status": ["ok", "failed", "ok"], "reason": ["", "timeouts", ""],
    ...                        "p50": [0.01, None, 0.01], "p99": [0.03, None, 0.02]})
    >>> s = summarize(None, trials)
    >>> s.summary[["policy", "trials", "p99_speedup_vs_cfs"]].values.tolist()
    [['cfs', 1, 1.0], ['round-robin', 1, 1.5]]
    >>> s.failed.to_dict("records")
    [{'policy': 'cfs', 'trial': 1, 'reason': 'timeouts'}]
    """
    manifest = getattr(requests, "manifest", None)
    if plans is None and manifest is not None:
        plans = manifest.get("plans")
    if trials is None and hasattr(requests, "trials"):
        requests, trials = requests.requests, requests.trials
    if not isinstance(trials, pd.DataFrame):
        raise AnalysisError(f"summarize needs the trial table (a DataFrame), not {type(trials).__name__}")
    if len(trials) and not {"policy", "trial_status"} <= set(trials.columns):
        raise AnalysisError("the trial table needs the columns policy and trial_status")
    have_requests = isinstance(requests, pd.DataFrame) and len(requests)
    speedups = (_speedups(requests, trials, _BASELINE) if have_requests else
                pd.DataFrame(columns=_SPEEDUP_COLUMNS))
    return RunSummary(summary=_policy_rows(trials, _BASELINE),
                      speedups=speedups, scope=scope_sentence(trials, speedups), verdict=_verdict(speedups),
                      headline=_headline(requests, trials) if have_requests else
                      pd.DataFrame(columns=_HEADLINE_COLUMNS),
                      cpu=_cpu_rows(trials), failed=_failed(trials),
                      notes=tuple(line for line in (fault_note(trials), balance_note(trials), front_note(trials))
                                  if line),
                      anatomy=anatomy_note(requests if have_requests else None, trials),
                      same_placement=_same_placement(plans, trials),
                      **_mechanism(trials, evidence_notes(manifest)))


def _mechanism(trials, notes):
    """``{"mechanism": ..., "correlations": ...}`` of results with scheduler evidence; ``{}`` (empty) otherwise."""
    if not has_evidence(trials):
        return {}
    try:
        return {"mechanism": mechanism_table(trials, notes), "correlations": mechanism_correlations(trials, notes)}
    except TunaError:
        # A trial table without its application's keys (hand-made): the per-policy table says what ran.
        return {}


def _same_placement(plans, trials):
    """``{policy: other}``: each policy whose plan's sha256 is the baseline's or an earlier policy's.

    Examples
    --------
    >>> trials = pd.DataFrame({"policy": ["cfs", "round-robin", "tuna-scatter"]})
    >>> _same_placement({"round-robin": {"sha256": "a"}, "tuna-scatter": {"sha256": "a"}}, trials)
    {'tuna-scatter': 'round-robin'}
    """
    if not plans or not len(trials) or "policy" not in trials.columns:
        return {}
    order = sorted(set(trials["policy"]), key=lambda p: (p != _BASELINE, p))
    first, same = {}, {}
    for policy in order:
        digest = (plans.get(policy) or {}).get("sha256")
        if digest is None:
            continue
        if digest in first:
            same[policy] = first[digest]
        else:
            first[digest] = policy
    return same


def _counted(n, word):
    """``"1 trial"``, ``"3 trials"``; a range of counts as ``"2-3 trials"`` (``n`` a (low, high) pair)."""
    low, high = (n, n) if isinstance(n, int) else n
    amount = f"{low}" if low == high else f"{low}-{high}"
    return f"{amount} {word}{'' if high == 1 else 's'}"


def _span(values):
    """``(low, high)`` of integer ``values``; ``None`` when there are none."""
    values = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    return (int(values.min()), int(values.max())) if len(values) else None


def _separated_evidence(trials, baseline):
    """``(label, separated, compared)`` of the scheduler's quantity that separates most comparisons, or None."""
    from .mechanism import SEPARATED, separation

    if not has_evidence(trials):
        return None
    try:
        sep = separation(trials, baseline)
    except TunaError:
        return None
    sep = sep[sep["measure"].ne("p99")]
    if sep.empty:
        return None
    counts = sep.assign(_s=sep["state"].eq(SEPARATED)).groupby("label", sort=False)["_s"].agg(["sum", "size"])
    best = counts["sum"].idxmax()
    return (best, int(counts.loc[best, "sum"]), int(counts.loc[best, "size"])) if counts["sum"].max() else None


def scope_sentence(trials, speedups, baseline=_BASELINE):
    """What these trials can and cannot tell, in one sentence, from the data: how many, and what they resolve.

    Parameters
    ----------
    trials : pandas.DataFrame
        The trial table (its valid trials are counted).
    speedups : pandas.DataFrame
        :attr:`RunSummary.speedups`: ``speedup``, ``ci_low``, ``ci_high``.
    baseline : str, default "cfs"

    Returns
    -------
    str
        How many valid trials of how many requests per policy, on how many
        CPUs; then what they are enough for (a quantity of the scheduler's
        evidence whose intervals separate a policy from ``baseline``'s, or
        p99) and what they are too few for: p99s closer than the narrowest
        speedup interval's half-width (an interval is ``value */ factor``,
        so a speedup nearer 1 than ``factor`` cannot exclude 1). Below
        :data:`~tuna_lab.analysis.stats.MIN_INTERVAL_TRIALS` trials it says
        that there is no interval. ``""`` without valid trials or speedups.

    Examples
    --------
    >>> import pandas as pd
    >>> trials = pd.DataFrame({"workers": 2, "threads": 2, "cpus": 2, "model": "medium", "batch": 100,
    ...     "policy": ["cfs"] * 3 + ["tuna-scatter"] * 3, "trial": [0, 1, 2] * 2, "trial_status": "ok",
    ...     "n": 50, "p99": [0.03, 0.02, 0.032, 0.022, 0.031, 0.021]})
    >>> sp = pd.DataFrame({"policy": ["tuna-scatter"], "baseline": "cfs", "speedup": [1.1],
    ...                    "ci_low": [0.8], "ci_high": [1.5]})
    >>> print(scope_sentence(trials, sp))  # doctest: +NORMALIZE_WHITESPACE
    3 trials x 50 requests per policy on 2 CPUs: too few to separate p99s closer than 37%
    (the narrowest p99 speedup interval is [0.80, 1.50]).
    >>> few = sp.assign(ci_low=float("nan"), ci_high=float("nan"))
    >>> print(scope_sentence(trials[trials["trial"] < 2], few))  # doctest: +NORMALIZE_WHITESPACE
    2 trials x 50 requests per policy on 2 CPUs: too few for an interval (it takes 3 trials of a policy),
    so they cannot tell whether any policy differed from cfs.
    """
    if not len(trials) or not len(speedups) or "policy" not in trials.columns:
        return ""
    valid = trials[valid_trials(trials)]
    if valid.empty:
        return ""
    keys = [c for c in ("machine", *APPLICATION) if c in valid.columns]
    counts = valid.groupby([*keys, "policy"], dropna=False, observed=True).size()
    apps = len(valid[keys].drop_duplicates()) if keys else 1
    per = "per policy" + (f" and application ({apps} applications)" if apps > 1 else "")
    size = _span(valid["n"]) if "n" in valid.columns else None
    cpus = _span(valid["cpus"]) if "cpus" in valid.columns else None
    head = (_counted(_span(counts), "trial") + (f" x {_counted(size, 'request')}" if size else "") + f" {per}"
            + (f" on {_counted(cpus, 'CPU')}" if cpus else ""))
    low, high = (pd.to_numeric(speedups[c], errors="coerce").to_numpy(float) for c in ("ci_low", "ci_high"))
    bounded = np.isfinite(low) & np.isfinite(high) & (low > 0)
    if not bounded.any():
        return (f"{head}: too few for an interval (it takes {MIN_INTERVAL_TRIALS} trials of a policy), so they "
                f"cannot tell whether any policy differed from {baseline}." + _mixed_rates(valid))
    enough = []
    evidence = _separated_evidence(trials, baseline)
    if evidence:
        label, k, m = evidence
        enough.append(f"enough to separate {label} from {baseline}'s ({k} of {m} policies)" if apps == 1 else
                      f"enough to separate {label} from {baseline}'s ({k} of {m} comparisons)")
    # One count with the verdict's (figures.verdict_text): of every comparison, saying those without an interval.
    apart, with_interval, total = p99_counts(low, high)
    if apart:
        enough.append(f"enough to separate p99 in {apart} of {total} comparisons"
                      + (f" ({total - with_interval} of them with {TOO_FEW_TRIALS})" if with_interval < total else ""))
    # An interval is value */ factor (stats.INTERVALS): a speedup within the factor of 1 cannot exclude 1.
    factor = np.sqrt(high[bounded] / low[bounded])
    i = int(np.argmin(factor))
    f = float(factor[i])
    closer = f"{f - 1:.0%}" if f < 2 else f"a factor of {f:.1f}"
    row = speedups[bounded].iloc[i]
    said = (f"too few to separate p99s closer than {closer} (the narrowest p99 speedup interval is "
            f"{format_interval(row['ci_low'], row['ci_high'])})")
    return f"{head}: " + "; ".join([*enough, said]) + "." + _mixed_rates(valid)


def _mixed_rates(valid):
    """A caveat for a tune's steps read as trials: each policy's p99 mixes the offered rates its race chose.

    Examples
    --------
    >>> _mixed_rates(pd.DataFrame({"step": [0, 1], "rate": [5.0, 80.0]}))  # doctest: +ELLIPSIS
    " These are a tune's open-loop steps at 5-80 requests/s, ..."
    >>> _mixed_rates(pd.DataFrame({"rate": [20.0, 20.0]}))
    ''
    """
    if "step" not in valid.columns or "rate" not in valid.columns:
        return ""
    rates = pd.to_numeric(valid["rate"], errors="coerce").dropna()
    if rates.nunique() < 2:
        return ""
    return (f" These are a tune's open-loop steps at {rates.min():g}-{rates.max():g} requests/s, chosen per "
            "candidate by its race: a policy's p99 here mixes those loads, so a speedup compares unlike loads; "
            "the tune's own race table (what `tuna-lab tune` printed; notebook 09 reads it) rates each candidate.")


def _verdict(speedups):
    """:func:`~tuna_lab.analysis.figures.verdict_text` of the speedups over cfs, ``""`` without any."""
    if not len(speedups):
        return ""
    from .figures import verdict_text       # plotly: imported when there is something to judge

    try:
        return verdict_text(speedups, _BASELINE)
    except TunaError:
        return ""


def demo_opening(cpus, trials=None, requests=None):
    """The demo's first sentence: what it runs and what that can and cannot tell, before it runs anything.

    From the design, not from any result: a pinning policy keeps each thread
    on its CPUs, so migrations per request separate it from cfs on any
    machine with an interval; p99 needs CPUs to spare, and on fewer than
    :data:`ARTICLE_MIN_CPUS` every placement keeps them all busy, so the
    sentence leads with migrations and says p99 may not separate the policies.

    Parameters
    ----------
    cpus : int
        The CPUs the demo may use.
    trials, requests : int, optional
        Its measurement's size; ``None`` for ``--offline`` (the mappings only).

    Examples
    --------
    >>> print(demo_opening(2, 3, 200))  # doctest: +NORMALIZE_WHITESPACE
    What this demo can tell: the Tuna mapping of this machine and of the article's; then cfs, round-robin and
    tuna-scatter measured here, 3 trials x 200 requests each - enough for an interval on migrations per request
    (moves of a thread between CPUs: the pinned policies' threads stay put, cfs's move). On 2 CPUs every
    placement keeps every CPU busy, so p99 may not separate the policies, and the article's speedups
    (32 logical CPUs) cannot show: it shows the method at work.
    >>> print(demo_opening(2))
    What this demo can tell: the Tuna mapping of this machine and of the article's (--offline: nothing is measured).
    """
    head = "What this demo can tell: the Tuna mapping of this machine and of the article's"
    if trials is None:
        return head + " (--offline: nothing is measured)."
    size = f"{_counted(trials, 'trial')} x {_counted(requests, 'request')} each"
    small = cpus < ARTICLE_MIN_CPUS
    tell = (f"too few trials for an interval (it takes {MIN_INTERVAL_TRIALS}), so no verdict on any policy"
            if trials < MIN_INTERVAL_TRIALS else
            "enough for an interval on migrations per request (moves of a thread between CPUs: the pinned "
            "policies' threads stay put, cfs's move)" + ("" if small else " and on p99, which say whether this "
                                                          "run can tell a policy's p99 from cfs's"))
    text = f"{head}; then cfs, round-robin and tuna-scatter measured here, {size} - {tell}."
    if small:
        text += (f" On {_counted(cpus, 'CPU')} every placement keeps every CPU busy, so p99 may not separate the "
                 "policies, and the article's speedups (32 logical CPUs) cannot show: it shows the method at work.")
    return text


def scale_note(cpus):
    """The one line a run on fewer than :data:`ARTICLE_MIN_CPUS` usable CPUs prints ("" on a machine large enough).

    With so few CPUs every placement keeps them all busy, so no policy can
    take work off a contended core: the run shows how the method works, not
    the article's speedups, which docs/article.md gives.

    Parameters
    ----------
    cpus : int
        The CPUs the run could use (:attr:`tuna_lab.machine.Limits.effective_cpus`,
        or a results table's ``cpus``).

    Examples
    --------
    >>> scale_note(2)  # doctest: +NORMALIZE_WHITESPACE
    "note: on 2 usable CPUs (fewer than 16) every placement saturates the CPUs, so this run demonstrates the method,
    not the article's effect; the article's numbers (32 logical CPUs) are in docs/article.md"
    >>> scale_note(32)
    ''
    """
    if cpus >= ARTICLE_MIN_CPUS:
        return ""
    return (f"note: on {cpus} usable CPU{'s' if cpus != 1 else ''} (fewer than {ARTICLE_MIN_CPUS}) every placement "
            "saturates the CPUs, so this run demonstrates the method, not the article's effect; the article's "
            "numbers (32 logical CPUs) are in docs/article.md")


def fault_note(trials):
    """One line saying how many trials had a worker replaced or the master restarted during them ("" if none).

    Such trials are never valid (:data:`~tuna_lab.measure.schema.FAULT_COLUMNS`):
    the summary leaves them out, as any failed trial, and this line says why.

    Examples
    --------
    >>> import pandas as pd
    >>> fault_note(pd.DataFrame({"policy": ["cfs", "cfs"], "workers_replaced": [0, 1], "master_restarted": 0}))
    'note: 1 of 2 trials had a worker replaced or the master restarted during it (cfs); they are not counted'
    >>> fault_note(pd.DataFrame({"policy": ["cfs"]}))
    ''
    """
    if not len(trials):
        return ""
    hit = pd.Series(False, index=trials.index)
    for column in ("workers_replaced", "master_restarted"):
        if column in trials.columns:
            hit |= pd.to_numeric(trials[column], errors="coerce").fillna(0).gt(0)
    if not hit.any():
        return ""
    policies = ", ".join(dict.fromkeys(trials.loc[hit, "policy"].astype(str)))
    return (f"note: {int(hit.sum())} of {len(trials)} trials had a worker replaced or the master restarted during "
            f"it ({policies}); they are not counted")


def balance_note(trials):
    """One line saying how many trials left a worker out of the load ("" if none): counted apart.

    Such a trial measured fewer workers than the server has (its
    ``worker_share`` is below :func:`~tuna_lab.measure.schema.fair_share`):
    it is never valid (:func:`~tuna_lab.measure.store.valid_rows`), and this
    line says how often the server gave the whole load to some workers.

    Examples
    --------
    >>> import pandas as pd
    >>> print(balance_note(pd.DataFrame({"policy": ["cfs", "tuna-scatter"], "worker_share": [0.9, 0.01]})))
    note: 1 of 2 trials left a worker out of the load (less than 25% of the busiest worker's; tuna-scatter): they measured fewer workers than the server has and are not counted
    >>> balance_note(pd.DataFrame({"policy": ["cfs"]}))
    ''
    """
    from ..measure.schema import fair_share

    if not len(trials) or "worker_share" not in trials.columns:
        return ""
    low = pd.to_numeric(trials["worker_share"], errors="coerce").lt(fair_share())
    if not low.any():
        return ""
    policies = ", ".join(dict.fromkeys(trials.loc[low, "policy"].astype(str)))
    return (f"note: {int(low.sum())} of {len(trials)} trials left a worker out of the load (less than "
            f"{fair_share():.0%} of the busiest worker's; {policies}): they measured fewer workers than the server "
            "has and are not counted")


def front_note(trials):
    """One plain line where the master, helpers and front ends used a large share of the workers' CPU ("" if not).

    Large, as ``pin`` and ``run --pid`` judge it: in some application and
    policy (the valid trials' means), at least
    :data:`~tuna_lab.live.traffic.FRONT_SHARE` of the workers' CPU per
    request and :data:`~tuna_lab.live.traffic.FRONT_FLOOR` seconds a
    trial. The line names the largest share; "" for results without the
    ``front_cpu_per_request`` column (recorded before it was) or a valid trial.

    Parameters
    ----------
    trials : pandas.DataFrame
        The trial table (:func:`~tuna_lab.analysis.stats.cpu_cost` reads it).

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"workers": 2, "threads": 1, "cpus": 2, "model": "app", "batch": 0,
    ...     "policy": ["cfs", "round-robin"], "trial": 0, "trial_status": "ok", "p99": 0.02,
    ...     "cpu_main_per_request": 0.01, "cpu_openmp_per_request": 0.0, "idle_cpu_share_main": 0.1,
    ...     "idle_cpu_share_openmp": float("nan"), "cpu_seconds": 1.0, "load_seconds": 2.0,
    ...     "cpu_per_request": 0.010, "front_cpu_per_request": [0.004, 0.001], "front_cpu_seconds": [0.4, 0.1]})
    >>> print(front_note(t))  # doctest: +NORMALIZE_WHITESPACE
    note: the master, helpers and front ends used 40% as much CPU as the workers (4.00 ms against 10.00 ms
    per request under cfs, 2x1): the server's CPU per request is the sum of the two
    >>> front_note(t.assign(front_cpu_per_request=0.0001, front_cpu_seconds=0.01))
    ''
    """
    from ..live.traffic import FRONT_FLOOR, FRONT_SHARE

    if not len(trials) or "front_cpu_per_request" not in trials.columns:
        return ""
    try:
        cost = cpu_cost(trials)
    except TunaError:
        return ""
    # No share where the workers' CPU was not measured (0 or NaN): NaN compares false below.
    share = cost["front_cpu_per_request"] / cost["cpu_per_request"].where(cost["cpu_per_request"] > 0)
    large = cost[(cost["front_cpu_seconds"] >= FRONT_FLOOR) & (share >= FRONT_SHARE)]
    if large.empty:
        return ""
    row = large.loc[share[large.index].idxmax()]
    return (f"note: the master, helpers and front ends used {share[row.name]:.0%} as much CPU as the workers "
            f"({row['front_cpu_per_request'] * 1e3:.2f} ms against {row['cpu_per_request'] * 1e3:.2f} ms per request "
            f"under {row['policy']}, {row['workers']}x{row['threads']}): the server's CPU per request is the sum "
            "of the two")


def _policy_rows(trials, baseline):
    """One row per policy: mean p50/p99 of its valid trials, the p99 speedup over ``baseline``, CPU."""
    ok = trials[valid_trials(trials)] if len(trials) else trials
    if ok.empty:
        return pd.DataFrame(columns=["policy", "trials", "p50", "p99", "p99_speedup_vs_cfs"])
    cpu = [c for c in _POLICY_CPU if c in ok.columns]
    means = ok.groupby("policy")[["p50", "p99", *cpu]].mean()
    n = ok.groupby("policy").size()
    base = means["p99"].get(baseline)
    rows = []
    for policy, row in means.iterrows():
        rows.append({"policy": policy, "trials": int(n[policy]), "p50": float(row["p50"]), "p99": float(row["p99"]),
                     "p99_speedup_vs_cfs": float(base / row["p99"]) if base is not None and row["p99"] > 0
                     else float("nan"),
                     **{c: float(row[c]) for c in cpu}})
    return pd.DataFrame(rows)


def _speedups(requests, trials, baseline):
    """Each other policy's p99 speedup over ``baseline`` with its 95% interval."""
    try:
        scen = scenario_stats(trial_stats(requests, trials))
    except TunaError:
        # Too few successful trials to compare: the per-policy table says what ran.
        return pd.DataFrame(columns=_SPEEDUP_COLUMNS)
    if baseline not in set(scen["policy"]):
        return pd.DataFrame(columns=_SPEEDUP_COLUMNS)
    rows = []
    for policy in sorted(set(scen["policy"]) - {baseline}):
        try:
            c = compare_policies(scen, baseline, policy)
        except TunaError:
            continue                    # no valid p99 of one of the two: no interval (its failed: lines say why)
        rows.append({"policy": policy, "baseline": baseline, "speedup": float(c["speedup"]),
                     "ci_low": float(c["speedup_ci_low"]), "ci_high": float(c["speedup_ci_high"])})
    return pd.DataFrame(rows, columns=_SPEEDUP_COLUMNS)


def _headline(requests, trials):
    """Each policy's average p99 speedup over cfs and round-robin, over all applications (per machine too)."""
    try:
        scenarios = scenario_stats(trial_stats(requests, trials))
    except TunaError:
        return pd.DataFrame(columns=_HEADLINE_COLUMNS)
    by = (None, "machine") if "machine" in scenarios.columns else (None,)
    try:
        summary = speedup_summary(scenarios, baselines=("cfs", "round-robin"), by=by)
    except TunaError:
        # No application with a valid p99 under a baseline and a policy (every trial of one failed): no headline,
        # and the per-policy table and the failed: lines say what ran.
        return pd.DataFrame(columns=_HEADLINE_COLUMNS)
    rows = [{"baseline": row["baseline"], "policy": row["policy"],
             **({"machine": row["machine"]} if row["group"] == "machine" else {}),
             "applications": int(row["n"]), "speedup": float(row["speedup"]), "geomean": float(row["geomean"])}
            for _, row in summary.iterrows()]
    return pd.DataFrame(rows, columns=_HEADLINE_COLUMNS[:2] + (["machine"] if len(by) > 1 else [])
                        + _HEADLINE_COLUMNS[2:])


def _cpu_rows(trials):
    """:func:`~tuna_lab.analysis.stats.cpu_cost` with the workers', the front's and the generator's CPU per request."""
    try:
        cost = cpu_cost(trials)
    except TunaError:
        return pd.DataFrame(columns=["p99", "server_cpu_per_request", "front_cpu_per_request",
                                     "generator_cpu_per_request", "trials"])
    keys = [c for c in _CPU_KEYS if c in cost.columns]
    return pd.DataFrame({**{k: cost[k] for k in keys}, "p99": cost["p99"].astype(float),
                         "server_cpu_per_request": cost["cpu_per_request"].astype(float),
                         "front_cpu_per_request": cost["front_cpu_per_request"].astype(float),
                         "generator_cpu_per_request": cost["generator_cpu_per_request"].astype(float),
                         "trials": cost["trials"].astype(int)})


def _failed(trials):
    if not len(trials):
        return pd.DataFrame(columns=_FAILED_COLUMNS)
    bad = trials[trials["trial_status"] != "ok"]
    reasons = bad["reason"] if "reason" in bad.columns else pd.Series("", index=bad.index)
    return pd.DataFrame({"policy": bad["policy"], "trial": bad["trial"].astype(int), "reason": reasons},
                        columns=_FAILED_COLUMNS).reset_index(drop=True)


def _summary_table(summary, same=None):
    """The per-policy rows as text (milliseconds); CPU columns where they were recorded.

    "server CPU" is the workers' (``cpu_per_request``), "front CPU" the
    master's, helpers' and front ends' (``front_cpu_per_request``).
    """
    if summary.empty:
        return "no successful trials"
    cpu = "cpu_per_request" in summary.columns
    # The master's, helpers' and front ends' CPU, beside the workers', where the trials recorded it.
    front = cpu and "front_cpu_per_request" in summary.columns and summary["front_cpu_per_request"].notna().any()
    gen = "generator_cpu_per_request" in summary.columns
    lines = [f"{'policy':<14}{'p50 ms':>9}{'p99 ms':>9}{'p99 speedup vs cfs':>21}"
             + (f"{'server CPU ms/req':>19}" if cpu else "") + (f"{'front CPU ms/req':>18}" if front else "")
             + (f"{'OpenMP idle':>13}" if cpu else "")
             + (f"{'generator CPU ms/req':>22}" if gen else "")]
    for _, row in summary.iterrows():
        speedup = row["p99_speedup_vs_cfs"]
        sp = "-" if pd.isna(speedup) else f"{speedup:.2f}x"
        if row["policy"] in (same or {}):
            sp = "same placement"
        line = f"{row['policy']:<14}{row['p50'] * 1e3:>9.1f}{row['p99'] * 1e3:>9.1f}{sp:>21}"
        if cpu:
            # With T=1 there is no OpenMP team, so no idle share to show (NaN).
            idle = row["idle_cpu_share_openmp"]
            line += f"{row['cpu_per_request'] * 1e3:>19.2f}"
            if front:
                value = row["front_cpu_per_request"]
                line += f"{'-':>18}" if pd.isna(value) else f"{value * 1e3:>18.2f}"
            line += f"{'-':>13}" if pd.isna(idle) else f"{idle:>13.0%}"
        if gen:
            line += f"{row['generator_cpu_per_request'] * 1e3:>22.2f}"
        lines.append(line)
    if cpu:
        # Each CPU column in words, once, under the table: its header is too short to say whose CPU it is.
        lines.append("(CPU ms/req: CPU time per request - server: the workers' threads"
                     + ("; front: the master's, its helpers' and front ends'" if front else "")
                     + "; OpenMP idle: the share of the OpenMP threads' CPU spent with no request in flight"
                     + ("; generator: the load generator's own" if gen else "") + ")")
    return "\n".join(lines)


def _speedup_line(s):
    """"policy vs cfs: p99 speedup X [lo, hi] (95% interval)", the interval by
    :func:`~tuna_lab.analysis.stats.format_interval`."""
    interval = format_interval(s["ci_low"], s["ci_high"])
    return (f"{s['policy']} vs {s['baseline']}: p99 speedup {s['speedup']:.2f}x "
            + (f"{interval} (95% interval)" if interval.startswith("[") else interval))
