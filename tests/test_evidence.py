"""The scheduler's evidence in every trial: a real run of the lab server, its columns and their units.

Every :data:`~tuna_lab.measure.schema.EVIDENCE_COLUMNS` column is in each
trial row, in the unit it says (per-request columns are totals over ok
requests; the threads table adds up to the trial's totals); the thread table
names each thread's role (the master, the workers' main and pool threads);
and a busy process planted on a serving CPU shows as foreign CPU time.
"""

import math
import os
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

from tuna_lab.machine import sched
from tuna_lab.machine.irqs import irq_counts
from tuna_lab.measure.experiment import Config, LoadSpec, TrialSpec, load_results, load_thread_cpu, run
from tuna_lab.measure.schema import EVIDENCE_COLUMNS, THREAD_EVIDENCE_COLUMNS

# alone: it measures foreign CPU and run-queue wait (tests/conftest.py)
pytestmark = pytest.mark.alone

CPUS = sorted(os.sched_getaffinity(0))
# One worker with a pool of two threads (main + 1 pool thread), so that every worker role is there.
CONFIG = Config(1, 2, "small", 20)
REQUESTS = 300

# The counts whose per-request column is the total over the trial's ok requests.
PER_REQUEST = {"run_delay_per_request": "run_delay_seconds", "migrations_per_request": "migrations",
               "involuntary_per_request": "involuntary_switches", "voluntary_per_request": "voluntary_switches",
               "irqs_per_request": "irqs", "front_cpu_per_request": "front_cpu_seconds"}


def _measure(out, policies, requests=REQUESTS):
    return run(CONFIG, policies, trials=1, load=LoadSpec(requests, concurrency=4), out=str(out),
               trial=TrialSpec(seed=1))


@pytest.fixture(scope="module")
def quiet(tmp_path_factory):
    out = tmp_path_factory.mktemp("evidence") / "cell"
    return _measure(out, ["cfs", "round-robin"]), out


def _exposed():
    """The columns this machine cannot fill, each with why (all others must be finite)."""
    missing = set()
    if sched.MIGRATIONS_NOTE is not None:
        missing |= {"migrations", "migrations_per_request"}
    if sched.cpu_pressure() is None:
        missing.add("cpu_pressure_seconds")
    if sched.cgroup_throttling() is None:
        missing |= {"throttled_seconds", "nr_throttled"}
    if not irq_counts():
        missing |= {"irqs", "irqs_per_request"}
    return missing


def test_every_trial_carries_every_evidence_column_in_its_unit(quiet):
    result, out = quiet
    trials = load_results(str(out))[1]
    assert (trials["trial_status"] == "ok").all(), trials[["policy", "reason"]]
    missing = _exposed()
    for column in EVIDENCE_COLUMNS:
        assert column in trials.columns, column
        values = trials[column].to_numpy(float)
        if column in missing:
            assert np.isnan(values).all(), column
        else:
            assert np.isfinite(values).all() and (values >= 0).all(), (column, values)
    for _, row in trials.iterrows():
        assert row["run_delay_seconds"] >= 0 and row["timeslices"] > 0 and row["involuntary_switches"] >= 0
        for per, total in PER_REQUEST.items():
            if total not in missing:
                assert row[per] == pytest.approx(row[total] / row["ok"]), per
        # Shares and times within what the load's wall time allows.
        assert 0 <= row["foreign_cpu_share"] <= 1.0 + 0.05
        assert row["foreign_cpu_seconds"] <= row["wall_seconds"] * len(CPUS) + 0.1
        assert row["run_delay_seconds"] < row["wall_seconds"] * 3 + 1      # three threads at most
    # The manifest says why migrations are missing (null when the kernel counts them).
    assert result.manifest["migrations_note"] == sched.MIGRATIONS_NOTE


def test_the_sampling_costs_under_one_percent_of_the_servers_cpu(quiet):
    result, _ = quiet
    trials = result.trials
    server = trials["cpu_seconds"] + trials["front_cpu_seconds"]
    assert (trials["evidence_overhead_seconds"] > 0).all()
    assert (trials["evidence_overhead_seconds"] <= 0.01 * server).all(), \
        trials[["policy", "evidence_overhead_seconds", "cpu_seconds"]]


def test_the_thread_table_names_each_role_and_adds_up_to_the_trial(quiet):
    result, out = quiet
    threads = load_thread_cpu(str(out))
    assert {"master", "main", "pool"} <= set(threads["role"]) and "openmp" not in set(threads["role"])
    assert set(threads["role"]) <= {"master", "front", "helper", "main", "pool", "other"}
    for column in THREAD_EVIDENCE_COLUMNS:
        assert column in threads.columns, column
    for _, row in result.trials.iterrows():
        mine = threads[(threads["policy"] == row["policy"]) & (threads["trial"] == row["trial"])]
        # One master, one worker: its main thread and its pool thread.
        assert (mine["role"] == "master").sum() == 1 and (mine["role"] == "main").sum() == 1
        assert mine.loc[mine["role"] == "pool", "threads"].sum() == CONFIG.threads - 1
        assert (mine.loc[mine["role"] == "pool", "cpu_seconds"] > 0).all()
        # The trial's totals are its threads' sums (the master's CPU is front_cpu_seconds, not cpu_seconds).
        for column in ("run_delay_seconds", "timeslices", "voluntary_switches", "involuntary_switches"):
            assert mine[column].sum() == pytest.approx(row[column]), column
        front = mine[mine["role"].isin(["master", "front", "helper"])]
        assert front["cpu_seconds"].sum() == pytest.approx(row["front_cpu_seconds"])
        assert mine.loc[mine["role"].isin(["main", "pool", "other"]), "cpu_seconds"].sum() == \
            pytest.approx(row["cpu_seconds"])


def test_old_results_without_the_columns_still_load_and_openmp_reads_as_pool(quiet, tmp_path):
    _, out = quiet
    old = tmp_path / "old"
    old.mkdir()
    for name in ("manifest.json", "requests.parquet"):
        (old / name).write_bytes((out / name).read_bytes())
    pd.read_parquet(out / "trials.parquet").drop(columns=list(EVIDENCE_COLUMNS)).to_parquet(old / "trials.parquet")
    threads = pd.read_parquet(out / "threads.parquet").drop(columns=list(THREAD_EVIDENCE_COLUMNS))
    threads["role"] = threads["role"].replace("pool", "openmp")
    threads.to_parquet(old / "threads.parquet")
    trials = load_results(str(old))[1]
    assert all(trials[c].isna().all() for c in EVIDENCE_COLUMNS)
    read = load_thread_cpu(str(old))
    assert "pool" in set(read["role"]) and "openmp" not in set(read["role"])
    assert all(read[c].isna().all() for c in THREAD_EVIDENCE_COLUMNS)


def test_a_busy_foreign_process_on_a_serving_cpu_is_foreign_cpu(quiet, tmp_path):
    quiet_result, _ = quiet
    # A spinner pinned on a CPU the server uses (cfs: all of them), at the highest priority we may give it,
    # so that it keeps its CPU busy whatever else runs.
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(spinner.pid, {CPUS[0]})
        try:
            os.setpriority(os.PRIO_PROCESS, spinner.pid, -20)
        except PermissionError:
            pass
        before, t0 = sched.thread_sched(spinner.pid, spinner.pid), time.monotonic()
        # A third of the quiet load: its rates, not its totals, are compared, and the spinner slows it.
        result = _measure(tmp_path / "busy", ["cfs"], requests=REQUESTS // 3)
        after, wall = sched.thread_sched(spinner.pid, spinner.pid), time.monotonic() - t0
    finally:
        spinner.kill()
        spinner.wait(timeout=10)
    busy = result.trials.iloc[0]
    calm = quiet_result.trials.set_index("policy").loc["cfs"]
    assert busy["trial_status"] == "ok", busy["reason"]
    # The spinner's CPU during the load, from its rate over the whole run: all of it is foreign CPU time.
    spun = (after.cpu_seconds - before.cpu_seconds) / wall * busy["load_seconds"]
    assert spun > 0.2 * busy["load_seconds"]
    assert busy["foreign_cpu_seconds"] >= 0.8 * spun - 0.05
    assert busy["foreign_cpu_seconds"] / busy["load_seconds"] > calm["foreign_cpu_seconds"] / calm["load_seconds"]
    assert math.isfinite(busy["foreign_cpu_share"]) and busy["foreign_cpu_share"] > 0.2


def test_the_manifest_records_the_serving_cpus_clocks_and_the_runtimes_wait_knobs(quiet):
    # Issue 50's extras, on the real cell's manifest.json (tests/test_evidence_extras.py tests the readers;
    # tests/test_experiment.py's report test, the report's header rows).
    from tuna_lab.machine.cpufreq import NOT_EXPOSED

    _, out = quiet
    _, _, (manifest,) = load_results(str(out))
    freq = manifest["cpu_frequency"]
    assert freq["cpus"] == manifest["client_cpus"]["server_cpus"]
    for reading in (freq["start"], freq["end"]):
        assert set(reading["cpus"]) == {str(c) for c in freq["cpus"]}
        if not any(os.path.isdir(f"/sys/devices/system/cpu/cpu{c}/cpufreq") for c in freq["cpus"]):
            assert reading["note"] == NOT_EXPOSED and all(v["khz"] is None for v in reading["cpus"].values())
    assert manifest["wait_knobs"] == {"OMP_WAIT_POLICY": "default", "GOMP_SPINCOUNT": "default",
                                      "KMP_BLOCKTIME": os.environ.get("KMP_BLOCKTIME", "default"),
                                      "session.intra_op.allow_spinning": "default"}
