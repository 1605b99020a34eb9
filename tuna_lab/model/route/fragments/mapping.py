"""From a fragment plan to positions: deal the fragments to workers and domains, then place them on cores.

:func:`fragment_mapping` follows a :class:`~.program.FragmentSolution`'s
plan: its domain patterns go to the level's domains, its partitions to the
workers, and a small exact program per domain (HiGHS) places that domain's
fragments on its cores, keeping every family the caps know and making the
finer levels as good as they can be.
"""

import time
from typing import NamedTuple

import numpy as np

from ...ranks import assign_ranks

__all__ = ["fragment_mapping"]


class _Fragment(NamedTuple):
    """A worker's threads dealt to one domain."""

    worker: int
    size: int


class _Worker(NamedTuple):
    """A worker's fragment sizes, largest first, and the size of the one holding its main thread."""

    sizes: np.ndarray
    marked: int


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
            if not free[col.cls]:
                return None
            plan[free[col.cls].pop(0)] = col
    if any(p is None for p in plan):
        return None
    t_end = time.perf_counter() + time_limit
    deal = _deal(plan, program.partitions, solution.workers, W, np.random.default_rng(seed), t_end)
    if deal is None:
        return None
    fragments, mains = deal                     # fragments[g]: its _Fragment list; mains: (worker, g)
    main_of = dict(mains)
    pos_main = np.full(W, -1)
    others = np.zeros((W, C), dtype=int)
    cache = {}
    for g in range(n_dom):
        cores = np.flatnonzero(labels == g)
        frags = sorted(fragments[g], key=lambda f: (-int(main_of[f.worker] == g), -f.size, f.worker))
        shape = tuple((f.size, main_of[f.worker] == g) for f in frags)
        key = (shape, plan[g].events, plan[g].phys_events, _structure(chain, j, cores, inst.core))
        if key not in cache:
            left = t_end - time.perf_counter()
            if left <= 0:
                return None
            cache[key] = _place(caps, chain, j, cores, shape, plan[g].events, plan[g].phys_events,
                                left if place_limit is None else min(left, place_limit))
        placed = cache[key]
        if placed is None:
            return None
        for frag, (on, main_at) in zip(frags, placed):
            on = cores[on]
            if main_at is not None:
                pos_main[frag.worker] = cores[main_at]
                on = on[on != cores[main_at]]
            others[frag.worker, on] += 1
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
    workers = [_Worker(np.repeat(np.arange(1, len(p.counts) + 1), p.counts)[::-1], p.marked + 1)
               for p, n in zip(partitions, counts) for _ in range(int(n))]
    if len(workers) != W:
        return None
    for attempt in range(attempts):
        if attempt and time.perf_counter() > t_end:
            return None
        need = [{k + 1: int(c) for k, c in enumerate(col.counts) if c} for col in plan]
        mains_left = [int(col.mains) for col in plan]
        frags_left = [int(col.counts.sum()) for col in plan]
        other = [int(col.other) for col in plan]
        order = sorted(range(W), key=lambda w: (-len(workers[w].sizes), -workers[w].marked))
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
                fragments[g].append(_Fragment(w, k))
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

    from ...highs.programs import boxed_max

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
