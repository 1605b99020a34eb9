"""Every public callable that takes a ``topology`` takes what the docs promise.

The README, ``topology_from`` and the notebooks say a topology may be given as a
:class:`~tuna_lab.Topology`, a preset name or a spec string. The public names are
found by walking every public module's ``__all__``; each one with a ``topology``
parameter is called here with a preset name (it must work) and with a value of no
accepted form (it must raise :class:`~tuna_lab.errors.TopologyError` naming the
accepted forms, never an AttributeError from deep inside).
"""

import argparse
import importlib
import inspect
import os
import pkgutil

import pytest

import tuna_lab
from tuna_lab.errors import TopologyError

PRESET = "xeon-8272cl"

# Records that carry a topology's description, not a topology to read: a Placement is made by
# placement() (called below), a Plan's ``topology`` is the text a plan file stores.
RECORDS = {"tuna_lab.placement.policies.Placement", "tuna_lab.placement.plan.Plan"}


def takes_a_topology():
    """``{home qualname: object}`` of every public callable of tuna_lab with a ``topology`` parameter."""
    names = ["tuna_lab"] + [m.name for m in pkgutil.walk_packages(tuna_lab.__path__, "tuna_lab.")
                            if not any(part.startswith("_") for part in m.name.split("."))]
    found = {}
    for name in names:
        if name == "tuna_lab.server.gunicorn_conf":          # Gunicorn's config file: its master's environment
            continue
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr)
            if not callable(obj):
                continue
            try:
                params = inspect.signature(obj).parameters
            except (TypeError, ValueError):
                continue
            if "topology" in params:
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return found


def _call(qualname, topology):
    """Call the public callable ``qualname`` with ``topology`` and small, valid other arguments."""
    obj = takes_a_topology()[qualname]
    short = qualname.rsplit(".", 1)[1]
    calls = {
        "solve": lambda: obj(2, 2, topology, time_limit=30),
        "topology_shape": lambda: obj(topology),
        "client_cpus_of": lambda: obj(argparse.Namespace(client_cpus=None), topology=topology),
        "plan_for": lambda: obj("round-robin", 2, 2, topology),
        "worker_locality": lambda: obj(os.getpid(), topology),
        "reserve_client_cpus": lambda: obj(None, topology),
        "placement": lambda: obj("round-robin", 2, 2, topology),
        "compare": lambda: obj(2, 2, topology, ["cfs", "round-robin"]),
        "Server": lambda: obj(2, 2, topology=topology),                 # made, not started
        "PolicyComparison": lambda: obj(2, 2, topology, ["cfs"]),
        "policy_comparison": lambda: obj(2, 2, topology, ["cfs"]),
    }
    first = list(inspect.signature(obj).parameters)[:1]
    if short in calls:
        return calls[short]()
    if first == ["topology"]:
        return obj(topology)
    return obj(2, 2, topology)                                          # (workers, threads, topology, ...)


CASES = sorted(set(takes_a_topology()) - RECORDS)


def test_the_walk_finds_the_documented_entry_points():
    assert {"tuna_lab.model.tuna.solve", "tuna_lab.model.tuna.TunaModel", "tuna_lab.placement.policies.placement",
            "tuna_lab.widgets.controllers.ModeExplorer"} <= set(CASES)


@pytest.mark.parametrize("qualname", CASES)
def test_a_preset_name_is_a_topology(qualname):
    assert _call(qualname, PRESET) is not None


@pytest.mark.parametrize("bad", [5, "nope"])
@pytest.mark.parametrize("qualname", CASES)
def test_anything_else_is_refused_naming_the_accepted_forms(qualname, bad):
    with pytest.raises(TopologyError) as info:
        _call(qualname, bad)
    message = str(info.value)
    assert "preset" in message and PRESET in message and "synthetic" in message, message
