"""HiGHS on a model's cvxpy problem: compiled once, started from a mapping, stopped at the deadline.

The solve pipeline (:mod:`~tuna_lab.model.pipeline`) runs HiGHS through
this module: :func:`compile_problem` (cvxpy's HiGHS data, kept on the
problem by cvxpy), :func:`highs_need` (whether compiling and presolve fit
the time left), :func:`run_highs` (in this process, or with a time limit
in a forked child that is killed at the deadline) and :func:`unpack`
(HiGHS's columns back into the problem's variables).

Examples
--------
>>> from types import SimpleNamespace
>>> from tuna_lab import Topology, TunaModel
>>> problem, encoding, _ = TunaModel(2, 2, Topology.preset("xeon-8272cl")).build()
>>> compiled = compile_problem(problem)
>>> record = SimpleNamespace(notes=[], highs_seconds=0.0)      # what the pipeline's RunRecord holds
>>> run_highs(compiled, encoding, None, False, {}, Clock(None), record)["model_status"]
'kOptimal'
"""

import os
import time
import warnings
import weakref
from types import SimpleNamespace

import lazy_loader
import numpy as np

from ...errors import NoSolutionError
from .programs import highs_lp, in_child, new_highs

# cvxpy takes most of a second to import; a compact solve that the constructive route
# proves never builds the cvxpy problem, so it is loaded on first use
cp = lazy_loader.load("cvxpy")

__all__ = ["Clock", "RESULT_RESERVE_S", "HIGHS_FAILED", "highs_need", "compile_problem", "run_highs", "unpack"]

# HiGHS's presolve and the set-up of its search (clique table, probing) do
# not stop at its time limit, and nothing useful comes before they end; on
# large models they take about this long per nonzero of the constraint
# matrix (measured on the 494k-nonzero epyc-9654-2s 32x16 compact model on 2
# shared CPUs: presolve 3-6 s, then 5-19 s before its first clock check).
_PRESOLVE_S_PER_NONZERO = 2e-5
# Before it is compiled the matrix's size is estimated from the model's:
# the counts encoding has 30-40 nonzeros per (worker, logical core) on the
# epyc presets (494k for 32x16 and 1.9M for 64x16 on 768 cores), and cvxpy
# compiles about a million of them per second (0.5 s and 2.1 s there).
_NNZ_PER_WORKER_CORE = 40
_COMPILE_S_PER_NONZERO = 1.2e-6
#: Seconds kept back from the time limit for what follows HiGHS: reading its
#: solution back through cvxpy, extracting and scoring the mapping (0.05-0.2 s
#: on 768 cores).
RESULT_RESERVE_S = 0.25
# HiGHS is told to stop this much before the time it is given (a fraction
# of it, at least a tenth of a second), so that it returns its incumbent and
# dual bound itself where its clock checks allow.
_HIGHS_MARGIN = 0.15

# The constraint matrix's nonzeros of each cvxpy problem compiled so far
# (cvxpy caches the compilation itself on the problem). Only numbers: a
# value referring to its problem would keep it alive.
_NONZEROS = weakref.WeakKeyDictionary()


class Clock:
    """The run's deadline: ``left()`` seconds remain (infinite without a time limit)."""

    def __init__(self, limit):
        self.t0 = time.perf_counter()
        self.limit = limit

    def left(self):
        if self.limit is None:
            return float("inf")
        return self.limit - (time.perf_counter() - self.t0)



def highs_need(model):
    """Seconds compiling (unless done) and HiGHS's presolve will take at least, estimated from the size."""
    built = model.build(cached_only=True)
    if built is not None and built[0] in _NONZEROS:
        return _PRESOLVE_S_PER_NONZERO * _NONZEROS[built[0]]
    inst = model.instance
    nnz = _NNZ_PER_WORKER_CORE * inst.W * inst.C
    return (_COMPILE_S_PER_NONZERO + _PRESOLVE_S_PER_NONZERO) * nnz



def compile_problem(problem):
    """cvxpy's HiGHS data of ``problem``: ``data``, ``chain``, ``inverse`` and the objective's ``offset``."""
    data, chain, inverse = problem.get_problem_data(cp.HIGHS)
    # HiGHS minimises -(objective) - offset; keep the offset to turn its
    # dual bound into a bound on our objective.
    offset = float(inverse[-1].get("offset", 0.0)) if inverse else 0.0
    _NONZEROS[problem] = int(data[cp.settings.A].nnz) if cp.settings.A in data else 0
    return {"data": data, "chain": chain, "inverse": inverse, "offset": offset}



def _highs_model(data):
    """The ``highspy.HighsModel`` of cvxpy's compiled HiGHS ``data`` (as cvxpy's interface builds it)."""
    import highspy
    from cvxpy.reductions.solvers.conic_solvers.conic_solver import dims_to_solver_dict

    s = cp.settings
    inf = highspy.kHighsInf
    dims = dims_to_solver_dict(data[s.DIMS])
    A = data[s.A]
    b = np.asarray(data[s.B], dtype=float)
    n = A.shape[1]
    lb, ub = data[s.LOWER_BOUNDS], data[s.UPPER_BOUNDS]
    lower = np.full(n, -inf) if lb is None else np.array(lb, dtype=float)
    upper = np.full(n, inf) if ub is None else np.array(ub, dtype=float)
    bools = np.asarray(data[s.BOOL_IDX], dtype=int)
    ints = np.concatenate([bools, np.asarray(data[s.INT_IDX], dtype=int)])
    lower[bools] = np.maximum(lower[bools], 0)
    upper[bools] = np.minimum(upper[bools], 1)
    model = highspy.HighsModel()
    # rows: the first EQ_DIM are equalities, the rest A x <= b
    model.lp_ = highs_lp(data[s.C], A, np.concatenate([b[:dims[s.EQ_DIM]], np.full(len(b) - dims[s.EQ_DIM], -inf)]),
                         b, lower, upper, integer=ints)
    return model, ints


def run_highs(compiled, enc, start, verbose, highs_options, clock, record):
    """Run HiGHS on the compiled problem until it ends or the deadline nears.

    Without a time limit HiGHS runs here, as cvxpy would run it. With one it
    runs in a forked child process that is killed at the deadline: HiGHS's
    presolve and the set-up of its search check the clock seldom (on the
    384-core compact models, 5-20 s go by without a check), and a process,
    unlike a thread, can be stopped (and then takes no CPU from what runs
    next).

    Returns
    -------
    dict or None
        ``model_status`` (HiGHS's status name), ``col_value`` (array or
        ``None``) and ``info`` (a dict of HiGHS's info values); ``None`` when
        HiGHS did not return in time (then ``start`` is the answer). Its wall
        time goes to ``record.highs_seconds``.
    """
    t0 = time.perf_counter()
    model, ints = _highs_model(compiled["data"])
    x0 = None if start is None else _start_values(compiled["data"], enc.start(start), ints)
    options = {"output_flag": bool(verbose), "log_to_console": bool(verbose), **highs_options}
    if clock.limit is None or not hasattr(os, "fork"):
        if clock.limit is not None:
            options["time_limit"] = max(0.05, clock.left() - RESULT_RESERVE_S)
        out = _highs_solve(model, x0, options)
    else:
        left = clock.left() - RESULT_RESERVE_S
        # HiGHS stops itself a little early where it can; the kill is the guarantee.
        options["time_limit"] = max(0.05, left - max(0.1, _HIGHS_MARGIN * left))
        out = _highs_in_child(model, x0, options, clock)
    record.highs_seconds = time.perf_counter() - t0
    if out is None:
        record.notes.append(f"HiGHS did not stop by the deadline (its presolve and search set-up check the "
                            f"clock seldom) and was stopped after {record.highs_seconds:.2f} s: "
                            "the constructive mapping is the answer")
        return None
    if "error" in out:
        raise NoSolutionError(f"HiGHS failed: {out['error']}")
    return out


# HiGHS's info values the result needs (cvxpy's HiGHS interface reads the
# objective and the iteration counts).
_INFO = ("objective_function_value", "mip_dual_bound", "mip_gap", "primal_solution_status",
         "ipm_iteration_count", "crossover_iteration_count", "pdlp_iteration_count",
         "qp_iteration_count", "simplex_iteration_count")


def _highs_solve(model, x0, options):
    """Run HiGHS on ``model`` from the start ``x0``; the plain-valued outcome (see :func:`run_highs`)."""
    import highspy

    h = new_highs(quiet=not options.get("output_flag", False))
    for name, value in options.items():
        if h.setOptionValue(name, value) == highspy.HighsStatus.kError:
            return {"error": f"HiGHS rejected the option {name}={value!r}"}
    h.passModel(model)
    if x0 is not None:
        sol = highspy.HighsSolution()
        sol.col_value = x0.tolist()
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    info = h.getInfo()
    solution = h.getSolution()
    return {"model_status": h.getModelStatus().name,
            "col_value": np.asarray(solution.col_value) if solution.value_valid else None,
            "info": {k: getattr(info, k, 0) for k in _INFO}, "run_time": h.getRunTime()}


def _highs_in_child(model, x0, options, clock):
    """:func:`_highs_solve` in a forked process, killed when the deadline nears; ``None`` then."""
    out = in_child(_highs_solve, (model, x0, options), max(0.0, clock.left() - RESULT_RESERVE_S))
    if out is None:
        return None
    ok, value = out
    return value if ok else {"error": value}


#: HiGHS's model statuses that carry no solution and no verdict on the model.
HIGHS_FAILED = ("kNotset", "kLoadError", "kModelError", "kPresolveError", "kSolveError",
                 "kPostsolveError", "kModelEmpty", "kMemoryLimit", "kUnknown")



def unpack(problem, compiled, results):
    """Set the variables of ``problem`` from HiGHS's ``results`` (an interrupted run is a time limit to cvxpy)."""
    status = results["model_status"]
    raw = {"model_status": "kTimeLimit" if status == "kInterrupt" else status,
           "solution": SimpleNamespace(col_value=results["col_value"]),
           "info": SimpleNamespace(**results["info"]), "run_time": results["run_time"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        problem.unpack_results(raw, compiled["chain"], compiled["inverse"])


def _start_values(data, values, ints):
    """HiGHS's starting point from ``values`` (``{variable id: value}``), in cvxpy's column order.

    Integer columns we know are set; the rest are left at 0.5 (binaries) /
    0 (continuous), which HiGHS treats as a partial solution: it fixes the
    known integers and completes the rest itself.
    """
    from cvxpy.settings import PARAM_PROB

    prog = data[PARAM_PROB]
    n = int(sum(v.size for v in prog.variables))
    x0 = np.zeros(n)
    x0[ints] = 0.5
    for var in prog.variables:
        if var.id in values:
            off = prog.var_id_to_col[var.id]
            x0[off:off + var.size] = np.asarray(values[var.id], dtype=float).ravel(order="F")
    return x0

