"""A constructive mapping: an immediate answer and the solver's warm start.

Threads are placed one at a time - all main threads first, then rank by rank
across the workers - each on the feasible core that raises the objective
most. "Feasible" keeps every family satisfiable to the end: a core may reach
the upper load ``U`` only while fewer than ``r`` cores have (so every core
ends within ``L..U``), likewise for physical cores and ``U+``, and a core
hosting a main thread may reach ``U`` only while (12)'s budget lasts. Ties
go to the least loaded core, then to cores in *scatter order* (an order of
the cores whose every prefix is spread evenly over the cache tree, like
hwloc's ``distrib``), so equal choices fill the machine evenly.

The greedy placement can dead-end on unusual family combinations; it then
returns ``None`` and the solver starts cold. :func:`local_search` polishes a
mapping (swaps, moves and two-move chains of non-main threads) when the
bounds do not prove the greedy one optimal.

Both read the model's rules from a :class:`~tuna_lab.model.caps.Caps` and
know nothing else: a family that contributes no caps cannot be honoured
here, which is why the model does not call them then.
"""

import time
from dataclasses import dataclass

import numpy as np

from ..families import worker_counts
from ..ranks import assign_ranks

__all__ = ["scatter_order", "greedy_mapping", "local_search"]


def scatter_order(chain_labels, C):
    """Core positions ordered so that every prefix is balanced over every cache level.

    Parameters
    ----------
    chain_labels : list of arrays
        Partitions of the cores from the finest (physical cores) to the
        coarsest, each a (C,) label array; must be nested.
    C : int

    Examples
    --------
    >>> core = np.array([0, 1, 0, 1])          # two physical cores, siblings c and c+2
    >>> scatter_order([core], 4).tolist()
    [0, 1, 2, 3]
    """
    # Sort key, most significant first: the rank of a core among its siblings
    # at the finest level, then its rank within the next level's domain, ...
    # Interleaving "rank within parent" from the coarse end reproduces a
    # round-robin descent of the tree.
    keys = []
    prev = np.arange(C)                      # singletons
    for labels in list(chain_labels) + [np.zeros(C, dtype=int)]:
        labels = np.asarray(labels)
        # rank of each child group (prev label) inside its parent (labels)
        child_first = {}
        rank = np.empty(C, dtype=int)
        seen = {}
        for c in range(C):
            g, p = prev[c], labels[c]
            if g not in child_first:
                child_first[g] = seen.get(p, 0)
                seen[p] = seen.get(p, 0) + 1
            rank[c] = child_first[g]
        keys.append(rank)
        prev = labels
    # finest rank is the most significant: fill one sibling of every core first
    return np.lexsort(tuple(keys[::-1]))


def greedy_mapping(caps, chain_labels=None, order_by="rank"):
    """Place every thread greedily under the rules ``caps``; positions (W, T) or ``None``.

    ``order_by="rank"`` places rank by rank across the workers (spreads each
    rank, suits scatter); ``"worker"`` places all main threads, then worker
    by worker (lets a worker fill a domain before the next one, suits compact).
    """
    inst = caps.instance
    W, T, C = inst.W, inst.T, inst.C
    D = inst.distance
    if chain_labels is None:
        chain_labels = [inst.core]
    order = scatter_order(chain_labels, C)
    rank_in_order = np.empty(C, dtype=int)
    rank_in_order[order] = np.arange(C)
    core = inst.core

    cap_rank, cap_worker = caps.rank_limit, caps.worker_limit
    use_load = caps.load is not None
    use_phys = caps.phys_load is not None
    use_events = caps.event_budget is not None
    use_phys_events = caps.phys_event_budget is not None
    ev_bound, pev_bound = caps.event_budget, caps.phys_event_budget
    # r cores end at U (and r+ physical cores at U+) whatever the mapping
    U, r, Up, rp = inst.U, inst.r, inst.U_phys, inst.r_phys

    load = np.zeros(C, dtype=int)
    mains = np.zeros(C, dtype=int)
    B = np.zeros((W, C), dtype=int)
    pload = np.zeros(inst.P, dtype=int)
    pmain = np.zeros(inst.P, dtype=int)
    out = np.full((W, T), -1, dtype=int)
    at_U = at_Up = events = pevents = 0

    if order_by == "worker":
        sequence = [(w, 0) for w in range(W)] + [(w, t) for w in range(W) for t in range(1, T)]
    else:
        sequence = [(w, t) for t in range(T) for w in range(W)]
    # (2) caps each rank on a core; the greedy keeps only what that implies for the counts - at most
    # cap mains and cap (T-1) other threads per core - and numbers the ranks at the end
    # (assign_ranks: such counts always admit a numbering, de Werra). Numbering as it goes would
    # dead-end where the counts still fit: a core that took rank 2 early refusing the last rank 2
    # while another core lacks one.
    nonmain = np.zeros(C, dtype=int)
    nonmain_cap = cap_rank * (T - 1)
    for w, t in sequence:
        ok = ((mains < cap_rank) if t == 0 else (nonmain < nonmain_cap)) & (B[w] < cap_worker)
        reach_U = load + 1 == U
        if use_load:
            ok &= load < U
            if r > 0:
                ok &= ~reach_U | (at_U < r)
        preach = pload[core] + 1 == Up
        if use_phys:
            ok &= pload[core] < Up
            if rp > 0:
                ok &= ~preach | (at_Up < rp)
        has_main = mains > 0 if t > 0 else np.ones(C, bool)
        if use_events:
            ok &= ~(reach_U & has_main) | (events < ev_bound)
        phas_main = pmain[core] > 0 if t > 0 else np.ones(C, bool)
        if use_phys_events:
            ok &= ~(preach & phas_main) | (pevents < pev_bound)
        if not ok.any():
            return None
        if t == 0:
            gain = (mains @ D) if caps.spread_main else np.zeros(C)
        else:
            gain = caps.sign * (B[w] @ D)
        # best gain; then least loaded; then least loaded physical core; then scatter order
        cand = np.flatnonzero(ok)
        pick = cand[np.lexsort((rank_in_order[cand], pload[core[cand]], load[cand], -gain[cand]))[0]]
        x = core[pick]
        if use_events and load[pick] + 1 == U and (mains[pick] > 0 or t == 0):
            events += 1
        if use_phys_events and pload[x] + 1 == Up and (pmain[x] > 0 or t == 0):
            pevents += 1
        at_U += load[pick] + 1 == U
        at_Up += pload[x] + 1 == Up
        load[pick] += 1
        pload[x] += 1
        B[w, pick] += 1
        if t == 0:
            mains[pick] += 1
            pmain[x] += 1
        else:
            nonmain[pick] += 1
        out[w, t] = pick
    if caps.rank_cap is None or T < 2:
        return out
    others = B.copy()
    others[np.arange(W), out[:, 0]] -= 1
    return assign_ranks(out[:, 0], others, cap_rank)


@dataclass
class _Search:
    """What :func:`local_search` and its moves read and update in place.

    ``wi``/``ti`` list the non-main threads (worker, rank); ``g[w, c]`` is
    ``sum_c' B[w, c'] d(c, c')``, the distance of core ``c`` to worker ``w``'s threads.
    """

    caps: object
    pos: np.ndarray
    B: np.ndarray
    g: np.ndarray
    load: np.ndarray
    pload: np.ndarray
    mains: np.ndarray
    pmains: np.ndarray
    wi: np.ndarray
    ti: np.ndarray
    D0: np.ndarray
    core: np.ndarray
    #: most non-main threads a core may hold under (2)
    nonmain_cap: int
    t_end: float

    def loads_feasible(self, load, pload):
        """Whether loads ``load``/``pload`` (with the current mains) keep (8), (8+), (2), (12), (12+)."""
        caps, inst = self.caps, self.caps.instance
        if caps.load is not None and (load.min() < caps.load[0] or load.max() > caps.load[1]):
            return False
        if caps.phys_load is not None and \
                (pload.min() < caps.phys_load[0] or pload.max() > caps.phys_load[1]):
            return False
        if (load - self.mains).max() > self.nonmain_cap:
            return False
        if caps.event_budget is not None and \
                int(((load == inst.U) & (self.mains > 0)).sum()) > caps.event_budget:
            return False
        if caps.phys_event_budget is not None and \
                int(((pload == inst.U_phys) & self.pmains).sum()) > caps.phys_event_budget:
            return False
        return True


def local_search(pos, caps, time_limit=2.0, max_rounds=100000):
    """Improve a valid mapping by moving and swapping non-main threads; positions (W, T).

    Two moves, each keeping every rule of ``caps``: *swap* a non-main thread
    of one worker with one of another worker on a different core (no load,
    main thread or event changes; only (3) to check), and *move* one non-main
    thread to another core (the loads of two cores change: (8), (8+) and the
    events of (12)/(12+) are re-counted for the move). Each round takes the
    best improving move of either kind, with the gains of all candidates
    computed at once with numpy; the search stops at a local optimum or the
    time limit. Ranks are re-numbered at the end (:func:`assign_ranks`),
    since only the per-core counts of non-main threads matter to (2), and
    those the swaps keep.
    """
    t_end = time.perf_counter() + time_limit
    inst = caps.instance
    pos = np.array(pos, dtype=int)
    W, T = pos.shape
    C = inst.C
    if T < 2 or caps.sign == 0:
        return pos
    sign = caps.sign
    cap_worker = caps.worker_limit
    D0 = np.array(inst.distance, dtype=float)
    np.fill_diagonal(D0, 0.0)
    core = inst.core
    B = worker_counts(pos, C)
    load = B.sum(axis=0)
    mains = np.bincount(pos[:, 0], minlength=C)
    s = _Search(caps=caps, pos=pos, B=B, g=B @ D0, load=load,
                pload=np.bincount(core, weights=load, minlength=inst.P).astype(int), mains=mains,
                pmains=np.bincount(core, weights=mains, minlength=inst.P) > 0,
                wi=np.repeat(np.arange(W), T - 1), ti=np.tile(np.arange(1, T), W), D0=D0, core=core,
                nonmain_cap=W * T if caps.rank_cap is None else caps.rank_cap * (T - 1), t_end=t_end)
    g, pload, wi, ti = s.g, s.pload, s.wi, s.ti
    use_load, use_phys = caps.load is not None, caps.phys_load is not None
    use_events, use_pevents = caps.event_budget is not None, caps.phys_event_budget is not None
    L, U, Lp, Up = inst.L, inst.U, inst.L_phys, inst.U_phys
    K, Kp = caps.event_budget, caps.phys_event_budget
    # moves may change per-core counts of non-main threads when (2) cannot bind
    rank_ok = caps.rank_cap is None or caps.rank_cap * (T - 1) >= W
    pmains = s.pmains
    cores = np.arange(C)
    for _ in range(max_rounds):
        if time.perf_counter() > t_end:
            break
        ci = pos[wi, ti]
        gi = g[wi, ci]
        # swaps: thread i (w, c) <-> thread j (v, c')
        swap = sign * (g[wi[:, None], ci[None, :]] - gi[:, None] + g[wi[None, :], ci[:, None]]
                       - gi[None, :] - 2.0 * D0[ci[:, None], ci[None, :]])
        ok = (wi[:, None] != wi[None, :]) & (B[wi[:, None], ci[None, :]] < cap_worker) \
            & (B[wi[None, :], ci[:, None]] < cap_worker)
        swap = np.where(ok, swap, -np.inf)
        best_swap = np.unravel_index(np.argmax(swap), swap.shape)
        # moves: thread i (w, c) -> core c'
        move = sign * (g[wi] - gi[:, None] - D0[ci])
        ok = B[wi] < cap_worker
        ok &= cores[None, :] != ci[:, None]
        nonmain = load - mains
        ok &= (nonmain[None, :] + 1 <= s.nonmain_cap) | rank_ok
        same_phys = core[ci][:, None] == core[None, :]
        if use_load:
            ok &= (load[ci] - 1 >= L)[:, None] & (load[None, :] + 1 <= U)
        if use_phys:
            ok &= same_phys | ((pload[core[ci]] - 1 >= Lp)[:, None] & (pload[core][None, :] + 1 <= Up))
        if use_events:
            ev = int(((load == U) & (mains > 0)).sum())
            lost = ((load[ci] == U) & (mains[ci] > 0)).astype(int)
            won = ((load + 1 == U) & (mains > 0)).astype(int)
            ok &= ev - lost[:, None] + won[None, :] <= K
        if use_pevents:
            pev = int(((pload == Up) & pmains).sum())
            plost = ((pload[core[ci]] == Up) & pmains[core[ci]]).astype(int)
            pwon = ((pload[core] + 1 == Up) & pmains[core]).astype(int)
            ok &= same_phys | (pev - plost[:, None] + pwon[None, :] <= Kp)
        move = np.where(ok, move, -np.inf)
        best_move = np.unravel_index(np.argmax(move), move.shape)
        gain_swap, gain_move = swap[best_swap], move[best_move]
        if max(gain_swap, gain_move) <= 1e-9:
            # No single move or swap improves: try chains "thread i to c', and
            # another thread j into the core i left" (loads of i's core kept).
            if not _chain(s):
                break
            continue
        if gain_swap >= gain_move:
            # Apply the best swaps of this round whose workers are all distinct:
            # a swap's gain depends only on its two workers' rows.
            flat = swap.ravel()
            top = np.argpartition(-flat, min(4 * W, flat.size - 1))[:4 * W]
            top = top[np.argsort(-flat[top])]
            used = np.zeros(W, dtype=bool)
            for k in top:
                if flat[k] <= 1e-9:
                    break
                i, j = divmod(int(k), swap.shape[1])
                w, c, v, c2 = wi[i], ci[i], wi[j], ci[j]
                if used[w] or used[v]:
                    continue
                used[w] = used[v] = True
                pos[w, ti[i]], pos[v, ti[j]] = c2, c
                B[w, c] -= 1; B[w, c2] += 1; B[v, c2] -= 1; B[v, c] += 1
                g[w] += D0[c2] - D0[c]
                g[v] += D0[c] - D0[c2]
        else:
            i, c2 = best_move
            w, c = wi[i], ci[i]
            pos[w, ti[i]] = c2
            B[w, c] -= 1; B[w, c2] += 1
            g[w] += D0[c2] - D0[c]
            load[c] -= 1; load[c2] += 1
            pload[core[c]] -= 1; pload[core[c2]] += 1
    if caps.rank_cap is not None and T > 1:
        others = B.copy()
        others[np.arange(W), pos[:, 0]] -= 1
        pos = assign_ranks(pos[:, 0], others, caps.rank_cap)
    return pos


def _chain(s, n_first=60, n_second=4):
    """One improving two-move chain of the search ``s``, applied in place; whether one was found."""
    pos, B, g, wi, ti, D0, core = s.pos, s.B, s.g, s.wi, s.ti, s.D0, s.core
    sign, cap_worker = s.caps.sign, s.caps.worker_limit
    ci = pos[wi, ti]
    gi = g[wi, ci]
    first = sign * (g[wi] - gi[:, None] - D0[ci])
    ok = (B[wi] < cap_worker) & (np.arange(D0.shape[0])[None, :] != ci[:, None])
    first = np.where(ok, first, -np.inf).ravel()
    n_first = min(n_first, first.size - 1)
    top = np.argpartition(-first, n_first)[:n_first]
    top = top[np.argsort(-first[top])]
    C = D0.shape[0]
    for k in top:
        if time.perf_counter() > s.t_end or not np.isfinite(first[k]):
            return False
        i, c2 = divmod(int(k), C)
        w, c = wi[i], ci[i]
        g_w = g[w] + D0[c2] - D0[c]
        # second move: thread j (u, c3) -> c
        gj = np.where(wi == w, g_w[c] - g_w[ci] - D0[ci, c], g[wi, c] - gi - D0[ci, c])
        second = sign * gj
        bw = B[wi, c] - (wi == w)
        okj = (bw < cap_worker) & (ci != c) & (np.arange(len(wi)) != i)
        okj &= ~((wi == w) & (ci == c2))
        second = np.where(okj, second, -np.inf)
        need = -first[k]
        cand = np.flatnonzero(second > need + 1e-9)
        if cand.size == 0:
            continue
        cand = cand[np.argsort(-second[cand])][:n_second]
        for j in cand:
            u, c3 = wi[j], ci[j]
            new_load = s.load.copy()
            new_load[c2] += 1
            new_load[c3] -= 1
            new_pload = s.pload.copy()
            new_pload[core[c2]] += 1
            new_pload[core[c3]] -= 1
            if not s.loads_feasible(new_load, new_pload):
                continue
            pos[w, ti[i]] = c2
            B[w, c] -= 1; B[w, c2] += 1
            g[w] += D0[c2] - D0[c]
            pos[u, ti[j]] = c
            B[u, c3] -= 1; B[u, c] += 1
            g[u] += D0[c] - D0[c3]
            s.load[:] = new_load
            s.pload[:] = new_pload
            return True
    return False
