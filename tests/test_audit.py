"""``tuna-lab audit`` and ``status`` drift against real Gunicorn servers with planted faults.

The servers, the user's app and the /proc readers are test_pin's; every fault
is planted with the kernel's own tools (``taskset``, ``kill``, a cgroup, an IRQ
affinity) and every check of a mask reads /proc independently of tuna_lab.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tuna_lab.errors import BindingError
from tuna_lab.machine import irqs
from tuna_lab.live import audit

import helpers
from procfs import cpus_of
from test_pin import (CPUS, GUNICORN, USERAPP, W, Server, _gunicorn_quiet, _no_process_left_behind,  # noqa: F401
                      cli, every_worker_has_its_pool, get, plain, pool_tids, ready, request_until,
                      scatter_plan, server_env, wait_until)

# alone: it says no foreign load is there on a clean server (tests/conftest.py)
pytestmark = [pytest.mark.skipif(len(CPUS) < 2, reason="auditing a W=2 server needs 2 CPUs"), pytest.mark.alone]


@pytest.fixture(scope="module")
def model_file(user_model):
    """The user's model for test_pin's server fixtures: the session's (conftest), not trained again here."""
    return user_model


def run_audit(*args, interval=0.5):
    done = cli("audit", *args, "--interval", interval, "--json")
    assert done.returncode in (0, 1), done.stderr
    out = json.loads(done.stdout)
    return done.returncode, [f for f in out["findings"] if f["severity"] == "fault"], out


def kinds(faults):
    return {f["kind"] for f in faults}


@pytest.fixture
def pinned(plain, scatter_plan):
    """The plain server pinned to tuna-scatter by `pin --pid`, unpinned afterwards."""
    request_until(plain, lambda: every_worker_has_its_pool(plain), "every worker to start its OpenMP pool")
    done = cli("pin", "--pid", plain.master, "--plan", scatter_plan)
    assert done.returncode == 0, done.stderr
    yield plain
    cli("unpin", "--pid", plain.master)


def test_a_clean_pinned_server_has_no_findings(pinned, scatter_plan):
    status, faults, out = run_audit("--pid", pinned.master)
    assert status == 0 and faults == [], faults
    tids = {t["tid"] for t in out["snapshot"]["threads"]}
    assert set(pinned.workers()) <= tids and pinned.master in tids
    for t in out["snapshot"]["threads"]:
        assert t["cpus"] == cpus_of(t["tid"])
    status, faults, _ = run_audit("--pid", pinned.master, "--plan", scatter_plan)
    assert status == 0 and faults == [], faults
    done = cli("status", "--pid", pinned.master)
    assert done.returncode == 0 and "no drift" in done.stdout, done.stdout


def test_two_pools_forced_onto_one_cpu_are_an_overlap(pinned):
    pools = [pool_tids(pid)[0] for pid in pinned.workers()]
    before = [cpus_of(t) for t in pools]
    for tid in pools:
        subprocess.run(["taskset", "-p", "-c", str(CPUS[0]), str(tid)], check=True, capture_output=True)
    try:
        status, faults, _ = run_audit("--pid", pinned.master)
        assert status == 1
        [overlap] = [f for f in faults if f["kind"] == "overlap"]
        assert sorted(overlap["evidence"]["workers"]) == sorted(pinned.workers())
        assert overlap["evidence"]["cpus"] == [CPUS[0]]
        assert "drift" in kinds(faults)       # and the moved pool thread is off its planned CPU
        done = cli("status", "--pid", pinned.master, "--json")
        assert any(d["kind"] == "drift" for d in json.loads(done.stdout)["drift"])
    finally:
        for tid, cpus in zip(pools, before):
            os.sched_setaffinity(tid, cpus)


def test_a_worker_replaced_after_the_pin_is_named(pinned):
    old = pinned.workers()
    os.kill(old[0], signal.SIGKILL)
    wait_until(lambda: ready(pinned) and old[0] not in pinned.workers(), 120, "a replacement worker")
    new = [p for p in pinned.workers() if p not in old]
    status, faults, _ = run_audit("--pid", pinned.master)
    assert status == 1
    replaced = [f for f in faults if f["kind"] == "replaced"]
    assert [f["evidence"]["pid"] for f in replaced] == new and replaced[0]["evidence"]["gone"] == [old[0]]
    done = cli("status", "--pid", pinned.master)
    assert f"drift: worker {new[0]} started after the pin" in done.stdout, done.stdout


# -- a server confined to one CPU, with the other free ---------------------------------------------

@pytest.fixture(scope="module")
def confined(model_file, tmp_path_factory):
    """The user's app under Gunicorn (W=2), started on the last CPU only and pinned there (T=1)."""
    srv = Server(["taskset", "-c", str(CPUS[-1]), GUNICORN, "-w", W, "--chdir", USERAPP, "-b", "127.0.0.1:{port}",
                  "-p", "{pidfile}", *_gunicorn_quiet(), "wsgi_app:application"],
                 server_env(model_file, OMP_NUM_THREADS="1"), tmp_path_factory.mktemp("confined"), "confined")
    try:
        wait_until(lambda: ready(srv), 120, "the confined server's workers")
        get(srv.port)
        done = cli("pin", "--pid", srv.master, "-t", 1, "--policy", "round-robin")
        assert done.returncode == 0, done.stderr
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def spinner():
    """A busy process of someone else's, pinned to the serving CPU."""
    proc = subprocess.Popen(["taskset", "-c", str(CPUS[-1]), sys.executable, "-c", "while True: pass"])
    time.sleep(0.3)
    yield proc
    proc.kill()
    proc.wait(10)


def test_a_busy_foreign_process_on_a_serving_cpu_is_named_and_isolate_moves_it_back_exactly(confined, spinner):
    status, faults, out = run_audit("--pid", confined.master)
    assert out["snapshot"]["serving"] == [CPUS[-1]]
    assert status == 1
    [foreign] = [f for f in faults if f["kind"] == "foreign" and f["evidence"]["pid"] == spinner.pid]
    assert foreign["evidence"]["cpus"] == [CPUS[-1]] and foreign["evidence"]["cpu_rate"] > 0.3

    # --isolate prints, changes nothing.
    done = cli("audit", "--pid", confined.master, "--interval", 0.5, "--isolate")
    assert f"taskset -p -c {CPUS[0]} {spinner.pid}" in done.stdout, done.stdout
    assert cpus_of(spinner.pid) == [CPUS[-1]]
    # --apply moves it and records it; unpin --isolate puts back exactly that.
    done = cli("audit", "--pid", confined.master, "--interval", 0.5, "--isolate", "--apply")
    assert done.returncode == 1 and cpus_of(spinner.pid) == [CPUS[0]], (done.stdout, done.stderr)
    record = json.loads(Path(audit.isolation_record_path()).read_text())
    moved = [m for m in record["entries"] if m["kind"] == "thread"]
    assert {m["pid"] for m in moved} >= {spinner.pid}
    done = cli("unpin", "--isolate")
    assert done.returncode == 0, done.stderr
    assert cpus_of(spinner.pid) == [CPUS[-1]]
    assert not Path(audit.isolation_record_path()).exists()


def _movable_irq():
    for irq in irqs.irq_table():
        current = irqs.irq_affinity(irq.name)
        if current is None:
            continue
        try:
            irqs.set_irq_affinity(irq.name, current)
        except BindingError:
            continue
        return irq.name, current
    return None


def _disk_irq(tmp_path):
    """The numbered IRQ that fires most while this process writes and syncs a file (a disk's), or None."""
    before = {i.name: sum(i.counts) for i in irqs.irq_table()}
    with open(tmp_path / "sync", "wb") as fh:
        for _ in range(50):
            fh.write(os.urandom(4096))
            fh.flush()
            os.fsync(fh.fileno())
    grown = sorted(((sum(i.counts) - before.get(i.name, 0), i.name) for i in irqs.irq_table()
                    if i.name.isdigit()), reverse=True)
    return grown[0][1] if grown and grown[0][0] >= 20 else None


def test_an_irq_on_the_serving_cpu_is_named_and_isolation_restores_its_affinity(confined, tmp_path):
    if _movable_irq() is None:
        pytest.skip("no IRQ affinity is writable on this machine (not root, or every IRQ is managed)")
    name = _disk_irq(tmp_path)
    if name is None or irqs.irq_affinity(name) is None:
        pytest.skip("no numbered IRQ fires on file syncs here (no disk interrupts to plant)")
    original = irqs.irq_affinity(name)
    try:
        irqs.set_irq_affinity(name, original)
    except BindingError as exc:
        pytest.skip(f"the IRQ that fires on file syncs cannot be moved here: {exc}")
    stop = threading.Event()

    def sync():
        with open(tmp_path / "load", "wb") as fh:
            while not stop.is_set():
                fh.write(b"x" * 4096)
                fh.flush()
                os.fsync(fh.fileno())

    writer = threading.Thread(target=sync)
    try:
        irqs.set_irq_affinity(name, {CPUS[-1]})
        writer.start()
        status, faults, _ = run_audit("--pid", confined.master, interval=1.0)
        assert status == 1
        assert any(f["kind"] == "irq" and f["evidence"]["name"] == name for f in faults), faults
        done = cli("audit", "--pid", confined.master, "--interval", 1.0, "--isolate", "--apply")
        assert irqs.irq_affinity(name) == frozenset({CPUS[0]}), done.stdout
        assert cli("unpin", "--isolate").returncode == 0
        assert irqs.irq_affinity(name) == frozenset({CPUS[-1]})
    finally:
        stop.set()
        if writer.is_alive():
            writer.join(10)
        irqs.set_irq_affinity(name, original)


CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")


def _make_cgroup():
    """A new cpu cgroup with a quota of 0.05 CPU: (path, procs file, cleanup), or the reason none can be made."""
    for base, quota in ((CGROUP_V2, None), (CGROUP_V1, "cpu.cfs_quota_us")):
        marker = base / ("cpu.max" if quota is None else "cpu.cfs_quota_us")
        if quota is None and not (base / "cgroup.subtree_control").exists():
            continue
        if not marker.exists() and quota is not None:
            continue
        path = base / f"tuna_lab_audit_{os.getpid()}"
        try:
            path.mkdir()
            if quota is None:
                (path / "cpu.max").write_text("5000 100000")
            else:
                (path / "cpu.cfs_period_us").write_text("100000")
                (path / quota).write_text("5000")
        except OSError as exc:
            if path.exists():
                path.rmdir()
            reason = f"{base}: {exc.strerror}"
            continue
        return path, None
    return None, locals().get("reason", "no cgroup v2 with the cpu controller nor a cgroup v1 cpu hierarchy")


def test_a_cgroup_quota_that_throttles_the_server_is_named(confined):
    path, reason = _make_cgroup()
    if path is None:
        pytest.skip(f"cannot make a cpu cgroup here: {reason}")
    pids = [confined.master, *confined.workers()]
    home = {pid: Path(f"/proc/{pid}/cgroup").read_text() for pid in pids}
    stop = threading.Event()

    def load():
        while not stop.is_set():
            try:
                get(confined.port, timeout=30)
            except OSError:
                time.sleep(0.05)

    senders = [threading.Thread(target=load) for _ in range(2)]
    root = path.parent
    try:
        for pid in pids:
            (path / "cgroup.procs").write_text(str(pid))
        for s in senders:
            s.start()
        status, faults, _ = run_audit("--pid", confined.master, interval=1.5)
        assert status == 1
        [throttled] = [f for f in faults if f["kind"] == "throttled"]
        assert throttled["evidence"]["nr_throttled"] > 0 and throttled["evidence"]["quota_cpus"] == pytest.approx(0.05)
    finally:
        stop.set()
        for s in senders:
            if s.is_alive():
                s.join(60)
        for pid in pids:
            try:
                (root / "cgroup.procs").write_text(str(pid))
            except OSError:
                pass
        wait_until(lambda: not (path / "cgroup.procs").read_text().strip(), 10, "the cgroup to empty")
        path.rmdir()
    assert all(Path(f"/proc/{pid}/cgroup").read_text() == home[pid] for pid in pids)


def test_findings_are_pure_and_name_smt_splits_and_offline_or_isolated_cpus():
    plan = {"topology": {"cpus": [0, 1, 2, 3]},
            "slots": [{"slot": 0, "main": [0], "pool": [[1]]}, {"slot": 1, "main": [2], "pool": [[3]]}]}

    def thread(pid, tid, role, cpus, planned):
        return {"pid": pid, "process": "worker", "slot": None, "tid": tid, "comm": "x", "role": role, "rank": None,
                "cpus": cpus, "planned": planned, "recorded": False, "last_cpu": cpus[0], "cpu_rate": 0.0,
                "run_delay_rate": 0.0, "migration_rate": None}

    snap = audit.Snapshot(master=10, interval=1.0, online=[0, 1, 2], isolated=[1], cores=[[0, 1], [2, 3]],
                          plan=plan, plan_source="--plan", serving=[0, 1, 2, 3],
                          threads=[thread(11, 11, "main", [0], [0]), thread(11, 12, "pool", [1], [1]),
                                   thread(13, 13, "main", [2], [2]), thread(13, 14, "pool", [1], [3])])
    found = audit.findings(snap.to_dict())
    assert found == audit.findings(snap)
    by_kind = {f.kind: f for f in found}
    assert by_kind["smt-split"].evidence["workers"] == [13] and by_kind["smt-split"].evidence["core"] == [0, 1]
    assert by_kind["overlap"].evidence["cpus"] == [1]
    assert by_kind["drift"].evidence["tid"] == 14
    assert by_kind["offline"].evidence["cpus"] == [3] and by_kind["isolated"].evidence["cpus"] == [1]


def test_bad_input_is_one_line_and_status_2(tmp_path):
    for args in (["--pid", "999999999"], ["--isolate"], ["--apply", "--pid", "1"], ["--interval", "0"],
                 ["--pid", str(os.getpid()), "--plan", str(tmp_path / "missing.json")]):
        done = cli("audit", *args)
        assert done.returncode == 2 and done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, (args, done)


@pytest.mark.parametrize("plant", ["link", "fifo", "deep"])
def test_a_planted_isolation_record_is_refused_in_one_line(plant, tmp_path):
    # The record lives in this user's state folder (tuna_lab-UID in the temporary folder): a folder planted
    # at that name is passed over (never followed), and a record planted in it is refused, not taken for
    # "nothing recorded" (and never read from a FIFO or parsed without bound).
    folder = tmp_path / f"tuna_lab-{os.geteuid()}"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("XDG_RUNTIME_DIR", None)
    if plant == "link":
        folder.symlink_to("/etc")
    else:
        folder.mkdir(mode=0o700)
        record = folder / "isolation.json"
        if plant == "fifo":
            os.mkfifo(record)
        else:
            record.write_text("[" * 100_000)
    done = helpers.cli("unpin", "--isolate", env=env, timeout=60)
    if plant == "link":
        assert done.returncode == 0 and "nothing to put back" in done.stdout, (done.stdout, done.stderr)
        assert folder.is_symlink() and "Traceback" not in done.stderr
        return
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and "refused" in done.stderr, done.stderr
