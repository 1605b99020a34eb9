"""Hypothesis strategies shared by the tuna_lab tests.

Kept small on purpose: machines of at most 16 logical cores solve and compare
quickly, and still cover packages, NUMA nodes, shared and private caches and SMT.
"""

from hypothesis import strategies as st

from tuna_lab.topology import Topology

__all__ = ["synthetic_specs", "topologies", "relabelled"]

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
