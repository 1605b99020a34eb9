"""Small helpers around ``highspy`` that more than one stage of the model needs.

:func:`new_highs` makes a solver without the banner HiGHS prints as it is
made; :func:`integer_program` solves ``max c x, lb <= A x <= ub`` over
integers with the options a restricted cutting-stock program wants.

Examples
--------
>>> import numpy as np
>>> out = integer_program(np.array([3.0, 2.0]), np.array([[1.0, 1.0]]), np.array([0.0]), np.array([4.5]),
...                       upper=3, time_limit=5)
>>> out.status, out.x.tolist(), out.value
('optimal', [3, 1], 11.0)
"""

import os
import sys
from dataclasses import dataclass

import numpy as np

__all__ = ["new_highs", "fresh_scheduler", "highs_lp", "central_duals", "integer_program", "IntegerResult"]


def new_highs(quiet=True):
    """A ``highspy.Highs``; ``quiet``: without the banner HiGHS 1.16 prints to stdout as it is made.

    The banner comes before any option can be set, and it would corrupt
    ``tuna-lab solve --json``: file descriptor 1 points to /dev/null
    while the object is made.
    """
    import highspy

    if not quiet:
        return highspy.Highs()
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            return highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)


# A fork copies HiGHS's global task scheduler but not its worker threads: a
# process forked after an in-process solve (a notebook's, a benchmark's
# children) would wait forever on workers that do not exist. The first solve
# in a forked child starts the scheduler afresh.
_forked = False


def _note_fork():
    global _forked
    _forked = True


os.register_at_fork(after_in_child=_note_fork)


def fresh_scheduler():
    """Start HiGHS's global scheduler afresh if this process was forked since it last ran."""
    global _forked
    if _forked:
        import highspy

        # not blocking: the copied workers never ran in this process, there is nothing to wait for
        highspy.Highs.resetGlobalScheduler(False)
        _forked = False


def highs_lp(cost, A, row_lower, row_upper, col_lower, col_upper, integer=()):
    """The ``highspy.HighsLp`` of ``min cost @ x``, ``row_lower <= A @ x <= row_upper``, ``col_lower <= x <= col_upper``.

    ``A``: a scipy sparse matrix; infinite bounds as numpy's (HiGHS's
    infinity is the float one); ``integer``: the indices of the integer
    columns.
    """
    import highspy

    A = A.tocsc()
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = A.shape[1], A.shape[0]
    lp.offset_ = 0
    lp.col_cost_ = np.asarray(cost, dtype=float)
    lp.row_lower_, lp.row_upper_ = np.asarray(row_lower, dtype=float), np.asarray(row_upper, dtype=float)
    lp.col_lower_, lp.col_upper_ = np.asarray(col_lower, dtype=float), np.asarray(col_upper, dtype=float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = A.indptr, A.indices, A.data
    if len(integer):
        integrality = np.full(A.shape[1], highspy.HighsVarType.kContinuous, dtype=object)
        integrality[np.asarray(integer, dtype=int)] = highspy.HighsVarType.kInteger
        lp.integrality_ = integrality.tolist()
    return lp


def _boxed_max(c, A, lb, ub, upper, time_limit, integer, options):
    """A quiet ``highspy.Highs`` holding ``max c @ x``, ``lb <= A @ x <= ub``, ``0 <= x <= upper``
    (integer ``x`` if ``integer``; ``upper`` one for all or one per column), with ``options`` and the
    time limit set."""
    import scipy.sparse as sp

    n = len(c)
    lp = highs_lp(-np.asarray(c, dtype=float), sp.csc_matrix(np.asarray(A, dtype=float)), lb, ub,  # HiGHS minimises
                  np.zeros(n), np.broadcast_to(np.asarray(upper, dtype=float), (n,)).copy(),
                  integer=np.arange(n) if integer else ())
    fresh_scheduler()
    h = new_highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", max(0.05, float(time_limit)))
    for key, value in options.items():
        h.setOptionValue(key, value)
    h.passModel(lp)
    return h


def central_duals(c, A, lb, ub, upper, time_limit):
    """Row duals ``y`` of ``max c @ x``, ``lb <= A @ x <= ub``, ``0 <= x <= upper`` near the centre of the optimal face, or ``None``.

    HiGHS's interior point method without crossover: where the optimal
    duals are many (a degenerate cutting-stock relaxation), a vertex puts
    many columns at reduced cost 0 and a central one few, so fewer columns
    lie within a given reduced cost of the optimum. The reduced costs are
    ``-c - A^T y``; ``y`` is approximately optimal only, so a caller that
    proves with it works out the bound it implies itself.
    """
    import highspy

    h = _boxed_max(c, A, lb, ub, upper, time_limit, integer=False,
                   options={"solver": "ipm", "run_crossover": "off"})
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return None
    y = np.asarray(h.getSolution().row_dual, dtype=float)
    return y if np.all(np.isfinite(y)) else None


@dataclass(frozen=True)
class IntegerResult:
    """What :func:`integer_program` found.

    Attributes
    ----------
    status : str
        ``"optimal"``, ``"stopped"`` (time limit: ``x`` the best found, if
        any) or ``"infeasible"``.
    x : ndarray of int or None
    value : float or None
        ``c @ x``.
    bound : float
        Proven upper bound on the optimum (``inf`` if none).
    """

    status: str
    x: np.ndarray | None
    value: float | None
    bound: float


#: HiGHS's sub-MIP heuristics (RINS, RENS, root reduced cost) spend most of a restricted
#: cutting-stock program's time on its thousands of general-integer columns, while the caller
#: brings the plans it already has as the start: off, these programs prove 2-3x sooner.
_QUIET_HEURISTICS = {"mip_heuristic_run_rins": False, "mip_heuristic_run_rens": False,
                     "mip_heuristic_run_root_reduced_cost": False}


def integer_program(c, A, lb, ub, upper, time_limit, start=None):
    """``max c @ x`` over integers ``0 <= x <= upper`` with ``lb <= A @ x <= ub`` (HiGHS), as an :class:`IntegerResult`.

    ``upper``: one bound for every column or one per column. ``start``: a
    feasible ``x`` to begin from (its value prunes the search).
    """
    import highspy

    c = np.asarray(c, dtype=float)
    h = _boxed_max(c, A, lb, ub, upper, time_limit, integer=True, options={"mip_rel_gap": 0.0, **_QUIET_HEURISTICS})
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = np.asarray(start, dtype=float)
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    if status == highspy.HighsModelStatus.kInfeasible:
        return IntegerResult("infeasible", None, None, -np.inf)
    bound = -float(info.mip_dual_bound) if np.isfinite(info.mip_dual_bound) else np.inf
    x = None
    if info.primal_solution_status == 2:              # feasible
        x = np.round(np.asarray(h.getSolution().col_value)).astype(int)
    optimal = status == highspy.HighsModelStatus.kOptimal
    if optimal and x is not None:
        bound = min(bound, float(c @ x))
    return IntegerResult("optimal" if optimal else "stopped", x, None if x is None else float(c @ x), bound)
