"""Counting and listing partitions: a domain's fragments, and a worker's ``T`` threads split over domains.

A partition is kept as a *count vector* (entry ``k - 1``: how many parts of
size ``k``), which is what the fragment programs' rows read; a worker is a
partition of ``T`` with the part holding its main thread marked
(:class:`Partition`).

Examples
--------
>>> list(partitions(4, 2))
[(2, 2), (2, 1, 1), (1, 1, 1, 1)]
>>> marked_partitions(3, 3)[:2]
[Partition(counts=array([0, 0, 1]), marked=2), Partition(counts=array([1, 1, 0]), marked=0)]
"""

from typing import NamedTuple

import numpy as np

__all__ = ["Partition", "partitions", "count_vectors", "count_partitions", "as_counts", "marked_partitions"]


class Partition(NamedTuple):
    """A worker's column: how its ``T`` threads split into fragments, and which fragment holds its main."""

    #: How many fragments of each size (entry ``k - 1``: size ``k``).
    counts: np.ndarray
    #: Index (size - 1) of the fragment holding the main thread.
    marked: int

    def key(self):
        """The column's identity (count vectors are arrays, which do not hash)."""
        return np.asarray(self.counts, dtype=np.int64).tobytes(), int(self.marked)


def partitions(n, largest, most=None):
    """Every partition of ``n`` into parts of at most ``largest`` (and at most ``most`` parts), non-increasing."""
    if n == 0:
        yield ()
        return
    if most is not None and (most <= 0 or n > most * largest):
        return
    for first in range(min(n, largest), 0, -1):
        for rest in partitions(n - first, first, None if most is None else most - 1):
            yield (first,) + rest


def count_vectors(n_min, n_max, largest):
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


def count_partitions(n_max, largest, most):
    """How many partitions of each ``n <= n_max`` have parts of at most ``largest`` and at most ``most`` parts."""
    # ways[n, p]: partitions of n into exactly p parts, sizes added one at a time (each any number of times)
    most = min(most, n_max)
    ways = np.zeros((n_max + 1, most + 1))
    ways[0, 0] = 1.0
    for k in range(1, largest + 1):
        for n in range(k, n_max + 1):
            ways[n, 1:] += ways[n - k, :-1]
    return ways.sum(axis=1)


def as_counts(part, largest):
    """A partition as a count vector: entry ``k - 1`` is how many parts have size ``k``."""
    return np.bincount(np.asarray(part, dtype=int) - 1, minlength=largest)[:largest] if part \
        else np.zeros(largest, dtype=int)


def marked_partitions(T, largest, most=None):
    """The workers: partitions of ``T`` (at most ``most`` parts) as :class:`Partition`, one for each size a
    part has (the fragment holding the main thread)."""
    out = []
    for part in partitions(T, largest, most):
        vec = as_counts(part, largest)
        out += [Partition(vec, int(k)) for k in np.flatnonzero(vec)]
    return out
