"""Sweeps on a real Dask cluster on 127.0.0.1: a scheduler and two 1-CPU workers, no mocks.

The CLI prints its progress (machines, trials, cells done) on stderr.

Each worker is confined to one CPU with ``taskset``, so each is a "machine" of
its own: the same hostname, another topology fingerprint. The cells are tiny
(1 worker x 1 thread, the small model, 20 requests) so the module stays well
under two minutes on two CPUs.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

distributed = pytest.importorskip("distributed")

from tuna_lab.measure.experiment import Config, load_results  # noqa: E402
from tuna_lab.measure.sweeps.local import ClusterSpec, sweep  # noqa: E402
from tuna_lab.server.models import ensure_model  # noqa: E402
from daskcluster import DASK, Cluster, scheduler, stop  # noqa: E402
from helpers import main  # noqa: E402

CPUS = sorted(os.sched_getaffinity(0))[:2]
#: Every process of this module's cluster carries it (Gunicorns inherit it): how survivors are found.
MARK = f"tuna-lab-test-cluster-{uuid.uuid4().hex[:8]}"
GRID = ["--configs", "1x1", "--models", "small", "--batches", "10,20", "--policies", "cfs,round-robin",
        "--trials", "1", "--requests", "20"]

pytestmark = pytest.mark.skipif(len(CPUS) < 2 or not shutil.which("taskset") or not DASK.exists(),
                                reason="needs two CPUs, taskset and the dask command (pip install '.[cluster]')")


def _gunicorns(under=None):
    """Live Gunicorn processes started under this module's cluster (under one process, if given)."""
    procs = psutil.Process(under).children(recursive=True) if under else psutil.process_iter()
    found = []
    for p in procs:
        try:
            if "gunicorn" in " ".join(p.cmdline()) and p.environ().get("TUNA_LAB_TEST_MARK") == MARK:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ensure_model("small")            # trained once into the cache, before any worker needs it
    c = Cluster(tmp_path_factory.mktemp("dask"), CPUS, MARK)
    yield c
    c.close()


def _cli(*args):
    """``tuna-lab ARGS`` in this process (helpers.main) and how long it took."""
    started = time.monotonic()
    p = main(*args)
    return p, time.monotonic() - started


def _cells(out):
    """``{cell: [machines it finished on]}`` and the manifests, read from the tree."""
    where, manifests = {}, {}
    for manifest in sorted(Path(out).glob("*/*/manifest.json")):
        machine, cell = manifest.parent.parent.name, manifest.parent.name
        if cell.endswith(".partial"):
            continue
        where.setdefault(cell, []).append(machine)
        manifests[machine, cell] = json.loads(manifest.read_text())
    return where, manifests


@pytest.fixture(scope="module")
def spread(cluster, tmp_path_factory):
    out = tmp_path_factory.mktemp("spread") / "out"
    p, seconds = _cli("sweep", *GRID, "--out", out, "--cluster", cluster.address, "--any-machine")
    assert p.returncode == 0, p.stderr
    return out, p.stderr, seconds


def test_spread_lands_every_cell_once_under_the_machine_that_ran_it(cluster, spread):
    out, log, seconds = spread
    where, manifests = _cells(out)
    assert sorted(where) == ["w1-t1-small-b10", "w1-t1-small-b20"]
    assert all(len(machines) == 1 for machines in where.values())
    # Two idle machines, two cells: one each, each under the name of the machine that ran it.
    assert len({m[0] for m in where.values()}) == 2
    for (machine, cell), m in manifests.items():
        assert machine == f"{m['hostname']}-{m['fingerprint'][:8]}" == m["machine"]
        worker_cpu = int(m["dask_worker"].removeprefix("cpu"))
        assert m["cpus"] == [worker_cpu] and m["limits"]["usable"] == [worker_cpu]
        assert m["cell"] == cell and {"cpu_model", "kernel", "versions", "topology"} <= set(m)
    assert "cluster: scheduler" in log and "done in" in log and "s left" in log
    requests, trials, _ = load_results(str(out))
    assert sorted(trials["machine"].unique()) == sorted({m[0] for m in where.values()})
    assert len(trials) == 2 * 2 and len(requests) == 2 * 2 * 20


def test_per_machine_runs_every_cell_on_both_and_resumes(cluster, spread, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(spread[0], out)
    before = {p: p.stat().st_mtime_ns for p in out.glob("*/*/manifest.json")}
    lines = []
    configs = [Config(1, 1, "small", b) for b in (10, 20)]
    with distributed.Client(cluster.address, timeout=10) as client:
        sweep(configs, ["cfs", "round-robin"], str(out), trials=1, requests=20, progress=lines.append,
              cluster=ClusterSpec(client, per_machine=True))
    where, _ = _cells(out)
    assert all(sorted(machines) == sorted(where["w1-t1-small-b10"]) and len(machines) == 2
               for machines in where.values())
    # Each machine had one of the two cells already: it ran only the other one.
    assert sum("1 of 2 cells already finished, 1 to run" in line for line in lines) == 2
    assert sum(" done in " in line for line in lines) == 2
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())
    # Everything finished: a re-run sends nothing.
    p, _ = _cli("sweep", *GRID, "--out", out, "--cluster", cluster.address, "--per-machine")
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("2 of 2 cells already finished, 0 to run") == 2 and " done in " not in p.stderr


def test_report_and_advise_read_the_multi_machine_tree(spread, tmp_path):
    out = spread[0]
    machines = sorted(d.name for d in out.iterdir() if d.is_dir())     # not the folder's lock file
    p, _ = _cli("report", out, "-o", tmp_path / "report.html")
    assert p.returncode == 0, p.stderr
    text = (tmp_path / "report.html").read_text()
    assert "<h2>Machines</h2>" in text and all(text.count(m) >= 3 for m in machines)
    assert "p99 by configuration - machine " + machines[0] in text
    # Two configurations are too few to learn from: one clear line, exit 2.
    p, _ = _cli("advise", "-w", "1", "-t", "1", "--model", "small", out)
    assert p.returncode == 2 and p.stdout == ""
    assert len(p.stderr.strip().splitlines()) == 1 and "at least 4" in p.stderr


def test_interrupt_keeps_finished_cells_and_leaves_no_server(cluster, tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "tuna_lab.cli", "sweep", "--configs", "1x1", "--models", "small",
           "--batches", "10,20,30,40,50,60", "--policies", "cfs,round-robin", "--trials", "1", "--requests", "20",
           "--out", str(out), "--cluster", cluster.address, "--any-machine"]
    # One trial: a cell is still two runs (one per policy), so the interrupt may find a cell between them.
    # Ctrl-C as in a terminal: a test run started in the background (``cmd &`` without job control,
    # nohup) has SIGINT ignored, and a child inherits that - the sweep would never see the interrupt
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + 90
    while not any(" done in " in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any(" done in " in line for line in lines), "".join(lines)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130, "".join(lines)
    reader.join(10)
    assert lines[-1].startswith("tuna-lab: interrupted") and any("no more cells are sent" in line for line in lines)
    where, _ = _cells(out)
    assert 1 <= len(where) < 6 and all(len(m) == 1 for m in where.values())
    load_results(str(out))                               # what was kept is whole
    # The running cells stop after their current trial, their servers with them.
    deadline = time.monotonic() + 30
    while _gunicorns() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _gunicorns()


def test_a_worker_killed_mid_cell_loses_nothing_and_mixes_nothing(cluster, tmp_path):
    out = tmp_path / "out"
    # The default spread: the two 1-CPU workers are one machine *shape* (CPU ids aside), so both run cells,
    # and the cell of the first machine seen - the one the sweep keeps to - moves to the other when it is lost.
    # One trial: a cell is still two runs (one per policy), so the kill lands between its first and its last.
    cmd = [sys.executable, "-m", "tuna_lab.cli", "sweep", "--configs", "1x1", "--models", "small",
           "--batches", "10,20,30", "--policies", "cfs,round-robin", "--trials", "1", "--requests", "20",
           "--out", str(out), "--cluster", cluster.address]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + 90
    joined = []
    while not joined and time.monotonic() < deadline:
        joined = [line.rstrip().split()[-1] for line in list(lines) if line.startswith("cluster: machine ")
                  and " worker tcp://" in line]
        time.sleep(0.05)
    assert joined, "".join(lines)
    address = joined[0]
    victim = next(name for name, a in cluster.address_of.items() if a == address)

    def machine():
        return next((line.split()[2].rstrip(":") for line in lines if line.startswith("cluster: machine")
                     and line.rstrip().endswith(address)), None)

    # Kill it once it finished a run of its cell and serves the next one: mid-cell, with a run to keep apart.
    servers = []
    while time.monotonic() < deadline:
        name = machine()
        if name and any(f"[{name}]" in line and "trial" in line for line in lines):
            servers = _gunicorns(under=cluster.workers[victim].pid)
            if servers:
                break
        time.sleep(0.05)
    assert servers, "".join(lines)
    os.killpg(cluster.workers[victim].pid, signal.SIGKILL)
    killed = time.monotonic()
    cluster.workers[victim].wait(timeout=10)
    # The killed worker's Gunicorn stops with it (parent-death signal: a graceful stop of its workers).
    psutil.wait_procs(servers, timeout=30)
    assert time.monotonic() - killed < 15
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in servers)
    assert proc.wait(timeout=120) == 0
    reader.join(10)
    text = "".join(lines)
    assert f"[{machine()}] its machine left during" in text and "queued again" in text
    assert "of another shape" not in text
    where, manifests = _cells(out)
    assert sorted(where) == ["w1-t1-small-b10", "w1-t1-small-b20", "w1-t1-small-b30"]
    assert all(len(m) == 1 for m in where.values())
    # The lost cell finished on the other machine: one shape, two folders (one per fingerprint) on this host.
    lost = next(line.split(" during ")[1].split(":")[0] for line in lines if "its machine left during" in line)
    assert where[lost] != [machine()] and len({m["shape"] for m in manifests.values()}) == 1
    partial = list(out.glob(f"{machine()}/*.partial"))
    assert len(partial) == 1 and (partial[0] / "trials.parquet").exists()
    # Every (cell, policy, trial) once: the partial runs are kept apart, not counted.
    requests, trials, _ = load_results(str(out))
    assert len(trials) == 3 * 2 and not trials.duplicated(["cell", "policy", "trial"]).any()
    assert len(requests) == 3 * 2 * 20
    assert not _gunicorns()                              # nor does any other


def test_unreachable_scheduler_is_one_line_and_exit_2(tmp_path):
    with socket.socket() as s:          # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p, seconds = _cli("sweep", *GRID, "--out", tmp_path / "out", "--cluster", f"tcp://127.0.0.1:{port}")
    assert p.returncode == 2 and seconds < 8             # refused at the first try, not after the 10 s timeout
    assert len(p.stderr.strip().splitlines()) == 1 and "cannot reach the Dask scheduler" in p.stderr


def test_a_scheduler_without_workers_says_so_after_a_bounded_wait(tmp_path):
    boss, address = scheduler(tmp_path, MARK)
    try:
        p, seconds = _cli("sweep", *GRID, "--out", tmp_path / "out", "--cluster", address,
                          "--wait-for-workers", "2")
    finally:
        stop(boss)
    assert p.returncode == 2 and seconds < 15 and p.stdout == ""
    line = p.stderr.strip().splitlines()[-1]
    assert line.startswith("tuna-lab: error: no Dask worker joined") and "--resources machine=1" in line


def test_cluster_options_need_a_cluster(tmp_path):
    p, _ = _cli("sweep", *GRID, "--out", tmp_path / "out", "--per-machine")
    assert p.returncode == 2 and "--cluster" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_a_worker_without_tuna_lab_is_reported_at_once(tmp_path):
    # A worker whose Python finds a tuna_lab that cannot be imported (as one with none installed).
    fake = tmp_path / "site" / "tuna_lab"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named tuna_lab (test worker)')\n")
    boss, address = scheduler(tmp_path, MARK)
    env = {**os.environ, "TUNA_LAB_TEST_MARK": MARK, "PYTHONPATH": str(tmp_path / "site")}
    worker = subprocess.Popen([str(DASK), "worker", address, "--nthreads", "1", "--nworkers", "1", "--resources",
                               "machine=1", "--no-dashboard"], stdout=open(tmp_path / "w.log", "wb"),
                              stderr=subprocess.STDOUT, env=env, start_new_session=True)
    from tuna_lab.errors import ExperimentError
    from tuna_lab.measure.sweeps.cluster import connect

    started = time.monotonic()
    try:
        # In this process (the CLI turns the error into one line and exit 2 like any other): no CLI start-up.
        with connect(address) as client, pytest.raises(ExperimentError) as info:
            sweep([Config(1, 1, "small", 10)], ["cfs"], str(tmp_path / "out"), trials=1, requests=5,
                  cluster=ClusterSpec(client, worker_wait=60))
    finally:
        stop(worker)
        stop(boss)
    line = str(info.value)
    assert time.monotonic() - started < 30 and "\n" not in line
    assert "cannot import" in line and "No module named tuna_lab (test worker)" in line and "install tuna_lab" in line
