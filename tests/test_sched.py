"""tuna_lab.machine.sched against real threads and processes: its units, and threads that vanish.

Each counter is checked against what a thread certainly did: a thread that
sleeps gives its core up (voluntary switches) and burns next to no CPU; a
thread that spins is always runnable, so its CPU time plus its run-queue
wait is the wall time; two spinners forced onto one CPU each wait about half
of it. The machine is shared with other work, so bounds leave room for it,
but a value in the wrong unit (ms for s, ticks for ns) fails every one.
"""

import os
import subprocess
import sys
import threading
import time

import pytest

from tuna_lab.machine import sched

# alone: it reads the scheduler's counters of a busy thread (tests/conftest.py)
pytestmark = pytest.mark.alone

SPIN = "while True: pass"


@pytest.fixture
def spinners():
    """Start spinning child processes (each one thread) on the CPUs given; stop them all afterwards."""
    started = []

    def start(*cpus):
        for cpu in cpus:
            p = subprocess.Popen([sys.executable, "-c", SPIN])
            started.append(p)
            os.sched_setaffinity(p.pid, {cpu})
        return started[-len(cpus):]

    yield start
    for p in started:
        p.kill()
        p.wait(timeout=10)


def _delta(before, after, field):
    return getattr(after, field) - getattr(before, field)


def test_a_sleeping_thread_switches_voluntarily_and_burns_no_cpu():
    stop = threading.Event()
    tids = []

    def sleeper():
        tids.append(threading.get_native_id())
        while not stop.wait(0.01):
            pass

    thread = threading.Thread(target=sleeper)
    thread.start()
    try:
        while not tids:
            time.sleep(0.001)
        tid = tids[0]
        assert tid in sched.process_sched(os.getpid())
        before = sched.thread_sched(os.getpid(), tid)
        time.sleep(1.0)
        after = sched.thread_sched(os.getpid(), tid)
    finally:
        stop.set()
        thread.join()
    # About 100 sleeps of 10 ms: each one a voluntary switch; the CPU spent waking is microseconds each.
    assert _delta(before, after, "voluntary_switches") >= 50
    assert 0 <= _delta(before, after, "cpu_seconds") < 0.05
    assert _delta(before, after, "timeslices") >= 50
    assert after.tid == tid and after.comm and after.last_cpu in after.affinity


def test_a_spinning_thread_is_always_running_or_waiting_for_a_core(spinners):
    (p,) = spinners(0)
    time.sleep(0.2)
    before, t0 = sched.thread_sched(p.pid, p.pid), time.monotonic()
    busy0 = sched.cpu_busy_seconds()
    time.sleep(1.5)
    after, wall = sched.thread_sched(p.pid, p.pid), time.monotonic() - t0
    busy1 = sched.cpu_busy_seconds()
    cpu, delay = _delta(before, after, "cpu_seconds"), _delta(before, after, "run_delay_seconds")
    # Always runnable: it runs or it waits on CPU 0's run queue (other work on the machine decides how the
    # wall time splits between the two, not how much they add up to).
    assert cpu + delay == pytest.approx(wall, rel=0.15)
    assert cpu > 0.2 * wall and delay >= 0
    assert after.affinity == frozenset({0}) and after.last_cpu == 0
    assert _delta(before, after, "voluntary_switches") <= 5
    # /proc/stat counts in clock ticks: CPU 0 was busy at least while the spinner ran there.
    assert cpu - 0.05 <= busy1[0] - busy0[0] <= wall + 0.05


def test_two_spinners_on_one_cpu_each_wait_about_half_the_time(spinners):
    pair = spinners(1, 1)
    time.sleep(0.2)
    before, t0 = [sched.thread_sched(p.pid, p.pid) for p in pair], time.monotonic()
    pressure0 = sched.cpu_pressure()
    time.sleep(2.0)
    after, wall = [sched.thread_sched(p.pid, p.pid) for p in pair], time.monotonic() - t0
    pressure1 = sched.cpu_pressure()
    cpus = [_delta(b, a, "cpu_seconds") for b, a in zip(before, after)]
    delays = [_delta(b, a, "run_delay_seconds") for b, a in zip(before, after)]
    # One CPU for two: together they run at most the wall time, and each waits at least a third of it
    # (half when they are alone on the CPU; more when other work shares it).
    assert sum(cpus) <= wall * 1.05
    for cpu, delay in zip(cpus, delays):
        assert delay >= 0.33 * wall
        assert cpu + delay == pytest.approx(wall, rel=0.15)
    # They preempt each other: involuntary switches, not voluntary ones.
    assert all(_delta(b, a, "involuntary_switches") >= 10 for b, a in zip(before, after))
    if pressure0 is not None:
        assert pressure1["some_total_seconds"] > pressure0["some_total_seconds"]


def test_migrations_are_counted_or_their_absence_explained(spinners):
    (p,) = spinners(0)
    time.sleep(0.1)
    before = sched.thread_sched(p.pid, p.pid)
    if sched.MIGRATIONS_NOTE is not None:
        assert before.migrations is None and "migrations" in sched.MIGRATIONS_NOTE
        return
    assert isinstance(before.migrations, int)
    other = 1 if 1 in os.sched_getaffinity(0) else 0
    if other == 0:
        pytest.skip("one CPU: no other CPU to move a thread to")
    os.sched_setaffinity(p.pid, {other})
    time.sleep(0.2)
    after = sched.thread_sched(p.pid, p.pid)
    assert after.last_cpu == other and after.migrations >= before.migrations + 1


def test_a_vanished_thread_or_process_gives_none_not_an_exception():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=30)
    assert sched.thread_sched(p.pid, p.pid) is None
    assert sched.process_sched(p.pid) == {}
    assert sched.cgroup_throttling(p.pid) is None


def test_cgroup_throttling_of_a_child_is_read_from_its_own_cgroup(spinners):
    (p,) = spinners(0)
    mine, its = sched.cgroup_throttling(), sched.cgroup_throttling(p.pid)
    if mine is None:
        pytest.skip("no cpu controller cpu.stat is readable here")
    assert set(its) == {"nr_throttled", "throttled_seconds", "version", "quota_cpus"}
    # The child is in our cgroup: the same counters (no quota here may throttle between the two reads).
    assert its["version"] == mine["version"] and its["quota_cpus"] == mine["quota_cpus"]
    assert its["nr_throttled"] >= 0 and its["throttled_seconds"] >= 0
