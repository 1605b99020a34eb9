"""Per-thread CPU accounting and the OpenMP wait policy as an experiment factor."""

import json
import os
import threading

import numpy as np
import pandas as pd
import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tuna_lab.errors import CpuAccountingError, ExperimentError
from tuna_lab.measure.cpu import CpuSampler, account, summarize_threads
from tuna_lab.server.cpuclock import process_thread_cpu, request_cpu, thread_cpu_seconds
from tuna_lab.server.openmp import wait_policy_env
from tuna_lab.measure.experiment import Config, LoadSpec, TrialSpec, load_results, load_thread_cpu, run

# alone: it measures CPU time (tests/conftest.py)
pytestmark = [pytest.mark.alone, pytest.mark.server]

CPUS = len(os.sched_getaffinity(0))
T = min(2, CPUS)


def test_thread_cpu_seconds_grows_with_work_and_names_a_missing_thread():
    me = (os.getpid(), threading.get_native_id())
    before = thread_cpu_seconds(*me)
    sum(i * i for i in range(300_000))
    assert thread_cpu_seconds(*me) > before
    with pytest.raises(CpuAccountingError, match="thread 999999999"):
        thread_cpu_seconds(os.getpid(), 999_999_999)


def test_sampler_keeps_the_last_value_of_a_thread_that_exited():
    done = threading.Event()
    box = {}

    def work():
        box["tid"] = threading.get_native_id()
        sum(range(200_000))
        done.wait(5)

    t = threading.Thread(target=work)
    t.start()
    while "tid" not in box:
        pass
    sampler = CpuSampler([{"pid": os.getpid(), "tid": box["tid"], "role": "openmp"}], period=0.005).start()
    done.set()
    t.join()
    sampler.stop()
    cpu = sampler.cpu[:, 0]
    assert np.isfinite(cpu).all() and np.all(np.diff(cpu) >= 0) and cpu[-1] > 0


@given(st.dictionaries(st.integers(1, 50), st.floats(0, 100), min_size=1),
       st.dictionaries(st.integers(1, 50), st.floats(0, 10)))
def test_request_cpu_adds_each_threads_increase_to_its_role(before, increase):
    after = {tid: before.get(tid, 0.0) + inc for tid, inc in increase.items()}
    pid = min(before)
    out = request_cpu(before, after, pid=pid)
    assert out["main"] == pytest.approx(increase.get(pid, 0.0))
    assert out["openmp"] == pytest.approx(sum(v for t, v in increase.items() if t != pid))


def test_process_thread_cpu_sees_this_thread():
    listing = lambda: {t.id for t in psutil.Process().threads()}  # noqa: E731
    before = listing()
    cpu = process_thread_cpu()
    after = listing()
    # Only threads that exist, and every thread alive throughout.
    assert before & after <= set(cpu) <= before | after
    assert cpu[os.getpid()] > 0 and all(v >= 0 for v in cpu.values())


def test_account_splits_cpu_into_busy_and_idle_time():
    class Fixed:                                   # samples at t = 0, 1, 2, 3 s
        # "openmp" is the pool's older name (the lab server's records say it); "other" is no pool thread.
        threads = [{"pid": 7, "tid": 7, "role": "main"}, {"pid": 7, "tid": 8, "role": "openmp"},
                   {"pid": 7, "tid": 9, "role": "pool"}, {"pid": 7, "tid": 10, "role": "other"}]
        times = np.array([0.0, 1.0, 2.0, 3.0])
        cpu = np.array([[0.0, 0.0, 0.0, 0.0], [0.5, 1.0, 0.5, 0.1], [0.5, 2.0, np.nan, 0.2],
                        [1.0, 3.0, np.nan, 0.25]])

    requests = pd.DataFrame({"pid": [7, 7, 7], "status": [200, 200, 500], "cpu_main": [0.25, 0.25, 9.0],
                             "cpu_openmp": [0.5, 1.0, 9.0]})
    rows = account(Fixed, requests).set_index("role")
    assert rows.loc["main", "cpu_seconds"] == 1.0 and rows.loc["main", "busy_cpu_seconds"] == 0.5
    # The thread that exited keeps its last reading (0.5 s); the failed request does not count.
    assert rows.loc["pool", "cpu_seconds"] == 3.5 and rows.loc["pool", "idle_cpu_seconds"] == 2.0
    assert rows.loc["pool", "threads"] == 2 and rows.loc["pool", "max_thread_cpu_seconds"] == 3.0
    # A worker's other thread is neither its pool nor split into busy and idle (no request clock covers it).
    assert rows.loc["other", "cpu_seconds"] == 0.25 and np.isnan(rows.loc["other", "busy_cpu_seconds"])
    s = summarize_threads(rows.reset_index(), 2)
    assert s["idle_cpu_share_openmp"] == pytest.approx(2 / 3.5) and s["cpu_main_per_request"] == 0.5
    assert s["cpu_openmp_seconds"] == 3.5 and s["cpu_seconds"] == pytest.approx(1.0 + 3.5 + 0.25)


def test_wait_policy_is_checked_and_default_unsets_the_variables():
    assert wait_policy_env("active", 0) == ({"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "0"}, [])
    for bad in ({"wait_policy": "lazy"}, {"spincount": -1}, {"spincount": True}):
        with pytest.raises(ExperimentError):
            Config(1, 1, "small", **bad)
    assert Config(1, 1, "small").key == "w1-t1-small-b100"          # old cells keep their names
    assert Config(1, 1, "small", wait_policy="passive", spincount=10).key == "w1-t1-small-b100-passive-spin10"


@pytest.fixture(scope="module")
def waits(tmp_path_factory):
    """One worker, T threads, a tiny model: the same run with passive and with active waiting."""
    out = tmp_path_factory.mktemp("wait")
    results = {}
    for wait in ("passive", "active"):
        results[wait] = run(Config(1, T, "small", 20, wait_policy=wait), ["cfs"], trials=1,
                            load=LoadSpec(60, concurrency=1), out=str(out / wait), trial=TrialSpec(seed=1))
    return results, out


def test_cpu_accounting_adds_up(waits):
    results, _ = waits
    for wait, result in results.items():
        assert set(result.threads["role"]) >= {"master", "main"} | ({"pool"} if T > 1 else set())
        # The workers' threads (the master's are front_cpu_seconds: see tests/test_evidence.py).
        threads = result.threads[result.threads["role"].isin(["main", "pool"])]
        wall = threads["wall_seconds"].iloc[0]
        # No thread runs more than the trial's wall time; all of them at most wall x CPUs.
        assert (threads["max_thread_cpu_seconds"] <= wall * 1.02 + 0.01).all(), wait
        assert threads["cpu_seconds"].sum() <= wall * CPUS * 1.02 + 0.01
        assert (threads["requests"] > 0).all() and (threads["cpu_seconds"] > 0).all(), wait
        assert (threads["busy_cpu_seconds"] > 0).all() and (threads["idle_cpu_seconds"] >= 0).all()
        # Every request reports what its threads spent on it.
        assert (result.requests["cpu_main"] > 0).all() and (result.requests["cpu_openmp"] >= 0).all()
        row = result.trials.iloc[0]
        assert row["wait_policy"] == wait and row["cpu_per_request"] > 0
        # Each worker's share of resident pages on its main thread's NUMA node.
        assert 0 < row["numa_locality"] <= 1 and (threads["numa_node"] >= 0).all()
        assert result.manifest["wait_policy"] == wait


def test_passive_waiting_burns_less_idle_cpu_than_active(waits):
    results, _ = waits
    if T < 2:
        pytest.skip("needs an OpenMP pool of 2 threads (2 usable CPUs)")
    idle = {w: r.trials.iloc[0]["idle_cpu_share_openmp"] for w, r in results.items()}
    # Active pool threads spin through every gap between requests.
    assert idle["passive"] < idle["active"], idle


def test_thread_cpu_is_saved_next_to_the_cell(waits):
    results, out = waits
    saved = load_thread_cpu(str(out / "active"))
    assert len(saved) == len(results["active"].threads) and set(saved["wait_policy"]) == {"active"}
    with pytest.raises(ExperimentError):
        load_thread_cpu(str(out / "missing"))


def _marked(mark):
    """PIDs of live processes whose environment holds ``mark`` (``NAME=value``)."""
    name, value = mark.split("=", 1)
    # Unreadable environments (other users', zombies') come back as None: not ours to find.
    return [p.pid for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get(name) == value]


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_sigterm_stops_a_run_and_its_servers(tmp_path, sig):
    """`kill` of a running `tuna-lab run`, or its terminal closing, unwinds like Ctrl-C: no Gunicorn is left behind."""
    import signal
    import subprocess
    import sys
    import time
    import uuid

    mark = f"TUNA_LAB_TEST_MARK={uuid.uuid4().hex}"
    env = dict(os.environ, TUNA_LAB_TEST_MARK=mark.split("=")[1])
    proc = subprocess.Popen([sys.executable, "-m", "tuna_lab.cli", "run", "-w", "1", "-t", "1", "--model", "small",
                             "--batch", "10", "--policies", "cfs", "--trials", "50", "--requests", "50",
                             "--out", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        for line in proc.stderr:                         # the first trial has finished: a server ran
            if "trial 1/50" in line:
                break
        # A later trial's server is starting or serving: the run and (at least) its Gunicorn master.
        # Polled, not slept for: a small server starts in well under a second between two trials.
        deadline = time.monotonic() + 60
        while len(marked := _marked(mark)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(marked) >= 2
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted" in err
    deadline = time.monotonic() + 10
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _marked(mark)
    # The trials that finished are kept beside the cell, which a reader does not take for a finished one.
    partial = tmp_path / (Config(1, 1, "small", 10).key + ".partial")
    manifest = json.loads((partial / "manifest.json").read_text())
    trials = pd.read_parquet(partial / "trials.parquet")
    assert manifest["interrupted"] and 1 <= len(trials) <= len(manifest["orders"]) <= len(trials) + 1
    assert len(pd.read_parquet(partial / "requests.parquet")) == 50 * len(trials)
    with pytest.raises(ExperimentError, match="no finished"):
        load_results(str(tmp_path))


def test_a_fifo_planted_as_a_cpu_lock_file_is_refused_in_one_line_within_seconds(tmp_path):
    """A blocking open of a FIFO waits for a writer for ever: the lock file is opened O_NONBLOCK, then refused."""
    import time

    from helpers import cli

    folder = tmp_path / "locks"
    folder.mkdir(mode=0o700)
    for cpu in os.sched_getaffinity(0):
        os.mkfifo(folder / f"cpu{cpu}.lock")
    t0 = time.monotonic()
    # A process, under a timeout: a blocking open would hang it, not the test session.
    p = cli("run", "-w", "1", "-t", "1", "--model", "small", "--policies", "cfs", "--trials", "1", "--requests", "5",
            timeout=60, env={**os.environ, "TUNA_LAB_LOCK_DIR": str(folder), "TUNA_LAB_CPU_LOCK_WAIT": "5"})
    assert time.monotonic() - t0 < 30
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert p.returncode == 2 and len(errors) == 1, p.stderr
    assert "is not a regular file (a FIFO)" in errors[0] and "Traceback" not in p.stderr
