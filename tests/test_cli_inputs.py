"""Hostile and oversized input to the CLI: one line on stderr, the right exit status, no traceback, no hang.

Every command runs as a real subprocess under a 4 GB address-space cap (where
it could explode in memory) and a timeout: a refusal must come before any
allocation sized by the input, and before anything is started.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import tuna_lab
from tuna_lab import _checks
from tuna_lab.cli import options
from tuna_lab.errors import TopologyError

SWEEP_2CPU = Path(__file__).resolve().parent.parent / "notebooks" / "data" / "sweep-2cpu"
PRLIMIT = shutil.which("prlimit")


def tuna_lab_cli(*args, timeout=30, cwd=None):
    """``tuna-lab ARGS`` under a 4 GB address-space cap (where prlimit exists), within ``timeout`` seconds."""
    cap = [PRLIMIT, "--as=4000000000"] if PRLIMIT else []
    return subprocess.run([*cap, sys.executable, "-m", "tuna_lab.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def assert_one_line(p, status):
    """Exit ``status``, no traceback, and exactly one ``tuna-lab: ...error`` line among stderr's lines."""
    assert p.returncode == status, (p.returncode, p.stdout[-500:], p.stderr[-2000:])
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr[-2000:]
    errors = [line for line in p.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and errors[0].startswith("tuna-lab"), p.stderr
    return errors[0]


@pytest.fixture
def fsroot(tmp_path):
    """A filesystem root with one CPU whose ``online`` file is for the test to plant."""
    cpu = tmp_path / "root" / "sys" / "devices" / "system" / "cpu"
    (cpu / "cpu0" / "topology").mkdir(parents=True)
    return tmp_path / "root", cpu / "online"


def test_fsroot_whose_online_is_dev_zero_is_refused(fsroot):
    root, online = fsroot
    online.symlink_to("/dev/zero")
    line = assert_one_line(tuna_lab_cli("topology", "--fsroot", str(root)), 2)
    assert "not a regular file (a character device)" in line


def test_fsroot_whose_online_is_a_fifo_is_refused_at_once(fsroot):
    root, online = fsroot
    os.mkfifo(online)
    line = assert_one_line(tuna_lab_cli("solve", "-w", "1", "-t", "1", "--fsroot", str(root), timeout=20), 2)
    assert "a FIFO" in line


@pytest.mark.parametrize("device", ["fifo", "/dev/zero"])
def test_hwloc_xml_that_is_no_regular_file_is_refused_at_once(tmp_path, device):
    path = tmp_path / "m.xml"
    if device == "fifo":
        os.mkfifo(path)
    else:
        path = Path(device)
    line = assert_one_line(tuna_lab_cli("topology", "--hwloc-xml", str(path), timeout=20), 2)
    assert "not a regular file" in line


def _xml(pus):
    return "<topology><object type=\"Machine\">" + "".join(
        f'<object type="PU" os_index="{i}"/>' for i in pus) + "</object></topology>\n"


@pytest.mark.parametrize("pus, message", [
    (range(20000), "more than the 4096 PUs"),
    ([0, 4000000000], "os_index 4000000000 is above 65535"),
    ([0, "9" * 5000], "is above 65535"),
])
def test_hwloc_xml_too_large_or_with_huge_ids_is_refused(tmp_path, pus, message):
    path = tmp_path / "big.xml"
    path.write_text(_xml(pus))
    line = assert_one_line(tuna_lab_cli("solve", "-w", "1", "-t", "1", "--hwloc-xml", str(path)), 2)
    assert message in line


@pytest.mark.parametrize("spec, message", [
    ("core:60000 pu:1", "more than the 4096 PUs"),
    ("pack:100000 core:100000 pu:100000", "more than the 4096 PUs"),
    ("core:2 pu:1(indexes=0,4000000000)", "CPU id 4000000000 is above 65535"),
    ("core:2 pu:1(indexes=0," + "9" * 5000 + ")", "is above 65535"),
])
def test_synthetic_spec_too_large_is_refused(spec, message):
    line = assert_one_line(tuna_lab_cli("topology", "--synthetic", spec, "--json"), 2)
    assert message in line


@pytest.mark.parametrize("size", [("-w", "1000000000", "-t", "1"), ("-w", "1", "-t", "99999999999999999999"),
                                  ("-w", "128", "-t", "128")])
def test_solve_with_too_many_threads_is_refused_before_any_allocation(size):
    line = assert_one_line(tuna_lab_cli("solve", *size, "--preset", "xeon-8272cl"), 2)
    assert "workers x threads must be at most 8192" in line


@pytest.mark.parametrize("args, message", [
    (("-w", "1", "-t", "1", "--batch", "1000000000", "--model", "small"), "exceeds the server's limit"),
    (("-w", "1", "-t", "1", "--concurrency", "0"), "concurrency must be a positive integer"),
    (("-w", "1", "-t", "1", "--app", "../../etc:passwd"), "is not a Python module name"),
    (("-w", "1000000000", "-t", "1"), "workers x threads must be at most 8192"),
    (("-w", "1", "-t", "1", "--max-error-rate", "2"), "--max-error-rate must be in [0, 1)"),
])
def test_run_checks_its_options_up_front(args, message, tmp_path):
    line = assert_one_line(tuna_lab_cli("run", *args, "--out", str(tmp_path / "out")), 2)
    assert message in line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("args, message", [
    (("--models", ""), "--models is empty"),
    (("--batches", ""), "--batches is empty"),
    (("--policies", ""), "no policies given"),
    (("--configs", "1x99999999999999"), "W x T at most 8192"),
    (("--concurrency", "0"), "concurrency must be a positive integer"),
    (("--batches", "1000000000"), "exceeds the server's limit"),
])
def test_sweep_refuses_empty_and_oversized_options(args, message, tmp_path):
    base = ("--configs", "1x1") if "--configs" not in args else ()
    line = assert_one_line(tuna_lab_cli("sweep", *base, *args, "--out", str(tmp_path / "sweep")), 2)
    assert message in line


def test_tune_refuses_a_module_path_that_is_no_module():
    line = assert_one_line(tuna_lab_cli("tune", "--sla-p99", "50ms", "--app", "../x:app"), 2)
    assert "is not a Python module name" in line


def test_a_sweep_that_runs_nothing_exits_1(tmp_path):
    p = tuna_lab_cli("sweep", "--configs", "1x1", "--models", "small", "--budget", "1ms", "--out", str(tmp_path / "s"))
    line = assert_one_line(p, 1)
    assert "no cell ran" in line and "--budget" in line


@pytest.mark.server
def test_a_run_whose_every_trial_fails_exits_1(tmp_path):
    # An app that starts and answers every request with an error: each trial fails on its error rate.
    (tmp_path / "broken.py").write_text(
        "def app(environ, start_response):\n"
        "    start_response('500 Internal Server Error', [('Content-Type', 'text/plain')])\n"
        "    return [b'broken']\n")
    p = tuna_lab_cli("run", "--app", "broken:app", "--app-dir", str(tmp_path), "-w", "1", "-t", "1",
                     "--policies", "cfs", "--trials", "1", "--requests", "5", timeout=300)
    line = assert_one_line(p, 1)
    assert "no valid trial of cfs" in line


@pytest.mark.parametrize("where", ["/proc/version", "folder"])
def test_report_to_a_path_that_cannot_be_written_is_one_line(tmp_path, where):
    out = str(tmp_path) if where == "folder" else where
    line = assert_one_line(tuna_lab_cli("report", str(SWEEP_2CPU / "w2-t1-small-b100"), "-o", out, timeout=60), 2)
    # /proc/version holds data that is no report: refused as such before any write is tried (issue 46)
    assert f"cannot write {out}" in line or f"{out} is a file that is no tuna-lab report" in line


def test_report_through_a_link_replaces_the_link_not_its_target(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "r.html").symlink_to(victim)
    p = tuna_lab_cli("report", str(SWEEP_2CPU / "w2-t1-small-b100"), "-o", str(tmp_path / "r.html"), timeout=60)
    assert p.returncode == 0, p.stderr
    assert victim.read_text() == "keep" and not (tmp_path / "r.html").is_symlink()


def test_a_malformed_cluster_address_is_one_line_at_once(tmp_path):
    pytest.importorskip("distributed")
    p = tuna_lab_cli("sweep", "--cluster", "tcp://[::zz", "--configs", "1x1", "--out", str(tmp_path / "s"),
                     timeout=15)
    line = assert_one_line(p, 2)
    assert "is not a scheduler address" in line


@pytest.mark.parametrize("name", ["../../x", "a/b", "x" * 300, "", "..", ".hidden", "-rf", None])
def test_cluster_machine_names_become_one_safe_folder(name):
    from tuna_lab.measure.sweeps.cluster import machine_folder

    folder = machine_folder(name)
    assert folder and "/" not in folder and not folder.startswith((".", "-")) and len(folder) <= 64
    assert os.path.basename(os.path.normpath(os.path.join("/out", folder))) == folder


def test_cluster_machine_names_keep_a_real_name_and_never_collide():
    from tuna_lab.measure.sweeps.cluster import machine_folder

    assert machine_folder("node7-3fb3535c") == "node7-3fb3535c"
    assert len({machine_folder(n) for n in ("a/b", "a_b", "a:b", "x" * 300, "x" * 301)}) == 5


def test_solve_takes_a_preset_name_and_refuses_other_things():
    assert tuna_lab.solve(4, 4, "xeon-8272cl").proven_optimal
    with pytest.raises(TopologyError):
        tuna_lab.solve(4, 4, 5)
    with pytest.raises(TopologyError, match="unknown topology"):
        tuna_lab.solve(4, 4, "xeon")


def test_the_help_states_the_bounds_the_checks_hold():
    assert options.SIZE_BOUND_HELP == f"W x T at most {_checks.MAX_THREADS}"
    assert options.TOPOLOGY_BOUND_HELP == (f"at most {_checks.MAX_LOGICAL_CPUS} logical CPUs, "
                                           f"ids up to {_checks.MAX_CPU_ID}")
    p = tuna_lab_cli("solve", "--help")
    assert p.returncode == 0
    text = " ".join(p.stdout.split())
    assert options.SIZE_BOUND_HELP in text and options.TOPOLOGY_BOUND_HELP in text
