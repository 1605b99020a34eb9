"""The Tuna ILP: constraint families, encodings, the model and its result.

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
