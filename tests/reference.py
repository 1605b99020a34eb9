"""An independent reference of the Tuna ILP, for the model tests: equations (1)-(12) in numpy.

Everything here is re-derived from the article's equations (1)-(12) and the
SPEC's definitions with plain numpy, without calling the library's family
checks, so that the solver, the library's checks and this reference can be
compared with each other. :func:`brute_force` enumerates every assignment of
a tiny instance.

Assignments are ``(N, W, T)`` arrays of core *positions* ``0..C-1`` (the
index into ``topology.cpus``); column ``t = 0`` is the main thread.
"""

import math

import numpy as np
import pytest

__all__ = ["MAX_ENUMERATION", "CONSTRAINT_KEYS", "ALL_KEYS", "bounds", "scenario3", "uniform_smt",
           "one_hot_counts", "upper_pair_sum", "objective_parts", "objective_of", "model_objective",
           "feasible_mask", "all_assignments", "brute_force"]

#: Largest number of assignments :func:`brute_force` will enumerate.
MAX_ENUMERATION = 300_000

#: Keys of every constraint family (objective terms excluded).
CONSTRAINT_KEYS = ("1", "2", "3", "8", "8p", "9-10", "11-12", "11p-12p")
ALL_KEYS = ("1", "2", "3", "4-5", "6-7", "8", "8p", "9-10", "11-12", "11p-12p")


# -- the article's numbers, written out again ------------------------------------

def bounds(W, T, C):
    """``(L, U, r)`` of equation (8): floor(WT/C), ceil(WT/C), WT mod C."""
    return (W * T) // C, math.ceil(W * T / C), (W * T) % C


def scenario3(W, T, C):
    return W * T > C and (W * T) % C > 0


def uniform_smt(core):
    counts = np.bincount(np.asarray(core))
    return bool(np.all(counts == counts[0]))


# -- vectorised counts over a batch of assignments ----------------------------------

def one_hot_counts(assign, C):
    """``(N, W, T)`` positions -> ``(N, W, T, C)`` one-hot."""
    return (np.asarray(assign)[..., None] == np.arange(C)).astype(np.int64)


def upper_pair_sum(X, D):
    """``sum_{c<c'} X_c X_c' D[c, c']`` over the last axis of ``X``."""
    Du = np.triu(np.asarray(D, dtype=float), 1)
    return np.einsum("...c,cd,...d->...", X.astype(float), Du, X.astype(float))


def objective_parts(assign, topology, mode, costs=None):
    """``(f_main, f_mode)`` for a batch ``(N, W, T)`` (or a single ``(W, T)``) of positions."""
    assign = np.asarray(assign)
    single = assign.ndim == 2
    if single:
        assign = assign[None]
    C = topology.n_logical
    D = topology.distance(costs)
    Y = one_hot_counts(assign, C)                # (N, W, T, C)
    A = Y[:, :, 0, :].sum(axis=1)                # (N, C)   main threads per core
    B = Y.sum(axis=2)                            # (N, W, C) threads of w per core
    s = 1.0 if mode == "scatter" else -1.0
    f_main = upper_pair_sum(A, D)
    f_mode = s * upper_pair_sum(B, D).sum(axis=1)
    if single:
        return float(f_main[0]), float(f_mode[0])
    return f_main, f_mode


def objective_of(assign, topology, mode, costs=None):
    """``f_main + f_mode``: what :attr:`Mapping.objective` reports, whatever the families."""
    f_main, f_mode = objective_parts(assign, topology, mode, costs)
    return f_main + f_mode


def feasible_mask(assign, topology, keys=ALL_KEYS):
    """Which assignments of the batch satisfy every constraint family in ``keys``.

    Written from the article: (2)/(3) use cap 1 when ``W <= C`` / ``T <= C``
    and ``ceil(W/C)`` / ``ceil(T/C)`` otherwise (the library's generalisation);
    (8+) and (11+)-(12+) follow the physical-core derivation in the library's
    docstrings (only with uniform SMT, ``P < C``).
    """
    assign = np.asarray(assign)
    N, W, T = assign.shape
    C = topology.n_logical
    core = np.asarray(topology.core)
    P = int(core.max()) + 1
    Y = one_hot_counts(assign, C)
    A = Y[:, :, 0, :].sum(axis=1)                # (N, C)
    B = Y.sum(axis=2)                            # (N, W, C)
    R = Y.sum(axis=1)                            # (N, T, C) threads of rank t per core
    load = B.sum(axis=1)                         # (N, C)
    member = (core[:, None] == np.arange(P)).astype(np.int64)   # (C, P)
    pload = load @ member                        # (N, P)
    pmain = A @ member
    L, U, r = bounds(W, T, C)
    ok = np.ones(N, dtype=bool)
    keys = set(keys)
    # (1) holds by construction: every enumerated thread sits on exactly one core.
    if "2" in keys:
        cap = 1 if W <= C else math.ceil(W / C)
        ok &= (R <= cap).all(axis=(1, 2))
    if "3" in keys:
        cap = 1 if T <= C else math.ceil(T / C)
        ok &= (B <= cap).all(axis=(1, 2))
    if "8" in keys:
        ok &= ((load >= L) & (load <= U)).all(axis=1)
    smt_ok = P < C and uniform_smt(core)
    Lp, Up, rp = bounds(W, T, P)
    if "8p" in keys and smt_ok:
        ok &= ((pload >= Lp) & (pload <= Up)).all(axis=1)
    if "11-12" in keys and scenario3(W, T, C):
        events = ((load == U) & (A > 0)).sum(axis=1)
        ok &= events <= max(0, W - C + r)
    if "11p-12p" in keys and smt_ok and scenario3(W, T, P):
        events = ((pload == Up) & (pmain > 0)).sum(axis=1)
        ok &= events <= max(0, min(W, P) - P + rp)
    return ok


def all_assignments(W, T, C):
    """Every ``(W, T)`` assignment of threads to ``C`` core positions, shape (C**(WT), W, T)."""
    n = W * T
    total = C ** n
    if total > MAX_ENUMERATION:
        pytest.skip(f"{total} assignments is too many to enumerate")
    idx = np.arange(total, dtype=np.int64)
    digits = (idx[:, None] // (C ** np.arange(n, dtype=np.int64))) % C
    return digits.reshape(total, W, T)


def model_objective(assign, topology, mode, keys=ALL_KEYS, costs=None):
    """The objective a model with the families ``keys`` maximises, for a batch (or one) assignment.

    ``f_main`` counts only with (4)+(5) in ``keys`` and ``f_mode`` only with
    (6)+(7): a model without an objective term does not score it.
    """
    f_main, f_mode = objective_parts(assign, topology, mode, costs)
    total = np.zeros_like(np.asarray(f_main, dtype=float))
    if "4-5" in keys:
        total = total + f_main
    if "6-7" in keys:
        total = total + f_mode
    return total


def brute_force(W, T, topology, mode="scatter", keys=ALL_KEYS, costs=None):
    """``(best objective or None, feasible assignments, their objectives)`` by enumeration.

    Feasible under the constraint families in ``keys``, scored by the
    objective terms in ``keys`` (:func:`model_objective`).
    """
    assign = all_assignments(W, T, topology.n_logical)
    mask = feasible_mask(assign, topology, keys)
    feasible = assign[mask]
    if feasible.shape[0] == 0:
        return None, feasible, np.zeros(0)
    values = model_objective(feasible, topology, mode, keys, costs)
    return float(np.max(values)), feasible, values
