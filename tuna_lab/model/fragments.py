"""How workers split over the cache domains of one level: a bound, and the mapping it points to.

In compact mode each worker wants its threads in few domains of a cache
level (an L3, say), while the main threads want to be spread over them and
the load families cap what a domain holds. A worker's threads in one domain
form a *fragment*; its fragments over the level's domains are a partition
of its ``T`` threads, and a domain's fragments a partition of the threads it
carries. The level's part of the objective, ``-1/2 wt (a^2 - sum x^2)`` per
domain (``a`` main threads, fragments of ``x`` threads), depends on nothing
else.

Domains of one size and workers are interchangeable, so the best split is
a small integer program over *how many* domains take each pattern (a
partition of their threads into fragments, with ``a`` mains and the events
of (12)/(12+) they use) and how many workers each partition of ``T``, with
the fragments of each size counted equal on both sides - the cutting-stock
form. Its optimum bounds the level (:meth:`FragmentProgram.solve`; the
relaxation forgets which worker is which and the cores inside a domain),
and its solution is a plan: :func:`fragment_mapping` deals the fragments to
workers and domains and places each domain's fragments on its cores with a
small exact program that keeps every family of the model and makes the
finer levels (SMT siblings, shared L2) as good as they can be.

Examples
--------
>>> from tuna_lab import Topology, TunaModel
>>> from tuna_lab.model.encodings import ultrametric_chain
>>> model = TunaModel(64, 6, Topology.preset("epyc-9654-2s"), mode="compact")
>>> chain = ultrametric_chain(model.instance.topology)
>>> solution = fragment_program(model.caps, chain, 2, inner=False).solve()
>>> round(solution.bound)             # the L3 level's part: 64 workers of 6 on 24 L3s of 16
140400
>>> positions = fragment_mapping(model.caps, chain, solution)
>>> positions.shape
(64, 6)
"""

import itertools
import time
from dataclasses import dataclass, field, replace

import numpy as np

from .bounds import domain_shapes
from .ranks import assign_ranks

__all__ = ["MAX_COLUMNS", "FragmentProgram", "FragmentSolution", "fragment_program", "fragment_mapping"]

#: Most columns (domain patterns plus worker partitions) :func:`fragment_program` builds.
MAX_COLUMNS = 60000


def _partitions(n, largest, most=None):
    """Every partition of ``n`` into parts of at most ``largest`` (and at most ``most`` parts), non-increasing."""
    if n == 0:
        yield ()
        return
    if most is not None and (most <= 0 or n > most * largest):
        return
    for first in range(min(n, largest), 0, -1):
        for rest in _partitions(n - first, first, None if most is None else most - 1):
            yield (first,) + rest


def _count_vectors(n_min, n_max, largest):
    """Every partition of ``n_min..n_max`` into parts of at most ``largest``, as count vectors (rows).

    Built size by size with numpy (all count vectors over the sizes up to
    ``k``, by their total), not part by part: tens of thousands of rows in
    milliseconds.
    """
    # by[t]: the count vectors over sizes 1..k (columns) whose parts add up to t
    by = [np.zeros((1, 0), dtype=np.int64)] + [np.zeros((0, 0), dtype=np.int64)] * n_max
    for k in range(1, largest + 1):
        nxt = []
        for t in range(n_max + 1):
            blocks = [np.hstack([by[t - c * k], np.full((len(by[t - c * k]), 1), c, dtype=np.int64)])
                      for c in range(t // k + 1) if len(by[t - c * k])]
            nxt.append(np.vstack(blocks) if blocks else np.zeros((0, k), dtype=np.int64))
        by = nxt
    rows = [by[t] for t in range(n_min, n_max + 1)]
    return np.vstack(rows) if rows else np.zeros((0, largest), dtype=np.int64)


def _count_partitions(n_max, largest, most):
    """How many partitions of each ``n <= n_max`` have parts of at most ``largest`` and at most ``most`` parts."""
    # ways[n, p]: partitions of n into exactly p parts, sizes added one at a time (each any number of times)
    most = min(most, n_max)
    ways = np.zeros((n_max + 1, most + 1))
    ways[0, 0] = 1.0
    for k in range(1, largest + 1):
        for n in range(k, n_max + 1):
            ways[n, 1:] += ways[n - k, :-1]
    return ways.sum(axis=1)


def _counts(part, largest):
    """A partition as a count vector: entry ``k - 1`` is how many parts have size ``k``."""
    return np.bincount(np.asarray(part, dtype=int) - 1, minlength=largest)[:largest] if part \
        else np.zeros(largest, dtype=int)


def _marked(T, largest, most=None):
    """The workers: partitions of ``T`` (at most ``most`` parts) as ``(count vector, index of the marked size)``,
    one for each size a part has (the fragment holding the main thread)."""
    out = []
    for part in _partitions(T, largest, most):
        vec = _counts(part, largest)
        out += [(vec, int(k)) for k in np.flatnonzero(vec)]
    return out


def _part_key(partition):
    """A worker column's identity: its count vector and marked size."""
    return np.asarray(partition[0], dtype=np.int64).tobytes(), int(partition[1])


def _mains(cnt, a, other):
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
        The worker rules the search added (:func:`_worker_cuts`): the plan
        and the bound keep them.
    """

    program: object
    bound: float
    domains: np.ndarray | None
    workers: np.ndarray | None
    proven: bool
    alternatives: tuple = ()
    cuts: tuple = ()
    _search: object = field(default=None, repr=False, compare=False)
    _within: tuple = field(default=None, repr=False, compare=False)

    def resume(self, time_limit, on_plan=None):
        """The search that stopped at this solution's time limit, run ``time_limit`` seconds more.

        A :class:`FragmentSolution` at least as good (a bound as low, a plan
        as high); ``self`` when it is proven or its search has nothing left
        to try. ``on_plan``: as in :meth:`FragmentProgram.solve`.
        """
        if self.proven or self._search is None:
            return self
        return self._search.run(time_limit, on_plan)


@dataclass
class FragmentProgram:
    """The cutting-stock program of level ``j``: see the module's text.

    Build it with :func:`fragment_program`. ``columns`` are the domain
    patterns ``(class, a, e_l, e_p, fragment counts, value, other)``
    (``other``: the largest fragment without a main); ``partitions`` the
    partitions of ``T`` as ``(count vector, index of the marked size)``; ``value``, ``A``, ``lb``,
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
        those of central duals (:func:`_central`): far fewer columns lie
        within a slack of them than of a vertex's. A program too big to
        write out generates its columns: it adds the patterns that price
        out (:class:`_Pricing`) until none does, which proves the
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
        plan is cut off by a worker rule (:func:`_worker_cuts`), each a 0-1
        column of the integer program, and the program solved again. The
        rules hold for every mapping, so the bound is one on mappings (and
        no longer on the program). ``cuts``: the rules to begin with
        (default: :func:`_pair_cuts`).

        ``within``: ``(slack, value)`` - no plan of the columns within
        ``slack`` beats ``value``, as a program solved before proved (its
        solution's ``_within``); the integer program then looks only at
        plans with a column outside, and only at those better than the best
        plan so far, which is far less work than all of them again.
        """
        if self.pricing is not None:
            return self.pricing.solve(self, time_limit, slack, on_plan)

        t_end = time.perf_counter() + time_limit
        A, lb, ub = self.A, self.lb, self.ub
        n_dom = len(self.columns)
        cuts = _pair_cuts(self) if cuts is None else list(cuts)
        if duals is None:
            relaxed = self.relaxation(time_limit)
            if relaxed is None:
                return None
            bound, x, _, y = relaxed
            if np.all(np.abs(x - np.round(x)) < 1e-7):
                x = np.round(x).astype(int)
                tol = 1e-7 * max(1.0, abs(bound))
                if not _worker_cuts(self, x):
                    return FragmentSolution(self, bound + tol, x[:n_dom], x[n_dom:], True, cuts=tuple(cuts))
            _, reduced, ceiling = _central(self, y, bound, t_end)
        else:
            reduced, ceiling = _dual_bound(self, duals)[1], float(ceiling)
        tol = 1e-7 * max(1.0, abs(ceiling))
        slack = 1e-3 * max(1.0, abs(ceiling)) if slack is None else float(slack)
        slack = min(slack, complete_below)
        best, tight = None, ceiling
        if start is not None and np.all(A @ start >= lb - 1e-9) and np.all(A @ start <= ub + 1e-9) \
                and not _worker_cuts(self, start):
            best = (float(self.value @ start), np.asarray(start, dtype=int))
        while time.perf_counter() < t_end - 0.05:
            keep = np.flatnonzero(reduced <= slack + tol)
            keep = keep[np.argsort(reduced[keep], kind="stable")]     # a canonical order: HiGHS is sensitive to it
            if not len(keep):
                slack = min(max(4 * slack, float(reduced.min())), complete_below)
                continue
            capped = len(keep) > _RESTRICTED_COLUMNS
            if capped:
                keep = keep[np.argsort(reduced[keep], kind="stable")[:_RESTRICTED_COLUMNS]]
                slack = float(reduced[keep].max()) - tol
            # the plans within the slack of a program solved before are known: at most ``known``. Only
            # those with a new column are left (one row), and only those better than the best plan
            # (HiGHS's cutoff)
            fresh = reduced[keep] > within[0] + tol if within is not None and within[0] < slack - tol else None
            known = within[1] if fresh is not None else -np.inf
            cutoff = best[0] if fresh is not None and best is not None else None
            # the best plan so far, where it lies within the kept columns, is HiGHS's start
            begin = None
            if fresh is None and best is not None and not np.any(np.delete(best[1], keep)):
                begin = best[1][keep]
            ruled = len(keep) <= _CUT_COLUMNS
            res = _restricted(self, keep, cuts if ruled else (), max(0.05, t_end - time.perf_counter()), start=begin,
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
                broken = _worker_cuts(self, x)
                if broken:
                    # no mapping follows it: cut it off (and every plan that breaks the same rules), and
                    # solve again where a plan of these columns could still prove it; else widen them
                    cuts += broken
                    if ruled and res.status == "optimal" and found >= ceiling - slack - tol:
                        continue
                elif best is None or found > best[0]:
                    best = (found, x)
            if best is not None and best[0] >= tight - tol:
                # no plan with a column left out beats it: it is the integer optimum
                x = best[1]
                return FragmentSolution(self, best[0] + tol, x[:n_dom], x[n_dom:], True, cuts=tuple(cuts))
            if capped or res.status == "stopped" or slack >= complete_below:
                break                       # out of columns to add, or out of time
            # widen the columns to what a better plan could still use
            slack = max(2 * slack, ceiling - best[0] + tol) if best is not None else 4 * slack
            slack = min(slack, complete_below)
        if best is None:
            return FragmentSolution(self, tight + tol, None, None, False, cuts=tuple(cuts), _within=within)
        x = best[1]
        return FragmentSolution(self, tight + tol, x[:n_dom], x[n_dom:], False, cuts=tuple(cuts), _within=within)

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

        from ._highs import boxed_max

        h = boxed_max(self.value, self.A, self.lb, self.ub, self.upper, max(0.1, time_limit),
                      options={"presolve": "off", "simplex_strategy": 4})
        h.run()
        if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
            return None
        solution = h.getSolution()
        x, y = np.asarray(solution.col_value), np.asarray(solution.row_dual)
        # (HiGHS minimises -value: its row duals are those of the reduced costs -value - A^T y)
        return float(self.value @ x), x, -self.value - self.A.T @ y, y


def _dual_bound(program, y, unseen=0.0):
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


def _central(program, y, bound, t_end, unseen=0.0):
    """``(duals, reduced costs, D)`` (:func:`_dual_bound`): central duals of ``program``
    (:func:`_highs.central_duals`) where they prove nearly the relaxation's optimum ``bound``, else
    the vertex's ``y``."""
    from ._highs import central_duals

    vertex = _dual_bound(program, y, unseen)
    left = t_end - time.perf_counter()
    yc = central_duals(program.value, program.A, program.lb, program.ub, program.upper, left) \
        if left > 0.1 else None
    if yc is not None:
        central = _dual_bound(program, yc, unseen)
        if central[2] <= vertex[2] + 1e-6 * max(1.0, abs(bound)):
            return central
    return vertex


def _worker_cuts(program, x):
    """The worker rules plan ``x`` (counts of every column of ``program``) breaks, as ``(sizes, need)``.

    A domain's fragments belong to distinct workers, so a domain that takes
    ``need`` fragments of the sizes ``sizes`` (indices: size - 1) needs
    ``need`` workers with a fragment of one of those sizes. Every mapping
    keeps these rules; a plan, which forgets which worker is which, may not.
    The smallest sets of sizes a used pattern breaks the rule for, at most
    ``_CUT_SIZES`` sizes of a pattern considered.
    """
    n_dom = len(program.columns)
    x = np.asarray(x)
    parts = np.array([vec for vec, _ in program.partitions])
    out = []
    for c in np.flatnonzero(x[:n_dom]):
        vec = np.asarray(program.columns[c][4])
        sizes = np.flatnonzero(vec)[::-1][:_CUT_SIZES]
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


def _pair_cuts(program):
    """The worker rules of :func:`_worker_cuts` for the workers of two fragments, written before any plan breaks them.

    A plan breaks a rule most often by putting one worker's two fragments
    ``p`` and ``T - p`` in one domain, where no worker can hold them both:
    one rule for each split of ``T`` in two, so that the search never meets
    those plans (found one at a time, each would cost a program solved again).
    """
    T, largest = program.caps.instance.T, len(program.partitions[0][0])
    return [(tuple(sorted({p - 1, T - p - 1})), 2) for p in range(1, T // 2 + 1) if T - p <= largest]


def _restricted(program, keep, cuts, time_limit, start=None, fresh=None, cutoff=None):
    """:func:`_highs.integer_program` over the columns ``keep`` of ``program``, with the worker rules ``cuts``.

    Each rule ``(sizes, need)`` (:func:`_worker_cuts`) is a 0-1 column ``u``:
    the domains taking a pattern of ``need`` or more fragments of those
    sizes are at most ``u`` times all of them, and the workers with a
    fragment of one of them at least ``need u``. ``start``: counts of the
    kept columns. ``fresh``: the kept columns (a mask) of which a plan must
    use one; ``cutoff``: a value a plan must beat (``"infeasible"`` when none
    does). The result's ``x`` holds the kept columns only.
    """
    from ._highs import IntegerResult, integer_program

    A, lb, ub, value = program.A[:, keep], program.lb, program.ub, program.value[keep]
    upper = np.full(len(keep), float(program.upper))
    if cuts:
        n_dom = len(program.columns)
        dom, wrk = keep[keep < n_dom], keep[keep >= n_dom] - n_dom
        vecs = np.zeros((len(keep), len(program.partitions[0][0])))
        vecs[keep < n_dom] = [program.columns[i][4] for i in dom]
        parts = np.zeros_like(vecs)
        parts[keep >= n_dom] = [program.partitions[i][0] for i in wrk]
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


#: Most patterns of each shape one round of pricing adds.
_KEEP = 200

#: Most partial patterns one level of :meth:`_Pricing.price`'s walk may hold (a few hundred MB at most):
#: past it the walk gives up, and nothing is proven by that round.
_STATE_LIMIT = 2_000_000


class _Pricing:
    """The domain patterns of a program too big to write out: a first few, and those that price out.

    A domain pattern's reduced profit ``value + A^T y`` (``y``: the
    relaxation's duals) is its fragments' own terms plus a few that depend
    on all of them (the finer levels' bound, which fragments must hold a
    main). Each fragment of size ``k`` adds at most ``h_k`` to it, so the
    best any completion of a partial pattern can reach is a knapsack over
    the threads left, and a walk over the partitions, level by level
    (largest fragments first, every partial pattern of a level at once in
    numpy), prunes every partial pattern that cannot reach the threshold.
    With ``most``, the partitions of ``T`` are generated the same way
    (:meth:`price_workers`), from those of at most ``most`` parts.
    """

    def __init__(self, caps, chain, j, wt, classes, shapes, largest, inner, most=None):
        self.caps, self.wt, self.shapes, self.largest, self.inner = caps, wt, shapes, largest, inner
        self.workers = most is not None
        self.most = most                      # the most parts of the partitions written out so far
        self.npc = [key[1] for key in classes]
        self.counts = list(classes.values())
        self.nc = len(classes)
        self.sizes = np.arange(1, largest + 1)
        self.squares = self.sizes ** 2
        self.use_main = caps.spread_main
        self.W = caps.instance.W
        self.event_row = self.nc + 2 + 3 * largest
        self.pevent_row = self.event_row + (caps.event_budget is not None)
        self._table = None                  # see table(): None not built yet, False too big

    def table(self, deadline=None):
        """Every pattern a domain could take, as rows of fragment counts, or ``None`` when there are too many.

        All partitions of up to the largest domain's threads into at most
        ``W`` fragments of at most the largest size, built once: where they
        fit in memory, pricing evaluates them all at once (exact, and far
        cheaper than the pruned walk on domains of 32 logical cores).
        """
        if self._table is None:
            h_max = max((hi for *_, hi, _, _ in self.shapes), default=0)
            n_min = min((max(lo, a) for _, a, _, _, lo, *_ in self.shapes), default=0)
            # count them first (any number of parts: the table's rows before the W filter)
            if _count_partitions(h_max, self.largest, h_max)[n_min:].sum() > _TABLE_ROWS:
                self._table = False
                return None
            V = _count_vectors(n_min, h_max, self.largest)
            V = V[V.sum(axis=1) <= self.W]
            # counts of fragments bigger than each size (tail[:, k]: sizes above k), for the shapes' filters
            tail = np.concatenate([np.cumsum(V[:, ::-1], axis=1)[:, ::-1], np.zeros((len(V), 1), dtype=np.int64)],
                                  axis=1)
            self._table = (V, V @ self.sizes, V.sum(axis=1), tail)
        return self._table or None

    def _values(self, shape, V):
        """The program's value of every pattern of ``V`` (fragment counts, one per row) in ``shape``."""
        ci, a, el, ep, *_ = shape
        value = -0.5 * self.wt * ((a * a if self.use_main else 0) - V.astype(float) @ self.squares)
        if self.inner is not None:
            value = value + self.inner(V, V @ self.sizes, a, el, ep, self.npc[ci], shape[-1])
        return value

    def _columns(self, shape, V, values=None):
        """The program's columns of the patterns of ``V`` in ``shape`` (``values``: their :meth:`_values`)."""
        ci, a, el, ep, *_, other = shape
        values = self._values(shape, V) if values is None else values
        return [(ci, a, el, ep, vec, float(value), other) for vec, value in zip(V, values)]

    def _fits(self, shape, vec):
        ci, a, el, ep, lo, hi, own, other = shape
        parts = int(vec.sum())
        return parts >= a and parts <= self.W and int(vec[other:].sum()) <= a and not vec[own:].any()

    def initial(self, deadline, most_extra=2):
        """Patterns of at most ``a + most_extra`` fragments: enough for a feasible start, usually.

        Fewer extra fragments where those are more than ``MAX_COLUMNS`` (domains
        of 32 logical cores carrying up to 48 threads: hundreds of thousands);
        ``None`` if even ``a`` fragments are, or at the deadline.
        """
        # the mains a domain takes when they are spread evenly, and one more: pricing adds the rest
        spread = -(-self.W // sum(self.counts)) + 1
        for extra in range(most_extra, -1, -1):
            columns = []
            for shape in (shape for shape in self.shapes if shape[1] <= spread):
                ci, a, el, ep, lo, hi, own, other = shape
                for n in range(max(lo, a), hi + 1):
                    vecs = [vec for vec in (_counts(part, self.largest)
                                            for part in _partitions(n, min(own, self.largest), max(a, 1) + extra))
                            if self._fits(shape, vec)]
                    if vecs:
                        columns += self._columns(shape, np.array(vecs))
                    if deadline is not None and time.perf_counter() > deadline:
                        return None
                    if len(columns) > MAX_COLUMNS:
                        break
                if len(columns) > MAX_COLUMNS:
                    break
            else:
                return columns
        return None

    def _profits(self, shape, V, y, values=None):
        """``value + A^T y`` of every pattern of ``V`` (fragment counts, one per row) in ``shape``:
        how much each adds at the duals ``y`` (``values``: their :meth:`_values`)."""
        ci, a, el, ep, lo, hi, own, other = shape
        L, base = self.largest, self.nc + 2
        C = V.astype(float)
        value = self._values(shape, V) if values is None else values
        must, may = _mains(C, a, other)
        out = value + y[ci] + a * y[self.nc] + C @ y[base::3][:L] - must @ y[base + 1::3][:L] \
            - may @ y[base + 2::3][:L]
        if self.caps.event_budget is not None:
            out = out + el * y[self.event_row]
        if self.caps.phys_event_budget is not None:
            out = out + ep * y[self.pevent_row]
        return out

    def _price_table(self, table, y, threshold, keep):
        """:meth:`price` over every pattern of :meth:`table` at once."""
        V, nn, parts, tail = table
        L = self.largest
        found = []
        for shape in self.shapes:
            ci, a, el, ep, lo, hi, own, other = shape
            ok = (nn >= max(lo, a)) & (nn <= hi) & (parts >= a) & (parts <= self.W) \
                & (tail[:, min(other, L)] <= a) & (tail[:, min(own, L)] == 0)
            idx = np.flatnonzero(ok)
            if not len(idx):
                continue
            found += self._columns_over(shape, V[idx], y, threshold, keep)
        return found

    def _columns_over(self, shape, V, y, threshold, keep):
        """The columns of the patterns of ``V`` whose profit exceeds ``threshold``, best first (at most ``keep``)."""
        values = self._values(shape, V)
        out = self._profits(shape, V, y, values)
        hits = np.flatnonzero(out > threshold)
        hits = hits[np.argsort(-out[hits], kind="stable")]
        hits = hits if keep is None else hits[:keep]
        return self._columns(shape, V[hits], values[hits])

    def price(self, y, threshold, deadline, state_limit=_STATE_LIMIT, keep=_KEEP):
        """Patterns whose profit at ``y`` exceeds ``threshold`` (at most ``keep`` per shape, best first; all if ``None``).

        ``None`` when the walk holds more than ``state_limit`` partial
        patterns at one level, or runs out of time (nothing proven then).
        """
        table = self.table(deadline)
        if table is not None:
            return self._price_table(table, y, threshold, keep)
        L = self.largest
        base = self.nc + 2
        ysize, ymust, ymay = y[base::3][:L], y[base + 1::3][:L], y[base + 2::3][:L]
        # a fragment's own gain; a main it may hold gains up to -ymay more, but a domain's ``a`` mains
        # hold at most ``a`` of each size (may_k <= min(count, a)): capping that per size keeps many
        # small fragments from looking profitable on a bonus only ``a`` of them can have
        h = 0.5 * self.wt * self.squares + ysize + np.maximum(0, -ymust)
        bonus = np.maximum(0, -ymay)
        halves = self.sizes // 2
        per_pair = 0.0
        pair_cap = 0
        if self.inner is not None:
            h = h + self.inner.per_thread * self.sizes
            per_pair = self.inner.per_pair
        h_max = max((hi for *_, hi, _, _ in self.shapes), default=0)
        if per_pair > 0:
            # a domain holds at most ``per_core`` pairs per physical core, and a pair takes two threads
            pair_cap = min(max(self.npc) * self.inner.per_core, h_max // 2)
        Q = pair_cap + 1

        def shifted(tab, r, q):
            # tab[R, p] moved to [R + r, min(p + q, Q - 1)]: r more threads, q more possible pairs (saturating)
            out = np.full_like(tab, -np.inf)
            if r > h_max:
                return out
            moved = tab[:h_max + 1 - r]
            if q:
                sat = np.full_like(moved, -np.inf)
                if q < Q:
                    sat[:, q:] = moved[:, :Q - q]
                sat[:, Q - 1] = np.maximum(sat[:, Q - 1], moved[:, max(0, Q - q):].max(axis=1))
                moved = sat
            out[r:] = moved
            return out

        knaps = {}

        def knap_for(a):
            # knap[k, R, q]: most that fragments of sizes <= k add on at most R threads with q possible
            # sibling pairs (q capped at what a domain holds, the pairs' own gain added at the end): the
            # pairs saturate and the bonus is capped, so this is tighter than per-fragment gains
            if a not in knaps:
                knap = np.full((L + 1, h_max + 1, Q), -np.inf)
                knap[0, :, 0] = 0.0
                for k in range(1, L + 1):
                    tab = knap[k - 1].copy()
                    for c in range(1, h_max // k + 1):
                        gain_c = c * h[k - 1] + min(c, a) * bonus[k - 1]
                        tab = np.maximum(tab, shifted(knap[k - 1], c * k, min(c * int(halves[k - 1]), Q)) + gain_c)
                    knap[k] = tab
                knaps[a] = knap
            return knaps[a]

        # best completion for (k, R) given the pairs already q_cur: max over q' of knap + gain(min(cap, q_cur+q'))
        gain = per_pair * np.minimum(np.arange(2 * Q), pair_cap) if Q > 1 else np.zeros(2)

        def completion(knap, k, R, q_cur):
            # (R, q_cur: arrays, one per partial pattern)
            if Q == 1:
                return knap[k, R, 0]
            return np.max(knap[k][R] + gain[np.minimum(q_cur, pair_cap)[:, None] + np.arange(Q)], axis=1)

        found = []
        for shape in self.shapes:
            ci, a, el, ep, lo, hi, own, other = shape
            top = min(own, L)
            const = y[ci] + a * y[self.nc] - 0.5 * self.wt * (a * a if self.use_main else 0)
            if self.inner is not None:
                const += self.inner.per_main * a
            if self.caps.event_budget is not None:
                const += el * y[self.event_row]
            if self.caps.phys_event_budget is not None:
                const += ep * y[self.pevent_row]
            knap = knap_for(a)
            # the partial patterns (counts of the sizes above k chosen), all at once, level by level from
            # the largest size down: numpy over the whole frontier, not a walk node by node in Python
            V = np.zeros((1, L), dtype=np.int8 if hi < 128 else np.int16)
            n, parts, pairs, acc = (np.zeros(1, dtype=np.int64),) * 3 + (np.zeros(1),)
            for k in range(top, 0, -1):
                alive = const + acc + completion(knap, k, hi - n, pairs) > threshold
                V, n, parts, pairs, acc = V[alive], n[alive], parts[alive], pairs[alive], acc[alive]
                # each partial pattern takes 0..most fragments of size k
                reps = np.minimum((hi - n) // k, self.W - parts) + 1
                if reps.sum() > state_limit or (deadline is not None and time.perf_counter() > deadline):
                    return None
                at = np.repeat(np.arange(len(V)), reps)
                c = np.arange(len(at)) - np.repeat(np.cumsum(reps) - reps, reps)
                V = V[at]
                V[:, k - 1] = c
                n, parts = n[at] + c * k, parts[at] + c
                pairs = pairs[at] + c * int(halves[k - 1])
                acc = acc[at] + c * h[k - 1] + np.minimum(c, a) * bonus[k - 1]
            fits = (n >= max(lo, a)) & (parts >= a) & (parts <= self.W) & (V[:, other:].sum(axis=1) <= a)
            leaves = V[fits].astype(np.int64)
            if len(leaves):
                # in the order of a depth-first walk taking the most of the largest size first (the
                # columns' order is the programs': HiGHS is sensitive to it)
                leaves = leaves[np.lexsort(tuple(-leaves[:, i] for i in range(top)))]
                found += self._columns_over(shape, leaves, y, threshold, keep)
        return found

    def price_workers(self, y, threshold, deadline, node_limit=400000):
        """Partitions of ``T`` (marked, as in :attr:`FragmentProgram.partitions`) whose profit at ``y`` exceeds
        ``threshold``; ``[]`` unless the workers are generated, ``None`` out of nodes or time.

        A worker column's profit is the workers' row dual, less each part's
        fragment-count dual, plus the marked size's two main duals: a
        depth-first walk over the parts (largest first), pruned by the best
        any completion can add (an exact-fill knapsack over the threads left).
        """
        if not self.workers:
            return []
        L, T, base = self.largest, self.caps.instance.T, self.nc + 2
        gain = -y[base::3][:L]                        # a part of size k + 1
        mark = y[base + 1::3][:L] + y[base + 2::3][:L]
        const = y[self.nc + 1]
        # fill[k, R]: the most parts of sizes <= k + 1 add on exactly R threads
        fill = np.full((L, T + 1), -np.inf)
        fill[:, 0] = 0.0
        for k in range(L):
            for R in range(1, T + 1):
                best = fill[k - 1, R] if k else -np.inf
                if R >= k + 1:
                    best = max(best, fill[k, R - k - 1] + gain[k])
                fill[k, R] = best
        top_mark = np.maximum.accumulate(mark)        # the best marked size among sizes <= k + 1
        nodes, found, vec = [0], [], np.zeros(L, dtype=int)

        def walk(k, R, acc, marked):
            nodes[0] += 1
            if nodes[0] > node_limit:
                raise _OutOfNodes
            if R == 0:
                for m in np.flatnonzero(vec):
                    if const + acc + mark[m] > threshold:
                        found.append((vec.copy(), int(m)))
                return
            if k < 0 or const + acc + fill[k, R] + max(marked, top_mark[k]) <= threshold:
                return
            for c in range(R // (k + 1), -1, -1):
                vec[k] = c
                walk(k - 1, R - c * (k + 1), acc + c * gain[k], max(marked, mark[k]) if c else marked)
            vec[k] = 0

        try:
            walk(L - 1, T, 0.0, -np.inf)
        except _OutOfNodes:
            return None
        if deadline is not None and time.perf_counter() > deadline:
            return None
        return found

    def solve(self, program, time_limit, slack, on_plan=None):
        """Generate columns until none prices out, then price-and-branch (:class:`_Branching`).

        With :attr:`workers`, the partitions of ``T`` are generated alongside the domain patterns.
        """
        t_end = time.perf_counter() + time_limit
        while True:
            left = t_end - time.perf_counter()
            relaxed = program.relaxation(left) if left > 0 else None
            if relaxed is None and left > 0 and self.workers and self.most < self.caps.instance.T:
                # the partitions of few parts fit no plan: those of a few parts more (pricing needs one)
                self.most += _EXTRA_PARTS
                program = self.extended(program, (), _marked(self.caps.instance.T, self.largest, self.most))
                continue
            if relaxed is None:
                return None
            bound, _, _, y = relaxed
            # patterns that gain less than ``eps`` are left out: together they add at most
            # ``eps`` per domain, which the bound below counts (``unseen``)
            eps = 1e-7 * max(1.0, abs(bound))
            y = _dual_bound(program, y)[0]        # signs clipped: the bound below comes from these duals
            new, new_workers = self.price(y, eps, t_end), self.price_workers(y, eps, t_end)
            if new is None or new_workers is None:
                return None                  # the relaxation's optimum over all patterns is not proven
            known = {_key(c) for c in program.columns}
            known_workers = {_part_key(p) for p in program.partitions}
            if all(_key(c) in known for c in new) and all(_part_key(p) in known_workers for p in new_workers):
                # the best few of each shape are all known: so is every pattern that prices out? (only
                # a shape that found its fill may have more)
                shapes = [c[:4] for c in new]
                if all(shapes.count(k) < _KEEP for k in set(shapes)):
                    break
                new = self.price(y, eps, t_end, keep=None)
                if new is None:
                    return None
                if all(_key(c) in known for c in new):
                    break
            program = self.extended(program, new, new_workers)
        # (and each worker left out less than ``eps``)
        unseen = eps * (sum(self.counts) + (self.W if self.workers else 0))
        y, _, ceiling = _dual_bound(program, y, unseen)
        # central duals put far fewer columns within a slack than the vertex's (see FragmentProgram.solve):
        # take them where no pattern left out prices out at them either
        yc, _, ceiling_c = _central(program, y, bound, t_end, unseen)
        if not np.array_equal(yc, y):
            found, found_workers = self.price(yc, eps, t_end, keep=None), self.price_workers(yc, eps, t_end)
            if found is not None and all(_key(c) in known for c in found) and found_workers is not None \
                    and all(_part_key(p) in known_workers for p in found_workers):
                y, ceiling = yc, ceiling_c
        return _Branching(self, program, y, ceiling, slack).run(t_end - time.perf_counter(), on_plan)

    def extended(self, program, new, new_workers=()):
        """``program`` with the columns of ``new`` (and the partitions of ``new_workers``) it does not hold
        yet (a generated program, each time from its own columns: each branch must hold every column it
        was priced for)."""
        cols = _merged(program.columns, new, _key)
        parts = _merged(program.partitions, new_workers, _part_key)
        value, A, lb, ub = _assemble(self.caps, program.classes, cols, parts, self.largest)
        return replace(program, columns=cols, partitions=parts, value=value, A=A, lb=lb, ub=ub)


def _merged(old, new, key):
    """``old`` and then the items of ``new`` whose ``key`` is not among them yet, in order."""
    seen = {key(item) for item in old}
    out = list(old)
    for item in new:
        if key(item) not in seen:
            seen.add(key(item))
            out.append(item)
    return out


def _key(column):
    """A domain column's identity: its class, mains, events and fragment counts."""
    return column[:4] + (np.asarray(column[4], dtype=np.int64).tobytes(),)


def _used(program, solution):
    """The columns ``solution`` uses, by :func:`_key` (domains) and :func:`_part_key` (workers), with their counts."""
    return ({_key(program.columns[i]): int(solution.domains[i]) for i in np.flatnonzero(solution.domains)} |
            {_part_key(program.partitions[i]): int(solution.workers[i]) for i in np.flatnonzero(solution.workers)})


class _Branching:
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
        self.cuts = tuple(_pair_cuts(program))      # the worker rules so far (they hold for every program)
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
            if near is None or near_workers is None or len(near) + len(near_workers) > MAX_COLUMNS:
                self.over = near is not None and near_workers is not None   # too many: the bound stands alone
                break
            final = replace(self.pricing.extended(self.program, near, near_workers), pricing=None)
            self.final = final
            # HiGHS's time grows much faster than the columns: at most _GROWTH times the last program's
            # (the slack that holds that many), unless that is still few
            reduced = _dual_bound(final, self.y)[1]
            within = np.sort(reduced[reduced <= self.slack + tol])
            most = _JUMP_COLUMNS if self.jump else max(int(_GROWTH * self.kept), _FREE_COLUMNS)
            if self.kept and len(within) > most:
                self.slack = float(within[most])
            self.kept = int(np.sum(reduced <= self.slack + tol))
            left = t_end - time.perf_counter()
            start = None
            if self.best is not None:         # the best plan so far, on this program's columns
                at = {_key(c): i for i, c in enumerate(final.columns)} | \
                    {_part_key(p): len(final.columns) + i for i, p in enumerate(final.partitions)}
                used = self.best[2]
                if all(k in at for k in used):
                    start = np.zeros(len(final.value), dtype=int)
                    start[[at[k] for k in used]] = list(used.values())
            began, before = time.perf_counter(), -np.inf if self.best is None else self.best[0]
            solution = final.solve(left, slack=self.slack, complete_below=self.slack, duals=self.y,
                                   ceiling=ceiling, start=start, cuts=self.cuts, within=self.within) \
                if left > 0 else None
            quick = time.perf_counter() - began < min(_QUICK * left, _QUICK_S)
            if solution is None or solution.bound > ceiling + 2 * tol:     # (its own tolerance added)
                self.over = solution is not None
                break
            self.cuts = solution.cuts
            self.within = solution._within or self.within
            if solution.proven:
                used = _used(final, solution)
                same = self.best is not None and self.best[2] == used
                return replace(solution, alternatives=self.alternatives(1 if same else 0))
            self.tight = min(self.tight, solution.bound)
            if solution.domains is not None:
                found = float(final.value @ np.concatenate([solution.domains, solution.workers]))
                if self.best is None or found > self.best[0]:
                    if self.best is not None:
                        self.plans = [self.best[1]] + self.plans[:_ALTERNATIVES - 1]
                    self.best = (found, solution, _used(final, solution))
                    if on_plan is not None and found < self.tight - 2 * tol:
                        on_plan(solution)
                if self.best[0] >= self.tight - 2 * tol:
                    break
            stopped = time.perf_counter() >= t_end - 0.05
            if stopped and (self.best is None or self.best[0] <= before):
                break                        # stopped at the time limit with nothing new: resume it as it was
            wider = (4 if self.best is None or quick else _WIDEN) * self.slack
            # a quick program with a plan: straight to the slack that proves the plan, or to as many
            # columns as a program HiGHS solves in a second or two holds (its time hardly grows with
            # the columns up to there, and each program solved on the way costs its root again)
            self.jump = quick and self.best is not None
            if self.best is not None:
                wider = ceiling - self.best[0] + tol if self.jump else min(wider, ceiling - self.best[0] + tol)
            if wider <= self.slack * (1 + 1e-9):
                self.over = not stopped      # a program cut short may still prove it: run it again
                break
            self.slack = wider
        if self.best is not None:
            sol = self.best[1]
            proven = self.best[0] >= self.tight - 2 * tol
            return replace(sol, bound=min(self.tight, sol.bound), proven=proven, alternatives=self.alternatives(1),
                           _search=None if proven else self)
        return FragmentSolution(self.final, self.tight, None, None, False, (), self)

    def alternatives(self, skip=0):
        """The plans found so far, best first, without the ``skip`` best (a few: each holds its program)."""
        plans = ([self.best[1]] if self.best is not None else []) + self.plans
        return tuple(replace(p, alternatives=(), _search=None) for p in plans[skip:skip + _ALTERNATIVES])


class _OutOfNodes(Exception):
    """The pricing walk's node budget ran out."""


#: Most earlier plans a solution keeps as :attr:`FragmentSolution.alternatives`.
_ALTERNATIVES = 3

#: Most columns the integer program of :meth:`FragmentProgram.solve` keeps.
_RESTRICTED_COLUMNS = 8000

#: Most fragment sizes of a pattern (the largest) whose subsets :func:`_worker_cuts` tries.
_CUT_SIZES = 8

#: Most columns of a restricted program that carries the worker rules: HiGHS stalls for many seconds
#: at the root of bigger ones on their 0-1 columns (past its time limit), and a program without them
#: still bounds every mapping (a plan that breaks them is not taken as one).
_CUT_COLUMNS = 4000

#: Partitions of ``T`` above which the workers are generated too (:meth:`_Pricing.price_workers`): those of
#: at most ``_EXTRA_PARTS`` more parts than the fewest first (T = 32 into parts of 16 has 7,665; 36 has 15,892).
_WORKER_PARTITIONS = 10000
_EXTRA_PARTS = 2

#: How much the branching's slack grows at most once it has a plan and its programs take time: the
#: columns within it (and HiGHS's time) grow much faster than the slack, and a better plan found on
#: the way lowers the slack the proof needs (``LP - plan``). While a program takes less than
#: ``_QUICK`` of the time left and ``_QUICK_S`` seconds (a few hundred columns), the slack grows 4x.
_WIDEN = 1.5
_QUICK = 0.05
_QUICK_S = 0.25

#: A widened restricted program holds at most ``_GROWTH`` times the columns of the one before, or
#: ``_FREE_COLUMNS`` (programs that small take HiGHS a fraction of a second).
_GROWTH = 2.5
_FREE_COLUMNS = 1000

#: Most columns of the program that follows a quick one that found a plan (see :meth:`_Branching.run`).
_JUMP_COLUMNS = 2500

#: Most patterns :meth:`_Pricing.table` writes out for pricing (the partitions of up to 32 threads are
#: about 30,000; of 32 to 48, hundreds of thousands: those domains price with the pruned walk).
_TABLE_ROWS = 100000


def fragment_program(caps, chain, j, inner=True, max_columns=MAX_COLUMNS, deadline=None):
    """The fragment program of level ``j`` (:class:`FragmentProgram`), or ``None`` where it does not apply.

    It applies in compact mode to a level above the cores (``j >= 1``)
    whose weight ``d_{j+1} - d_j`` is positive, and not with more than
    ``max_columns`` columns, nor once ``time.perf_counter()`` passes
    ``deadline`` while building. With ``inner`` and SMT-2 physical cores just
    below level ``j = 2``, each column also carries a bound of its domain's
    two finer levels, and the program bounds levels ``0..j`` together
    (:attr:`FragmentProgram.levels`); otherwise level ``j`` alone.

    Examples
    --------
    >>> from tuna_lab import Topology, TunaModel
    >>> from tuna_lab.model.encodings import ultrametric_chain
    >>> model = TunaModel(64, 6, Topology.preset("epyc-9654-2s"), mode="compact")
    >>> program = fragment_program(model.caps, ultrametric_chain(model.instance.topology), 2)
    >>> len(program.partitions)          # the 11 partitions of T = 6, each with its main's part marked
    19
    """
    inst = caps.instance
    W, T = inst.W, inst.T
    s = caps.sign
    d = [0.0] + [c for c, _ in chain]
    if s >= 0 or j < 1 or j >= len(d) - 1:
        return None
    wt = d[j + 1] - d[j]
    if wt <= 0:
        return None
    use_main = caps.spread_main
    classes, shapes = domain_shapes(caps, chain, j)
    largest = min(max((own for *_, own, _ in shapes), default=0), T)
    hi_max = max((hi for *_, hi, _, _ in shapes), default=0)
    if largest < 1:
        return None
    inner = _inner_rule(caps, chain, j) if inner else None
    levels = tuple(range(j + 1)) if inner is not None else (j,)
    # a worker: a partition of T with one marked part, the fragment that holds its main thread; where
    # T has too many partitions (T much bigger than a domain), those of few parts and the ones that price out
    many = _count_partitions(T, largest, T)[T] > _WORKER_PARTITIONS
    most = -(-T // largest) + _EXTRA_PARTS if many else T
    partitions = _marked(T, largest, most)

    def generated():
        # too many patterns to write out: generate the ones that matter (see FragmentProgram.solve)
        pricing = _Pricing(caps, chain, j, wt, classes, shapes, largest, inner, most=most if many else None)
        columns = pricing.initial(deadline)
        if not columns:
            return None
        value, A, lb, ub = _assemble(caps, classes, columns, partitions, largest)
        return FragmentProgram(caps, chain, j, levels, classes, columns, partitions, value, A, lb, ub,
                               max(max(classes.values()), W), pricing)

    if many or _count_partitions(hi_max, largest, W).sum() > max_columns or len(partitions) > max_columns:
        return generated()                   # too many to write out: counted, not listed
    # every partition of up to hi_max threads into at most W fragments, as count vectors by their total
    V = _count_vectors(0, hi_max, largest)
    V = V[V.sum(axis=1) <= W]
    totals = V @ np.arange(1, largest + 1)
    by_n = {n: V[totals == n] for n in range(hi_max + 1)}
    if deadline is not None and time.perf_counter() > deadline:
        return None
    squares = np.arange(1, largest + 1) ** 2
    columns = []
    for ci, a, el, ep, lo, hi, own, other in shapes:
        for n in range(max(lo, a), hi + 1):
            counts = by_n.get(n)
            if counts is None or not len(counts):
                continue
            parts = counts.sum(axis=1)
            # fragments bigger than a worker's share without its main hold one of the ``a`` mains
            big = counts[:, other:].sum(axis=1)
            keep = (parts >= a) & (big <= a) & (counts[:, own:].sum(axis=1) == 0)
            npc = list(classes)[ci][1]
            V = counts[keep]
            values = -0.5 * wt * ((a * a if use_main else 0) + s * (V @ squares).astype(float))
            if inner is not None and len(V):
                values = values + inner(V, np.full(len(V), n), a, el, ep, npc, other)
            columns += [(ci, a, el, ep, vec, float(value), other) for vec, value in zip(V, values)]
            if deadline is not None and time.perf_counter() > deadline:
                return None
            if len(columns) > max_columns:
                return generated()
    if not columns or not partitions:
        return None
    if len(columns) + len(partitions) > max_columns:
        return generated()
    value, A, lb, ub = _assemble(caps, classes, columns, partitions, largest)
    return FragmentProgram(caps, chain, j, levels, classes, columns, partitions, value, A, lb, ub,
                           max(max(classes.values()), W))


def _assemble(caps, classes, columns, partitions, largest):
    """``(value, A, lb, ub)`` of the program over ``columns`` (domain patterns) and ``partitions``."""
    W = caps.instance.W
    n_w = len(partitions)
    zeros_w = np.zeros(n_w)
    dom = np.array([c[4] for c in columns], dtype=float).T
    wrk = np.array([vec for vec, _ in partitions], dtype=float).T
    marked = np.zeros((largest, n_w))
    marked[[k for _, k in partitions], np.arange(n_w)] = 1.0
    ci = np.array([c[0] for c in columns])
    a, el, ep = (np.array([c[k] for c in columns], dtype=float) for k in (1, 2, 3))
    must, may = _mains(dom.T, a, [c[6] for c in columns])
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
    value = np.concatenate([[c[5] for c in columns], zeros_w])
    return value, np.array(A, dtype=float), np.array(lb, dtype=float), np.array(ub, dtype=float)


def _inner_rule(caps, chain, j):
    """The bound of a domain's two finer levels (SMT siblings) from its pattern, or ``None``.

    Applies when level ``j`` is 2, its sub-domains are physical cores of two
    SMT siblings (level 1) and a worker or a rank has at most one thread per
    logical core; then the single-core level is fixed by the counts and the
    physical-core level reads same-worker sibling pairs and main threads
    sharing a physical core. A domain of ``npc`` physical cores with ``n``
    threads and ``a`` mains has at most ``npc * min(U, U+ // 2, f)`` worker
    pairs (one pair takes a thread on both siblings, and a worker has at
    most one on a physical core: ``f`` is its fragments of two or more
    threads) and at most ``floor(x / 2)`` per fragment of ``x``; a main's physical core carries
    only ``L+`` unless it spends an event of (12+), which caps how many
    physical cores the mains can take, so at least ``a - q_max`` of them
    share one - where, under (12) with no event left, the two mains are the
    only threads there and no worker pair fits. A main alone on its logical
    core in a fragment of one thread leaves its physical core without a
    pair too.
    """
    inst = caps.instance
    if j != 2 or len(chain) < 2 or caps.worker_max > 1 or caps.main_max > 1:
        return None
    if not (inst.P * 2 == inst.C and np.all(inst.smt == 2)):
        return None
    first = np.asarray(chain[0][1])
    if len(np.unique(first)) != inst.P or \
            len(np.unique(np.stack([first, inst.core]), axis=1).T) != inst.P:
        return None
    d1, d2 = chain[0][0], chain[1][0]
    w0, w1 = d1, d2 - d1
    s, use_main = caps.sign, caps.spread_main
    U = caps.load[1] if caps.load is not None else inst.W
    phys = caps.phys_load
    # a pair takes a thread on both siblings, so a physical core holds at most as many pairs as a
    # sibling holds threads (U), and half what (8+) lets it carry - one per worker, but with U = 2
    # two workers can each have one there
    per_core = max(0, min(U, phys[1] // 2) if phys is not None else U)
    events = caps.phys_event_budget is not None and phys is not None and phys[1] > phys[0]
    balanced = phys is not None and phys[1] - phys[0] <= 1
    # a main on a physical core at L+ = 1 (no event) is alone there: its own fragment pairs one thread fewer
    alone_phys = events and phys[0] == 1

    def inner(vec, n, a, el, ep, npc, other):
        # numpy's element-wise min/max: ``vec`` may be one pattern or a table of them (rows), ``n`` their sizes
        # a worker holds at most one pair on a physical core: no more pairs there than fragments of two or more
        duos = vec.sum(axis=-1) - vec[..., 0]
        halves = vec @ (np.arange(1, vec.shape[-1] + 1) // 2)
        if alone_phys:
            halves = halves - _lone_main_loss(vec, n, a, ep, npc, other)
        pairs = np.minimum(npc * np.minimum(per_core, duos), halves)
        if balanced:
            # (8+) holds each physical core at L+ or U+ threads: ``n`` fixes how many carry U+, and a
            # core of ``l`` threads holds at most ``l // 2`` pairs
            up = np.clip(n - npc * phys[0], 0, npc)
            pairs = np.minimum(pairs, (npc - up) * (phys[0] // 2) + up * (phys[1] // 2))
        shared = 0                  # physical cores two mains must share
        if events:
            q_max = (npc * phys[1] - n) // (phys[1] - phys[0]) + ep
            shared = np.maximum(0, a - q_max)
        # mains alone on their logical core: under (8) with U = 1, or under (12) with no event here
        alone = caps.load is not None and (U == 1 or (caps.event_budget is not None and el == 0
                                                      and caps.load[0] == 1))
        if alone:
            pairs = _lone_main_pairs(pairs, duos, a, npc, np.minimum(per_core, duos), shared, use_main,
                                     vec=vec, halves=halves, low=caps.load[0])
        else:
            pairs = pairs - (shared if use_main else 0)
        # ``pairs`` is now the most of (sibling pairs - mains sharing a physical core), what level 1 reads
        level0 = -0.5 * w0 * ((a if use_main else 0) + s * n)
        level1 = -0.5 * w1 * ((a if use_main else 0) + s * n) - s * w1 * pairs
        return level0 + level1

    # what the column generation's pricing needs to bound it from above (compact mode: s = -1):
    # per thread, per possible sibling pair, and per main (shared mains only lower it)
    inner.per_thread = -0.5 * (w0 + w1) * s
    inner.per_pair = -w1 * s
    inner.per_main = -0.5 * (w0 + w1) * (1 if use_main else 0)
    inner.per_core = per_core
    return inner


def _lone_main_loss(vec, n, a, ep, npc, other):
    """The fewest pairs a domain's fragments lose to mains alone on their physical core (L+ = 1).

    ``vec``: fragment counts (one pattern or rows of them) of ``n`` threads
    on ``npc`` physical cores; ``a`` mains, all alone but those on the ``ep``
    event cores (load U+ = 2), of which one per core may pair with its own
    worker. Two mains on an event core pair with neither, and the mains the
    ``2 npc - n`` cores at L+ do not seat must double up so. A main without
    a pair takes one thread of its fragment out of the pairing, which costs
    a fragment of even size one pair and an odd one none. Mains lie in
    distinct fragments, every fragment bigger than ``other`` holds one, and
    the others go to odd fragments first; the mains paired on event cores
    spare even fragments first.
    """
    vec = np.asarray(vec)
    sizes = np.arange(1, vec.shape[-1] + 1)
    even, big = sizes % 2 == 0, sizes > other
    must_even = vec @ (even & big)
    must = vec @ big
    odd_free = vec @ (~even & ~big)
    extra_even = np.maximum(0, (a - must) - odd_free)
    doubled = np.maximum(0, a - np.maximum(0, 2 * npc - n) - ep)
    spared = np.minimum(a, np.maximum(0, ep - doubled))
    return np.maximum(0, must_even + extra_even - spared)


def _lone_main_pairs(pairs, duos, a, npc, per_core, shared, use_main, vec=None, halves=None, low=0):
    """The most sibling pairs less mains sharing a physical core, of a domain whose mains are alone
    on their logical cores.

    ``pairs``: the most pairs the fragments hold (``floor(x / 2)`` each,
    ``per_core`` per physical core; one per pattern or one per row of them,
    like ``duos``, the fragments of two or more threads). A main alone on its logical core leaves
    its physical core at most one pair, its own worker's, and none when its
    fragment is of one thread; two mains on one physical core leave it none.
    With ``c2`` physical cores holding two mains (at least ``shared``) and
    ``c1 = a - 2 c2`` holding one, the cores hold at most
    ``per_core (npc - c1 - c2) + min(1, per_core) (c1 - m1)`` pairs, where ``m1`` (the mains in
    fragments of one thread on a ``c1`` core) is at least ``a`` less the
    fragments of two or more threads, less ``2 c2``. The most of
    ``pairs - c2`` (the physical level reads both; ``pairs`` alone without
    (4-5)) over every ``c2``.

    With ``vec`` (the fragment counts), ``halves`` (the most pairs the
    fragments hold, ``floor(x / 2)`` each) and ``low`` (the least threads a
    logical core carries, ``L``): a single-thread main alone on its physical
    core's one sibling leaves the other sibling ``low`` threads of other
    workers, which pair with nothing. An odd fragment, or one of one thread
    without a main, gives one such thread for free; past those, every two
    cost a pair.
    """
    singles = np.maximum(0, a - duos)
    free = 0
    if vec is not None and low > 0:
        sizes = np.arange(1, vec.shape[-1] + 1)
        free = vec @ ((sizes % 2 == 1) & (sizes > 1)) + np.maximum(0, vec[..., 0] - singles)
    best = np.full(np.shape(pairs), -np.inf)
    for c2 in range(0, a // 2 + 1):
        c1 = a - 2 * c2
        if c1 + c2 > npc:
            continue
        # (singles beyond what the c2 cores seat are on c1 cores: at most c1 of them, as singles <= a)
        m1 = np.maximum(0, singles - 2 * c2)
        held = np.minimum(pairs, per_core * (npc - c1 - c2) + np.minimum(1, per_core) * (c1 - m1))
        if vec is not None and low > 0:
            given = np.maximum(0, low * m1 - free)
            held = np.minimum(held, halves - (given + 1) // 2)
        value = held - (c2 if use_main else 0)
        best = np.where(c2 >= shared, np.maximum(best, value), best)
    # no way to seat the mains: the pattern cannot occur, any finite value bounds it
    return np.where(np.isfinite(best), best, pairs - (shared if use_main else 0))


def fragment_mapping(caps, chain, solution, time_limit=5.0, seed=0, place_limit=None):
    """Positions ``(W, T)`` that follow ``solution``'s plan, or ``None``.

    The plan's domain patterns are dealt to the level's domains, its
    partitions to the workers, and each worker's fragments to distinct
    domains holding fragments of their sizes; the main threads go to
    fragments so that every domain gets its ``a`` (a small integer
    program). Each domain's fragments are then placed on its cores by an
    exact program that keeps the load, rank, worker and event rules and
    makes the finer levels' part of the objective as good as it can be.
    ``None`` when the plan is not integral, a deal fails, or a level above
    the plan's has weight (which the plan does not see).

    Parameters
    ----------
    caps : Caps
    chain : list of (cost, labels)
    solution : FragmentSolution
    time_limit : float
        Seconds for the placement programs together.
    seed : int
        Seeds the order in which fragments are dealt when the first deal fails.
    place_limit : float, optional
        Seconds for each placement program: HiGHS returns its best placement
        when they pass (often the optimum, found long before it is proven).
    """
    program = solution.program if solution is not None else None
    if program is None or solution.domains is None:
        return None
    inst = caps.instance
    W, T, C = inst.W, inst.T, inst.C
    j = program.level
    d = [0.0] + [c for c, _ in chain]
    if any(d[i + 1] - d[i] > 0 for i in range(j + 1, len(d) - 1)):
        return None
    if caps.worker_max > 1 or caps.main_max > 1:
        return None
    labels = np.asarray(chain[j - 1][1])
    n_dom = int(labels.max()) + 1
    keys = list(program.classes)
    size = np.bincount(labels, minlength=n_dom)
    domain_class = [keys.index((int(size[g]), int(len(np.unique(inst.core[labels == g]))))) for g in range(n_dom)]
    # deal the domain patterns to the domains of their class
    plan = [None] * n_dom
    free = {k: [g for g in range(n_dom) if domain_class[g] == k] for k in range(len(keys))}
    for col, count in zip(program.columns, solution.domains):
        for _ in range(int(count)):
            if not free[col[0]]:
                return None
            plan[free[col[0]].pop(0)] = col
    if any(p is None for p in plan):
        return None
    t_end = time.perf_counter() + time_limit
    deal = _deal(plan, program.partitions, solution.workers, W, np.random.default_rng(seed), t_end)
    if deal is None:
        return None
    fragments, mains = deal                     # fragments[g] = [(worker, size)], mains: (worker, g)
    main_of = dict(mains)
    pos_main = np.full(W, -1)
    others = np.zeros((W, C), dtype=int)
    cache = {}
    for g in range(n_dom):
        cores = np.flatnonzero(labels == g)
        frags = sorted(fragments[g], key=lambda f: (-int(main_of[f[0]] == g), -f[1], f[0]))
        shape = tuple((k, main_of[w] == g) for w, k in frags)
        key = (shape, plan[g][2], plan[g][3], _structure(chain, j, cores, inst.core))
        if key not in cache:
            left = t_end - time.perf_counter()
            if left <= 0:
                return None
            cache[key] = _place(caps, chain, j, cores, shape, plan[g][2], plan[g][3],
                                left if place_limit is None else min(left, place_limit))
        placed = cache[key]
        if placed is None:
            return None
        for (w, _), (on, main_at) in zip(frags, placed):
            on = cores[on]
            if main_at is not None:
                pos_main[w] = cores[main_at]
                on = on[on != cores[main_at]]
            others[w, on] += 1
    if np.any(pos_main < 0) or np.any(others.sum(axis=1) != T - 1):
        return None
    cap = caps.rank_cap if caps.rank_cap is not None else W
    try:
        return assign_ranks(pos_main, others, cap)
    except Exception:                          # an unusual plan the rank recovery cannot number
        return None


def _deal(plan, partitions, counts, W, rng, t_end, attempts=50):
    """Workers' fragments to distinct domains, each worker's main to the fragment its partition marks.

    A greedy deal, marked fragments first into domains that still need
    mains, the others where a fragment without a main fits; retried in
    random orders. Returns ``(fragments per domain, [(worker, domain of its
    main)])`` or ``None``.
    """
    workers = [(np.repeat(np.arange(1, len(vec) + 1), vec)[::-1], mark + 1)
               for (vec, mark), n in zip(partitions, counts) for _ in range(int(n))]
    if len(workers) != W:
        return None
    for attempt in range(attempts):
        if attempt and time.perf_counter() > t_end:
            return None
        need = [{k + 1: int(c) for k, c in enumerate(col[4]) if c} for col in plan]
        mains_left = [int(col[1]) for col in plan]
        frags_left = [int(col[4].sum()) for col in plan]
        other = [int(col[6]) for col in plan]
        order = sorted(range(W), key=lambda w: (-len(workers[w][0]), -workers[w][1]))
        if attempt:
            order = list(rng.permutation(W))
        fragments, mains = [[] for _ in plan], []
        ok = True
        for w in order:
            sizes, mark = workers[w]
            rest = list(sizes)
            rest.remove(mark)
            used = set()
            for k, marked in [(mark, True)] + [(int(k), False) for k in rest]:
                if marked:
                    choices = [g for g in range(len(plan)) if need[g].get(k, 0) > 0 and mains_left[g] > 0]
                    # a fragment too big to be without a main goes first where it must
                    key = (lambda g: (k > other[g], mains_left[g], rng.random() if attempt else -g))
                else:
                    choices = [g for g in range(len(plan)) if need[g].get(k, 0) > 0 and g not in used
                               and k <= other[g] and frags_left[g] - 1 >= mains_left[g]]
                    key = (lambda g: (frags_left[g] - mains_left[g], need[g][k], rng.random() if attempt else -g))
                if not choices:
                    ok = False
                    break
                g = max(choices, key=key)
                need[g][k] -= 1
                frags_left[g] -= 1
                used.add(g)
                fragments[g].append((w, k))
                if marked:
                    mains_left[g] -= 1
                    mains.append((w, g))
            if not ok:
                break
        if ok:
            return fragments, mains
    return None


def _structure(chain, j, cores, core_of):
    """A domain's inner structure up to renaming: its cores' labels at every finer level, renumbered."""
    out = [tuple(np.unique(core_of[cores], return_inverse=True)[1])]
    for _, lab in chain[:j - 1]:
        out.append(tuple(np.unique(np.asarray(lab)[cores], return_inverse=True)[1]))
    return tuple(out)


def _place(caps, chain, j, cores, shape, el, ep, time_limit):
    """Place one domain's fragments on its cores: ``[(cores of the fragment, main's core or None)]``.

    Indices are into ``cores``. An exact 0-1 program (HiGHS): every
    fragment on distinct cores, its main (if here) alone among mains on its
    core, the loads of (8)/(8+) and at most ``el``/``ep`` events of
    (12)/(12+); it maximises the finer levels' part of the objective - the
    worker pairs sharing a sub-domain, weighted by how much closer they are
    than the level's distance, less the same for pairs of main threads.
    ``None`` if infeasible.
    """
    import scipy.sparse as sp

    from ._highs import boxed_max

    inst = caps.instance
    n = len(cores)
    F = len(shape)
    if not F:
        return []                 # an empty domain (the plan kept its loads' lower bounds)
    D = inst.distance[np.ix_(cores, cores)]
    d_j = chain[j - 1][0]
    close = [(a, b) for a in range(n) for b in range(a + 1, n) if D[a, b] < d_j]
    mains = [f for f, (_, has) in enumerate(shape) if has]
    phys = inst.core[cores]
    phys_ids = np.unique(phys)
    # columns: y[f, c] | m[f, c] (main fragments) | z[f, pair] | zm[pair] | e[c] | Mx[x] | ep[x]
    ny, nm, nz, nzm = F * n, len(mains) * n, F * len(close), len(close) if caps.spread_main else 0
    use_ev = caps.event_budget is not None and caps.load is not None and inst.U == inst.L + 1
    use_pev = caps.phys_event_budget is not None and caps.phys_load is not None \
        and inst.U_phys == inst.L_phys + 1
    ne = n if use_ev else 0
    nx = len(phys_ids) if use_pev else 0
    o_m, o_z = ny, ny + nm
    o_zm = o_z + nz
    o_e = o_zm + nzm
    o_x = o_e + ne
    o_p = o_x + nx
    N = o_p + nx
    rows, lo, hi = [], [], []

    def row(entries, low, high):
        rows.append(entries)
        lo.append(low)
        hi.append(high)

    def Y(f, c):
        return f * n + c

    def Mv(i, c):
        return o_m + i * n + c

    for f, (k, _) in enumerate(shape):
        row({Y(f, c): 1.0 for c in range(n)}, k, k)
    for i, f in enumerate(mains):
        row({Mv(i, c): 1.0 for c in range(n)}, 1, 1)
        for c in range(n):
            row({Mv(i, c): 1.0, Y(f, c): -1.0}, -np.inf, 0)
    for c in range(n):
        if mains:
            row({Mv(i, c): 1.0 for i in range(len(mains))}, -np.inf, 1)
        if caps.load is not None:
            row({Y(f, c): 1.0 for f in range(F)}, caps.load[0], caps.load[1])
    if caps.phys_load is not None:
        for x in phys_ids:
            on = np.flatnonzero(phys == x)
            if len(on) == inst.smt[x]:                  # the whole physical core is in the domain
                row({Y(f, c): 1.0 for f in range(F) for c in on}, caps.phys_load[0], caps.phys_load[1])
    for f in range(F):
        for p, (a, b) in enumerate(close):
            row({o_z + f * len(close) + p: 1.0, Y(f, a): -1.0}, -np.inf, 0)
            row({o_z + f * len(close) + p: 1.0, Y(f, b): -1.0}, -np.inf, 0)
    if nzm:
        for p, (a, b) in enumerate(close):
            entries = {o_zm + p: -1.0}
            for i in range(len(mains)):
                entries[Mv(i, a)] = entries.get(Mv(i, a), 0.0) + 1.0
                entries[Mv(i, b)] = entries.get(Mv(i, b), 0.0) + 1.0
            row(entries, -np.inf, 1)
    if use_ev:              # e_c >= (N_c - L) + M_c - 1
        for c in range(n):
            entries = {o_e + c: -1.0}
            for f in range(F):
                entries[Y(f, c)] = 1.0
            for i in range(len(mains)):
                entries[Mv(i, c)] = entries.get(Mv(i, c), 0.0) + 1.0
            row(entries, -np.inf, inst.L + 1)
        row({o_e + c: 1.0 for c in range(n)}, -np.inf, el)
    if use_pev:             # ep_x >= (N_x - L+) + M+_x - 1, M+_x >= main on a sibling
        for xi, x in enumerate(phys_ids):
            on = np.flatnonzero(phys == x)
            for c in on:
                for i in range(len(mains)):
                    row({o_x + xi: 1.0, Mv(i, c): -1.0}, 0, np.inf)
            entries = {o_p + xi: -1.0, o_x + xi: 1.0}
            for f in range(F):
                for c in on:
                    entries[Y(f, c)] = 1.0
            row(entries, -np.inf, inst.L_phys + 1)
        row({o_p + xi: 1.0 for xi in range(nx)}, -np.inf, ep)
    gain = np.array([d_j - D[a, b] for a, b in close])
    value = np.zeros(N)
    if close:
        value[o_z:o_z + nz] = np.tile(gain, F)            # shared worker pairs gain
        if nzm:
            value[o_zm:o_zm + nzm] = -gain                # shared main pairs lose
    data, ri, ci = [], [], []
    for r, entries in enumerate(rows):
        for col, v in entries.items():
            ri.append(r)
            ci.append(col)
            data.append(v)
    A = sp.csr_matrix((data, (ri, ci)), shape=(len(rows), N))
    h = boxed_max(value, A, np.array(lo, dtype=float), np.array(hi, dtype=float), 1.0, max(0.1, time_limit),
                  integer=True)
    h.run()
    if h.getInfo().primal_solution_status != 2:       # no feasible point (infeasible, or none in time)
        return None
    x = np.round(np.asarray(h.getSolution().col_value)).astype(int)
    out = []
    for f, (_, has) in enumerate(shape):
        on = np.flatnonzero(x[f * n:(f + 1) * n])
        main_at = None
        if has:
            i = mains.index(f)
            main_at = int(np.flatnonzero(x[o_m + i * n:o_m + (i + 1) * n])[0])
        out.append((on, main_at))
    return out
