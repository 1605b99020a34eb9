"""Which rules a model's families impose, as the numbers the solver-free routes read.

The constructive mapping (:mod:`~tuna_lab.model.route.construct`), the counting
bound (:mod:`~tuna_lab.model.route.bounds`) and the encodings' capacities need to
know *what* the families ask - "at most ``ceil(W/C)`` threads of one rank per
core", "every core carries ``L..U`` threads" - not *which* families are in
the model. :class:`Caps` holds those answers. It is built once per model by
:meth:`Caps.of`, which asks every family for its part
(:meth:`~tuna_lab.model.families.Family.caps`) and merges the parts here, in
one place.

A family that contributes nothing (the default of
:meth:`~tuna_lab.model.families.Family.caps`, e.g. a user's own family) is
listed in :attr:`Caps.unknown`: the greedy rules cannot honour a rule they
were not given, and the bound is a bound of the known families only, so both
routes decline (:attr:`Caps.understood`) and the model is left to HiGHS.

Examples
--------
>>> from tuna_lab import Topology
>>> from tuna_lab.model.families import DEFAULT_FAMILIES
>>> from tuna_lab.model.instance import Instance
>>> caps = Caps.of(Instance(3, 3, Topology.synthetic("core:4 pu:1")), DEFAULT_FAMILIES)
>>> caps.load, caps.event_budget, caps.understood
((2, 3), 0, True)
"""

from dataclasses import dataclass, fields

from ..errors import ModelError

__all__ = ["Caps"]


@dataclass(frozen=True)
class Caps:
    """The rules of a set of families on one instance.

    ``None`` (or ``False``/``0``) means that no family of the model imposes
    the rule.

    Attributes
    ----------
    instance : Instance
        The instance the numbers are for.
    rank_cap : int or None
        Most threads of one rank on a core ((2): ``ceil(W/C)``).
    worker_cap : int or None
        Most threads of one worker on a core ((3): ``ceil(T/C)``).
    load : (int, int) or None
        ``(L, U)``: threads every logical core carries ((8)).
    phys_load : (int, int) or None
        ``(L+, U+)``: threads every physical core carries ((8+), uniform SMT only).
    event_budget : int or None
        Most cores hosting a main thread that may carry ``U`` threads
        ((11)+(12), scenario 3 only).
    phys_event_budget : int or None
        The same for physical cores and ``U+`` ((11+)+(12+)).
    spread_main : bool
        The objective has ``f_main`` ((4)+(5)).
    sign : int
        Sign of ``f_mode`` in the objective ((6)+(7)): +1 scatter, -1
        compact, 0 without the term.
    symmetric : bool
        Every family is invariant under renumbering workers and permuting
        interchangeable cores (:attr:`Family.symmetric
        <tuna_lab.model.families.Family.symmetric>`), so those symmetries may
        be broken.
    unknown : tuple of str
        Keys of the families that contributed nothing (see :attr:`understood`).
    """

    instance: object
    rank_cap: int | None = None
    worker_cap: int | None = None
    load: tuple | None = None
    phys_load: tuple | None = None
    event_budget: int | None = None
    phys_event_budget: int | None = None
    spread_main: bool = False
    sign: int = 0
    symmetric: bool = False
    unknown: tuple = ()

    @classmethod
    def of(cls, instance, families):
        """Merge every family's :meth:`~tuna_lab.model.families.Family.caps` for ``instance``.

        Raises
        ------
        ModelError
            A family names a rule that is not a field of :class:`Caps`, or
            two families set the same rule (which of them would win is not
            for this merge to guess).
        """
        names = {f.name for f in fields(cls)} - {"instance", "symmetric", "unknown"}
        parts, owner, unknown = {}, {}, []
        for fam in families:
            part = fam.caps(instance)
            if part is None:
                unknown.append(fam.key)
                continue
            for name, value in part.items():
                if name not in names:
                    raise ModelError(f"family ({fam.key}) contributes an unknown cap {name!r}; "
                                     f"known: {', '.join(sorted(names))}")
                if name in owner:
                    raise ModelError(f"families ({owner[name]}) and ({fam.key}) both set {name}")
                owner[name] = fam.key
                parts[name] = value
        symmetric = all(fam.symmetric for fam in families)
        return cls(instance=instance, symmetric=symmetric, unknown=tuple(unknown), **parts)

    @property
    def understood(self):
        """Whether every family contributed, so the constructive route and the bound may be used."""
        return not self.unknown

    @property
    def rank_limit(self):
        """Threads of one rank a core may hold: ``rank_cap``, or ``W`` without (2)."""
        return self.instance.W if self.rank_cap is None else self.rank_cap

    @property
    def worker_limit(self):
        """Threads of one worker a core may hold: ``worker_cap``, or ``T`` without (3)."""
        return self.instance.T if self.worker_cap is None else self.worker_cap

    @property
    def main_max(self):
        """Largest possible ``A_c`` (main threads on one core)."""
        return min(self.rank_limit, self.instance.W)

    @property
    def worker_max(self):
        """Largest possible ``B_wc`` (threads of one worker on one core)."""
        return min(self.worker_limit, self.instance.T)
