"""The API's edges a notebook user meets (issue 49): a name that is not there is refused, not stored unread.

Cheap: preset topologies, in-process, no server. The rest of the issue's API cases live beside their code
(tests/test_model.py: verify and the certificate; tests/test_families.py: the shape check;
tests/test_widgets.py: setters, violated(), reprs).
"""

import pytest

from tuna_lab import solve
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
    # time_limit is read at the next solve; private state is the controller's own
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
