"""The article's experiment as a design for this machine, cut to a time budget in a fixed order.

The article measures 36 server configurations ``W x T`` (under- and
oversubscribed, on 32 logical CPUs) x 3 models x 3 batch sizes under CFS,
round-robin and Tuna, 5 trials x 1,000 concurrent requests each.
:func:`article_design` keeps that design on the CPUs at hand - the pairs
scaled as :func:`~tuna_lab.measure.experiment.grid` ``("machine")`` scales
them, keeping ``WT/C`` - and, given a budget, cuts it until its estimated
time fits 90% of it (:data:`MARGIN`: the estimates are rough), in this
order (each cut only as far as needed):

1. requests per trial, down to 200;
2. batch sizes 1,000 then 500 (100 stays: the batch of the article's figures);
3. models large then small (medium stays: the model of the article's figures);
4. configurations, least informative first, down to the article's 4x4 and
   16x16 (its stage cells, scaled) with at least one under- and one
   oversubscribed configuration;
5. trials, down to 3;
6. requests per trial, down to 100 (below, no request lies above the p99).

A factor the caller fixes (``models=``, ``requests=``, ...) is never cut.
Every cut is a :class:`Cut`; :meth:`ArticleDesign.describe` prints them as
one line. The cells are ordered most important first, so that a sweep that
runs out of time (:func:`tuna_lab.measure.sweeps.local.sweep` with ``budget``)
leaves out the least important.

Examples
--------
>>> design = article_design(cpus=2, budget=300)
>>> design.pairs, design.models, design.batches, design.trials, design.requests
(((1, 1), (16, 1)), ('medium',), (100,), 3, 140)
>>> for part in design.describe().split("; "):
...     print(part)
budget 5m: requests 1000 -> 200
batches 500, 1000 cut
models small, large cut
configurations 9 -> 2 (kept 1x1, 16x1)
trials 5 -> 3
requests 200 -> 140
estimate 4.4 min for 2 cells
"""

import math
from dataclasses import dataclass, field

from ..._checks import positive_int, positive_number
from ...errors import ExperimentError
from ..experiment import Config, grid, scale_pair

__all__ = ["ARTICLE", "Cut", "ArticleDesign", "article_design", "estimate_cell"]

#: The article's design: its models, batches, policies, trials and requests per trial.
ARTICLE = {"models": ("small", "medium", "large"), "batches": (100, 500, 1000),
           "policies": ("cfs", "round-robin", "tuna-scatter"), "trials": 5, "requests": 1000,
           "stage_pairs": ((4, 4), (16, 16))}
#: The floors of the cuts: requests per trial (first, then last) and trials.
REQUESTS_FLOOR, REQUESTS_MIN, TRIALS_MIN = 200, 100, 3
#: The share of the budget a design is cut to: the estimates are rough, and a sweep stops at the budget.
MARGIN = 0.9
# CPU-seconds of one request of 100 rows (all stages, SHAP included): one-trial probes on a shared 2-CPU
# machine (1x1, 100 requests: medium 32 ms, large 51 ms of server CPU, p50 58 and 91 ms), rounded up;
# a sweep rescales them by what its own cells took.
_CPU_PER_100_ROWS = {"small": 0.05, "medium": 0.07, "large": 0.11}
# Server start (Gunicorn, model load) per trial and policy: a base plus a part per worker (16 workers: ~7 s).
_START_SECONDS, _START_PER_WORKER = 3.0, 0.4
_WARMUP = 20


@dataclass(frozen=True)
class Cut:
    """One cut of the design: ``what`` went from ``before`` to ``after``, for ``reason``."""

    what: str
    before: object
    after: object
    reason: str

    def __str__(self):
        if self.what in ("batches", "models"):
            gone = [str(v) for v in self.before if v not in self.after]
            return f"{self.what} {', '.join(gone)} cut"
        if self.what == "configurations":
            # The shorter list: what was kept, or what was cut.
            cut = [p for p in self.before if p not in self.after]
            which = ("kept", self.after) if len(self.after) <= len(cut) else ("cut", cut)
            return (f"configurations {len(self.before)} -> {len(self.after)} "
                    f"({which[0]} {', '.join(f'{w}x{t}' for w, t in which[1])})")
        return f"{self.what} {self.before} -> {self.after}"

    def to_dict(self):
        """The cut as JSON-able fields (lists for tuples)."""
        def plain(v):
            return [plain(x) for x in v] if isinstance(v, (list, tuple)) else v
        return {"what": self.what, "before": plain(self.before), "after": plain(self.after), "reason": self.reason,
                "text": str(self)}


@dataclass(frozen=True)
class ArticleDesign:
    """The article's experiment sized to ``cpus`` CPUs and cut to ``budget`` seconds (None: no cut).

    ``pairs`` are ordered most important first (the stage cells, then the
    subscription sides in turn), and so are :attr:`configs`.
    """

    cpus: int
    pairs: tuple
    models: tuple
    batches: tuple
    policies: tuple
    trials: int
    requests: int
    budget: float | None = None
    estimate: float = 0.0
    stage_pairs: tuple = ()
    cuts: tuple = field(default=())

    @property
    def configs(self):
        """The cells: medium/100 (the article's figure cell) first, then the other models and batches."""
        order = sorted(((m, b) for m in self.models for b in self.batches),
                       key=lambda mb: (mb != ("medium", 100), ARTICLE["models"].index(mb[0])
                                       if mb[0] in ARTICLE["models"] else 9, mb[1]))
        return [Config(w, t, m, b) for m, b in order for w, t in self.pairs]

    def describe(self):
        """One line: the budget and every cut, or that nothing was cut."""
        head = "no budget" if self.budget is None else f"budget {_duration(self.budget)}"
        body = "; ".join(map(str, self.cuts)) or "nothing cut"
        return f"{head}: {body}; estimate {self.estimate / 60:.1f} min for {len(self.configs)} cells"

    def to_dict(self):
        """The design as JSON-able fields (what a sweep records in its ``sweep.json``)."""
        return {"cpus": self.cpus, "pairs": [list(p) for p in self.pairs], "models": list(self.models),
                "batches": list(self.batches), "policies": list(self.policies), "trials": self.trials,
                "requests": self.requests, "budget": self.budget, "estimate": round(self.estimate, 1),
                "stage_pairs": [list(p) for p in self.stage_pairs], "cuts": [c.to_dict() for c in self.cuts],
                "summary": self.describe()}


def _duration(seconds):
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


def estimate_cell(config, policies, trials, requests, cpus, scale=1.0):
    """Estimated seconds of one cell: a server start per trial and policy, then its requests.

    A start costs 3 s plus 0.4 s per worker; a request of ``b`` rows costs
    ``b / 100`` x 0.05 (small), 0.07 (medium) or 0.11 (large) CPU-seconds,
    spread over ``min(W T, cpus)`` CPUs; 20 warm-up requests come with each
    start. ``scale`` multiplies the whole: a sweep sets it from the cells it
    has finished (what they took over what they were estimated to take).

    Examples
    --------
    >>> round(estimate_cell(Config(2, 1, "medium", 100), ["cfs", "round-robin"], 3, 100, cpus=2), 1)
    48.0
    """
    per_request = _CPU_PER_100_ROWS.get(config.model, _CPU_PER_100_ROWS["large"]) * config.batch / 100
    busy = max(1, min(config.workers * config.threads, cpus))
    run = _START_SECONDS + _START_PER_WORKER * config.workers + (_WARMUP + requests) * per_request / busy
    return scale * trials * len(policies) * run


def _alternate(pairs, cpus, first):
    """``pairs`` after ``first``: under- and oversubscribed in turn, each side farthest-first in log WT."""
    sides = {"under": [], "over": []}
    for p in pairs:
        if p not in first:
            sides["over" if p[0] * p[1] > cpus else "under"].append(p)
    chosen = list(first)
    for side in sides.values():
        ordered = []
        while side:
            # The pair farthest (in log W T) from those already chosen: the range is covered first.
            best = max(side, key=lambda p: (min((abs(math.log(p[0] * p[1]) - math.log(q[0] * q[1]))
                                                 for q in chosen + ordered), default=0), -p[0], -p[1]))
            ordered.append(best)
            side.remove(best)
        side.extend(ordered)
    out = list(first)
    under, over = sides["under"], sides["over"]
    for i in range(max(len(under), len(over))):
        out += [s[i] for s in (under, over) if i < len(s)]
    return out


def _minimum(pairs, stage, cpus):
    """How many of the ordered ``pairs`` must stay: the stage cells and both subscription sides."""
    need = {p for p in stage if p in pairs}
    sides = set()
    for i, p in enumerate(pairs):
        sides.add(p[0] * p[1] > cpus)
        if need <= set(pairs[:i + 1]) and len(sides) == len({q[0] * q[1] > cpus for q in pairs}):
            return i + 1
    return len(pairs)


def article_design(cpus=None, budget=None, *, pairs=None, models=None, batches=None, policies=None, trials=None,
                   requests=None, scale=1.0):
    """The article's experiment on ``cpus`` CPUs, cut to fit ``budget`` seconds.

    Parameters
    ----------
    cpus : int, optional
        The CPUs the servers may use; default this process's effective CPUs
        (:attr:`Limits.effective_cpus <tuna_lab.machine.limits.Limits.effective_cpus>`).
    budget : float, optional
        Seconds the sweep may take; None: the whole design, nothing cut.
    pairs, models, batches, policies, trials, requests : optional
        Fixed by the caller (the CLI's explicit options): used as given and
        never cut. ``pairs`` are ``(W, T)`` tuples (the article's own 36, for
        example, with :func:`~tuna_lab.measure.experiment.grid` ``("article")``).
    scale : float
        Multiplies every estimate (:func:`estimate_cell`): above 1 on a
        machine slower than the defaults assume.

    Returns
    -------
    ArticleDesign
        Its ``cuts`` say what was cut and why; ``estimate`` is the estimated
        seconds of the whole. When even the smallest design exceeds the
        budget, the last cut says so: a sweep then runs the cells that fit and
        leaves the rest for a resume.

    Raises
    ------
    ExperimentError
        A non-positive budget, CPU count, trial or request count.

    Examples
    --------
    >>> d = article_design(cpus=32)
    >>> len(d.pairs), d.models, d.batches, d.trials, d.requests, d.cuts
    (36, ('small', 'medium', 'large'), (100, 500, 1000), 5, 1000, ())
    >>> d.stage_pairs
    ((4, 4), (16, 16))
    >>> article_design(cpus=2, budget=3600, requests=500).requests      # explicit options are never cut
    500
    """
    if cpus is None:
        from ...machine.limits import Limits

        cpus = Limits.read().effective_cpus
    cpus = positive_int("cpus", cpus, ExperimentError)
    if budget is not None:
        budget = positive_number("budget", budget, ExperimentError)
    fixed = {k for k, v in (("pairs", pairs), ("models", models), ("batches", batches), ("trials", trials),
                            ("requests", requests)) if v is not None}
    stage = tuple(dict.fromkeys(scale_pair(w, t, cpus) for w, t in ARTICLE["stage_pairs"]))
    all_pairs = [tuple(p) for p in (pairs if pairs is not None else grid("machine", cpus=cpus))]
    if pairs is not None:
        # Explicit pairs (the article's 36 unscaled, say): its own 4x4 and 16x16 when present.
        stage = tuple(p for p in ARTICLE["stage_pairs"] if p in all_pairs) or stage
    design = {
        "pairs": _alternate(all_pairs, cpus, [p for p in stage if p in all_pairs]),
        "models": list(models if models is not None else ARTICLE["models"]),
        "batches": [int(b) for b in (batches if batches is not None else ARTICLE["batches"])],
        "trials": positive_int("trials", trials if trials is not None else ARTICLE["trials"], ExperimentError),
        "requests": positive_int("requests", requests if requests is not None else ARTICLE["requests"],
                                 ExperimentError),
    }
    policies = tuple(policies if policies is not None else ARTICLE["policies"])

    def total():
        return sum(estimate_cell(Config(w, t, m, b), policies, design["trials"], design["requests"], cpus, scale)
                   for w, t in design["pairs"] for m in design["models"] for b in design["batches"])

    cuts = []
    if budget is not None:
        _cut(design, fixed, total, MARGIN * budget, cuts, stage, cpus)
        if total() > MARGIN * budget:
            cuts.append(Cut("estimate", f"{total():.0f} s", f"over {MARGIN:.0%} of the budget",
                            "the smallest design does not fit: the cells that do not are left for a resume"))
    return ArticleDesign(cpus, tuple(design["pairs"]), tuple(design["models"]), tuple(design["batches"]), policies,
                         design["trials"], design["requests"], budget, total(), stage, tuple(cuts))


def _cut(design, fixed, total, budget, cuts, stage, cpus):
    """Cut ``design`` in place, in the module's documented order, until ``total()`` fits ``budget``."""
    def requests_down(floor, reason):
        if "requests" in fixed or design["requests"] <= floor:
            return
        before = design["requests"]
        # The most requests that fit, found by bisection (total() grows with them), not below the floor.
        low, high = floor, before
        design["requests"] = low
        if total() <= budget:
            while high - low > 10:
                mid = (low + high) // 2
                design["requests"] = mid
                low, high = (mid, high) if total() <= budget else (low, mid)
            design["requests"] = low // 10 * 10 if low // 10 * 10 >= floor else low
        if design["requests"] != before:
            cuts.append(Cut("requests", before, design["requests"], reason))

    def drop(key, order, keep, reason):
        if key in fixed:
            return
        before = tuple(design[key])
        for value in order:
            if total() <= budget:
                break
            if value in design[key] and value != keep and len(design[key]) > 1:
                design[key].remove(value)
        if tuple(design[key]) != before:
            cuts.append(Cut(key, before, tuple(design[key]), reason))

    steps = [
        lambda: requests_down(REQUESTS_FLOOR, "fewer requests per trial first: every factor of the article stays"),
        lambda: drop("batches", (1000, 500), 100, "the article's gains shrink as the batch grows; batch 100 is "
                                                  "the batch of its figures"),
        lambda: drop("models", ("large", "small"), "medium", "the article's gains shrink as the model grows; "
                                                            "medium is the model of its figures"),
        lambda: _drop_pairs(design, fixed, total, budget, cuts, stage, cpus),
        lambda: _trials_down(design, fixed, total, budget, cuts),
        lambda: requests_down(REQUESTS_MIN, "at 100 requests one request still lies above the p99"),
    ]
    for step in steps:
        if total() <= budget:
            return
        step()


def _drop_pairs(design, fixed, total, budget, cuts, stage, cpus):
    if "pairs" in fixed:
        return
    before = tuple(design["pairs"])
    keep = _minimum(design["pairs"], stage, cpus)
    while len(design["pairs"]) > keep and total() > budget:
        design["pairs"].pop()
    if tuple(design["pairs"]) != before:
        cuts.append(Cut("configurations", before, tuple(design["pairs"]),
                        "least informative first; kept the article's 4x4 and 16x16 (scaled) and both "
                        "subscription sides"))


def _trials_down(design, fixed, total, budget, cuts):
    if "trials" in fixed or design["trials"] <= TRIALS_MIN:
        return
    before = design["trials"]
    while design["trials"] > TRIALS_MIN and total() > budget:
        design["trials"] -= 1
    cuts.append(Cut("trials", before, design["trials"], "3 trials still give every speedup an interval"))
