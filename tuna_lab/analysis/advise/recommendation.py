"""The advisor's answer for one configuration: the verdict, the predictions, the evidence, the coverage.

:class:`Recommendation` is what :meth:`~tuna_lab.analysis.advise.Advisor.recommend`
returns; ``str()`` is what ``tuna-lab advise`` prints and :meth:`~Recommendation.to_dict`
what ``tuna-lab advise --json`` prints (with the advisor's evaluation).

Examples
--------
>>> import pandas as pd
>>> rec = Recommendation(workers=2, threads=2, model="small", batch=100, wait_policy="default", spincount=None,
...     cpus=2, oversubscription=2.0, best_policy="tuna-scatter", predicted_speedup=1.5, pin=True, mae=0.1,
...     predictions=pd.DataFrame(), evidence=pd.DataFrame(), covered=True)
>>> rec.verdict
'pin with tuna-scatter: predicted p99 speedup 1.50x over cfs (held-out MAE 0.10)'
"""

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..stats import format_interval

__all__ = ["Recommendation"]


@dataclass
class Recommendation:
    """The advice for one configuration.

    Attributes
    ----------
    workers, threads, model, batch, wait_policy, spincount, cpus
        The question (``spincount`` None: unset; ``cpus`` of the machine asked about).
    oversubscription : float
        ``W*T/cpus``.
    best_policy : str
        The pinning policy with the highest predicted speedup over cfs; when
        the model learnt nothing (``learnt`` False) and ``measured`` is set,
        the measured one.
    predicted_speedup : float
        Its predicted p99 speedup over cfs (XGBoost).
    pin : bool
        Whether to pin. When the model learnt something: whether the
        predicted speedup exceeds 1 by more than the regressor's held-out
        MAE (below that, the gain is within the model's own error). When it
        did not: only on a measurement, where ``measured`` is set.
    mae : float
        The XGBoost regressor's held-out mean absolute error.
    predictions : pandas.DataFrame
        The predicted p99 speedup over cfs of cfs itself (1.0) and of every
        pinning policy, best first: ``policy``, ``xgboost``, and the
        baselines ``linear`` and ``constant`` (the training rows'
        geometric-mean speedup, the same for every pinning policy).
    evidence : pandas.DataFrame
        The nearest measured configurations, their ``distance`` and
        ``measured <policy>`` speedups (and the ``machine`` each was measured
        on, for results from several machines).
    covered : bool
        False when the question lies outside what the results cover.
    coverage : list of str
        One plain statement per way it does (empty when covered).
    notes : list of str
        Where the cfs stage times came from, and other caveats.
    learnt : bool
        Whether XGBoost did better (a lower MAE) than the constant baseline
        on held-out configurations. If not, the sweep's data cannot tell
        placements apart, and the model's word never advises pinning.
    measured : tuple or None
        Set only when the model learnt nothing and this very configuration
        was measured: ``(policy, speedup, low, high)`` of its fastest policy
        whose measured speedup's 95% interval lies above 1 (None if no
        policy's does). The advice then rests on that measurement alone.
    """

    workers: int
    threads: int
    model: str
    batch: int
    wait_policy: str
    spincount: int | None
    cpus: int
    oversubscription: float
    best_policy: str
    predicted_speedup: float
    pin: bool
    mae: float
    predictions: pd.DataFrame
    evidence: pd.DataFrame
    covered: bool
    coverage: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    learnt: bool = True
    measured: tuple | None = None

    @property
    def verdict(self):
        """One sentence: pin (with what, and why) or do not."""
        speedup, error = f"{self.predicted_speedup:.2f}x", f"held-out MAE {self.mae:.2f}"
        blind = "the sweep's data cannot tell placements apart (XGBoost did no better than a constant)"
        if not self.learnt and self.measured is not None:
            policy, value, low, high = self.measured
            text = (f"pin with {policy}: measured p99 speedup {value:.2f}x {format_interval(low, high)} over cfs "
                    f"in this very configuration; the model is no help here, as {blind}")
        elif not self.learnt:
            why = ("no policy's measured speedup in this configuration has an interval above 1"
                   if self._was_measured else "this configuration was not measured")
            text = f"do not pin on this evidence: {blind}, and {why}"
        elif self.pin:
            text = f"pin with {self.best_policy}: predicted p99 speedup {speedup} over cfs ({error})"
        elif self.predicted_speedup <= 1:
            text = (f"do not pin: no policy is predicted faster than cfs (best: {self.best_policy} at {speedup}; "
                    f"{error})")
        else:
            text = (f"do not pin on this evidence: the best policy, {self.best_policy} at {speedup} over cfs, is "
                    f"within the model's error ({error})")
        return text + ("" if self.covered else "; outside what the results cover, so measure before trusting it")

    @property
    def _was_measured(self):
        """Whether the question is a measured configuration (the nearest evidence is 0 away)."""
        return not self.evidence.empty and float(self.evidence["distance"].iloc[0]) == 0

    def to_dict(self):
        """A JSON-able dict (what ``tuna-lab advise --json`` prints)."""
        def records(frame):
            return [{k: (None if isinstance(v, float) and math.isnan(v) else
                         v.item() if isinstance(v, np.generic) else v) for k, v in r.items()}
                    for r in frame.to_dict("records")]

        return {
            "workers": self.workers, "threads": self.threads, "model": self.model, "batch": self.batch,
            "wait_policy": self.wait_policy, "spincount": self.spincount, "cpus": self.cpus,
            "oversubscription": self.oversubscription,
            "best_policy": self.best_policy, "predicted_speedup": self.predicted_speedup, "pin": self.pin,
            "verdict": self.verdict, "mae": self.mae, "predictions": records(self.predictions),
            "evidence": records(self.evidence), "covered": self.covered, "coverage": list(self.coverage),
            "notes": list(self.notes), "learnt": self.learnt,
            "measured": None if self.measured is None else dict(zip(
                ("policy", "speedup", "low", "high"),
                (v if isinstance(v, str) or math.isfinite(v) else None for v in self.measured))),
        }

    def __str__(self):
        spin = "" if self.spincount is None else f" (spin count {self.spincount})"
        lines = [f"Should I pin? W={self.workers} x T={self.threads}, model {self.model}, batch {self.batch}, "
                 f"wait policy {self.wait_policy}{spin}, {self.cpus} cpus (W*T/cpus = {self.oversubscription:g})",
                 f"  {self.verdict}", "  predicted p99 speedup over cfs (xgboost; baselines: linear, constant):"]
        for r in self.predictions.itertuples(index=False):
            lines.append(f"    {r.policy:<14}{r.xgboost:6.2f}x {r.linear:6.2f}x {r.constant:6.2f}x")
        lines.append("  evidence - nearest measured configurations (measured speedup over cfs):")
        measured = [c for c in self.evidence.columns if c.startswith("measured ")]
        for r in self.evidence.to_dict("records"):
            shown = "  ".join(f"{c[len('measured '):]} {r[c]:.2f}x" for c in measured if not pd.isna(r[c]))
            where = f"{r['machine']}: " if "machine" in r else ""
            lines.append(f"    {where}{r['cell']:<26} ({r['cpus']} cpus) distance {r['distance']:.2f}  {shown}")
        if self.covered:
            lines.append("  coverage: within what the results cover")
        else:
            lines.append("  coverage: OUTSIDE what the results cover:")
            lines += [f"    - {c}" for c in self.coverage]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)
