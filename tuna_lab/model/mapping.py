"""The result of a solve: which logical core every thread of every worker runs on."""

from dataclasses import dataclass, field

import numpy as np

from .._checks import iterable
from ..errors import ModelError
from .families import DEFAULT_FAMILIES, Family, loads, main_counts, pair_sums, resolve_family, worker_counts
from .instance import Instance

__all__ = ["Mapping", "Relaxed", "NoCertificate"]

#: Why a mapping of a model without objective terms shows no certificate (describe() and to_dict() say it).
_NO_CERTIFICATE = ("the model maximises no objective term ((4-5) and (6-7) left out), so any mapping "
                   "meeting its constraints is optimal")


class NoCertificate(dict):
    """:attr:`Mapping.certificate` of a model without objective terms: the solver's numbers, certifying nothing.

    Still the dict the solve wrote (``certifies`` is ``[]``; a relaxed
    mapping's ``relaxation`` proof is in it), so code that reads keys keeps
    working; its repr says that it certifies nothing, where a plain dict's
    ``'proven': True`` beside ``'objective': 0.0`` would read as a claim about
    the mapping's objective.

    Examples
    --------
    >>> from tuna_lab import solve
    >>> solve(2, 2, "xeon-8272cl", families=["1"]).certificate
    NoCertificate(certifies nothing: the model maximises no objective term ((4-5) and (6-7) left out), so any mapping meeting its constraints is optimal)
    """

    def __repr__(self):
        return f"NoCertificate(certifies nothing: {_NO_CERTIFICATE})"


@dataclass(frozen=True)
class Relaxed:
    """A family a relaxed mapping exceeds, by how much and where.

    Attributes
    ----------
    family : str
        The family's key (``"11-12"``).
    amount : float
        The total of its rows' excess (:meth:`Family.residual
        <tuna_lab.model.families.Family.residual>` summed), the least any
        mapping of the other families reaches when the relaxation is proven.
    message : str
        Its violations, as :meth:`Mapping.verify` words them.
    """

    family: str
    amount: float
    message: str

    def __str__(self):
        return f"({self.family}) exceeded by {self.amount:g}: {self.message}"


@dataclass(frozen=True, eq=False)
class Mapping:
    """A thread-to-core mapping with the solver's evidence about it.

    Parameters
    ----------
    instance : Instance
        Workers, threads, topology and mode the mapping was made for.
    assignment : array of int, shape (W, T)
        OS cpu id of thread ``t`` of worker ``w``; column 0 = main threads.
    families : tuple of Family
        The families the mapping was solved under (what :meth:`verify` checks).
    status : str
        ``"optimal"``, ``"time_limit"``, ``"constructed"`` ... or ``"relaxed"``:
        the families admit no mapping and this one exceeds the yielding
        families (:attr:`relaxed`) least, then maximises the objective.
    proven_optimal : bool
        The solver proved no better mapping exists (within ``gap``); for a
        relaxed mapping, both stages are proven (least violation, then
        objective).
    gap : float or None
        Relative gap between the objective and the solver's bound.
    build_seconds, solve_seconds : float
        Model building (cvxpy) and solving (HiGHS) wall time.
    encoding : str
        Which encoding produced it (``"constructive+bound"``/``"constructive"``
        when no solver ran).
    bound : float or None
        Best proven upper bound on the objective the model maximised (the
        terms of its objective families; :attr:`objective` with both).
    extra : dict
        Free-form additions.
    notes : tuple of str
        Why the solve took the route it took when that is not the default
        (e.g. a family the constructive route does not know: HiGHS solved it).
    certificate : dict
        What proves :attr:`bound` (JSON-able; empty when nothing does):
        ``certifies`` - the objective terms its bound is on (:attr:`objective_terms`;
        empty for a model without objective terms, whose certificate proves nothing
        about :attr:`objective`: it is then a :class:`NoCertificate`, whose repr
        says so, and is not shown by :meth:`describe`, ``repr`` or :meth:`to_dict`);
        ``name`` - ``"highs"`` (HiGHS's dual bound), or the combinatorial
        bound's name (``"counting"``, pattern bounds such as
        ``"sibling-pattern+domain-pattern"``), or ``"none"``; ``proven``;
        ``objective``, ``bound`` and ``gap``; ``step`` - the lattice step of
        the objective values, so that a bound less than one step above the
        objective proves it (0 if unknown); ``dual_bound`` - HiGHS's, when it
        ran; ``combinatorial`` - the combinatorial bound's parts
        (:meth:`Certificate.as_dict <tuna_lab.model.route.bounds.Certificate.as_dict>`)
        when computed. A relaxed mapping adds ``relaxation``: the yielding
        families, the conflicts (:meth:`Conflict.as_dict
        <tuna_lab.model.explain.Conflict.as_dict>`) and the first stage's
        least violation with its lower bound and proof.
    relaxed : tuple of Relaxed
        The families a relaxed mapping exceeds and by how much (empty otherwise):
        exactly what :meth:`verify` reports.

    Examples
    --------
    >>> from tuna_lab import solve, Topology
    >>> m = solve(2, 2, Topology.preset("xeon-8272cl"))
    >>> m.assignment.shape, m.verify()
    ((2, 2), [])
    """

    instance: Instance
    assignment: np.ndarray
    families: tuple = DEFAULT_FAMILIES
    status: str = "unknown"
    proven_optimal: bool = False
    gap: float | None = None
    build_seconds: float = 0.0
    solve_seconds: float = 0.0
    encoding: str = ""
    bound: float | None = None
    extra: dict = field(default_factory=dict)
    notes: tuple = ()
    certificate: dict = field(default_factory=dict)
    relaxed: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "assignment", np.asarray(self.assignment, dtype=int))
        object.__setattr__(self, "notes", tuple(self.notes))
        object.__setattr__(self, "relaxed", tuple(self.relaxed))
        if self.certificate:
            # What the bound is on: the objective terms the model maximised ([] - it certifies nothing).
            terms = list(self.objective_terms)
            kind = dict if terms else NoCertificate
            object.__setattr__(self, "certificate", kind({**self.certificate, "certifies": terms}))

    # -- basic facts -----------------------------------------------------------
    @property
    def topology(self):
        return self.instance.topology

    @property
    def workers(self):
        return self.instance.W

    @property
    def threads(self):
        return self.instance.T

    @property
    def mode(self):
        return self.instance.mode

    @property
    def positions(self):
        """The assignment as core positions ``0..C-1`` (``-1`` for ids not in the topology)."""
        cpus = self.instance.cpus
        pos = np.searchsorted(cpus, self.assignment)
        pos = np.clip(pos, 0, len(cpus) - 1)
        return np.where(cpus[pos] == self.assignment, pos, -1)

    @property
    def logical_loads(self):
        """Threads per logical core, aligned with ``topology.cpus``."""
        return loads(self.positions, self.instance.C)

    @property
    def physical_loads(self):
        """Threads per physical core (index = ``topology.core`` value)."""
        inst = self.instance
        return np.bincount(inst.core, weights=self.logical_loads, minlength=inst.P).astype(int)

    # -- objective, recomputed from the assignment and the distance ------------
    @property
    def f_main(self):
        return float(pair_sums(main_counts(self.positions, self.instance.C), self.instance.distance)[0])

    @property
    def f_mode(self):
        inst = self.instance
        return float(inst.sign * pair_sums(worker_counts(self.positions, inst.C), inst.distance).sum())

    @property
    def objective(self):
        """``f_main + f_mode`` of this assignment (whatever families were active)."""
        return self.f_main + self.f_mode

    # -- checks ---------------------------------------------------------------
    def verify(self, families=None):
        """Run the families' numpy checks; return the list of violations (empty = valid).

        Parameters
        ----------
        families : family or list of families, optional
            Default: the families the mapping was solved under. Each is named
            as :meth:`TunaModel.with_ <tuna_lab.model.TunaModel.with_>` and
            ``without`` take them: a key (``"11-12"``), an equation number, a
            class name, a class or an instance. A list, tuple, set or other
            iterable holds several; anything else names one.

        Raises
        ------
        ModelError
            A name no family goes by (``3.5``, ``object()``), or bytes
            (``b"8"`` is not read as the key ``"8"``, nor as the numbers 56).

        Examples
        --------
        >>> from tuna_lab import solve
        >>> solve(4, 4, "xeon-8272cl").verify(["11-12", "(8)"])
        []
        """
        if families is None:
            families = self.families
        elif isinstance(families, (bytes, bytearray, memoryview)):
            # Iterated, bytes are numbers: b"8" would ask for family 56.
            raise ModelError(f"verify: a family is named by a str key such as '8', not bytes: got {families!r}")
        elif isinstance(families, (str, int, Family, type)) or not iterable(families):
            # One family, resolved as with_() and without() resolve theirs (a ModelError if no family has that name).
            families = [families]
        fams = [resolve_family(f, self.families) for f in families]
        pos = self.positions
        out = []
        for fam in fams:
            out.extend(fam.violations(pos, self.instance))
        return out

    @property
    def objective_terms(self):
        """The objective terms the model maximised (``"f_main"``, ``"f_mode"``): what a certificate certifies.

        A model without (4-5) or (6-7) did not optimise that term:
        :attr:`objective` still reports it, measured on the assignment.
        """
        keys = {f.key for f in self.families if f.kind == "objective"}
        return tuple(term for key, term in (("4-5", "f_main"), ("6-7", "f_mode")) if key in keys)

    # -- export ---------------------------------------------------------------
    def to_frame(self):
        """One row per thread: worker, thread, role, cpu, physical core, package, NUMA node."""
        import pandas as pd

        inst = self.instance
        pos = self.positions
        W, T = pos.shape
        topo = self.topology
        safe = np.where(pos >= 0, pos, 0)
        return pd.DataFrame({
            "worker": np.repeat(np.arange(W), T),
            "thread": np.tile(np.arange(T), W),
            "role": np.tile(np.where(np.arange(T) == 0, "main", "openmp"), W),
            "cpu": self.assignment.ravel(),
            "physical_core": np.asarray(topo.core)[safe].ravel(),
            "package": np.asarray(topo.package)[safe].ravel(),
            "numa": np.asarray(topo.numa)[safe].ravel(),
            "mode": inst.mode,
        })

    def to_dict(self):
        """The ``tuna-lab solve --json`` object (a stable interface).

        ``certificate`` is :attr:`certificate`, or ``None`` where it certifies
        nothing (a model without objective terms; ``no_certificate`` then
        says why, as :meth:`describe` does; ``None`` otherwise).

        Examples
        --------
        >>> from tuna_lab import solve
        >>> d = solve(4, 4, "xeon-8272cl").to_dict()
        >>> d["certificate"]["certifies"], d["no_certificate"]
        (['f_main', 'f_mode'], None)
        >>> d = solve(4, 4, "xeon-8272cl", families=["1"]).to_dict()
        >>> d["certificate"], d["no_certificate"].split(",")[0]
        (None, 'the model maximises no objective term ((4-5) and (6-7) left out)')
        """
        inst = self.instance
        return {
            "workers": inst.W,
            "threads": inst.T,
            "mode": inst.mode,
            "topology": self.topology.name,
            "logical_cores": inst.C,
            "physical_cores": inst.P,
            "assignment": self.assignment.tolist(),
            "logical_loads": dict(zip(map(str, inst.cpus.tolist()), self.logical_loads.tolist())),
            "physical_loads": self.physical_loads.tolist(),
            "f_main": self.f_main,
            "f_mode": self.f_mode,
            "objective": self.objective,
            "status": self.status,
            "proven_optimal": bool(self.proven_optimal),
            "gap": None if self.gap is None else float(self.gap),
            "bound": None if self.bound is None else float(self.bound),
            "build_seconds": float(self.build_seconds),
            "solve_seconds": float(self.solve_seconds),
            "encoding": self.encoding,
            "families": [f.key for f in self.families],
            "violations": [v.message for v in self.verify()],
            "notes": list(self.notes),
            # As describe() and repr: a certificate of a model with no objective term certifies nothing,
            # and a "proven": true beside "objective": 1500 would read as a claim about that number.
            "certificate": dict(self.certificate) if self.certificate and self.objective_terms else None,
            "no_certificate": None if self.objective_terms or not self.certificate else _NO_CERTIFICATE,
            "relaxed": [{"family": r.family, "amount": r.amount, "message": r.message} for r in self.relaxed],
        }

    def describe(self):
        """A short multi-line text: one line per worker, then the objective."""
        inst = self.instance
        lines = [inst.describe()]
        width = len(str(int(inst.cpus.max()))) if inst.C else 1
        for w, row in enumerate(self.assignment):
            cores = " ".join(f"{c:>{width}}" for c in row)
            lines.append(f"  worker {w:>2}: main {row[0]:>{width}} | all {cores}")
        gap = "-" if self.gap is None else f"{self.gap:.2%}"
        lines.append(f"  f_main={self.f_main:g} f_mode={self.f_mode:g} objective={self.objective:g} "
                     f"status={self.status} proven_optimal={self.proven_optimal} gap={gap} "
                     f"[{self.encoding}: build {self.build_seconds:.3f}s solve {self.solve_seconds:.3f}s]")
        if self.certificate and self.objective_terms:
            lines.append(f"  certificate: {self._certificate_text()}")
        elif self.certificate:
            # A bound of 0 on an objective of 0 certifies nothing a reader of objective=... cares about.
            lines.append(f"  no certificate: {_NO_CERTIFICATE}; f_main and f_mode above are measured, not optimised")
        lines += [f"  relaxed: {r}" for r in self.relaxed]
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def _certificate_text(self):
        """One line: which bound proves what, with the numbers to check it."""
        c = self.certificate
        terms = self.objective_terms
        what = " + ".join(terms) + ("" if len(terms) == 2 else " only; "
                                     + " and ".join(t for t in ("f_main", "f_mode") if t not in terms)
                                     + " not in the model")
        parts = [f"{c.get('name', 'none')} bound on the model's objective ({what}):"]
        for key in ("objective", "bound", "dual_bound", "step"):
            if c.get(key) is not None:
                parts.append(f"{key}={c[key]:.10g}")
        if c.get("gap") is not None:
            parts.append(f"gap={c['gap']:.4%}")
        comb = c.get("combinatorial")
        if comb and comb.get("name") != c.get("name"):
            parts.append(f"{comb['name']} bound={comb['bound']:.10g}")
        return " ".join(parts)

    def __repr__(self):
        inst = self.instance
        cert = f", certificate={self.certificate['name']!r}" if self.certificate and self.objective_terms else ""
        return (f"Mapping(W={inst.W}, T={inst.T}, {inst.mode}, topology={self.topology.name!r}, "
                f"objective={self.objective:g}, status={self.status!r}{cert})")
