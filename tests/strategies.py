"""Hypothesis strategies shared by the tuna_lab tests (all of them live here).

Kept small on purpose: machines of at most 16 logical cores solve and compare
quickly, and still cover packages, NUMA nodes, shared and private caches and SMT.
The model tests draw machines of at most 8 PUs (``synthetic_specs(max_pus=8)``)
so that brute force can check the optimum.
"""

import numpy as np
from hypothesis import strategies as st

from tuna_lab.machine.topology import Topology

__all__ = ["synthetic_specs", "topologies", "relabelled", "numa_specs", "numa_topologies",
           "rank_problems", "fragment_cases", "race_problems", "article_budgets"]

MAX_PUS = 16


@st.composite
def synthetic_specs(draw, max_pus=MAX_PUS):
    """hwloc synthetic strings such as ``"pack:2 l3:2 l2:1 core:3 pu:2"``.

    Optional levels: 1-2 packages, 1-2 NUMA nodes, 1-3 L3 domains per package,
    1-2 L2 domains per L3; then 1-3 cores and 1-2 PUs per core; at most
    ``max_pus`` PUs in all.
    """
    levels, total = [], 1

    def level(kind, most):
        # Cap each arity by what is left of the budget, so every draw is valid.
        nonlocal total
        arity = draw(st.integers(1, max(1, min(most, max_pus // total))))
        levels.append((kind, arity))
        total *= arity

    if draw(st.booleans()):
        level("pack", 2)
    if draw(st.booleans()):
        level("numa", 2)
    if draw(st.booleans()):
        level("l3", 3)
    if draw(st.booleans()):
        level("l2", 2)
    level("core", 3)
    level("pu", 2)
    return " ".join(f"{kind}:{arity}" for kind, arity in levels)


def topologies(max_pus=MAX_PUS):
    """Small synthetic :class:`Topology` objects."""
    return synthetic_specs(max_pus).map(Topology.synthetic)


@st.composite
def relabelled(draw, max_pus=MAX_PUS):
    """``(topology, perm)``: a small topology and a random permutation of its OS ids."""
    topo = draw(topologies(max_pus))
    new = draw(st.permutations(topo.cpus))
    return topo, dict(zip(topo.cpus, new))


@st.composite
def numa_specs(draw, max_pus=MAX_PUS):
    """Synthetic specs with 2-3 NUMA nodes above (nested) caches.

    The nodes are one per package (``pack:2 numa:1``), two per package or 2-3
    without packages; then optional L3 (1-2 per node) and L2 (1-2 per L3),
    1-2 cores and 1-2 PUs per core, at most ``max_pus`` PUs in all.
    """
    top = draw(st.sampled_from(["pack:2 numa:1", "pack:2 numa:2", "numa:2", "numa:3"]))
    total = 1
    for part in top.split():
        total *= int(part.split(":")[1])
    levels = [top]
    for kind, most, optional in (("l3", 2, True), ("l2", 2, True), ("core", 2, False), ("pu", 2, False)):
        if optional and not draw(st.booleans()):
            continue
        arity = draw(st.integers(1, max(1, min(most, max_pus // total))))
        levels.append(f"{kind}:{arity}")
        total *= arity
    return " ".join(levels)


@st.composite
def numa_topologies(draw, max_pus=MAX_PUS):
    """Small NUMA topologies with a ``"remote"`` cost >= ``"none"`` (sometimes equal).

    ``"none"`` is drawn in 200..400 and ``"remote"`` up to 800 above it.
    """
    topo = Topology.synthetic(draw(numa_specs(max_pus)))
    none = draw(st.integers(200, 400))
    remote = none + draw(st.sampled_from([0, 1, 20, 220, 800]))
    return topo.with_costs({"none": none, "remote": remote})


@st.composite
def rank_problems(draw):
    """``(main, others, cap)`` meeting :func:`~tuna_lab.model.ranks.assign_ranks`' condition.

    Every worker has ``T - 1`` non-main threads; every core carries at most
    ``cap * (T - 1)`` of them and at most ``cap`` main threads.
    """
    C = draw(st.integers(1, 6))
    cap = draw(st.integers(1, 3))
    W = draw(st.integers(1, min(8, C * cap)))
    T = draw(st.integers(1, 6))
    room_main = np.full(C, cap)
    main = []
    for _ in range(W):
        choices = np.flatnonzero(room_main > 0).tolist()
        c = draw(st.sampled_from(choices))
        room_main[c] -= 1
        main.append(c)
    room = np.full(C, cap * (T - 1))
    others = np.zeros((W, C), dtype=int)
    # Skewed draws reach the capacity of some cores, the hard cases.
    skew = draw(st.booleans())
    for w in range(W):
        for _ in range(T - 1):
            choices = np.flatnonzero(room > 0).tolist()
            c = choices[0] if skew and draw(st.booleans()) else draw(st.sampled_from(choices))
            room[c] -= 1
            others[w, c] += 1
    return np.array(main, dtype=int), others, cap


@st.composite
def fragment_cases(draw, max_pus=8, max_assignments=300_000):
    """``(spec, W, T, drop)``: compact-mode instances small enough to enumerate, for the bounds' tests.

    Machines of at most ``max_pus`` PUs (:func:`synthetic_specs`) with
    ``C ** (W T)`` at most ``max_assignments``; ``drop`` is a tuple of family
    keys to remove (each with what requires it), often empty.
    """
    spec = draw(synthetic_specs(max_pus=max_pus))
    C = Topology.synthetic(spec).n_logical
    W = draw(st.integers(1, 4))
    most = 1
    while C ** (W * (most + 1)) <= max_assignments and most < 4:
        most += 1
    T = draw(st.integers(1, most))
    if C ** (W * T) > max_assignments:
        W, T = 1, min(T, most)
    drop = draw(st.sampled_from([(), (), ("8p", "11p-12p"), ("11p-12p",), ("11-12",), ("3",), ("2",),
                                 ("4-5",)]))
    return spec, W, T, drop


@st.composite
def race_problems(draw, max_candidates=9):
    """A simulated ``tune`` race: ``{"rates": {name: true rate}, "pairs", "policies", ...}``.

    1-3 W x T pairs x 1-3 policies (at most ``max_candidates`` candidates),
    each with a true rate (requests/s within the target) between 2 and 400,
    often close to another's (the hard case); the race's ``rounds``,
    ``eta``, ``steps`` and ``step_seconds``; the per-run ``overhead`` (a
    server start, seconds); a ``budget``, sometimes too short to finish; and
    the ``seed`` of the target's noise.
    """
    pairs = draw(st.lists(st.sampled_from([(1, 1), (1, 2), (2, 1), (2, 2), (4, 1)]), min_size=1, max_size=3,
                          unique=True))
    policies = draw(st.lists(st.sampled_from(["cfs", "round-robin", "tuna-scatter"]), min_size=1,
                             max_size=max(1, min(3, max_candidates // len(pairs))), unique=True))
    rates = {}
    for w, t in pairs:
        base = draw(st.floats(2.0, 400.0))
        for policy in policies:
            # Policies of a pair close to each other (within 10%), pairs anywhere: as on a real machine.
            rates[f"{w}x{t} {policy}"] = base * draw(st.floats(0.9, 1.1))
    return {"rates": rates, "pairs": pairs, "policies": policies,
            "rounds": draw(st.integers(1, 4)), "eta": draw(st.sampled_from([1.0, 2.0, 3.0, 4.0])),
            "steps": draw(st.integers(1, 4)), "step_seconds": draw(st.sampled_from([0.5, 1.0, 2.0])),
            "overhead": draw(st.floats(0.5, 5.0)),
            "budget": draw(st.sampled_from([40.0, 120.0, 600.0, 3600.0])),
            "seed": draw(st.integers(0, 2 ** 16))}


@st.composite
def article_budgets(draw):
    """``(cpus, smaller, larger)``: a machine's CPU count and two budgets in seconds for the article design.

    From a minute (less than the smallest design needs) to two days (more than the whole design on 2 CPUs).
    """
    cpus = draw(st.sampled_from([1, 2, 3, 4, 8, 12, 16, 32, 64]))
    low = draw(st.floats(60, 2 * 86_400, allow_nan=False))
    high = draw(st.floats(low, 2 * 86_400, allow_nan=False))
    return cpus, low, high
