"""Tests of tuna_lab.model.ranks.assign_ranks: numbering threads so that (2) holds."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from strategies import rank_problems
from tuna_lab.errors import ModelError
from tuna_lab.model.ranks import assign_ranks


def check_ranks(main, others, cap, out):
    W, C = others.shape
    T = int(others[0].sum()) + 1 if W else 1
    assert out.shape == (W, T)
    np.testing.assert_array_equal(out[:, 0], main)
    assert np.all((out >= 0) & (out < C))
    # per-worker counts of non-main threads are preserved
    for w in range(W):
        np.testing.assert_array_equal(np.bincount(out[w, 1:], minlength=C), others[w])
    # each rank has at most cap threads per core
    for t in range(T):
        assert np.bincount(out[:, t], minlength=C).max() <= cap, (t, out)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rank_problems())
def test_assign_ranks_property(problem):
    main, others, cap = problem
    out = assign_ranks(main, others, cap)
    check_ranks(main, others, cap, out)


def test_docstring_example_is_valid():
    main, others = np.array([0, 1]), np.array([[0, 1, 1], [1, 0, 1]])
    check_ranks(main, others, 1, assign_ranks(main, others, cap=1))


def test_tight_latin_square():
    """W = C = T - 1 workers, each with one thread on every core: a Latin square."""
    n = 5
    others = np.ones((n, n), dtype=int)
    out = assign_ranks(np.arange(n), others, 1)
    check_ranks(np.arange(n), others, 1, out)
    for t in range(1, n + 1):
        assert sorted(out[:, t].tolist()) == list(range(n))


def test_stacked_threads_with_cap_two():
    # 4 workers on 2 cores, cap = ceil(4/2) = 2; core 0 carries 2*(T-1) = 6 peers.
    main = np.array([0, 0, 1, 1])
    others = np.array([[3, 0], [2, 1], [1, 2], [0, 3]])
    out = assign_ranks(main, others, 2)
    check_ranks(main, others, 2, out)


def test_single_thread_workers():
    out = assign_ranks(np.array([2, 0, 1]), np.zeros((3, 4), dtype=int), 1)
    np.testing.assert_array_equal(out, [[2], [0], [1]])


def test_unequal_rows_are_rejected():
    with pytest.raises(ModelError):
        assign_ranks(np.array([0, 1]), np.array([[1, 1], [1, 0]]), 1)


def test_impossible_counts_are_rejected():
    # Both workers put both peers on core 0: 4 > cap * (T - 1) = 2.
    with pytest.raises(ModelError):
        assign_ranks(np.array([1, 1]), np.array([[2, 0], [2, 0]]), 1)
