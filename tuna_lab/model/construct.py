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
returns ``None`` and the solver starts cold.
"""

import numpy as np

from .families import PhysicalBalance

__all__ = ["scatter_order", "greedy_mapping"]


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


def greedy_mapping(inst, families, chain_labels=None, order_by="rank"):
    """Place every thread greedily under the families' rules; positions (W, T) or ``None``.

    ``order_by="rank"`` places rank by rank across the workers (spreads each
    rank, suits scatter); ``"worker"`` places all main threads, then worker
    by worker (lets a worker fill a domain before the next one, suits compact).
    """
    W, T, C = inst.W, inst.T, inst.C
    keys = {f.key for f in families}
    D = inst.distance
    if chain_labels is None:
        chain_labels = [inst.core]
    order = scatter_order(chain_labels, C)
    rank_in_order = np.empty(C, dtype=int)
    rank_in_order[order] = np.arange(C)
    core = inst.core

    cap_rank = inst.cap_rank if "2" in keys else W
    cap_worker = inst.cap_worker if "3" in keys else T
    use_load = "8" in keys
    use_phys = "8p" in keys and PhysicalBalance().applies(inst)
    use_events = "11-12" in keys and inst.scenario3
    use_phys_events = "11p-12p" in keys and use_phys and inst.scenario3_phys
    ev_bound = max(0, W - C + inst.r)
    pev_bound = max(0, min(W, inst.P) - inst.P + inst.r_phys)
    U, r, Up, rp = inst.U, inst.r, inst.U_phys, inst.r_phys
    sign = inst.sign if "6-7" in keys else 0
    spread_main = "4-5" in keys

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
    per_rank = np.zeros((T, C), dtype=int)
    for w, t in sequence:
        if True:
            ok = (per_rank[t] < cap_rank) & (B[w] < cap_worker)
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
                gain = (mains @ D) if spread_main else np.zeros(C)
            else:
                gain = sign * (B[w] @ D)
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
            per_rank[t, pick] += 1
            if t == 0:
                mains[pick] += 1
                pmain[x] += 1
            out[w, t] = pick
    return out
