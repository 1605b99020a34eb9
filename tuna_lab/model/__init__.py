"""The Tuna ILP: constraint families, encodings, the model and its result - declared, then searched.

The solve path, module by module:

1. :mod:`~.instance` - ``W``, ``T``, the topology and the numbers they give (``L``, ``U``, ``r``...);
2. :mod:`~.families` - the constraint families and objective terms, merged into :mod:`~.caps`;
3. :mod:`~.encodings` - the cvxpy variables the families' rows are written on;
4. :mod:`~.tuna` - :class:`TunaModel`, the immutable declaration, and :mod:`~.problem`, its
   cvxpy problem (cached by declaration);
5. :mod:`~.pipeline` - one solve: it creates a :class:`~.search.Search` (:mod:`~.search`: the
   constructive route of :mod:`~.construct`, the bounds of :mod:`~.bounds` and the
   :mod:`~.fragments` package), then runs HiGHS (:mod:`~.solver`) where the bound does not prove
   the mapping; where the families admit no mapping, :mod:`~.explain` and the relaxation;
6. :mod:`~.mapping` - the result, :class:`Mapping` (ranks by :mod:`~.ranks`).

Names are loaded on first use: the families and the instance need only numpy,
while :class:`TunaModel` and :func:`solve` load cvxpy and HiGHS.
"""

import lazy_loader as _lazy

__all__ = [
    "TunaModel", "Mapping", "Instance", "solve", "Family", "Violation", "DEFAULT_FAMILIES",
    "FAMILY_TYPES", "SingleCore", "UniqueRankCores", "UniqueWorkerCores", "MainSpread",
    "WorkerDistance", "LogicalBalance", "PhysicalBalance", "MainIndicator", "MainLoadCap",
    "PhysicalMainLoadCap",
]

__getattr__, __dir__, _ = _lazy.attach(__name__, submod_attrs={
    "families": ["DEFAULT_FAMILIES", "FAMILY_TYPES", "Family", "LogicalBalance", "MainIndicator",
                 "MainLoadCap", "MainSpread", "PhysicalBalance", "PhysicalMainLoadCap", "SingleCore",
                 "UniqueRankCores", "UniqueWorkerCores", "Violation", "WorkerDistance"],
    "instance": ["Instance"],
    "mapping": ["Mapping"],
    "tuna": ["TunaModel", "solve"],
})
