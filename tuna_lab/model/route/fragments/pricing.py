"""Column generation: the domain patterns (and workers) of a program too big to write out.

:class:`Pricing` finds the patterns that price out at the relaxation's
duals - by a table of every pattern where they fit in memory, else by a
walk over partial patterns pruned by a knapsack bound - until none does,
which proves the relaxation's optimum over all of them; then
:class:`~.branching.Branching` searches the integer plans.
"""

import time
from dataclasses import replace

import numpy as np

from . import tuning
from .branching import Branching
from .partitions import Partition, as_counts, count_partitions, count_vectors, marked_partitions, partitions
from .program import Column, assemble, central_bound, dual_bound, main_counts, merged

__all__ = ["Pricing"]


class Pricing:
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
        self.npc = [physical for _, physical in classes]       # classes: (logical cores, physical cores)
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
            h_max = max((shape.hi for shape in self.shapes), default=0)
            n_min = min((max(shape.lo, shape.mains) for shape in self.shapes), default=0)
            # count them first (any number of parts: the table's rows before the W filter)
            if count_partitions(h_max, self.largest, h_max)[n_min:].sum() > tuning.TABLE_ROWS:
                self._table = False
                return None
            V = count_vectors(n_min, h_max, self.largest)
            V = V[V.sum(axis=1) <= self.W]
            # counts of fragments bigger than each size (tail[:, k]: sizes above k), for the shapes' filters
            tail = np.concatenate([np.cumsum(V[:, ::-1], axis=1)[:, ::-1], np.zeros((len(V), 1), dtype=np.int64)],
                                  axis=1)
            self._table = (V, V @ self.sizes, V.sum(axis=1), tail)
        return self._table or None

    def _values(self, shape, V):
        """The program's value of every pattern of ``V`` (fragment counts, one per row) in ``shape``."""
        ci, a, el, ep = shape.cls, shape.mains, shape.events, shape.phys_events
        value = -0.5 * self.wt * ((a * a if self.use_main else 0) - V.astype(float) @ self.squares)
        if self.inner is not None:
            value = value + self.inner(V, V @ self.sizes, a, el, ep, self.npc[ci], shape.other)
        return value

    def _columns(self, shape, V, values=None):
        """The program's columns of the patterns of ``V`` in ``shape`` (``values``: their :meth:`_values`)."""
        values = self._values(shape, V) if values is None else values
        return [Column(shape.cls, shape.mains, shape.events, shape.phys_events, vec, float(value), shape.other)
                for vec, value in zip(V, values)]

    def _fits(self, shape, vec):
        a, parts = shape.mains, int(vec.sum())
        return parts >= a and parts <= self.W and int(vec[shape.other:].sum()) <= a and not vec[shape.own:].any()

    def initial(self, deadline, most_extra=2):
        """Patterns of at most ``a + most_extra`` fragments: enough for a feasible start, usually.

        Fewer extra fragments where those are more than ``tuning.MAX_COLUMNS`` (domains
        of 32 logical cores carrying up to 48 threads: hundreds of thousands);
        ``None`` if even ``a`` fragments are, or at the deadline.
        """
        # the mains a domain takes when they are spread evenly, and one more: pricing adds the rest
        spread = -(-self.W // sum(self.counts)) + 1
        for extra in range(most_extra, -1, -1):
            columns = []
            for shape in (shape for shape in self.shapes if shape.mains <= spread):
                a, lo, hi, own = shape.mains, shape.lo, shape.hi, shape.own
                for n in range(max(lo, a), hi + 1):
                    vecs = [vec for vec in (as_counts(part, self.largest)
                                            for part in partitions(n, min(own, self.largest), max(a, 1) + extra))
                            if self._fits(shape, vec)]
                    if vecs:
                        columns += self._columns(shape, np.array(vecs))
                    if deadline is not None and time.perf_counter() > deadline:
                        return None
                    if len(columns) > tuning.MAX_COLUMNS:
                        break
                if len(columns) > tuning.MAX_COLUMNS:
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
        must, may = main_counts(C, a, other)
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

    def price(self, y, threshold, deadline, state_limit=tuning.STATE_LIMIT, keep=tuning.KEEP):
        """Patterns whose profit at ``y`` exceeds ``threshold`` (at most ``keep`` per shape, best first; all if
        ``None``).

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
        h_max = max((shape.hi for shape in self.shapes), default=0)
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
                        found.append(Partition(vec.copy(), int(m)))
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
        """Generate columns until none prices out, then price-and-branch (:class:`Branching`).

        With :attr:`workers`, the partitions of ``T`` are generated alongside the domain patterns.
        """
        t_end = time.perf_counter() + time_limit
        while True:
            left = t_end - time.perf_counter()
            relaxed = program.relaxation(left) if left > 0 else None
            if relaxed is None and left > 0 and self.workers and self.most < self.caps.instance.T:
                # the partitions of few parts fit no plan: those of a few parts more (pricing needs one)
                self.most += tuning.EXTRA_PARTS
                program = self.extended(program, (), marked_partitions(self.caps.instance.T, self.largest, self.most))
                continue
            if relaxed is None:
                return None
            bound, _, _, y = relaxed
            # patterns that gain less than ``eps`` are left out: together they add at most
            # ``eps`` per domain, which the bound below counts (``unseen``)
            eps = 1e-7 * max(1.0, abs(bound))
            y = dual_bound(program, y)[0]        # signs clipped: the bound below comes from these duals
            new, new_workers = self.price(y, eps, t_end), self.price_workers(y, eps, t_end)
            if new is None or new_workers is None:
                return None                  # the relaxation's optimum over all patterns is not proven
            known = {c.key() for c in program.columns}
            known_workers = {p.key() for p in program.partitions}
            if all(c.key() in known for c in new) and all(p.key() in known_workers for p in new_workers):
                # the best few of each shape are all known: so is every pattern that prices out? (only
                # a shape that found its fill may have more)
                shapes = [(c.cls, c.mains, c.events, c.phys_events) for c in new]
                if all(shapes.count(k) < tuning.KEEP for k in set(shapes)):
                    break
                new = self.price(y, eps, t_end, keep=None)
                if new is None:
                    return None
                if all(c.key() in known for c in new):
                    break
            program = self.extended(program, new, new_workers)
        # (and each worker left out less than ``eps``)
        unseen = eps * (sum(self.counts) + (self.W if self.workers else 0))
        y, _, ceiling = dual_bound(program, y, unseen)
        # central duals put far fewer columns within a slack than the vertex's (see FragmentProgram.solve):
        # take them where no pattern left out prices out at them either
        yc, _, ceiling_c = central_bound(program, y, bound, t_end, unseen)
        if not np.array_equal(yc, y):
            found, found_workers = self.price(yc, eps, t_end, keep=None), self.price_workers(yc, eps, t_end)
            if found is not None and all(c.key() in known for c in found) and found_workers is not None \
                    and all(p.key() in known_workers for p in found_workers):
                y, ceiling = yc, ceiling_c
        return Branching(self, program, y, ceiling, slack).run(t_end - time.perf_counter(), on_plan)

    def extended(self, program, new, new_workers=()):
        """``program`` with the columns of ``new`` (and the partitions of ``new_workers``) it does not hold
        yet (a generated program, each time from its own columns: each branch must hold every column it
        was priced for)."""
        cols = merged(program.columns, new)
        parts = merged(program.partitions, new_workers)
        value, A, lb, ub = assemble(self.caps, program.classes, cols, parts, self.largest)
        return replace(program, columns=cols, partitions=parts, value=value, A=A, lb=lb, ub=ub)



class _OutOfNodes(Exception):
    """The pricing walk's node budget ran out."""

