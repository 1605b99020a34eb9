"""How :meth:`TunaModel.solve <tuna_lab.model.tuna.TunaModel.solve>` reaches a mapping, stage by stage.

Each run creates a :class:`~tuna_lab.model.route.search.Search` of the model and
owns it: what one stage of the search finds (the pattern bounds, the
fragment programs solved so far), the next reuses, and it all goes when the
run ends. The model itself only declares and keeps nothing.

1. *Constructive route.* The greedy mapping (:meth:`Search.construct
   <tuna_lab.model.route.search.Search.construct>`); when it reaches the
   combinatorial bound (:meth:`Search.certificate
   <tuna_lab.model.route.search.Search.certificate>`) it is optimal and the run
   ends (``encoding="constructive+bound"``). Otherwise local search polishes
   it and the bound is tried again.
2. *Build.* The cvxpy problem (:mod:`~tuna_lab.model.problem`, cached by the
   model's declaration) compiled for HiGHS (:mod:`~tuna_lab.model.highs.solve`).
3. *Guard.* With a time limit that compiling (estimated from the model's
   size) and HiGHS's presolve (which does not stop at its time limit) would
   overrun, the polished mapping is the answer, with the bound's gap
   (``encoding="constructive"``).
4. *HiGHS*, warm-started with the constructive mapping; with a time limit
   in a forked child process that is killed at the deadline.
5. *Result.* HiGHS's status and dual bound, tightened by the combinatorial
   bound.

The time limit covers all of it, from the first stage to the returned
mapping (not the import of cvxpy nor the building of the
:class:`TunaModel`): every stage gets what is left of it. HiGHS is told to
stop a little before the deadline; should it not (its presolve and the
set-up of its search check the clock seldom), its process is killed and
the best mapping found so far is returned, with the bound's certified gap.
Only the greedy construction itself runs to its end whatever the limit.

The constructive route and the bound know the families that contribute to
:class:`~tuna_lab.model.caps.Caps` only. With any other family the run goes
straight to HiGHS, which sees every family's rows, and the mapping says so
in :attr:`Mapping.notes <tuna_lab.model.mapping.Mapping.notes>`.

What one run did is kept in a :class:`RunRecord` (timings, route, status,
bound, gap, the certificate, notes), from which the
:class:`~tuna_lab.model.mapping.Mapping` is made.
"""

import time
from dataclasses import dataclass, field

import lazy_loader
import numpy as np

from .._checks import positive_number
from ..errors import InfeasibleModelError, ModelError, NoSolutionError
from .route.bounds import bound_closes, patterns_infeasible
from .mapping import Mapping
from .route.search import Search
from .highs.solve import HIGHS_FAILED, RESULT_RESERVE_S, Clock, compile_problem, highs_need, run_highs, unpack

# cvxpy takes most of a second to import; a compact solve that the constructive route
# proves never builds the cvxpy problem, so it is loaded on first use
cp = lazy_loader.load("cvxpy")

__all__ = ["SolveOptions", "RunRecord", "run", "infeasible_error", "json_plain", "ON_INFEASIBLE", "PROVE"]

#: What :meth:`TunaModel.solve` does when the families admit no mapping: ``"relax"`` returns the
#: nearest mapping (the yielding family's slack least, then the objective greatest), ``"raise"``
#: raises :class:`~tuna_lab.errors.InfeasibleModelError` with a minimal conflicting subset.
ON_INFEASIBLE = ("relax", "raise")

# The share of the time left that the constructive route's programs (compact
# mode's fragment programs and their placements, together) may take. Most of
# it: on the models where they run long (hundreds of cores) HiGHS cannot
# finish anyway, and on small ones they finish in milliseconds.
_CONSTRUCT_SHARE = 0.6
# ... and where HiGHS cannot run in the time limit at all: all but what
# local search and the bound's check of the mapping need (the programs' plans
# are mapped as they come, so a search cut at its limit leaves a mapping,
# but a cut restricted program starts again when it is resumed).
_CONSTRUCT_SHARE_ALONE = 0.97
# ... and of what is left after it and local search, where HiGHS still cannot
# run: the bound's stopped search goes on (a plan found late is often the
# optimum, and proving it takes one more program), local search has the rest.
_RESUME_SHARE = 0.9

#: What ``prove`` may be: ``"auto"``/``"bound"`` let the counting bound prove
#: optimality, ``"solver"`` leaves the proof to HiGHS.
PROVE = ("auto", "solver", "bound")



@dataclass(frozen=True)
class SolveOptions:
    """The checked options of one solve (see :meth:`TunaModel.solve`).

    Raises
    ------
    ModelError
        A time limit that is not a positive number, a gap outside ``[0, 1)``
        or an unknown ``prove``.
    """

    time_limit: float | None = None
    gap: float | None = None
    verbose: bool = False
    warm_start: bool = True
    prove: str = "auto"

    def __post_init__(self):
        if self.time_limit is not None:
            object.__setattr__(self, "time_limit", positive_number("time limit", self.time_limit, ModelError))
        if self.gap is not None and (isinstance(self.gap, bool) or not (
                isinstance(self.gap, (int, float)) and 0 <= self.gap < 1)):
            raise ModelError(f"gap must be a number in [0, 1), got {self.gap!r}")
        if self.prove not in PROVE:
            raise ModelError(f"prove must be auto, solver or bound, got {self.prove!r}")


@dataclass
class RunRecord:
    """What one run of the pipeline did and found: the evidence a :class:`Mapping` carries.

    Attributes
    ----------
    route : str
        What produced the mapping, reported as :attr:`Mapping.encoding`:
        ``"constructive+bound"``, ``"constructive"`` or the encoding HiGHS solved.
    status : str
        ``"optimal"``, ``"time_limit"``, ``"constructed"``.
    proven_optimal : bool
    bound : float or None
        Best proven upper bound on the objective the model maximises
        (:meth:`TunaModel.value`: the terms of its objective families).
    gap : float or None
        ``(bound - value) / max(1, |value|)``.
    construct_seconds : float
        Greedy mapping, local search and bound certificates.
    build_seconds : float
        Building and compiling the cvxpy problem.
    highs_seconds : float
        HiGHS's run (as long as the run waited for it).
    combinatorial : Certificate or None
        The model's bound (:meth:`TunaModel.certificate`), once computed.
    dual_bound : float or None
        HiGHS's dual bound on the objective, when HiGHS ran and proved one.
    certificate : dict
        What proves the mapping's bound (see :attr:`Mapping.certificate
        <tuna_lab.model.mapping.Mapping.certificate>`), set with the result.
    notes : list of str
        Why the run took the route it took, when that is not the default.
    """

    route: str = ""
    status: str = "unknown"
    proven_optimal: bool = False
    bound: float | None = None
    gap: float | None = None
    construct_seconds: float = 0.0
    build_seconds: float = 0.0
    highs_seconds: float = 0.0
    combinatorial: object = None
    dual_bound: float | None = None
    certificate: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)

    def mapping(self, model, positions):
        """The :class:`Mapping` of ``positions`` (shape (W, T)) with this record's evidence.

        ``solve_seconds`` is HiGHS's time when HiGHS's answer is the
        mapping, else the constructive route's (it was the solver then) plus
        whatever HiGHS spent before the deadline stopped it.
        """
        inst = model.instance
        solver_ran = self.route not in ("constructive", "constructive+bound")
        return Mapping(inst, inst.cpus[positions], model.families, status=self.status,
                       proven_optimal=self.proven_optimal, gap=self.gap, bound=self.bound,
                       build_seconds=self.build_seconds,
                       solve_seconds=self.highs_seconds if solver_ran else self.construct_seconds + self.highs_seconds,
                       encoding=self.route, notes=tuple(self.notes), certificate=dict(self.certificate))

    def certify(self, model, objective, by):
        """Fill :attr:`certificate`: the bound that proves the mapping's gap, and its numbers.

        ``by`` names what proved optimality (``"highs"``, or ``None`` for the
        tighter of the two bounds); :attr:`bound`, :attr:`gap` and
        :attr:`proven_optimal` are set already.
        """
        comb = self.combinatorial
        if by is None:
            # the bound the gap is measured against: the tighter of the two
            if comb is not None and (self.dual_bound is None or comb.bound <= self.dual_bound):
                by = comb.name
            elif self.dual_bound is not None:
                by = "highs"
        self.certificate = {
            "name": by or "none",
            "proven": bool(self.proven_optimal),
            "objective": float(objective),
            "bound": None if self.bound is None else float(self.bound),
            "gap": None if self.gap is None else float(self.gap),
            "step": float(model.granularity()),
            "dual_bound": None if self.dual_bound is None else float(self.dual_bound),
            "combinatorial": None if comb is None else json_plain(comb.as_dict()),
        }


def json_plain(value):
    """``value`` with numpy scalars and tuples turned into JSON's types."""
    if isinstance(value, dict):
        return {str(k): json_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def run(model, options):
    """Solve ``model`` (a :class:`TunaModel`) under ``options`` (:class:`SolveOptions`).

    Returns
    -------
    Mapping
        With the run's evidence (:class:`RunRecord`).
    """
    clock = Clock(options.time_limit)
    record = RunRecord()
    # this run's search: what the constructive route finds, the bound's steps reuse
    search = Search(model)
    if not model.caps.understood:
        record.notes.append(
            f"families ({', '.join(model.caps.unknown)}) are not known to the constructive mapping "
            "and the counting bound: HiGHS solved the model")
    # An explicit encoding="pairwise" asks for the literal model: solve it.
    by_bound = options.prove in ("auto", "bound") and model.encoding != "pairwise"
    start = None
    if options.warm_start:
        start, proven = _constructive(search, options, record, by_bound, clock)
        if proven is not None:
            return proven
    if start is None and by_bound and model.caps.understood:
        # the greedy placement dead-ends: a model with no mapping at all says so at once (HiGHS on
        # the full model looks for minutes), one that only seems hard goes on to HiGHS - if it can
        # compile and presolve within the time left
        chain = search.chain
        if chain is not None and patterns_infeasible(model.caps, chain):
            raise infeasible_error(model, "(the patterns of its physical cores admit none)")
        if options.time_limit is not None and clock.left() - RESULT_RESERVE_S < highs_need(model):
            raise NoSolutionError(
                f"no mapping of W={model.instance.W} x T={model.instance.T} found within the time limit of "
                f"{options.time_limit:g} s: the constructive mapping dead-ends, and compiling the model "
                f"for HiGHS and its presolve need ~{highs_need(model):.1f} s more; raise the time limit")
    if start is not None and options.time_limit is not None:
        need = highs_need(model)
        left = clock.left() - RESULT_RESERVE_S
        if left < need:
            # compiling and HiGHS's presolve alone would overrun the time
            # left: the polished mapping, with its certified gap, is the answer.
            record.notes.append(f"compiling and HiGHS's presolve (~{need:.1f} s) would overrun the "
                                f"{max(left, 0.0):.2f} s left: the constructive mapping is the answer")
            if by_bound:
                # the bound's own search (compact mode's fragment programs) may close it with that time
                proven = _certificate(search, start, record, time_limit=_RESUME_SHARE * left)
                if proven is not None:
                    return proven
            # the time HiGHS would not have used goes to local search
            start, proven = _polish(search, start, record, by_bound, clock.left() - RESULT_RESERVE_S)
            if proven is not None:
                return proven
            return _constructed(search, start, record, options.prove)
    problem, enc, compiled = _compiled(model, record)
    highs_options = {}
    if options.gap is not None:
        highs_options["mip_rel_gap"] = float(options.gap)
    outcome = run_highs(compiled, enc, start, options.verbose, highs_options, clock, record)
    if outcome is None:
        if start is None:
            raise NoSolutionError(
                f"HiGHS found no feasible mapping for W={model.instance.W} x T={model.instance.T} "
                f"within the time limit of {options.time_limit:g} s; raise the time limit")
        return _constructed(search, start, record, options.prove)
    return _result(search, problem, enc, compiled, outcome, start, options.prove, record)


def _constructive(search, options, record, by_bound, clock):
    """``(start, mapping)``: the constructive mapping, and the run's answer if the bound proves it."""
    model = search.model
    t0 = time.perf_counter()
    if options.time_limit is None:
        start = search.construct()
    else:
        # its programs' time limit (together): a share of what is left, so
        # that local search, the bound and HiGHS keep theirs - unless HiGHS
        # could not even compile and presolve in all of it: then its share
        # goes to the programs too, which alone may prove the mapping
        share = _CONSTRUCT_SHARE if highs_need(model) < clock.left() else _CONSTRUCT_SHARE_ALONE
        start = search.construct(time_limit=max(0.05, share * (clock.left() - RESULT_RESERVE_S)))
    record.construct_seconds = time.perf_counter() - t0
    if start is None:
        return None, None
    if by_bound:
        proven = _certificate(search, start, record)
        if proven is not None:
            return start, proven
    # Not proven yet: polish the greedy mapping by local search (its time
    # comes out of the time limit), then try the bound again.
    budget = 2.0 if options.time_limit is None else min(2.0, 0.3 * options.time_limit,
                                                        clock.left() - RESULT_RESERVE_S)
    return _polish(search, start, record, by_bound, budget)


def _polish(search, start, record, by_bound, budget):
    """``(start, mapping)`` after local search for ``budget`` seconds, as :func:`_constructive`."""
    if budget <= 0.01:
        return start, None
    t0 = time.perf_counter()
    polished = search.model.improve(start, time_limit=budget)
    record.construct_seconds += time.perf_counter() - t0
    if polished is not start:
        start = polished
        if by_bound:
            return start, _certificate(search, start, record)
    return start, None


def _certificate(search, start, record, time_limit=None):
    """The mapping ``start``, proven optimal, if it reaches the search's certificate; else ``None``.

    ``time_limit``: what the certificate's stopped searches may go on for
    (:meth:`Search.certificate <tuna_lab.model.route.search.Search.certificate>`).
    """
    model = search.model
    objective = model.value(start)
    t0 = time.perf_counter()
    cert = search.certificate(target=objective, time_limit=time_limit)
    record.construct_seconds += time.perf_counter() - t0
    if cert is None:
        return None
    # kept for the result: a valid bound either way (the full one unless
    # the target let it skip parts, which it does only when it closes)
    record.combinatorial = cert
    if not bound_closes(cert.bound, objective, model.granularity()):
        return None
    record.route, record.status, record.proven_optimal = "constructive+bound", "optimal", True
    record.bound, record.gap, record.build_seconds = max(cert.bound, objective), 0.0, 0.0
    record.certify(model, objective, cert.name)
    return record.mapping(model, start)


def _full_certificate(search, record):
    """The model's bound certificate (computed once per run), or ``None``."""
    if record.combinatorial is None:
        record.combinatorial = search.certificate()
    return record.combinatorial


def _compiled(model, record):
    """``(problem, encoding, compiled)``; timed into ``record.build_seconds``.

    ``compiled`` holds cvxpy's HiGHS data, solving chain and inverse data
    and the objective's offset (compiled once per problem by cvxpy).
    """
    problem, enc, build_s = model.build()
    t0 = time.perf_counter()
    compiled = compile_problem(problem)
    record.build_seconds = build_s + time.perf_counter() - t0
    return problem, enc, compiled


def _constructed(search, start, record, prove="auto"):
    """The mapping ``start`` as the answer without HiGHS, with the combinatorial bound's gap."""
    model = search.model
    objective = model.value(start)
    cert = _full_certificate(search, record)
    record.route, record.status = "constructive", "constructed"
    bound = None if cert is None else cert.bound
    if record.dual_bound is not None:
        bound = record.dual_bound if bound is None else min(bound, record.dual_bound)
    if bound is not None:
        record.bound = max(bound, objective)
        closes = bound_closes(record.bound, objective, model.granularity())
        record.proven_optimal = closes and prove != "solver"
        record.gap = 0.0 if closes else (record.bound - objective) / max(1.0, abs(objective))
        if record.proven_optimal:
            record.status = "optimal"
    record.certify(model, objective, None)
    return record.mapping(model, start)


def infeasible_error(model, why=""):
    """The :class:`InfeasibleModelError` of ``model`` (``why``: how it was proven, appended)."""
    inst = model.instance
    active = model.active_families
    names = ", ".join(f"({f.key}) {f.name}" for f in active)
    return InfeasibleModelError(
        f"no mapping of W={inst.W} x T={inst.T} on {inst.C} cores satisfies the families {names}"
        + (f" {why}" if why else ""), [f.key for f in active])


def _result(search, problem, enc, compiled, results, start, prove, record):
    """The mapping HiGHS found (or ``start`` if it found none, or none better), with its evidence."""
    model = search.model
    inst = model.instance
    info = results["info"]
    status = results["model_status"]
    if status in ("kInfeasible", "kUnboundedOrInfeasible"):
        raise infeasible_error(model)
    has_solution = (status not in HIGHS_FAILED and info["primal_solution_status"] == 2
                    and results["col_value"] is not None)
    dual = float(info["mip_dual_bound"])
    if np.isfinite(dual):
        # HiGHS minimises -(objective) - offset
        record.dual_bound = -(dual + compiled["offset"])
    record.route = enc.name
    proven = False
    positions = None
    if has_solution:
        # cvxpy turns the solver's columns into variable values; an
        # interrupted run is a time limit to it
        unpack(problem, compiled, results)
        positions = enc.extract()
        proven = status == "kOptimal"
        record.status = "optimal" if proven else "time_limit"
        if start is not None and model.value(start) > model.value(positions) + 1e-9:
            positions = start          # HiGHS did not get back to its own start
    if positions is None:
        if start is None:
            raise NoSolutionError(
                f"HiGHS found no feasible mapping for W={inst.W} x T={inst.T} ({status}); "
                "raise the time limit")
        # The solver ran out of time before loading (or improving on) the
        # constructive mapping: that mapping is the answer, with whatever
        # bound HiGHS proved.
        record.status, positions = "constructed", start
    objective = model.value(positions)
    cert = _full_certificate(search, record)        # None unless every family is known to it
    bound = record.dual_bound
    if cert is not None:
        bound = cert.bound if bound is None else min(bound, cert.bound)
    gap = None
    if bound is not None:
        bound = max(bound, objective)
        gap = (bound - objective) / max(1.0, abs(objective))
    by = "highs" if proven else None
    step = model.granularity()
    if not proven and prove != "solver" and bound is not None and bound_closes(bound, objective, step):
        # the bound is less than one lattice step above: nothing better exists
        proven, record.status, gap = True, "optimal", 0.0
        if cert is not None and bound_closes(max(cert.bound, objective), objective, step):
            by = cert.name
        else:
            by = "highs"
    if proven:
        gap = min(gap, 1e-4) if gap is not None else 0.0
    record.proven_optimal, record.bound, record.gap = proven, bound, gap
    record.certify(model, objective, by)
    return record.mapping(model, positions)


# -- when the families admit no mapping: the nearest mapping ------------------------------------
