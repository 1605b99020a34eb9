"""The numbers every constraint family reads: W, T, C, P, L, U, r and the distance.

An :class:`Instance` is a pure value computed once from ``(workers, threads,
topology, mode)``. Families, encodings and checks all read it, so the
article's definitions (``L = floor(WT/C)`` ...) live in exactly one place.
"""

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .._checks import check_size, positive_int
from ..errors import ModelError

__all__ = ["Instance", "MODES", "check_positive_int"]

#: The two heuristic modes of the article's objective term (6)+(7).
MODES = ("scatter", "compact")


def check_positive_int(name, value):
    """Return ``value`` as an int, or raise :class:`ModelError` if it is not a positive integer."""
    return positive_int(name, value, ModelError)


@dataclass(frozen=True, eq=False)
class Instance:
    """One configuration of the ILP: ``W`` workers x ``T`` threads on a topology.

    Parameters
    ----------
    workers, threads : int
        ``W`` server workers, each with ``T`` OpenMP threads (thread 0 = main);
        ``W x T`` at most :data:`~tuna_lab._checks.MAX_THREADS` (8192).
    topology : Topology or str
        The machine, or anything :func:`~tuna_lab.machine.topology_from` takes.
    mode : {"scatter", "compact"}
        Sign of the within-worker distance term (7).
    costs : dict, optional
        Cache-distance costs; ``None`` uses the topology's own.
    """

    workers: int
    threads: int
    topology: object
    mode: str = "scatter"
    costs: dict = field(default=None)

    def __post_init__(self):
        from ..machine.spec import topology_from

        object.__setattr__(self, "topology", topology_from(self.topology))
        # Bounded before anything is sized by W and T (MAX_THREADS: the local search's (WT)^2 matrices).
        workers, threads = check_size(self.workers, self.threads, ModelError)
        object.__setattr__(self, "workers", workers)
        object.__setattr__(self, "threads", threads)
        if self.mode not in MODES:
            raise ModelError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")

    # -- sizes -----------------------------------------------------------
    @property
    def W(self):
        return self.workers

    @property
    def T(self):
        return self.threads

    @property
    def C(self):
        return self.topology.n_logical

    @property
    def P(self):
        return self.topology.n_physical

    @property
    def sign(self):
        """``s`` of the SPEC: +1 in scatter mode, -1 in compact mode."""
        return 1 if self.mode == "scatter" else -1

    # -- the article's balance bounds ------------------------------------
    @property
    def L(self):
        return (self.W * self.T) // self.C

    @property
    def U(self):
        return -(-(self.W * self.T) // self.C)

    @property
    def r(self):
        return (self.W * self.T) % self.C

    @property
    def scenario3(self):
        """The article's scenario 3: ``WT > C`` and ``WT mod C > 0``."""
        return self.W * self.T > self.C and self.r > 0

    @property
    def cap_rank(self):
        """Per-core cap of equally ranked threads: 1 when ``W <= C`` (eq. 2), else ``ceil(W/C)``."""
        return -(-self.W // self.C)

    @property
    def cap_worker(self):
        """Per-core cap of one worker's threads: 1 when ``T <= C`` (eq. 3), else ``ceil(T/C)``."""
        return -(-self.T // self.C)

    # -- physical cores ----------------------------------------------------
    @cached_property
    def smt(self):
        """Logical cores per physical core, shape (P,)."""
        return np.bincount(self.core, minlength=self.P)

    @property
    def uniform_smt(self):
        return bool(np.all(self.smt == self.smt[0]))

    @property
    def L_phys(self):
        return (self.W * self.T) // self.P

    @property
    def U_phys(self):
        return -(-(self.W * self.T) // self.P)

    @property
    def r_phys(self):
        return (self.W * self.T) % self.P

    @property
    def scenario3_phys(self):
        return self.W * self.T > self.P and self.r_phys > 0

    # -- topology arrays ---------------------------------------------------
    @cached_property
    def core(self):
        """Physical core index of each logical core position, shape (C,)."""
        return np.asarray(self.topology.core, dtype=int)

    @cached_property
    def distance(self):
        return np.asarray(self.topology.distance(self.costs), dtype=float)

    @cached_property
    def cpus(self):
        return np.asarray(self.topology.cpus, dtype=int)

    def positions(self, cpus):
        """Map OS cpu ids to positions ``0..C-1``; raise :class:`ModelError` on unknown ids."""
        cpus = np.asarray(cpus)
        pos = np.searchsorted(self.cpus, cpus)
        pos = np.clip(pos, 0, self.C - 1)
        bad = self.cpus[pos] != cpus
        if np.any(bad):
            raise ModelError(f"cpu ids not in this topology: {sorted(set(cpus[bad].tolist()))}")
        return pos

    def describe(self):
        """One line for humans: sizes and which scenario of the article applies."""
        wt = self.W * self.T
        if wt < self.C:
            scen = "scenario 1 (WT < C)"
        elif self.r == 0:
            scen = "scenario 2 (WT mod C = 0)"
        else:
            scen = "scenario 3 (WT > C, WT mod C > 0)"
        return (f"W={self.W} T={self.T} on C={self.C} logical / P={self.P} physical cores, "
                f"{self.mode}; L={self.L} U={self.U} r={self.r}; {scen}")
