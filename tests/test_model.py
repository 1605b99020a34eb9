"""Tests of TunaModel / solve / Mapping: optimality against brute force, properties, behaviour.

The reference optimum comes from ``reference.brute_force``: every assignment of
the ``W*T`` threads to the cores of a tiny machine, filtered by the article's
constraints and scored by the objective terms of the model (``f_main`` and/or
``f_mode``) recomputed from the distance.
"""

import inspect
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from reference import (ALL_KEYS, brute_force, feasible_mask, model_objective, objective_of,
                       objective_parts)
from strategies import synthetic_specs
from tuna_lab import InfeasibleModelError, Mapping, ModelError, Topology, TunaModel, solve
from tuna_lab.errors import NoSolutionError, TunaError
from tuna_lab.model.families import (Family, LogicalBalance, MainIndicator, MainLoadCap,
                                     PhysicalBalance,
                                     PhysicalMainLoadCap, UniqueRankCores, UniqueWorkerCores,
                                     Violation)


def spec_strategy():
    """Machines small enough for brute force: at most 8 PUs."""
    return synthetic_specs(max_pus=8)

CORE4 = "core:4 pu:1"
SMT2x2 = "core:2 pu:2"
PACK2 = "pack:2 l3:1 core:2 pu:1"
TREE = "l3:1 l2:2 core:1 pu:2"
CORE3 = "core:3 pu:1"
SMT3x2 = "core:3 pu:2"

_TOPOS = {}


def topo(spec):
    if spec not in _TOPOS:
        _TOPOS[spec] = Topology.synthetic(spec)
    return _TOPOS[spec]


_BRUTE = {}


def brute(W, T, spec, mode, keys=ALL_KEYS):
    key = (W, T, spec, mode, tuple(keys))
    if key not in _BRUTE:
        best, feasible, _ = brute_force(W, T, topo(spec), mode, keys)
        _BRUTE[key] = (best, len(feasible))
    return _BRUTE[key]


def check_mapping(m, model):
    """Invariants every solved mapping must satisfy."""
    inst = model.instance
    t = inst.topology
    W, T = inst.W, inst.T
    assert m.assignment.shape == (W, T)
    assert set(m.assignment.ravel().tolist()) <= set(t.cpus)
    np.testing.assert_array_equal(np.asarray(t.cpus)[m.positions], m.assignment)
    assert m.verify() == []
    # objective recomputed independently from the assignment and topology.distance()
    assert m.objective == pytest.approx(objective_of(m.positions, t, inst.mode, inst.costs))
    assert m.objective == pytest.approx(m.f_main + m.f_mode)
    keys = [f.key for f in model.families]
    assert feasible_mask(m.positions[None], t, keys)[0]
    # bounds bound what the model maximises: the objective terms of its families
    value = model_objective(m.positions, t, inst.mode, keys, inst.costs)
    assert model.value(m.positions) == pytest.approx(value)
    scale = 1e-6 * max(1.0, abs(value))
    if m.bound is not None:
        assert m.bound >= value - scale
    if m.gap is not None:
        assert m.gap >= 0
    bound = model.bound()
    assert bound is None or bound >= value - scale


def solve_model(model, time_limit=None, via_solver=False):
    """``model.solve``; ``via_solver`` makes HiGHS prove optimality itself when the model
    can also prove it by a counting bound (``prove="solver"``)."""
    kwargs = {} if time_limit is None else {"time_limit": time_limit}
    if via_solver and "prove" in inspect.signature(model.solve).parameters:
        kwargs["prove"] = "solver"
    if "on_infeasible" in inspect.signature(model.solve).parameters:
        kwargs["on_infeasible"] = "raise"        # these tests compare feasibility with brute force
    return model.solve(**kwargs)


def compare_with_brute_force(W, T, spec, mode, encoding, keys=ALL_KEYS, time_limit=60,
                             via_solver=True):
    best, _ = brute(W, T, spec, mode, keys)
    model = TunaModel(W, T, topo(spec), mode=mode, encoding=encoding, families=keys)
    if best is None:
        if hasattr(model, "construct"):
            assert model.construct() is None
        with pytest.raises(InfeasibleModelError) as info:
            solve_model(model, time_limit, via_solver)
        assert info.value.families
        assert set(info.value.families) <= set(keys)
        return None
    if hasattr(model, "bound"):
        bound = model.bound()
        assert bound is None or bound >= best - 1e-6, "the counting bound cuts off the optimum"
    if hasattr(model, "construct"):
        start = model.construct()
        if start is not None:
            start = np.asarray(start)
            assert not any(f.violations(start, model.instance) for f in model.families)
            assert feasible_mask(start[None], topo(spec), keys)[0]
            assert model_objective(start, topo(spec), mode, keys) <= best + 1e-6
    m = solve_model(model, time_limit, via_solver)
    check_mapping(m, model)
    if via_solver:
        assert m.encoding == encoding
    # These instances prove in well under the time limit: a solve that stops
    # proving optimality is a regression, not something to skip.
    assert m.proven_optimal, f"{encoding} did not prove optimality within {time_limit}s ({m.status})"
    assert model_objective(m.positions, topo(spec), mode, keys) == pytest.approx(best), \
        (m.assignment.tolist(), best)
    return m


# -- 1. default families against brute force ----------------------------------------

COUNT_CASES = [
    (CORE4, 1, 1), (CORE4, 2, 2), (CORE4, 3, 2), (CORE4, 2, 3), (CORE4, 3, 3), (CORE4, 5, 1),
    (CORE4, 1, 5), (CORE4, 2, 4), (CORE4, 4, 2), (CORE4, 6, 1),
    (SMT2x2, 2, 2), (SMT2x2, 3, 2), (SMT2x2, 2, 3), (SMT2x2, 3, 1), (SMT2x2, 1, 3),
    (SMT2x2, 5, 1), (SMT2x2, 1, 5),
    (TREE, 2, 2), (TREE, 2, 3), (TREE, 3, 1), (TREE, 1, 3), (TREE, 5, 1),
    (PACK2, 2, 2), (PACK2, 2, 3), (PACK2, 5, 1), (PACK2, 2, 4),
    (CORE3, 2, 2), (CORE3, 2, 3), (CORE3, 4, 1), (CORE3, 1, 4), (CORE3, 3, 2), (CORE3, 2, 4),
    (CORE3, 4, 2), (CORE3, 5, 2),
    (SMT3x2, 2, 2), (SMT3x2, 3, 1), (SMT3x2, 2, 3),
]


@pytest.mark.parametrize("via_solver", [True, False], ids=["solver", "default"])
@pytest.mark.parametrize("mode", ["scatter", "compact"])
@pytest.mark.parametrize("spec,W,T", COUNT_CASES)
def test_counts_encoding_matches_brute_force(spec, W, T, mode, via_solver):
    compare_with_brute_force(W, T, spec, mode, "counts", via_solver=via_solver)


PAIRWISE_CASES = [
    (CORE4, 2, 2), (CORE4, 3, 2), (CORE4, 2, 3), (CORE4, 5, 1), (CORE4, 1, 5),
    (SMT2x2, 2, 2), (SMT2x2, 3, 1), (SMT2x2, 1, 3), (SMT2x2, 2, 3),
    (PACK2, 2, 2), (PACK2, 2, 3), (PACK2, 5, 1), (CORE3, 4, 1), (CORE3, 1, 4),
]


@pytest.mark.parametrize("mode", ["scatter", "compact"])
@pytest.mark.parametrize("spec,W,T", PAIRWISE_CASES)
def test_pairwise_encoding_matches_brute_force(spec, W, T, mode):
    compare_with_brute_force(W, T, spec, mode, "pairwise", time_limit=30)


def test_brute_force_cases_cover_the_scenarios():
    """The cases above include oversubscription, W > C, T > C and scenario 3 (both cases)."""
    seen = set()
    for spec, W, T in COUNT_CASES:
        C = topo(spec).n_logical
        wt = W * T
        seen.add("under" if wt < C else "divisible" if wt % C == 0 else "scenario3")
        if W > C:
            seen.add("W>C")
        if T > C:
            seen.add("T>C")
        if wt > C and wt % C and W > C - wt % C:
            seen.add("scenario3-case2")
        if wt > C and wt % C and W <= C - wt % C:
            seen.add("scenario3-case1")
    assert seen >= {"under", "divisible", "scenario3", "W>C", "T>C",
                    "scenario3-case1", "scenario3-case2"}


# -- 2. family subsets against brute force -----------------------------------------------

SUBSET_CASES = [(CORE4, 2, 2), (CORE4, 3, 2), (CORE4, 2, 3), (CORE4, 1, 5), (CORE4, 5, 1),
                (SMT2x2, 3, 2), (SMT2x2, 2, 3), (SMT2x2, 1, 3), (SMT2x2, 3, 1),
                (PACK2, 3, 2), (PACK2, 2, 3), (CORE3, 2, 2), (CORE3, 1, 4), (CORE3, 4, 2)]
DROPS = [("11-12",), ("3",), ("2",), ("8",), ("8", "3"), ("8p",), ("11p-12p",),
         ("8p", "11p-12p"), ("2", "3"), ("11-12", "9-10", "8"), ("11-12", "9-10", "8", "3"),
         ("2", "3", "8", "11-12")]


def _accepted(spec, W, T, keys):
    try:
        TunaModel(W, T, topo(spec), families=keys)
    except ModelError:
        return False
    return True


def _subset_params():
    """Combinations the model accepts (refusals are tested on their own below)."""
    for spec, W, T in SUBSET_CASES:
        for drop in DROPS:
            keys = tuple(k for k in ALL_KEYS if k not in drop)
            if not _accepted(spec, W, T, keys):
                continue
            for mode in ("scatter", "compact"):
                yield pytest.param(spec, W, T, mode, keys,
                                   id=f"{spec}-{W}x{T}-{mode}-no{'+'.join(drop)}")


@pytest.mark.parametrize("spec,W,T,mode,keys", list(_subset_params()))
def test_family_subsets_match_brute_force(spec, W, T, mode, keys):
    """The counts encoding under reduced family sets, HiGHS-proven and by the default path."""
    compare_with_brute_force(W, T, spec, mode, "counts", keys, via_solver=True)
    compare_with_brute_force(W, T, spec, mode, "counts", keys, via_solver=False)


OBJECTIVE_DROPS = [(CORE4, 2, 2, ("4-5",)), (TREE, 2, 3, ("4-5",)), (SMT2x2, 3, 1, ("4-5",)),
                   (TREE, 2, 2, ("6-7",)), (PACK2, 3, 2, ("6-7",)), (CORE3, 4, 1, ("6-7",)),
                   (TREE, 2, 2, ("4-5", "6-7"))]


@pytest.mark.parametrize("mode", ["scatter", "compact"])
@pytest.mark.parametrize("spec,W,T,drop", OBJECTIVE_DROPS)
def test_dropping_an_objective_term_matches_brute_force(spec, W, T, drop, mode):
    """Without (4)+(5) or (6)+(7) the model maximises the other term only, and so does the
    reference: by HiGHS and by the default path (whose bound must know the term is gone)."""
    keys = tuple(k for k in ALL_KEYS if k not in drop)
    for via_solver in (True, False):
        compare_with_brute_force(W, T, spec, mode, "counts", keys, via_solver=via_solver)


def test_brute_force_scores_only_the_terms_of_the_families_present():
    t = topo(TREE)
    _, feasible, both = brute_force(2, 2, t, "compact")
    f_main, f_mode = objective_parts(feasible, t, "compact")
    np.testing.assert_allclose(both, f_main + f_mode)
    for drop, expected in ((("4-5",), f_mode), (("6-7",), f_main), (("4-5", "6-7"), 0 * f_main)):
        keys = tuple(k for k in ALL_KEYS if k not in drop)
        best, same, values = brute_force(2, 2, t, "compact", keys)
        np.testing.assert_array_equal(same, feasible)        # objective terms never change feasibility
        np.testing.assert_allclose(values, expected)
        assert best == pytest.approx(expected.max())
    assert brute_force(2, 2, t, "compact", tuple(k for k in ALL_KEYS if k != "4-5"))[0] != \
        pytest.approx(both.max())


# -- 3. hypothesis properties --------------------------------------------------------------

PROPERTY_SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                             suppress_health_check=[HealthCheck.too_slow,
                                                    HealthCheck.filter_too_much])


def _solve_or_none(model, time_limit=20, via_solver=False):
    try:
        return solve_model(model, time_limit, via_solver)
    except InfeasibleModelError:
        return None


@PROPERTY_SETTINGS
@given(spec=spec_strategy(), W=st.integers(1, 5), T=st.integers(1, 5),
       mode=st.sampled_from(["scatter", "compact"]), via_solver=st.booleans())
def test_property_counts_mapping_passes_every_check(spec, W, T, mode, via_solver):
    t = Topology.synthetic(spec)
    model = TunaModel(W, T, t, mode=mode, encoding="counts")
    m = _solve_or_none(model, via_solver=via_solver)
    C = t.n_logical
    small = C ** (W * T) <= 20_000
    event("infeasible" if m is None else "feasible")
    if m is None:
        if small:
            assert brute_force(W, T, t, mode)[0] is None
        return
    check_mapping(m, model)
    if mode == "compact":
        assert m.f_mode <= 0
    else:
        assert m.f_mode >= 0
    if small and m.proven_optimal:
        event("compared with brute force")
        assert m.objective == pytest.approx(brute_force(W, T, t, mode)[0])


@PROPERTY_SETTINGS
@given(spec=spec_strategy(), W=st.integers(1, 5), T=st.integers(1, 5),
       mode=st.sampled_from(["scatter", "compact"]), data=st.data())
def test_property_relabelling_keeps_the_optimum(spec, W, T, mode, data):
    t = Topology.synthetic(spec)
    perm = data.draw(st.permutations(t.cpus), label="new ids")
    r = t.relabel(dict(zip(t.cpus, perm)))
    a = _solve_or_none(TunaModel(W, T, t, mode=mode))
    b = _solve_or_none(TunaModel(W, T, r, mode=mode))
    assert (a is None) == (b is None)
    event("infeasible" if a is None else "feasible")
    if a is None:
        return
    assert a.verify() == [] and b.verify() == []
    assert set(b.assignment.ravel().tolist()) <= set(r.cpus)
    assert a.proven_optimal and b.proven_optimal     # small instances always prove
    assert a.objective == pytest.approx(b.objective)


#: Non-objective families; removals the model refuses (requirements) are skipped.
REMOVABLE = ["11-12", "8p", "2", "3", "8", "11p-12p", "9-10"]


@PROPERTY_SETTINGS
@given(spec=spec_strategy(), W=st.integers(1, 5), T=st.integers(1, 5),
       mode=st.sampled_from(["scatter", "compact"]),
       drop=st.lists(st.sampled_from(REMOVABLE), min_size=1, max_size=3, unique=True))
def test_property_removing_a_family_never_lowers_the_optimum(spec, W, T, mode, drop):
    t = Topology.synthetic(spec)
    full = TunaModel(W, T, t, mode=mode)
    try:
        reduced = full.without(*drop)
    except ModelError:
        assume(False)
    a = _solve_or_none(full)
    b = _solve_or_none(reduced)
    event("full model infeasible" if a is None else "full model feasible")
    if a is None:
        return
    assert b is not None, "removing a constraint family made the model infeasible"
    assert b.verify() == []
    assert a.proven_optimal and b.proven_optimal     # small instances always prove
    assert b.objective >= a.objective - 1e-6 * max(1.0, abs(a.objective))


# -- 4. model behaviour ----------------------------------------------------------------------

def keys_of(model):
    return [f.key for f in model.families]


def test_default_families_in_build_order():
    model = TunaModel(2, 2, topo(CORE4))
    assert keys_of(model) == list(ALL_KEYS)
    assert model.instance.W == 2 and model.instance.T == 2


@pytest.mark.parametrize("spec", ["11-12", "(11-12)", MainLoadCap, "MainLoadCap", MainLoadCap(),
                                  "11", "12"])
def test_without_by_key_class_name_and_equation(spec):
    model = TunaModel(2, 2, topo(CORE4))
    reduced = model.without(spec)
    assert "11-12" not in keys_of(reduced)
    assert len(reduced.families) == len(model.families) - 1
    assert keys_of(model) == list(ALL_KEYS)            # the original is unchanged
    back = reduced.with_(spec)
    assert keys_of(back) == list(ALL_KEYS)             # canonical order restored


def test_without_several_and_with_in_any_order():
    model = TunaModel(2, 2, topo(CORE4)).without("8p", UniqueWorkerCores, "UniqueRankCores")
    assert keys_of(model) == [k for k in ALL_KEYS if k not in ("2", "3", "8p")]
    back = model.with_(PhysicalBalance, "3", UniqueRankCores())
    assert keys_of(back) == list(ALL_KEYS)
    # adding a family twice keeps one copy
    assert keys_of(TunaModel(2, 2, topo(CORE4)).with_("8")) == list(ALL_KEYS)


def test_with_mode_keeps_families_and_topology():
    model = TunaModel(2, 2, topo(TREE)).without("3")
    other = model.with_mode("compact")
    assert other.instance.mode == "compact"
    assert keys_of(other) == keys_of(model)
    assert other.instance.topology is model.instance.topology
    assert other.with_mode("scatter").solve().objective == pytest.approx(model.solve().objective)
    with pytest.raises(ModelError):
        model.with_mode("sideways")


def test_a_model_is_immutable_and_solving_leaves_no_state_on_it():
    """A model only declares: nothing can be set or deleted on it, a solve (whose search the pipeline
    owns) adds nothing to it, and so a second solve finds what the first found."""
    model = TunaModel(4, 4, Topology.preset("xeon-8272cl"), mode="compact")
    declared = dict(vars(model))
    assert set(declared) == {"instance", "families", "encoding", "caps"}
    for name in ("families", "caps", "_fragments", "anything"):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(model, name, None)
    with pytest.raises(AttributeError, match="immutable"):
        del model.caps
    first, bound = model.solve(), model.bound()
    second = model.solve()
    assert vars(model).keys() == declared.keys() and all(vars(model)[k] is v for k, v in declared.items())
    assert np.array_equal(first.positions, second.positions)
    assert (first.objective, first.bound, first.proven_optimal) == (second.objective, second.bound, True)
    assert first.certificate["name"] == second.certificate["name"] and model.bound() == bound
    # the new model of a change, the old one as it was
    assert model.with_mode("scatter").instance.mode == "scatter" and model.instance.mode == "compact"


@pytest.mark.parametrize("bad", ["13", "nope", 13, 3.5, None, object(), int])
def test_unknown_family_is_a_model_error(bad):
    model = TunaModel(2, 2, topo(CORE4))
    with pytest.raises(ModelError):
        model.without(bad)
    with pytest.raises(ModelError):
        model.with_(bad)
    with pytest.raises(ModelError):
        TunaModel(2, 2, topo(CORE4), families=["1", bad])


def test_removing_main_indicator_while_main_load_cap_is_active():
    model = TunaModel(3, 3, topo(CORE4))      # scenario 3: (11-12) active
    assert MainLoadCap() in model.active_families
    for spec in ("9-10", MainIndicator, "MainIndicator"):
        with pytest.raises(ModelError, match="9-10"):
            model.without(spec)
    # fine once (11-12) goes too, and outside scenario 3
    assert "9-10" not in keys_of(model.without("11-12", "9-10"))
    assert "9-10" not in keys_of(TunaModel(2, 2, topo(CORE4)).without("9-10"))


def test_removing_physical_balance_while_physical_cap_is_active():
    model = TunaModel(1, 3, topo(SMT2x2))     # physical scenario 3
    assert PhysicalMainLoadCap() in model.active_families
    with pytest.raises(ModelError, match="8p"):
        model.without("8p")
    assert "8p" not in keys_of(model.without("8p", "11p-12p"))


@pytest.mark.parametrize("W,T", [(0, 2), (2, -1), (2, 2.5), (True, 2), (2, True), ("3", 2),
                                 (2, "3"), (None, 2), (-3, 1), (2, 0)])
def test_bad_workers_or_threads(W, T):
    with pytest.raises(ModelError):
        TunaModel(W, T, topo(CORE4))
    with pytest.raises(ModelError):
        solve(W, T, topo(CORE4))


def test_numpy_integers_are_accepted():
    m = solve(np.int64(2), np.int32(2), topo(CORE4))
    assert m.workers == 2 and m.threads == 2


@pytest.mark.parametrize("mode", ["Scatter", "spread", "", None, 1])
def test_bad_mode(mode):
    with pytest.raises(ModelError):
        TunaModel(2, 2, topo(CORE4), mode=mode)


@pytest.mark.parametrize("kw", [dict(time_limit=0), dict(time_limit=-1), dict(time_limit="5"),
                                dict(gap=-0.1), dict(gap=1), dict(gap="0")])
def test_bad_solve_options(kw):
    model = TunaModel(2, 2, topo(CORE4))
    with pytest.raises(ModelError):
        model.solve(**kw)


def test_unknown_solve_option():
    with pytest.raises(ModelError, match="bogus"):
        solve(2, 2, topo(CORE4), bogus=1)


def test_errors_share_a_base_class():
    assert issubclass(ModelError, TunaError) and issubclass(ModelError, ValueError)
    assert issubclass(InfeasibleModelError, TunaError)
    assert issubclass(NoSolutionError, TunaError)


class Impossible(Family):
    """A custom family no assignment satisfies (cvxpy rows and numpy check)."""

    key = "impossible"
    equations = ("x",)
    description = "no core may carry a thread"
    latex = r"\sum_{w,t} Y_{w,t,c} \leq -1"

    def constraints(self, enc):
        return [enc.load <= -1]

    def residual(self, assign, inst):
        return np.bincount(np.asarray(assign).ravel(), minlength=inst.C).astype(float) + 1

    def violations(self, assign, inst):
        res = self.residual(assign, inst)
        return [Violation(self.key, (c,), float(res[c]), f"core {c} carries a thread")
                for c in range(inst.C)]


class ImpossibleRowsOnly(Family):
    """A custom family given only as cvxpy constraints."""

    key = "impossible-rows"
    equations = ("y",)
    description = "no core may carry a thread (solver rows only)"
    latex = r"\sum_{w,t} Y_{w,t,c} \leq -1"

    def constraints(self, enc):
        return [enc.load <= -1]


@pytest.mark.parametrize("encoding", ["counts", "pairwise"])
@pytest.mark.parametrize("via_solver", [False, True])
def test_infeasible_family_combination(encoding, via_solver):
    model = TunaModel(2, 2, topo(CORE4), encoding=encoding).with_(Impossible())
    assert keys_of(model)[-1] == "impossible"
    with pytest.raises(InfeasibleModelError) as info:
        solve_model(model, 30, via_solver)
    # the minimal conflicting subset: the impossible family alone (with (1)) admits no mapping
    assert info.value.families == ("impossible",)
    assert "impossible" in str(info.value)
    # the class works as well as an instance
    with pytest.raises(InfeasibleModelError):
        solve_model(TunaModel(2, 2, topo(CORE4), encoding=encoding).with_(Impossible),
                    30, via_solver)


def test_infeasible_rows_only_family_via_solver():
    model = TunaModel(2, 2, topo(CORE4)).with_(ImpossibleRowsOnly)
    with pytest.raises(InfeasibleModelError) as info:
        solve_model(model, 30, via_solver=True)
    assert "impossible-rows" in info.value.families


def test_article_families_are_infeasible_for_some_scenario_3_instances():
    """W=3, T=2 on 4 cores: (8) leaves two cores at U=2; at most max(0, 3-4+2)=1 of
    them may hold a main thread (11-12), so the other holds two rank-1 threads,
    which (2) forbids. Brute force agrees that nothing is feasible."""
    assert brute(3, 2, CORE4, "scatter")[0] is None
    model = TunaModel(3, 2, topo(CORE4))
    for via_solver in (False, True):
        with pytest.raises(InfeasibleModelError) as info:
            solve_model(model, via_solver=via_solver)
        assert info.value.families == ("2", "11-12")
        assert info.value.needs == ("8", "9-10")
        assert "W=3" in str(info.value) and "max(0, 3-4+2) = 1" in info.value.reason
    # dropping (11-12) or (2) makes it feasible
    assert brute(3, 2, CORE4, "scatter", tuple(k for k in ALL_KEYS if k != "2"))[0] is not None
    reduced = model.without("11-12")
    check_mapping(solve_model(reduced, via_solver=True), reduced)


DICT_KEYS = {"workers", "threads", "mode", "logical_cores", "physical_cores", "assignment",
             "f_main", "f_mode", "objective", "status", "proven_optimal", "gap",
             "build_seconds", "solve_seconds"}


@pytest.mark.parametrize("mode", ["scatter", "compact"])
def test_mapping_to_dict_and_objective_parts(xeon, mode):
    m = solve(4, 4, xeon, mode=mode)
    d = m.to_dict()
    assert DICT_KEYS <= set(d)
    json.dumps(d)                                  # a JSON object, as the CLI prints it
    assert d["workers"] == 4 and d["threads"] == 4 and d["mode"] == mode
    assert d["logical_cores"] == 32 and d["physical_cores"] == 16
    assert d["assignment"] == m.assignment.tolist()
    assert d["objective"] == pytest.approx(d["f_main"] + d["f_mode"])
    assert d["f_main"] == m.f_main and d["f_mode"] == m.f_mode
    assert d["proven_optimal"] is True and m.proven_optimal
    assert d["status"] == "optimal"
    assert d["gap"] is None or 0 <= d["gap"] <= 1e-3
    assert d["build_seconds"] >= 0 and d["solve_seconds"] >= 0
    assert m.verify() == []
    if mode == "compact":
        assert m.f_mode <= 0
    else:
        assert m.f_mode >= 0
    # main threads are spread: never two on SMT siblings of the same physical core
    phys = np.asarray(xeon.core)[m.positions[:, 0]]
    assert len(set(phys.tolist())) == 4


def test_mapping_to_frame(xeon):
    m = solve(3, 2, xeon)
    frame = m.to_frame()
    assert len(frame) == 6
    assert {"worker", "thread", "role", "cpu", "physical_core"} <= set(frame.columns)
    assert (frame["role"] == "main").sum() == 3
    assert frame["cpu"].tolist() == m.assignment.ravel().tolist()


def test_scatter_and_compact_on_the_article_machine(xeon):
    """Scatter spreads a worker's threads over the L3; compact packs them on SMT siblings
    (shared L1) - but only without (8+), which allows one thread per physical core
    while WT <= P."""
    d = xeon.distance()
    s = solve(2, 2, xeon, mode="scatter")
    c = solve(2, 2, xeon, mode="compact")
    c_smt = TunaModel(2, 2, xeon, mode="compact").without("8p").solve()
    for w in range(2):
        assert d[s.positions[w, 0], s.positions[w, 1]] == 50
        assert d[c.positions[w, 0], c.positions[w, 1]] == 50
        assert d[c_smt.positions[w, 0], c_smt.positions[w, 1]] == 4
    assert s.f_mode == 100 and c.f_mode == -100 and c_smt.f_mode == -8
    assert s.f_main == c.f_main == c_smt.f_main == 50
    assert c_smt.verify() == []


def test_restricted_topology_uses_its_os_ids(xeon):
    t = xeon.restrict([0, 1, 2, 3, 16, 17, 18, 19])
    for mode in ("scatter", "compact"):
        m = solve(2, 4, t, mode=mode)
        assert set(m.assignment.ravel().tolist()) <= set(t.cpus)
        assert m.verify() == []
        assert m.objective == pytest.approx(objective_of(m.positions, t, mode))


@pytest.mark.parametrize("W,T,spec", [(5, 2, CORE4), (6, 3, CORE4), (9, 2, SMT2x2),
                                      (3, 7, SMT2x2), (2, 9, CORE4)])
def test_oversubscribed_instances_verify(W, T, spec):
    """W > C and T > C use the generalised caps, and rank recovery with cap > 1."""
    for mode in ("scatter", "compact"):
        model = TunaModel(W, T, topo(spec), mode=mode)
        check_mapping(model.solve(time_limit=30), model)


def test_mapping_of_a_hand_built_assignment(xeon):
    model = TunaModel(2, 2, xeon)
    m = Mapping(model.instance, [[0, 1], [0, 99]], model.families)
    np.testing.assert_array_equal(m.positions, [[0, 1], [0, -1]])
    keys = {v.family for v in m.verify()}
    assert {"1", "2"} <= keys
    ok = Mapping(model.instance, [[0, 1], [2, 3]], model.families)
    assert ok.verify() == []
    assert ok.f_main == 50 and ok.f_mode == 100 and ok.objective == 150
    smt = Mapping(model.instance, [[0, 16], [1, 17]], model.families)   # siblings: d = 4
    assert smt.f_main == 50 and smt.f_mode == 8
    assert {v.family for v in smt.verify()} == {"8p"}     # physical cores 0, 1 carry 2


def test_solve_function_passes_options(xeon):
    m = solve(2, 2, xeon, mode="compact", families=[k for k in ALL_KEYS if k != "3"],
              encoding="counts", time_limit=30, gap=0.0)
    assert m.mode == "compact"
    assert "3" not in [f.key for f in m.families]
    assert m.proven_optimal and m.verify() == []


def test_resolving_twice_reuses_the_build(xeon):
    model = TunaModel(2, 3, xeon)
    a = model.solve()
    b = TunaModel(2, 3, xeon).solve()
    assert a.objective == b.objective
    assert a.assignment.tolist() == b.assignment.tolist()


# -- regressions of library bugs found by these tests (fixed in 11c0d1c) -------------------

def test_counts_without_rank_family_extracts_a_mapping():
    """The counts encoding once recovered ranks with (2)'s cap although (2) was removed."""
    model = TunaModel(3, 2, topo(CORE4)).without("2")
    for via_solver in (True, False):
        m = solve_model(model, via_solver=via_solver)
        check_mapping(m, model)
        assert m.objective == pytest.approx(brute(3, 2, CORE4, "scatter",
                                                  tuple(k for k in ALL_KEYS if k != "2"))[0])
    m = model.solve(warm_start=False) if "warm_start" in inspect.signature(model.solve).parameters \
        else model.solve()
    check_mapping(m, model)


def test_main_load_cap_requires_logical_balance_in_scenario_3():
    """(11) is a product of 0-1 quantities only under (8): the encodings' (N_c - L) M_c and
    the check's "N_c == U and a main thread" disagreed without it (and the pairwise
    encoding forced N_c >= L everywhere), so the model refuses the combination."""
    t = topo(CORE4)
    for encoding in ("counts", "pairwise"):
        with pytest.raises(ModelError, match="8"):
            TunaModel(1, 5, t, mode="compact", encoding=encoding).without("8")
        with pytest.raises(ModelError, match="8"):
            TunaModel(3, 3, t, encoding=encoding).without(LogicalBalance)
    # outside scenario 3 (11-12) is inactive and (8) may go
    assert "8" not in keys_of(TunaModel(2, 2, t).without("8"))
    # with (11-12) gone too, (8) may go in scenario 3
    reduced = TunaModel(1, 5, t, mode="compact").without("8", "11-12", "9-10")
    m = solve_model(reduced, via_solver=True)
    check_mapping(m, reduced)
    assert m.objective == pytest.approx(
        brute(1, 5, CORE4, "compact", tuple(k for k in ALL_KEYS if k not in ("8", "11-12", "9-10")))[0])


PAIRWISE_SUBSETS = [(CORE4, 2, 2, ("3",)), (CORE4, 2, 3, ("11-12",)), (CORE4, 3, 2, ("2",)),
                    (CORE4, 1, 5, ("3",)), (SMT2x2, 1, 3, ("11p-12p",)),
                    (SMT2x2, 2, 2, ("8p",)), (CORE3, 2, 2, ("11-12", "9-10", "8"))]


@pytest.mark.parametrize("mode", ["scatter", "compact"])
@pytest.mark.parametrize("spec,W,T,drop", PAIRWISE_SUBSETS)
def test_pairwise_under_reduced_families_matches_brute_force(spec, W, T, drop, mode):
    keys = tuple(k for k in ALL_KEYS if k not in drop)
    compare_with_brute_force(W, T, spec, mode, "pairwise", keys, time_limit=30)


def test_costs_are_part_of_the_build_cache():
    """A model with other costs once re-solved the problem built with the default ones."""
    t = Topology.synthetic("pack:2 l3:1 l2:2 core:1 pu:2")
    costs = {"L3": 200}
    best = brute_force(3, 2, t, "compact", costs=costs)[0]
    default_best = brute_force(3, 2, t, "compact")[0]
    a = solve_model(TunaModel(3, 2, t, mode="compact"), via_solver=True)   # default costs, cached
    assert a.objective == pytest.approx(default_best)
    model = TunaModel(3, 2, t, mode="compact", costs=costs)
    for via_solver in (True, False):
        m = solve_model(model, via_solver=via_solver)
        assert m.proven_optimal
        assert m.objective == pytest.approx(best)
        assert m.objective == pytest.approx(objective_of(m.positions, t, "compact", costs))
    assert best == 190.0 and objective_of(a.positions, t, "compact", costs) < best


def test_unknown_encoding_is_refused_at_construction():
    with pytest.raises(ModelError, match="encoding"):
        TunaModel(2, 2, topo(CORE4), encoding="dense")


def test_infeasible_rows_only_family_default_path():
    """A user's family given only as cvxpy rows must not be bypassed by the constructive
    mapping and the counting bound, which know the built-in families only."""
    model = TunaModel(2, 2, topo(CORE4)).with_(ImpossibleRowsOnly)
    with pytest.raises(InfeasibleModelError):
        model.solve()


def test_verify_messages_name_os_cpu_ids(xeon):
    t = xeon.restrict([0, 1, 16, 17])                     # positions 2, 3 are cpus 16, 17
    model = TunaModel(2, 2, t)
    m = Mapping(model.instance, [[16, 16], [0, 1]], model.families)
    messages = sorted(v.message for v in m.verify() if v.family == "8")
    assert messages == ["cpu 16 carries 2 threads, above U=1", "cpu 17 carries 0 threads, below L=1"]
    assert any("16" in msg for msg in m.to_dict()["violations"])


def test_tuna_model_docstring_examples():
    import doctest

    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in doctest.DocTestFinder().find(TunaModel):
        runner.run(test, out=lambda _: None)
    assert runner.failures == 0


def test_family_1_cannot_be_removed():
    with pytest.raises(ModelError, match=r"\(1\)"):
        TunaModel(2, 2, topo(CORE4)).without("1")


# -- 5. the sibling-pattern bound and the objective lattice ----------------------------------

MINI_XEON = "l3:1 l2:3 core:1 pu:2"      # the article's machine in small: SMT pairs under one L3


@pytest.mark.parametrize("spec,W,T,drop", [
    (MINI_XEON, 2, 2, ()), (MINI_XEON, 2, 2, ("11p-12p",)), (MINI_XEON, 1, 4, ()),
    (TREE, 3, 2, ("11-12",)),
])
def test_sibling_pattern_bound_proves_what_the_counting_bound_cannot(spec, W, T, drop):
    """Cases where (11+)-(12+), sibling capacity or worker competition cap the compact
    pairs: the joint bound equals the brute-force optimum and the default path proves it."""
    from tuna_lab.model.route.bounds import objective_bound
    from tuna_lab.model.encodings import ultrametric_chain

    keys = tuple(k for k in ALL_KEYS if k not in drop)
    best, _ = brute(W, T, spec, "compact", keys)
    model = TunaModel(W, T, topo(spec), mode="compact", families=keys)
    chain = ultrametric_chain(topo(spec))
    per_level = objective_bound(model.caps, chain, patterns=False)
    assert per_level > best + 1
    assert model.bound() == pytest.approx(best, abs=1e-4)
    m = model.solve()
    assert m.encoding == "constructive+bound" and m.proven_optimal
    assert m.objective == pytest.approx(best)


@pytest.mark.parametrize("mode", ["scatter", "compact"])
@pytest.mark.parametrize("spec,W,T,drop", [
    (TREE, 4, 2, ()), (TREE, 2, 4, ()), (TREE, 4, 2, ("8",)), (TREE, 4, 2, ("3",)),
    (MINI_XEON, 3, 2, ()), (MINI_XEON, 3, 2, ("2", "3")),
])
def test_bounds_never_cut_off_the_optimum_on_smt_pairs(spec, W, T, drop, mode):
    """Oversubscribed and reduced-family SMT-2 cases: bound >= brute-force optimum, and
    the default path (which proves by bound and lattice step) returns the optimum."""
    keys = tuple(k for k in ALL_KEYS if k not in drop)
    compare_with_brute_force(W, T, spec, mode, "counts", keys, via_solver=False)


def test_objective_granularity_is_a_step_of_every_objective_value():
    """Feasible objective values differ by multiples of the lattice step."""
    from tuna_lab.model.route.bounds import objective_granularity
    from tuna_lab.model.encodings import ultrametric_chain

    for spec, W, T, mode in [(MINI_XEON, 2, 2, "compact"), (TREE, 2, 3, "scatter"),
                             (PACK2, 2, 3, "compact"), (TREE, 5, 1, "compact")]:
        t = topo(spec)
        _, feasible, values = brute_force(W, T, t, mode)
        step = objective_granularity(TunaModel(W, T, t, mode).caps, ultrametric_chain(t))
        assert step >= 1
        assert np.allclose(np.round((values - values.max()) / step), (values - values.max()) / step)
    xeon_step = TunaModel(6, 4, Topology.preset("xeon-8272cl"), "compact").granularity()
    assert xeon_step == 46           # sibling level only: the single-core level is constant


def test_local_search_keeps_every_family_and_never_worsens():
    """The polishing step on an oversubscribed compact case of a two-level SMT machine, from the
    greedy mapping (``construct`` maps the fragment programs' plans too, and reaches the optimum here)."""
    from tuna_lab.model.route.construct import greedy_mapping
    from tuna_lab.model.encodings import ultrametric_chain

    t = Topology.synthetic("pack:2 l3:2 l2:2 core:1 pu:2")
    model = TunaModel(5, 5, t, mode="compact")
    labels = [model.instance.core] + [lab for _, lab in ultrametric_chain(t)]
    start = greedy_mapping(model.caps, labels, "rank")
    better = model.improve(start, time_limit=2.0)
    assert not any(f.violations(better, model.instance) for f in model.families)
    assert objective_of(better, t, "compact") > objective_of(start, t, "compact")
    m = Mapping(model.instance, np.asarray(t.cpus)[better], model.families)
    assert m.verify() == [] and feasible_mask(better[None], t)[0]


def test_warm_start_is_canonical_for_the_symmetry_breaking_rows():
    """HiGHS drops a start that breaks the counts encoding's symmetry ordering."""
    model = TunaModel(5, 4, Topology.preset("epyc-7313p"), mode="compact")
    problem, enc, _ = model.build()
    start = model.improve(model.construct())      # this one breaks the ordering as it is
    canon = enc.canonical(start)
    inst = model.instance
    assert Mapping(inst, inst.cpus[canon], model.families).verify() == []
    assert objective_of(canon, inst.topology, "compact") == pytest.approx(
        objective_of(start, inst.topology, "compact"))
    values = enc.start(start)
    for var in problem.variables():
        if var.id in values:
            var.value = values[var.id]
    assert max(float(np.max(c.violation())) for c in enc.symmetry_constraints()) <= 1e-9


# ------------------------------------------------------------ certificates
def _check_certificate(m, model):
    """The certificate's numbers are the mapping's, and prove what it says."""
    cert = m.certificate
    json.dumps(m.to_dict())
    assert m.to_dict()["certificate"] == cert
    assert cert["objective"] == pytest.approx(model.value(m.positions))
    assert cert["bound"] == pytest.approx(m.bound) and cert["gap"] == pytest.approx(m.gap)
    assert cert["proven"] is bool(m.proven_optimal)
    assert cert["bound"] >= cert["objective"] - 1e-6
    if cert["proven"]:
        # proven: the bound lies less than one lattice step above the objective
        step = cert["step"]
        assert cert["bound"] - cert["objective"] < (step if step > 0 else 1e-6) or cert["name"] == "highs"
    comb = cert["combinatorial"]
    if comb is not None:
        assert comb["bound"] == pytest.approx(comb["constant"] + sum(comb["levels"]))
        assert comb["bound"] >= cert["objective"] - 1e-6
    assert f"certificate={cert['name']!r}" in repr(m)
    assert f"certificate: {cert['name']}" in m.describe()


@pytest.mark.parametrize("mode", ["scatter", "compact"])
def test_certificate_of_a_mapping_proven_by_the_bound(xeon, mode):
    model = TunaModel(4, 4, xeon, mode)
    m = model.solve()
    assert m.proven_optimal and m.encoding == "constructive+bound"
    _check_certificate(m, model)
    cert = m.certificate
    assert cert["name"] == model.certificate(target=cert["objective"]).name
    assert cert["name"] != "highs" and cert["dual_bound"] is None


def test_certificate_of_a_mapping_proven_by_highs(xeon):
    model = TunaModel(4, 4, xeon, "compact")
    m = model.solve(prove="solver")
    assert m.proven_optimal and m.encoding == "counts"
    _check_certificate(m, model)
    cert = m.certificate
    assert cert["name"] == "highs"
    # HiGHS's dual bound, in the objective's sign, bounds the optimum it found
    assert cert["dual_bound"] is not None and cert["dual_bound"] >= cert["objective"] - 1e-6
    assert cert["dual_bound"] - cert["objective"] <= 1e-4 * max(1.0, abs(cert["objective"])) + 1e-6


def test_certificate_of_a_mapping_not_proven_in_time():
    model = TunaModel(32, 16, Topology.preset("epyc-9654-2s"), "compact").without("8p", "11p-12p")
    m = model.solve(time_limit=1.0)
    _check_certificate(m, model)
    if not m.proven_optimal:
        assert m.certificate["gap"] > 0 and m.certificate["name"] != "none"


def test_the_768_core_preset():
    # 2 packages x 12 L3 domains x 16 cores x 2 SMT, a NUMA node per socket
    topo = Topology.preset("epyc-9965-2s")
    P = 384
    assert (topo.n_logical, topo.n_physical, topo.threads_per_core) == (768, P, 2)
    assert topo.package.max() + 1 == 2 and topo.numa.max() + 1 == 2
    l3 = np.asarray(topo.caches["L3"])
    assert l3.max() + 1 == 24 and set(np.bincount(l3).tolist()) == {32}
    assert topo.siblings()[:2] == [(0, P), (1, P + 1)]
    d = topo.distance()
    assert d[0, P] == 4 and d[0, 15] == 50 and d[0, 16] == 200   # SMT sibling, same CCD, another CCD


# ------------------------------------------------------------ the API a notebook user meets
def test_verify_takes_the_family_names_with_and_without_take():
    m = solve(4, 4, "xeon-8272cl")
    assert m.verify(["11-12"]) == [] and m.verify("8p") == [] and m.verify([8, "(11)", "MainLoadCap"]) == []
    # a name with_/without accept is a name verify accepts, and one they refuse it refuses alike
    model = TunaModel(4, 4, "xeon-8272cl")
    for name in ("11-12", "(9)", "PhysicalBalance", LogicalBalance, MainLoadCap()):
        model.without(name)
        assert m.verify([name]) == []
    with pytest.raises(ModelError, match="unknown constraint family 'zz'"):
        m.verify(["zz"])
    with pytest.raises(ModelError, match="unknown constraint family"):
        model.without("zz")
    # it checks what it is asked: a mapping placed without (8) fails (8)'s check by name
    crowded = Mapping(m.instance, np.zeros((4, 4), dtype=int) + np.arange(4), m.families)
    assert {v.family for v in crowded.verify(["8"])} == {"8"}


def test_a_certificate_says_what_it_certifies_and_is_not_shown_for_a_model_without_objective():
    alone = solve(4, 4, "xeon-8272cl", families=["1"])
    text = alone.describe()
    # before: "objective=1500 ... proven_optimal=True" beside "certificate: counting objective=0"
    assert "  certificate:" not in text and "certificate=" not in repr(alone)
    assert "no certificate: the model maximises no objective term" in text
    assert alone.certificate["certifies"] == []
    # nor in solve --json: before, a full {"proven": true, ...} object beside "objective": 1500
    assert alone.to_dict()["certificate"] is None and "no objective term" in alone.to_dict()["no_certificate"]
    full = solve(4, 4, "xeon-8272cl")
    assert full.certificate["certifies"] == ["f_main", "f_mode"]
    assert "certificate: counting bound on the model's objective (f_main + f_mode): objective=1500" in full.describe()
    main_only = solve(4, 4, "xeon-8272cl", families=["1", "2", "3", "4-5"])
    line = next(ln for ln in main_only.describe().splitlines() if "certificate:" in ln)
    assert "(f_main only; f_mode not in the model)" in line and f"objective={main_only.f_main:g}" in line
