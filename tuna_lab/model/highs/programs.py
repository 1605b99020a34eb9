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

__all__ = ["new_highs", "fresh_scheduler", "in_child", "highs_lp", "boxed_max", "central_duals",
           "integer_program", "IntegerResult"]


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


def in_child(target, args, timeout):
    """``target(*args)`` in a forked process, killed if it has not answered within ``timeout`` seconds.

    Returns ``(True, value)``, ``(False, reason)`` when it raised or died,
    or ``None`` at the timeout. For HiGHS, which checks its time limit only
    now and then: on some programs it goes on for many seconds past it in
    one step (node propagation at the root) that no callback interrupts. In
    a process that may not have children (a daemon), ``target`` runs here.
    """
    import multiprocessing

    if multiprocessing.current_process().daemon:
        try:
            return True, target(*args)
        except Exception as exc:
            return False, _one_line(exc)
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(send, target, args, os.getpid()), name="tuna-lab-highs", daemon=True)
    proc.start()
    send.close()
    try:
        # poll also returns on a dead child (end of file), then recv raises EOFError
        if not receive.poll(max(0.0, timeout)):
            return None
        try:
            return receive.recv()
        except EOFError:
            return False, f"the HiGHS process ended with status {proc.exitcode}"
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        receive.close()


def _child(conn, target, args, parent):
    """In the forked child of :func:`in_child`: run, send the outcome to the parent, end."""
    _die_with(parent)
    try:
        # a parent that ran HiGHS in-process before leaves the child HiGHS's scheduler without its
        # workers: start it afresh
        fresh_scheduler()
        out = True, target(*args)
    except BaseException as exc:   # the parent reports it
        out = False, _one_line(exc)
    conn.send(out)
    conn.close()


def _die_with(parent):
    """Have the kernel kill this (forked) process when its parent ends (Linux ``PR_SET_PDEATHSIG``).

    A parent killed outright (SIGKILL, SIGTERM without cleanup) would
    otherwise leave HiGHS running on its own until its time limit.
    """
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:              # it ended before the call
        os._exit(1)


def _one_line(exc):
    from ..._checks import one_line

    return one_line(exc)


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


def boxed_max(c, A, lb, ub, upper, time_limit, integer=False, options=None):
    """A quiet ``highspy.Highs`` holding ``max c @ x``, ``lb <= A @ x <= ub``, ``0 <= x <= upper``
    (integer ``x`` if ``integer``; ``upper`` one for all or one per column; ``A`` dense or scipy
    sparse), with ``options`` and the time limit set."""
    import scipy.sparse as sp

    n = len(c)
    lp = highs_lp(-np.asarray(c, dtype=float), sp.csc_matrix(A, dtype=float), lb, ub,  # HiGHS minimises
                  np.zeros(n), np.broadcast_to(np.asarray(upper, dtype=float), (n,)).copy(),
                  integer=np.arange(n) if integer else ())
    fresh_scheduler()
    h = new_highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", max(0.05, float(time_limit)))
    for key, value in (options or {}).items():
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

    # (without presolve: after it, an interior point that is not crossed over to a vertex sometimes
    # comes back from postsolve as status "unknown" - on 31x16 compact without the physical analogues,
    # which then priced with the vertex's duals: 43,000 columns within the slack instead of 2,500)
    h = boxed_max(c, A, lb, ub, upper, time_limit, integer=False,
                  options={"solver": "ipm", "run_crossover": "off", "presolve": "off"})
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


#: HiGHS's options for a restricted cutting-stock program (a few dozen rows, thousands of
#: general-integer columns):
#:
#: * its sub-MIP heuristics (RINS, RENS, root reduced cost) spend most of the time, while the
#:   caller brings the plans it already has as the start: off, these programs prove 2-3x sooner;
#: * full presolve sometimes runs for seconds on them (3.9 s of 3.9 on one) and takes out little:
#:   the light one (``presolve_mode`` 2);
#: * strong branching on every column until its pseudocosts are reliable takes most of the tree
#:   search (23,000 of 27,000 simplex iterations on one): pseudocosts from the start
#:   (``mip_pscost_minreliable`` 0).
#:
#: Together, on the 12 programs of 0.3 s or more that epyc-9654-2s's compact 28x14-33x16 without
#: the physical analogues solve (HiGHS 1.16, 3 random seeds): 20-27 s in all against 33-42 s,
#: the slowest 3.4-4.3 s against 6.3-8.9 s.
_RESTRICTED_OPTIONS = {"mip_heuristic_run_rins": False, "mip_heuristic_run_rens": False,
                       "mip_heuristic_run_root_reduced_cost": False, "presolve_mode": 2,
                       "mip_pscost_minreliable": 0}


#: Programs of at least this many columns given at least ``_CHILD_S`` seconds run in a child process
#: (:func:`in_child`), killed ``_CHILD_GRACE_S`` after their time limit.
_CHILD_COLUMNS = 1000
_CHILD_S = 1.0
_CHILD_GRACE_S = 0.2


def integer_program(c, A, lb, ub, upper, time_limit, start=None, cutoff=None):
    """``max c @ x`` over integers ``0 <= x <= upper`` with ``lb <= A @ x <= ub`` (HiGHS), as an :class:`IntegerResult`.

    ``upper``: one bound for every column or one per column. ``start``: a
    feasible ``x`` to begin from (its value prunes the search). ``cutoff``:
    a value ``c @ x`` must beat; ``"infeasible"`` then when none does. A big
    program runs in a child process, so that it ends by its time limit
    (and a little) whatever HiGHS does; it is ``"stopped"`` with nothing
    found when it had to be killed.
    """
    if len(c) >= _CHILD_COLUMNS and time_limit >= _CHILD_S:
        out = in_child(_integer_program, (c, A, lb, ub, upper, time_limit, start, cutoff),
                       time_limit + _CHILD_GRACE_S)
        if out is None:
            return IntegerResult("stopped", None, None, np.inf)
        ok, value = out
        if not ok:
            raise RuntimeError(f"HiGHS failed on a restricted program: {value}")
        return value
    return _integer_program(c, A, lb, ub, upper, time_limit, start, cutoff)


def _integer_program(c, A, lb, ub, upper, time_limit, start=None, cutoff=None):
    import highspy

    c = np.asarray(c, dtype=float)
    h = boxed_max(c, A, lb, ub, upper, time_limit, integer=True, options={"mip_rel_gap": 0.0, **_RESTRICTED_OPTIONS})
    if cutoff is not None:
        h.setOptionValue("objective_bound", -float(cutoff))       # (HiGHS minimises -c @ x)
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
