"""Tests of tuna_lab.machine.limits: CPU quota, cpuset, online and isolated CPUs, on fake trees and this machine."""

import json
import os
from pathlib import Path

import pytest

from tuna_lab._checks import parse_cpulist
from tuna_lab.cli import main
from tuna_lab.machine import Limits
from tuna_lab.machine.linuxfs import cgroup_cpu_quota, cgroup_cpuset, cgroup_dir, mounts


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def cpus_online(root, n, online=None):
    """``n`` cpuN directories, and the online file (all of them by default)."""
    for c in range(n):
        (root / f"sys/devices/system/cpu/cpu{c}").mkdir(parents=True, exist_ok=True)
    write(root / "sys/devices/system/cpu/online", online or f"0-{n - 1}")


def fake_v2(root, cpu_max="max 100000", cgroup="/kubepods/pod1", parent_max=None, cpuset=None):
    """A pure cgroup v2 machine with 4 online CPUs; this process in ``cgroup``."""
    cpus_online(root, 4)
    write(root / "proc/self/cgroup", f"0::{cgroup}")
    write(root / "proc/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev 0 0")
    top = root / "sys/fs/cgroup"
    write(top / "cgroup.controllers", "cpuset cpu io memory pids")
    write(top / "cpuset.cpus.effective", "0-3")
    leaf = top / cgroup.lstrip("/")
    write(leaf / "cpu.max", cpu_max)
    if parent_max is not None:
        write(leaf.parent / "cpu.max", parent_max)
    if cpuset is not None:
        write(leaf / "cpuset.cpus.effective", cpuset)
    return root


def fake_v1(root, quota="-1", period="100000"):
    """A cgroup v1 machine (cpu,cpuacct and cpuset hierarchies) with 4 online CPUs."""
    cpus_online(root, 4)
    write(root / "proc/self/cgroup", "5:cpuset:/\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc")
    write(root / "proc/mounts", "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n"
                                "cgroup /sys/fs/cgroup/cpuset cgroup rw,nosuid,cpuset 0 0")
    cpu = root / "sys/fs/cgroup/cpu,cpuacct"
    write(cpu / "cpu.cfs_quota_us", "-1")
    write(cpu / "cpu.cfs_period_us", "100000")
    write(cpu / "docker/abc/cpu.cfs_quota_us", quota)
    write(cpu / "docker/abc/cpu.cfs_period_us", period)
    write(root / "sys/fs/cgroup/cpuset/cpuset.cpus", "0-3")
    return root


# ----------------------------------------------------------------- quotas
@pytest.mark.parametrize("cpu_max, quota, effective", [
    ("150000 100000", 1.5, 1),
    ("max 100000", None, 4),
    ("200000 100000", 2.0, 2),
    ("50000 100000", 0.5, 1),
])
def test_v2_quota_in_cpus_worth(tmp_path, cpu_max, quota, effective):
    limits = Limits.read(fake_v2(tmp_path, cpu_max))
    assert limits.quota == quota and limits.effective_cpus == effective
    assert limits.affinity is None and limits.usable == (0, 1, 2, 3)
    assert cgroup_dir(tmp_path, "cpu") == ("v2", tmp_path / "sys/fs/cgroup/kubepods/pod1")


def test_v2_tightest_ancestor_wins(tmp_path):
    # The kernel enforces every ancestor's quota: a pod limited at 1.5 CPUs, its container unlimited.
    root = fake_v2(tmp_path, "max 100000", parent_max="150000 100000")
    assert cgroup_cpu_quota(root) == 1.5
    root = fake_v2(tmp_path / "b", "300000 100000", parent_max="400000 100000")
    assert cgroup_cpu_quota(root) == 3.0


def test_v1_quota_is_read(tmp_path):
    assert Limits.read(fake_v1(tmp_path, "250000", "100000")).quota == 2.5
    assert Limits.read(fake_v1(tmp_path / "unlimited", "-1")).quota is None
    assert cgroup_dir(tmp_path, "cpu") == ("v1", tmp_path / "sys/fs/cgroup/cpu,cpuacct/docker/abc")


def test_a_container_sees_its_cgroup_as_the_mount(tmp_path):
    # Without a cgroup namespace, /proc/self/cgroup names /docker/abc but only that subtree is
    # mounted (mountinfo's root field): its files are at the mount point itself.
    cpus_online(tmp_path, 8)
    write(tmp_path / "proc/self/cgroup", "0::/docker/abc")
    write(tmp_path / "proc/self/mountinfo",
          "30 25 0:26 /docker/abc /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate")
    write(tmp_path / "sys/fs/cgroup/cgroup.controllers", "cpuset cpu")
    write(tmp_path / "sys/fs/cgroup/cpu.max", "100000 100000")
    write(tmp_path / "sys/fs/cgroup/cpuset.cpus.effective", "2-5")
    assert [(m.point, m.root, m.fstype) for m in mounts(tmp_path)] == [("/sys/fs/cgroup", "/docker/abc", "cgroup2")]
    limits = Limits.read(tmp_path)
    assert (limits.quota, limits.cpuset, limits.usable, limits.effective_cpus) == (1.0, (2, 3, 4, 5), (2, 3, 4, 5), 1)


def test_a_cpuset_restricts_the_cpus(tmp_path):
    limits = Limits.read(fake_v2(tmp_path, "max 100000", cpuset="1-2"))
    assert cgroup_cpuset(tmp_path) == (1, 2)
    assert limits.cpuset == (1, 2) and limits.usable == (1, 2) and limits.effective_cpus == 2
    # An explicit affinity narrows it further; a quota narrows the count, not the set.
    both = Limits.read(fake_v2(tmp_path / "q", "150000 100000", cpuset="1-3"), affinity={0, 1, 2})
    assert both.usable == (1, 2) and both.effective_cpus == 1 and both.throttles(2) and not both.throttles(1)


def test_no_cgroup_no_quota_and_isolated_cpus(tmp_path):
    cpus_online(tmp_path, 5, online="0-3")  # cpu4 is offline
    write(tmp_path / "sys/devices/system/cpu/isolated", "2-3")
    write(tmp_path / "sys/devices/system/cpu/nohz_full", "(null)")  # a kernel without nohz_full
    limits = Limits.read(tmp_path)
    assert (limits.cpuset, limits.quota, limits.isolated, limits.nohz_full) == (None, None, (2, 3), ())
    # Isolated CPUs stay usable: a thread pinned there runs there.
    assert limits.usable == (0, 1, 2, 3) and limits.effective_cpus == 4
    assert not limits.throttles(64)


def test_limits_to_dict_and_describe():
    limits = Limits(online=(0, 1, 2, 3), affinity=(0, 1, 2, 3), cpuset=(0, 1), quota=1.5)
    d = json.loads(json.dumps(limits.to_dict()))
    assert d == {"online": [0, 1, 2, 3], "affinity": [0, 1, 2, 3], "cpuset": [0, 1], "quota": 1.5,
                 "isolated": [], "nohz_full": [], "usable": [0, 1], "effective_cpus": 1}
    lines = limits.describe().splitlines()
    assert len(lines) == 2 and "CPU quota 1.5 CPUs" in lines[0] and "size by 1 CPU" in lines[0]


# ------------------------------------------------------------ this machine
def by_hand_quota():
    """This process's CPU quota read straight from /proc and /sys/fs/cgroup, or "unknown"."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    fields = [line.split(":", 2) for line in lines]
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if v2.exists() and "cpu" in v2.read_text().split():
        path = next(p for _, ctl, p in fields if ctl == "")
        top, kind = Path("/sys/fs/cgroup"), "v2"
    else:
        path = next((p for _, ctl, p in fields if "cpu" in ctl.split(",")), None)
        tops = [Path(line.split()[1]) for line in Path("/proc/mounts").read_text().splitlines()
                if line.split()[2] == "cgroup" and "cpu" in line.split()[3].split(",")]
        if path is None or not tops:
            return None
        top, kind = tops[0], "v1"
    here = top / path.lstrip("/")
    if not here.is_dir():
        return "unknown"  # a mount of a subtree: not for a by-hand reading
    quotas = []
    for d in [here, *here.parents]:
        if kind == "v2" and (d / "cpu.max").exists():
            q, p = (d / "cpu.max").read_text().split()
            if q != "max":
                quotas.append(int(q) / int(p))
        elif kind == "v1" and (d / "cpu.cfs_quota_us").exists():
            q, p = int((d / "cpu.cfs_quota_us").read_text()), int((d / "cpu.cfs_period_us").read_text())
            if q > 0:
                quotas.append(q / p)
        if d == top:
            break
    return min(quotas) if quotas else None


@pytest.mark.skipif(not Path("/sys/fs/cgroup").is_dir(), reason="no cgroup filesystem")
def test_this_machine_agrees_with_affinity_and_cgroup_by_hand():
    limits = Limits.read()
    affinity = os.sched_getaffinity(0)
    assert set(limits.affinity) == affinity and set(limits.usable) == affinity
    assert limits.online == parse_cpulist(Path("/sys/devices/system/cpu/online").read_text())
    expected = by_hand_quota()
    if expected != "unknown":
        assert limits.quota == expected
    # The count to size by: the usable CPUs, capped by the quota rounded down.
    cap = len(affinity) if limits.quota is None else max(1, int(limits.quota))
    assert limits.effective_cpus == min(len(affinity), cap)
    if limits.cpuset is not None:
        assert set(limits.cpuset) >= affinity


# --------------------------------------------------------------------- CLI
def test_topology_prints_and_carries_the_limits(capsys):
    assert main(["topology", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["limits"]["effective_cpus"] == Limits.read().effective_cpus
    assert set(out["limits"]["usable"]) == os.sched_getaffinity(0) and "distance" in out
    assert main(["topology"]) == 0
    assert "limits:" in capsys.readouterr().out
    # A preset is no machine this process runs on: no limits.
    assert main(["topology", "--preset", "epyc-7313p", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["limits"] is None


def test_topology_of_an_fsroot_shows_its_limits(tmp_path, capsys):
    root = fake_v2(tmp_path, "150000 100000", cgroup="/job", cpuset="0-1")
    for c in range(4):
        write(root / f"sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list", str(c))
        write(root / f"sys/devices/system/cpu/cpu{c}/cache/index0/level", "2")
        write(root / f"sys/devices/system/cpu/cpu{c}/cache/index0/type", "Unified")
        write(root / f"sys/devices/system/cpu/cpu{c}/cache/index0/shared_cpu_list", "0-3")
    assert main(["topology", "--fsroot", str(root), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["logical_cores"] == [0, 1] and out["limits"]["quota"] == 1.5
    assert out["limits"]["affinity"] is None and out["limits"]["effective_cpus"] == 1


# ------------------------------------------ what the tools do with the limits
@pytest.fixture
def quota_of_one_and_a_half(monkeypatch):
    """This process seen as on a 4-CPU pod limited to 1.5 CPUs."""
    fake = Limits(online=(0, 1, 2, 3), affinity=(0, 1, 2, 3), quota=1.5)
    monkeypatch.setattr(Limits, "read", classmethod(lambda cls, root="/", affinity=None: fake))
    return fake


def test_quota_below_the_threads_warns_in_one_line(capsys):
    from tuna_lab.cli.options import check_cpu_quota
    from tuna_lab.errors import ExperimentError

    limits = Limits(online=(0, 1, 2, 3), quota=1.5)
    assert check_cpu_quota(1, limits=limits) is limits and capsys.readouterr().err == ""
    check_cpu_quota(8, limits=limits)  # 8 threads run on at most the 4 usable CPUs
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("tuna-lab: warning: CPU quota 1.5 CPUs is below the 4 CPUs")
    assert "throttling" in err[0] and "size by 1 CPU" in err[0]
    with pytest.raises(ExperimentError, match="CPU quota 1.5"):
        check_cpu_quota(2, strict=True, error=ExperimentError, limits=limits)
    check_cpu_quota(64, strict=True, limits=Limits(online=(0, 1)))  # no quota: nothing to refuse


@pytest.mark.parametrize("argv", [
    ["run", "-w", "2", "-t", "2", "--model", "small", "--strict"],
    ["sweep", "--configs", "1x1,2x2", "--out", "unused", "--strict"],
    ["serve", "-w", "2", "-t", "1", "--model", "small", "--strict"],
])
def test_strict_refuses_before_anything_runs(argv, quota_of_one_and_a_half, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith("tuna-lab: error: CPU quota 1.5 CPUs is below the ")
    assert not any(tmp_path.iterdir())  # no cell, no server state was written


def test_grid_and_manifest_use_the_limits(quota_of_one_and_a_half):
    from tuna_lab.measure.experiment import Config, grid, manifest

    # Sized by the quota's one CPU, not the four the affinity lists.
    assert grid("machine") == grid("machine", cpus=1) != grid("machine", cpus=4)
    meta = manifest(Config(1, 1, "small"), ["cfs"], 1, 10, 0)
    assert meta["limits"] == quota_of_one_and_a_half.to_dict() and meta["limits"]["quota"] == 1.5
    json.dumps(meta)


def test_the_library_warns_of_throttling_and_strict_refuses():
    import warnings

    from tuna_lab.errors import ExperimentError, ThrottlingWarning
    from tuna_lab.machine import check_throttling

    limits = Limits(online=(0, 1, 2, 3), quota=1.5)
    with pytest.warns(ThrottlingWarning, match="CPU quota 1.5 CPUs is below the 2 CPUs"):
        assert check_throttling(2, limits=limits) is limits
    with pytest.raises(ExperimentError, match="size by 1 CPU"):
        check_throttling(8, strict=True, error=ExperimentError, limits=limits)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_throttling(1, strict=True, limits=limits)               # one CPU's worth fits in 1.5
        check_throttling(64, limits=Limits(online=(0, 1)))            # no quota: nothing to say


def test_run_checks_the_quota_before_anything_runs(quota_of_one_and_a_half, tmp_path):
    from tuna_lab.errors import ExperimentError, ThrottlingWarning
    from tuna_lab.measure.experiment import Config, LoadSpec, TrialSpec, run

    out = tmp_path / "cell"
    with pytest.raises(ExperimentError, match="CPU quota 1.5 CPUs is below the 4 CPUs"):
        run(Config(2, 2, "small", 20), ["cfs"], trials=1, load=LoadSpec(10), out=str(out), strict=True)
    # Not strict: the warning, then the run goes on - here to a bad client CPU list, before any server starts.
    with pytest.warns(ThrottlingWarning, match="measure CFS throttling"), \
            pytest.raises(ExperimentError, match="client"):
        run(Config(2, 2, "small", 20), ["cfs"], trials=1, load=LoadSpec(10), trial=TrialSpec(client_cpus="99"))
    assert not out.exists()


def test_a_lab_server_warns_of_throttling_when_it_starts(quota_of_one_and_a_half, tmp_path):
    from tuna_lab.errors import PlanError, ThrottlingWarning
    from tuna_lab.server.launch import Server

    # A state folder that does not exist ends the start right after the check (and the model's lookup):
    # its plan cannot be written there.
    server = Server(2, 1, "small", state_dir=str(tmp_path / "missing"))
    with pytest.warns(ThrottlingWarning, match="below the 2 CPUs"), pytest.raises(PlanError, match="cannot write"):
        server.start()
