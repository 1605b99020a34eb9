"""The Tuna ILP: constraint families, encodings, the model and its result."""

from .families import (DEFAULT_FAMILIES, FAMILY_TYPES, Family, LogicalBalance, MainIndicator,
                       MainLoadCap, MainSpread, PhysicalBalance, PhysicalMainLoadCap, SingleCore,
                       UniqueRankCores, UniqueWorkerCores, Violation, WorkerDistance)
from .instance import Instance
from .mapping import Mapping
from .tuna import TunaModel, solve

__all__ = [
    "TunaModel", "Mapping", "Instance", "solve", "Family", "Violation", "DEFAULT_FAMILIES",
    "FAMILY_TYPES", "SingleCore", "UniqueRankCores", "UniqueWorkerCores", "MainSpread",
    "WorkerDistance", "LogicalBalance", "PhysicalBalance", "MainIndicator", "MainLoadCap",
    "PhysicalMainLoadCap",
]
