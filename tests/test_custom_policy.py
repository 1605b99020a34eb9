"""A policy defined here, and only here, runs everywhere a built-in one does.

Adding a policy is one ``register`` call: this file defines "every thread on
the last CPU" and takes it through ``placement``/``Plan``, ``tuna-lab plan``,
the lab server and ``run`` without touching any other file of the package.
"""

import json
import os

import pytest

from tuna_lab import Topology
from tuna_lab.cli import main
from tuna_lab.errors import ExperimentError, PolicyError
from tuna_lab.measure.experiment import Config, LoadSpec, TrialSpec, check_policies, run
from tuna_lab.placement import (POLICIES, PinnedBy, Plan, Policy, get_policy, placement, policy_names, register,
                                registered_policies, unregister)

CORE4 = Topology.synthetic("core:4 pu:1")
NAME = "last-cpu"


def _last_cpu(workers, threads, topology, **options):
    return [[topology.cpus[-1]] * threads for _ in range(workers)]


@pytest.fixture(scope="module", autouse=True)
def last_cpu():
    policy = register(Policy(NAME, "every thread of every worker on the last CPU", _last_cpu))
    yield policy
    unregister(NAME)


def test_a_registered_policy_places_and_plans_like_a_built_in_one():
    p = placement(NAME, 2, 3, CORE4)
    assert p.policy == NAME and p.pinned_by is PinnedBy.TUNA_LAB and p.env == {}
    assert p.as_array().tolist() == [[3, 3, 3], [3, 3, 3]]
    plan = p.plan()
    assert plan.slots == (((3,),) * 3,) * 2 and Plan.from_dict(plan.to_dict()) == plan
    assert plan.to_dict()["pinned_by"] == "tuna_lab"
    # listed after the built-in policies, which keep their order
    assert policy_names()[:len(POLICIES)] == POLICIES and policy_names()[-1] == NAME
    assert get_policy(NAME).needs_solver is False and check_policies(["cfs", NAME]) == ["cfs", NAME]


def test_the_registry_refuses_duplicates_and_malformed_policies():
    with pytest.raises(PolicyError, match="registered already"):
        register(Policy(NAME, "again", _last_cpu))
    with pytest.raises(PolicyError, match="registered already"):
        register(Policy("cfs", "a second cfs", _last_cpu))
    for bad in (lambda: Policy("a,b", "comma", _last_cpu), lambda: Policy("x", "", _last_cpu),
                lambda: Policy("x", "not callable", 3), lambda: Policy("x", "who?", _last_cpu, pinned_by="kernel"),
                lambda: unregister("never-registered"), lambda: placement("never-registered", 1, 1, CORE4),
                lambda: register("cfs")):
        with pytest.raises(PolicyError):
            bad()
    with pytest.raises(ExperimentError, match="unknown policy"):
        check_policies(["never-registered"])
    # A place function that returns the wrong shape is named in the error.
    register(Policy("too-few", "one worker only", lambda W, T, topo, **_: [[0] * T]))
    try:
        with pytest.raises(PolicyError):
            placement("too-few", 2, 1, CORE4)
    finally:
        unregister("too-few")
    assert "too-few" not in policy_names()


def test_needing_the_solver_is_declared_not_read_from_the_name():
    assert [p.name for p in registered_policies() if p.needs_solver] == ["tuna-scatter", "tuna-compact"]
    register(Policy("tuna-lookalike", "a tuna- name that needs no solver", _last_cpu))
    try:
        assert get_policy("tuna-lookalike").needs_solver is False
        assert placement("tuna-lookalike", 1, 1, CORE4).mapping is None
    finally:
        unregister("tuna-lookalike")


def test_tuna_lab_plan_offers_it(capsys):
    assert main(["plan", "-w", "2", "-t", "1", "--policy", NAME, "--preset", "xeon-8272cl", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["policy"] == NAME and [s["main"] for s in data["slots"]] == [[31], [31]]
    assert main(["plan", "-w", "1", "-t", "1", "--policy", "nope", "--preset", "xeon-8272cl"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and NAME in err
    assert err.startswith("tuna-lab: error: unknown policy 'nope'")


def test_run_pins_the_lab_server_with_it(tmp_path):
    # One tiny trial: run() starts the lab server under the policy, which binds every worker thread to the
    # last CPU (the master is not a worker: the policy does not place it).
    threads = min(2, len(os.sched_getaffinity(0)))
    result = run(Config(1, threads, "small", 10), [NAME], trials=1, load=LoadSpec(5), trial=TrialSpec(warmup=2),
                 out=str(tmp_path / "c"))
    assert (result.trials["policy"] == NAME).all() and (result.trials["trial_status"] == "ok").all()
    last = str(max(os.sched_getaffinity(0)))
    workers = result.threads[result.threads["role"].isin(["main", "pool"])]
    assert set(workers["role"]) == {"main", "pool"} and set(workers["cpus"]) == {last}, result.threads


def test_the_widgets_and_the_cli_help_list_it(capsys):
    from tuna_lab.widgets import PolicyComparison, compared_policies

    assert compared_policies()[-1] == NAME and "cfs" not in compared_policies()
    pc = PolicyComparison(2, 2, CORE4)
    assert pc.loads[NAME].tolist() == [0, 0, 0, 4]
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert NAME in capsys.readouterr().out
