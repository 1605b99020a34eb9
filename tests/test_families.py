"""Unit tests of the constraint families' numpy checks, against hand-built assignments.

Each family is checked on assignments that satisfy it and on ones that
violate it (messages, indices and amounts), for the generalised caps when
``W > C`` or ``T > C``, and for its self-description. The last tests compare
the families' checks, and the rows each family builds in both encodings,
with the independent reference in ``reference.py`` on random assignments.
"""

import math

import cvxpy as cp
import numpy as np
import pytest

from reference import ALL_KEYS, feasible_mask, objective_parts
from tuna_lab import Topology, TunaModel
from tuna_lab.errors import ModelError
from tuna_lab.model.families import (DEFAULT_FAMILIES, FAMILY_TYPES, Family, LogicalBalance,
                                     MainIndicator, MainLoadCap, MainSpread, PhysicalBalance,
                                     PhysicalMainLoadCap, SingleCore, UniqueRankCores,
                                     UniqueWorkerCores, Violation, WorkerDistance)
from tuna_lab.model.caps import Caps
from tuna_lab.model.instance import Instance

CORE4 = Topology.synthetic("core:4 pu:1")        # C=4, P=4, no shared cache: d=200
SMT2x2 = Topology.synthetic("core:2 pu:2")       # C=4, P=2: cpus 0,1 on core 0; 2,3 on core 1
TREE = Topology.synthetic("l3:1 l2:2 core:1 pu:2")  # d: siblings 10, else 50


def inst(W, T, topo=CORE4, mode="scatter"):
    return Instance(W, T, topo, mode)


def arr(rows):
    return np.array(rows, dtype=int)


def check_consistent(fam, assign, instance):
    """residual is all zero iff there is no violation; amounts are its positive entries."""
    viol = fam.violations(assign, instance)
    res = np.asarray(fam.residual(assign, instance), dtype=float)
    assert np.all(res >= 0)
    assert (len(viol) == 0) == bool(np.all(res == 0))
    assert sorted(v.amount for v in viol) == sorted(res[res > 0].tolist())
    for v in viol:
        assert isinstance(v, Violation)
        assert v.family == fam.key
        assert v.amount > 0
        assert isinstance(v.message, str) and v.message
    return viol


# -- (1) ----------------------------------------------------------------------------

def test_single_core_accepts_every_valid_position():
    i = inst(2, 2)
    assert check_consistent(SingleCore(), arr([[0, 3], [1, 2]]), i) == []


def test_single_core_flags_unassigned_and_out_of_range_threads():
    i = inst(2, 2)
    # -1 is the mark of an unassigned thread: (1)'s violation. A position past the topology's cores is
    # no assignment at all, refused before any family looks at it.
    viol = check_consistent(SingleCore(), arr([[0, -1], [1, 2]]), i)
    assert [v.index for v in viol] == [(0, 1)] and [v.amount for v in viol] == [1.0]
    assert viol[0].message == "thread 1 of worker 0 is not on a core of this topology"
    with pytest.raises(ModelError, match="got 4 for thread 0 of worker 1"):
        SingleCore().violations(arr([[0, 1], [4, 2]]), i)


# -- (2) ----------------------------------------------------------------------------

def test_unique_rank_cores_satisfied_and_violated():
    i = inst(2, 2)
    fam = UniqueRankCores()
    # Same worker on one core is not (2)'s business (that is (3)).
    assert check_consistent(fam, arr([[0, 0], [1, 2]]), i) == []
    viol = check_consistent(fam, arr([[0, 1], [0, 2]]), i)
    assert len(viol) == 1
    assert viol[0].index == (0, 0)
    assert viol[0].amount == 1.0
    assert viol[0].message == "cpu 0 holds 2 threads of rank 0, above 1"
    viol = check_consistent(fam, arr([[0, 3], [1, 3]]), i)
    assert [(v.index, v.amount) for v in viol] == [((1, 3), 1.0)]
    assert "rank 1" in viol[0].message


def test_unique_rank_cores_generalised_when_more_workers_than_cores():
    i = inst(5, 1)            # W=5 > C=4: at most ceil(5/4) = 2 main threads per core
    fam = UniqueRankCores()
    assert i.cap_rank == 2
    assert not fam.applies(i)
    assert "ceil(W/C) = 2" in fam.note(i)
    assert check_consistent(fam, arr([[0], [0], [1], [2], [3]]), i) == []
    viol = check_consistent(fam, arr([[0], [0], [0], [1], [2]]), i)
    assert [(v.index, v.amount) for v in viol] == [((0, 0), 1.0)]
    assert viol[0].message == "cpu 0 holds 3 threads of rank 0, above 2"
    viol = check_consistent(fam, arr([[0], [0], [0], [0], [0]]), i)
    assert viol[0].amount == 3.0


def test_unique_rank_cores_applies_when_workers_fit():
    fam = UniqueRankCores()
    assert fam.applies(inst(4, 1))
    assert fam.note(inst(4, 1)) == "at most 1 thread of each rank per core (W <= C)"


# -- (3) ----------------------------------------------------------------------------

def test_unique_worker_cores_satisfied_and_violated():
    i = inst(2, 2)
    fam = UniqueWorkerCores()
    # Two workers' threads may share a core under (3).
    assert check_consistent(fam, arr([[0, 1], [0, 1]]), i) == []
    viol = check_consistent(fam, arr([[0, 0], [1, 2]]), i)
    assert [(v.index, v.amount) for v in viol] == [((0, 0), 1.0)]
    assert viol[0].message == "cpu 0 holds 2 threads of worker 0, above 1"


def test_unique_worker_cores_generalised_when_more_threads_than_cores():
    i = inst(1, 5)            # T=5 > C=4: at most ceil(5/4) = 2 threads of a worker per core
    fam = UniqueWorkerCores()
    assert i.cap_worker == 2
    assert not fam.applies(i)
    assert "ceil(T/C) = 2" in fam.note(i)
    assert check_consistent(fam, arr([[0, 0, 1, 2, 3]]), i) == []
    viol = check_consistent(fam, arr([[0, 0, 0, 1, 2]]), i)
    assert [(v.index, v.amount) for v in viol] == [((0, 0), 1.0)]
    assert viol[0].message == "cpu 0 holds 3 threads of worker 0, above 2"
    assert fam.applies(inst(1, 4))
    assert "T <= C" in fam.note(inst(1, 4))


# -- (4)+(5), (6)+(7) -----------------------------------------------------------------

def test_objective_values_by_hand():
    # Tree: d(0,1)=10 (L2 siblings), d(0,2)=50.
    i = inst(2, 2, TREE)
    a = arr([[0, 1], [2, 3]])
    assert MainSpread().value(a, i) == 50.0           # mains on 0 and 2
    assert WorkerDistance().value(a, i) == 20.0       # 10 + 10
    a = arr([[0, 2], [1, 3]])
    assert MainSpread().value(a, i) == 10.0
    assert WorkerDistance().value(a, i) == 100.0
    ic = inst(2, 2, TREE, mode="compact")
    assert WorkerDistance().value(a, ic) == -100.0
    # Several main threads on one core: A_c counts them, same-core pairs cost nothing.
    i3 = inst(3, 1, TREE)
    assert MainSpread().value(arr([[0], [0], [2]]), i3) == 2 * 50.0
    # Within-worker distance of threads stacked on one core is zero.
    assert WorkerDistance().value(arr([[1, 1, 1]]), inst(1, 3, TREE)) == 0.0
    assert WorkerDistance().value(arr([[1, 1, 0]]), inst(1, 3, TREE)) == 2 * 10.0


def test_objective_families_have_no_violations():
    i = inst(2, 2)
    for fam in (MainSpread(), WorkerDistance()):
        assert fam.kind == "objective"
        assert fam.violations(arr([[0, 0], [0, 0]]), i) == []
        assert np.all(np.asarray(fam.residual(arr([[0, 0], [0, 0]]), i)) == 0)


def test_worker_distance_note_names_the_mode():
    assert "maximise" in WorkerDistance().note(inst(2, 2))
    assert "minimise" in WorkerDistance().note(inst(2, 2, mode="compact"))


# -- (8) ----------------------------------------------------------------------------

def test_logical_balance_docstring_example(xeon):
    i = Instance(2, 2, xeon)
    viol = check_consistent(LogicalBalance(), arr([[0, 0], [1, 2]]), i)
    assert viol[0].message == "cpu 0 carries 2 threads, above U=1"


def test_logical_balance_above_and_below():
    i = inst(2, 2)            # WT = C = 4: L = U = 1
    fam = LogicalBalance()
    assert check_consistent(fam, arr([[0, 1], [2, 3]]), i) == []
    viol = check_consistent(fam, arr([[0, 0], [1, 2]]), i)
    assert {(v.index, v.amount) for v in viol} == {((0,), 1.0), ((3,), 1.0)}
    msgs = sorted(v.message for v in viol)
    assert msgs == ["cpu 0 carries 2 threads, above U=1",
                    "cpu 3 carries 0 threads, below L=1"]
    viol = check_consistent(fam, arr([[0, 0], [0, 0]]), i)
    assert {(v.index, v.amount) for v in viol} == {((0,), 3.0), ((1,), 1.0), ((2,), 1.0), ((3,), 1.0)}


def test_logical_balance_scenario_1_has_no_lower_bound():
    i = inst(1, 2)            # WT=2 < C=4: L=0, U=1
    fam = LogicalBalance()
    assert (i.L, i.U) == (0, 1)
    assert check_consistent(fam, arr([[0, 3]]), i) == []
    assert fam.note(i) == "every logical core carries 0..1 threads"


def test_logical_balance_scenario_3():
    i = inst(3, 3)            # WT=9, C=4: L=2, U=3, r=1
    fam = LogicalBalance()
    assert (i.L, i.U, i.r) == (2, 3, 1)
    assert check_consistent(fam, arr([[0, 1, 2], [1, 2, 3], [2, 3, 0]]), i) == []
    viol = check_consistent(fam, arr([[0, 1, 2], [1, 2, 3], [2, 3, 2]]), i)
    assert {(v.index, v.amount) for v in viol} == {((2,), 1.0), ((0,), 1.0)}


# -- (8+) ---------------------------------------------------------------------------

def test_physical_balance_satisfied_and_violated():
    i = inst(2, 2, SMT2x2)    # WT=4, P=2: L+ = U+ = 2
    fam = PhysicalBalance()
    assert fam.applies(i) and fam.active(i)
    assert (i.L_phys, i.U_phys) == (2, 2)
    assert fam.note(i) == "every physical core carries 2..2 threads"
    # Logically balanced (one thread per logical core) and physically balanced.
    assert check_consistent(fam, arr([[0, 2], [1, 3]]), i) == []
    # Logically balanced, but not physically: (8) alone allows this.
    assert LogicalBalance().violations(arr([[0, 1], [1, 0]]), i) != []
    viol = check_consistent(fam, arr([[0, 1], [0, 1]]), i)
    assert {(v.index, v.amount) for v in viol} == {((0,), 2.0), ((1,), 2.0)}
    msgs = sorted(v.message for v in viol)
    assert msgs == ["physical core 0 carries 4 threads, outside L+=2..U+=2",
                    "physical core 1 carries 0 threads, outside L+=2..U+=2"]


def test_physical_balance_catches_what_logical_balance_allows():
    i = inst(3, 2, SMT2x2)    # WT=6, C=4: L=1, U=2; P=2: L+ = U+ = 3
    a = arr([[0, 2], [1, 3], [0, 1]])   # logical loads 2,2,1,1: fine for (8)
    assert LogicalBalance().violations(a, i) == []
    viol = check_consistent(PhysicalBalance(), a, i)
    assert {(v.index, v.amount) for v in viol} == {((0,), 1.0), ((1,), 1.0)}


def test_physical_balance_inactive_without_smt_or_with_mixed_smt(xeon):
    fam = PhysicalBalance()
    i = inst(2, 2)            # no SMT
    assert not fam.applies(i) and not fam.active(i)
    assert "no SMT" in fam.note(i)
    assert check_consistent(fam, arr([[0, 0], [0, 0]]), i) == []
    assert np.asarray(fam.residual(arr([[0, 0], [0, 0]]), i)).size == 0
    mixed = xeon.restrict([0, 1, 16])   # physical core 0 has two PUs, core 1 one
    im = Instance(1, 3, mixed)
    assert not im.uniform_smt
    assert not fam.applies(im)
    assert fam.violations(np.array([[0, 0, 0]]), im) == []


# -- (9)+(10) ---------------------------------------------------------------------

def test_main_indicator_cannot_be_violated_and_is_active_in_scenario_3():
    fam = MainIndicator()
    i3 = inst(3, 3)
    assert fam.active(i3)
    assert fam.note(i3) == fam.description
    assert fam.violations(arr([[0, 0, 0]] * 3), i3) == []
    assert np.asarray(fam.residual(arr([[0, 0, 0]] * 3), i3)).size == 0
    i1 = inst(2, 2)
    assert not fam.active(i1)
    assert "scenario 3" in fam.note(i1)


# -- (11)+(12) ------------------------------------------------------------------------

def test_main_load_cap_scenario_3_bound_zero():
    i = inst(3, 3)            # WT=9, C=4, L=2, U=3, r=1: bound max(0, 3-4+1) = 0
    fam = MainLoadCap()
    assert i.scenario3 and fam.applies(i) and fam.active(i)
    assert fam.bound(i) == 0
    assert fam.note(i) == "at most 0 cores with a main thread carry U=3 threads"
    # Mains on cores 0, 1, 2 (load 2 each); core 3 carries U=3 peer threads.
    ok = arr([[0, 3, 1], [1, 3, 2], [2, 3, 0]])
    assert fam.violations(ok, i) == []
    check_consistent(fam, ok, i)
    # Main of worker 0 on core 3, which carries U=3 threads.
    bad = arr([[3, 0, 1], [1, 3, 2], [2, 3, 0]])
    viol = check_consistent(fam, bad, i)
    assert len(viol) == 1
    assert viol[0].index == () and viol[0].amount == 1.0
    assert viol[0].message == "1 cores with a main thread carry U=3 threads (cpus [3]), above 0"


def test_main_load_cap_positive_bound():
    i = inst(5, 2)            # WT=10, C=4, L=2, U=3, r=2: W > C - r, bound 5-4+2 = 3
    fam = MainLoadCap()
    assert fam.bound(i) == 3
    assert "at most 3 cores" in fam.note(i)
    # Loads 3,3,2,2; mains on 0,0,1,2,3: events on cores 0 and 1 -> 2 <= 3.
    a = arr([[0, 1], [0, 1], [1, 2], [2, 3], [3, 0]])
    assert check_consistent(fam, a, i) == []


def test_main_load_cap_does_not_apply_outside_scenario_3():
    fam = MainLoadCap()
    for W, T in [(1, 3), (2, 2), (2, 4)]:    # WT < C, WT = C, WT = 2C
        i = inst(W, T)
        assert not i.scenario3
        assert not fam.applies(i) and not fam.active(i)
        assert "not scenario 3" in fam.note(i)
        assert np.asarray(fam.residual(arr([[0] * T] * W), i)).size == 0
        assert fam.violations(arr([[0] * T] * W), i) == []


# -- (11+)+(12+) ----------------------------------------------------------------------

def test_physical_main_load_cap():
    i = inst(1, 3, SMT2x2)    # WT=3 > P=2, r+=1, L+=1, U+=2; bound max(0, 1-2+1) = 0
    fam = PhysicalMainLoadCap()
    assert i.scenario3_phys and fam.applies(i)
    assert (i.L_phys, i.U_phys, i.r_phys) == (1, 2, 1)
    assert fam.bound(i) == 0
    assert fam.note(i) == "at most 0 physical cores with a main thread carry U+=2 threads"
    ok = arr([[2, 0, 1]])     # main on physical core 1 (load 1)
    assert check_consistent(fam, ok, i) == []
    bad = arr([[0, 1, 2]])    # main on physical core 0, which carries U+=2
    viol = check_consistent(fam, bad, i)
    assert len(viol) == 1 and viol[0].amount == 1.0
    assert viol[0].message == ("1 physical cores with a main thread carry U+=2 threads "
                               "(cores [0]), above 0")


def test_physical_main_load_cap_bound_with_many_workers():
    i = inst(3, 1, SMT2x2)    # W=3 > P=2: bound max(0, min(3,2) - 2 + 1) = 1
    fam = PhysicalMainLoadCap()
    assert fam.bound(i) == 1
    assert check_consistent(fam, arr([[0], [1], [2]]), i) == []


def test_physical_main_load_cap_does_not_apply():
    fam = PhysicalMainLoadCap()
    assert not fam.applies(inst(3, 3))              # no SMT
    assert not fam.applies(inst(2, 2, SMT2x2))      # WT mod P = 0
    assert not fam.applies(inst(1, 1, SMT2x2))      # WT < P
    assert fam.violations(arr([[0, 0, 0]] * 3), inst(3, 3)) == []
    assert "nothing to add" in fam.note(inst(3, 3))


# -- every family ---------------------------------------------------------------------

CAP_FIELDS = {"rank_cap", "worker_cap", "load", "phys_load", "event_budget", "phys_event_budget",
              "spread_main", "sign"}


def test_every_family_describes_itself():
    keys, equations = set(), []
    for ftype in FAMILY_TYPES:
        fam = ftype()
        assert fam.key and fam.key not in keys
        keys.add(fam.key)
        assert isinstance(fam.equations, tuple) and fam.equations
        assert all(isinstance(e, str) and e for e in fam.equations)
        equations += fam.equations
        assert isinstance(fam.latex, str) and fam.latex.strip()
        assert isinstance(fam.description, str) and fam.description.strip()
        assert fam.kind in ("constraint", "objective")
        assert fam.name == ftype.__name__
        assert fam.symmetric is True          # the counts encoding's symmetry rows rely on it
        # a family implements what its kind needs, not the base class's empty defaults
        assert ftype.constraints is not Family.constraints
        if fam.kind == "objective":
            assert ftype.term is not Family.term and ftype.value is not Family.value
        for W, T in [(1, 1), (2, 2), (3, 3), (5, 1), (1, 5), (6, 3)]:
            for topo in (CORE4, SMT2x2):
                i = inst(W, T, topo)
                assert isinstance(fam.applies(i), bool)
                assert isinstance(fam.active(i), bool)
                assert isinstance(fam.note(i), str) and fam.note(i)
                # every article family speaks to the constructive route and the bound
                part = fam.caps(i)
                assert isinstance(part, dict) and set(part) <= CAP_FIELDS
    assert keys == {"1", "2", "3", "4-5", "6-7", "8", "8p", "9-10", "11-12", "11p-12p"}
    assert len(equations) == len(set(equations)), "an equation number is claimed by two families"
    assert all(set(ftype.requires) <= keys for ftype in FAMILY_TYPES)
    assert {type(f) for f in DEFAULT_FAMILIES} == set(FAMILY_TYPES)
    assert [k for f in FAMILY_TYPES for k in f.equations][:12] == \
        ["1", "2", "3", "4", "5", "6", "7", "8", "8+", "9", "10", "11"]


def test_families_compare_by_type():
    assert LogicalBalance() == LogicalBalance()
    assert LogicalBalance() != PhysicalBalance()
    assert len({LogicalBalance(), LogicalBalance(), MainSpread()}) == 2


@pytest.mark.parametrize("W,T,topo", [(1, 1, CORE4), (2, 2, CORE4), (3, 3, CORE4), (5, 1, CORE4),
                                      (1, 5, CORE4), (5, 2, CORE4), (2, 2, SMT2x2),
                                      (3, 2, SMT2x2), (1, 3, SMT2x2), (3, 1, SMT2x2),
                                      (3, 3, SMT2x2), (2, 3, TREE)])
def test_checks_agree_with_independent_reference(W, T, topo):
    """On random assignments: residual/violations consistent, and the families' verdict
    equals the reference feasibility and objective computed from the article."""
    rng = np.random.default_rng(W * 100 + T * 10 + topo.n_physical)
    C = topo.n_logical
    batch = rng.integers(0, C, size=(200, W, T))
    # Add a few balanced assignments, which are rarer at random.
    flat = np.tile(np.arange(C), -(-W * T // C))[: W * T]
    batch = np.concatenate([batch, np.stack([rng.permutation(flat).reshape(W, T)
                                             for _ in range(150)])])
    ref_ok = feasible_mask(batch, topo)
    f_main, f_mode = objective_parts(batch, topo, "scatter")
    i = inst(W, T, topo)
    ic = inst(W, T, topo, "compact")
    ok = []
    for n, a in enumerate(batch):
        viol = []
        for fam in DEFAULT_FAMILIES:
            viol += check_consistent(fam, a, i)
        ok.append(not viol)
        assert MainSpread().value(a, i) == pytest.approx(f_main[n])
        assert WorkerDistance().value(a, i) == pytest.approx(f_mode[n])
        assert WorkerDistance().value(a, ic) == pytest.approx(-f_mode[n])
    np.testing.assert_array_equal(np.array(ok), ref_ok)


def test_caps_of_the_default_families():
    """Each rule comes from the family that imposes it, with the instance's numbers."""
    i = inst(3, 3, SMT2x2)                  # scenario 3 (U=3, r=1); P=2: L+=4, U+=5, r+=1
    caps = Caps.of(i, DEFAULT_FAMILIES)
    assert caps.understood and caps.unknown == () and caps.symmetric
    assert (caps.rank_cap, caps.worker_cap) == (1, 1)
    assert caps.load == (2, 3) and caps.phys_load == (4, 5)
    assert caps.event_budget == MainLoadCap().bound(i) == 0
    assert caps.phys_event_budget == PhysicalMainLoadCap().bound(i) == 1
    assert caps.spread_main and caps.sign == 1
    assert Caps.of(inst(3, 3, SMT2x2, "compact"), DEFAULT_FAMILIES).sign == -1
    # rules of absent or inapplicable families are absent
    bare = Caps.of(inst(2, 2), [SingleCore(), PhysicalBalance(), MainLoadCap()])
    assert bare.understood
    assert (bare.rank_cap, bare.load, bare.phys_load, bare.event_budget) == (None, None, None, None)
    assert (bare.rank_limit, bare.worker_limit, bare.spread_main, bare.sign) == (2, 2, False, 0)


#: Instances on which every family is active at least once: scenario 3 with (2)
#: generalised (W > C), physical scenario 3, SMT with and without it, three cache levels.
ROW_CASES = [(3, 3, CORE4), (5, 2, TREE), (1, 3, SMT2x2), (3, 2, SMT2x2)]


def _with_requirements(key):
    """``key``, (1) and what ``key`` needs, in the default build order."""
    need, todo = {"1", key}, [key]
    while todo:
        key = todo.pop()
        ftype = next(f for f in FAMILY_TYPES if f.key == key)
        todo += [k for k in ftype.requires if k not in need]
        need |= set(ftype.requires)
    return tuple(k for k in ALL_KEYS if k in need)


def _reference_verdict(batch, topo, keys, encoding):
    """The reference feasibility of each assignment under ``keys``.

    The counts encoding states (2) for ranks ``t >= 1`` in aggregate (at most
    ``cap * (T - 1)`` non-main threads per core), which holds for *some*
    numbering of the threads (module docstring of the encodings); the rows
    are then compared with that form.
    """
    if encoding != "counts" or "2" not in keys:
        return feasible_mask(batch, topo, keys)
    N, W, T = batch.shape
    C = topo.n_logical
    cap = 1 if W <= C else math.ceil(W / C)
    main = (batch[:, :, 0, None] == np.arange(C)).sum(axis=1)
    nonmain = (batch[:, :, 1:, None] == np.arange(C)).sum(axis=(1, 2))
    aggregated = (main <= cap).all(axis=1) & (nonmain <= cap * (T - 1)).all(axis=1)
    return feasible_mask(batch, topo, [k for k in keys if k != "2"]) & aggregated


def _assignments(W, T, topo, keys, key, rng, n=4):
    """Assignments the reference accepts under ``keys``, ones that break family ``key`` only,
    and others it rejects: up to ``n`` of each (balanced loads mostly)."""
    C = topo.n_logical
    flat = np.tile(np.arange(C), -(-W * T // C))[: W * T]
    batch = np.concatenate([rng.integers(0, C, size=(40, W, T)),
                            np.stack([rng.permutation(flat).reshape(W, T) for _ in range(400)])])
    ok = feasible_mask(batch, topo, keys)
    only = ~ok & feasible_mask(batch, topo, [k for k in keys if k != key])
    return np.concatenate([batch[ok][:n], batch[only][:n], batch[~ok & ~only][:n]])


@pytest.mark.parametrize("encoding", ["pairwise", "counts"])
@pytest.mark.parametrize("ftype", FAMILY_TYPES, ids=lambda f: f.key)
def test_family_rows_agree_with_its_check_in_both_encodings(ftype, encoding):
    """With the assignment variables fixed to a mapping, the rows the family builds (and
    those of what it requires) are feasible exactly when the reference accepts the
    mapping and the library's checks find no violation; an objective family's term
    then equals its value and the reference's."""
    rng = np.random.default_rng(len(ftype.key) * 7 + len(encoding))
    keys = _with_requirements(ftype.key)
    for W, T, topo in ROW_CASES:
        model = TunaModel(W, T, topo, families=keys, encoding=encoding)
        assert model.caps.understood
        problem, enc, _ = model.build()
        assert enc.name == encoding
        assert any(type(f) is ftype for f in model.families)
        batch = _assignments(W, T, topo, keys, ftype.key, rng)
        # Fix the decision variables through parameters: compiled once, re-solved per mapping.
        fixed = {var.id: var for var in problem.variables() if var.id in enc.start(batch[0])}
        params = {vid: cp.Parameter(var.shape) for vid, var in fixed.items()}
        pinned = cp.Problem(problem.objective,
                            problem.constraints + [fixed[v] == params[v] for v in fixed])
        expected = _reference_verdict(batch, topo, keys, encoding)
        for assign, want in zip(batch, expected):
            for vid, value in enc.start(assign).items():
                params[vid].value = value
            pinned.solve(solver=cp.HIGHS)
            feasible = pinned.status == cp.OPTIMAL
            assert feasible == bool(want), (ftype.key, encoding, W, T, assign.tolist(), pinned.status)
            if encoding == "pairwise" or "2" not in keys:
                checks = [v for fam in model.families for v in fam.violations(assign, model.instance)]
                assert feasible == (checks == [])
            if feasible and ftype.kind == "objective":
                i = model.instance
                f_main, f_mode = objective_parts(assign, topo, i.mode)
                assert pinned.value == pytest.approx(ftype().value(assign, i))
                assert pinned.value == pytest.approx(f_main if ftype is MainSpread else f_mode)


def test_messages_name_os_cpu_ids(xeon):
    """Positions 2 and 3 of this sub-machine are OS cpus 16 and 17."""
    t = xeon.restrict([0, 1, 16, 17])
    i = Instance(2, 2, t)
    viol = LogicalBalance().violations(arr([[2, 2], [0, 1]]), i)
    assert sorted(v.message for v in viol) == ["cpu 16 carries 2 threads, above U=1",
                                               "cpu 17 carries 0 threads, below L=1"]
    assert sorted(v.index for v in viol) == [(2,), (3,)]          # indices stay positions
    viol = UniqueRankCores().violations(arr([[2, 0], [2, 1]]), i)
    assert [v.message for v in viol] == ["cpu 16 holds 2 threads of rank 0, above 1"]
    viol = UniqueWorkerCores().violations(arr([[3, 3], [0, 1]]), i)
    assert [v.message for v in viol] == ["cpu 17 holds 2 threads of worker 0, above 1"]
    i3 = Instance(3, 3, xeon.restrict([0, 1, 2, 20]))             # scenario 3, bound 0
    viol = MainLoadCap().violations(arr([[3, 0, 1], [1, 3, 2], [2, 3, 0]]), i3)
    assert viol and "cpus [20]" in viol[0].message


@pytest.mark.parametrize("shape", [(3,), (4, 3), (3, 4), (4, 4, 1), ()])
def test_a_family_check_refuses_an_assignment_of_the_wrong_shape(shape):
    from tuna_lab.errors import ModelError

    inst = Instance(4, 4, Topology.preset("xeon-8272cl"))
    bad = np.zeros(shape, dtype=int)
    for fam in DEFAULT_FAMILIES:
        # before: SingleCore().violations(np.zeros(3), inst) == [] - nothing wrong with a 3-vector
        for check in (fam.violations, fam.residual, fam.value):
            with pytest.raises(ModelError, match=r"shape \(4, 4\).*got shape"):
                check(bad, inst)


def test_a_family_of_ones_own_gets_the_shape_check_and_non_integers_are_refused():
    from tuna_lab.errors import ModelError

    class Mine(Family):
        key = "mine"

        def violations(self, assign, inst):
            return []

    inst = Instance(2, 2, Topology.preset("xeon-8272cl"))
    with pytest.raises(ModelError, match="shape"):
        Mine().violations(np.zeros(3, dtype=int), inst)
    with pytest.raises(ModelError, match="integer core positions"):
        LogicalBalance().violations(np.full((2, 2), 0.5), inst)
    assert LogicalBalance().violations(np.array([[0.0, 1.0], [2.0, 3.0]]), inst) == []
