"""Faults: SIGKILL at a random point of a small sweep, resume, and check that nothing is lost or mixed.

Each seed draws what to kill - the sweep itself, the Gunicorn master it
started, one of that master's workers, or (a sweep on a real Dask cluster of
two 1-CPU workers on 127.0.0.1) one Dask worker - and when: after a random
number of the sweep's trials have finished, plus a random fraction of a
second. Then the sweep is resumed until it finishes, and every time:

* every cell is finished exactly once, with the sweep's settings (policies,
  trials, requests), and holds one row per (policy, trial), none twice;
* no cell that was finished when the kill struck changes on resume;
* no server of the sweep is left running, and this process's CPUs are what
  they were (nothing stays pinned).

``make test`` runs three seeds, the first three kinds (``test_cluster``
kills a Dask worker there); ``make faults`` runs ``TUNA_LAB_FAULT_SEEDS`` of
them (24 by default there, six of each kind). The seed decides the
kind and the point; what the kill hits at that point still depends on the
machine's timing, which is the point of the test.
"""

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest
from daskcluster import DASK, Cluster
from helpers import main

from tuna_lab.measure.store import is_finished, load_results
from tuna_lab.server.models import ensure_model

SEEDS = int(os.environ.get("TUNA_LAB_FAULT_SEEDS", "3"))
KINDS = ("sweep", "master", "worker", "dask-worker")
CONFIGS, BATCHES, POLICIES, TRIALS, REQUESTS = "1x1", (10, 20), ("cfs", "round-robin"), 1, 20
CELLS = [f"w1-t1-small-b{b}" for b in BATCHES]
RUNS = len(CELLS) * len(POLICIES) * TRIALS
#: Every process the sweeps of this module start carries it (Gunicorn inherits it): how survivors are found.
MARK = f"tuna-lab-test-faults-{uuid.uuid4().hex[:8]}"


def _argv(out, cluster=None):
    """``tuna-lab sweep`` of this module's grid, as a process (the one killed) runs it."""
    return [sys.executable, "-m", "tuna_lab", *_args(out, cluster)]


def _args(out, cluster=None):
    """The arguments of :func:`_argv` after the program: the resume runs them in this process."""
    return ["sweep", "--configs", CONFIGS, "--models", "small",
            "--batches", ",".join(map(str, BATCHES)), "--policies", ",".join(POLICIES), "--trials", str(TRIALS),
            "--requests", str(REQUESTS), "--out", str(out), *(["--cluster", cluster.address] if cluster else [])]


def _ours(cluster=None):
    """Live processes that carry this module's mark (zombies do not count: they hold no CPU, no port).

    The cluster's own scheduler and Dask workers are not counted: they are
    meant to outlive a sweep. A Gunicorn under one of them is.
    """
    keep = set()
    if cluster is not None:
        for proc in [cluster.scheduler, *cluster.workers.values()]:
            try:
                tree = psutil.Process(proc.pid)
                keep.update(p.pid for p in [tree, *tree.children(recursive=True)]
                            if "gunicorn" not in " ".join(p.cmdline()))
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.pid not in keep and p.environ().get("TUNA_LAB_TEST_MARK") == MARK \
                    and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _dask_victim(cluster, rng):
    """A Dask worker to kill: one running a Gunicorn at this instant if any does, else any live one."""
    live = {name: proc for name, proc in cluster.workers.items() if proc.poll() is None}
    busy = []
    for name, proc in live.items():
        try:
            if any("gunicorn" in " ".join(p.cmdline()) for p in psutil.Process(proc.pid).children(recursive=True)):
                busy.append(name)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    names = sorted(busy or live)
    return cluster.workers[names[int(rng.integers(0, len(names)))]] if names else None


def _gunicorn_master(sweep_pid):
    """The Gunicorn master the sweep runs now (a child of the sweep running gunicorn), or None."""
    try:
        kids = psutil.Process(sweep_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return None
    for p in kids:
        try:
            if "gunicorn" in " ".join(p.cmdline()) and p.ppid() == sweep_pid:
                return p
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def _finished(out):
    """``{cell folder, relative to out: digest of its files}`` for every finished cell under ``out``.

    A local sweep's cells are ``out/<cell>``; a cluster's, ``out/<machine>/<cell>``.
    """
    cells = {}
    for manifest in sorted([*Path(out).glob("*/manifest.json"), *Path(out).glob("*/*/manifest.json")]):
        folder = manifest.parent
        if not folder.name.endswith(".partial") and is_finished(str(folder)):
            digest = hashlib.sha256()
            for f in sorted(folder.rglob("*")):
                if f.is_file():
                    digest.update(f.relative_to(folder).as_posix().encode() + f.read_bytes())
            cells[folder.relative_to(out).as_posix()] = digest.hexdigest()
    return cells


def _cells(finished):
    """The cell names of :func:`_finished`'s folders, each as often as it was finished."""
    return sorted(Path(folder).name for folder in finished)


def _wait_gone(cluster=None, timeout=30):
    deadline = time.monotonic() + timeout
    while _ours(cluster) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _ours(cluster)


@pytest.fixture(scope="module", autouse=True)
def _model():
    ensure_model("small")            # trained once into the cache, before the first sweep is timed


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="round-robin on one CPU pins nothing")
@pytest.mark.parametrize("seed", range(SEEDS))
def test_a_kill_at_a_random_point_loses_nothing_and_mixes_nothing(seed, tmp_path):
    rng = np.random.default_rng(seed)
    kind = KINDS[seed % len(KINDS)]
    after = int(rng.integers(0, RUNS))               # trials finished before the kill
    delay = float(rng.uniform(0.0, 1.5))
    out = tmp_path / "sweep"
    env = {**os.environ, "TUNA_LAB_TEST_MARK": MARK}
    affinity = os.sched_getaffinity(0)
    cluster = None
    if kind == "dask-worker":
        if not DASK.exists():
            pytest.skip("needs the dask command (pip install '.[cluster]')")
        # Two workers of one shape: the killed one's cell moves to the other.
        (tmp_path / "dask").mkdir()
        cluster = Cluster(tmp_path / "dask", sorted(affinity)[:2], MARK)

    sweep = subprocess.Popen(_argv(out, cluster), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(sweep.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while sum(" trial " in line for line in lines) < after and sweep.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(delay)
        victim = None
        if kind == "sweep":
            victim = psutil.Process(sweep.pid) if sweep.poll() is None else None
        elif kind == "dask-worker":
            victim = _dask_victim(cluster, rng)
        else:
            # A server to hit: the next one the sweep starts, if none runs at this instant.
            while victim is None and sweep.poll() is None and time.monotonic() < deadline:
                master = _gunicorn_master(sweep.pid)
                if master is not None and kind == "master":
                    victim = master
                elif master is not None:
                    try:
                        workers = master.children()
                    except psutil.NoSuchProcess:
                        workers = []
                    victim = workers[int(rng.integers(0, len(workers)))] if workers else None
                if victim is None:
                    time.sleep(0.02)
        killed = False
        if isinstance(victim, subprocess.Popen):      # a Dask worker: its nanny and worker process together
            with contextlib.suppress(ProcessLookupError):
                os.killpg(victim.pid, signal.SIGKILL)
                killed = True
            victim.wait(timeout=10)
        elif victim is not None:
            try:
                victim.send_signal(signal.SIGKILL)
                killed = True
            except psutil.NoSuchProcess:
                pass
        struck = _finished(out)                       # what was finished when the kill struck
        sweep.wait(timeout=180)
        reader.join(10)
        assert not _wait_gone(cluster), f"left running after the {kind} was killed: {_ours(cluster)}"

        # Resume until finished (a killed server fails its trial; its cell is then redone on resume). The resume
        # is no process under test: it runs in this one (its servers still carry the mark, from its environment).
        before = _finished(out)
        assert all(before.get(cell) == digest for cell, digest in struck.items()), "a finished cell changed"
        for _ in range(3):
            done = main(*_args(out, cluster), env=env, timeout=180)
            assert done.returncode == 0, done.stderr
            if set(_cells(_finished(out))) == set(CELLS):
                break
        assert not _wait_gone(cluster), f"left running after the resume: {_ours(cluster)}"
    finally:
        if cluster is not None:
            cluster.close()
        for p in _ours():
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass

    final = _finished(out)
    assert _cells(final) == CELLS, (kind, after, sorted(final))      # every cell once, on one machine
    assert all(final[cell] == digest for cell, digest in before.items()), "the resume changed a finished cell"
    _, trials, manifests = load_results(str(out))
    assert len(trials) == RUNS and not trials.duplicated(["cell", "policy", "trial"]).any()
    for m in manifests:
        assert sorted(m["policies"]) == sorted(POLICIES) and m["trials"] == TRIALS and m["requests"] == REQUESTS
    # The sweep's identity, written before its first cell, is the one every resume ran under.
    settings = json.loads((out / "sweep.json").read_text())
    assert sorted(settings["configs"]) == CELLS and settings["policies"] == list(POLICIES)
    assert (settings["trials"], settings["requests"]) == (TRIALS, REQUESTS)
    assert os.sched_getaffinity(0) == affinity
    # Say what was struck, for the record of the kills survived (pytest -rA shows it).
    print(f"seed {seed}: killed the {kind} after {after} trials + {delay:.2f} s: "
          f"{'hit' if killed else 'nothing left to hit'}; {len(struck)} cells finished then")


def _all_ready(master):
    """Whether every worker of ``master`` has finished its own start-up (warmed and pinned): the trial begins then."""
    from tuna_lab.errors import TunaError
    from tuna_lab.server.launch import status
    with contextlib.suppress(psutil.Error, TunaError, OSError, ValueError, KeyError):
        argv = master.cmdline()
        info = status(argv[argv.index("--pid") + 1])
        return len(info["workers"]) == info["workers_expected"] and all(w["ready"] for w in info["workers"])
    return False


def _worker_cpu(master):
    """CPU seconds the master's live workers have spent so far: it grows with the requests they serve."""
    total = 0.0
    with contextlib.suppress(psutil.Error):
        for worker in master.children():
            with contextlib.suppress(psutil.Error):
                times = worker.cpu_times()
                total += times.user + times.system
    return total


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="round-robin on one CPU pins nothing")
@pytest.mark.parametrize("kind", ["master", "worker"])
def test_a_kill_mid_trial_is_recorded_and_the_resume_redoes_only_that_run(kind, tmp_path):
    """Kill the first server's master (or one worker) once it has answered well past its warm-up."""
    from tuna_lab.measure.store import cell_state

    out = tmp_path / "run" / "w2-t1-small-b10"          # `run --out` writes its cell inside the folder
    args = ["run", "-w", "2", "-t", "1", "--model", "small", "--batch", "10", "--policies", ",".join(POLICIES),
            "--trials", "2", "--requests", "800", "--concurrency", "2", "--seed", "1", "--out", str(out.parent)]
    argv = [sys.executable, "-m", "tuna_lab", *args]
    env = {**os.environ, "TUNA_LAB_TEST_MARK": MARK}
    runner = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        master = None
        while master is None and runner.poll() is None and time.monotonic() < deadline:
            master = _gunicorn_master(runner.pid)
            time.sleep(0.02)
        assert master is not None, "no server started"
        # Its workers up, then well past the warm-up's 20 requests (0.5 s of the workers' CPU is some 200 of the
        # small model's at batch 10, 2 ms each here), far from the load's 800: mid-trial.
        # Counted from when every worker is ready: a worker's own start-up (imports, the model, its warm-up)
        # costs some 0.4-0.5 s of CPU here, so a count from its fork killed during the server's start-up,
        # before the trial (the start fails, or a replaced worker is warm before the trial's warm-up).
        while not _all_ready(master) and master.is_running() and time.monotonic() < deadline:
            time.sleep(0.02)
        start = _worker_cpu(master)
        while _worker_cpu(master) < start + 0.5 and master.is_running() and time.monotonic() < deadline:
            time.sleep(0.01)
        victim = master if kind == "master" else master.children()[0]
        victim.send_signal(signal.SIGKILL)
        _, err = runner.communicate(timeout=300)
    finally:
        runner.kill()
    assert "Traceback" not in err and (out / "trials.parquet").exists(), err
    trials = pd.read_parquet(out / "trials.parquet")
    hit = trials[(trials["trial"] == 0) & (trials["order"] == 0)].iloc[0]     # the first server's run
    assert hit["trial_status"] == "failed", hit["reason"]
    if kind == "master":
        assert hit["master_restarted"] == 1 and "died" in hit["reason"]
    else:
        assert hit["master_restarted"] == 0 and hit["workers_replaced"] >= 1 and "replaced" in hit["reason"]
    others = trials.drop(index=hit.name)
    assert (others["trial_status"] == "ok").all() and (others[["workers_replaced", "master_restarted"]] == 0).all().all()
    # Validity per policy: the killed run's policy is one trial short, so the cell is not finished.
    state = cell_state(str(out))
    assert state.status == "incomplete" and state.missing == {hit["policy"]: 1}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["valid_by_policy"] == {p: 1 if p == hit["policy"] else 2 for p in POLICIES}
    # The resume runs that one run and keeps the three others as they were (in this process: the killed
    # run's was the process under test).
    again = main(*args, env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "keeping 3 valid runs of an earlier attempt, running the 1 missing" in again.stderr
    assert sum(" trial " in line for line in again.stderr.splitlines()) == 1
    final = pd.read_parquet(out / "trials.parquet").set_index(["trial", "policy"])
    assert len(final) == 4 and (final["trial_status"] == "ok").all() and cell_state(str(out)).finished
    assert final.loc[(0, hit["policy"]), "attempt"] == 1 and (final.drop(index=(0, hit["policy"]))["attempt"] == 0).all()
    kept = others.set_index(["trial", "policy"])
    assert (final.loc[kept.index, "p99"] == kept["p99"]).all()
    assert not _wait_gone(), f"left running: {_ours()}"
