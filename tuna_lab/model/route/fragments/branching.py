"""Price-and-branch over a generated program's patterns, within a slack that grows until it proves its plan.

:class:`Branching` is the search of one generated
:class:`~.program.FragmentProgram`; it keeps its state, so that a solution
returned unproven at its time limit resumes where it stopped
(:meth:`FragmentSolution.resume <.program.FragmentSolution.resume>`).
"""

import time
from dataclasses import replace
from typing import NamedTuple

import numpy as np

from . import tuning
from .program import FragmentSolution, dual_bound, pair_cuts, used_columns

__all__ = ["Branching"]


class _Plan(NamedTuple):
    """The best plan a :class:`Branching` has found."""

    value: float
    solution: FragmentSolution
    #: Its columns by key, with their counts (:func:`~.program.used_columns`): the plan on any program.
    used: dict


class Branching:
    """Price-and-branch over the patterns of a generated program within a growing slack.

    Every pattern prices out at the duals ``y``, which prove ``ceiling``
    over all of them. Branch over those a better plan could use (reduced
    cost at most ``slack``); a plan ``v`` short of ``ceiling - slack`` proves
    nothing yet, so widen to ``ceiling - v``, where the branch's optimum is
    the integer optimum. The search keeps its state: a solution it returns
    unproven at its time limit resumes where it stopped
    (:meth:`FragmentSolution.resume`).
    """

    def __init__(self, pricing, program, y, ceiling, slack):
        self.pricing, self.program, self.y, self.ceiling = pricing, program, y, ceiling
        self.tol = 1e-7 * max(1.0, abs(ceiling))
        self.slack = 1e-3 * max(1.0, abs(ceiling)) if slack is None else float(slack)
        self.best, self.final, self.tight = None, replace(program, pricing=None), ceiling + self.tol
        self.plans = []                    # the plans best was before, best first
        self.over = False                  # nothing left to try
        self.cuts = tuple(pair_cuts(program))      # the worker rules so far (they hold for every program)
        self.kept = 0                      # the columns within the slack of the last program solved
        self.within = None                 # (slack, value): no plan within that slack beats the value
        self.jump = False                  # the last program was quick and found a plan (see run)

    def run(self, time_limit, on_plan=None):
        """The best solution after up to ``time_limit`` seconds more (:class:`FragmentSolution`); ``on_plan``
        is called with each better plan on the way."""
        t_end = time.perf_counter() + time_limit
        tol, ceiling = self.tol, self.ceiling
        while not self.over and time.perf_counter() < t_end:
            near = self.pricing.price(self.y, -self.slack, t_end, keep=None)
            near_workers = self.pricing.price_workers(self.y, -self.slack, t_end) if near is not None else None
            if near is None or near_workers is None or len(near) + len(near_workers) > tuning.MAX_COLUMNS:
                self.over = near is not None and near_workers is not None   # too many: the bound stands alone
                break
            final = replace(self.pricing.extended(self.program, near, near_workers), pricing=None)
            self.final = final
            # HiGHS's time grows much faster than the columns: at most tuning.GROWTH times the last program's
            # (the slack that holds that many), unless that is still few
            reduced = dual_bound(final, self.y)[1]
            within = np.sort(reduced[reduced <= self.slack + tol])
            most = tuning.JUMP_COLUMNS if self.jump else max(int(tuning.GROWTH * self.kept), tuning.FREE_COLUMNS)
            if self.kept and len(within) > most:
                self.slack = float(within[most])
            self.kept = int(np.sum(reduced <= self.slack + tol))
            left = t_end - time.perf_counter()
            start = None
            if self.best is not None:         # the best plan so far, on this program's columns
                at = {c.key(): i for i, c in enumerate(final.columns)} | \
                    {p.key(): len(final.columns) + i for i, p in enumerate(final.partitions)}
                used = self.best.used
                if all(k in at for k in used):
                    start = np.zeros(len(final.value), dtype=int)
                    start[[at[k] for k in used]] = list(used.values())
            began, before = time.perf_counter(), -np.inf if self.best is None else self.best.value
            solution = final.solve(left, slack=self.slack, complete_below=self.slack, duals=self.y,
                                   ceiling=ceiling, start=start, cuts=self.cuts, within=self.within) \
                if left > 0 else None
            quick = time.perf_counter() - began < min(tuning.QUICK * left, tuning.QUICK_S)
            if solution is None or solution.bound > ceiling + 2 * tol:     # (its own tolerance added)
                self.over = solution is not None
                break
            self.cuts = solution.cuts
            self.within = solution.within or self.within
            if solution.proven:
                used = used_columns(final, solution)
                same = self.best is not None and self.best.used == used
                return replace(solution, alternatives=self.alternatives(1 if same else 0))
            self.tight = min(self.tight, solution.bound)
            if solution.domains is not None:
                found = float(final.value @ np.concatenate([solution.domains, solution.workers]))
                if self.best is None or found > self.best.value:
                    if self.best is not None:
                        self.plans = [self.best.solution] + self.plans[:tuning.ALTERNATIVES - 1]
                    self.best = _Plan(found, solution, used_columns(final, solution))
                    if on_plan is not None and found < self.tight - 2 * tol:
                        on_plan(solution)
                if self.best.value >= self.tight - 2 * tol:
                    break
            stopped = time.perf_counter() >= t_end - 0.05
            if stopped and (self.best is None or self.best.value <= before):
                break                        # stopped at the time limit with nothing new: resume it as it was
            wider = (4 if self.best is None or quick else tuning.WIDEN) * self.slack
            # a quick program with a plan: straight to the slack that proves the plan, or to as many
            # columns as a program HiGHS solves in a second or two holds (its time hardly grows with
            # the columns up to there, and each program solved on the way costs its root again)
            self.jump = quick and self.best is not None
            if self.best is not None:
                wider = ceiling - self.best.value + tol if self.jump else min(wider, ceiling - self.best.value + tol)
            if wider <= self.slack * (1 + 1e-9):
                self.over = not stopped      # a program cut short may still prove it: run it again
                break
            self.slack = wider
        if self.best is not None:
            sol = self.best.solution
            proven = self.best.value >= self.tight - 2 * tol
            return replace(sol, bound=min(self.tight, sol.bound), proven=proven, alternatives=self.alternatives(1),
                           search=None if proven else self)
        return FragmentSolution(self.final, self.tight, None, None, False, (), self)

    def alternatives(self, skip=0):
        """The plans found so far, best first, without the ``skip`` best (a few: each holds its program)."""
        plans = ([self.best.solution] if self.best is not None else []) + self.plans
        return tuple(replace(p, alternatives=(), search=None) for p in plans[skip:skip + tuning.ALTERNATIVES])

