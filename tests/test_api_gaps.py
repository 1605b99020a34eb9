"""Gaps in the API a notebook user meets: what a family check accepts, what ``solve --json``
claims, and what the mode explorer proposes where the workers fill the machine."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tuna_lab import Topology, solve
from tuna_lab.errors import ModelError
from tuna_lab.model.families import DEFAULT_FAMILIES, Family
from tuna_lab.model.instance import Instance
from tuna_lab.widgets import ModeExplorer

XEON = Topology.preset("xeon-8272cl")


# -- a family check refuses what is not an assignment of this topology's cores ----------

@pytest.mark.parametrize("bad, words", [
    ([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12]], "ragged sequence"),    # before: numpy's ValueError
    (np.full((4, 4), 999), "core positions 0..31 of this topology"),            # before: [] from (2), (3), (8) ...
    (np.full((4, 4), -2), "got -2 for thread 0 of worker 0"),                   # before: [] as well
    (np.arange(16).reshape(4, 4) + 20, r"got 32 for thread 0 of worker 3 \(and 3 more\)"),
])
def test_every_family_check_refuses_a_ragged_or_out_of_range_assignment(bad, words):
    inst = Instance(4, 4, XEON)
    for fam in DEFAULT_FAMILIES:
        for check in (fam.violations, fam.residual, fam.value):
            with pytest.raises(ModelError, match=words) as info:
                check(bad, inst)
            assert "\n" not in str(info.value)


def test_unassigned_threads_stay_for_single_core_to_report_and_a_family_of_ones_own_is_checked_too():
    inst = Instance(2, 2, XEON)
    # -1 is an unassigned thread (Mapping.positions writes it for a cpu the topology lacks): (1) flags it
    assert [v.index for v in DEFAULT_FAMILIES[0].violations([[0, -1], [1, 2]], inst)] == [(0, 1)]

    class Mine(Family):
        key = "mine"

        def violations(self, assign, inst):
            return []

    with pytest.raises(ModelError, match="got 999"):
        Mine().violations([[0, 1], [2, 999]], inst)
    with pytest.raises(ModelError, match="ragged"):
        Mine().violations([[0, 1], [2]], inst)


# -- solve --json makes no certificate claim for a model it does not cover ---------------

ONLY_1 = "2,3,4-5,6-7,8,8p,9-10,11-12,11p-12p"


def _solve_json(*extra):
    out = subprocess.run([sys.executable, "-m", "tuna_lab", "solve", "-w", "4", "-t", "4", "--preset", "xeon-8272cl",
                          "--json", *extra], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_solve_json_claims_no_certificate_for_a_model_without_objective_terms():
    alone = _solve_json("--without", ONLY_1)
    # before: "certificate": {"name": "counting", "proven": true, ..., "certifies": []} beside "objective": 1500
    assert alone["families"] == ["1"] and alone["certificate"] is None
    assert alone["no_certificate"].startswith("the model maximises no objective term")
    full = _solve_json()
    assert full["certificate"]["proven"] is True and full["certificate"]["certifies"] == ["f_main", "f_mode"]
    assert full["no_certificate"] is None
    # the same words as the text output, which already left the certificate out
    assert alone["no_certificate"] in solve(4, 4, XEON, families=["1"]).describe()


# -- the mode explorer names a fix where the workers fill the machine --------------------

@pytest.mark.parametrize("spec, fix", [
    ("epyc-7313p", "1 x 8 (fewer threads) makes them differ"),
    ("xeon-8272cl", "1 x 16 (fewer threads) with the physical-core balance off makes them differ"),
])
def test_the_mode_explorer_proposes_fewer_threads_where_one_worker_fills_the_machine(spec, fix):
    ex = ModeExplorer(spec, 1, 32)
    # before: "no small change tried (physical balance off, more threads, several L3s) makes them differ"
    assert not ex.differ() and fix in ex.why_same()
    # the change it names does separate them
    ex.threads = int(fix.split(" x ")[1].split()[0])
    if "balance off" in fix:
        ex.toggle_physical()
    assert ex.differ()


def test_fewer_workers_are_tried_too():
    ex = ModeExplorer("epyc-7313p", 32, 1)
    assert not ex.differ() and "makes them differ" in ex.why_same()
    from tuna_lab.model.modes import _candidates
    words = [w for w, _ in _candidates(ex.mapping.instance, True)]
    assert "16 x 2 (fewer workers)" in words and "1 x 2 (fewer workers)" in words
