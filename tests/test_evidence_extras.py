"""Issue 50's extra evidence: CPU clocks and governors, irqbalance under ``audit --isolate``, runtime wait knobs.

No server starts here: the cpufreq reader runs on folder trees that imitate
``/sys`` and on this machine's own; the irqbalance check finds a real process
of that name (``sleep`` under a link named ``irqbalance``); the wait knobs
are read from real targets' environments (a child process stands for a
running server's master). tests/test_evidence.py checks a real cell's
written manifest and report.
"""

import os
import subprocess
import time

import pytest

from tuna_lab.live.audit import isolation_warnings
from tuna_lab.machine import procfs
from tuna_lab.machine.cpufreq import CPU_DIR, NOT_EXPOSED, cpu_frequency, describe_frequency
from tuna_lab.measure.attached import AttachedTarget
from tuna_lab.measure.evidence import DEFAULT, ORT_SPINNING, WAIT_KNOBS, evidence_rows, wait_knobs
from tuna_lab.measure.experiment import Config, manifest
from tuna_lab.measure.target import AppTarget

CPUS = sorted(os.sched_getaffinity(0))


def _sys_tree(root, cpus):
    """A folder imitating /sys/devices/system/cpu: ``{cpu: (scaling_cur_freq, scaling_governor) or None}``."""
    for cpu, files in cpus.items():
        folder = root / f"cpu{cpu}"
        folder.mkdir(parents=True)
        if files is None:
            continue
        (folder / "cpufreq").mkdir()
        for name, text in zip(("scaling_cur_freq", "scaling_governor"), files):
            if text is not None:
                (folder / "cpufreq" / name).write_text(text + "\n")
    return str(root)


# -- CPU frequency and governor ---------------------------------------------------------------------


def test_frequency_and_governor_are_read_per_cpu_where_cpufreq_exposes_them(tmp_path):
    root = _sys_tree(tmp_path, {0: ("2400000", "performance"), 1: ("800000", "powersave"), 2: None})
    reading = cpu_frequency([1, 0], root)
    assert reading == {"cpus": {"0": {"khz": 2400000, "governor": "performance"},
                                "1": {"khz": 800000, "governor": "powersave"}}, "note": None}
    assert describe_frequency(reading) == "CPU 0 2.40 GHz performance, CPU 1 0.80 GHz powersave"


def test_a_machine_without_cpufreq_records_null_and_says_why(tmp_path):
    root = _sys_tree(tmp_path, {0: None, 1: None})
    reading = cpu_frequency([0, 1], root)
    assert reading == {"cpus": {"0": {"khz": None, "governor": None}, "1": {"khz": None, "governor": None}},
                       "note": NOT_EXPOSED}
    assert describe_frequency(reading) == "not exposed by this machine: no cpufreq in /sys"


def test_a_cpu_missing_a_file_or_holding_junk_is_null_with_its_reason(tmp_path):
    root = _sys_tree(tmp_path, {0: ("2400000", None), 1: ("fast", "schedutil"), 2: None, 3: ("0", "performance")})
    reading = cpu_frequency(range(4), root)
    assert reading["cpus"] == {"0": {"khz": 2400000, "governor": None}, "1": {"khz": None, "governor": "schedutil"},
                               "2": {"khz": None, "governor": None}, "3": {"khz": None, "governor": "performance"}}
    assert reading["note"] == ("CPU 0: no scaling_governor; CPU 1: scaling_cur_freq is no frequency ('fast'); "
                               "CPU 2: no cpufreq folder; CPU 3: scaling_cur_freq is no frequency ('0')")
    assert describe_frequency(reading).startswith("CPU 0 2.40 GHz -, CPU 1 - schedutil, CPU 3 - performance (CPU 0:")


def test_a_fifo_where_the_frequency_should_be_is_not_waited_on(tmp_path):
    root = _sys_tree(tmp_path, {0: (None, "performance")})
    os.mkfifo(tmp_path / "cpu0" / "cpufreq" / "scaling_cur_freq")
    start = time.monotonic()
    reading = cpu_frequency([0], root)
    assert time.monotonic() - start < 5
    assert reading["cpus"]["0"] == {"khz": None, "governor": "performance"}
    assert reading["note"] == "CPU 0: no scaling_cur_freq"


def test_this_machines_reading_is_its_figures_or_why_there_are_none():
    reading = cpu_frequency(CPUS)
    exposed = [cpu for cpu in CPUS if os.path.isdir(f"{CPU_DIR}/cpu{cpu}/cpufreq")]
    if not exposed:
        assert reading["note"] == NOT_EXPOSED
        assert all(v == {"khz": None, "governor": None} for v in reading["cpus"].values())
    else:
        for cpu in exposed:
            assert isinstance(reading["cpus"][str(cpu)]["khz"], int)


def test_a_cells_manifest_records_the_serving_cpus_clocks_and_wait_knobs():
    # The manifest the runner writes, built in-process on this machine (no server): serving CPUs from client_cpus.
    serving = CPUS[-1:]
    meta = manifest(Config(1, 1, "small", 10, wait_policy="active"), ["cfs"], 1, 10, 0,
                    {"client_cpus": {"server_cpus": serving}})
    freq = meta["cpu_frequency"]
    assert freq["cpus"] == serving and set(freq["start"]["cpus"]) == {str(c) for c in serving}
    assert freq["start"] == cpu_frequency(serving) or freq["start"]["note"] is None   # clocks move; a reason does not
    assert meta["wait_knobs"]["OMP_WAIT_POLICY"] == "ACTIVE"
    assert meta["wait_knobs"]["KMP_BLOCKTIME"] == os.environ.get("KMP_BLOCKTIME", DEFAULT)
    assert "KMP_BLOCKTIME" in meta["wait_knobs_note"]
    labels = dict(evidence_rows(meta))
    assert set(labels) == {"CPU frequency", "runtime wait settings"}
    assert "OMP_WAIT_POLICY=ACTIVE" in labels["runtime wait settings"]


# -- the runtimes' wait knobs -------------------------------------------------------------------------


def test_the_lab_servers_knobs_are_its_environment_with_the_cells_wait_policy_applied():
    inherited = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "7", "KMP_BLOCKTIME": "0"}
    # "default" removes the inherited OMP_WAIT_POLICY and GOMP_SPINCOUNT, as the lab server does; KMP_BLOCKTIME stays.
    assert wait_knobs(Config(1, 1, "small", 10), environ=inherited) == {
        "OMP_WAIT_POLICY": DEFAULT, "GOMP_SPINCOUNT": DEFAULT, "KMP_BLOCKTIME": "0", ORT_SPINNING: DEFAULT}
    assert wait_knobs(Config(1, 1, "small", 10, wait_policy="passive", spincount=1000), environ={}) == {
        "OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000", "KMP_BLOCKTIME": DEFAULT, ORT_SPINNING: DEFAULT}


def test_an_apps_knobs_are_its_environment_and_onnx_runtimes_option_is_said_to_be_its_own(tmp_path):
    (tmp_path / "myapp.py").write_text("app = None\n")
    target = AppTarget("myapp:app", 1, 1, app_dir=str(tmp_path), env={"KMP_BLOCKTIME": "1"})
    config = Config(1, 1, "myapp", 0, target="app")
    knobs = wait_knobs(config, target, environ={"OMP_WAIT_POLICY": "PASSIVE"})
    assert knobs["KMP_BLOCKTIME"] == "1" and knobs["OMP_WAIT_POLICY"] == "PASSIVE"
    assert knobs["GOMP_SPINCOUNT"] == DEFAULT
    assert "SessionOptions" in knobs[ORT_SPINNING]


def test_a_running_servers_knobs_are_read_from_its_masters_environment():
    env = {k: v for k, v in os.environ.items() if k not in WAIT_KNOBS}
    child = subprocess.Popen(["sleep", "30"], env={**env, "KMP_BLOCKTIME": "5", "OMP_WAIT_POLICY": "active"})
    try:
        target = AttachedTarget(child.pid, "http://127.0.0.1:9", 1)
        knobs = wait_knobs(Config(1, 1, "x", 0, target="attached"), target)
        assert knobs["KMP_BLOCKTIME"] == "5" and knobs["OMP_WAIT_POLICY"] == "active"
        assert knobs["GOMP_SPINCOUNT"] == DEFAULT
    finally:
        child.kill()
        child.wait()
    # Gone: every knob says why it is not known, none is guessed.
    knobs = wait_knobs(Config(1, 1, "x", 0, target="attached"), target)
    assert all(v.startswith("unreadable: ") for v in knobs.values()), knobs


# -- irqbalance under audit --isolate -----------------------------------------------------------------


@pytest.fixture
def irqbalance(tmp_path):
    """A real process named irqbalance: ``sleep`` run through a link of that name (its comm is the link's)."""
    link = tmp_path / "irqbalance"
    link.symlink_to("/bin/sleep" if os.path.exists("/bin/sleep") else "/usr/bin/sleep")
    proc = subprocess.Popen([str(link), "30"])
    try:
        for _ in range(100):            # comm is set at exec, a moment after fork
            if procfs.thread_name(proc.pid, proc.pid) == "irqbalance":
                break
            time.sleep(0.01)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_running_irqbalance_is_found_by_its_name_and_warned_of_in_one_line(irqbalance):
    assert irqbalance.pid in procfs.processes_named("irqbalance")
    (line,) = isolation_warnings([0])
    assert "\n" not in line and f"{irqbalance.pid}" in line
    assert "undoes the IRQ moves of --isolate" in line and "CPUs 0" in line
    irqbalance.kill()
    irqbalance.wait()
    assert irqbalance.pid not in procfs.processes_named("irqbalance")


def test_a_process_that_only_calls_itself_irqbalance_in_argv_is_not_it():
    # exec -a rewrites argv[0], not the kernel's name: a shell script cannot be taken for the daemon by its argv.
    proc = subprocess.Popen(["bash", "-c", "exec -a irqbalance sleep 30"])
    try:
        time.sleep(0.1)
        assert proc.pid not in procfs.processes_named("irqbalance")
    finally:
        proc.kill()
        proc.wait()


def test_no_irqbalance_no_warning():
    if procfs.processes_named("irqbalance"):
        pytest.skip("this machine runs irqbalance")
    assert isolation_warnings([0]) == []
