"""Recover thread ranks from per-core thread counts (the counts encoding's last step).

The counts encoding decides, for every worker, which core runs its main
thread and how many of its other threads run on each core. Equation (2)
also constrains *which rank* sits where: at most ``cap`` threads of one
rank per core. Numbering the threads is an edge-colouring problem on the
bipartite multigraph workers x cores (one edge per non-main thread, one
colour per rank); an equitable colouring exists whenever every core carries
at most ``cap * (T - 1)`` non-main threads (de Werra). We peel one colour
class at a time with a feasibility flow (a maximum flow, scipy), keeping
every core's remaining degree within ``cap`` times the colours left.
"""

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
    """One edge per worker such that every core keeps degree <= cap * (k - 1).

    A feasible flow with lower bounds (core ``c`` must take at least
    ``deg_c - cap (k-1)`` of the edges), found as a maximum flow between a
    super source and sink (scipy's Dinic): the usual reduction of lower bounds.
    """
    import scipy.sparse as sp
    from scipy.sparse.csgraph import maximum_flow

    W, C = rest.shape
    deg = rest.sum(axis=0)
    lo = np.maximum(deg - cap * (k - 1), 0)
    hi = np.minimum(deg, cap)
    if np.any(lo > hi):
        raise ModelError("thread counts admit no rank numbering satisfying (2)")
    s, t, S, T = W + C, W + C + 1, W + C + 2, W + C + 3
    ww, cc = np.nonzero(rest > 0)
    cores = np.arange(C)
    src = [ww, W + cores, [t], np.full(W, S), [s], W + cores, [S]]
    dst = [W + cc, np.full(C, t), [s], np.arange(W), [T], np.full(C, T), [t]]
    cap_ = [np.ones(ww.size), hi - lo, [W], np.ones(W), [W], lo, [lo.sum()]]
    src, dst = np.concatenate(src).astype(np.int32), np.concatenate(dst).astype(np.int32)
    cap_ = np.concatenate(cap_).astype(np.int32)
    keep = cap_ > 0
    graph = sp.csr_array((cap_[keep], (src[keep], dst[keep])), shape=(T + 1, T + 1))
    graph.sum_duplicates()
    res = maximum_flow(graph, S, T)
    if res.flow_value != W + lo.sum():
        raise ModelError("thread counts admit no rank numbering satisfying (2)")
    flow = res.flow.tocsr()[:W, W:W + C].toarray()
    if np.any((flow > 0).sum(axis=1) != 1):
        raise ModelError("thread counts admit no rank numbering satisfying (2)")
    return np.argmax(flow > 0, axis=1)
