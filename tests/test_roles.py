"""Workers by role, not by parentage: ``status/pin/unpin/plan --pid`` on servers of three real shapes.

Each server in ``tests/shapes`` is a real process tree on 127.0.0.1 that
predicts with XGBoost (a model trained here) and writes down which of its
processes it started as what (``SHAPE_ROLES``); every check reads the masks
the kernel reports in ``/proc`` (:mod:`procfs`), and the libgomp pool threads
are found independently of the library (:func:`test_pin.pool_tids`).

* **prefork**: Gunicorn (2 workers) whose config starts a multiprocessing
  Manager and a metrics exporter from ``when_ready``;
* **frontend**: a master with a Manager, 1 forked API process on the socket
  and 2 spawned inference workers fed over a queue (LitServe's shape);
* **dispatch**: a master that parses HTTP itself and feeds 2 spawned workers
  over a queue (MLServer's shape).
"""

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tuna_lab._checks import format_cpulist
from tuna_lab.machine import topology_from
from tuna_lab.placement import placement
from tuna_lab.server.launch import free_port

from procfs import affinities, cpus_of
from test_pin import (CPUS, GUNICORN, USERAPP, Server, _gunicorn_quiet, _no_process_left_behind,  # noqa: F401
                      cli, model_file, pool_tids, server_env, shell_with_sleeps, wait_until)

SHAPES = Path(__file__).parent / "shapes"
W, T = 2, 2

# alone: it samples masks while a trial runs (tests/conftest.py)
pytestmark = [pytest.mark.skipif(len(CPUS) < 2, reason="pinning W=2 x T=2 needs 2 CPUs"), pytest.mark.alone]

COMMANDS = {
    "prefork": [GUNICORN, "-c", SHAPES / "prefork_conf.py", "--chdir", SHAPES, "-b", "127.0.0.1:{port}",
                *_gunicorn_quiet(), "prefork_app:application"],
    "frontend": [sys.executable, SHAPES / "frontend_server.py", "{port}"],
    "dispatch": [sys.executable, SHAPES / "dispatch_server.py", "{port}"],
}


class Shape:
    """A running shape server and the roles it wrote down: ``{"worker": [pid], "helper": [...], ...}``."""

    def __init__(self, name, model, workdir):
        self.name = name
        self.roles_file = workdir / f"{name}.roles"
        env = server_env(model, PYTHONPATH=f"{USERAPP}{os.pathsep}{SHAPES}", SHAPE_ROLES=str(self.roles_file),
                         SHAPE_EXPORTER_PORT=str(free_port()))
        self.srv = Server(COMMANDS[name], env, workdir, name)
        self.master = self.srv.master

    def roles(self):
        out = {}
        if self.roles_file.exists():
            for line in self.roles_file.read_text().splitlines():
                role, _, pid = line.rpartition(" ")
                out.setdefault(role, []).append(int(pid))
        return out

    def workers(self):
        return self.roles().get("worker", [])

    def others(self):
        return sorted(pid for role, pids in self.roles().items() if role != "worker" for pid in pids)

    def get(self):
        with urllib.request.urlopen(f"http://127.0.0.1:{self.srv.port}/", timeout=30) as resp:
            return json.loads(resp.read())

    def warm(self):
        """Requests until every worker has its OpenMP pool (the queue-fed shapes warm up by themselves)."""
        deadline = time.monotonic() + 60
        while not all(len(pool_tids(p)) >= T - 1 for p in self.workers()):
            assert time.monotonic() < deadline, f"{self.name}: not every worker started its pool"
            self.get()


@pytest.fixture(scope="module", params=sorted(COMMANDS))
def shape(request, model_file, tmp_path_factory):
    sh = Shape(request.param, model_file, tmp_path_factory.mktemp(request.param))
    try:
        helpers = {"prefork": 2, "frontend": 3, "dispatch": 1}[sh.name]
        wait_until(lambda: sh.srv.proc.poll() is None and len(sh.workers()) == W and len(sh.others()) == helpers,
                   120, f"the {sh.name} server's processes")
        wait_until(lambda: _answers(sh), 60, f"the {sh.name} server to answer")
        sh.warm()
        yield sh
    finally:
        sh.srv.stop()


def _answers(sh):
    try:
        return "mean" in sh.get()
    except OSError:
        return False


def test_status_finds_the_workers_and_says_what_every_other_process_is(shape):
    done = cli("status", "--pid", shape.master, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert sorted(w["pid"] for w in report["workers"]) == sorted(shape.workers())
    assert all(w["why"] for w in report["workers"])
    processes = {p["pid"]: p for p in report["processes"]}
    assert processes.pop(shape.master)["role"] == "master"
    assert sorted(processes) == shape.others()
    for role, pids in shape.roles().items():
        for pid in pids:
            if role != "worker":
                # The API process is a front end; a Manager, a tracker, an exporter are helpers.
                assert processes[pid]["role"] == role and processes[pid]["why"], processes[pid]
    text = cli("status", "--pid", shape.master).stdout
    assert f"  master {shape.master}: " in text
    for pid in shape.others():
        assert f" {pid}: " in text, text


def test_pin_binds_only_the_inference_workers_and_unpin_gives_back_exactly_what_it_changed(shape):
    shape.warm()
    workers = shape.workers()
    tree = [shape.master, *shape.others(), *workers]
    user_before, user_after = pool_tids(workers[0])[0], pool_tids(workers[1])[0]
    os.sched_setaffinity(user_before, CPUS[-1:])             # a mask the user set before the pin
    try:
        before = affinities(tree)
        done = cli("pin", "--pid", shape.master, "-t", T, "--policy", "round-robin", "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        slot_of = {w["pid"]: w["slot"] for w in report["workers"]}
        assert sorted(slot_of) == sorted(workers), report
        plan = placement("round-robin", W, T, topology_from(None)).plan()
        pinned = affinities(tree)
        expected = dict(before)
        for pid, slot in slot_of.items():
            # XGBoost without OMP_PLACES: the main thread on all of its slot's CPUs, the pool on its own.
            expected[pid] = sorted({c for cpus in plan.slots[slot] for c in cpus})
            for rank, tid in enumerate(pool_tids(pid), start=1):
                expected[tid] = list(plan.slots[slot][rank])
        assert {t: c for t, c in pinned.items() if t in before} == expected, "only workers' main+pool threads move"

        os.sched_setaffinity(user_after, CPUS[:1])           # ... and one the user sets after it
        done = cli("unpin", "--pid", shape.master)
        assert done.returncode == 0, done.stderr
        assert f"thread {user_after} is on CPUs {CPUS[0]}" in done.stderr, done.stderr
        after = affinities(tree)
        assert after.pop(user_after) == CPUS[:1]
        want = {t: c for t, c in before.items() if t != user_after}
        assert {t: c for t, c in after.items() if t in want} == want
        assert after[user_before] == CPUS[-1:]

        # The ledger keeps what it could not give back, and says it again; once that thread is on the mask
        # tuna_lab set, it is given back (to its mask from before the pin) and nothing is recorded any more.
        done = cli("unpin", "--pid", shape.master)
        assert done.returncode == 0 and "left as it is" in done.stderr, (done.stdout, done.stderr)
        assert cpus_of(user_after) == CPUS[:1]
        os.sched_setaffinity(user_after, pinned[user_after])
        done = cli("unpin", "--pid", shape.master)
        assert done.returncode == 0 and cpus_of(user_after) == before[user_after], done.stderr
        # Nothing recorded now: unpin changes nothing, and says so.
        os.sched_setaffinity(user_after, CPUS[-1:])
        done = cli("unpin", "--pid", shape.master)
        assert done.returncode == 0 and "nothing to unpin" in done.stdout, (done.stdout, done.stderr)
        assert cpus_of(user_after) == CPUS[-1:]
    finally:
        for tid in (user_before, user_after):
            os.sched_setaffinity(tid, CPUS)


def test_a_plan_for_every_child_is_refused_and_names_the_helpers_left_out(shape):
    children = len(shape.workers()) + len(shape.others())
    done = cli("plan", "-w", children, "-t", T, "--policy", "round-robin", "--format", "taskset", "--pid",
               shape.master)
    assert done.returncode == 2, (done.stdout, done.stderr)
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and f"give -w {W}" in line, line
    for pid in shape.others():
        assert f"{pid} (" in line, line


def test_taskset_export_binds_main_threads_as_pin_does(shape):
    done = cli("plan", "-w", W, "-t", T, "--policy", "round-robin", "--format", "taskset", "--pid", shape.master)
    assert done.returncode == 0, done.stderr
    plan = placement("round-robin", W, T, topology_from(None)).plan()
    for pid in shape.workers():
        slot = next(int(line.split("(slot ")[1].split(")")[0]) for line in done.stdout.splitlines()
                    if line.startswith(f"# worker {pid} "))
        union = format_cpulist(sorted({c for cpus in plan.slots[slot] for c in cpus}))
        # Never one CPU for an XGBoost main thread: it would shrink its pool to one thread.
        assert f"taskset -p -c {union} {pid}" in done.stdout.splitlines(), done.stdout
    assert not any(line.endswith(f" {pid}") for pid in shape.others() for line in done.stdout.splitlines())


def test_the_user_names_the_workers(shape):
    front = shape.others()[0]                             # a helper or front end, taken as a worker on request
    done = cli("status", "--pid", shape.master, "--worker-pids", f"{front},{shape.workers()[0]}", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {w["pid"] for w in report["workers"]} == {front, shape.workers()[0]}
    assert all(w["why"] == "named by --worker-pids" for w in report["workers"])
    assert shape.workers()[1] in {p["pid"] for p in report["processes"]}
    done = cli("status", "--pid", shape.master, "--worker-match", "no such command line")
    assert done.returncode == 2 and "matches the command line of none" in done.stderr, done.stderr


def test_a_shell_with_two_sleeps_is_still_refused(shell_with_sleeps):
    done = cli("status", "--pid", shell_with_sleeps)
    assert done.returncode == 2 and "not a recognised pre-fork server" in done.stderr, done.stderr
    assert "holds no TCP socket and runs no inference runtime" in done.stderr
    done = cli("pin", "--pid", shell_with_sleeps, "-t", 1, "--policy", "round-robin")
    assert done.returncode == 2 and "not a recognised pre-fork server" in done.stderr, done.stderr


def _front_and_pools(shape):
    """``(front masks, pool masks)``: every thread of the master and helpers, and the workers' pool threads.

    The pools are read first: unpin gives the front its masks back before the pools, so a pool read back on
    the front CPU means the front was given back before that read, and a front read after it shows so (read
    the other way round, a front read just before the unpin and a pool read just after it look like an overlap).
    """
    pools = {tid: cpus_of(tid) for pid in shape.workers() for tid in pool_tids(pid)}
    front = affinities([shape.master, *shape.others()])
    return front, pools


@pytest.mark.parametrize("shape", ["dispatch"], indirect=True)
def test_front_cpus_keep_a_parsing_master_apart_in_pin_and_in_run(shape, tmp_path):
    """MLServer's shape: ``pin --front-cpus`` and ``run --pid --front-cpus`` put every thread of the master (it
    parses the requests) and its helper on the front CPU, never a worker's pool thread, and give every mask back."""
    shape.warm()
    front_cpu = CPUS[:1]
    tree = [shape.master, *shape.others(), *shape.workers()]
    before = affinities(tree)

    done = cli("pin", "--pid", shape.master, "-t", T, "--policy", "round-robin", "--front-cpus", front_cpu[0],
               "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {f["pid"] for f in report["front_cpus"]} == {shape.master, *shape.others()}, report
    front, pools = _front_and_pools(shape)
    assert front and all(cpus == front_cpu for cpus in front.values()), front
    assert pools and not any(set(cpus) & set(front_cpu) for cpus in pools.values()), pools
    done = cli("unpin", "--pid", shape.master)
    assert done.returncode == 0, done.stderr
    after = affinities(tree)
    assert {t: c for t, c in after.items() if t in before} == {t: c for t, c in before.items() if t in after}

    # run: sampled from /proc while it runs. pin_server binds the workers before the front and unpin gives the
    # front back first, so a placed pool thread back on the front CPU while the master is there would be a real
    # overlap. (One the first placement did not see yet - its worker idle in the first warm-up - stays on its
    # own mask until the runner's second warm-up places it, before any measured request.)
    url = f"http://127.0.0.1:{shape.srv.port}/"
    argv = [sys.executable, "-m", "tuna_lab", "run", "--pid", str(shape.master), "--url", url, "-t", str(T),
            "--policies", "round-robin", "--front-cpus", str(front_cpu[0]), "--trials", "1", "--requests", "40",
            "--out", str(tmp_path / "out")]
    with open(tmp_path / "run.out", "w") as out, open(tmp_path / "run.err", "w") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, cwd=tmp_path)
    apart, overlaps, placed, seen = 0, [], set(), set()
    try:
        while proc.poll() is None:
            try:
                front, pools = _front_and_pools(shape)
            except (FileNotFoundError, ProcessLookupError, StopIteration):
                continue
            if front.get(shape.master) == front_cpu:
                seen |= set(pools)
                if all(cpus == front_cpu for cpus in front.values()):
                    apart += 1
                overlaps += [(tid, tuple(cpus)) for tid, cpus in pools.items()
                             if tid in placed and set(cpus) & set(front_cpu)]
                placed |= {tid for tid, cpus in pools.items() if not set(cpus) & set(front_cpu)}
            time.sleep(0.02)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stdout, stderr = (tmp_path / "run.out").read_text(), (tmp_path / "run.err").read_text()
    assert proc.returncode == 0, stderr
    assert apart, "the master and its helper were never all on the front CPU during the trial"
    assert seen and placed == seen, f"pool threads never placed off the front CPU: {sorted(seen - placed)}"
    assert not overlaps, f"pool threads back on the front CPU while the master was there: {sorted(set(overlaps))}"
    assert f"front end: the master, helpers and front ends on CPUs {front_cpu[0]} " in stdout, stdout
    assert "front CPU" in stdout, stdout       # the summary's column: their CPU per request
    after = affinities(tree)
    assert {t: c for t, c in after.items() if t in before} == {t: c for t, c in before.items() if t in after}
    # Nothing of the run's pins is left behind.
    done = cli("unpin", "--pid", shape.master)
    assert done.returncode == 0 and "nothing to unpin" in done.stdout, (done.stdout, done.stderr)
