"""Tests of tuna_lab.placement.policies: each policy's placement, its loads, exports and compare()."""

import json

import numpy as np
import pandas as pd
import pytest

from tuna_lab import ModelError, Topology, TopologyError, solve
from tuna_lab.placement.policies import POLICIES, Placement, compare, placement

XEON = Topology.preset("xeon-8272cl")        # 16 cores, siblings c and c+16
XEON2S = Topology.preset("xeon-8260-2s")     # 2 NUMA nodes, 48 cores, siblings c and c+48
SMT4 = Topology.synthetic("core:4 pu:2")     # siblings (0,1) (2,3) (4,5) (6,7)
CORE8 = Topology.synthetic("core:8 pu:1")
CORE16 = Topology.synthetic("core:16 pu:1")

COMPARE_COLUMNS = ["pinned_by", "max_logical_load", "max_physical_load", "load_std", "idle_cpus",
                   "stacked_main_cpus", "max_main_cpu_load", "f_main", "f_mode"]


def allowed_lists(p):
    return [[sorted(s) for s in row] for row in p.allowed]


# -- round-robin (OCC pinning) ---------------------------------------------------

def test_round_robin_counts_threads_worker_by_worker():
    p = placement("round-robin", 4, 4, XEON)
    assert p.pinned_by == "tuna_lab" and p.env == {}
    for w in range(4):
        for t in range(4):
            assert p.cpu(w, t) == (w * 4 + t) % 32


def test_round_robin_stacks_main_threads_when_threads_divide_cores():
    # The article's figure: on 16 cores, W=4 T=4 puts every main thread 4 cores apart ...
    assert placement("round-robin", 4, 4, CORE16).as_array()[:, 0].tolist() == [0, 4, 8, 12]
    # ... and with 16 workers on 32 cpus, workers w and w+8 share their main thread's cpu.
    mains = placement("round-robin", 16, 4, XEON).as_array()[:, 0]
    assert mains.tolist() == [0, 4, 8, 12, 16, 20, 24, 28] * 2
    assert np.array_equal(mains[:8], mains[8:])
    assert compare(16, 4, XEON, ["round-robin"]).loc["round-robin", "stacked_main_cpus"] == 8


def test_round_robin_gives_the_remainder_to_the_first_cores():
    loads = placement("round-robin", 2, 6, CORE8).expected_loads()
    assert loads.tolist() == [2, 2, 2, 2, 1, 1, 1, 1]


# -- OpenMP binding (libgomp emulation) --------------------------------------------

@pytest.mark.parametrize("topo", [XEON, SMT4], ids=["xeon", "smt4"])
@pytest.mark.parametrize("policy", ["omp-spread", "omp-close"])
@pytest.mark.parametrize("places", ["cores", "threads"])
@pytest.mark.parametrize("T", [1, 2, 3, 5, 20])
def test_omp_binding_is_identical_in_every_worker(topo, policy, places, T):
    p = placement(policy, 3, T, topo, places=places)
    assert p.pinned_by == "openmp"
    assert p.env == {"OMP_PROC_BIND": policy.removeprefix("omp-"), "OMP_PLACES": places,
                     "OMP_NUM_THREADS": str(T)}
    assert p.allowed[0] == p.allowed[1] == p.allowed[2]
    # The main thread binds to the first place.
    first = set(topo.siblings()[0]) if places == "cores" else {topo.cpus[0]}
    assert set(p.allowed[0][0]) == first


def test_omp_cores_places_are_sibling_sets():
    spread = placement("omp-spread", 2, 2, XEON)
    close = placement("omp-close", 2, 2, XEON)
    assert allowed_lists(spread) == [[[0, 16], [8, 24]]] * 2      # places 0 and 8 of 16
    assert allowed_lists(close) == [[[0, 16], [1, 17]]] * 2       # places 0 and 1
    assert allowed_lists(placement("omp-spread", 1, 2, SMT4)) == [[[0, 1], [4, 5]]]
    assert allowed_lists(placement("omp-close", 1, 2, SMT4)) == [[[0, 1], [2, 3]]]
    assert spread.cpu(0, 0) is None and spread.as_array().tolist() == [[-1, -1]] * 2


def test_omp_threads_places_are_single_cpus():
    assert placement("omp-spread", 2, 2, XEON, places="threads").as_array().tolist() == [[0, 16]] * 2
    assert placement("omp-close", 2, 2, XEON, places="threads").as_array().tolist() == [[0, 1]] * 2
    assert placement("omp-spread", 1, 2, SMT4, places="threads").as_array().tolist() == [[0, 4]]
    assert placement("omp-close", 1, 3, SMT4, places="threads").as_array().tolist() == [[0, 1, 2]]


def test_omp_spread_uneven_subpartitions_put_the_longer_ones_first():
    # N=8 places, T=3: subpartitions of 3, 3, 2 places -> first places 0, 3, 6.
    assert placement("omp-spread", 1, 3, CORE8).as_array().tolist() == [[0, 3, 6]]
    # N=16 core places, T=5: sizes 4,3,3,3,3 -> places 0, 4, 7, 10, 13.
    spread = placement("omp-spread", 1, 5, XEON)
    assert [min(s) for s in spread.allowed[0]] == [0, 4, 7, 10, 13]


def test_omp_more_threads_than_places():
    # close, T=5 over N=2: two threads per place, then the leftover back on place 0 (libgomp).
    close = placement("omp-close", 1, 5, Topology.synthetic("core:2 pu:1"))
    assert close.as_array().tolist() == [[0, 0, 1, 1, 0]]
    # spread with T > N behaves like close.
    for topo, places in ((SMT4, "cores"), (SMT4, "threads"), (XEON, "cores")):
        s = placement("omp-spread", 2, 20, topo, places=places)
        c = placement("omp-close", 2, 20, topo, places=places)
        assert s.allowed == c.allowed
    # 20 threads on 16 core places: the first 4 places get 2 threads, the others 1.
    loads = placement("omp-close", 1, 20, XEON).expected_loads()
    per_core = np.bincount(XEON.core, weights=loads)
    assert per_core.tolist() == [2] * 4 + [1] * 12


def test_omp_binding_leaves_cores_idle_that_other_policies_use():
    # The article's figure: 2 workers x 2 threads on 4 cores, spread over-uses cores 0, 2.
    core4 = Topology.synthetic("core:4 pu:1")
    assert placement("omp-spread", 2, 2, core4).expected_loads().tolist() == [2, 0, 2, 0]
    assert placement("omp-close", 2, 2, core4).expected_loads().tolist() == [2, 2, 0, 0]
    assert placement("round-robin", 2, 2, core4).expected_loads().tolist() == [1, 1, 1, 1]
    # With cores places on SMT, a thread's share is split over the siblings.
    loads = placement("omp-spread", 4, 2, XEON).expected_loads()
    assert loads[[0, 16, 8, 24]].tolist() == [2, 2, 2, 2]
    assert np.count_nonzero(loads) == 4


# -- numa, cfs, tuna ------------------------------------------------------------------

def test_numa_assigns_workers_round_robin_over_nodes():
    p = placement("numa", 5, 3, XEON2S)
    assert p.pinned_by == "tuna_lab"
    nodes = [set(np.asarray(XEON2S.cpus)[XEON2S.numa == k].tolist()) for k in range(2)]
    assert nodes[0] == set(range(24)) | set(range(48, 72))
    for w in range(5):
        assert all(set(s) == nodes[w % 2] for s in p.allowed[w])
    assert p.as_array().max() == -1


def test_cfs_allows_every_cpu():
    p = placement("cfs", 3, 2, XEON)
    assert p.pinned_by == "none" and p.env == {} and p.mapping is None
    assert all(s == frozenset(XEON.cpus) for row in p.allowed for s in row)
    assert np.allclose(p.expected_loads(), 6 / 32)
    assert set(p.to_frame()["allowed"]) == {"all"}


@pytest.mark.parametrize("mode", ["scatter", "compact"])
@pytest.mark.parametrize("W, T, topo", [(4, 4, XEON), (2, 6, CORE8), (3, 2, SMT4)])
def test_tuna_placement_is_the_solved_mapping(mode, W, T, topo):
    p = placement(f"tuna-{mode}", W, T, topo, time_limit=10)
    assert p.pinned_by == "tuna_lab" and p.mapping.mode == mode
    assert p.mapping.verify() == []
    assert np.array_equal(p.as_array(), p.mapping.assignment)
    assert np.array_equal(p.as_array(), solve(W, T, topo, mode).assignment)
    assert placement(f"tuna-{mode}", W, T, topo, mode=mode).mapping.mode == mode


# -- shared behaviour -------------------------------------------------------------------

@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("W, T, topo", [(4, 4, XEON), (2, 6, CORE8), (5, 3, SMT4)])
def test_every_policy_places_every_thread_once(policy, W, T, topo):
    p = placement(policy, W, T, topo)
    assert isinstance(p, Placement) and (p.workers, p.threads) == (W, T)
    assert len(p.allowed) == W and all(len(row) == T for row in p.allowed)
    loads = p.expected_loads()
    assert loads.shape == (topo.n_logical,)
    assert loads.sum() == pytest.approx(W * T)

    d = json.loads(json.dumps(p.to_dict()))
    assert d["policy"] == policy and d["workers"] == W and d["threads"] == T
    assert sum(d["expected_loads"].values()) == pytest.approx(W * T)
    assert (d["mapping"] is None) == (not policy.startswith("tuna-"))

    frame = p.to_frame()
    assert len(frame) == W * T
    assert list(frame.columns) == ["policy", "worker", "thread", "role", "allowed", "n_allowed", "cpu"]
    assert (frame["role"] == "main").sum() == W
    single = p.as_array().ravel()
    assert frame["cpu"].isna().tolist() == (single < 0).tolist()

    text = p.describe()
    assert text.startswith(policy) and len(text.splitlines()) >= W + 2


def test_topology_none_reads_this_machine():
    p = placement("round-robin", 1, 1)
    assert p.topology.n_logical >= 1 and p.cpu(0, 0) == p.topology.cpus[0]


@pytest.mark.parametrize("call", [
    lambda: placement("bogus", 2, 2, XEON),
    lambda: placement(None, 2, 2, XEON),
    lambda: placement("cfs", 0, 2, XEON),
    lambda: placement("cfs", 2, -1, XEON),
    lambda: placement("cfs", 2.0, 2, XEON),
    lambda: placement("cfs", True, 2, XEON),
    lambda: placement("omp-close", 2, 2, XEON, places="sockets"),
    lambda: placement("tuna-scatter", 2, 2, XEON, mode="compact"),
    lambda: placement("cfs", 2, 2, XEON, mode="fast"),
    lambda: compare(2, 2, XEON, ["cfs", "bogus"]),
    lambda: Placement("x", 2, 1, XEON, ((frozenset({0}),),), {}, "tuna_lab"),
    lambda: Placement("x", 1, 1, XEON, ((frozenset({99}),),), {}, "tuna_lab"),
    lambda: Placement("x", 1, 1, XEON, ((frozenset({0}),),), {}, "kernel"),
])
def test_bad_inputs_raise_model_error(call):
    with pytest.raises(ModelError) as info:
        call()
    assert "\n" not in str(info.value)


def test_a_preset_name_is_a_topology_and_anything_else_a_topology_error():
    assert placement("round-robin", 2, 2, "xeon-8272cl").topology.to_dict() == XEON.to_dict()
    for bad in (5, "no-such-machine"):
        with pytest.raises(TopologyError):
            placement("cfs", 2, 2, bad)


def test_unknown_policy_error_lists_the_valid_names():
    with pytest.raises(ModelError, match="round-robin.*tuna-compact"):
        placement("occ", 2, 2, XEON)


# -- compare ----------------------------------------------------------------------------

def test_compare_has_one_row_per_policy():
    df = compare(4, 4, XEON)
    assert isinstance(df, pd.DataFrame)
    assert df.index.name == "policy" and list(df.index) == list(POLICIES)
    assert list(df.columns) == COMPARE_COLUMNS
    # f_main and f_mode exist only where every thread has one cpu.
    assert df.loc[["cfs", "numa", "omp-spread", "omp-close"], ["f_main", "f_mode"]].isna().all().all()
    assert df.loc[["round-robin", "tuna-scatter", "tuna-compact"], ["f_main", "f_mode"]].notna().all().all()
    assert df.loc["round-robin", "max_logical_load"] >= df.loc["tuna-scatter", "max_logical_load"]
    # OpenMP binding: every worker on the same 4 sibling pairs, 24 cpus idle.
    assert df.loc["omp-spread", "idle_cpus"] == 24 and df.loc["omp-spread", "max_logical_load"] == 2
    assert df.loc["cfs", "load_std"] == pytest.approx(0)


def test_compare_shows_where_round_robin_falls_short():
    # Threads divide cores: round-robin stacks main threads, Tuna spreads them.
    df = compare(16, 4, XEON, ["round-robin", "tuna-scatter"])
    assert df["stacked_main_cpus"].tolist() == [8, 0]
    assert df.loc["tuna-scatter", "f_main"] > df.loc["round-robin", "f_main"]
    # Remainder threads: round-robin gives main threads the overloaded cores.
    df = compare(2, 6, CORE8, ["round-robin", "tuna-scatter"])
    assert df["max_main_cpu_load"].tolist() == [2, 1]
    assert df["max_logical_load"].tolist() == [2, 2]


def test_compare_f_terms_match_the_mapping():
    df = compare(4, 4, XEON, ["tuna-scatter"], places="threads")
    m = solve(4, 4, XEON, "scatter")
    assert df.loc["tuna-scatter", "f_main"] == pytest.approx(m.f_main)
    assert df.loc["tuna-scatter", "f_mode"] == pytest.approx(m.f_mode)
    assert compare(2, 2, XEON, ["omp-close"], places="threads")["f_main"].notna().all()


def test_the_cli_names_the_policies_the_library_registers():
    # The CLI's help lists the built-in names without loading the registry; the two must agree.
    from tuna_lab.placement.names import BUILTIN_POLICIES
    from tuna_lab.placement.policies import POLICIES

    assert POLICIES == BUILTIN_POLICIES
