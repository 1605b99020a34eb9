"""Why a model admits no mapping: a minimal conflicting subset of its families, and which one yields.

A model's families may admit no mapping at all. The article's (2) and
(11)+(12) do so for about one configuration in nine that a server could run
(24 workers x 2 threads on 32 cores, say). :func:`explain` finds a *minimal
conflicting subset*: families that admit no mapping together with (1) and
the families they read (their ``requires``), while every proper subset of
them admits one. It says why in words, with the instance's numbers where a
counting argument is known, and names the family that yields to the
conflict (:attr:`Family.yields <tuna_lab.model.families.Family.yields>`).

The search is fast where it can be:

1. *Counting.* :func:`counting_conflict` reads only the merged
   :class:`~tuna_lab.model.caps.Caps`. With (2) at a rank cap ``k``, a core
   without a main thread holds at most ``k (T-1)`` threads. When the upper
   load ``U`` of (8) is larger, each of the ``r`` cores at ``U`` carries a
   main thread: ``r`` events, above the ``max(0, W-C+r)`` that (11)+(12)
   allow whenever ``W < C``. No solver runs.
2. *Deletion filter.* Otherwise each family is dropped in turn and kept
   out when the rest still admits no mapping. Each verdict comes from the
   solve pipeline on the constraint families alone: the greedy mapping
   proves a subset feasible, the sibling patterns or HiGHS prove one
   infeasible.

Examples
--------
>>> from tuna_lab import Topology, TunaModel
>>> conflict = TunaModel(24, 2, Topology.preset("xeon-8272cl")).explain()
>>> conflict.families, conflict.needs, conflict.proof, conflict.yielding
(('2', '11-12'), ('8', '9-10'), 'counting', '11-12')
>>> conflict.min_violation
8
"""

import time
from dataclasses import dataclass

from ..errors import InfeasibleModelError, NoSolutionError

__all__ = ["Conflict", "explain", "counting_conflict", "forced_events", "counting_conflicts"]


@dataclass(frozen=True)
class Conflict:
    """A minimal conflicting subset of a model's families, and why.

    Attributes
    ----------
    families : tuple of str
        Keys of the conflicting families: with (1) and :attr:`needs` they
        admit no mapping; without any one of them, the rest admit one.
    needs : tuple of str
        Families the conflicting ones read (their ``requires``), kept with them.
    reason : str
        Why, in words: the counting argument with the instance's numbers
        where one is known, else how the subset was proven infeasible.
    proof : str
        ``"counting"``, or ``"solver"`` (the sibling patterns or HiGHS,
        through the solve pipeline).
    yielding : str or None
        Key of the family that yields in a relaxation (the conflicting
        family with the lowest :attr:`Family.yields
        <tuna_lab.model.families.Family.yields>`); ``None`` when none may.
    min_violation : int or None
        The least total violation of :attr:`yielding` over the mappings of
        the other families, where the counting argument knows it.
    seconds : float
        Time the search took.
    """

    families: tuple
    needs: tuple
    reason: str
    proof: str
    yielding: str | None = None
    min_violation: int | None = None
    seconds: float = 0.0

    def describe(self):
        """One line: the conflicting families, the families they read and the reason."""
        fams = " and ".join(f"({k})" for k in self.families)
        needs = f" (with {', '.join(f'({k})' for k in self.needs)}, which they read)" if self.needs else ""
        return f"{fams}{needs} admit no mapping together: {self.reason}"

    def error(self, inst):
        """The :class:`~tuna_lab.errors.InfeasibleModelError` of this conflict for ``inst``."""
        return InfeasibleModelError(
            f"no mapping of W={inst.W} x T={inst.T} on {inst.C} cores: {self.describe()}",
            self.families, needs=self.needs, reason=self.reason)

    def as_dict(self):
        """JSON-able fields."""
        return {"families": list(self.families), "needs": list(self.needs), "reason": self.reason,
                "proof": self.proof, "yielding": self.yielding, "min_violation": self.min_violation,
                "seconds": round(self.seconds, 4)}


def forced_events(caps):
    """Cores with a main thread at load ``U`` that every mapping of (2) and (8) has, or ``None``.

    With (2) at rank cap ``k``, a core without a main thread holds at most
    ``k (T-1)`` threads; when that is below ``U`` each of the ``r`` cores at
    ``U`` (exactly ``r`` under (8)) carries a main thread.

    Examples
    --------
    >>> from tuna_lab import Topology
    >>> from tuna_lab.model.caps import Caps
    >>> from tuna_lab.model.families import DEFAULT_FAMILIES
    >>> from tuna_lab.model.instance import Instance
    >>> forced_events(Caps.of(Instance(24, 2, Topology.preset("xeon-8272cl")), DEFAULT_FAMILIES))
    16
    """
    inst = caps.instance
    if caps.rank_cap is None or caps.load is None or not inst.scenario3:
        return None
    L, U = caps.load
    if U <= caps.rank_cap * (inst.T - 1):
        return None
    return inst.r


def counting_conflict(caps):
    """The :class:`Conflict` of (2) with (11)+(12) when the counting argument proves it, else ``None``.

    Reads only ``caps`` (see the module docstring, 1.).
    """
    inst = caps.instance
    forced = forced_events(caps)
    budget = caps.event_budget
    if forced is None or budget is None or forced <= budget:
        return None
    k, (L, U) = caps.rank_cap, caps.load
    per_rank = "1 thread" if k == 1 else f"{k} threads"
    reason = (f"(8) puts U={U} threads on r={inst.r} of the {inst.C} cores and L={L} on the others; "
              f"(2) lets a core hold at most {per_rank} of each rank, so a core without a main thread "
              f"holds at most {k}x(T-1) = {k * (inst.T - 1)} < U threads: all {inst.r} cores at U "
              f"carry a main thread, but (11-12) allows at most max(0, W-C+r) = "
              f"max(0, {inst.W}-{inst.C}+{inst.r}) = {budget}")
    return Conflict(("2", "11-12"), ("8", "9-10"), reason, "counting", "11-12", forced - budget)


def counting_conflicts(topology, max_threads=8):
    """The configurations of the issue's count that the counting argument proves the families cannot place.

    Every ``W x T`` with ``W <= 2C+1``, ``T <= max_threads`` and ``WT <= 4C``
    on ``topology`` under the default families, whose (2) and (11)+(12)
    conflict (:func:`counting_conflict`; no solver runs), as rows: ``workers``,
    ``threads``, ``r``, ``U``, the cap ``max(0, W-C+r)`` of (12), and
    ``least_excess``, the fewest cores with a main thread at ``U`` above it
    (what the relaxation exceeds). ``topology`` is anything
    :func:`~tuna_lab.machine.topology_from` takes.

    Returns
    -------
    list of dict

    Examples
    --------
    >>> from tuna_lab import Topology
    >>> rows = counting_conflicts(Topology.synthetic("pack:1 l3:2 l2:2 core:2 pu:2"))
    >>> len(rows), rows[0]
    (15, {'workers': 9, 'threads': 2, 'r': 2, 'U': 2, 'cap': 0, 'least_excess': 2})
    """
    from .caps import Caps
    from .families import DEFAULT_FAMILIES
    from ..machine.spec import topology_from
    from .instance import Instance

    topology = topology_from(topology)
    C = topology.n_logical
    out = []
    for T in range(1, max_threads + 1):
        for W in range(1, 2 * C + 2):
            if W * T > 4 * C:
                break
            caps = Caps.of(Instance(W, T, topology), DEFAULT_FAMILIES)
            conflict = counting_conflict(caps)
            if conflict is not None:
                out.append({"workers": W, "threads": T, "r": caps.instance.r, "U": caps.instance.U,
                            "cap": caps.event_budget, "least_excess": conflict.min_violation})
    return out


def explain(model, time_limit=None):
    """The :class:`Conflict` of ``model``, or ``None`` if its families admit a mapping.

    Parameters
    ----------
    model : TunaModel
    time_limit : float, optional
        Seconds the deletion filter's verdicts may take in all; a verdict
        not reached in time keeps the family (the subset is then
        infeasible, but maybe not minimal, and :attr:`Conflict.reason`
        says so).

    Raises
    ------
    NoSolutionError
        The model itself could not be decided within the time limit.
    """
    t0 = time.perf_counter()
    deadline = None if time_limit is None else t0 + time_limit
    counted = counting_conflict(model.caps)
    if counted is not None and all(k in _keys(model) for k in counted.families):
        return _timed(counted, t0)
    fams = [f for f in model.active_families if f.kind == "constraint" and f.key != "1"]
    verdict = _verdict(model, [f.key for f in fams], deadline)
    if verdict is True:
        return None
    if verdict is None:
        raise NoSolutionError(f"whether the families of W={model.instance.W} x T={model.instance.T} admit a "
                              "mapping was not decided within the time limit")
    keep = [f.key for f in fams]
    undecided = False
    # the families that never yield are tried first, then the others, the first to yield last: where
    # several minimal subsets exist, the one found holds a family that may yield if one does
    for key in sorted(keep, key=lambda k: _delete_order(model, k)):
        rest = [k for k in keep if k != key]
        if key in _required(model, rest):
            continue                        # read by another member: it stays with it
        verdict = _verdict(model, rest, deadline)
        if verdict is False:
            keep = rest
        elif verdict is None:
            undecided = True
    core = tuple(k for k in _canonical(model, keep) if k not in _required(model, keep))
    needs = tuple(k for k in _closure(model, core) if k not in core and k != "1")
    counted = counting_conflict(_submodel(model, core).caps)
    if counted is not None and set(counted.families) == set(core):
        return _timed(counted, t0)
    yielding = min((k for k in core if _yield_rank(model, k) is not None),
                   key=lambda k: _yield_rank(model, k), default=None)
    reason = ("the solver proves that no mapping satisfies them together, and a mapping satisfies "
              "each proper subset")
    if undecided:
        reason = "the solver proves that no mapping satisfies them together (minimality not decided in time)"
    return Conflict(core, needs, reason, "solver", yielding, None, time.perf_counter() - t0)


def _timed(conflict, t0):
    return Conflict(conflict.families, conflict.needs, conflict.reason, conflict.proof, conflict.yielding,
                    conflict.min_violation, time.perf_counter() - t0)


def _keys(model):
    return [f.key for f in model.families]


def _family(model, key):
    return next(f for f in model.families if f.key == key)


def _yield_rank(model, key):
    return _family(model, key).yields


def _delete_order(model, key):
    rank = _yield_rank(model, key)
    return (0, 0) if rank is None else (1, -rank)


def _canonical(model, keys):
    return [k for k in _keys(model) if k in keys]


def _closure(model, keys):
    """``keys`` with (1) and every family they require, transitively, in the model's order."""
    out = {"1", *keys}
    todo = list(keys)
    while todo:
        for need in _family(model, todo.pop()).requires:
            if need not in out:
                out.add(need)
                todo.append(need)
    return _canonical(model, out)


def _required(model, keys):
    """Keys some member of ``keys`` requires."""
    return {need for k in keys for need in _family(model, k).requires}


def _submodel(model, keys):
    """``model`` with only (1), ``keys`` and what they require (objective terms dropped)."""
    keep = set(_closure(model, keys))
    return model.without(*[f.key for f in model.families if f.key not in keep])


def _verdict(model, keys, deadline):
    """``True`` if (1), ``keys`` and their requirements admit a mapping, ``False`` if not, ``None`` if undecided."""
    from .pipeline import SolveOptions, run

    sub = _submodel(model, keys)
    if counting_conflict(sub.caps) is not None:
        return False
    left = None if deadline is None else deadline - time.perf_counter()
    if left is not None and left <= 0.05:
        return None
    try:
        run(sub, SolveOptions(time_limit=left))
    except InfeasibleModelError:
        return False
    except NoSolutionError:
        return None
    return True
