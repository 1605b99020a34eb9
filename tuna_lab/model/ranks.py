"""Recover thread ranks from per-core thread counts (the counts encoding's last step).

The counts encoding decides, for every worker, which core runs its main
thread and how many of its other threads run on each core. Equation (2)
also constrains *which rank* sits where: at most ``cap`` threads of one
rank per core. Numbering the threads is an edge-colouring problem on the
bipartite multigraph workers x cores (one edge per non-main thread, one
colour per rank); an equitable colouring exists whenever every core carries
at most ``cap * (T - 1)`` non-main threads (de Werra). We peel one colour
class at a time with a feasibility flow (networkx network simplex), keeping
every core's remaining degree within ``cap`` times the colours left.
"""

import networkx as nx
import numpy as np

from ..errors import ModelError

__all__ = ["assign_ranks"]


def assign_ranks(main, others, cap):
    """Number each worker's threads so that no core holds more than ``cap`` threads of a rank.

    Parameters
    ----------
    main : array of int, shape (W,)
        Core position of each worker's main thread (rank 0).
    others : array of int, shape (W, C)
        ``others[w, c]`` = number of worker ``w``'s non-main threads on core ``c``;
        every row sums to ``T - 1``.
    cap : int
        Threads of one rank allowed per core.

    Returns
    -------
    ndarray of int, shape (W, T)
        Core position of thread ``t`` of worker ``w``; column 0 is ``main``.

    Examples
    --------
    >>> assign_ranks(np.array([0, 1]), np.array([[0, 1, 1], [1, 0, 1]]), cap=1)
    array([[0, 2, 1],
           [1, 0, 2]])
    """
    main = np.asarray(main, dtype=int)
    rest = np.array(others, dtype=int, copy=True)
    W, C = rest.shape
    colours = int(rest[0].sum()) if W else 0
    if np.any(rest.sum(axis=1) != colours):
        raise ModelError("every worker must have the same number of threads")
    out = np.empty((W, colours + 1), dtype=int)
    out[:, 0] = main
    for k in range(colours, 0, -1):
        out[:, colours - k + 1] = _colour_class(rest, k, cap)
        rest[np.arange(W), out[:, colours - k + 1]] -= 1
    return out


def _colour_class(rest, k, cap):
    """One edge per worker such that every core keeps degree <= cap * (k - 1)."""
    W, C = rest.shape
    deg = rest.sum(axis=0)
    lo = np.maximum(deg - cap * (k - 1), 0)
    hi = np.minimum(deg, cap)
    if np.any(lo > hi):
        raise ModelError("thread counts admit no rank numbering satisfying (2)")
    G = nx.DiGraph()
    G.add_node("sink", demand=int(W - lo.sum()))
    for w in range(W):
        G.add_node(("w", w), demand=-1)
    used = np.flatnonzero(deg > 0)
    for c in used:
        G.add_node(("c", int(c)), demand=int(lo[c]))
        if hi[c] > lo[c]:
            G.add_edge(("c", int(c)), "sink", capacity=int(hi[c] - lo[c]), weight=0)
    for w, c in np.argwhere(rest > 0):
        G.add_edge(("w", int(w)), ("c", int(c)), capacity=1, weight=0)
    try:
        _, flow = nx.network_simplex(G)
    except nx.NetworkXUnfeasible:
        raise ModelError("thread counts admit no rank numbering satisfying (2)") from None
    choice = np.empty(W, dtype=int)
    for w in range(W):
        choice[w] = next(c for (_, c), f in flow[("w", w)].items() if f > 0)
    return choice
