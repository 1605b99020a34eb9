"""The Tuna ILP's constraint families and objective terms, one small class each.

Every family is a composable object in the spirit of ``cvxpy.constraints``:

* :meth:`Family.constraints` builds its cvxpy constraints from an encoding's
  variables (vectorised: sparse aggregation matrices and ``axis=`` sums);
  objective families build a term with :meth:`Family.term` instead;
* :meth:`Family.violations` checks a finished assignment with plain numpy,
  independently of any solver, and :meth:`Family.residual` returns the
  amount by which each of its rows is violated (0 when satisfied);
* :meth:`Family.caps` says what it asks in numbers (a rank cap, a load
  range, an events budget ...) for the solver-free routes: the constructive
  mapping and the counting bound read only the merged
  :class:`~tuna_lab.model.caps.Caps`, never which families are present;
* it knows its equation numbers, a one-line description and its LaTeX, and
  when it applies to an instance (:meth:`Family.applies`, :meth:`Family.note`).

Rows are built only through the members of the
:class:`~tuna_lab.model.encodings.Encoding` contract, so every family works
with every encoding. A family returns *all* its rows from
:meth:`Family.constraints`, including the definitions of the auxiliary
variables it owns (an objective family returns there the linearisation of
its term).

Assignments are ``(W, T)`` integer arrays of core *positions* ``0..C-1``
(column 0 = each worker's main thread); ``-1`` marks an unassigned thread.
:class:`~tuna_lab.model.mapping.Mapping` converts from OS cpu ids.

Examples
--------
>>> from tuna_lab import Topology
>>> from tuna_lab.model.instance import Instance
>>> inst = Instance(2, 2, Topology.preset("xeon-8272cl"))
>>> LogicalBalance().violations(np.array([[0, 0], [1, 2]]), inst)[0].message
'cpu 0 carries 2 threads, above U=1'
"""

from dataclasses import dataclass
from functools import wraps

import numpy as np

from ..errors import ModelError
from .assignment import checked_assignment  # the one check of what every family reads
from .counts import loads, main_counts, pair_sums, rank_counts, worker_counts

__all__ = [
    "Family",
    "Violation",
    "SingleCore",
    "UniqueRankCores",
    "UniqueWorkerCores",
    "MainSpread",
    "WorkerDistance",
    "LogicalBalance",
    "PhysicalBalance",
    "MainIndicator",
    "MainLoadCap",
    "PhysicalMainLoadCap",
    "resolve_family",
    "DEFAULT_FAMILIES",
    "FAMILY_TYPES",
]


@dataclass(frozen=True)
class Violation:
    """One violated row of a family: which family, where, by how much, and why."""

    family: str
    index: tuple
    amount: float
    message: str


# -- plain-numpy checks of an assignment (its counts: tuna_lab.model.counts) ----

def _valid(assign, C):
    assign = np.asarray(assign)
    return (assign >= 0) & (assign < C)


def _excess(values, cap):
    return np.maximum(np.asarray(values, float) - cap, 0.0)


def _checking(method):
    """``method(assign, inst)`` with ``assign`` checked first (see :func:`~tuna_lab.model.assignment.checked_assignment`)."""
    @wraps(method)
    def check(self, assign, inst):
        return method(self, checked_assignment(assign, inst), inst)
    check._checks_shape = True
    return check


class Family:
    """Base class of the constraint families and objective terms.

    Subclasses set the class attributes below and override the methods they need.
    :meth:`violations`, :meth:`residual` and :meth:`value` - a subclass's
    own too - refuse an assignment that is not a ``(W, T)`` integer array
    of positions ``-1..C-1`` with :class:`~tuna_lab.errors.ModelError`
    (:func:`~tuna_lab.model.assignment.checked_assignment`, the one place that checks it).
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # Wrapped where they are defined, so that a family of one's own gets the shape check too.
        for name in ("violations", "residual", "value"):
            method = cls.__dict__.get(name)
            if callable(method) and not getattr(method, "_checks_shape", False):
                setattr(cls, name, _checking(method))

    #: short key used by ``TunaModel.without`` / ``with_`` (the equation numbers)
    key = ""
    #: the article's equation numbers this family implements
    equations = ()
    #: one-line description
    description = ""
    #: LaTeX of the family as the article writes it
    latex = ""
    #: "constraint" or "objective"
    kind = "constraint"
    #: keys of families this one needs in the same model
    requires = ()
    #: Whether the family is invariant under renumbering the workers and
    #: permuting interchangeable cores (same cache domains, same SMT shape).
    #: Only then may the counts encoding add rows that break those symmetries
    #: (:meth:`~tuna_lab.model.encodings.CountEncoding.symmetry_constraints`).
    #: Off by default: a family of one's own that singles out some cores or
    #: workers would be cut off by them.
    symmetric = False
    #: Where the family stands when a conflict forces one to yield
    #: (:mod:`~tuna_lab.model.explain`): the lowest number yields first;
    #: ``None``, the default, never yields (its rows stay hard).
    yields = None

    @property
    def name(self):
        return type(self).__name__

    def applies(self, inst):
        """Whether the article's form of this family applies to ``inst`` as written."""
        return True

    def active(self, inst):
        """Whether the family adds anything to the model for ``inst`` (possibly generalised)."""
        return True

    def note(self, inst):
        """What the family does for ``inst``, including how it is generalised."""
        return self.description

    def constraints(self, enc):
        """All cvxpy rows of this family over an :class:`~tuna_lab.model.encodings.Encoding`.

        Includes the rows defining the auxiliary variables the family owns;
        an objective family returns the linearisation of its :meth:`term`.
        """
        return []

    def elastic(self, enc):
        """``(rows, slack)``: the family's rows with non-negative slack, or ``None`` if it cannot yield.

        ``slack`` is a cvxpy expression, the total by which the rows are
        exceeded, equal to ``residual(...).sum()`` at a mapping where the
        slack is least. The relaxation (:mod:`~tuna_lab.model.pipeline`)
        puts these rows in place of :meth:`constraints` for the family that
        yields, minimises the slack, then maximises the objective at that
        minimum.
        """
        return None

    def term(self, enc):
        """Objective term (to be maximised) of an objective family; ``None`` otherwise.

        Its defining rows come from :meth:`constraints` (the encoding builds
        each auxiliary object once, so both calls see the same variables).
        """
        return None

    def caps(self, inst):
        """This family's part of :class:`~tuna_lab.model.caps.Caps` for ``inst``, or ``None``.

        A dict of the rules it imposes, named as the fields of ``Caps``
        (``{}`` when it imposes none the solver-free routes need to know).
        ``None``, the default, says that the constructive mapping and the
        counting bound do not understand the family: a model holding it is
        solved by HiGHS, which sees its rows. A subclass inherits its
        parent's answer; one that changes the rows should return ``None``.
        """
        return None

    @_checking
    def residual(self, assign, inst):
        """Non-negative violation of each of the family's rows (all zero if satisfied)."""
        return np.zeros(0)

    @_checking
    def violations(self, assign, inst):
        """List of :class:`Violation` of ``assign`` (positions array, shape (W, T))."""
        return []

    @_checking
    def value(self, assign, inst):
        """Objective value of the term for ``assign`` (objective families only)."""
        return 0.0

    def __repr__(self):
        eqs = ",".join(self.equations)
        return f"{self.name}(({eqs}))"

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(type(self))


# -- (1) ---------------------------------------------------------------------

class SingleCore(Family):
    """(1) Every thread is assigned to exactly one logical core.

    Its check flags the unassigned threads (``-1``); a position outside the
    topology never reaches it (:func:`~tuna_lab.model.assignment.checked_assignment` refuses it first).
    """

    key = "1"
    symmetric = True
    equations = ("1",)
    description = "each thread is assigned to exactly one core"
    latex = r"\sum_{c} Y_{w,t,c} = 1 \quad \forall w,t"

    def constraints(self, enc):
        return enc.assignment_constraints()

    def caps(self, inst):
        return {}              # it defines what a mapping is: every route builds one

    def residual(self, assign, inst):
        return (~_valid(assign, inst.C)).astype(float).ravel()

    def violations(self, assign, inst):
        bad = np.argwhere(~_valid(assign, inst.C))
        return [Violation(self.key, (int(w), int(t)), 1.0,
                          f"thread {t} of worker {w} is not on a core of this topology")
                for w, t in bad]


# -- (2), (3) ----------------------------------------------------------------

class UniqueRankCores(Family):
    """(2) Equally ranked threads of different workers sit on different cores.

    The article states (2) for ``W <= C``. With more workers than cores it is
    infeasible as written, so it is generalised to *at most* ``ceil(W/C)``
    threads of one rank per core - the same spreading intent, still feasible.
    The generalisation is beyond the article.
    """

    key = "2"
    symmetric = True
    equations = ("2",)
    description = "equally ranked threads of different workers go to different cores"
    latex = r"\sum_{w} Y_{w,t,c} \leq 1 \quad \forall t,c \qquad (W \leq C)"

    def applies(self, inst):
        return inst.W <= inst.C

    def note(self, inst):
        if self.applies(inst):
            return "at most 1 thread of each rank per core (W <= C)"
        return f"W > C: generalised to at most ceil(W/C) = {inst.cap_rank} threads of each rank per core"

    def constraints(self, enc):
        return enc.rank_cap(enc.inst.cap_rank)

    def caps(self, inst):
        return {"rank_cap": inst.cap_rank}

    def residual(self, assign, inst):
        return _excess(rank_counts(assign, inst.C), inst.cap_rank).ravel()

    def violations(self, assign, inst):
        excess = _excess(rank_counts(assign, inst.C), inst.cap_rank)
        return [Violation(self.key, (int(t), int(c)), float(excess[t, c]),
                          f"cpu {inst.cpus[c]} holds {int(excess[t, c] + inst.cap_rank)} threads of rank {t}, "
                          f"above {inst.cap_rank}")
                for t, c in np.argwhere(excess > 0)]


class UniqueWorkerCores(Family):
    """(3) The threads of one worker sit on different cores.

    Generalised to at most ``ceil(T/C)`` per core when ``T > C`` (beyond the article).
    """

    key = "3"
    symmetric = True
    equations = ("3",)
    description = "threads of one worker go to different cores"
    latex = r"\sum_{t} Y_{w,t,c} \leq 1 \quad \forall w,c \qquad (T \leq C)"

    def applies(self, inst):
        return inst.T <= inst.C

    def note(self, inst):
        if self.applies(inst):
            return "at most 1 thread of each worker per core (T <= C)"
        return f"T > C: generalised to at most ceil(T/C) = {inst.cap_worker} threads of a worker per core"

    def constraints(self, enc):
        return enc.worker_cap(enc.inst.cap_worker)

    def caps(self, inst):
        return {"worker_cap": inst.cap_worker}

    def residual(self, assign, inst):
        return _excess(worker_counts(assign, inst.C), inst.cap_worker).ravel()

    def violations(self, assign, inst):
        excess = _excess(worker_counts(assign, inst.C), inst.cap_worker)
        return [Violation(self.key, (int(w), int(c)), float(excess[w, c]),
                          f"cpu {inst.cpus[c]} holds {int(excess[w, c] + inst.cap_worker)} threads of worker {w}, "
                          f"above {inst.cap_worker}")
                for w, c in np.argwhere(excess > 0)]


# -- objective terms (4)+(5), (6)+(7) ------------------------------------------

class MainSpread(Family):
    """(4)+(5) Maximise the total distance between the workers' main threads.

    ``f_main = sum_{c<c'} A_c A_c' d(c,c')`` with ``A_c`` the number of main
    threads on core ``c``. Main threads carry the most work and share nothing,
    so spreading them apart avoids contention.
    """

    key = "4-5"
    symmetric = True
    equations = ("4", "5")
    kind = "objective"
    description = "maximise the distance between main threads (f_main)"
    latex = (r"f_{main}=\sum_{c}\sum_{c'>c}\Big(\sum_{w} Y_{w,0,c}\Big)"
             r"\Big(\sum_{w} Y_{w,0,c'}\Big)d_{c,c'}")

    # pair_sum builds the linearisation once per encoding: both calls get the same one.
    def constraints(self, enc):
        return enc.pair_sum("main", enc.main_count[None, :], maximize=True)[1]

    def term(self, enc):
        return enc.pair_sum("main", enc.main_count[None, :], maximize=True)[0]

    def caps(self, inst):
        return {"spread_main": True}

    def value(self, assign, inst):
        return float(pair_sums(main_counts(assign, inst.C), inst.distance)[0])


class WorkerDistance(Family):
    """(6)+(7) Within-worker distance: maximised in scatter mode, minimised in compact mode.

    ``f_mode = s * sum_w sum_{c<c'} B_wc B_wc' d(c,c')`` with ``s = +1``
    (scatter) or ``-1`` (compact).
    """

    key = "6-7"
    symmetric = True
    equations = ("6", "7")
    kind = "objective"
    description = "within-worker distance, maximised (scatter) or minimised (compact) (f_mode)"
    latex = (r"f_{mode}=(-1)^{\mathbb{1}(compact)}\sum_{w}\sum_{c}\sum_{c'>c}"
             r"\Big(\sum_{t} Y_{w,t,c}\Big)\Big(\sum_{t} Y_{w,t,c'}\Big)d_{c,c'}")

    def note(self, inst):
        return f"{inst.mode}: {'maximise' if inst.sign > 0 else 'minimise'} within-worker distance"

    def constraints(self, enc):
        return enc.pair_sum("worker", enc.worker_count, maximize=enc.inst.sign > 0)[1]

    def term(self, enc):
        inst = enc.inst
        return inst.sign * enc.pair_sum("worker", enc.worker_count, maximize=inst.sign > 0)[0]

    def caps(self, inst):
        return {"sign": inst.sign}

    def value(self, assign, inst):
        return float(inst.sign * pair_sums(worker_counts(assign, inst.C), inst.distance).sum())


# -- (8) and its physical-core analogue -------------------------------------------

class LogicalBalance(Family):
    """(8) Every logical core carries between ``L = floor(WT/C)`` and ``U = ceil(WT/C)`` threads."""

    key = "8"
    symmetric = True
    equations = ("8",)
    description = "every logical core carries L..U threads"
    latex = (r"\left\lfloor\frac{WT}{C}\right\rfloor=L \leq \sum_{w}\sum_{t}Y_{w,t,c}"
             r" \leq U=\left\lceil\frac{WT}{C}\right\rceil \quad \forall c")

    def note(self, inst):
        return f"every logical core carries {inst.L}..{inst.U} threads"

    def constraints(self, enc):
        inst = enc.inst
        cons = [enc.load <= inst.U]
        if inst.L > 0:
            cons.append(enc.load >= inst.L)
        return cons

    def caps(self, inst):
        return {"load": (inst.L, inst.U)}

    def residual(self, assign, inst):
        n = loads(assign, inst.C)
        return np.maximum(n - inst.U, 0) + np.maximum(inst.L - n, 0).astype(float)

    def violations(self, assign, inst):
        n = loads(assign, inst.C)
        out = []
        for c in np.flatnonzero(n > inst.U):
            out.append(Violation(self.key, (int(c),), float(n[c] - inst.U),
                                 f"cpu {inst.cpus[c]} carries {n[c]} threads, above U={inst.U}"))
        for c in np.flatnonzero(n < inst.L):
            out.append(Violation(self.key, (int(c),), float(inst.L - n[c]),
                                 f"cpu {inst.cpus[c]} carries {n[c]} threads, below L={inst.L}"))
        return out


def _physical_loads(assign, inst):
    return np.bincount(inst.core, weights=loads(assign, inst.C), minlength=inst.P).astype(int)


class PhysicalBalance(Family):
    r"""(8+) Every physical core carries between ``L+ = floor(WT/P)`` and ``U+ = ceil(WT/P)`` threads.

    Beyond the article: it omits the physical-core analogues "for brevity". Derivation:
    with ``P`` physical cores of ``v`` SMT siblings each, the load of a
    physical core is ``N_x = sum_{c in x} N_c``. The same fairness argument as
    (8), applied to the ``P`` physical cores that really share execution
    units, gives ``floor(WT/P) <= N_x <= ceil(WT/P)``. It never conflicts with
    (8): with ``WT = C L + r`` and ``C = P v``, ``L+ = vL + floor(r/P)`` and
    ``U+ = vL + ceil(r/P)``, so it only asks that the ``r`` logical cores at
    load ``U`` be spread over physical cores, ``floor(r/P)`` or
    ``ceil(r/P)`` of them each, which is always possible since ``r < C``.
    Without it, (8) allows both SMT siblings of one physical core to carry
    ``U`` while another physical core carries ``2L``.

    Applies when there is SMT (``P < C``) with the same number of siblings on
    every physical core; otherwise it adds nothing (the logical bound (8)
    already is the physical one without SMT, and "fair" is ill-defined on
    mixed cores).
    """

    key = "8p"
    symmetric = True
    equations = ("8+",)
    description = "every physical core carries L+..U+ threads"
    latex = (r"\left\lfloor\frac{WT}{P}\right\rfloor=L^{+} \leq \sum_{c \in x}\sum_{w}\sum_{t}Y_{w,t,c}"
             r" \leq U^{+}=\left\lceil\frac{WT}{P}\right\rceil \quad \forall x")

    def applies(self, inst):
        return inst.P < inst.C and inst.uniform_smt

    active = applies

    def note(self, inst):
        if not self.applies(inst):
            return "no SMT (or mixed SMT): nothing to add beyond (8)"
        return f"every physical core carries {inst.L_phys}..{inst.U_phys} threads"

    def constraints(self, enc):
        inst = enc.inst
        if not self.applies(inst):
            return []
        n_phys = enc.load @ enc.physical_matrix
        cons = [n_phys <= inst.U_phys]
        if inst.L_phys > 0:
            cons.append(n_phys >= inst.L_phys)
        return cons

    def caps(self, inst):
        # mixed or no SMT: (8) already says everything
        return {"phys_load": (inst.L_phys, inst.U_phys)} if self.applies(inst) else {}

    def residual(self, assign, inst):
        if not self.applies(inst):
            return np.zeros(0)
        n = _physical_loads(assign, inst)
        return (np.maximum(n - inst.U_phys, 0) + np.maximum(inst.L_phys - n, 0)).astype(float)

    def violations(self, assign, inst):
        res = self.residual(assign, inst)
        if res.size == 0:
            return []
        n = _physical_loads(assign, inst)
        return [Violation(self.key, (int(x),), float(res[x]),
                          f"physical core {x} carries {n[x]} threads, outside "
                          f"L+={inst.L_phys}..U+={inst.U_phys}")
                for x in np.flatnonzero(res > 0)]


# -- (9)+(10), (11)+(12) and the physical analogue ----------------------------------------

class MainIndicator(Family):
    """(9)+(10) ``M_c = 1`` exactly when some main thread is on core ``c``.

    An auxiliary definition used by (11)+(12); on a finished assignment it is
    the indicator ``A_c >= 1`` and cannot be violated.
    """

    key = "9-10"
    symmetric = True
    equations = ("9", "10")
    description = "M_c indicates that some main thread is on core c"
    latex = (r"M_c \geq Y_{w,0,c} \;\forall w,c \qquad "
             r"M_c \leq \sum_{w} Y_{w,0,c} \;\forall c")

    def active(self, inst):
        return inst.scenario3

    def note(self, inst):
        if not inst.scenario3:
            return "defined only for scenario 3, where (11)+(12) uses it"
        return self.description

    def constraints(self, enc):
        if not enc.inst.scenario3:
            return []
        # (9)+(10) own M_c's definition; (11)+(12) only read M_c.
        return enc.main_indicator()[1]

    def caps(self, inst):
        return {}              # an auxiliary definition: nothing to cap


def _main_load_events(assign, inst):
    """``1(E_c)``: core ``c`` carries ``U`` threads, one of them a main thread."""
    return (loads(assign, inst.C) == inst.U) & (main_counts(assign, inst.C) > 0)


class MainLoadCap(Family):
    """(11)+(12) In scenario 3, few cores hosting a main thread may carry the upper load ``U``.

    ``1(E_c) = (N_c - L) M_c`` marks a core that carries ``U`` threads and a main
    thread; at most ``max(0, W - C + r)`` such cores are allowed, the minimum
    the counting argument of the article forces.
    """

    key = "11-12"
    symmetric = True
    equations = ("11", "12")
    description = "in scenario 3, at most max(0, W-C+r) main-thread cores carry U threads"
    latex = (r"\mathbb{1}(E_c)=\Big(\sum_{w}\sum_{t}Y_{w,t,c}-L\Big)M_c \;\forall c \qquad "
             r"\sum_{c}\mathbb{1}(E_c) \leq \max\{0, W-C+r\}")
    # (11) is a product of two 0-1 quantities only because (8) keeps N_c - L in {0, 1}.
    requires = ("9-10", "8")

    def applies(self, inst):
        return inst.scenario3

    active = applies

    def bound(self, inst):
        return max(0, inst.W - inst.C + inst.r)

    def note(self, inst):
        if not inst.scenario3:
            return "not scenario 3 (WT <= C or WT mod C = 0): (8) alone balances the cores"
        return f"at most {self.bound(inst)} cores with a main thread carry U={inst.U} threads"

    # The first to yield to a conflict: it only prefers which loaded cores carry a main thread,
    # where (2) keeps equally ranked threads apart and (8) keeps the balance (docs/model.md).
    yields = 1

    def constraints(self, enc):
        inst = enc.inst
        if not inst.scenario3:
            return []
        indicator, _ = enc.main_indicator()          # its rows belong to (9)+(10)
        events, cons = enc.product(enc.load - inst.L, indicator, "logical")
        return cons + [cp_sum(events) <= self.bound(inst)]

    def elastic(self, enc):
        """(12) with a slack: ``sum_c 1(E_c) <= max(0, W-C+r) + s``, ``s >= 0``.

        Examples
        --------
        >>> from tuna_lab import Topology, TunaModel
        >>> model = TunaModel(24, 2, Topology.preset("xeon-8272cl"))
        >>> model.explain().families, model.solve().relaxed[0].amount
        (('2', '11-12'), 8.0)
        """
        return _elastic_events(self, enc, enc.load - enc.inst.L, lambda: enc.main_indicator()[0],
                               "logical", enc.inst.scenario3)

    def caps(self, inst):
        return {"event_budget": self.bound(inst)} if self.applies(inst) else {}

    def residual(self, assign, inst):
        if not inst.scenario3:
            return np.zeros(0)
        return np.array([max(0.0, float(_main_load_events(assign, inst).sum()) - self.bound(inst))])

    def violations(self, assign, inst):
        res = self.residual(assign, inst)
        if res.size == 0 or res[0] == 0:
            return []
        ev = _main_load_events(assign, inst)
        return [Violation(self.key, (), float(res[0]),
                          f"{int(ev.sum())} cores with a main thread carry U={inst.U} threads "
                          f"(cpus {inst.cpus[np.flatnonzero(ev)].tolist()}), above {self.bound(inst)}")]


class PhysicalMainLoadCap(Family):
    r"""(11+)+(12+) The physical-core analogue of (11)+(12).

    Beyond the article, which omits the physical-core analogues "for brevity".

    Derivation: in the physical scenario 3 (``WT > P`` and
    ``r+ = WT mod P > 0``), (8+) leaves ``r+`` physical cores at ``U+`` and
    ``P - r+`` at ``L+ = U+ - 1``. A physical core ``x`` hosting a main
    thread is best given the lower load. Let ``M+_x = 1`` if some main thread
    runs on a sibling of ``x``, and ``1(E+_x) = (N_x - L+) M+_x`` (a product
    of two 0-1 quantities, since ``N_x - L+`` is 0 or 1 under (8+)). If the
    ``W`` main threads sit on distinct physical cores - what (4)+(5) favours,
    and what is possible when ``W <= P`` - at least ``W - (P - r+)`` of those
    cores must carry ``U+``, exactly the article's argument with ``C``
    replaced by ``P``; with ``W > P`` every physical core may host a main
    thread. Hence

    ``sum_x 1(E+_x) <= max(0, min(W, P) - P + r+)``.

    Main threads sharing a physical core only lower the left-hand side, so
    the bound never cuts off a placement that (2) allows. Applies with
    uniform SMT (``P < C``), like (8+).
    """

    key = "11p-12p"
    symmetric = True
    equations = ("11+", "12+")
    description = "in physical scenario 3, few physical cores hosting a main thread carry U+ threads"
    latex = (r"\mathbb{1}(E^{+}_x)=\Big(\sum_{c\in x}\sum_{w}\sum_{t}Y_{w,t,c}-L^{+}\Big)M^{+}_x"
             r" \;\forall x \qquad \sum_{x}\mathbb{1}(E^{+}_x) \leq \max\{0, \min(W,P)-P+r^{+}\}")
    requires = ("9-10", "8p")

    def applies(self, inst):
        return inst.P < inst.C and inst.uniform_smt and inst.scenario3_phys

    active = applies

    def bound(self, inst):
        return max(0, min(inst.W, inst.P) - inst.P + inst.r_phys)

    def note(self, inst):
        if not self.applies(inst):
            return "not the physical scenario 3 (or no SMT): nothing to add"
        return (f"at most {self.bound(inst)} physical cores with a main thread carry "
                f"U+={inst.U_phys} threads")

    def _events(self, assign, inst):
        n = _physical_loads(assign, inst)
        has_main = np.bincount(inst.core, weights=main_counts(assign, inst.C), minlength=inst.P) > 0
        return (n == inst.U_phys) & has_main

    # (the physical analogue yields before the article's own (11)+(12))
    yields = 0

    def constraints(self, enc):
        inst = enc.inst
        if not self.applies(inst):
            return []
        # M+_x has no family of its own: this one owns its definition.
        indicator, cons = enc.physical_main_indicator()
        events, more = enc.product(
            enc.load @ enc.physical_matrix - inst.L_phys, indicator, "physical")
        return cons + more + [cp_sum(events) <= self.bound(inst)]

    def elastic(self, enc):
        """(12+) with a slack, as :meth:`MainLoadCap.elastic`; its own ``M+_x`` rows included."""
        inst = enc.inst
        if not self.applies(inst):
            return _elastic_events(self, enc, None, None, "physical", False)
        indicator, cons = enc.physical_main_indicator()
        rows, slack = _elastic_events(self, enc, enc.load @ enc.physical_matrix - inst.L_phys,
                                      lambda: indicator, "physical", True)
        return cons + rows, slack

    def caps(self, inst):
        return {"phys_event_budget": self.bound(inst)} if self.applies(inst) else {}

    def residual(self, assign, inst):
        if not self.applies(inst):
            return np.zeros(0)
        return np.array([max(0.0, float(self._events(assign, inst).sum()) - self.bound(inst))])

    def violations(self, assign, inst):
        res = self.residual(assign, inst)
        if res.size == 0 or res[0] == 0:
            return []
        ev = self._events(assign, inst)
        return [Violation(self.key, (), float(res[0]),
                          f"{int(ev.sum())} physical cores with a main thread carry U+={inst.U_phys} "
                          f"threads (cores {np.flatnonzero(ev).tolist()}), above {self.bound(inst)}")]


def _elastic_events(family, enc, excess, indicator, label, active):
    """``(rows, slack)`` of an event budget (12)/(12+) that may be exceeded by ``slack >= 0``."""
    import cvxpy as cp

    slack = cp.Variable(nonneg=True, name=f"slack_{family.key}")
    if not active:
        return [slack == 0], slack
    events, cons = enc.product(excess, indicator(), label)
    return cons + [cp_sum(events) <= family.bound(enc.inst) + slack], slack


def cp_sum(expr):
    import cvxpy as cp

    return cp.sum(expr)


#: The families a :class:`~tuna_lab.model.tuna.TunaModel` composes by default,
#: in build order ((9)+(10) before the families that read ``M_c``).
FAMILY_TYPES = (SingleCore, UniqueRankCores, UniqueWorkerCores, MainSpread, WorkerDistance,
                LogicalBalance, PhysicalBalance, MainIndicator, MainLoadCap, PhysicalMainLoadCap)

DEFAULT_FAMILIES = tuple(f() for f in FAMILY_TYPES)


def resolve_family(spec, held=()):
    """The family ``spec`` names: an instance, a class, a key (``"11-12"``), a class name or an equation number.

    The one resolver behind :meth:`TunaModel.with_ <tuna_lab.model.TunaModel.with_>`,
    :meth:`~tuna_lab.model.TunaModel.without`, :meth:`Mapping.verify
    <tuna_lab.model.Mapping.verify>` and the widgets. ``held``: families
    already at hand (a model's), searched first, so that a key also names a
    family of one's own.

    Raises
    ------
    ModelError
        No family goes by that name.

    Examples
    --------
    >>> resolve_family("(11)"), resolve_family(8).key, resolve_family("PhysicalBalance").key
    (MainLoadCap((11,12)), '8', '8p')
    """
    if isinstance(spec, Family):
        return spec
    if isinstance(spec, type) and issubclass(spec, Family):
        return spec()
    if isinstance(spec, (str, int)) and not isinstance(spec, bool):
        s = str(spec).strip().strip("()").strip()
        for fam in (*held, *(ftype() for ftype in FAMILY_TYPES)):
            if s in (fam.key, fam.name) or s in fam.equations:
                return fam
    known = dict.fromkeys([*(f"{f.key} ({f.name})" for f in held),
                           *(f"{f.key} ({f.__name__})" for f in FAMILY_TYPES)])
    raise ModelError(f"unknown constraint family {spec!r}; known: " + ", ".join(known))
