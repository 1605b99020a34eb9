"""A running server's scheduler evidence, sampled (issue 50): the attribution rule, the sampler and its cost.

The rule (:func:`tuna_lab.measure.sampled.attribute`) is checked on synthetic
intervals and requests, in this process; the sampler reads this process's
own threads. The real case - an attached trial whose ``requests.parquet`` has
the sampled columns and whose manifest says the rate - is
``tests/test_targets.py::test_attached_server_is_measured_live_and_ends_with_its_masks``,
on the running server that module starts already (no server of its own here).
"""

import hashlib
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest

from tuna_lab.errors import CpuAccountingError, TargetError
from tuna_lab.machine.procfs import SampledThreads
from tuna_lab.machine.sched import MIGRATIONS_NOTE, thread_sched
from tuna_lab.measure.sampled import (HOOKED, MAX_HZ, NoSampler, SchedSampler, attribute, check_hz,
                                      sampled_words)

from helpers import main as cli


# -- the rule -------------------------------------------------------------------------------------

def test_an_interval_is_split_by_the_time_each_request_was_in_flight_in_it():
    times = [0.0, 1.0, 2.0, 3.0]
    deltas = [[6.0, 1.0], [9.0, 0.0], [5.0, 2.0]]        # the third interval has no request in flight
    starts, ends = [0.0, 0.5, 1.0], [1.0, 2.0, 1.5]
    got = attribute(times, deltas, starts, ends)
    # Interval 1: request 0 throughout, 1 half of it (request-seconds 1.5): 4 and 2. Interval 2: request 1
    # throughout, 2 half (1.5): 6 and 3. Interval 3: nobody, so its 5 go to no one.
    assert got[:, 0].tolist() == pytest.approx([4.0, 2.0 + 6.0, 3.0])
    assert got[:, 1].tolist() == pytest.approx([2 / 3, 1 / 3, 0.0])


def test_what_the_requests_are_given_is_what_the_intervals_they_covered_counted():
    rng = np.random.default_rng(7)
    times = np.sort(np.concatenate([[0.0, 10.0], rng.uniform(0, 10, 998)]))
    deltas = rng.uniform(0, 1e-3, (len(times) - 1, 3))
    starts = rng.uniform(0, 9.9, 400)
    ends = starts + rng.exponential(0.02, 400)
    ends = np.minimum(ends, 10.0)
    got = attribute(times, deltas, starts, ends)
    assert np.isfinite(got).all() and (got >= 0).all()
    covered = np.array([((s < times[1:]) & (e > times[:-1])).any() for s, e in zip(starts, ends)])
    assert covered.all()
    busy = np.zeros(len(times) - 1, dtype=bool)
    for s, e in zip(starts, ends):
        busy |= (s < times[1:]) & (e > times[:-1])
    # Nothing is made up or lost: the requests share exactly what the intervals they were in counted.
    assert got.sum(axis=0) == pytest.approx(deltas[busy].sum(axis=0), rel=1e-9)


def test_a_request_outside_the_sampled_time_gets_nothing_rather_than_a_guess():
    got = attribute([1.0, 2.0], [[5.0]], [0.5, 1.2, np.nan, 1.5], [1.5, 1.8, 1.9, 2.5])
    assert np.isnan(got[[0, 2, 3], 0]).all() and got[1, 0] == pytest.approx(5.0)
    with pytest.raises(CpuAccountingError, match="at least two samples"):
        attribute([1.0], [], [1.0], [1.0])


# -- the sampler on this process's own threads ----------------------------------------------------

def _team(n):
    stop = threading.Event()
    team = [threading.Thread(target=stop.wait, daemon=True) for _ in range(n)]
    for t in team:
        t.start()
    return stop, team


def _asleep(tid, timeout=10.0):
    """Wait until thread ``tid`` of this process reads the same twice, 50 ms apart: blocked, not on its way."""
    deadline = time.monotonic() + timeout
    before = thread_sched(os.getpid(), tid)
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = thread_sched(os.getpid(), tid)
        if (now.cpu_seconds, now.voluntary_switches, now.involuntary_switches) == \
                (before.cpu_seconds, before.voluntary_switches, before.involuntary_switches):
            return
        before = now
    raise AssertionError(f"thread {tid} did not come to rest in {timeout} s")


_WORK = bytes(8 << 20)


def test_the_sampler_fills_the_request_columns_and_says_it_sampled():
    stop, team = _team(2)
    me = threading.get_native_id()
    threads = [{"pid": os.getpid(), "tid": me, "role": "main"},
               *({"pid": os.getpid(), "tid": t.native_id, "role": "openmp"} for t in team)]
    origin = time.monotonic()
    with SchedSampler(threads, hz=200) as sampler:
        sent, done = [], []
        for _ in range(4):                      # four "requests", one after the other, each doing work
            sent.append(time.monotonic() - origin)
            # hashlib lets go of the GIL on a large buffer: the sampler thread samples while the work runs on
            # this thread's CPU (a loop in Python, or sum(), would hold the GIL and keep the sampler from its reads)
            hashlib.sha256(_WORK).digest()
            done.append(time.monotonic() - origin)
    stop.set()
    n = len(sent)
    frame = pd.DataFrame({"status": [200, 200, 200, 500], "sent_at": sent, "scheduled_at": sent,
                          "client_seconds": np.subtract(done, sent), "pid": -1,
                          **{c: np.nan for c in ("rq_wait", "rq_wait_main", "switches_voluntary",
                                                 "switches_involuntary", "request_migrations", "last_cpu",
                                                 "cpu_main", "cpu_openmp")}})
    frame.attrs["clock_origin"] = origin
    out = sampler.fill(frame)
    ok = out["status"].eq(200)
    assert out.loc[ok, ["rq_wait", "rq_wait_main", "cpu_main", "switches_voluntary"]].notna().all().all()
    # The main thread did the work, never sleeping: it ran or waited for a CPU for most of the requests' time
    # (not all: it waits for the GIL while the sampler holds it; and the edge intervals smear: what the thread
    # did just before the first request and after the last is given to them, the only ones in flight).
    spent = out.loc[ok, ["cpu_main", "rq_wait_main"]].to_numpy().sum()
    assert 0.3 < spent / out.loc[ok, "client_seconds"].sum() < 1.5, out
    assert out.loc[~ok].drop(columns=["status", "sent_at", "scheduled_at", "client_seconds", "pid"]).isna().all().all()
    assert (out.loc[ok, "last_cpu"].isin(sorted(os.sched_getaffinity(0)))).all()   # one worker: its main thread's
    assert sampler.note == sampled_words(200.0) == "sampled at 200 Hz"
    assert sampler.columns()["sched_evidence"] == "sampled at 200 Hz" and len(out) == n


def test_the_servers_own_evidence_is_kept_and_the_note_says_hooked():
    me = [{"pid": os.getpid(), "tid": threading.get_native_id(), "role": "main"}]
    origin = time.monotonic()
    notes = set()
    with SchedSampler(me, hz=500, notes=notes) as sampler:
        time.sleep(0.02)
    frame = pd.DataFrame({"status": [200], "sent_at": [0.001], "scheduled_at": [0.001], "client_seconds": [0.01],
                          "pid": [-1], "rq_wait": [0.25], "rq_wait_main": [0.125],
                          **{c: [np.nan] for c in ("switches_voluntary", "switches_involuntary",
                                                   "request_migrations", "last_cpu", "cpu_main", "cpu_openmp")}})
    frame.attrs["clock_origin"] = origin
    out = sampler.fill(frame)
    assert out["rq_wait"].tolist() == [0.25] and out["rq_wait_main"].tolist() == [0.125]
    assert sampler.note == HOOKED
    assert notes == {HOOKED}               # what the target's manifest then says
    # The targets that send theirs get no sampler, and their trial rows no new column.
    assert NoSampler().fill(frame) is frame and NoSampler().columns() == {}


def test_a_workers_counters_go_to_the_requests_it_served_when_the_server_says_which():
    """Two workers: this process works, a child sleeps; each request names its worker (``pid``)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; print('asleep', flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "asleep\n"        # its start-up's own CPU is over
        threads = [{"pid": os.getpid(), "tid": threading.get_native_id(), "role": "main"},
                   {"pid": child.pid, "tid": child.pid, "role": "main"}]
        origin = time.monotonic()
        with SchedSampler(threads, hz=200) as sampler:
            t0 = time.monotonic() - origin
            _ = sum(range(8_000_000))          # ~0.1-0.3 s: many samples, so one sample's edge weighs little
            t1 = time.monotonic() - origin
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    frame = pd.DataFrame({"status": [200, 200], "sent_at": [t0, t0], "scheduled_at": [t0, t0],
                          "client_seconds": [t1 - t0] * 2, "pid": [os.getpid(), child.pid],
                          **{c: np.nan for c in ("rq_wait", "rq_wait_main", "switches_voluntary",
                                                 "switches_involuntary", "request_migrations", "last_cpu",
                                                 "cpu_main", "cpu_openmp")}})
    frame.attrs["clock_origin"] = origin
    out = sampler.fill(frame)
    # Pooled, the two would share this process's work evenly; by worker, the sleeping one's request gets none.
    # (The working thread ran or waited for a CPU for much of the request: not all, on a shared machine, where
    # it also waits for the GIL while a preempted sampler thread holds it.)
    busy = out[["cpu_main", "rq_wait_main"]].sum(axis=1)
    assert busy.iloc[0] > 0.2 * (t1 - t0) and busy.iloc[1] < 0.05 * busy.iloc[0], (busy.tolist(), t1 - t0)
    assert out["last_cpu"].notna().all()


def test_the_samplers_reader_reads_what_the_scheduler_says_and_only_what_is_asked():
    """procfs.SampledThreads against machine.sched's own reading of the same threads (untimed)."""
    idle_stop, (idle,) = _team(1)
    _asleep(idle.native_id)     # a thread just started may still run on its way into wait(): on a busy machine
    ended = threading.Thread(target=lambda: None)
    ended.start()
    ended.join()
    pid, me = os.getpid(), threading.get_native_id()
    asked = [(pid, me, True), (pid, idle.native_id, False), (pid, 2 ** 22 + 1, True)]
    try:
        with SampledThreads(asked, migrations=MIGRATIONS_NOTE is None) as files, \
                SampledThreads(asked[:2], migrations=False) as by_status:
            first = files.read()
            _ = sum(range(300_000))                      # this thread runs; the idle one does not
            mine, still, gone = files.read()
            told = thread_sched(pid, idle.native_id)
            switched = by_status.read()
    finally:
        idle_stop.set()
    assert gone is None and first[2] is None                 # no such thread: no reading, not a made-up one
    run, wait, vol, invol, mig, cpu = mine
    assert run > first[0][0] and wait >= first[0][1] and cpu in os.sched_getaffinity(0)
    # The idle thread: not asked for its last CPU, and the same reading twice (its other files left unread).
    assert np.isnan(still[5]) and still == first[1]
    assert still[:4] == (round(told.cpu_seconds * 1e9), round(told.run_delay_seconds * 1e9),
                         told.voluntary_switches, told.involuntary_switches)
    assert still[4] == (told.migrations if MIGRATIONS_NOTE is None else -1)
    # Without sched's counts the switches come from status, and migrations say they are unknown.
    assert switched[1][2:5] == (told.voluntary_switches, told.involuntary_switches, -1)
    # The last CPU follows the thread when it is moved (a migration, which the reader watches for).
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) > 1:
        mask = os.sched_getaffinity(me)
        try:
            with SampledThreads(asked[:1], migrations=MIGRATIONS_NOTE is None) as files:
                for cpu in (cpus[0], cpus[1], cpus[0]):
                    os.sched_setaffinity(me, {cpu})
                    _ = sum(range(10_000))
                    assert files.read()[0][5] == cpu == thread_sched(pid, me).last_cpu
        finally:
            os.sched_setaffinity(me, mask)
    # A thread that ended reads as gone, and so does everything once closed.
    with SampledThreads([(pid, ended.native_id, False)]) as files:
        assert files.read() == [None]
    # One that ends between two readings: gone from then on, and the others' readings stay theirs.
    ending_stop, (ending,) = _team(1)
    other_stop, (other,) = _team(1)
    with SampledThreads([(pid, ending.native_id, False), (pid, me, True), (pid, other.native_id, False)]) as files:
        before = files.read()
        ending_stop.set()
        ending.join()
        # join() returns when Python's thread has finished, a moment before the kernel's task is gone: wait
        # (briefly) for /proc to say so, as a sampler meets it a sample later (a CI check once read it still there).
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{pid}/task/{ending.native_id}") and time.monotonic() < deadline:
            time.sleep(0.01)
        _ = sum(range(100_000))
        after = files.read()
        told = thread_sched(pid, other.native_id)
    other_stop.set()
    assert before[0] is not None and after[0] is None
    assert after[1][0] > before[1][0] and after[1][5] in os.sched_getaffinity(0)
    assert after[2][0] == round(told.cpu_seconds * 1e9) and np.isnan(after[2][5])
    files2 = SampledThreads(asked[:1])
    assert files2.read()[0] is not None
    files2.close()
    assert files2.read() == [None]


@pytest.mark.parametrize("hz", [0, -5, MAX_HZ * 2, float("nan"), "fast"])
def test_a_bad_rate_is_one_line(hz):
    with pytest.raises(TargetError, match="--sample-hz") as err:
        check_hz(hz)
    assert "\n" not in str(err.value)


def test_sample_hz_without_a_running_server_is_refused_in_one_line():
    r = cli("run", "-w", 1, "-t", 1, "--sample-hz", 50)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "--sample-hz is for a running server (--pid)" in r.stderr
    r = cli("run", "--pid", os.getpid(), "--url", "http://127.0.0.1:1/", "-t", 1, "--sample-hz", 0)
    assert r.returncode == 2 and "--sample-hz" in r.stderr, r.stderr


@pytest.mark.alone
def test_the_sampler_costs_little_cpu_at_100_hz():
    """Its own CPU per second of load, over 8 threads (a 2 x 4 server's workers): docs/anatomy.md says it."""
    stop, team = _team(8)
    threads = [{"pid": os.getpid(), "tid": t.native_id, "role": "openmp"} for t in team]
    try:
        with SchedSampler(threads, hz=100) as sampler:
            time.sleep(2.0)
    finally:
        stop.set()
    per_second = sampler.cpu_seconds / (sampler.times[-1] - sampler.times[0])
    print(f"sampler: {per_second * 1e3:.2f} ms of CPU per second at 100 Hz over 8 threads "
          f"({len(sampler.times)} samples)")
    assert len(sampler.times) >= 150
    # 0.8-1.4% of one CPU on this 2-CPU machine at a load average of 2-5 (idle threads: their schedstat only, the
    # rest is the wake-up; 2.9-3.6% when every file of every thread was read). The bound catches a reading that
    # went back to opening each file per sample (several times the cost), not the machine's load; the cost on a
    # loaded server is `tuna-lab bench sampler`'s (docs/anatomy.md).
    assert per_second < 0.08, per_second
