"""Plain-numpy counts of an assignment: threads per core, per worker and core, per rank and core.

The quantities of the Tuna ILP read off a finished ``(W, T)`` assignment of
core positions (``-1``: unassigned, not counted), with no solver: the
families' checks (:mod:`~tuna_lab.model.families`), the encodings, the
constructive mapping and the policies all count with these.

Examples
--------
>>> loads([[0, 0], [1, -1]], 3)
array([2, 1, 0])
"""

import numpy as np

__all__ = ["main_counts", "worker_counts", "rank_counts", "loads", "pair_sums"]


def _grouped_counts(groups, cores, n_groups, C):
    """counts[g, c] = number of (group, core) pairs, dropping unassigned entries."""
    ok = (cores >= 0) & (cores < C)
    flat = groups[ok] * C + cores[ok]
    return np.bincount(flat, minlength=n_groups * C).reshape(n_groups, C)


def main_counts(assign, C):
    """``A_c``: main threads per core, shape (C,)."""
    return _grouped_counts(np.zeros(len(assign), int), np.asarray(assign)[:, 0], 1, C)[0]


def worker_counts(assign, C):
    """``B_wc``: threads of worker ``w`` on core ``c``, shape (W, C)."""
    assign = np.asarray(assign)
    W, T = assign.shape
    return _grouped_counts(np.repeat(np.arange(W), T), assign.ravel(), W, C)


def rank_counts(assign, C):
    """Threads of rank ``t`` on core ``c`` over all workers, shape (T, C)."""
    assign = np.asarray(assign)
    W, T = assign.shape
    return _grouped_counts(np.tile(np.arange(T), W), assign.ravel(), T, C)


def loads(assign, C):
    """``N_c``: threads per logical core, shape (C,)."""
    return worker_counts(assign, C).sum(axis=0)


def pair_sums(counts, distance):
    """``sum_{c<c'} X_c X_c' d(c,c')`` for each row of ``counts`` (k, C)."""
    counts = np.atleast_2d(np.asarray(counts, dtype=float))
    full = np.einsum("kc,cd,kd->k", counts, distance, counts)
    diag = (counts ** 2) @ np.diag(distance)
    return (full - diag) / 2
