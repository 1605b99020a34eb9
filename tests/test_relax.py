"""When the families admit no mapping: the minimal conflicting subset, and the nearest (relaxed) mapping.

* brute force on small machines: for every configuration small enough to
  enumerate whose default families admit no mapping, the relaxed mapping's
  violation and objective are the brute-force lexicographic optimum (least
  excess of the yielding family over the mappings of the other families,
  then the greatest objective), by the counting route and by HiGHS; the
  explained subset admits no mapping and every proper subset admits one
  (the reference's feasibility, not the library's);
* a grid on the article's machine: every configuration of the issue's count
  is feasible, or relaxed with ``verify()`` listing only the relaxed family;
* the CLI on 24x2 for xeon-8272cl.
"""

import json

import numpy as np
import pytest

from helpers import main

from reference import ALL_KEYS, all_assignments, bounds, feasible_mask, model_objective, scenario3
from tuna_lab import InfeasibleModelError, ModelError, Topology, TunaModel, solve

#: Small machines, and the shapes on them that brute force can enumerate.
SMALL = ("core:4 pu:1", "core:2 pu:2", "core:5 pu:1", "l2:2 core:1 pu:2")
MAX_ASSIGNMENTS = 70_000


def _cases():
    for spec in SMALL:
        C = Topology.synthetic(spec).n_logical
        for T in (2, 3):
            for W in range(1, C + 1):
                if C ** (W * T) <= MAX_ASSIGNMENTS:
                    yield spec, W, T


def _closure(keys):
    """``keys`` with (1) and what they read (as the library's ``requires`` say)."""
    out = {"1", *keys}
    if "11-12" in out:
        out |= {"8", "9-10"}
    if "11p-12p" in out:
        out |= {"8p", "9-10"}
    return out


def _residual_11_12(assign, topo):
    """Excess of (12) for a batch, from the article (events above max(0, W-C+r))."""
    N, W, T = assign.shape
    C = topo.n_logical
    L, U, r = bounds(W, T, C)
    onehot = assign[..., None] == np.arange(C)
    load = onehot.sum(axis=(1, 2))
    mains = onehot[:, :, 0, :].sum(axis=1)
    events = ((load == U) & (mains > 0)).sum(axis=1)
    return np.maximum(events - max(0, W - C + r), 0)


@pytest.mark.parametrize("spec,W,T", [c for c in _cases()])
def test_relaxation_and_explanation_match_brute_force(spec, W, T):
    topo = Topology.synthetic(spec)
    assign = all_assignments(W, T, topo.n_logical)
    if feasible_mask(assign, topo, ALL_KEYS).any():
        assert TunaModel(W, T, topo).explain() is None
        return
    model = TunaModel(W, T, topo)
    conflict = model.explain()
    keys = set(conflict.families)
    # infeasible together with (1) and what they read, and minimal
    assert not feasible_mask(assign, topo, tuple(_closure(keys))).any()
    for k in keys:
        assert feasible_mask(assign, topo, tuple(_closure(keys - {k}))).any(), (k, conflict)
    assert conflict.yielding == "11-12"
    # the lexicographic optimum over the mappings of the other families
    rest = tuple(k for k in ALL_KEYS if k != "11-12")
    ok = feasible_mask(assign, topo, rest)
    assert ok.any()
    excess = _residual_11_12(assign[ok], topo)
    least = excess.min()
    best = model_objective(assign[ok][excess == least], topo, "scatter").max()
    for mode in ("scatter", "compact"):
        if mode == "compact":
            best = model_objective(assign[ok][excess == least], topo, "compact").max()
        for prove in ("auto", "solver"):
            m = TunaModel(W, T, topo, mode).solve(prove=prove, time_limit=60)
            assert m.status == "relaxed" and m.proven_optimal, (mode, prove, m.notes)
            assert [r.family for r in m.relaxed] == ["11-12"]
            assert m.relaxed[0].amount == least == conflict.min_violation
            assert m.objective == pytest.approx(best), (mode, prove)
            assert {v.family for v in m.verify()} == {"11-12"}
            assert sum(v.amount for v in m.verify()) == least
            assert m.certificate["relaxation"]["stage1"]["proven"]


def test_the_small_cases_include_conflicts():
    conflicts = [c for c in _cases() if TunaModel(c[1], c[2], Topology.synthetic(c[0])).explain() is not None]
    assert len(conflicts) >= 4


def test_raise_keeps_the_old_behaviour_with_the_minimal_subset():
    topo = Topology.synthetic("pack:1 l3:2 l2:2 core:2 pu:2")
    with pytest.raises(InfeasibleModelError) as info:
        TunaModel(10, 2, topo).solve(on_infeasible="raise")
    assert info.value.families == ("2", "11-12") and info.value.needs == ("8", "9-10")
    assert "r=4" in info.value.reason and "max(0, 10-16+4) = 0" in info.value.reason
    with pytest.raises(ModelError, match="on_infeasible"):
        TunaModel(10, 2, topo).solve(on_infeasible="ignore")
    # dropping either family of the subset admits a mapping
    for key in info.value.families:
        assert TunaModel(10, 2, topo).without(key).solve(on_infeasible="raise").verify() == []


def test_the_deletion_filter_finds_a_conflict_with_a_family_of_ones_own():
    """No counting argument knows a user's family: the solver's verdicts find the subset, and it is
    minimal (three main threads, two even cpus, at most one main thread per core)."""
    from test_custom_family import CORE4, EvenMainCores

    model = TunaModel(3, 1, CORE4).with_(EvenMainCores())
    conflict = model.explain()
    # (2) or (8) (one thread per core when WT <= C) each conflict with it: either is a minimal subset
    assert conflict.proof == "solver" and conflict.families in (("2", "even-main"), ("8", "even-main"))
    assert conflict.yielding is None                      # neither may yield: relax raises
    with pytest.raises(InfeasibleModelError) as info:
        model.solve()
    assert info.value.families == conflict.families
    alone = {"2": "2", "8": "8", "even-main": EvenMainCores()}
    with pytest.raises(InfeasibleModelError):
        TunaModel(3, 1, CORE4, families=["1"] + [alone[k] for k in conflict.families]).solve(on_infeasible="raise")
    for key in conflict.families:
        subset = ["1"] + [alone[k] for k in conflict.families if k != key]
        assert TunaModel(3, 1, CORE4, families=subset).solve(on_infeasible="raise").verify() == []


#: The issue's count on the article's machine: W <= 2C+1, T <= 8, WT <= 4C.
def _article_grid(C=32):
    return [(W, T) for T in range(1, 9) for W in range(1, 2 * C + 2) if W * T <= 4 * C]


def test_article_machine_every_configuration_gets_a_placement():
    """Scatter, on the 283 configurations: feasible, or relaxed with only (11-12) in verify().

    The conflicts are exactly the counting argument's, (T-1)C/T < W < C with r > 0 (32 of them).
    """
    topo = Topology.preset("xeon-8272cl")
    grid = _article_grid()
    assert len(grid) == 283
    relaxed = []
    for W, T in grid:
        m = solve(W, T, topo, time_limit=20)
        if m.status == "relaxed":
            relaxed.append((W, T))
            assert {v.family for v in m.verify()} == {"11-12"}, (W, T)
            assert [r.family for r in m.relaxed] == ["11-12"]
        else:
            assert m.verify() == [], (W, T)
    expected = [(W, T) for W, T in grid if scenario3(W, T, 32) and (T - 1) * 32 < W * T and W < 32]
    assert relaxed == expected and len(relaxed) == 32


def test_cli_relaxes_and_strict_families_fails_with_the_subset():
    base = ["-w", "24", "-t", "2", "--preset", "xeon-8272cl"]
    done = main("solve", *base, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["status"] == "relaxed" and out["relaxed"][0]["family"] == "11-12"
    assert len(out["assignment"]) == 24 and out["relaxed"][0]["amount"] == 8
    done = main("plan", *base, "--policy", "tuna-scatter")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["status"] == "relaxed" and len(plan["slots"]) == 24
    note = done.stderr.strip().splitlines()
    assert len(note) == 1 and note[0].startswith("tuna-lab: note:") and "relaxed" in note[0]
    for cmd in (["solve", *base], ["plan", *base, "--policy", "tuna-compact"]):
        done = main(*cmd, "--strict-families")
        assert done.returncode == 2 and done.stdout == ""
        line = done.stderr.strip().splitlines()
        assert len(line) == 1 and "(2) and (11-12)" in line[0] and "max(0, 24-32+16) = 8" in line[0]
