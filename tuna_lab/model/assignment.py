"""What every constraint family's check reads: an assignment, checked once before any family counts it.

An assignment is a ``(W, T)`` array of core positions (column 0 the main
threads); :func:`checked_assignment` refuses anything else with one
:class:`~tuna_lab.errors.ModelError` line, for every family alike
(:class:`~tuna_lab.model.families.Family` calls it before its checks).
"""

import numpy as np

from ..errors import ModelError

__all__ = ["checked_assignment"]


def checked_assignment(assign, inst):
    """``assign`` as a ``(W, T)`` integer array of ``inst``'s core positions, or :class:`ModelError` saying what is wrong.

    A check that read an assignment of another shape would count what it
    finds and report nothing wrong: a (3,)-vector has no worker with two
    threads on one core. Positions outside ``-1..C-1`` are refused for the
    same reason: the counts drop them, so ``np.full((W, T), 999)`` would
    crowd no core and pass (2), (3), (8) ... with ``[]``. ``-1`` stays: it
    marks an unassigned thread (as :attr:`Mapping.positions
    <tuna_lab.model.mapping.Mapping.positions>` writes a cpu id the topology
    lacks), which (1) reports as a violation. Every family's checks call
    this, a family of one's own's too (:class:`Family`).

    Examples
    --------
    >>> from tuna_lab import Topology
    >>> from tuna_lab.model.instance import Instance
    >>> inst = Instance(2, 2, Topology.preset("xeon-8272cl"))
    >>> checked_assignment([[0, 1], [2, -1]], inst).tolist()
    [[0, 1], [2, -1]]
    >>> checked_assignment([[0, 1], [2]], inst)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.ModelError: an assignment for W=2 x T=2 is a (2, 2) array of core positions (column 0 = main threads), got a ragged sequence (rows of different lengths or non-numbers)
    >>> checked_assignment([[0, 1], [2, 999]], inst)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.ModelError: an assignment holds core positions 0..31 of this topology (-1: unassigned), got 999 for thread 1 of worker 1
    """
    want = (inst.W, inst.T)
    try:
        arr = np.asarray(assign)
    except (ValueError, TypeError):
        # numpy refuses ragged nesting itself, in its own words: say it in ours
        raise ModelError(f"an assignment for W={inst.W} x T={inst.T} is a {want} array of core positions "
                         f"(column 0 = main threads), got a ragged sequence (rows of different lengths "
                         f"or non-numbers)") from None
    if arr.shape != want:
        raise ModelError(f"an assignment for W={inst.W} x T={inst.T} is an array of shape {want} "
                         f"(core positions, column 0 = main threads), got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind != "f" or not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise ModelError(f"an assignment holds integer core positions, got {arr.dtype} values")
        arr = arr.astype(int)
    outside = np.argwhere((arr < -1) | (arr >= inst.C))
    if len(outside):
        w, t = (int(i) for i in outside[0])
        more = f" (and {len(outside) - 1} more)" if len(outside) > 1 else ""
        raise ModelError(f"an assignment holds core positions 0..{inst.C - 1} of this topology (-1: unassigned), "
                         f"got {int(arr[w, t])} for thread {t} of worker {w}{more}")
    return arr
