"""The API's edges a notebook user meets (issue 49): a name that is not there is refused, not stored unread.

Cheap: preset topologies, in-process, no server. The rest of the issue's API cases live beside their code
(tests/test_model.py: verify and the certificate; tests/test_families.py: the shape check;
tests/test_widgets.py: setters, violated(), reprs; tests/test_teaching.py: the explorer's lines); the
audit's follow-ups on verify, the certificates and improve are at the end of this file.
"""

import re

import numpy as np
import pytest

from tuna_lab import TunaModel, solve
from tuna_lab.errors import ModelError
from tuna_lab.widgets import ConstraintToggles, DistanceView, ModeExplorer, PolicyComparison


@pytest.fixture(scope="module")
def explorer():
    return ModeExplorer("xeon-8272cl", workers=2, threads=2)


def test_a_typo_of_an_input_is_refused_not_silently_kept(explorer):
    # before: ex.worker = 5 (no s) stored an attribute nothing reads, and the mapping kept 2 workers
    with pytest.raises(AttributeError, match="ModeExplorer has no member 'worker' to assign: its inputs are "
                                             "topology, workers, threads, mode, physical"):
        explorer.worker = 5
    assert not hasattr(explorer, "worker") and explorer.mapping.workers == 2
    dv = DistanceView("epyc-7313p")
    # the constructor's parameter is cpus=, the input highlighted: dv.cpus = [0, 1] highlighted nothing
    with pytest.raises(AttributeError, match="its inputs are topology, highlighted"):
        dv.cpus = [0, 1]
    assert dv.highlighted == frozenset()
    dv.highlighted = [0, 1]
    assert dv.highlighted == {0, 1}
    ct = ConstraintToggles(2, 2, "xeon-8272cl")
    with pytest.raises(AttributeError, match=r"ConstraintToggles has no member 'without' to assign: set_enabled\(\)"):
        ct.without = ["8"]


def test_a_setting_the_controller_has_stays_assignable(explorer):
    # time_limit is an input (it re-solves); private state is the controller's own
    explorer.time_limit = 5.0
    assert explorer.time_limit == 5.0
    pc = PolicyComparison(2, 2, "xeon-8272cl", ["omp-close"])
    pc.time_limit = 2.0
    assert pc.time_limit == 2.0


def test_a_distance_figure_of_an_unknown_kind_is_a_model_error():
    with pytest.raises(ModelError, match="kind must be 'matrix' or 'tree', got 'pie'"):
        DistanceView("epyc-7313p").figure("pie")


def test_verify_refuses_an_unknown_family_key_with_the_known_ones():
    m = solve(4, 4, "xeon-8272cl")
    assert m.verify(["11-12"]) == [] and m.verify(["(8)", "8p"]) == []
    with pytest.raises(ModelError, match=r"unknown constraint family '11-13'; known: 1 \(SingleCore\)"):
        m.verify(["11-13"])


# -- the audit of issue 49: verify, the certificates, improve ------------------------------------

def test_a_mapping_of_a_model_without_objective_terms_shows_a_certificate_of_nothing():
    alone = solve(4, 4, "xeon-8272cl", families=["1"])
    # before: {'name': 'counting', 'proven': True, 'objective': 0.0, ..., 'certifies': []}
    assert repr(alone.certificate) == (
        "NoCertificate(certifies nothing: the model maximises no objective term ((4-5) and (6-7) left out), "
        "so any mapping meeting its constraints is optimal)")
    # still the dict the solve wrote, for code that reads its keys (a relaxed mapping's proof is in it)
    assert isinstance(alone.certificate, dict) and alone.certificate["certifies"] == []
    full = solve(4, 4, "xeon-8272cl")
    assert type(full.certificate) is dict and full.certificate["certifies"] == ["f_main", "f_mode"]
    # describe() and to_dict() say it as before
    assert "no certificate: the model maximises" in alone.describe() and alone.to_dict()["certificate"] is None


@pytest.mark.parametrize("families, text", [
    (None, "Certificate(counting: certifies f_main + f_mode, bound=1500, step=46)"),
    (["1", "2", "3", "4-5"], "Certificate(counting: certifies f_main only (f_mode not in the model), bound=300, "
                             "step=46)"),
    (["1"], "Certificate(counting: certifies nothing (the model has no objective term), bound=0)"),
])
def test_a_bound_certificate_reads_as_what_it_certifies(families, text):
    # before: Certificate(name='counting', bound=1500.0, constant=2000.0, levels=(-40.0, -460.0), ...)
    assert repr(TunaModel(4, 4, "xeon-8272cl", families=families).certificate()) == text


@pytest.mark.parametrize("bad, words", [
    (3.5, "unknown constraint family 3.5; known: 1 (SingleCore)"),              # before: TypeError
    (object(), "unknown constraint family <object object at"),                   # before: TypeError
    (b"8", "verify: a family is named by a str key such as '8', not bytes: got b'8'"),   # before: family 56
])
def test_verify_names_one_family_as_with_and_without_do(bad, words):
    m = solve(4, 4, "xeon-8272cl")
    with pytest.raises(ModelError, match=re.escape(words)):
        m.verify(bad)
    if not isinstance(bad, bytes):
        with pytest.raises(ModelError, match=re.escape(words)):
            TunaModel(4, 4, "xeon-8272cl").with_(bad)
    assert m.verify("8") == m.verify({"8", "11-12"}) == m.verify(f for f in ["8"]) == []


@pytest.mark.parametrize("start, words", [
    ([[0, 1], [2]], "got a ragged sequence"),                   # before: numpy's ValueError
    ([["a", "b"], ["c", "d"]], "integer core positions"),       # before: ValueError: invalid literal for int()
    ([[0, 1], [2, 999]], "got 999 for thread 1 of worker 1"),    # before: IndexError
    ([[0, 1], [2, -1]], "thread 1 of worker 1 is unassigned"),
])
def test_improve_refuses_a_start_that_is_not_a_mapping_of_the_model(start, words):
    model = TunaModel(2, 2, "xeon-8272cl")
    with pytest.raises(ModelError, match=words):
        model.improve(start)
    good = model.construct()
    assert model.improve(good) is good and model.improve(None) is None
    assert np.array_equal(model.improve(good.tolist()), good)
