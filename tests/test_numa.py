"""Tests of tuna_lab.machine.numa: the numa_maps parser on recorded samples, and live locality."""

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from tuna_lab.errors import NumaError, TopologyError, TunaError
from tuna_lab.machine.numa import Locality, NumaMaps, locality, parse_numa_maps, read_numa_maps, worker_locality
from tuna_lab.machine.topology import Topology

DATA = Path(__file__).parent / "data"
NODE_ROOT = Path("/sys/devices/system/node")
ONE_NODE = len(list(NODE_ROOT.glob("node[0-9]*"))) <= 1
needs_numa_maps = pytest.mark.skipif(not Path(f"/proc/{os.getpid()}/numa_maps").exists(),
                                     reason="no /proc/<pid>/numa_maps (kernel without NUMA support)")


# ----------------------------------------------------------------- parser
def test_two_node_sample():
    # A Gunicorn worker on two sockets: shared libraries on node 0 (loaded by the
    # master), most anonymous memory on node 1, two hugetlb mappings of 2 MiB pages,
    # interleave / bind / "prefer (many)" policies and five mappings without pages.
    maps = parse_numa_maps((DATA / "numa_maps_2node.txt").read_text())
    assert maps.pages == {0: 4739, 1: 12235}
    # 6 huge pages of 2048 KiB (1 on node 0, 5 on node 1), every other page 4 KiB
    assert maps.huge_pages == {0: 1, 1: 5}
    assert maps.kib == {0: 4738 * 4 + 2048, 1: 12230 * 4 + 5 * 2048}
    assert (maps.mappings, maps.empty_mappings) == (25, 5)
    assert maps.total_kib == 80160
    assert maps.share(1) == pytest.approx(59160 / 80160)
    assert maps.share(0) + maps.share(1) == pytest.approx(1.0) and maps.share(7) == 0.0


def test_one_node_sample():
    # Recorded on this project's one-node machine: a short python3 process.
    maps = parse_numa_maps((DATA / "numa_maps_1node.txt").read_text())
    assert maps.pages == {0: 3392} and maps.kib == {0: 4 * 3392} and maps.huge_pages == {}
    assert (maps.mappings, maps.empty_mappings) == (104, 6)
    assert maps.share(0) == 1.0


def test_parser_edge_cases():
    empty = parse_numa_maps("")
    assert empty == NumaMaps() and math.isnan(empty.share(0)) and empty.total_kib == 0
    # Lines without kernelpagesize_kB (old kernels) use page_kib; blank lines are skipped.
    text = "00400000 default file=/bin/x mapped=3 N0=3\n\n7f00 bind:1 anon=2 N1=2 kernelpagesize_kB=64\n"
    maps = parse_numa_maps(text, page_kib=4)
    assert maps.pages == {0: 3, 1: 2} and maps.kib == {0: 12, 1: 128} and maps.mappings == 2
    # An escaped file name cannot fake a node count; unknown fields are ignored.
    maps = parse_numa_maps("7f00 default file=/tmp/N0\\0755 anon=1 future_field=9 N2=1 kernelpagesize_kB=4")
    assert maps.pages == {2: 1}
    with pytest.raises(NumaError, match="line 2") as info:
        parse_numa_maps("7f00 default N0=1\n<html>\n")
    assert isinstance(info.value, TunaError) and info.value.pid is None


# ---------------------------------------------------------- live process
@needs_numa_maps
def test_worker_locality_of_this_process():
    pid = os.getpid()
    loc = worker_locality(pid)
    assert isinstance(loc, Locality) and loc.pid == pid
    assert loc.cpus == tuple(sorted(os.sched_getaffinity(pid)))
    assert loc.node in loc.pages and sum(loc.pages.values()) > 0 and loc.kib[loc.node] > 0
    assert sum(loc.affinity_nodes.values()) == len(loc.cpus)
    if ONE_NODE:
        assert loc.share == 1.0 and not loc.spans_nodes and list(loc.pages) == [loc.node]
    else:
        assert 0.0 <= loc.share <= 1.0
    assert locality(pid, loc.node) == pytest.approx(loc.share, abs=0.05)   # memory moves a little
    json.dumps(loc.to_dict())
    # The same with the machine given (as the experiment runner does).
    assert worker_locality(pid, Topology.from_sysfs()).node == loc.node


@needs_numa_maps
def test_worker_locality_of_a_child_process():
    child = subprocess.Popen(["sleep", "30"])
    try:
        loc = worker_locality(child.pid)
        assert loc.pid == child.pid and sum(loc.pages.values()) > 0
        assert read_numa_maps(child.pid).mappings > 0
        if ONE_NODE:
            assert loc.share == 1.0
    finally:
        child.kill()
        child.wait()
    with pytest.raises(NumaError, match="no process") as info:
        worker_locality(child.pid)              # reaped: the pid is gone
    assert info.value.pid == child.pid


@needs_numa_maps
def test_affinity_over_several_nodes(monkeypatch):
    # A made-up machine: cpu 0 on node 4, cpus 1 and 2 on node 7. All of this
    # process's memory sits on the real machine's node, so node 7 holds none of it.
    topo = Topology("made-up", (0, 1, 2), [0, 1, 2], [0, 0, 0], [0, 1, 1], numa_os_index=[4, 7, 7])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    loc = worker_locality(os.getpid(), topo)
    assert loc.node == 7 and loc.spans_nodes and loc.affinity_nodes == {4: 1, 7: 2}
    if ONE_NODE:
        assert loc.share == 0.0
    # a tie goes to the lowest node; CPUs the topology does not know are left out
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 99})
    loc = worker_locality(os.getpid(), topo)
    assert loc.node == 4 and loc.cpus == (0, 1) and loc.affinity_nodes == {4: 1, 7: 1}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {99})
    with pytest.raises(TopologyError, match="made-up"):
        worker_locality(os.getpid(), topo)


def test_read_errors(tmp_path, monkeypatch):
    (tmp_path / "42").mkdir()
    with pytest.raises(NumaError, match="without NUMA support") as info:
        read_numa_maps(42, proc=tmp_path)
    assert info.value.pid == 42
    with pytest.raises(NumaError, match="no process"):
        read_numa_maps(43, proc=tmp_path)
    (tmp_path / "42" / "numa_maps").mkdir()
    with pytest.raises(NumaError, match="cannot read"):
        read_numa_maps(42, proc=tmp_path)
    (tmp_path / "44").mkdir()
    (tmp_path / "44" / "numa_maps").write_text("7f00 default N1=2 kernelpagesize_kB=4\n")
    assert read_numa_maps(44, proc=tmp_path).pages == {1: 2}

    import tuna_lab.machine.numa as numa

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(numa, "open", denied, raising=False)   # root reads anything; fake it
    with pytest.raises(NumaError, match="permission denied"):
        read_numa_maps(44, proc=tmp_path)


@pytest.mark.parametrize("pid", [0, -1, "123", 1.5, True, None])
def test_bad_pid(pid):
    with pytest.raises(NumaError, match="pid"):
        worker_locality(pid)
