"""A family defined here, not in the library, composes with the article's in both encodings.

:class:`EvenMainCores` builds its rows only through the
:class:`~tuna_lab.model.encodings.Encoding` contract and checks a mapping
with numpy. It contributes nothing to :class:`~tuna_lab.model.caps.Caps`, so
the constructive mapping and the counting bound, which could not honour it,
decline: HiGHS solves the model, the mapping says so in its notes, and it
satisfies the family (which :meth:`Mapping.verify` runs). It singles out
cores, so it leaves ``symmetric`` off and the counts encoding adds no
symmetry-breaking rows (which would cut its optimum off). The optimum is
compared with brute force under the reference plus the family's own rule.

The last tests pin the contract itself: what an encoding must provide, and
how the families' caps are merged.
"""

import numpy as np
import pytest

from reference import ALL_KEYS, all_assignments, feasible_mask, model_objective
from tuna_lab import InfeasibleModelError, ModelError, Topology, TunaModel
from tuna_lab.model.caps import Caps
from tuna_lab.model.encodings import CountEncoding, Encoding, PairwiseEncoding
from tuna_lab.model.families import (DEFAULT_FAMILIES, Family, LogicalBalance, MainLoadCap,
                                     SingleCore, Violation)
from tuna_lab.model.instance import Instance

CORE4 = Topology.synthetic("core:4 pu:1")
CORE3 = Topology.synthetic("core:3 pu:1")
SMT_TREE = Topology.synthetic("pack:2 l3:1 l2:2 core:1 pu:2")     # 8 PUs, siblings c, c+1


class EvenMainCores(Family):
    """Main threads run only on even-numbered CPUs (OS ids)."""

    key = "even-main"
    equations = ("even",)
    description = "main threads run on even-numbered cpus only"
    latex = r"\sum_{w} Y_{w,0,c} = 0 \quad \forall c:\ \mathrm{cpu}(c) \text{ odd}"

    def constraints(self, enc):
        odd = np.flatnonzero(enc.inst.cpus % 2 == 1)
        return [enc.main_count[odd] == 0]

    def residual(self, assign, inst):
        main = np.asarray(assign)[:, 0]
        on_core = (main >= 0) & (main < inst.C)
        return (on_core & (inst.cpus[np.where(on_core, main, 0)] % 2 == 1)).astype(float)

    def violations(self, assign, inst):
        res = self.residual(assign, inst)
        return [Violation(self.key, (int(w),), 1.0,
                          f"main thread of worker {w} on odd cpu {inst.cpus[assign[w, 0]]}")
                for w in np.flatnonzero(res > 0)]


def brute_force_even(W, T, topo, mode):
    """Reference optimum under the article's families and "mains on even cpus"."""
    assign = all_assignments(W, T, topo.n_logical)
    cpus = np.asarray(topo.cpus)
    ok = feasible_mask(assign, topo) & (cpus[assign[:, :, 0]] % 2 == 0).all(axis=1)
    if not ok.any():
        return None
    return float(np.max(model_objective(assign[ok], topo, mode, ALL_KEYS)))


CASES = [(CORE4, 2, 2), (CORE3, 2, 3), (SMT_TREE, 2, 2), (SMT_TREE, 3, 1)]


@pytest.mark.parametrize("mode", ["scatter", "compact"])
@pytest.mark.parametrize("encoding", ["counts", "pairwise"])
@pytest.mark.parametrize("topo,W,T", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_custom_family_is_honoured_in_both_encodings(topo, W, T, encoding, mode):
    model = TunaModel(W, T, topo, mode, families=DEFAULT_FAMILIES + (EvenMainCores(),),
                      encoding=encoding)
    assert [f.key for f in model.families] == list(ALL_KEYS) + ["even-main"]
    m = model.solve(time_limit=60)
    # never silently ignored: verify() runs the family's own check, and it passes
    assert EvenMainCores() in m.families
    assert m.verify() == []
    assert np.all(m.assignment[:, 0] % 2 == 0)
    assert feasible_mask(m.positions[None], topo)[0]
    # solved by HiGHS, which sees the family's rows, and the mapping says why
    assert m.encoding == encoding and m.proven_optimal
    assert any("even-main" in note and "HiGHS" in note for note in m.notes)
    assert m.to_dict()["notes"] == list(m.notes)
    assert m.objective == pytest.approx(brute_force_even(W, T, topo, mode))


def test_the_default_optimum_breaks_the_custom_family():
    """So the cases above test something: without the family, a main thread lands on an odd cpu."""
    m = TunaModel(2, 2, CORE4).solve()
    assert EvenMainCores().violations(m.positions, m.instance)
    assert m.notes == ()


def test_constructive_route_and_bound_decline_a_family_they_do_not_know():
    model = TunaModel(2, 2, CORE4).with_(EvenMainCores())
    assert model.caps.unknown == ("even-main",) and not model.caps.understood
    # it singles out cores: the counts encoding must not break core symmetries
    assert not model.caps.symmetric
    _, enc, _ = model.build()
    assert enc.name == "counts" and enc.symmetry_constraints() == []
    assert TunaModel(2, 2, CORE4).build()[1].symmetry_constraints()
    assert model.construct() is None
    assert model.bound() is None and model.granularity() == 0.0
    start = np.array([[0, 1], [2, 3]])
    assert model.improve(start) is start
    # with_() and families= build the same model
    same = TunaModel(2, 2, CORE4, families=DEFAULT_FAMILIES + (EvenMainCores,))
    assert same.families == model.families
    assert same.solve().assignment.tolist() == model.solve().assignment.tolist()
    # the article's families alone keep the fast route
    assert TunaModel(2, 2, CORE4).caps.understood


def test_custom_family_can_make_the_model_infeasible():
    """Three main threads, two even cpus and at most one main thread per core (2)."""
    model = TunaModel(3, 1, CORE4).with_(EvenMainCores())
    assert brute_force_even(3, 1, CORE4, "scatter") is None
    with pytest.raises(InfeasibleModelError) as info:
        model.solve()
    # a minimal conflicting subset: (2) or (8) (one thread per core when WT <= C), each with it
    assert info.value.families in (("2", "even-main"), ("8", "even-main"))


class EvenMainCoresClaimed(EvenMainCores):
    """The same rule, but claiming (wrongly) that the greedy rules need to know nothing."""

    key = "even-main-claimed"

    def caps(self, inst):
        return {}


def test_a_family_claiming_no_caps_is_still_checked():
    """The constructive route checks its mapping with every family's numpy check: a greedy
    mapping that breaks the family is dropped, never returned."""
    model = TunaModel(2, 2, CORE4).with_(EvenMainCoresClaimed())
    assert model.caps.understood
    start = model.construct()
    assert start is None or not EvenMainCoresClaimed().violations(start, model.instance)
    m = model.solve()
    assert m.verify() == [] and np.all(m.assignment[:, 0] % 2 == 0)
    assert m.objective == pytest.approx(brute_force_even(2, 2, CORE4, "scatter"))


# -- the contract with the encodings ---------------------------------------------------

CONTRACT = {"assignment_constraints", "rank_cap", "worker_cap", "main_indicator",
            "physical_main_indicator", "product", "pair_sum", "symmetry_constraints",
            "extract", "canonical", "start"}


def test_encoding_contract_lists_every_member_and_both_encodings_implement_it():
    assert set(Encoding.__abstractmethods__) == CONTRACT
    for name in CONTRACT:
        assert getattr(Encoding, name).__doc__, f"Encoding.{name} is undocumented"
    for cls in (PairwiseEncoding, CountEncoding):
        assert not cls.__abstractmethods__
        missing = [name for name in CONTRACT if name not in vars(cls)]
        assert not missing, f"{cls.__name__} inherits abstract {missing}"


def test_an_incomplete_encoding_cannot_be_built():
    class Partial(Encoding):
        def assignment_constraints(self):
            return []

    caps = Caps.of(Instance(2, 2, CORE4), DEFAULT_FAMILIES)
    with pytest.raises(TypeError, match="abstract"):
        Partial(caps.instance, caps)


@pytest.mark.parametrize("encoding", ["counts", "pairwise"])
def test_auxiliary_objects_are_built_once(encoding):
    """The family owning a definition and the families reading it share its variables."""
    model = TunaModel(3, 3, CORE4, encoding=encoding)          # scenario 3: M_c is read by (11)+(12)
    _, enc, _ = model.build()
    first, second = enc.main_indicator(), enc.main_indicator()
    assert first[0] is second[0] and first[1] is second[1]
    expr, rows = enc.pair_sum("worker", enc.worker_count, maximize=True)
    assert enc.pair_sum("worker", enc.worker_count, maximize=True)[0] is expr


# -- merging the caps --------------------------------------------------------------------

class Conflicting(Family):
    key = "conflicting"

    def caps(self, inst):
        return {"load": (0, 1)}


class Misnamed(Family):
    key = "misnamed"

    def caps(self, inst):
        return {"loads": (0, 1)}


def test_caps_refuse_conflicts_and_unknown_rules():
    inst = Instance(2, 2, CORE4)
    with pytest.raises(ModelError, match=r"\(8\) and \(conflicting\) both set load"):
        Caps.of(inst, [SingleCore(), LogicalBalance(), Conflicting()])
    with pytest.raises(ModelError, match="unknown cap 'loads'"):
        Caps.of(inst, [Misnamed()])
    caps = Caps.of(inst, [SingleCore(), Conflicting(), MainLoadCap()])
    assert caps.load == (0, 1) and caps.understood
