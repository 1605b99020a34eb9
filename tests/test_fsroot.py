"""Tests of Topology.from_fsroot: hwloc's 21 real machines read like lstopo reads them, and small synthetic trees.

The dumps are hwloc's own test machines (tests/data/hwloc-dumps, BSD-3): each
is extracted once per session and compared with Debian's
``lstopo-no-graphics --input DIR --of xml`` read through from_hwloc_xml.
"""

import json
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from tuna_lab._checks import parse_cpulist, parse_cpumask
from tuna_lab.cli import main
from tuna_lab.errors import TopologyError, TopologyWarning
from tuna_lab.machine import Topology
from tuna_lab.model import solve

DUMPS = Path(__file__).parent / "data" / "hwloc-dumps"
ARCHIVES = sorted(DUMPS.glob("*.tar.bz2"))
LSTOPO = shutil.which("lstopo-no-graphics") or shutil.which("lstopo")
needs_lstopo = pytest.mark.skipif(LSTOPO is None, reason="lstopo (Debian's hwloc) is not on PATH")
NAMES = [a.name.removesuffix(".tar.bz2") for a in ARCHIVES]


def test_every_dump_is_here():
    # CI has only the repository: the 21 machines and their licence travel with the tests.
    assert len(ARCHIVES) == 21 and (DUMPS / "COPYING.hwloc").is_file()


@pytest.fixture(scope="session")
def dumps(hwloc_dump_roots):
    """``{archive name: its extracted filesystem root}`` (conftest extracts each archive once)."""
    assert set(hwloc_dump_roots) == set(NAMES)
    return hwloc_dump_roots


@pytest.fixture(scope="session")
def lstopo_reading(dumps):
    """The XML text ``lstopo --input DIR --of xml`` writes for a dump (cached), or a skip."""
    cache = {}

    def read(name):
        if name not in cache:
            done = subprocess.run([LSTOPO, "--input", str(dumps[name]), "--of", "xml", "-"],
                                  capture_output=True, text=True, timeout=120)
            cache[name] = done.stdout if done.returncode == 0 and "<topology" in done.stdout else None
        if cache[name] is None:
            pytest.skip(f"lstopo cannot read {name}")
        return cache[name]

    return read


def read_quietly(root):
    """from_fsroot, with the one TopologyWarning it may give returned alongside."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        topo = Topology.from_fsroot(root)
    return topo, [w for w in caught if issubclass(w.category, TopologyWarning)]


# ---------------------------------------------------------- the 21 machines
@needs_lstopo
@pytest.mark.parametrize("name", NAMES)
def test_dump_reads_like_lstopo(name, dumps, lstopo_reading):
    xml = lstopo_reading(name)
    hwloc = Topology.from_hwloc_xml(xml)
    mine, warned = read_quietly(dumps[name])
    assert mine.cpus == hwloc.cpus
    # The NUMA remote cost aside: the cache distances, and the physical cores.
    np.testing.assert_array_equal(mine.distance({"remote": None}), hwloc.distance({"remote": None}))
    assert sorted(mine.siblings()) == sorted(hwloc.siblings())
    # Without any cache, one warning says so (and lstopo has none either); else no warning.
    assert len(warned) == (0 if hwloc.caches else 1)
    assert all("no CPU cache information" in str(w.message) for w in warned)
    # Where lstopo shows every NUMA node holding these CPUs (a cpuset's mems may hide
    # some), the nodes and the remote cost derived from their distances agree too.
    shown = {int(n) for n in re.findall(r'type="NUMANode" os_index="(\d+)"', xml)}
    if set(mine.numa_nodes()) <= shown:
        assert sorted(mine.numa_nodes().values()) == sorted(hwloc.numa_nodes().values())
        assert mine.costs.get("remote") == hwloc.costs.get("remote")


@pytest.mark.parametrize("name", NAMES)
def test_a_solve_on_every_dump_verifies(name, dumps):
    topo, _ = read_quietly(dumps[name])
    mapping = solve(2, 2, topo, "scatter", time_limit=5)
    assert mapping.verify() == []
    assert set(mapping.assignment.ravel().tolist()) <= set(topo.cpus)


def test_dump_cpusets_and_offline_cpus(dumps):
    # Offline CPUs (the online file, or each CPU's own online file) are left out...
    assert Topology.from_fsroot(dumps["16em64t-4s2c2t-offlines"]).cpus == (0, 1, 3, 4, 6, 7, 8, 9, 10, 11, 12, 15)
    assert Topology.from_fsroot(dumps["offline-cpu0-node0"]).cpus == tuple(range(4, 21))
    # ...and so are the CPUs outside the dump's cpuset: the cpuset filesystem (online: 0-3,5-15)...
    assert Topology.from_fsroot(dumps["16amd64-8n2c-cpusets"]).cpus == (0, 1, 2, 3, 5, 6, 12, 13, 14, 15)
    # ...and a cgroup v2 mounted away from /sys/fs/cgroup, named by proc/self/cpuset.
    cgroup2 = Topology.from_fsroot(dumps["32amd64-4s2n4c-cgroup2"])
    assert cgroup2.cpus == tuple(range(6)) and cgroup2.name == "32amd64-4s2n4c-cgroup"
    # An explicit allowed set overrides the cpuset, and must be online.
    assert Topology.from_fsroot(dumps["32amd64-4s2n4c-cgroup2"], allowed=range(8, 12)).cpus == (8, 9, 10, 11)
    with pytest.raises(TopologyError, match="not online"):
        Topology.from_fsroot(dumps["offline-cpu0-node0"], allowed={0, 4})


def test_old_kernels_mask_files_give_caches_and_siblings(dumps):
    # 2007-era sysfs: only shared_cpu_map / thread_siblings masks, no lists.
    topo = Topology.from_fsroot(dumps["16em64t-4s2c2t"])
    assert topo.siblings()[0] == (0, 8) and topo.threads_per_core == 2
    assert topo.distance()[0, [8, 4, 1]].tolist() == [4.0, 50.0, 200.0]


def test_amd_compute_units_are_cores_of_their_own(dumps):
    # Bulldozer: the two cores of a compute unit are listed as thread siblings but
    # have core ids of their own; hwloc (and so this reader) makes them two cores.
    topo = Topology.from_fsroot(dumps["64amd64-4s2n4ca2co"])
    assert topo.n_physical == topo.n_logical == 64 and topo.distance()[0, 1] == 10


# ------------------------------------------------------- synthetic trees
def write(path, text, pad=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n" + pad)


def fake_machine(root, masks=True, lists=False, pad="", online="0-3"):
    """Four CPUs, two cores of two threads (0,2 and 1,3), an L2 per core, one L3, one NUMA node."""
    cpu = root / "sys/devices/system/cpu"
    core_mask = {0: "00000005", 1: "0000000a", 2: "00000005", 3: "0000000a"}
    core_list = {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3"}
    for c in range(4):
        topo, cache = cpu / f"cpu{c}" / "topology", cpu / f"cpu{c}" / "cache"
        write(topo / "core_id", str(c % 2), pad)
        write(topo / "physical_package_id", "0", pad)
        if masks:
            write(topo / "thread_siblings", "00000000," + core_mask[c], pad)
            write(topo / "core_siblings", "00000000,0000000f", pad)
        if lists:
            write(topo / "thread_siblings_list", core_list[c], pad)
        for i, (level, kind, mask, cpulist) in enumerate([
                (1, "Data", core_mask[c], core_list[c]), (1, "Instruction", core_mask[c], core_list[c]),
                (2, "Unified", core_mask[c], core_list[c]), (3, "Unified", "0000000f", "0-3")]):
            write(cache / f"index{i}" / "level", str(level), pad)
            write(cache / f"index{i}" / "type", kind, pad)
            if masks:
                write(cache / f"index{i}" / "shared_cpu_map", mask, pad)
            if lists:
                write(cache / f"index{i}" / "shared_cpu_list", cpulist, pad)
    if online is not None:
        write(cpu / "online", online, pad)
    write(root / "sys/devices/system/node/node0/cpumap", "0000000f", pad)
    write(root / "sys/devices/system/node/online", "0", pad)
    return root


def test_mask_only_tree_with_nul_padding(tmp_path):
    topo = Topology.from_fsroot(fake_machine(tmp_path, pad="\x00" * 7))
    assert topo.cpus == (0, 1, 2, 3) and topo.name == tmp_path.name
    assert topo.siblings() == [(0, 2), (1, 3)]
    assert list(topo.caches) == ["L1", "L2", "L3"] and topo.numa_nodes() == {0: (0, 1, 2, 3)}
    assert topo.distance()[0, [2, 1]].tolist() == [4.0, 50.0]
    # The same machine told in lists reads the same.
    lists = Topology.from_fsroot(fake_machine(tmp_path / "lists", masks=False, lists=True))
    np.testing.assert_array_equal(lists.distance(), topo.distance())


def test_masks_win_over_lists_as_in_hwloc(tmp_path):
    root = fake_machine(tmp_path, masks=True, lists=True)
    # A list that disagrees with the mask (as in some dumps) loses: hwloc reads the masks.
    for c in range(4):
        write(root / f"sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list", str(c))
    assert Topology.from_fsroot(root).siblings() == [(0, 2), (1, 3)]


def test_offline_cpu_is_left_out(tmp_path):
    root = fake_machine(tmp_path, online="0-2")
    topo = Topology.from_fsroot(root)
    assert topo.cpus == (0, 1, 2) and topo.siblings() == [(0, 2), (1,)]
    # Without the online file, each CPU's own online file says it.
    (root / "sys/devices/system/cpu/online").unlink()
    write(root / "sys/devices/system/cpu/cpu1/online", "0")
    assert Topology.from_fsroot(root).cpus == (0, 2, 3)


def test_cgroup_v1_cpuset_restricts_the_cpus(tmp_path):
    root = fake_machine(tmp_path)
    write(root / "proc/self/cgroup", "4:cpu,cpuacct:/\n3:cpuset:/job7\n0::/")
    write(root / "proc/mounts", "cgroup /sys/fs/cgroup/cpuset cgroup rw,nosuid,cpuset 0 0")
    write(root / "sys/fs/cgroup/cpuset/cpuset.cpus", "0-3")
    write(root / "sys/fs/cgroup/cpuset/job7/cpuset.cpus", "1-2\x00")
    assert Topology.from_fsroot(root).cpus == (1, 2)


def test_cgroup_v2_cpuset_restricts_the_cpus(tmp_path):
    root = fake_machine(tmp_path)
    write(root / "proc/self/cgroup", "0::/user.slice/job")
    write(root / "sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory")
    write(root / "sys/fs/cgroup/user.slice/job/cpuset.cpus.effective", "0,3")
    topo = Topology.from_fsroot(root)
    assert topo.cpus == (0, 3) and topo.n_physical == 2
    # A cgroup without its own cpuset file takes its nearest ancestor's.
    (root / "sys/fs/cgroup/user.slice/job/cpuset.cpus.effective").unlink()
    write(root / "sys/fs/cgroup/user.slice/cpuset.cpus.effective", "2-3")
    assert Topology.from_fsroot(root).cpus == (2, 3)


def test_no_cache_information_warns_once_and_names_the_device_tree(tmp_path):
    root = fake_machine(tmp_path)
    for c in range(4):
        shutil.rmtree(root / f"sys/devices/system/cpu/cpu{c}/cache")
    (root / "proc/device-tree/cpus").mkdir(parents=True)
    with pytest.warns(TopologyWarning) as caught:
        topo = Topology.from_fsroot(root)
    assert len(caught) == 1 and "proc/device-tree" in str(caught[0].message)
    assert topo.caches == {} and topo.distance()[0, 1] == 200


def test_bad_files_and_missing_root(tmp_path):
    root = fake_machine(tmp_path)
    write(root / "sys/devices/system/cpu/cpu0/topology/thread_siblings", "zz,00000001")
    with pytest.raises(TopologyError, match="bad cpumask"):
        Topology.from_fsroot(root)
    with pytest.raises(TopologyError, match="no sysfs cpu directory"):
        Topology.from_fsroot(tmp_path / "nowhere")


def test_parsers_tolerate_padding():
    assert parse_cpulist("0-3\n\x00\x00") == (0, 1, 2, 3)
    assert parse_cpulist(" 1,3 \n") == (1, 3) and parse_cpulist("\n\x00") == ()
    assert parse_cpumask("00000000,00000101\n\x00") == (0, 8)
    assert parse_cpumask("1,00000000,80000000") == (31, 64)
    with pytest.raises(TopologyError, match="shared_cpu_map"):
        parse_cpumask("0x,12", "shared_cpu_map")


def test_this_machine_is_the_root_restricted_to_affinity():
    import os

    topo = Topology.from_fsroot("/")
    assert topo.name == "this machine" and set(topo.cpus) == os.sched_getaffinity(0)
    assert topo.cpus == Topology.from_sysfs().cpus


# --------------------------------------------------------------------- CLI
def test_cli_topology_and_solve_take_fsroot(dumps, capsys):
    assert main(["topology", "--fsroot", str(dumps["16em64t-4s2c2t"]), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["name"] == "16em64t-4s2c2t" and out["n_logical"] == 16 and out["threads_per_core"] == 2
    assert main(["solve", "-w", "2", "-t", "2", "--fsroot", str(dumps["2arm-2c"]), "--time-limit", "5"]) == 0
    captured = capsys.readouterr()
    # The missing caches are said in one line on stderr.
    assert [line for line in captured.err.splitlines() if "warning" in line] == \
        [line for line in captured.err.splitlines() if line.strip()]
    assert len(captured.err.strip().splitlines()) == 1 and "no CPU cache information" in captured.err
    assert main(["topology", "--fsroot", "/nowhere"]) == 2
    with pytest.raises(SystemExit) as exited:  # one machine at a time
        main(["topology", "--fsroot", "/", "--preset", "epyc-7313p"])
    assert exited.value.code == 2
