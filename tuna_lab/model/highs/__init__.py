"""HiGHS, the solver behind every proof the fast route cannot give.

:mod:`~tuna_lab.model.highs.solve` runs HiGHS on a model's cvxpy problem
(compiled once, warm-started from a mapping, stopped at the deadline in a
forked child); :mod:`~tuna_lab.model.highs.programs` holds the small
``highspy`` helpers the fast route's own programs use (a quiet solver, an
integer program, an LP's duals).
"""
