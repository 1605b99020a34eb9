"""The field tests' toolkit: a framework's server in its own venv, tuna-lab as a user runs it, and /proc's truth.

Every fact the tests assert is read here from ``/proc`` (through the suite's
own readers, :mod:`procfs` and :func:`test_pin.pool_tids`), never through
tuna_lab: which processes map ``libxgboost`` and whose libgomp pool threads
run while requests are served (the real inference workers), which processes
listen on the server's port (its front ends), and every thread's CPU mask.
"""

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from procfs import affinities, cpu_seconds, cpus_of
from test_pin import pool_tids

from tuna_lab.machine import topology_from
from tuna_lab.placement import placement

ROOT = Path(__file__).resolve().parents[2]
APPS = Path(__file__).resolve().parent / "apps"
VENVS = ROOT / ".venv-field"
#: tuna-lab from the project's own venv, as a user runs it beside the framework's.
TUNA_LAB = ROOT / ".venv" / "bin" / "tuna-lab"
CPUS = sorted(os.sched_getaffinity(0))
#: Inference workers and OpenMP threads per worker (the main thread + one libgomp pool thread).
W, T = 2, 2
#: The policies `run` measures.
POLICIES = ("cfs", "round-robin", "tuna-scatter")
FEATURES, ROWS = 32, 100


def tuna_lab(*args, timeout=180):
    """``tuna-lab ARGS`` from the project's venv, run in the temporary folder; the finished process."""
    return subprocess.run([str(TUNA_LAB), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          check=False, cwd=tempfile.gettempdir(), stdin=subprocess.DEVNULL)


def framework_python(name, modules):
    """The interpreter of ``.venv-field/NAME``, or a skip that says why it cannot serve (``make field`` makes it)."""
    failed = VENVS / f"{name}.install-failed"
    if failed.exists():
        pytest.skip(f"{name} could not be installed here: {failed.read_text().strip()}")
    python = VENVS / name / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no {python.relative_to(ROOT)}: `make field` creates it")
    done = subprocess.run([str(python), "-c", f"import {', '.join(modules)}"], capture_output=True, text=True,
                          timeout=120, check=False)
    if done.returncode != 0:
        pytest.skip(f"{name}'s venv cannot import {', '.join(modules)}: {done.stderr.strip().splitlines()[-1]}")
    return python


def train_model(python, path):
    """An XGBoost model trained by the framework's own XGBoost on made-up data (apps/train.py)."""
    subprocess.run([str(python), str(APPS / "train.py"), str(path), str(FEATURES)], check=True, timeout=300)
    return path


def rows(seed=1):
    """One request's rows: ``ROWS`` x ``FEATURES`` numbers in [0, 1), rounded to keep the body small."""
    rng = random.Random(seed)
    return [[round(rng.random(), 4) for _ in range(FEATURES)] for _ in range(ROWS)]


def free_port():
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FieldServer:
    """A framework's server, started in its own session on 127.0.0.1 and stopped as a group.

    Parameters
    ----------
    argv, env, cwd
        How the framework's own command line starts it.
    port
        Its HTTP port (127.0.0.1).
    url
        The inference URL; ``body`` the file POSTed there (JSON).
    log
        Where its output goes (shown when it fails to start).
    """

    def __init__(self, argv, env, cwd, port, url, body, log):
        self.port, self.url, self.body, self.log = port, url, Path(body), Path(log)
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([str(a) for a in argv], cwd=cwd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.master = self.proc.pid

    def post(self, timeout=60):
        """One inference request as JSON; its HTTP status (a refused connection is 0)."""
        req = urllib.request.Request(self.url, data=self.body.read_bytes(), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                resp.read()
                return resp.status
        except urllib.error.HTTPError as err:
            return err.code
        except OSError:
            return 0

    def load(self, n, concurrency=2 * W):
        """``n`` requests, ``concurrency`` at a time; their statuses."""
        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(lambda _: self.post(), range(n)))

    def wait_ready(self, timeout=180):
        """Until it answers 200 and every real worker has started its pool, or fail with its log's end."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self.post(timeout=10) == 200 and len(self.workers_by_proc()) == W:
                return
            time.sleep(0.5)
        tail = self.log.read_text(errors="replace")[-3000:]
        raise AssertionError(f"the server did not come up with {W} serving workers in {timeout} s:\n{tail}")

    def tree(self):
        """The master and every live process under it (zombies left out)."""
        try:
            master = psutil.Process(self.master)
            procs = [master, *master.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        out = []
        for p in procs:
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p.pid)
            except psutil.NoSuchProcess:
                pass
        return out

    def workers_by_proc(self, requests=4 * W):
        """The real inference workers, from /proc alone: they map libxgboost and their libgomp pool threads run
        while ``requests`` requests are served (the master and LitServe's API processes map libxgboost too,
        but never predict, so they have no pool)."""
        candidates = [pid for pid in self.tree() if pid != self.master and _maps(pid, "libxgboost")]
        serving = set()
        for _ in range(5):                  # a worker that a round happened not to feed gets another chance
            before = {pid: _pool_seconds(pid) for pid in candidates}
            self.load(requests)
            serving |= {pid for pid in candidates if _pool_seconds(pid) > before[pid]}
            if len(serving) >= W:
                break
        return sorted(serving)

    def listeners(self):
        """The processes under the master (not it) that hold a socket listening on the server's port."""
        out = []
        for pid in self.tree():
            if pid == self.master:
                continue
            try:
                conns = psutil.Process(pid).net_connections(kind="tcp")
            except psutil.NoSuchProcess:
                continue
            if any(c.status == psutil.CONN_LISTEN and c.laddr.port == self.port for c in conns):
                out.append(pid)
        return sorted(out)

    def masks(self):
        """``{tid: cpus}`` of every thread of every process of the server."""
        return affinities(self.tree())

    def stop(self):
        """SIGTERM to its process group, SIGKILL after 30 s; nothing of it is left running."""
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.master, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
            # The master is gone; its children may linger a moment after it.
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and _group_alive(self.master):
                time.sleep(0.2)
            if not _group_alive(self.master):
                break


def _group_alive(pgid):
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _maps(pid, name):
    try:
        with open(f"/proc/{pid}/maps") as fh:
            return any(name in line for line in fh)
    except OSError:
        return False


def _pool_seconds(pid):
    """CPU seconds run so far by ``pid``'s libgomp pool threads (0 before its first parallel region)."""
    try:
        pool = set(pool_tids(pid))
        return sum(s for tid, s in cpu_seconds(pid).items() if tid in pool)
    except OSError:
        return 0.0


def set_mask(tid, cpus):
    """Set a thread's mask as a user does: ``taskset -p -c LIST TID`` (sched_setaffinity without taskset)."""
    if shutil.which("taskset"):
        subprocess.run(["taskset", "-p", "-c", ",".join(map(str, cpus)), str(tid)], check=True,
                       capture_output=True, timeout=30)
    else:
        os.sched_setaffinity(tid, cpus)
    assert cpus_of(tid) == sorted(cpus)


def report(done):
    """The JSON a successful ``--json`` command printed (the command's stderr when it failed)."""
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr}\n{done.stdout[-2000:]}"
    return json.loads(done.stdout)



# -- the checks, the same for every framework -------------------------------------------------------------


def check_status(server):
    """``status --pid``: the workers are exactly /proc's serving workers, every other process a helper or a front end
    (one that listens on the server's port), each with the reason, and each worker's pool threads are libgomp's."""
    workers = server.workers_by_proc()
    assert len(workers) == W, f"/proc: {workers} map libxgboost and run their pools while serving"
    listeners = server.listeners()
    rep = report(tuna_lab("status", "--pid", server.master, "--json"))
    assert sorted(w["pid"] for w in rep["workers"]) == workers, rep["workers"]
    assert all(w["why"] for w in rep["workers"])
    processes = {p["pid"]: p for p in rep["processes"]}
    assert processes.pop(server.master)["role"] == "master"
    others = sorted(set(server.tree()) - {server.master, *workers})
    assert sorted(processes) == others, "every process that is no worker is listed, and only those"
    for pid, proc in processes.items():
        # A front end answers on the server's port; a Manager forked after the bind holds that socket too, and is
        # a helper all the same.
        assert proc["role"] in ("helper", "front end") and proc["why"], proc
        assert proc["role"] == "helper" or pid in listeners, proc
    for worker in rep["workers"]:
        pools = sorted(t["tid"] for t in worker["threads"] if t["role"] == "pool")
        assert pools == pool_tids(worker["pid"]), worker["threads"]
    text = tuna_lab("status", "--pid", server.master)
    assert text.returncode == 0, text.stderr
    for pid in others:
        assert f" {pid}: " in text.stdout, text.stdout


def _planned(policy):
    """The plan ``policy`` makes for W x T on this machine, as ``pin`` makes it."""
    return placement(policy, W, T, topology_from(None)).plan()


def _expected_pin(before, slot_of, plan):
    """The masks after ``pin``: each worker's main thread on all of its slot's CPUs (XGBoost sizes its pool from
    it), each pool thread on its own CPUs, every other thread as it was."""
    expected = dict(before)
    for pid, slot in slot_of.items():
        pools = pool_tids(pid)
        assert len(pools) == T - 1, f"worker {pid}: libgomp pool threads {pools}"
        expected[pid] = sorted({c for cpus in plan.slots[slot] for c in cpus})
        for rank, tid in enumerate(pools, start=1):
            expected[tid] = sorted(plan.slots[slot][rank])
    return expected


def _same(masks, expected):
    """``masks`` restricted to the threads of ``expected`` (a thread that ended meanwhile is left out)."""
    return {t: c for t, c in masks.items() if t in expected}, {t: c for t, c in expected.items() if t in masks}


def check_pin(server, policy="tuna-scatter"):
    """``pin --pid -t T --policy``: every real pool is where the plan puts it, read from /proc; pools the plan keeps
    apart share no CPU; helpers and front ends are not touched. ``unpin`` then gives every mask back."""
    workers = server.workers_by_proc()
    plan = _planned(policy)
    before = server.masks()
    try:
        rep = report(tuna_lab("pin", "--pid", server.master, "-t", T, "--policy", policy, "--json"))
        slot_of = {w["pid"]: w["slot"] for w in rep["workers"]}
        assert sorted(slot_of) == workers, rep["workers"]
        got, want = _same(server.masks(), _expected_pin(before, slot_of, plan))
        assert got == want, "the workers' main and pool threads are placed as planned, nothing else moves"
        planned_pools = [{c for rank in range(1, T) for c in plan.slots[slot][rank]} for slot in slot_of.values()]
        placed_pools = [{c for tid in pool_tids(pid) for c in cpus_of(tid)} for pid in slot_of]
        if not planned_pools[0] & planned_pools[1]:
            assert not placed_pools[0] & placed_pools[1], f"the pools share a CPU: {placed_pools}"
    finally:
        done = tuna_lab("unpin", "--pid", server.master)
    assert done.returncode == 0, done.stderr
    got, want = _same(server.masks(), before)
    assert got == want, "unpin gives back the masks from before the pin"


def check_unpin(server, policy="tuna-scatter"):
    """``unpin`` restores only what tuna_lab set: a pool thread's mask set by the user before the pin comes back,
    a thread tuna_lab never pinned keeps the user's mask, a mask the user changes after the pin is left (and
    said), and with nothing recorded ``unpin`` changes nothing and says so."""
    workers = server.workers_by_proc()
    first_pool, second_pool = pool_tids(workers[0])[0], pool_tids(workers[1])[0]
    untouched = next(t for t in sorted(os.listdir(f"/proc/{workers[1]}/task"), key=int)
                     if int(t) not in (workers[1], *pool_tids(workers[1])))
    untouched = int(untouched)
    touched = (first_pool, second_pool, untouched)
    try:
        set_mask(first_pool, CPUS[-1:])                     # the user's masks before the pin
        set_mask(untouched, CPUS[:1])
        before = server.masks()
        report(tuna_lab("pin", "--pid", server.master, "-t", T, "--policy", policy, "--json"))
        assert cpus_of(untouched) == CPUS[:1], "pin left a thread it does not place as it was"
        later = CPUS if cpus_of(second_pool) != CPUS else CPUS[:1]
        set_mask(second_pool, later)                        # ... and one the user changes after it
        done = tuna_lab("unpin", "--pid", server.master)
        assert done.returncode == 0, done.stderr
        assert f"thread {second_pool} " in done.stderr, f"unpin does not say it left {second_pool}: {done.stderr}"
        after = server.masks()
        assert after.pop(second_pool) == later
        got, want = _same(after, {t: c for t, c in before.items() if t != second_pool})
        assert got == want, "unpin restores what it set, to the masks from before the pin, and nothing else"
        assert after[first_pool] == CPUS[-1:] and after[untouched] == CPUS[:1]

        snapshot = server.masks()
        done = tuna_lab("unpin", "--pid", server.master)
        # The entry unpin could not give back (the user's mask) is kept in the ledger and said again; nothing moves.
        assert done.returncode == 0 and ("nothing to unpin" in done.stdout or "no mask was changed" in done.stdout), \
            (done.stdout, done.stderr)
        got, want = _same(server.masks(), snapshot)
        assert got == want, "unpin with nothing recorded changes nothing"
    finally:
        for tid in touched:
            try:
                os.sched_setaffinity(tid, CPUS)
            except OSError:
                pass


def check_run(server, user_mask=False, requests=60):
    """``run --pid --url --body``: exit 0, every policy measured in its trial, and every thread's mask afterwards
    exactly as before - with ``user_mask``, a worker's main thread the user put on the last CPU with taskset."""
    # A pin an earlier test failed to undo would make run refuse the server: each run starts as on one never pinned.
    done = tuna_lab("unpin", "--pid", server.master)
    assert done.returncode == 0, done.stderr
    workers = server.workers_by_proc()
    user = workers[0]
    try:
        if user_mask:
            set_mask(user, CPUS[-1:])                       # taskset -p -c LAST WORKER, before the run
        before = server.masks()
        rep = report(tuna_lab("run", "--pid", server.master, "--url", server.url, "--body", server.body,
                              "-t", T, "--policies", ",".join(POLICIES), "--trials", 1, "--requests", requests,
                              "--json", timeout=3600))
        measured = {row["policy"]: row for row in rep["summary"]}
        assert sorted(measured) == sorted(POLICIES), rep["summary"]
        for row in measured.values():
            assert row["trials"] == 1 and row["p50"] and row["p99"] and row["cpu_per_request"], row
        assert rep["failed_trials"] == [], rep["failed_trials"]
        after = server.masks()
        assert after[user] == before[user], "the worker's mask from before the run is given back"
        got, want = _same(after, before)
        changed = {t: (want[t], got[t]) for t in want if got[t] != want[t]}
        assert not changed, f"masks not restored (tid: before, after): {changed}"
    finally:
        os.sched_setaffinity(user, CPUS)


def check_unpin_after_run(server, requests=20):
    """After ``run --pid`` gave every mask back, nothing of its pins is left: ``unpin`` has nothing to undo, says so
    and changes nothing."""
    tuna_lab("unpin", "--pid", server.master)                 # no records of an earlier test's run
    server.workers_by_proc()
    report(tuna_lab("run", "--pid", server.master, "--url", server.url, "--body", server.body, "-t", T,
                    "--policies", "tuna-scatter", "--trials", 1, "--requests", requests, "--json", timeout=3600))
    before = server.masks()
    done = tuna_lab("unpin", "--pid", server.master)
    got, want = _same(server.masks(), before)
    assert got == want, "unpin after a run changes nothing"
    assert done.returncode == 0 and "nothing to unpin" in done.stdout and "warning" not in done.stderr, \
        (done.stdout, done.stderr)


__all__ = [
    "APPS",
    "CPUS",
    "FEATURES",
    "POLICIES",
    "ROOT",
    "TUNA_LAB",
    "VENVS",
    "FieldServer",
    "T",
    "W",
    "check_pin",
    "check_run",
    "check_status",
    "check_unpin",
    "check_unpin_after_run",
    "cpus_of",
    "framework_python",
    "free_port",
    "pool_tids",
    "report",
    "rows",
    "set_mask",
    "train_model",
    "tuna_lab",
]
