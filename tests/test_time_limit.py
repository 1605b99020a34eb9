"""The time limit of a solve is a deadline: every stage, HiGHS included, ends by it.

These are correctness tests of the deadline, not benchmarks: each case is
one that is not proven within its limit (or is kept from being proven by
``prove="solver"``), so the run must stop early and return what it has.
The tests allow the limit + 1.5 s: the machine running them has 2 CPUs
shared with other jobs, and a test that fails on a busy machine proves
nothing. The strict goal (limit + 0.5 s) is measured by ``tuna-lab bench
solver --scale-only`` (docs/solver-bench.md).
"""

import multiprocessing
import time

import pytest

from tuna_lab import Topology, TunaModel
from tuna_lab.errors import NoSolutionError

MARGIN = 1.5


@pytest.fixture(scope="module")
def epyc():
    return Topology.preset("epyc-9654-2s")


def _timed_solve(model, **kw):
    t0 = time.perf_counter()
    mapping = model.solve(**kw)
    return mapping, time.perf_counter() - t0


def _check_answer(model, mapping):
    """A mapping that keeps every family, with a certified bound and gap."""
    inst = model.instance
    assert mapping.assignment.shape == (inst.W, inst.T)
    assert mapping.verify() == []
    assert mapping.gap is not None and mapping.gap >= 0
    assert mapping.bound is not None and mapping.bound >= model.value(mapping.positions) - 1e-6
    cert = mapping.certificate
    assert cert["name"] != "none" and cert["objective"] == pytest.approx(model.value(mapping.positions))
    assert cert["bound"] == pytest.approx(mapping.bound) and cert["proven"] == mapping.proven_optimal


@pytest.mark.parametrize("workers, threads, limit", [(40, 12, 2.0), (36, 10, 1.0), (28, 14, 3.0)])
def test_uneven_compact_shapes_return_by_the_limit(epyc, workers, threads, limit):
    model = TunaModel(workers, threads, epyc, "compact")
    mapping, wall = _timed_solve(model, time_limit=limit)
    assert wall <= limit + MARGIN, f"{workers}x{threads}: {wall:.2f} s for a {limit} s limit"
    _check_answer(model, mapping)
    assert multiprocessing.active_children() == []     # no HiGHS process left behind


def test_a_limit_too_short_for_highs_returns_the_constructive_mapping(epyc):
    # prove="solver" keeps the bound from ending the run, and on this
    # 750k-nonzero model HiGHS's presolve alone would outlast the limit.
    model = TunaModel(64, 6, epyc, "compact")
    mapping, wall = _timed_solve(model, time_limit=2.0, prove="solver")
    assert wall <= 2.0 + MARGIN
    _check_answer(model, mapping)
    assert not mapping.proven_optimal and mapping.status in ("constructed", "time_limit")
    assert multiprocessing.active_children() == []


def test_no_start_and_no_time_raises_by_the_deadline(epyc):
    # without the constructive start nothing is found in 1 s: the error, in time
    model = TunaModel(32, 16, epyc, "compact")
    t0 = time.perf_counter()
    with pytest.raises(NoSolutionError, match="time limit"):
        model.solve(time_limit=1.0, warm_start=False)
    assert time.perf_counter() - t0 <= 1.0 + MARGIN
    assert multiprocessing.active_children() == []


def test_time_limit_leaves_small_models_proven(epyc):
    # a limit does not cost the cases the bound proves at once their proof
    model = TunaModel(96, 4, epyc, "compact")
    mapping, wall = _timed_solve(model, time_limit=5.0)
    assert mapping.proven_optimal and mapping.gap == 0.0
    assert mapping.certificate["name"] != "highs" and mapping.certificate["proven"]


def test_work_in_a_child_ends_by_its_timeout():
    """HiGHS may run many seconds past its time limit in one uninterruptible step; a program run in a
    child process (:func:`tuna_lab.model.highs.programs.in_child`) is killed at its timeout instead, and
    leaves no process behind."""
    import psutil

    from tuna_lab.model.highs.programs import in_child

    t0 = time.perf_counter()
    assert in_child(time.sleep, (30,), 0.5) is None
    assert time.perf_counter() - t0 < 0.5 + MARGIN
    assert not psutil.Process().children(recursive=True)
    assert in_child(divmod, (7, 2), 30) == (True, (3, 1))
    ok, reason = in_child(int, ("seven",), 30)
    assert not ok and "seven" in reason


def test_a_big_restricted_program_solves_alike_in_a_child(monkeypatch):
    """The restricted programs of the fragment search big enough to run in a child give what they
    give in process."""
    import numpy as np

    from tuna_lab.model.highs import programs as _highs

    rng = np.random.default_rng(7)
    n = 1200
    c = rng.integers(1, 50, n).astype(float)
    A = rng.integers(0, 4, (6, n)).astype(float)
    lb, ub = np.zeros(6), np.full(6, 40.0)
    monkeypatch.setattr(_highs, "_CHILD_COLUMNS", 10 * n)
    here = _highs.integer_program(c, A, lb, ub, 3, time_limit=120)
    monkeypatch.setattr(_highs, "_CHILD_COLUMNS", n)
    there = _highs.integer_program(c, A, lb, ub, 3, time_limit=120)
    assert here.status == there.status == "optimal"
    assert there.value == here.value == float(c @ there.x) and np.all(A @ there.x <= ub)
