"""Which fragment program a level gets: written out, or generating its columns (see :func:`fragment_program`)."""

import time

import numpy as np

from ..bounds import domain_shapes
from . import tuning
from .inner import inner_rule
from .partitions import count_partitions, count_vectors, marked_partitions
from .pricing import Pricing
from .program import Column, FragmentProgram, assemble

__all__ = ["fragment_program"]


def fragment_program(caps, chain, j, inner=True, max_columns=None, deadline=None):
    """The fragment program of level ``j`` (:class:`FragmentProgram`), or ``None`` where it does not apply.

    It applies in compact mode to a level above the cores (``j >= 1``)
    whose weight ``d_{j+1} - d_j`` is positive, and not with more than
    ``max_columns`` columns (default :data:`~.tuning.MAX_COLUMNS`), nor once ``time.perf_counter()`` passes
    ``deadline`` while building. With ``inner`` and SMT-2 physical cores just
    below level ``j = 2``, each column also carries a bound of its domain's
    two finer levels, and the program bounds levels ``0..j`` together
    (:attr:`FragmentProgram.levels`); otherwise level ``j`` alone.

    Examples
    --------
    >>> from tuna_lab import Topology, TunaModel
    >>> from tuna_lab.model.encodings import ultrametric_chain
    >>> model = TunaModel(64, 6, Topology.preset("epyc-9654-2s"), mode="compact")
    >>> program = fragment_program(model.caps, ultrametric_chain(model.instance.topology), 2)
    >>> len(program.partitions)          # the 11 partitions of T = 6, each with its main's part marked
    19
    >>> program.pricing is None          # small enough to write out
    True
    """
    max_columns = tuning.MAX_COLUMNS if max_columns is None else max_columns
    inst = caps.instance
    W, T = inst.W, inst.T
    s = caps.sign
    d = [0.0] + [c for c, _ in chain]
    if s >= 0 or j < 1 or j >= len(d) - 1:
        return None
    wt = d[j + 1] - d[j]
    if wt <= 0:
        return None
    use_main = caps.spread_main
    classes, shapes = domain_shapes(caps, chain, j)
    largest = min(max((shape.own for shape in shapes), default=0), T)
    hi_max = max((shape.hi for shape in shapes), default=0)
    if largest < 1:
        return None
    inner = inner_rule(caps, chain, j) if inner else None
    levels = tuple(range(j + 1)) if inner is not None else (j,)
    # a worker: a partition of T with one marked part, the fragment that holds its main thread; where
    # T has too many partitions (T much bigger than a domain), those of few parts and the ones that price out
    many = count_partitions(T, largest, T)[T] > tuning.WORKER_PARTITIONS
    most = -(-T // largest) + tuning.EXTRA_PARTS if many else T
    partitions = marked_partitions(T, largest, most)

    def generated():
        # too many patterns to write out: generate the ones that matter (see FragmentProgram.solve)
        pricing = Pricing(caps, chain, j, wt, classes, shapes, largest, inner, most=most if many else None)
        columns = pricing.initial(deadline)
        if not columns:
            return None
        value, A, lb, ub = assemble(caps, classes, columns, partitions, largest)
        return FragmentProgram(caps, chain, j, levels, classes, columns, partitions, value, A, lb, ub,
                               max(max(classes.values()), W), pricing)

    if many or count_partitions(hi_max, largest, W).sum() > max_columns or len(partitions) > max_columns:
        return generated()                   # too many to write out: counted, not listed
    # every partition of up to hi_max threads into at most W fragments, as count vectors by their total
    V = count_vectors(0, hi_max, largest)
    V = V[V.sum(axis=1) <= W]
    totals = V @ np.arange(1, largest + 1)
    by_n = {n: V[totals == n] for n in range(hi_max + 1)}
    if deadline is not None and time.perf_counter() > deadline:
        return None
    squares = np.arange(1, largest + 1) ** 2
    columns = []
    for ci, a, el, ep, lo, hi, own, other in shapes:
        for n in range(max(lo, a), hi + 1):
            counts = by_n.get(n)
            if counts is None or not len(counts):
                continue
            parts = counts.sum(axis=1)
            # fragments bigger than a worker's share without its main hold one of the ``a`` mains
            big = counts[:, other:].sum(axis=1)
            keep = (parts >= a) & (big <= a) & (counts[:, own:].sum(axis=1) == 0)
            npc = list(classes)[ci][1]
            V = counts[keep]
            values = -0.5 * wt * ((a * a if use_main else 0) + s * (V @ squares).astype(float))
            if inner is not None and len(V):
                values = values + inner(V, np.full(len(V), n), a, el, ep, npc, other)
            columns += [Column(ci, a, el, ep, vec, float(value), other) for vec, value in zip(V, values)]
            if deadline is not None and time.perf_counter() > deadline:
                return None
            if len(columns) > max_columns:
                return generated()
    if not columns or not partitions:
        return None
    if len(columns) + len(partitions) > max_columns:
        return generated()
    value, A, lb, ub = assemble(caps, classes, columns, partitions, largest)
    return FragmentProgram(caps, chain, j, levels, classes, columns, partitions, value, A, lb, ub,
                           max(max(classes.values()), W))
