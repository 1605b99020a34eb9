"""The search behind :func:`~tuna_lab.measure.tune.tuner.tune`: candidates raced on open-loop rate.

Measuring every candidate well is what a sweep does, and most of its time
goes to candidates that are out of the race after one short trial. The search
here (:func:`race`) is successive halving with a racing rule:

* Rounds. In round ``k`` every candidate still in the race gets one *run*: a
  server start, a warm-up and its placement (as any trial), then a few
  open-loop steps of ``step_seconds * 2**k`` seconds each on that server. The
  steps search the rate: from the leader's best passing rate, up by x4 until
  a step misses the target, down by x4 until one meets it (gently, by
  ``1 + 2 tolerance``, for a candidate that met the target there before),
  then bisection; once the bracket is within ``tolerance``, further steps
  re-measure the best passing rate, which is the evidence its lower bound
  needs. Whether a rate met the target is read from the share of requests
  over it at each rate, fitted non-decreasing in the rate (isotonic
  regression): one unlucky short step below rates that met the target on
  more requests does not cap the candidate.
* Intervals (:func:`rate_bounds`). Latency grows with the offered rate, so a
  request at a lower rate is no slower in distribution than one at a higher
  rate. Every step counts its requests over the target (a failed request
  counts as over); pooling the steps at or below a rate gives a one-sided
  binomial test (:func:`scipy.stats.binomtest`) that more than 1% of requests
  are over the target there (the rate is an upper bound), and pooling the
  steps from a rate up to that bound one that fewer are (a lower bound).
  Every round's steps count: the bounds pool all of a candidate's runs.
* Drops. After each round a candidate whose upper bound is below the best
  lower bound is dropped (racing: the only statistical drop). Then the rest
  are halved, keeping the best ``1/eta`` of them (default a quarter) but at
  least two until the round before the last, ranked by where the p99 crosses
  the target within each bracket (log p99 interpolated between the passing
  and the failing rate), so the longer trials go to the close ones. Within a
  run, a candidate that misses the target at a quarter of the leader's
  passing rate is out at once (halving would rank it out anyway), and one
  that misses even at ``low`` requests per second is dropped as unable to
  meet it. Halving drops are by rank, not by a test: they guarantee nothing
  statistically, and the ``sure`` line says whether the evidence separates
  the winner.
* Budget. A run or a step is begun only when its worst case (duration plus
  drain, and a server start estimated from the runs so far) fits in what is
  left; when the budget runs out the best so far is returned, with a line
  saying whether its interval separates it from every other candidate.
  Round 1 takes first the runs that add a W x T x wait policy or a placement
  policy not yet measured (:func:`_covering_order`): a budget that runs out
  there leaves pairings unmeasured, not a whole configuration or policy.

:func:`race` is the algorithm alone: it asks ``evaluate`` to measure each
candidate's steps, so it runs as well on made-up measurements as on servers.

Examples
--------
>>> parse_duration("50ms"), parse_duration("90s"), parse_duration("15m")
(0.05, 90.0, 900.0)
>>> auto_configs(2)
[(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)]
"""

import math
import re
import time
from dataclasses import dataclass, field

import numpy as np

from ..._checks import positive_int, positive_number, spec_or_default
from ...errors import TuneError

__all__ = ["Candidate", "Step", "TuneResult", "RaceRules", "START_GUESS", "MIN_STEP_SECONDS", "parse_duration",
           "auto_configs", "rate_bounds", "race", "format_seconds", "check_step_seconds"]

# The share of requests a p99 target allows over it.
_OVER = 0.01
#: What a server start, warm-up and placement cost before the first run has measured it (seconds):
#: the lab server on a small machine takes 1-3 s to start, and a user's app may take longer.
START_GUESS = 5.0
# The search's step factor before a bracket is found: x4 up from a passing rate, /4 down from a failing one.
_GROWTH = 4.0
# A step carries at least this many requests (its duration grows at low rates, up to 4 x the round's).
_MIN_REQUESTS = 20
#: The shortest step that measures a rate (seconds). The open loop's sends lag their Poisson schedule by up
#: to about 5 ms (the p99 of ``send_lag`` in tests/data/tune-loaded, a tune on a loaded 2-CPU machine:
#: 6.6 ms at most), and a request takes milliseconds: a step of ten times that is the shortest whose
#: offered rate is the rate asked to within about 10%. Shorter ones (``--step-seconds 1e-9``) sent one
#: request each and "met" every rate.
MIN_STEP_SECONDS = 0.05
_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text, name="duration", error=TuneError):
    """Seconds from ``"50ms"``, ``"90s"``, ``"15m"``, ``"1h"`` or a bare number of seconds.

    Parameters
    ----------
    text : str or float
    name : str
        What the value is, for the error message.
    error : type
        The exception raised when ``text`` is not a positive duration.

    Returns
    -------
    float

    Examples
    --------
    >>> parse_duration("1.5s"), parse_duration(2)
    (1.5, 2.0)
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return positive_number(name, text, error)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s|min|m|h)?\s*", str(text))
    if not match:
        raise error(f"{name} {text!r} is not a duration such as 50ms, 90s or 15m")
    value = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if not value > 0 or not math.isfinite(value):
        raise error(f"{name} must be more than 0, got {text!r}")
    return value


def auto_configs(cpus):
    """The W x T pairs ``--configs auto`` takes on ``cpus`` effective CPUs.

    As the article's grid does, under- and oversubscribed servers: ``W x T``
    of half, once and twice the CPUs, with T a power of two no larger than
    the CPUs (XGBoost runs at most that many threads per worker).

    Examples
    --------
    >>> auto_configs(4)
    [(1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (4, 1), (4, 2), (8, 1)]
    """
    cpus = positive_int("cpus", cpus, TuneError)
    pairs = set()
    for total in {max(1, cpus // 2), cpus, 2 * cpus}:
        threads = 1
        while threads <= min(cpus, total):
            if total % threads == 0:
                pairs.add((total // threads, threads))
            threads *= 2
    return sorted(pairs)


@dataclass(frozen=True)
class Candidate:
    """One configuration in the race: W workers x T threads, a placement policy and an OpenMP wait policy."""

    workers: int
    threads: int
    policy: str
    wait_policy: str = "default"

    @property
    def name(self):
        """``"2x2 tuna-scatter"`` (and the wait policy when it is not the default)."""
        wait = "" if self.wait_policy == "default" else f" {self.wait_policy}"
        return f"{self.workers}x{self.threads} {self.policy}{wait}"


@dataclass(frozen=True)
class Step:
    """One open-loop step of a run: its offered rate and what the target saw of it.

    ``over`` counts the requests slower than the target or failed, out of
    ``n``; ``p99`` is the client's (infinite when more than 1% failed);
    ``error`` says why a step could not be measured at all (the server did
    not start, its placement was not in effect), and is empty otherwise.
    """

    rate: float
    duration: float
    n: int
    over: int
    p99: float
    cpu_per_request: float = math.nan
    round: int = 0
    seconds: float = 0.0
    error: str = ""

    @property
    def passed(self):
        """Whether at most 1% of the requests were over the target (the step's p99 met it)."""
        return self.n > 0 and not self.error and self.over <= _OVER * self.n


@dataclass
class TuneResult:
    """What :func:`.tune` (or :func:`race`) found.

    Attributes
    ----------
    table : pandas.DataFrame
        One row per candidate, the winner (the best still in the race) first, then by rate: ``candidate``, ``workers``,
        ``threads``, ``policy``, ``wait_policy``, ``rate`` (the highest rate
        that met the target, requests/s), ``rate_low`` / ``rate_high`` (its
        one-sided bounds at ``confidence``; ``inf`` when no step missed),
        ``p99`` at ``rate`` (seconds), ``cpu_per_request`` at ``rate`` (server
        CPU seconds), ``rounds``, ``steps``, ``seconds`` (wall time spent on
        it), ``status`` (``winner``, ``in race``, ``dropped``) and ``reason`` (for a candidate the budget
        left unmeasured, ``not measured: ...``, and why).
    winner : Candidate or None
    sure : str
        How sure the winner is, in one line.
    history : pandas.DataFrame
        ``round``, ``candidate``, ``rate``, ``rate_low``, ``rate_high`` and
        ``status`` after every round: the race as it narrows.
    sla_p99, budget, elapsed, confidence : float
    plan : str
        The winner's ``plan --format gunicorn`` (empty without a winner or a machine).
    note : str
        What was searched (a running server: policies only).
    out : str or None
        Where the records were written.
    """

    table: object
    winner: Candidate | None
    sure: str
    history: object
    sla_p99: float
    budget: float
    elapsed: float
    confidence: float
    plan: str = ""
    note: str = ""
    out: str | None = None
    steps: dict = field(default_factory=dict, repr=False)

    def to_dict(self):
        """The result as one JSON-able object (what ``tune --json`` prints)."""
        rows = self.table.replace({np.inf: None}).astype(object).where(self.table.notna(), None)
        win = None
        if self.winner is not None:
            first = rows.iloc[0].to_dict()
            win = {"candidate": self.winner.name, "workers": self.winner.workers, "threads": self.winner.threads,
                   "policy": self.winner.policy, "wait_policy": self.winner.wait_policy, "rate": first["rate"],
                   "rate_low": first["rate_low"], "rate_high": first["rate_high"], "p99": first["p99"],
                   "cpu_per_request": first["cpu_per_request"], "plan": self.plan}
        history = self.history.astype(object).where(self.history.notna(), None) if len(self.history) else None
        return {"sla_p99": self.sla_p99, "budget": self.budget, "elapsed": self.elapsed,
                "confidence": self.confidence, "winner": win, "sure": self.sure, "note": self.note,
                "candidates": [{k: _plain(v) for k, v in r.items()} for r in rows.to_dict("records")],
                "history": [] if history is None else [{k: _plain(v) for k, v in r.items()}
                                                       for r in history.to_dict("records")],
                "out": self.out}

    @classmethod
    def from_dict(cls, data):
        """The result :meth:`to_dict` gave (an upper bound written as null - no step missed - is infinite again)."""
        import pandas as pd

        def frame(rows):
            out = pd.DataFrame(rows)
            if "rate_high" in out:
                out["rate_high"] = out["rate_high"].astype(float).fillna(math.inf)
            return out

        win = data.get("winner")
        winner = None if win is None else Candidate(int(win["workers"]), int(win["threads"]), win["policy"],
                                                    win.get("wait_policy", "default"))
        return cls(frame(data["candidates"]), winner, data["sure"], frame(data.get("history", [])),
                   float(data["sla_p99"]), float(data["budget"]), float(data["elapsed"]), float(data["confidence"]),
                   plan=(win or {}).get("plan", ""), note=data.get("note", ""), out=data.get("out"))

    def to_text(self):
        """The table, the winner, how sure it is and its plan, as ``tuna-lab tune`` prints them."""
        lines = [f"{'candidate':<24}{'rate/s':>9}{'interval /s':>18}{'p99 ms':>9}{'CPU ms/req':>12}{'rounds':>8}  "
                 f"{'status':<9}why"]
        for _, row in self.table.iterrows():
            high = "inf" if not math.isfinite(row["rate_high"]) else f"{row['rate_high']:.1f}"
            interval = f"[{row['rate_low']:.1f}, {high}]"
            p99 = "-" if not math.isfinite(row["p99"]) else f"{row['p99'] * 1e3:.1f}"
            cpu = "-" if not math.isfinite(row["cpu_per_request"]) else f"{row['cpu_per_request'] * 1e3:.2f}"
            lines.append(f"{row['candidate']:<24}{row['rate']:>9.1f}{interval:>18}{p99:>9}{cpu:>12}"
                         f"{row['rounds']:>8}  {row['status']:<9}{row['reason']}")
        lines.append(f"p99 target {self.sla_p99 * 1e3:g} ms; {self.elapsed:.0f} s of a {self.budget:.0f} s budget; "
                     f"intervals are {self.confidence:.0%} one-sided bounds")
        if self.note:
            lines.append(self.note)
        unmeasured = self.table.loc[self.table["steps"] == 0, "candidate"].tolist()
        if unmeasured:
            lines.append(f"not measured ({len(unmeasured)} of {len(self.table)}; the budget ran out before their "
                         f"first run): {', '.join(unmeasured)}")
        if self.winner is not None:
            lines.append(f"winner: {self.winner.name} ({self.sure})")
            lines.append("plan (plan --format gunicorn):")
            lines.append(self.plan)
        if self.out:
            lines.append(f"records: {self.out}; `tuna-lab report {self.out} -o report.html` reads them")
        return "\n".join(lines)


def _plain(value):
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def _pooled(steps):
    """``[(rate, n, over)]`` of measured ``steps``, one entry per distinct rate, by rate."""
    by = {}
    for s in steps:
        if s.n and not s.error:
            n, over = by.get(s.rate, (0, 0))
            by[s.rate] = (n + s.n, over + s.over)
    return [(r, *by[r]) for r in sorted(by)]


def rate_bounds(steps, confidence=0.9):
    """One-sided bounds ``(low, high)`` on the highest rate whose p99 meets the target.

    Latency is taken to grow with the offered rate (requests at a lower rate
    are no slower in distribution), so the share of requests over the target
    at a rate is at most the pooled share of the steps at higher rates, and
    at least that of the steps at lower rates. ``high`` is the lowest tested
    rate at which the steps at or below it show, by an exact one-sided
    binomial test at level ``1 - confidence``, more than 1% of requests over
    the target; ``low`` the highest tested rate below ``high`` at which the
    steps from it up to the lowest rate that missed the target show fewer
    than 1% (choosing those steps by their outcome makes ``low`` a little
    optimistic; it is what lets a race end before thousands of requests). ``(0, inf)`` when the
    steps say neither. The steps of different runs are pooled as if
    independent: a server that varies from start to start makes the bounds
    too narrow, which the next rounds' runs correct.

    Parameters
    ----------
    steps : iterable of Step
    confidence : float
        One-sided confidence of each bound, in (0, 1).

    Returns
    -------
    tuple of float

    Examples
    --------
    >>> steps = [Step(10.0, 30.0, 300, 0, 0.02), Step(20.0, 3.0, 60, 30, 0.5)]
    >>> rate_bounds(steps)
    (10.0, 20.0)
    >>> rate_bounds([Step(10.0, 1.0, 10, 0, 0.02)])
    (0.0, inf)
    """
    from scipy.stats import binomtest

    alpha = 1.0 - float(confidence)
    pooled = _pooled(steps)
    high, upto = math.inf, len(pooled)
    n = over = 0
    for i, (rate, count, k) in enumerate(pooled):
        n, over = n + count, over + k
        if binomtest(over, n, _OVER, alternative="greater").pvalue <= alpha:
            high, upto = rate, i
            break
    # The lower bound pools the steps from a rate up to the lowest rate that missed the target (or up to
    # ``high``): the steps above that are valid evidence too, but a bound diluted by them says nothing.
    _, missed = _bracket(steps)
    upto = min(upto, sum(1 for rate, _, _ in pooled if missed is None or rate < missed))
    low = 0.0
    n = over = 0
    for rate, count, k in reversed(pooled[:upto]):
        n, over = n + count, over + k
        if binomtest(over, n, _OVER, alternative="less").pvalue <= alpha:
            low = rate
            break
    return low, high


def _bracket(steps):
    """``(passing, failing)``: the highest rate that met the target and the lowest that did not.

    Met or not by the share of requests over the target at each rate, fitted
    non-decreasing in the rate (:func:`scipy.optimize.isotonic_regression`,
    weighted by the requests): latency grows with the rate, so a rate that
    missed below rates that met it on more requests (a slow server start, a
    burst of other work) is pooled with them, rather than capping the
    candidate by its one unlucky step.

    Examples
    --------
    >>> _bracket([Step(20.0, 1.0, 20, 1, 0.3), Step(22.0, 8.0, 180, 0, 0.04), Step(30.0, 1.0, 30, 9, 0.5)])
    (22.0, 30.0)
    """
    from scipy.optimize import isotonic_regression

    pooled = _pooled(steps)
    if not pooled:
        return None, None
    rates = [r for r, _, _ in pooled]
    counts = np.array([n for _, n, _ in pooled], dtype=float)
    share = isotonic_regression(np.array([o for _, _, o in pooled]) / counts, weights=counts).x
    fails = [r for r, f in zip(rates, share) if f > _OVER]
    passes = [r for r, f in zip(rates, share) if f <= _OVER]
    return (max(passes) if passes else None), (min(fails) if fails else None)


class _Entry:
    """One candidate's state in the race."""

    def __init__(self, candidate):
        self.candidate = candidate
        self.steps = []
        self.status, self.reason = "in race", ""
        self.rounds, self.seconds = 0, 0.0

    def summary(self, confidence):
        low, high = rate_bounds(self.steps, confidence)
        point, _ = _bracket(self.steps)
        point = max(point or 0.0, low)
        at = [s for s in self.steps if s.rate == point and s.n and not s.error]
        p99 = float(np.mean([s.p99 for s in at])) if at else math.nan
        cpu = [s.cpu_per_request for s in at if np.isfinite(s.cpu_per_request)]
        return {"candidate": self.candidate.name, "workers": self.candidate.workers,
                "threads": self.candidate.threads, "policy": self.candidate.policy,
                "wait_policy": self.candidate.wait_policy, "rate": point, "rate_low": low, "rate_high": high,
                "p99": p99, "cpu_per_request": float(np.mean(cpu)) if cpu else math.nan, "rounds": self.rounds,
                "steps": len(self.steps), "seconds": self.seconds, "status": self.status, "reason": self.reason}


@dataclass(frozen=True)
class RaceRules:
    """How :func:`race` searches: its rounds and steps, the halving, and the rates it tries.

    Parameters
    ----------
    rounds, steps : int
        At most this many rounds (round ``k``'s steps last ``step_seconds * 2**k``); steps per run.
    step_seconds, eta, tolerance, confidence : float
        First round's step length; ``1/eta`` kept per round; a resolved bracket; the bounds' confidence.
    low, high, start_rate : float
        Lowest and highest rate tried, and the first step's rate (requests per second).
    """

    rounds: int = 4
    step_seconds: float = 2.0
    steps: int = 3
    eta: float = 4.0
    tolerance: float = 0.1
    confidence: float = 0.9
    low: float = 1.0
    high: float = 1e5
    start_rate: float = 10.0


def race(candidates, evaluate, sla_p99, budget, *, rules=None, timeout=None, exhaustive=False, clock=time.monotonic,
         progress=None, prior=None):
    """Successive halving with a racing rule over ``candidates``, measured through ``evaluate``.

    Parameters
    ----------
    candidates : list of Candidate
    evaluate : callable
        ``evaluate(candidate, round, next_step)`` runs one run, asking ``next_step`` for each step.
    sla_p99, budget : float
        The target, seconds (for the message only); seconds the whole race may take (by ``clock``).
    rules : RaceRules, optional
        Rounds, steps, halving and rates (default ``RaceRules()``).
    timeout : float, optional
        Drain of a step after its last arrival (default ``2 * sla_p99 + 0.5``).
    exhaustive : bool
        Every candidate runs every round (no racing): the baseline of ``bench tune``.
    clock, progress : callable
        Seconds, monotonic; called with one line per run (optional).
    prior : dict, optional
        ``{candidate name: [Step, ...]}`` measured before (a resumed tune): each candidate starts
        from its steps, which count in its bracket and bounds as the race's own.

    Returns
    -------
    TuneResult
        Without ``plan``, ``note`` or ``out`` (:func:`.tune` adds them).

    Notes
    -----
    See docs/tune.md, sections "The race" (the rule) and "From Python" (the protocol of ``evaluate``).

    Examples
    --------
    >>> def evaluate(candidate, round, next_step):     # every step meets the target: p99 10 ms
    ...     step = next_step(None)
    ...     while step is not None:
    ...         rate, duration = step
    ...         step = next_step(Step(rate, duration, n=int(rate * duration), over=0, p99=0.01))
    >>> race([Candidate(1, 1, "cfs")], evaluate, 0.05, 60, rules=RaceRules(rounds=2)).winner
    Candidate(workers=1, threads=1, policy='cfs', wait_policy='default')
    """
    if not candidates:
        raise TuneError("no candidates to race")
    rules = spec_or_default("rules", rules, RaceRules, TuneError)
    rounds, step_seconds, steps, eta = rules.rounds, rules.step_seconds, rules.steps, rules.eta
    tolerance, confidence, low, high, start_rate = (rules.tolerance, rules.confidence, rules.low, rules.high,
                                                    rules.start_rate)
    check_step_seconds(step_seconds)
    timeout = 2.0 * sla_p99 + 0.5 if timeout is None else timeout
    entries = [_Entry(c) for c in candidates]
    for entry in entries:
        entry.steps = list((prior or {}).get(entry.candidate.name, ()))
    t0 = clock()
    deadline = t0 + budget
    overheads = []
    history = []
    ran_out = None

    def overhead():
        # Start, warm-up, placement and stop: the mean of what the runs so far cost beyond their steps.
        return float(np.mean(overheads)) if overheads else START_GUESS

    def leader_rate():
        best = [_bracket(e.steps)[0] for e in entries if e.status != "dropped"]
        return max([b for b in best if b], default=None)

    for rnd in range(rounds):
        alive = [e for e in entries if e.status == "in race"]
        if not alive:
            break
        if rnd == 0:
            alive = _covering_order(alive)
        seconds = step_seconds * 2 ** rnd
        for entry in alive:
            first = _first_duration(entry, seconds, start_rate, leader_rate())
            if clock() + overhead() + first + timeout > deadline:
                ran_out = rnd
                break
            taken = []

            def next_step(step, entry=entry, taken=taken, seconds=seconds):
                if step is not None:
                    step = Step(**{**step.__dict__, "round": rnd})
                    entry.steps.append(step)
                    taken.append(step)
                    if step.error:
                        entry.status, entry.reason = "dropped", f"could not be measured: {step.error}"
                        return None
                # A first run may take a few more steps, until its rate is bracketed: a candidate that had
                # to climb from start_rate must not lose the halving for want of a failing step.
                # Any run may take them while the candidate has no rate that met the target (a slower server
                # start than the last, a busier machine): a run never ends with a candidate it measured at 0/s.
                passing, failing = _bracket(entry.steps)
                short = passing is None or (failing is None and not entry.rounds)
                if len(taken) >= (steps + 3 if short else steps):
                    return None
                lead = leader_rate()
                passing, failing = _bracket(entry.steps)
                if not exhaustive and passing is None and failing and lead and failing * _GROWTH <= lead:
                    # Missed the target at a quarter of the leader's rate: whatever lower rate it meets, the
                    # halving ranks it out of the lead, so the search for that rate is not worth its steps.
                    entry.status = "dropped"
                    entry.reason = (f"round {rnd + 1}: missed the target at {failing:g}/s, a quarter or less of "
                                    f"the leader's {lead:g}/s")
                    return None
                rate = _next_rate(entry, low, high, tolerance, start_rate, lead, confidence)
                if rate is None:
                    return None
                duration = min(max(seconds, _MIN_REQUESTS / rate), 4 * seconds)
                if clock() + duration + timeout > deadline:
                    return None
                return rate, duration

            began = clock()
            evaluate(entry.candidate, rnd, next_step)
            spent = clock() - began
            entry.rounds += 1
            entry.seconds += spent
            overheads.append(max(0.0, spent - sum(s.seconds or s.duration for s in taken)))
            if progress:
                row = entry.summary(confidence)
                progress(f"tune: round {rnd + 1} {entry.candidate.name:<22} {len(taken)} steps, "
                         f"best {row['rate']:.1f}/s [{row['rate_low']:.1f}, {row['rate_high']:.1f}] "
                         f"({clock() - t0:.0f} of {budget:.0f} s)")
        if ran_out is not None:
            _snapshot(history, rnd, entries, confidence)
            break
        _drop(entries, rnd, rounds, eta, tolerance, confidence, low, exhaustive, sla_p99)
        _snapshot(history, rnd, entries, confidence)
        alive = [e for e in entries if e.status == "in race"]
        if not exhaustive and len(alive) == 1:
            point, fail = _bracket(alive[0].steps)
            if point and fail and fail - point <= tolerance * point:
                break                                   # one left, and its rate resolved: nothing to race
    for entry in entries:
        if not entry.steps and entry.status == "in race" and ran_out is not None:
            entry.reason = (f"not measured: the {budget:g} s budget ran out in round {ran_out + 1} before its first "
                            "run; a larger budget (or fewer candidates) measures it")
    return _result(entries, history, sla_p99, budget, clock() - t0, confidence, ran_out)


def _covering_order(entries):
    """Round 1's order: each next run the one adding the most W x T x wait cells and policies not yet measured.

    A budget that runs out in round 1 leaves the last candidates unmeasured. In the order given
    (every policy of ``1x1``, then of ``2x1``) that is whole configurations, and a race that ran
    out after two runs had measured one W x T; taken so as to cover, the first runs measure every
    configuration and every policy they can (``1x1 cfs``, ``2x1 round-robin``, then the rest in
    their order), so what is left unmeasured is a pairing, not a whole row of the answer. Steps
    of a resume count as measured. Ties keep the order given.

    Examples
    --------
    >>> entries = [_Entry(Candidate(w, 1, p)) for w in (1, 2) for p in ("cfs", "round-robin")]
    >>> [e.candidate.name for e in _covering_order(entries)]
    ['1x1 cfs', '2x1 round-robin', '1x1 round-robin', '2x1 cfs']
    """
    def cell(entry):
        return entry.candidate.workers, entry.candidate.threads, entry.candidate.wait_policy

    cells = {cell(e) for e in entries if e.steps}
    policies = {e.candidate.policy for e in entries if e.steps}
    left, order = list(entries), []
    while left:
        best = max(left, key=lambda e: (cell(e) not in cells) + (e.candidate.policy not in policies))
        left.remove(best)
        order.append(best)
        cells.add(cell(best))
        policies.add(best.candidate.policy)
    return order


def check_step_seconds(seconds, error=TuneError):
    """``seconds`` as a float, or ``error`` (one line, naming the minimum) for a step too short to measure.

    Examples
    --------
    >>> check_step_seconds(1e-9)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.TuneError: a step of 1e-09 s is too short to measure a rate: the least is 0.05 s (the open loop's sends lag their schedule by up to ~5 ms)
    """
    seconds = positive_number("step_seconds", seconds, error)
    if seconds < MIN_STEP_SECONDS:
        raise error(f"a step of {seconds:g} s is too short to measure a rate: the least is {MIN_STEP_SECONDS:g} s "
                    "(the open loop's sends lag their schedule by up to ~5 ms)")
    return float(seconds)


def _first_duration(entry, seconds, start_rate, leader):
    rate = (_bracket(entry.steps)[0] or leader or start_rate)
    return min(max(seconds, _MIN_REQUESTS / rate), 4 * seconds)


def _next_rate(entry, low, high, tolerance, start_rate, leader, confidence=0.9):
    """The search's next rate for ``entry``, or None (it cannot meet the target: it is marked so).

    A candidate is marked unable to meet the target only when the steps at
    the lowest rate show it (their upper bound, :func:`rate_bounds`, is that
    rate); one unlucky step there is measured again.
    """
    passing, failing = _bracket(entry.steps)
    if passing is None and failing is None:
        return min(max(leader or start_rate, low), high)
    if failing is None:
        # Only passes so far: up, unless the cap has passed already (then confirm it).
        return min(passing * _GROWTH, high)
    if passing is None:
        if failing <= low:
            if rate_bounds(entry.steps, confidence)[1] > low:
                return low
            worst = min((s for s in entry.steps if s.rate == failing), key=lambda s: s.p99)
            entry.status = "dropped"
            entry.reason = (f"cannot meet the target: p99 {format_seconds(worst.p99)} even at {failing:g}/s, "
                            f"the lowest rate tried")
            return None
        # Down x4 while the scale is unknown; a candidate that has met the target before (at this rate or
        # above, in another run: its server varies from start to start) is near it, and steps down gently.
        near = any(s.passed and s.rate >= failing for s in entry.steps)
        return max(failing / (1.0 + 2.0 * tolerance if near else _GROWTH), low)
    if failing - passing <= tolerance * passing:
        return passing                                   # resolved: more evidence at the best passing rate
    # Bisection: geometric while the bracket is wide (rates span decades), arithmetic once it is narrow.
    return math.sqrt(passing * failing) if failing > 2 * passing else (passing + failing) / 2


def format_seconds(seconds):
    """``seconds`` in milliseconds for a message, or "timeout" when infinite.

    Examples
    --------
    >>> format_seconds(0.0123), format_seconds(float("inf"))
    ('12.3 ms', 'timeout')
    """
    return "timeout" if not math.isfinite(seconds) else f"{seconds * 1e3:.1f} ms"


def _crossing(steps, sla_p99):
    """Where the p99 crosses the target, interpolated within the bracket: the halving's ranking.

    The bracket's passing rate alone ties every candidate whose short first
    steps bracketed alike; the steps' p99s say how close to the target each
    was. Between the passing rate ``p`` and the failing rate ``f`` (the
    lowest p99 seen at each), ``log p99`` is taken as linear in the rate;
    without a failing rate, ``p`` itself. Never below ``p`` nor above ``f``.

    Examples
    --------
    >>> _crossing([Step(10.0, 1.0, 30, 0, 0.025), Step(20.0, 1.0, 30, 3, 0.1)], 0.05)
    15.0
    """
    passing, failing = _bracket(steps)
    if passing is None:
        return 0.0
    if failing is None:
        return passing
    at = {r: min((s.p99 for s in steps if s.rate == r and s.n and not s.error), default=math.nan)
          for r in (passing, failing)}
    lo, hi = at[passing], at[failing]
    if not (0 < lo < hi and math.isfinite(lo)) or not math.isfinite(sla_p99):
        return passing
    if not math.isfinite(hi):
        hi = max(lo, sla_p99) * 4.0           # a timed-out step: far over, but how far is unknown
    share = (math.log(sla_p99) - math.log(lo)) / (math.log(hi) - math.log(lo)) if hi > lo else 0.0
    return passing + min(max(share, 0.0), 1.0) * (failing - passing)


def _drop(entries, rnd, rounds, eta, tolerance, confidence, low, exhaustive, sla_p99=math.nan):
    """After round ``rnd``: the racing rule, then successive halving (neither when ``exhaustive``)."""
    alive = [e for e in entries if e.status == "in race"]
    if exhaustive or len(alive) < 2:
        return
    rows = {id(e): e.summary(confidence) for e in alive}
    best = max(alive, key=lambda e: rows[id(e)]["rate_low"])
    best_low = rows[id(best)]["rate_low"]
    for e in alive:
        if e is not best and rows[id(e)]["rate_high"] < best_low:
            e.status = "dropped"
            e.reason = (f"round {rnd + 1}: upper bound {rows[id(e)]['rate_high']:.1f}/s below the lower bound "
                        f"{best_low:.1f}/s of {best.candidate.name}")
    # Best first, by where the p99 crosses the target within each bracket (round 1's coarse steps tie on
    # the bracket alone); a tie goes to the better lower bound.
    cross = {id(e): _crossing(e.steps, sla_p99) for e in alive}
    alive = sorted((e for e in alive if e.status == "in race"),
                   key=lambda e: (-cross[id(e)], -rows[id(e)]["rate"], -rows[id(e)]["rate_low"]))
    if rnd + 1 >= rounds or eta <= 1 or len(alive) < 2:
        return
    # Two stay until the round before the last: halving to one on short steps would crown a lucky step.
    keep = max(2 if rnd + 2 < rounds else 1, math.ceil(len(alive) / eta))
    lead, lead_cross = rows[id(alive[0])]["rate"], cross[id(alive[0])]
    for rank, e in enumerate(alive[keep:], keep + 1):
        rate = rows[id(e)]["rate"]
        e.status = "dropped"
        # A candidate at or above the leader's rate is dropped by the order's estimate (where the p99
        # crosses the target) or its tie-break (the lower bound): say which, with the figures, rather than
        # a bare rank that reads as slower.
        tie = ""
        if rate >= lead:
            how = "tied with the leader on rate" if rate == lead else "a higher rate than the leader's"
            by = (f"by where its p99 crosses the target ({cross[id(e)]:.1f}/s against {lead_cross:.1f}/s)"
                  if cross[id(e)] < lead_cross else "by its lower bound, at an equal crossing")
            tie = f"; {how}, ranked below it {by}"
        e.reason = (f"halving after round {rnd + 1}: {rate:.1f}/s, rank {rank} of {len(alive)} (leader "
                    f"{lead:.1f}/s{tie})")


def _snapshot(history, rnd, entries, confidence):
    for e in entries:
        row = e.summary(confidence)
        history.append({"round": rnd + 1, "candidate": row["candidate"], "rate": row["rate"],
                        "rate_low": row["rate_low"], "rate_high": row["rate_high"], "status": e.status})


def _result(entries, history, sla_p99, budget, elapsed, confidence, ran_out):
    import pandas as pd

    rows = [e.summary(confidence) for e in entries]
    table = pd.DataFrame(rows)
    # The winner is the best of those still in the race: a dropped candidate's estimate rests on fewer,
    # shorter steps than the survivors' (it may be higher only for that), so it never wins over them.
    table["_alive"] = table["status"] == "in race"
    if not (table["_alive"] & (table["rate"] > 0)).any():
        table["_alive"] = True
    table = table.sort_values(["_alive", "rate", "rate_low"], ascending=False, kind="stable")
    table = table.drop(columns="_alive").reset_index(drop=True)
    winner, sure = None, "no candidate met the target"
    measured = table[table["steps"] > 0]
    if len(measured) and table.loc[0, "rate"] > 0:
        top = table.iloc[0]
        winner = next(e.candidate for e in entries if e.candidate.name == top["candidate"])
        table.loc[0, "status"] = "winner"
        others = table.iloc[1:]
        others = others[others["steps"] > 0]
        if not len(others):
            sure = "the only candidate measured"
        else:
            rival = others.loc[others["rate_high"].idxmax()]
            if top["rate_low"] >= rival["rate_high"]:
                sure = (f"sure: its lower bound {top['rate_low']:.1f}/s is at or above every other candidate's "
                        f"upper bound ({confidence:.0%} one-sided)")
            elif not math.isfinite(rival["rate_high"]):
                # No upper bound: none of its steps was over the target often enough to show, at this
                # confidence, that more than 1% of requests are (one over in a short step is not enough).
                sure = (f"not sure: nothing bounds what {rival['candidate']} may serve (no step of it was over "
                        f"the target often enough to bound its rate, {confidence:.0%} one-sided), above the "
                        f"winner's lower bound {top['rate_low']:.1f}/s")
            else:
                sure = (f"not sure: {rival['candidate']} may serve up to {rival['rate_high']:.1f}/s, above the "
                        f"winner's lower bound {top['rate_low']:.1f}/s ({confidence:.0%} one-sided)")
        if ran_out is not None:
            sure += f"; the budget ran out in round {ran_out + 1}"
    steps = {e.candidate.name: list(e.steps) for e in entries}
    return TuneResult(table, winner, sure, pd.DataFrame(history), float(sla_p99), float(budget), float(elapsed),
                      float(confidence), steps=steps)
