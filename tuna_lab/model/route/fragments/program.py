"""The cutting-stock program of one cache level, its relaxation and its integer plans.

A :class:`FragmentProgram` holds the columns - domain patterns
(:class:`Column`) and workers (:class:`~.partitions.Partition`) - and the
rows that tie them (:func:`assemble`); :meth:`FragmentProgram.solve` proves
its bound and finds a plan (:class:`FragmentSolution`), by price-and-branch
over the columns within a slack of central duals. A program too big to
write out hands its solve to :class:`~.pricing.Pricing`. The worker rules
(:func:`worker_cuts`) cut off the plans no mapping can follow.
"""

import itertools
import time
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from . import tuning

__all__ = ["Column", "FragmentProgram", "FragmentSolution", "assemble", "main_counts", "dual_bound",
           "central_bound", "worker_cuts", "pair_cuts", "restricted", "merged", "used_columns"]


class _Best(NamedTuple):
    """The best plan :meth:`FragmentProgram.solve` has found: its value and counts of every column."""

    value: float
    x: np.ndarray


class Column(NamedTuple):
    """A domain pattern: one column of a :class:`FragmentProgram`."""

    #: Index of the domains' class (their size) in :attr:`FragmentProgram.classes`.
    cls: int
    #: Main threads the domain holds (``a``).
    mains: int
    #: Events of (12) the domain spends (``e_l``).
    events: int
    #: Events of (12+) the domain spends (``e_p``).
    phys_events: int
    #: How many fragments of each size (entry ``k - 1``: size ``k``).
    counts: np.ndarray
    #: The column's part of the objective (the level's, and the finer levels' bound with the inner rule).
    value: float
    #: The largest fragment without a main.
    other: int

    def key(self):
        """The column's identity: its class, mains, events and fragment counts (arrays do not hash)."""
        return (self.cls, self.mains, self.events, self.phys_events,
                np.asarray(self.counts, dtype=np.int64).tobytes())


def main_counts(cnt, a, other):
    """How many of each pattern's fragments of each size must / may hold a main: ``(must, may)``.

    ``cnt``: fragment counts, one pattern per row; ``a``: each pattern's
    mains; ``other``: each pattern's largest fragment without a main
    (scalars or one per row). Fragments bigger than ``other`` must, and
    ``a`` mains on ``parts`` fragments leave at most ``parts - a`` without
    one; the mains left after the others' musts bound what may.
    """
    a = np.asarray(a, dtype=float).reshape(-1, 1)
    big = np.arange(1, cnt.shape[1] + 1)[None, :] > np.asarray(other).reshape(-1, 1)
    must = np.where(big, cnt, np.maximum(cnt - (cnt.sum(axis=1, keepdims=True) - a), 0))
    may = np.maximum(np.minimum(cnt, a - must.sum(axis=1, keepdims=True) + must), 0)
    return must, may


@dataclass(frozen=True)
class FragmentSolution:
    """The optimum of a :class:`FragmentProgram`, or the best found and a bound on it.

    Attributes
    ----------
    program : FragmentProgram
    bound : float
        Proven upper bound on the level's part of the objective.
    domains : ndarray of int or None
        How many domains take each domain column (``None``: no integer plan found).
    workers : ndarray of int or None
        How many workers take each partition of ``T``.
    proven : bool
        The plan reaches ``bound``.
    alternatives : tuple of FragmentSolution
        The other plans the search found on the way, best first (a plan
        forgets which worker is which, and a mapping may follow a worse one
        where it cannot follow the best).
    cuts : tuple of (tuple of int, int)
        The worker rules the search added (:func:`worker_cuts`): the plan
        and the bound keep them.
    search : ~tuna_lab.model.route.fragments.branching.Branching or None
        The generated program's search that stopped at its time limit
        (:meth:`resume` goes on with it); ``None`` when proven or written out.
    within : (float, float) or None
        ``(slack, value)``: no plan of the columns within ``slack`` beats
        ``value`` (see :meth:`FragmentProgram.solve`'s ``within``).
    """

    program: object
    bound: float
    domains: np.ndarray | None
    workers: np.ndarray | None
    proven: bool
    alternatives: tuple = ()
    cuts: tuple = ()
    search: object = field(default=None, repr=False, compare=False)
    within: tuple = field(default=None, repr=False, compare=False)

    def resume(self, time_limit, on_plan=None):
        """The search that stopped at this solution's time limit, run ``time_limit`` seconds more.

        A :class:`FragmentSolution` at least as good (a bound as low, a plan
        as high); ``self`` when it is proven or its search has nothing left
        to try. ``on_plan``: as in :meth:`FragmentProgram.solve`.
        """
        if self.proven or self.search is None:
            return self
        return self.search.run(time_limit, on_plan)


@dataclass
class FragmentProgram:
    """The cutting-stock program of level ``j``: see the module's text.

    Build it with :func:`~.build.fragment_program`. ``columns`` are the
    domain patterns (:class:`Column`); ``partitions`` the partitions of
    ``T`` (:class:`~.partitions.Partition`); ``value``, ``A``, ``lb``,
    ``ub`` the program ``max value @ n, lb <= A n <= ub`` over non-negative
    integers ``n`` (domain columns first); ``levels`` the levels of the
    objective its optimum bounds.
    """

    caps: object
    chain: list
    level: int
    levels: tuple
    classes: dict
    columns: list
    partitions: list
    value: np.ndarray
    A: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    upper: int
    pricing: object = None

    def solve(self, time_limit=5.0, slack=None, complete_below=np.inf, duals=None, ceiling=None, start=None,
              on_plan=None, cuts=None, within=None):
        """The level's bound and, where one is found, an integer plan (:class:`FragmentSolution`).

        The linear relaxation first: its optimum bounds the level in any
        case. When it is not integral, an integer program over the columns
        whose reduced cost is at most ``slack`` (default: 0.1% of the
        optimum, widened while it finds no such plan): a plan of value ``v``
        that any column left out cannot beat (``v >= D - slack``, ``D`` the
        bound the duals prove) is the integer optimum, and then ``v`` is the
        bound - the usual price-and-branch argument. The reduced costs are
        those of central duals (:func:`central_bound`): far fewer columns lie
        within a slack of them than of a vertex's. A program too big to
        write out generates its columns: it adds the patterns that price
        out (:class:`Pricing`) until none does, which proves the
        relaxation's optimum over all of them. ``None`` when the relaxation
        is infeasible or does not finish in ``time_limit``.

        ``duals``, ``ceiling``: duals to price with and the bound ``D`` they
        prove over every column (the program's and any left out), given
        together; the program then holds every column whose reduced cost is
        below ``complete_below`` (all of them unless it was generated).
        ``start``: a plan to begin from (counts of every column, domain
        columns first). ``on_plan``: called with each better plan a
        generated program's search finds on its way (a
        :class:`FragmentSolution`), so that a caller can map it while the
        search goes on to its time limit.

        A plan forgets which worker is which, so it may put two fragments
        of one worker in one domain, which no mapping can follow: such a
        plan is cut off by a worker rule (:func:`worker_cuts`), each a 0-1
        column of the integer program, and the program solved again. The
        rules hold for every mapping, so the bound is one on mappings (and
        no longer on the program). ``cuts``: the rules to begin with
        (default: :func:`pair_cuts`).

        ``within``: ``(slack, value)`` - no plan of the columns within
        ``slack`` beats ``value``, as a program solved before proved (its
        solution's ``within``); the integer program then looks only at
        plans with a column outside, and only at those better than the best
        plan so far, which is far less work than all of them again.
        """
        if self.pricing is not None:
            return self.pricing.solve(self, time_limit, slack, on_plan)

        t_end = time.perf_counter() + time_limit
        A, lb, ub = self.A, self.lb, self.ub
        n_dom = len(self.columns)
        cuts = pair_cuts(self) if cuts is None else list(cuts)
        if duals is None:
            relaxed = self.relaxation(time_limit)
            if relaxed is None:
                return None
            bound, x, _, y = relaxed
            if np.all(np.abs(x - np.round(x)) < 1e-7):
                x = np.round(x).astype(int)
                tol = 1e-7 * max(1.0, abs(bound))
                if not worker_cuts(self, x):
                    return FragmentSolution(self, bound + tol, x[:n_dom], x[n_dom:], True, cuts=tuple(cuts))
            _, reduced, ceiling = central_bound(self, y, bound, t_end)
        else:
            reduced, ceiling = dual_bound(self, duals)[1], float(ceiling)
        tol = 1e-7 * max(1.0, abs(ceiling))
        slack = 1e-3 * max(1.0, abs(ceiling)) if slack is None else float(slack)
        slack = min(slack, complete_below)
        best, tight = None, ceiling
        if start is not None and np.all(A @ start >= lb - 1e-9) and np.all(A @ start <= ub + 1e-9) \
                and not worker_cuts(self, start):
            best = _Best(float(self.value @ start), np.asarray(start, dtype=int))
        while time.perf_counter() < t_end - 0.05:
            keep = np.flatnonzero(reduced <= slack + tol)
            keep = keep[np.argsort(reduced[keep], kind="stable")]     # a canonical order: HiGHS is sensitive to it
            if not len(keep):
                slack = min(max(4 * slack, float(reduced.min())), complete_below)
                continue
            capped = len(keep) > tuning.RESTRICTED_COLUMNS
            if capped:
                keep = keep[np.argsort(reduced[keep], kind="stable")[:tuning.RESTRICTED_COLUMNS]]
                slack = float(reduced[keep].max()) - tol
            # the plans within the slack of a program solved before are known: at most ``known``. Only
            # those with a new column are left (one row), and only those better than the best plan
            # (HiGHS's cutoff)
            fresh = reduced[keep] > within[0] + tol if within is not None and within[0] < slack - tol else None
            known = within[1] if fresh is not None else -np.inf
            cutoff = best.value if fresh is not None and best is not None else None
            # the best plan so far, where it lies within the kept columns, is HiGHS's start
            begin = None
            if fresh is None and best is not None and not np.any(np.delete(best.x, keep)):
                begin = best.x[keep]
            ruled = len(keep) <= tuning.CUT_COLUMNS
            res = restricted(self, keep, cuts if ruled else (), max(0.05, t_end - time.perf_counter()), start=begin,
                              fresh=fresh, cutoff=cutoff)
            # a plan better than max(its dual bound, D - slack) would use only kept columns, and
            # none of those beats the dual bound: a bound on the level even when HiGHS stops early
            if res.status == "infeasible":
                # no plan (no plan better than the cutoff) with a new column: every plan leaves a kept
                # column out, or is one of those known
                region = -np.inf if cutoff is None else cutoff
                tight = min(tight, max(region, known, ceiling - slack))
                within = (slack, max(region, known))
            elif np.isfinite(res.bound):
                tight = min(tight, max(res.bound, known, ceiling - slack))
                if res.status == "optimal":
                    within = (slack, max(res.bound, known))
            if res.x is not None:
                x = np.zeros(len(self.value), dtype=int)
                x[keep] = res.x
                found = float(self.value @ x)
                broken = worker_cuts(self, x)
                if broken:
                    # no mapping follows it: cut it off (and every plan that breaks the same rules), and
                    # solve again where a plan of these columns could still prove it; else widen them
                    cuts += broken
                    if ruled and res.status == "optimal" and found >= ceiling - slack - tol:
                        continue
                elif best is None or found > best.value:
                    best = _Best(found, x)
            if best is not None and best.value >= tight - tol:
                # no plan with a column left out beats it: it is the integer optimum
                x = best.x
                return FragmentSolution(self, best.value + tol, x[:n_dom], x[n_dom:], True, cuts=tuple(cuts))
            if capped or res.status == "stopped" or slack >= complete_below:
                break                       # out of columns to add, or out of time
            # widen the columns to what a better plan could still use
            slack = max(2 * slack, ceiling - best.value + tol) if best is not None else 4 * slack
            slack = min(slack, complete_below)
        if best is None:
            return FragmentSolution(self, tight + tol, None, None, False, cuts=tuple(cuts), within=within)
        x = best.x
        return FragmentSolution(self, tight + tol, x[:n_dom], x[n_dom:], False, cuts=tuple(cuts), within=within)

    def relaxation(self, time_limit=5.0):
        """``(optimum, x, reduced costs)`` of the linear relaxation, or ``None``.

        The reduced cost of a column is how much a plan loses, per unit of
        it, against the relaxation's optimum; with the duals ``y`` (one per
        row) it is ``-(value + A^T y)``.
        """
        # HiGHS itself rather than scipy's linprog over it: importing scipy.optimize takes 0.2-0.6 s.
        # Primal simplex without presolve: a cutting-stock relaxation has a few dozen rows and up to
        # 80,000 columns, on which the dual simplex after presolve took 3.5 s and this 0.25 s
        import highspy

        from ...highs.programs import boxed_max

        h = boxed_max(self.value, self.A, self.lb, self.ub, self.upper, max(0.1, time_limit),
                      options={"presolve": "off", "simplex_strategy": 4})
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        solution = h.getSolution()
        x, y = np.asarray(solution.col_value), np.asarray(solution.row_dual)
        # (HiGHS minimises -value: its row duals are those of the reduced costs -value - A^T y)
        return float(self.value @ x), x, -self.value - self.A.T @ y, y


def dual_bound(program, y, unseen=0.0):
    """``(y, reduced costs, D)``: duals ``y`` made feasible in sign, and the bound ``D`` they prove.

    For any plan ``x`` (``0 <= x <= upper``, ``lb <= A x <= ub``),
    ``value @ x <= D - sum(reduced[j] * x[j] for reduced[j] >= 0)``: weak
    duality, with ``D`` the duals' objective plus what columns of negative
    reduced cost could add at their upper bound, plus ``unseen`` (what the
    columns left out of a generated program could add). A column of reduced
    cost above ``D - v`` is in no plan of value ``v`` or more.
    """
    lb, ub = program.lb, program.ub
    # a dual may pull a row only towards a bound it has
    y = np.where(np.isfinite(lb), y, np.minimum(y, 0.0))
    y = np.where(np.isfinite(ub), y, np.maximum(y, 0.0))
    reduced = -program.value - program.A.T @ y
    rows = np.where(y > 0, y * np.where(np.isfinite(lb), lb, 0.0), y * np.where(np.isfinite(ub), ub, 0.0))
    ceiling = float(-rows.sum() - program.upper * np.minimum(reduced, 0.0).sum() + unseen)
    return y, reduced, ceiling


def central_bound(program, y, bound, t_end, unseen=0.0):
    """``(duals, reduced costs, D)`` (:func:`dual_bound`): central duals of ``program``
    (:func:`~tuna_lab.model.highs.programs.central_duals`) where they prove nearly the relaxation's optimum ``bound``, else
    the vertex's ``y``."""
    from ...highs.programs import central_duals

    vertex = dual_bound(program, y, unseen)
    left = t_end - time.perf_counter()
    yc = central_duals(program.value, program.A, program.lb, program.ub, program.upper, left) \
        if left > 0.1 else None
    if yc is not None:
        central = dual_bound(program, yc, unseen)
        if central[2] <= vertex[2] + 1e-6 * max(1.0, abs(bound)):
            return central
    return vertex


def worker_cuts(program, x):
    """The worker rules plan ``x`` (counts of every column of ``program``) breaks, as ``(sizes, need)``.

    A domain's fragments belong to distinct workers, so a domain that takes
    ``need`` fragments of the sizes ``sizes`` (indices: size - 1) needs
    ``need`` workers with a fragment of one of those sizes. Every mapping
    keeps these rules; a plan, which forgets which worker is which, may not.
    The smallest sets of sizes a used pattern breaks the rule for, at most
    ``tuning.CUT_SIZES`` sizes of a pattern considered.
    """
    n_dom = len(program.columns)
    x = np.asarray(x)
    parts = np.array([p.counts for p in program.partitions])
    out = []
    for c in np.flatnonzero(x[:n_dom]):
        vec = np.asarray(program.columns[c].counts)
        sizes = np.flatnonzero(vec)[::-1][:tuning.CUT_SIZES]
        broken = []
        for r in range(1, len(sizes) + 1):
            for S in itertools.combinations(sorted(int(k) for k in sizes), r):
                if any(set(b) <= set(S) for b in broken):
                    continue
                need = int(vec[list(S)].sum())
                if int(x[n_dom:] @ (parts[:, list(S)].sum(axis=1) > 0)) < need:
                    broken.append(S)
                    if (S, need) not in out:
                        out.append((S, need))
    return out


def pair_cuts(program):
    """The worker rules of :func:`worker_cuts` for the workers of two fragments, written before any plan breaks them.

    A plan breaks a rule most often by putting one worker's two fragments
    ``p`` and ``T - p`` in one domain, where no worker can hold them both:
    one rule for each split of ``T`` in two, so that the search never meets
    those plans (found one at a time, each would cost a program solved again).
    """
    T, largest = program.caps.instance.T, len(program.partitions[0].counts)
    return [(tuple(sorted({p - 1, T - p - 1})), 2) for p in range(1, T // 2 + 1) if T - p <= largest]


def restricted(program, keep, cuts, time_limit, start=None, fresh=None, cutoff=None):
    """:func:`~tuna_lab.model.highs.programs.integer_program` over the columns ``keep`` of ``program``, with the
    worker rules ``cuts``.

    Each rule ``(sizes, need)`` (:func:`worker_cuts`) is a 0-1 column ``u``:
    the domains taking a pattern of ``need`` or more fragments of those
    sizes are at most ``u`` times all of them, and the workers with a
    fragment of one of them at least ``need u``. ``start``: counts of the
    kept columns. ``fresh``: the kept columns (a mask) of which a plan must
    use one; ``cutoff``: a value a plan must beat (``"infeasible"`` when none
    does). The result's ``x`` holds the kept columns only.
    """
    from ...highs.programs import IntegerResult, integer_program

    A, lb, ub, value = program.A[:, keep], program.lb, program.ub, program.value[keep]
    upper = np.full(len(keep), float(program.upper))
    if cuts:
        n_dom = len(program.columns)
        dom, wrk = keep[keep < n_dom], keep[keep >= n_dom] - n_dom
        vecs = np.zeros((len(keep), len(program.partitions[0].counts)))
        vecs[keep < n_dom] = [program.columns[i].counts for i in dom]
        parts = np.zeros_like(vecs)
        parts[keep >= n_dom] = [program.partitions[i].counts for i in wrk]
        k, domains = len(cuts), float(sum(program.classes.values()))
        takes = np.array([vecs[:, list(S)].sum(axis=1) >= need for S, need in cuts], dtype=float)
        has = np.array([parts[:, list(S)].sum(axis=1) > 0 for S, _ in cuts], dtype=float)
        needs = np.array([need for _, need in cuts], dtype=float)
        A = np.block([[A, np.zeros((len(A), k))], [takes, -domains * np.eye(k)], [has, -np.diag(needs)]])
        lb = np.concatenate([lb, np.full(k, -np.inf), np.zeros(k)])
        ub = np.concatenate([ub, np.zeros(k), np.full(k, np.inf)])
        value = np.concatenate([value, np.zeros(k)])
        upper = np.concatenate([upper, np.ones(k)])
        if start is not None:
            used = (takes @ start > 0).astype(float)
            start = np.concatenate([start, used]) if np.all(has @ start >= needs * used) else None
    if fresh is not None:
        row = np.zeros(A.shape[1])
        row[:len(keep)] = fresh
        A, lb, ub = np.vstack([A, row]), np.append(lb, 1.0), np.append(ub, np.inf)
    res = integer_program(value, A, lb, ub, upper, time_limit, start=start, cutoff=cutoff)
    if cuts and res.x is not None:
        res = IntegerResult(res.status, res.x[:len(keep)], res.value, res.bound)
    return res



def assemble(caps, classes, columns, partitions, largest):
    """``(value, A, lb, ub)`` of the program over ``columns`` (domain patterns) and ``partitions``."""
    W = caps.instance.W
    n_w = len(partitions)
    zeros_w = np.zeros(n_w)
    dom = np.array([c.counts for c in columns], dtype=float).T
    wrk = np.array([p.counts for p in partitions], dtype=float).T
    marked = np.zeros((largest, n_w))
    marked[[p.marked for p in partitions], np.arange(n_w)] = 1.0
    ci = np.array([c.cls for c in columns])
    a, el, ep = (np.array([getattr(c, name) for c in columns], dtype=float)
                 for name in ("mains", "events", "phys_events"))
    must, may = main_counts(dom.T, a, [c.other for c in columns])
    A, lb, ub = [], [], []
    for k, count in enumerate(classes.values()):                 # every domain takes one pattern
        A.append(np.concatenate([(ci == k).astype(float), zeros_w]))
        lb.append(count)
        ub.append(count)
    A.append(np.concatenate([a, zeros_w]))                         # W main threads
    lb.append(W)
    ub.append(W)
    A.append(np.concatenate([np.zeros(len(columns)), np.ones(n_w)]))   # W workers
    lb.append(W)
    ub.append(W)
    for k in range(largest):                                        # fragments of each size match
        A.append(np.concatenate([dom[k], -wrk[k]]))
        lb.append(0)
        ub.append(0)
        # and the fragments of that size holding a main lie within what the domains allow
        A.append(np.concatenate([-must[:, k], marked[k]]))
        lb.append(0)
        ub.append(np.inf)
        A.append(np.concatenate([-may[:, k], marked[k]]))
        lb.append(-np.inf)
        ub.append(0)
    if caps.event_budget is not None:
        A.append(np.concatenate([el, zeros_w]))
        lb.append(-np.inf)
        ub.append(caps.event_budget)
    if caps.phys_event_budget is not None:
        A.append(np.concatenate([ep, zeros_w]))
        lb.append(-np.inf)
        ub.append(caps.phys_event_budget)
    value = np.concatenate([[c.value for c in columns], zeros_w])
    return value, np.array(A, dtype=float), np.array(lb, dtype=float), np.array(ub, dtype=float)



def merged(old, new):
    """``old`` and then the items of ``new`` whose :meth:`key <Column.key>` is not among them yet, in order."""
    seen = {item.key() for item in old}
    out = list(old)
    for item in new:
        if item.key() not in seen:
            seen.add(item.key())
            out.append(item)
    return out


def used_columns(program, solution):
    """The columns ``solution`` uses, by their keys (:meth:`Column.key`, :meth:`Partition.key
    <.partitions.Partition.key>`), with their counts: the plan's identity, whichever program holds it."""
    return ({program.columns[i].key(): int(solution.domains[i]) for i in np.flatnonzero(solution.domains)} |
            {program.partitions[i].key(): int(solution.workers[i]) for i in np.flatnonzero(solution.workers)})

