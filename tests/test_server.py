"""A real Gunicorn + XGBoost server on this machine, pinned by every policy.

These tests start real processes on 127.0.0.1 and stop them; each asserts
on what the kernel reports in /proc, not on what we asked for.
"""

import json
import os
import signal
import time
import urllib.error
import urllib.request

import psutil
import pytest

from helpers import cli, main
from tuna_lab.live.binding import affinity_of, threads_of
from tuna_lab.placement.policies import POLICIES
from tuna_lab.server.launch import Server, free_port, status
from tuna_lab.server.limits import ServerLimits

N_FEATURES_SMALL = 29


def post(url, body, timeout=60):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + "/predict", data=data, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def running(pid):
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def good_rows(n=4):
    return {"rows": [[float(i + j) / 10 for j in range(N_FEATURES_SMALL)] for i in range(n)]}


def assert_pinned_as_planned(srv):
    """Every worker's main and OpenMP threads sit where the policy says (read from /proc)."""
    pl = srv.placement
    records = srv.worker_records()
    assert sorted(r["slot"] for r in records) == list(range(srv.workers))
    for rec in records:
        pid, slot = rec["pid"], rec["slot"]
        assert affinity_of(pid) == pl.allowed[slot][0], f"main thread of slot {slot}"
        omp = [t for t in rec["threads"] if t["role"] == "openmp"]
        assert len(omp) == srv.threads - 1
        for t in omp:
            assert affinity_of(t["tid"]) == pl.allowed[slot][t["rank"]], f"thread {t['rank']} of slot {slot}"


@pytest.fixture(scope="module", autouse=True)
def _no_process_left_behind():
    before = {c.pid for c in psutil.Process().children()}
    cpus = os.sched_getaffinity(0)
    yield
    time.sleep(0.2)
    left = [c.pid for c in psutil.Process().children() if c.pid not in before and running(c.pid)]
    assert not left, f"processes left running: {left}"
    assert os.sched_getaffinity(0) == cpus  # the caller was never pinned


# On a 2-CPU machine the oversubscribed case is W=4, T=2 (WT/C = 4, like the W=2, T=4):
# XGBoost caps a worker's pool at the CPUs the process may use, so T > C cannot exist.
CPUS = len(os.sched_getaffinity(0))
CONFIGS = [(2, min(2, CPUS)), (4, min(2, CPUS))]


@pytest.mark.parametrize("workers,threads", CONFIGS)
@pytest.mark.parametrize("policy", POLICIES)
def test_every_thread_bound_as_the_policy_says(policy, workers, threads, tmp_path):
    caller_cpus = os.sched_getaffinity(0)
    with Server(workers, threads, model="small", policy=policy, request_log=str(tmp_path / "log")) as srv:
        assert_pinned_as_planned(srv)
        code, out = post(srv.url, good_rows(8))
        assert code == 200 and out["count"] == 8
        assert set(out["stages"]) == {"deserialize", "convert", "dmatrix", "predict", "shap"}
        pids = [srv.master_pid()] + srv.worker_pids()
    assert not any(running(p) for p in pids)
    assert os.sched_getaffinity(0) == caller_cpus
    lines = [json.loads(line) for f in (tmp_path / "log").iterdir() for line in f.read_text().splitlines()]
    assert any(line.get("batch") == 8 for line in lines)


def _cpu_seconds(pid, tid):
    """utime + stime of thread ``tid`` (tick resolution: enough to see that it ran)."""
    thread = next(t for t in psutil.Process(pid).threads() if t.id == tid)
    return thread.user_time + thread.system_time


@pytest.mark.skipif(CPUS < 2, reason="needs 2 CPUs for a 2-thread pool")
@pytest.mark.parametrize("policy", POLICIES)
def test_pinned_pool_threads_still_do_the_work(policy):
    """Pinning the main thread must not make XGBoost single-threaded (libgomp's CPU count)."""
    from tuna_lab.server.models import make_rows

    body = json.dumps({"rows": make_rows("small", 2000).tolist()}).encode()
    with Server(1, 2, model="small", policy=policy) as srv:
        rec = srv.worker_records()[0]
        omp = [t["tid"] for t in rec["threads"] if t["role"] == "openmp"]
        before = {t: _cpu_seconds(rec["pid"], t) for t in omp}
        for _ in range(8):
            assert post(srv.url, body)[0] == 200
        assert all(_cpu_seconds(rec["pid"], t) > before[t] for t in omp), "the OpenMP pool did no work"
        assert_pinned_as_planned(srv)                 # and the binding held through the requests


def test_more_threads_than_cpus_is_refused_with_a_reason():
    from tuna_lab.server.launch import ServerError

    with pytest.raises(ServerError, match="capped"):
        Server(1, CPUS + 1, model="small", policy="cfs")


def test_replacement_worker_is_repinned_to_the_same_slot(tmp_path):
    pidfile = str(tmp_path / "srv.pid")
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    with Server(2, 2, model="small", policy="round-robin", pidfile=pidfile, state_dir=str(state)) as srv:
        first = {r["slot"]: r["pid"] for r in srv.worker_records()}
        victim_slot = 1
        os.kill(first[victim_slot], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            recs = {r["slot"]: r for r in srv.worker_records()}
            new = recs.get(victim_slot)
            if new and new["pid"] != first[victim_slot] and new.get("ready"):
                break
            time.sleep(0.05)
        else:
            pytest.fail("no replacement worker became ready")
        # the replacement took the freed slot and was bound right after its warm-up
        assert new["pin_seconds"] >= 0
        assert_pinned_as_planned(srv)
        info = status(pidfile)
        assert {w["slot"] for w in info["workers"]} == {0, 1}
        code, _ = post(srv.url, good_rows())
        assert code == 200
    # The integration's hooks say the slot went to a replacement once, for the killed worker only:
    # not for the workers the normal stop ended.
    said = [line for line in (state / "gunicorn.log").read_text().splitlines() if "goes to its replacement" in line]
    assert len(said) == 1 and f"worker {first[victim_slot]} exited" in said[0], said


def test_bad_payloads_get_400_or_413_and_the_worker_keeps_serving():
    with Server(1, 2, model="small", policy="tuna-scatter", limits=ServerLimits(max_body_bytes=10_000)) as srv:
        bad = [b"{not json", json.dumps({"nope": 1}).encode(), json.dumps({"rows": [[1, 2]]}).encode(),
               json.dumps({"rows": [["a"] * N_FEATURES_SMALL]}).encode()]
        for body in bad:
            code, out = post(srv.url, body)
            assert code == 400 and out["error"] and "\n" not in out["error"]
        code, _ = post(srv.url, json.dumps(good_rows(200)).encode())
        assert code == 413
        code, out = post(srv.url, good_rows(3))
        assert code == 200 and out["count"] == 3


def test_status_cli_reports_roles_tids_and_cpus(tmp_path):
    pidfile = str(tmp_path / "s.pid")
    with Server(2, 2, model="small", policy="round-robin", pidfile=pidfile):
        p = main("status", "--pidfile", pidfile, "--json")
        assert p.returncode == 0, p.stderr
        info = json.loads(p.stdout)
        roles = sorted(t["role"] for w in info["workers"] for t in w["threads"])
        assert roles.count("main") == 2 and roles.count("openmp") == 2
        for w in info["workers"]:
            for t in w["threads"]:
                if t["role"] in ("main", "openmp"):
                    assert t["cpus"] == t["expected"]
                    assert t["tid"] in threads_of(w["pid"])
    p = main("status", "--pidfile", pidfile)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


def test_serve_detach_status_stop_from_the_cli(tmp_path):
    # serve --detach as a process: the server outlives it; status and stop then run here.
    pidfile = str(tmp_path / "cli.pid")
    p = cli("serve", "-w", "2", "-t", "1", "--model", "small", "--policy", "tuna-scatter",
            "--port", free_port(), "--pidfile", pidfile, "--detach", module="tuna_lab.cli", timeout=180)
    assert p.returncode == 0, p.stderr
    assert "serving http://127.0.0.1:" in p.stdout
    state_dir = json.loads((tmp_path / "cli.pid.tuna.json").read_text())["state_dir"]
    assert os.path.isdir(state_dir)
    try:
        info = json.loads(main("status", "--pidfile", pidfile, "--json").stdout)
        assert len(info["workers"]) == 2 and all(w["ready"] for w in info["workers"])
        mains = [t["cpus"] for w in info["workers"] for t in w["threads"] if t["role"] == "main"]
        assert all(len(c) == 1 for c in mains)
        if CPUS >= 2:
            assert mains[0] != mains[1]            # scatter: main threads apart
        workers = [w["pid"] for w in info["workers"]]
    finally:
        s = main("stop", "--pidfile", pidfile)
    assert s.returncode == 0, s.stderr
    time.sleep(0.2)
    assert not any(running(p) for p in [info["master"]] + workers)
    # Nothing of the detached server is left on disk: its scratch directory, the launcher's notes.
    assert not os.path.exists(state_dir) and not (tmp_path / "cli.pid.tuna.json").exists()


def test_stop_refuses_a_pidfile_that_names_another_process(tmp_path):
    import subprocess

    from tuna_lab.machine.procfs import start_ticks

    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        state = tmp_path / "state"
        state.mkdir()
        pidfile = tmp_path / "other.pid"
        pidfile.write_text(str(sleeper.pid))
        # A forged sidecar: first with another start time, then with the right one but no mark of ours.
        for ticks in (start_ticks(sleeper.pid) - 1, start_ticks(sleeper.pid)):
            (tmp_path / "other.pid.tuna.json").write_text(json.dumps(
                {"master": sleeper.pid, "start_ticks": ticks, "server_id": "0" * 32, "state_dir": str(state),
                 "own_state": True, "workers": 1}))
            for command in ("stop", "status"):
                p = main(command, "--pidfile", pidfile)
                assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
                assert "not the server tuna-lab started" in p.stderr
            time.sleep(0.1)
            assert sleeper.poll() is None and state.is_dir() and (tmp_path / "other.pid.tuna.json").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def _serving(pidfile, timeout=120):
    """``(master, workers)`` of the server of ``pidfile`` once every worker is ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            info = status(str(pidfile))
            if info["workers"] and all(w["ready"] for w in info["workers"]):
                return info["master"], [w["pid"] for w in info["workers"]]
        except Exception:  # not written yet, or half-written
            pass
        time.sleep(0.1)
    raise AssertionError(f"no server for {pidfile} after {timeout} s")


def _gone(pids, timeout=10):
    deadline = time.monotonic() + timeout
    while any(running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(running(p) for p in pids)


@pytest.mark.parametrize("how", ["parent killed", "SIGHUP"])
def test_a_foreground_serve_dies_with_its_parent_and_on_sighup(how, tmp_path):
    import subprocess
    import sys

    pidfile = tmp_path / "fg.pid"
    serve = [sys.executable, "-m", "tuna_lab.cli", "serve", "-w", "1", "-t", "1", "--model", "small",
             "--policy", "cfs", "--port", str(free_port()), "--pidfile", str(pidfile)]
    # The parent: a process that starts serve, says its PID and waits; it is killed outright below.
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               f"p = subprocess.Popen({serve!r}, stdout=subprocess.DEVNULL, "
                               "stderr=subprocess.DEVNULL)\nprint(p.pid, flush=True)\ntime.sleep(300)\n"],
                              stdout=subprocess.PIPE, text=True)
    try:
        cli = int(parent.stdout.readline())
        master, workers = _serving(pidfile)
        if how == "SIGHUP":
            os.kill(cli, signal.SIGHUP)
        else:
            parent.kill()
        assert _gone([cli, master, *workers]), how
        assert not (tmp_path / "fg.pid.tuna.json").exists()       # stopped cleanly, not just killed
    finally:
        parent.kill()
        parent.wait()


def test_serve_rejects_bad_input_with_one_line():
    for args in (["-w", "0", "-t", "1"], ["-w", "1", "-t", "1", "--policy", "nope"],
                 ["-w", "1", "-t", str(CPUS + 1)], ["-w", "1", "-t", "1", "--model", "huge"]):
        p = main("serve", *args)
        assert p.returncode == 2, (args, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1


def test_a_worker_that_failed_to_boot_is_said_with_its_cause_not_only_gunicorns_last_lines(tmp_path):
    s = Server(1, 1, "small", "cfs")
    s.state_dir = str(tmp_path)
    (tmp_path / "gunicorn.log").write_text(
        "[2026-11-29 03:25:18 +0000] [6214] [ERROR] Exception in worker process\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in post_fork\n'
        "    raise PlanError('refusing the state folder')\n"
        "tuna_lab.errors.PlanError: refusing the state folder /tmp/x: not this server's\n"
        "[2026-11-29 03:25:19 +0000] [6213] [ERROR] Worker (pid:6214) exited with code 3.\n"
        "[2026-11-29 03:25:29 +0000] [6213] [ERROR] Shutting down: Master\n"
        "[2026-11-29 03:25:29 +0000] [6213] [ERROR] Reason: Worker failed to boot.\n")
    said = s._tail()
    assert said.startswith("tuna_lab.errors.PlanError: refusing the state folder /tmp/x") and "failed to boot" in said
    (tmp_path / "gunicorn.log").write_text("[x] [1] [INFO] Booting worker\n[x] [1] [INFO] ready\n")
    assert s._tail() == "[x] [1] [INFO] Booting worker | [x] [1] [INFO] ready"
