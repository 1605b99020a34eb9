"""Tests of tuna_lab.machine.topology: presets, distances, hwloc agreement, sysfs, bad inputs."""

import io
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies import numa_topologies, relabelled, synthetic_specs, topologies
from tuna_lab.errors import TopologyError, TopologyWarning
from tuna_lab.machine.topology import DEFAULT_COSTS, PRESETS, Topology

DATA = Path(__file__).parent / "data"
LSTOPO = shutil.which("lstopo")
needs_lstopo = pytest.mark.skipif(LSTOPO is None, reason="lstopo (hwloc) is not on PATH")


def lstopo_xml(*args):
    """XML text exported by lstopo (synthetic input or this machine)."""
    return subprocess.run([LSTOPO, *args, "--of", "xml", "-"], check=True,
                          capture_output=True, text=True, timeout=30).stdout


def assert_same_machine(a, b):
    assert a.cpus == b.cpus
    for attr in ("core", "package", "numa"):
        np.testing.assert_array_equal(getattr(a, attr), getattr(b, attr), err_msg=attr)
    assert a.caches.keys() == b.caches.keys()
    for level in a.caches:
        np.testing.assert_array_equal(a.caches[level], b.caches[level], err_msg=level)
    np.testing.assert_array_equal(a.distance(), b.distance())


# ------------------------------------------------------------------ presets
@pytest.mark.parametrize("name, C, P, packages, l3, numa", [
    ("xeon-8272cl", 32, 16, 1, 1, 1),
    ("xeon-8260-2s", 96, 48, 2, 2, 2),
    ("epyc-7313p", 32, 16, 1, 4, 1),
    ("epyc-9654", 192, 96, 1, 12, 1),
    ("epyc-9654-2s", 384, 192, 2, 24, 2),
])
def test_preset_sizes(name, C, P, packages, l3, numa):
    topo = Topology.preset(name)
    assert name in PRESETS and topo.name == name
    assert (topo.n_logical, topo.n_physical, topo.threads_per_core) == (C, P, 2)
    assert topo.cpus == tuple(range(C))
    assert topo.package.max() + 1 == packages
    assert topo.caches["L3"].max() + 1 == l3
    assert topo.numa.max() + 1 == numa
    # Linux SMT numbering: physical core x owns logical cores x and x + P.
    assert topo.siblings() == [(x, x + P) for x in range(P)]
    assert repr(topo) == f"Topology({name!r}, C={C}, P={P}, packages={packages}, L3 domains={l3})"


def test_preset_distances():
    d = Topology.preset("xeon-8272cl").distance()
    assert d.shape == (32, 32) and d.dtype == float
    np.testing.assert_array_equal(np.diag(d), 1)
    assert d[0, 16] == d[16, 0] == 4  # SMT siblings share L1
    assert d[0, 1] == d[3, 30] == 50  # everything else shares the L3
    np.testing.assert_array_equal(d, d.T)

    d = Topology.preset("xeon-8260-2s").distance()
    assert d[5, 53] == 4 and d[0, 23] == 50
    assert d[0, 24] == d[0, 72] == d[47, 48] == 200  # across sockets

    d = Topology.preset("epyc-9654").distance()
    assert d[0, 7] == 50 and d[0, 8] == 200 and d[8, 104] == 4  # CCD = 8 cores


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_structure(name):
    topo = Topology.preset(name)
    d = topo.distance()
    np.testing.assert_array_equal(d, d.T)
    assert topo.is_ultrametric()
    costs = [cost for cost, _ in topo.levels()]
    assert costs == [4, 50]  # L1 = L2 = physical core, merged at the cheaper cost
    g = topo.graph()
    assert nx.is_tree(g) and g.nodes[("machine", 0)]["cpus"] == topo.cpus
    assert {n for n in g if g.out_degree(n) == 0} == {("pu", c) for c in topo.cpus}
    assert g.nodes[("core", 3)] == {"kind": "core", "index": 3,
                                    "cpus": (3, 3 + topo.n_physical)}


def test_unknown_preset_lists_names():
    with pytest.raises(TopologyError, match="xeon-8272cl") as info:
        Topology.preset("xeon-9999")
    assert "\n" not in str(info.value)


# -------------------------------------------------------------------- costs
def test_costs_parameter():
    topo = Topology.preset("epyc-7313p")
    d = topo.distance({"L3": 60, "none": 500})
    assert d[0, 1] == 60 and d[0, 4] == 500 and d[0, 16] == 4
    custom = Topology.preset("epyc-7313p")
    custom = Topology(custom.name, custom.cpus, custom.core, custom.package, custom.numa,
                      custom.caches, costs={"L1": 2})
    assert custom.costs == {**DEFAULT_COSTS, "L1": 2}
    assert custom.distance()[0, 16] == 2
    assert custom.distance({"L1": 3})[0, 16] == 3
    assert [cost for cost, _ in topo.levels({"L3": 60})] == [4, 60]


@pytest.mark.parametrize("costs", [
    {"L1": -4}, {"L2": 0}, {"L3": "50"}, {"L3": float("nan")}, {"L1": True},
    {"L2": 60},                # L2 > L3
    {"none": 100},             # none < L4
    {"same": 5},               # diagonal above L1
    {"L5": 300},               # unknown level
])
def test_bad_costs(costs):
    topo = Topology.synthetic("pack:2 l3:1 core:2 pu:2")
    with pytest.raises(TopologyError):
        topo.distance(costs)
    with pytest.raises(TopologyError):
        Topology("x", topo.cpus, topo.core, topo.package, topo.numa, topo.caches, costs)


def test_levels_merge_and_nesting():
    # L2 per L3 domain: identical partitions merge at the cheaper (L2) cost.
    topo = Topology.synthetic("l3:2 l2:1 core:2 pu:2")
    [(cost, labels)] = topo.levels()
    assert cost == 10 and labels.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # Equal costs merge to the coarser partition; L4 costs as much as "none" by default.
    topo = Topology.synthetic("l4:2 l3:2 l2:2 core:1 pu:2")
    assert [c for c, _ in topo.levels()] == [10, 50]
    assert [c for c, _ in topo.levels({"L2": 50})] == [50]
    assert [c for c, _ in topo.levels({"L4": 100})] == [10, 50, 100]

    crossed = Topology("crossed", (0, 1, 2, 3), [0, 1, 2, 3], [0] * 4, [0] * 4,
                       {"L2": [0, 0, 1, 1], "L3": [0, 1, 1, 2]})
    with pytest.raises(TopologyError, match="not nested"):
        crossed.levels()
    assert not crossed.is_ultrametric()


# -------------------------------------------------------------- synthetic
@pytest.mark.parametrize("spec, C, P, packages", [
    ("pack:2 l3:2 core:2 pu:2", 16, 8, 2),
    ("numa:2 core:3 pu:1", 6, 6, 1),
    ("package:1 l2:4 core:1 pu:2", 8, 4, 1),
    ("core:4 pu:2", 8, 4, 1),
    ("pack:2 pu:2", 4, 4, 2),  # no core level: each PU is its own core
    ("Socket:2 NODE:1 L3Cache:1(size=32MB) l1d:2 core:1 pu:1", 4, 4, 2),
    ("pack:1 l1i:2 core:1 pu:2", 4, 2, 1),  # instruction caches are ignored
])
def test_synthetic_shapes(spec, C, P, packages):
    topo = Topology.synthetic(spec)
    assert (topo.n_logical, topo.n_physical, topo.package.max() + 1) == (C, P, packages)
    assert topo.name == f"synthetic:{spec}"
    assert "L1i" not in topo.caches


def test_synthetic_labels():
    topo = Topology.synthetic("pack:2 l3:2 core:2 pu:2")
    assert topo.caches["L3"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    assert topo.siblings()[:2] == [(0, 1), (2, 3)]
    assert Topology.synthetic("numa:2 core:3 pu:1").numa.tolist() == [0, 0, 0, 1, 1, 1]
    # An explicit PU index list renames the OS ids as hwloc does.
    topo = Topology.synthetic("core:2 pu:2(indexes=0,2,1,3)")
    assert topo.siblings() == [(0, 2), (1, 3)]


@pytest.mark.parametrize("spec", [
    "", "   ", "pack:2 core:2", "core:2", "pack:0 pu:1", "pack:-1 pu:2", "pack:2x pu:1",
    "pack:2 core:2 pu:2 junk", "die:2 pu:1", "pack:2 core:2 pu:2 pu:1", "pack 2 pu 2",
    "l2:2 l3:2 pu:1", "core:2 pack:2 pu:1", "pack:2 pu:2 (size=1)", "pack:1000 core:1000 pu:1000",
    "core:2 pu:2(indexes=0,1,2)", "core:2 pu:2(indexes=pu:core)",
])
def test_bad_synthetic(spec):
    with pytest.raises(TopologyError) as info:
        Topology.synthetic(spec)
    assert str(info.value) and "\n" not in str(info.value)


@needs_lstopo
@pytest.mark.parametrize("spec", [
    "pack:2 l3:2 core:2 pu:2", "numa:2 core:3 pu:1", "pack:1 l3:2 l2:2 core:1 pu:2", "core:4 pu:2",
    "pack:2 numa:2 l3:1 l2:2 l1:1 core:1 pu:2", "pack:2 l3:1 numa:2 core:2 pu:1", "pack:2 pu:2",
    "l4:2 l3:2 core:1 pu:1", "pack:1 l3:2 core:2 pu:2(indexes=0,4,1,5,2,6,3,7)",
])
@pytest.mark.parametrize("xml_version", ["v2", "v1"])
def test_synthetic_matches_lstopo(spec, xml_version):
    flags = ["--export-xml-flags", "v1"] if xml_version == "v1" else []
    xml = lstopo_xml("--input", spec, *flags)
    assert_same_machine(Topology.synthetic(spec), Topology.from_hwloc_xml(xml))


@needs_lstopo
@settings(max_examples=10, deadline=None)
@given(synthetic_specs())
def test_random_synthetic_matches_lstopo(spec):
    assert_same_machine(Topology.synthetic(spec), Topology.from_hwloc_xml(lstopo_xml("--input", spec)))


# ---------------------------------------------------------------- hwloc XML
def test_xml_fixtures():
    # hwloc v1 XML: Socket objects, NUMA nodes as parents, type="Cache" depth="N".
    v1 = Topology.from_hwloc_xml(DATA / "v1_pack2_l3_smt.xml")
    assert v1.name == "v1_pack2_l3_smt.xml"
    assert_same_machine(v1, Topology.synthetic("pack:2 numa:1 l3:1 l2:2 l1:1 core:1 pu:2"))
    assert v1.numa.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # hwloc v2 XML with Linux-style SMT numbering, read from an open file.
    with open(DATA / "v2_linux_smt.xml", "rb") as f:
        v2 = Topology.from_hwloc_xml(f)
    assert v2.siblings() == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert v2.distance()[0, 4] == 4 and v2.distance()[0, 1] == 50 and v2.distance()[0, 2] == 200


def test_xml_pus_without_core_and_text_input():
    xml = """<topology version="2.0"><object type="Machine" os_index="0">
      <object type="NUMANode" os_index="0"/>
      <object type="L2Cache" cache_type="0"><object type="PU" os_index="3"/><object type="PU" os_index="1"/></object>
      <object type="L1iCache" cache_type="2"><object type="PU" os_index="0"/></object>
    </object></topology>"""
    topo = Topology.from_hwloc_xml(xml)
    assert topo.cpus == (0, 1, 3) and topo.n_physical == 3
    assert list(topo.caches) == ["L2"]
    assert topo.distance()[1, 2] == 10 and topo.distance()[0, 1] == 200


@pytest.mark.parametrize("text, match", [
    ("<topology><object type='Machine'><object type='PU' os_index='0'/>", "malformed"),
    ("<topology version='2.0'><object type='Machine' os_index='0'/></topology>", "no PU"),
    ("<html><body/></html>", "not hwloc XML"),
    ("<topology><object type='PU'/></topology>", "os_index"),
])
def test_bad_xml(text, match):
    with pytest.raises(TopologyError, match=match):
        Topology.from_hwloc_xml(text)


def test_bad_xml_file_names_the_file(tmp_path):
    full = (DATA / "v1_pack2_l3_smt.xml").read_text()
    truncated = tmp_path / "truncated.xml"
    truncated.write_text(full[: len(full) // 2])
    with pytest.raises(TopologyError, match="truncated.xml"):
        Topology.from_hwloc_xml(truncated)
    with pytest.raises(TopologyError, match="missing.xml"):
        Topology.from_hwloc_xml(tmp_path / "missing.xml")
    with pytest.raises(TopologyError, match="hwloc XML"):
        Topology.from_hwloc_xml(io.BytesIO(b"<topology><object"))


# -------------------------------------------------------------------- sysfs
def write_sysfs(root, cpus, siblings, caches=(), nodes=None):
    """A fake /sys/devices/system tree: ``caches`` is [(level, type, {cpu: shared})]."""
    cpu_root = root / "cpu"
    for cpu in cpus:
        topo = cpu_root / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(siblings[cpu] + "\n")
        (topo / "physical_package_id").write_text("0\n")
        (topo / "core_id").write_text("0\n")
        for index, (level, kind, shared) in enumerate(caches):
            d = cpu_root / f"cpu{cpu}" / "cache" / f"index{index}"
            d.mkdir(parents=True)
            (d / "level").write_text(f"{level}\n")
            (d / "type").write_text(f"{kind}\n")
            (d / "shared_cpu_list").write_text(shared[cpu] + "\n")
    (cpu_root / "online").write_text(f"0-{max(cpus)}\n")
    for node, cpulist in (nodes or {}).items():
        (root / "node" / f"node{node}").mkdir(parents=True)
        (root / "node" / f"node{node}" / "cpulist").write_text(cpulist + "\n")
    (cpu_root / "cpufreq").mkdir()  # not a CPU, must be ignored
    return cpu_root


def test_fake_sysfs(tmp_path):
    siblings = {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}
    root = write_sysfs(tmp_path, range(4), siblings, caches=[
        (1, "Data", siblings), (1, "Instruction", siblings), (2, "Unified", siblings),
        (3, "Unified", dict.fromkeys(range(4), "0-3")),
    ], nodes={0: "0-1", 1: "2-3"})
    topo = Topology.from_sysfs(root)
    assert topo.cpus == (0, 1, 2, 3) and topo.name == "this machine"
    assert topo.siblings() == [(0, 2), (1, 3)]
    assert list(topo.caches) == ["L1", "L2", "L3"]
    assert topo.numa.tolist() == [0, 0, 1, 1]
    d = topo.distance()
    assert d[0, 2] == 4 and d[0, 1] == 50 and d[1, 1] == 1

    two = Topology.from_sysfs(root, allowed={0, 1})
    assert two.cpus == (0, 1) and two.n_physical == 2 and two.distance()[0, 1] == 50
    with pytest.raises(TopologyError, match="not online"):
        Topology.from_sysfs(root, allowed={0, 9})


def test_fake_sysfs_without_caches_or_numa(tmp_path):
    root = write_sysfs(tmp_path, range(2), {0: "0-1", 1: "0-1"})
    # No cache anywhere: the flat distances are said in one warning, never silently.
    with pytest.warns(TopologyWarning, match="no CPU cache information"):
        topo = Topology.from_sysfs(root)
    assert topo.caches == {} and topo.n_physical == 1 and topo.numa.tolist() == [0, 0]
    assert topo.distance()[0, 1] == DEFAULT_COSTS["none"]
    with pytest.raises(TopologyError):
        Topology.from_sysfs(tmp_path / "nowhere")


@pytest.mark.skipif(not Path("/sys/devices/system/cpu").is_dir(), reason="no Linux sysfs")
def test_sysfs_of_this_machine():
    topo = Topology.from_sysfs()
    assert set(topo.cpus) == os.sched_getaffinity(0)
    first = Topology.from_sysfs(allowed=[topo.cpus[0]])
    assert first.cpus == topo.cpus[:1] and first.n_logical == 1


@needs_lstopo
@pytest.mark.skipif(not Path("/sys/devices/system/cpu").is_dir(), reason="no Linux sysfs")
def test_sysfs_matches_lstopo():
    mine, hwloc = Topology.from_sysfs(), Topology.from_hwloc_xml(lstopo_xml())
    # lstopo shows the cgroup's cpuset; this process may be pinned to fewer CPUs.
    if set(mine.cpus) < set(hwloc.cpus):
        hwloc = hwloc.restrict(mine.cpus)
    assert mine.cpus == hwloc.cpus
    assert mine.siblings() == hwloc.siblings()
    np.testing.assert_array_equal(mine.package, hwloc.package)
    assert mine.caches.keys() == hwloc.caches.keys()
    for level in mine.caches:
        np.testing.assert_array_equal(mine.caches[level], hwloc.caches[level], err_msg=level)


# ------------------------------------------------------ readers, import cost
def test_each_classmethod_is_its_reader():
    from tuna_lab.machine.readers import hwloc_xml, synthetic, sysfs
    from tuna_lab.machine import topology as topology_module

    from tuna_lab.machine.readers import Reading

    assert topology_module.PRESETS is synthetic.PRESETS
    # The readers return plain data, which Topology.from_reading builds on.
    read = Topology.from_reading
    spec = "pack:2 l3:1 core:2 pu:2(indexes=0,4,1,5,2,6,3,7)"
    assert isinstance(synthetic.read_synthetic(spec), Reading)
    assert_same_machine(read(synthetic.read_synthetic(spec)), Topology.synthetic(spec))
    assert Topology.synthetic(spec).siblings() == [(0, 4), (1, 5), (2, 6), (3, 7)]
    preset = read(synthetic.read_preset("epyc-7313p"))
    assert preset.name == "epyc-7313p" and preset.siblings()[:2] == [(0, 16), (1, 17)]
    assert_same_machine(preset, Topology.preset("epyc-7313p"))
    path = DATA / "v2_numa2_distances.xml"
    from_xml = read(hwloc_xml.read_hwloc_xml(path))
    assert from_xml.name == path.name and from_xml.costs == Topology.from_hwloc_xml(path).costs
    assert from_xml.costs["remote"] > from_xml.costs["none"]      # the XML's latency matrix was applied
    assert_same_machine(from_xml, Topology.from_hwloc_xml(path))
    if Path("/sys/devices/system/cpu").is_dir():
        assert_same_machine(read(sysfs.read_sysfs()), Topology.from_sysfs())


def test_from_keys_groups_equal_keys():
    topo = Topology.from_keys("keys", [1, 4, 6], [(1, 6), (4,), (1, 6)], ["p"] * 3, [None] * 3,
                              {"L2": ["a", "b", "a"], "L3": [7, 7, 7]}, numa_os_index=[3, 3, 3])
    assert topo.cpus == (1, 4, 6) and topo.siblings() == [(1, 6), (4,)]
    assert topo.caches["L2"].tolist() == [0, 1, 0] and topo.caches["L3"].tolist() == [0, 0, 0]
    assert topo.numa_nodes() == {3: (1, 4, 6)}
    with pytest.raises(TopologyError, match="one per logical core"):
        Topology.from_keys("short", [0, 1], ["a"], ["p", "p"], [0, 0])


def test_with_numa_latency():
    topo = Topology.synthetic(TWO_SOCKETS)  # nodes 0 and 1, an L3 each
    assert topo.with_numa_latency([0, 1], [[10, 21], [21, 10]]).costs["remote"] == 420
    # Rows are matched by OS node id; nodes without cores of ours are ignored.
    matrix = [[10, 99, 32], [99, 10, 99], [32, 99, 10]]
    assert topo.with_numa_latency([1, 5, 0], matrix).costs["remote"] == 640
    for ids, matrix in [([0, 1], None), ([0, 2], [[10, 21], [21, 10]]),  # node 1 not covered
                        ([0, 1], [[10, 10], [10, 10]]), ([0, 1], [["x", 1], [1, 1]])]:
        assert topo.with_numa_latency(ids, matrix) is topo
    one_node = Topology.synthetic("core:2 pu:1")
    assert one_node.with_numa_latency([0, 1], [[10, 21], [21, 10]]) is one_node


@pytest.mark.skipif(not Path("/sys/devices/system/cpu").is_dir(), reason="no Linux sysfs")
def test_reading_this_machine_loads_no_heavy_module():
    # `tuna-lab topology --json` must start fast: numpy, and nothing heavier. (The XML parser is a
    # lazy module in sys.modules from the first import of the readers; ElementPath appears when it is
    # really loaded.)
    code = ("import json, sys\n"
            "from tuna_lab.machine import Topology, topology_from\n"
            "json.dumps(Topology.from_sysfs().to_dict())\n"
            "json.dumps(topology_from('xeon-8260-2s').to_dict())\n"
            "print(sorted(m for m in ('networkx', 'xml.etree.ElementPath', 'scipy', 'pandas', 'cvxpy')\n"
            "             if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         timeout=60).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------- derived topologies
def test_relabel_maps_pairs():
    topo = Topology.preset("epyc-7313p")
    perm = dict(zip(topo.cpus, np.random.default_rng(0).permutation(topo.cpus).tolist()))
    moved = topo.relabel(perm)
    d, e = topo.distance(), moved.distance()
    pos = {c: i for i, c in enumerate(moved.cpus)}
    for a, b in itertools.combinations(range(topo.n_logical), 2):
        assert e[pos[perm[topo.cpus[a]]], pos[perm[topo.cpus[b]]]] == d[a, b]
    with pytest.raises(TopologyError):
        topo.relabel({0: 1})
    with pytest.raises(TopologyError):
        topo.relabel(dict.fromkeys(topo.cpus, 0))


def test_restrict():
    topo = Topology.preset("xeon-8260-2s").restrict([0, 1, 48, 24])
    assert topo.cpus == (0, 1, 24, 48)
    assert topo.core.tolist() == [0, 1, 2, 0] and topo.package.tolist() == [0, 0, 1, 0]
    assert topo.distance()[0, 3] == 4 and topo.distance()[0, 2] == 200
    with pytest.raises(TopologyError, match="unknown"):
        topo.restrict([0, 500])
    with pytest.raises(TopologyError):
        topo.restrict([])


def test_to_dict_is_json():
    topo = Topology.preset("epyc-7313p")
    data = json.loads(json.dumps(topo.to_dict()))
    assert data["n_logical"] == 32 and data["n_physical"] == 16
    assert data["logical_cores"] == list(range(32))
    assert data["physical_core"][16] == 0 and data["caches"]["L3"][4] == 1
    assert np.array_equal(np.array(data["distance"]), topo.distance())
    assert data["costs"] == DEFAULT_COSTS and data["name"] == "epyc-7313p"


def test_arrays_are_read_only():
    topo = Topology.synthetic("core:2 pu:2")
    with pytest.raises(ValueError):
        topo.core[0] = 1
    with pytest.raises(AttributeError):
        topo.name = "other"


# --------------------------------------------------------------- properties
@settings(max_examples=60, deadline=None)
@given(topologies())
def test_distance_is_an_ultrametric(topo):
    d = topo.distance()
    np.testing.assert_array_equal(d, d.T)
    np.testing.assert_array_equal(np.diag(d), DEFAULT_COSTS["same"])
    # d(a, c) <= max(d(a, b), d(b, c)) for every triple.
    assert np.all(d[:, None, :] <= np.maximum(d[:, :, None], d[None, :, :]))
    assert topo.is_ultrametric()
    # levels() rebuilds d: the first (finest) shared level gives the cost.
    rebuilt = np.full_like(d, DEFAULT_COSTS["none"])
    for cost, labels in reversed(topo.levels()):
        rebuilt[labels[:, None] == labels[None, :]] = cost
    np.fill_diagonal(rebuilt, DEFAULT_COSTS["same"])
    np.testing.assert_array_equal(rebuilt, d)
    chain = topo.levels()
    assert all(a < b for (a, _), (b, _) in zip(chain, chain[1:]))
    for (_, fine), (_, coarse) in zip(chain, chain[1:]):
        assert len(set(zip(fine.tolist(), coarse.tolist()))) == fine.max() + 1  # nested


@settings(max_examples=40, deadline=None)
@given(relabelled())
def test_relabel_keeps_distances(case):
    topo, perm = case
    moved = topo.relabel(perm)
    assert moved.cpus == topo.cpus and sorted(map(len, moved.siblings())) == sorted(topo.smt)
    d, e = topo.distance(), moved.distance()
    np.testing.assert_array_equal(np.sort(d, axis=None), np.sort(e, axis=None))
    idx = np.searchsorted(moved.cpus, [perm[c] for c in topo.cpus])
    np.testing.assert_array_equal(e[np.ix_(idx, idx)], d)
    assert nx.is_isomorphic(topo.graph(), moved.graph())


# ------------------------------------------------------- NUMA (remote) level
TWO_SOCKETS = "pack:2 numa:1 l3:1 l2:2 core:1 pu:2"   # L3 and NUMA node per socket


def test_remote_cost_is_off_by_default():
    for name in PRESETS:
        assert "remote" not in Topology.preset(name).costs
    topo = Topology.synthetic(TWO_SOCKETS)
    assert topo.distance()[0, 4] == DEFAULT_COSTS["none"]
    # "remote" equal to "none", or one NUMA node, leaves d and levels() as they are.
    for same in (topo.with_costs({"remote": 200}), Topology.synthetic("pack:1 l3:2 core:2 pu:1")
                 .with_costs({"remote": 420})):
        base = same.with_costs({"remote": None})
        np.testing.assert_array_equal(same.distance(), base.distance())
        assert [(c, lab.tolist()) for c, lab in same.levels()] == \
               [(c, lab.tolist()) for c, lab in base.levels()]


def test_remote_level_distance_and_levels():
    topo = Topology.synthetic(TWO_SOCKETS).with_costs({"remote": 420})
    d = topo.distance()
    assert d[0, 1] == 10 and d[0, 2] == 50 and d[0, 4] == d[3, 7] == 420
    assert topo.is_ultrametric()
    # L3 = NUMA node per socket: the node level merges into L3; the machine closes at 420.
    assert [(c, lab.tolist()) for c, lab in topo.levels()] == [
        (10.0, [0, 0, 1, 1, 2, 2, 3, 3]), (50.0, [0, 0, 0, 0, 1, 1, 1, 1]), (420.0, [0] * 8)]
    # Two nodes per socket, no shared cache: the node level costs "none".
    topo = Topology.synthetic("pack:2 numa:2 core:2 pu:1")
    assert [c for c, _ in topo.levels({"remote": 300})] == [200.0, 300.0]
    assert topo.distance({"remote": 300})[0, [1, 2, 4]].tolist() == [200.0, 300.0, 300.0]
    # costs given per call, or removed per call
    assert topo.with_costs({"remote": 300}).distance({"remote": None})[0, 4] == 200
    assert topo.with_costs({"remote": 300}).to_dict()["costs"]["remote"] == 300


@pytest.mark.parametrize("costs", [
    {"remote": 100},                      # remote < none
    {"none": 500, "remote": 450},
    {"remote": "420"}, {"remote": True}, {"remote": float("inf")}, {"remote": 0},
    {"Remote": 420},
])
def test_bad_remote_costs(costs):
    topo = Topology.synthetic("numa:2 core:2 pu:1")
    with pytest.raises(TopologyError, match="remote|Remote"):
        topo.distance(costs)
    with pytest.raises(TopologyError):
        topo.with_costs(costs)


def test_numa_node_splitting_a_cache_is_refused():
    # L3 domain 1 holds cpus 1 and 2, which sit on different NUMA nodes.
    split = Topology("split", (0, 1, 2, 3), [0, 1, 2, 3], [0] * 4, [0, 0, 1, 1],
                     {"L3": [0, 1, 1, 2]}, {"remote": 420})
    assert split.distance()[0, 1] == 200 and split.distance()[1, 2] == 50 and split.distance()[0, 2] == 420
    assert not split.is_ultrametric()
    with pytest.raises(TopologyError, match="NUMA nodes do not nest.*L3") as info:
        split.levels()
    assert "\n" not in str(info.value)
    assert len(split.levels({"remote": None})) == 1      # without the remote cost: as before
    # Nodes below one L3 (sub-NUMA clustering): refused as well.
    with pytest.raises(TopologyError, match="NUMA nodes do not nest"):
        Topology.synthetic("pack:2 l3:1 numa:2 core:2 pu:1").levels({"remote": 420})


def test_numa_os_index_follows_restrict_and_relabel():
    topo = Topology("t", (0, 1, 2, 3), [0, 1, 2, 3], [0, 0, 1, 1], [0, 0, 1, 1],
                    numa_os_index=[2, 2, 5, 5])
    assert topo.numa_nodes() == {2: (0, 1), 5: (2, 3)}
    sub = topo.restrict([2, 3])
    assert sub.numa.tolist() == [0, 0] and sub.numa_nodes() == {5: (2, 3)}
    assert topo.relabel({0: 3, 1: 2, 2: 1, 3: 0}).numa_nodes() == {2: (2, 3), 5: (0, 1)}
    assert topo.to_dict()["numa_os_index"] == [2, 2, 5, 5]
    assert Topology.synthetic("numa:2 core:2 pu:1").numa_nodes() == {0: (0, 1), 1: (2, 3)}
    with pytest.raises(TopologyError, match="numa_os_index"):
        Topology("t", (0, 1), [0, 1], [0, 0], [0, 1], numa_os_index=[3, 3])
    with pytest.raises(TopologyError, match="numa_os_index"):
        Topology("t", (0, 1), [0, 1], [0, 0], [0, 1], numa_os_index=[0])


@pytest.mark.parametrize("name, remote", [
    ("v2_numa2_distances.xml", 420.0),   # 10 / 21
    ("v1_numa2_distances.xml", 420.0),   # the same in hwloc 1.x form (1.0 / 2.1, base 10)
    ("v2_numa4_distances.xml", 360.0),   # 10 / 12 (same socket) / 21: mean ratio 1.8
])
def test_remote_cost_from_hwloc_distances(name, remote):
    topo = Topology.from_hwloc_xml(DATA / name)
    assert topo.costs["remote"] == remote
    assert topo.is_ultrametric() and topo.levels()[-1][0] == remote
    nodes = topo.numa_nodes()
    assert topo.distance()[0, -1] == remote
    assert nodes[0][0] == topo.cpus[0] and topo.cpus[-1] in nodes[max(nodes)]


def test_hwloc_distances_ignored_for_bandwidth_or_split_caches():
    xml = (DATA / "v2_numa2_distances.xml").read_text()
    assert 'kind="5"' in xml        # from the OS, latency
    assert "remote" not in Topology.from_hwloc_xml(xml.replace('kind="5"', 'kind="9"')).costs
    # Two nodes below each socket's one L3: a remote cost would break levels(), so none is set.
    split = Topology.from_hwloc_xml(DATA / "v2_numa4_split_l3_distances.xml")
    assert "remote" not in split.costs and split.numa_nodes()[3] == (6, 7)
    assert [c for c, _ in split.levels()] == [50.0]
    with pytest.raises(TopologyError, match="NUMA nodes do not nest"):
        split.levels({"remote": 420})


def test_remote_cost_from_sysfs_node_distance(tmp_path):
    siblings = {c: str(c) for c in range(4)}
    l2 = {0: "0-1", 1: "0-1", 2: "2-3", 3: "2-3"}
    root = write_sysfs(tmp_path, range(4), siblings, caches=[(2, "Unified", l2)],
                       nodes={0: "0-1", 1: "2-3"})
    node = tmp_path / "node"
    (node / "node0" / "distance").write_text("10 21\n")
    (node / "node1" / "distance").write_text("21 10\n")
    (node / "online").write_text("0-1\n")
    topo = Topology.from_sysfs(root)
    assert topo.costs["remote"] == 420 and topo.distance()[0, 2] == 420 and topo.distance()[0, 1] == 10
    assert topo.numa_nodes() == {0: (0, 1), 1: (2, 3)}
    # restricted to one node: the cost is kept but changes nothing
    one = Topology.from_sysfs(root, allowed={2, 3})
    assert one.numa_nodes() == {1: (2, 3)} and one.distance()[0, 1] == 10
    # a malformed row is ignored
    (node / "node1" / "distance").write_text("21\n")
    assert "remote" not in Topology.from_sysfs(root).costs


def test_remote_cost_from_sysfs_skips_split_caches(tmp_path):
    # An L3 shared by both nodes (sub-NUMA clustering): the remote cost would break levels().
    root = write_sysfs(tmp_path, range(4), {c: str(c) for c in range(4)},
                       caches=[(3, "Unified", dict.fromkeys(range(4), "0-3"))],
                       nodes={0: "0-1", 1: "2-3"})
    for n in (0, 1):
        (tmp_path / "node" / f"node{n}" / "distance").write_text("10 12\n" if n == 0 else "12 10\n")
    topo = Topology.from_sysfs(root)
    assert "remote" not in topo.costs and topo.levels()


@settings(max_examples=60, deadline=None)
@given(numa_topologies())
def test_remote_level_is_an_ultrametric(topo):
    d = topo.distance()
    np.testing.assert_array_equal(d, d.T)
    assert topo.is_ultrametric()
    none, remote = topo.costs["none"], topo.costs["remote"]
    cross = topo.numa[:, None] != topo.numa[None, :]
    assert np.all(d[cross] == remote)          # no cache spans two nodes in these machines
    assert np.all(d[~cross] <= none)
    # levels() rebuilds d; with remote > none the whole machine closes the list.
    chain = topo.levels()
    rebuilt = np.full_like(d, none)
    for cost, labels in reversed(chain):
        rebuilt[labels[:, None] == labels[None, :]] = cost
    np.fill_diagonal(rebuilt, topo.costs["same"])
    np.testing.assert_array_equal(rebuilt, d)
    assert all(a < b for (a, _), (b, _) in zip(chain, chain[1:]))
    for (_, fine), (_, coarse) in zip(chain, chain[1:]):
        assert len(set(zip(fine.tolist(), coarse.tolist()))) == fine.max() + 1  # nested
    if remote > none:
        assert chain[-1][0] == remote and chain[-1][1].max() == 0
        assert any(np.array_equal(labels, topo.numa) for _, labels in chain)
    else:
        assert all(cost < none for cost, _ in chain)


# The fast (counts) encoding against the literal one and brute force, with a remote level.
NUMA_MODEL_CASES = [
    ("numa:2 core:2 pu:1", 2, 2, None),
    ("pack:2 numa:1 l2:1 core:2 pu:1", 2, 2, None),     # L2 = node: merged levels
    ("numa:3 core:2 pu:1", 2, 2, None),
    ("numa:2 core:1 pu:2", 1, 3, {"remote": 300}),      # costs given to the model
    ("numa:2 core:2 pu:1", 5, 1, None),                 # scenario 3
]


@pytest.mark.parametrize("mode", ["scatter", "compact"])
@pytest.mark.parametrize("spec, W, T, model_costs", NUMA_MODEL_CASES)
def test_remote_level_fast_encoding_is_exact(spec, W, T, model_costs, mode):
    from reference import brute_force

    from tuna_lab import TunaModel

    topo = Topology.synthetic(spec)
    if model_costs is None:
        topo, model_costs = topo.with_costs({"remote": 420}), None
    best = brute_force(W, T, topo, mode, costs=model_costs)[0]
    counts = TunaModel(W, T, topo, mode, encoding="counts", costs=model_costs).solve(prove="solver")
    auto = TunaModel(W, T, topo, mode, costs=model_costs).solve()
    pairwise = TunaModel(W, T, topo, mode, encoding="pairwise", costs=model_costs).solve(time_limit=30)
    assert counts.encoding == "counts" and counts.proven_optimal and pairwise.proven_optimal
    assert counts.objective == auto.objective == pairwise.objective == pytest.approx(best)
    if mode == "compact" and W * T <= topo.n_logical and T <= 2:
        # each worker's threads stay on one NUMA node
        node = dict(zip(topo.cpus, topo.numa.tolist()))
        assert all(len({node[c] for c in row}) == 1 for row in counts.assignment.tolist())


@settings(max_examples=8, deadline=None)
@given(topo=numa_topologies(max_pus=6), W=st.integers(1, 3), T=st.integers(1, 2),
       mode=st.sampled_from(["scatter", "compact"]))
def test_property_remote_level_counts_matches_brute_force(topo, W, T, mode):
    from reference import brute_force

    from tuna_lab import TunaModel
    from tuna_lab.errors import InfeasibleModelError

    best = brute_force(W, T, topo, mode)[0]
    model = TunaModel(W, T, topo, mode, encoding="counts")
    if best is None:
        with pytest.raises(InfeasibleModelError):
            model.solve(prove="solver", on_infeasible="raise")
        return
    assert model.solve(prove="solver").objective == pytest.approx(best)
    assert model.bound() >= best - 1e-6


def test_hwloc_xml_with_non_ascii_digits_or_deep_nesting_is_read_without_a_traceback():
    from tuna_lab.machine.readers.hwloc_xml import read_hwloc_xml

    with pytest.raises(TopologyError, match="PU without a valid os_index"):
        read_hwloc_xml('<topology><object type="PU" os_index="²"/></topology>'.encode())
    deep = (b"<topology>" + b'<object type="Group">' * 3000 + b'<object type="PU" os_index="0"/>'
            + b"</object>" * 3000 + b"</topology>")
    assert read_hwloc_xml(deep).cpus == (0,)


def test_a_cpulist_with_an_absurd_cpu_id_is_one_error_not_a_billion_item_list():
    from tuna_lab._checks import parse_cpulist

    with pytest.raises(TopologyError, match="CPU id 4000000000 is above"):
        parse_cpulist("0-4000000000", "--client-cpus")
