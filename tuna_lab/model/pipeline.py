"""How :meth:`TunaModel.solve <tuna_lab.model.tuna.TunaModel.solve>` reaches a mapping, stage by stage.

1. *Constructive route.* The greedy mapping (:meth:`TunaModel.construct`);
   when it reaches the counting bound it is optimal and the run ends
   (``encoding="constructive+bound"``). Otherwise local search polishes it
   and the bound is tried again.
2. *Build.* The cvxpy problem (cached per model) compiled for HiGHS.
3. *Presolve guard.* With a time limit that HiGHS's presolve alone would
   overrun (it does not stop mid-way), the polished mapping is the answer,
   with the bound's gap (``encoding="constructive"``).
4. *HiGHS*, warm-started with the constructive mapping.
5. *Result.* HiGHS's status and dual bound, tightened by the counting bound.

The constructive route and the counting bound know the families that
contribute to :class:`~tuna_lab.model.caps.Caps` only. With any other family
the run goes straight to HiGHS, which sees every family's rows, and the
mapping says so in :attr:`Mapping.notes <tuna_lab.model.mapping.Mapping.notes>`.

What one run did is kept in a :class:`RunRecord` (timings, route, status,
bound, gap, notes), from which the :class:`~tuna_lab.model.mapping.Mapping`
is made.
"""

import time
import warnings
from dataclasses import dataclass, field

import cvxpy as cp
import numpy as np

from .._checks import positive_number
from ..errors import InfeasibleModelError, ModelError, NoSolutionError
from .bounds import bound_closes
from .mapping import Mapping

__all__ = ["SolveOptions", "RunRecord", "run"]

# HiGHS's presolve does not stop at its time limit; on large models it alone
# takes about this long per nonzero of the constraint matrix (measured on the
# 494k-nonzero epyc-9654-2s 32x16 compact model: 3-9 s on 2 shared CPUs).
_PRESOLVE_S_PER_NONZERO = 1e-5

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
        HiGHS's run.
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
    notes: list = field(default_factory=list)

    def mapping(self, model, positions):
        """The :class:`Mapping` of ``positions`` (shape (W, T)) with this record's evidence.

        ``solve_seconds`` is HiGHS's time when HiGHS ran, else the
        constructive route's (it was the solver then).
        """
        inst = model.instance
        solver_ran = self.route not in ("constructive", "constructive+bound")
        return Mapping(inst, inst.cpus[positions], model.families, status=self.status,
                       proven_optimal=self.proven_optimal, gap=self.gap, bound=self.bound,
                       build_seconds=self.build_seconds,
                       solve_seconds=self.highs_seconds if solver_ran else self.construct_seconds,
                       encoding=self.route, notes=tuple(self.notes))


def run(model, options):
    """Solve ``model`` (a :class:`TunaModel`) under ``options`` (:class:`SolveOptions`).

    Returns
    -------
    Mapping
        With the run's evidence (:class:`RunRecord`).
    """
    t_begin = time.perf_counter()
    record = RunRecord()
    if not model.caps.understood:
        record.notes.append(
            f"families ({', '.join(model.caps.unknown)}) are not known to the constructive mapping "
            "and the counting bound: HiGHS solved the model")
    # An explicit encoding="pairwise" asks for the literal model: solve it.
    by_bound = options.prove in ("auto", "bound") and model.encoding != "pairwise"
    start = None
    if options.warm_start:
        start, proven = _constructive(model, options, record, by_bound)
        if proven is not None:
            return proven
    problem, enc, data, offset = _compiled(model, record)
    if start is not None:
        _set_highs_start(problem, data, enc.start(start))
    highs_options = {}
    if options.time_limit is not None:
        # the limit covers the whole solve: what construction, local search
        # and building took comes out of HiGHS's share (it keeps at least a fifth)
        left = options.time_limit - (time.perf_counter() - t_begin)
        nnz = data[cp.settings.A].nnz if cp.settings.A in data else 0
        if start is not None and by_bound and left < _PRESOLVE_S_PER_NONZERO * nnz:
            # HiGHS's presolve alone would overrun the time left: the polished
            # mapping, with its certified gap, is the answer.
            record.notes.append(f"HiGHS's presolve would overrun the {left:.2f} s left: "
                                "the constructive mapping is the answer")
            return _constructed(model, start, record)
        highs_options["time_limit"] = max(0.2 * options.time_limit, left)
    if options.gap is not None:
        highs_options["mip_rel_gap"] = float(options.gap)
    _run_highs(problem, options.verbose, start is not None, highs_options, record)
    return _result(model, problem, enc, offset, start, options.prove, record)


def _constructive(model, options, record, by_bound):
    """``(start, mapping)``: the constructive mapping, and the run's answer if the bound proves it."""
    t0 = time.perf_counter()
    start = model.construct()
    record.construct_seconds = time.perf_counter() - t0
    if start is None:
        return None, None
    if by_bound:
        proven = _certificate(model, start, record)
        if proven is not None:
            return start, proven
    # Not proven yet: polish the greedy mapping by local search (its time
    # comes out of the time limit), then try the bound again.
    budget = 2.0 if options.time_limit is None else min(2.0, 0.3 * options.time_limit)
    t0 = time.perf_counter()
    start = model.improve(start, time_limit=budget)
    record.construct_seconds += time.perf_counter() - t0
    if by_bound:
        return start, _certificate(model, start, record)
    return start, None


def _certificate(model, start, record):
    """The mapping ``start``, proven optimal, if it reaches :meth:`TunaModel.bound`; else ``None``."""
    objective = model.value(start)
    t0 = time.perf_counter()
    bound = model.bound(target=objective)
    record.construct_seconds += time.perf_counter() - t0
    if bound is None or not bound_closes(bound, objective, model.granularity()):
        return None
    record.route, record.status, record.proven_optimal = "constructive+bound", "optimal", True
    record.bound, record.gap, record.build_seconds = max(bound, objective), 0.0, 0.0
    return record.mapping(model, start)


def _compiled(model, record):
    """``(problem, encoding, HiGHS data, objective offset)``; timed into ``record.build_seconds``."""
    problem, enc, build_s = model.build()
    t0 = time.perf_counter()
    data, _, inverse = problem.get_problem_data(cp.HIGHS)   # compiled once, cached by cvxpy
    record.build_seconds = build_s + time.perf_counter() - t0
    # HiGHS minimises -(objective) - offset; keep the offset to turn its
    # dual bound into a bound on our objective.
    offset = float(inverse[-1].get("offset", 0.0)) if inverse else 0.0
    return problem, enc, data, offset


def _constructed(model, start, record):
    """The mapping ``start`` as the answer without HiGHS, with the counting bound's gap."""
    objective = model.value(start)
    bound = model.bound()
    record.route, record.status = "constructive", "constructed"
    if bound is not None:
        record.bound = max(bound, objective)
        record.proven_optimal = bound_closes(record.bound, objective, model.granularity())
        record.gap = 0.0 if record.proven_optimal else (record.bound - objective) / max(1.0, abs(objective))
        if record.proven_optimal:
            record.status = "optimal"
    return record.mapping(model, start)


def _run_highs(problem, verbose, warm, highs_options, record):
    """Run HiGHS on ``problem``; its wall time goes to ``record.highs_seconds``."""
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            # cvxpy warns "may be inaccurate" on a time limit; we report the
            # status and the certified gap ourselves.
            warnings.simplefilter("ignore", UserWarning)
            problem.solve(solver=cp.HIGHS, verbose=verbose, warm_start=warm, **highs_options)
    except cp.error.SolverError as exc:
        raise NoSolutionError(f"HiGHS failed: {exc}") from None
    record.highs_seconds = time.perf_counter() - t0


def _result(model, problem, enc, offset, start, prove, record):
    """The mapping HiGHS found (or ``start`` if it found none in time), with its evidence."""
    inst = model.instance
    info = problem.solver_stats.extra_stats if problem.solver_stats else None
    status = problem.status
    if status in (cp.INFEASIBLE, "infeasible_or_unbounded"):
        active = model.active_families
        names = ", ".join(f"({f.key}) {f.name}" for f in active)
        raise InfeasibleModelError(
            f"no mapping of W={inst.W} x T={inst.T} on {inst.C} cores satisfies the families "
            f"{names}", [f.key for f in active])
    has_solution = status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE, cp.USER_LIMIT) and \
        all(v.value is not None for v in enc.variables()[:1])
    if has_solution and info is not None and getattr(info, "primal_solution_status", 2) != 2:
        has_solution = False
    dual = float(info.mip_dual_bound) if info is not None else float("nan")
    bound = -(dual + offset) if np.isfinite(dual) else None
    record.route = enc.name
    if not has_solution:
        if start is None:
            raise NoSolutionError(
                f"HiGHS found no feasible mapping for W={inst.W} x T={inst.T} ({status}); "
                "raise the time limit")
        # The solver ran out of time before improving on (or even loading)
        # the constructive mapping: that mapping is the answer, with
        # whatever bound HiGHS proved.
        record.status, positions, proven = "constructed", start, False
    else:
        record.status = "optimal" if status == cp.OPTIMAL else "time_limit"
        positions, proven = enc.extract(), status == cp.OPTIMAL
    objective = model.value(positions)
    counting = model.bound()            # None unless every family is known to it
    if counting is not None:
        bound = counting if bound is None else min(bound, counting)
    gap = None
    if bound is not None:
        bound = max(bound, objective)
        gap = (bound - objective) / max(1.0, abs(objective))
    if not proven and prove != "solver" and bound is not None \
            and bound_closes(bound, objective, model.granularity()):
        # the bound is less than one lattice step above: nothing better exists
        proven, record.status, gap = True, "optimal", 0.0
    if proven:
        gap = min(gap, 1e-4) if gap is not None else 0.0
    record.proven_optimal, record.bound, record.gap = proven, bound, gap
    return record.mapping(model, positions)


def _set_highs_start(problem, data, values):
    """Make ``values`` (``{variable id: value}``) HiGHS's starting solution for ``problem``.

    cvxpy 1.9 has no public way to give HiGHS a start of one's own: its
    HiGHS interface ignores ``Variable.value`` (cvxpy issues #849 and #2510;
    pull request #3490 proposes it), and ``warm_start=True`` only hands
    HiGHS the solution of the *previous* solve, which it keeps in the
    problem's private ``_solver_cache``. So we write our start there, as if
    a previous solve had found it. This function is the only place that
    touches cvxpy's private state; when cvxpy reads ``Variable.value`` for
    HiGHS, setting the values is enough.

    Integer columns we know are set; the rest are left at 0.5 (binaries) /
    0 (continuous), which HiGHS treats as a partial solution: it fixes the
    known integers and completes the rest itself.
    """
    import highspy
    from cvxpy.settings import PARAM_PROB

    prog = data[PARAM_PROB]
    n = int(sum(v.size for v in prog.variables))
    x0 = np.zeros(n)
    ints = np.concatenate([np.asarray(data.get("bool_vars_idx", []), dtype=int),
                           np.asarray(data.get("int_vars_idx", []), dtype=int)])
    x0[ints] = 0.5
    for var in prog.variables:
        if var.id in values:
            off = prog.var_id_to_col[var.id]
            x0[off:off + var.size] = np.asarray(values[var.id], dtype=float).ravel(order="F")
    sol = highspy.HighsSolution()
    sol.col_value = x0.tolist()
    sol.value_valid = True
    # the shape cvxpy's HiGHS interface stores after a solve: (solver, data, results)
    problem._solver_cache = {"HIGHS": (None, None, {"model_status": "kOptimal", "solution": sol})}
