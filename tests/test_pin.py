"""Pin a user's own pre-fork inference server: the Gunicorn hooks, ``tuna-lab pin/unpin/status --pid``.

Every server here is a real process tree on 127.0.0.1 running the user's app
of ``tests/userapp`` (which imports nothing from tuna_lab), and every check
reads what the kernel says in ``/proc/<pid>/task/<tid>/status``
(``Cpus_allowed_list``) and ``schedstat``; the CLI runs as a user runs it. The
OpenMP pool threads are found here independently of the library: the
threads whose blocking system call was made from libgomp's code.

Servers are shared within this module where a test leaves them as it found
them (pins undone); each is stopped with its whole process group.
"""

import contextlib
import json
import os
import queue
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from tuna_lab._checks import format_cpulist
from tuna_lab.machine import topology_from
from tuna_lab.machine.procfs import remove_dead_folders
from tuna_lab.placement import placement
from tuna_lab.live.ledger import Record, pins_record
from tuna_lab.placement.plan import Plan
from tuna_lab.server.launch import free_port

from helpers import ProcessGroup, main, wait_until
from procfs import affinities, cpus_of, tids_of

USERAPP = Path(__file__).parent / "userapp"
GUNICORN = Path(sys.executable).with_name("gunicorn")
UVICORN = Path(sys.executable).with_name("uvicorn")
CPUS = sorted(os.sched_getaffinity(0))
W, T = 2, 2

pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="pinning W=2 x T=2 needs 2 CPUs")


# -- reading /proc (independently of tuna_lab) ------------------------------------------------------

def cpu_ns(pid, tid):
    """CPU time a thread has run, in ns (first field of schedstat)."""
    with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
        return int(fh.read().split()[0])


def openmp_loaded(pid):
    with open(f"/proc/{pid}/maps") as fh:
        return "libgomp" in fh.read()


def pool_tids(pid, looks=100):
    """The worker's libgomp pool threads (sorted TIDs): blocked in a system call made from libgomp.

    A thread that is running is looked at again, up to ``looks`` times 20 ms apart: under live traffic a
    pool thread works or spins for each request, and 25 looks (0.5 s) once saw it running every time.
    """
    spans = []
    with open(f"/proc/{pid}/maps") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) == 6 and "libgomp" in parts[5]:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                spans.append((lo, hi))
    pool = []
    for tid in tids_of(pid):
        if tid == pid:
            continue
        for _ in range(looks):
            try:
                with open(f"/proc/{pid}/task/{tid}/syscall") as fh:
                    fields = fh.read().split()
            except FileNotFoundError:
                break
            if fields and fields[0] != "running":
                ip = int(fields[-1], 16)
                if any(lo <= ip < hi for lo, hi in spans):
                    pool.append(tid)
                break
            time.sleep(0.02)
    return pool


# -- running things ---------------------------------------------------------------------------------

def cli(*args, as_nobody=False, timeout=60):
    """``tuna-lab ARGS``: in this process (what a command does is under test here), or ``as_nobody`` as a
    process of that user."""
    if not as_nobody:
        return main(*args, timeout=timeout, cwd=tempfile.gettempdir())
    argv = [sys.executable, "-m", "tuna_lab", *map(str, args)]
    env = dict(os.environ)
    if as_nobody:
        argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        env["HOME"] = tempfile.gettempdir()
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=tempfile.gettempdir(), env=env)


def get(port, timeout=30):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=timeout) as resp:
        assert resp.status == 200
        return json.loads(resp.read())


def request_until(srv, predicate, what, max_requests=300, timeout=40):
    """Send bounded GET requests to ``srv`` until ``predicate()`` holds."""
    deadline = time.monotonic() + timeout
    for _ in range(max_requests):
        if predicate():
            return
        if time.monotonic() > deadline:
            break
        try:
            get(srv.port)
        except OSError as exc:
            raise AssertionError(f"GET :{srv.port} failed ({exc}); the server said:\n{srv.text()[-3000:]}") from None
    assert predicate(), f"{what} after {max_requests} requests / {timeout} s"


def server_env(model_file, **extra):
    """The environment a user's server starts with: no tuna_lab or OpenMP settings unless given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNA_LAB_", "OMP_", "GOMP_"))}
    env.update(USERAPP_MODEL=str(model_file), PYTHONUNBUFFERED="1", **extra)
    return env


def _gunicorn_quiet():
    # Gunicorn 25+ opens a control socket at one fixed path per user: servers started
    # side by side (two test sessions) would fight over it.
    import gunicorn.config

    return ["--no-control-socket"] if hasattr(gunicorn.config, "ControlSocketDisable") else []


# A user's server: a process tree in its own session, stopped as a group (the one class tests/helpers.py keeps).
Server = ProcessGroup


def ready(srv, workers=W):
    """Every worker is up and has imported the app (libgomp is mapped)."""
    pids = srv.workers()
    assert srv.proc.poll() is None, f"server exited: {srv.text()[-2000:]}"
    try:
        return len(pids) == workers and all(openmp_loaded(p) for p in pids) and pids
    except OSError:             # a worker that died meanwhile (its /proc files gone): not ready yet
        return False


def responds(srv):
    try:
        get(srv.port, timeout=5)
        return True
    except OSError:
        return False


def every_worker_has_its_pool(srv):
    return all(len(pool_tids(p)) >= T - 1 for p in srv.workers())


@pytest.fixture(scope="module")
def model_file(user_model):
    """The user's model (XGBoost, nthread=2), trained once for the session (conftest's ``user_model``)."""
    return user_model


@pytest.fixture(scope="module")
def scatter_plan(tmp_path_factory):
    """``tuna-lab plan -w 2 -t 2 --policy tuna-scatter`` on this machine, as a file."""
    done = cli("plan", "-w", W, "-t", T, "--policy", "tuna-scatter")
    assert done.returncode == 0, done.stderr
    path = tmp_path_factory.mktemp("plans") / "scatter.json"
    path.write_text(done.stdout)
    return path


@pytest.fixture(scope="module", autouse=True)
def _no_process_left_behind():
    before = {c.pid for c in psutil.Process().children(recursive=True)}
    state = {p.name for p in Path(tempfile.gettempdir()).glob("tuna_lab-gunicorn-*")}
    yield
    time.sleep(0.2)
    left = [c.pid for c in psutil.Process().children(recursive=True)
            if c.pid not in before and c.status() != psutil.STATUS_ZOMBIE]
    # The hooks' state of the servers these tests ran, and only that: a folder that appeared while they ran and
    # whose master (the PID and start time in its name) is gone. Another session's folders - there before, or
    # of a server still running - are not this module's to delete (the library's own sweep, remove_dead_folders,
    # checks the owner, the mode and the process).
    new = {p.name for p in Path(tempfile.gettempdir()).glob("tuna_lab-gunicorn-*")} - state
    remove_dead_folders(tempfile.gettempdir(), rf"tuna_lab-gunicorn-{os.getuid()}-(\d+)-(\d+)(?:\..*)?",
                        lambda path, m: [(int(m[1]), int(m[2]))] if os.path.basename(path) in new else [])
    assert not left, f"processes left running: {left}"


# -- the Gunicorn hooks in the user's own gunicorn.conf.py ------------------------------------------

_SLOT_LINE = re.compile(r"tuna_lab: worker (\d+) slot (\d+) \(([^)]+)\): (.*)$", re.M)


def hooked_slots(srv):
    """``{pid: slot}`` of the live workers, from the hooks' log lines."""
    live = set(srv.workers())
    return {int(m.group(1)): int(m.group(2)) for m in _SLOT_LINE.finditer(srv.text()) if int(m.group(1)) in live}


@pytest.fixture(scope="module")
def hooked(model_file, tmp_path_factory):
    """The user's app under Gunicorn with the 3-line integration (tuna-scatter, T=2) in its config."""
    srv = Server([GUNICORN, "-c", USERAPP / "gunicorn.conf.py", "--chdir", USERAPP, "-b", "127.0.0.1:{port}",
                  "-p", "{pidfile}", *_gunicorn_quiet(), "wsgi_app:application"],
                 server_env(model_file), tmp_path_factory.mktemp("hooked"), "hooked")
    try:
        wait_until(lambda: ready(srv) and len(hooked_slots(srv)) == W, 120, "both hooked workers to pin themselves")
        assert int(srv.pidfile.read_text()) == srv.master
        yield srv
    finally:
        srv.stop()


def test_hooked_workers_sit_on_their_slots_cpus(hooked, scatter_plan):
    plan = Plan.read(scatter_plan)
    slots = hooked_slots(hooked)
    assert sorted(slots.values()) == list(range(W)), hooked.text()
    for pid, slot in slots.items():
        row = plan.slots[slot]
        # No preload_app: libgomp was not loaded at the fork, so post_fork set OMP_PLACES
        # and the main thread sits on exactly its own CPU.
        assert cpus_of(pid) == list(row[0]), f"main thread of worker {pid} (slot {slot})"
        pool = pool_tids(pid)
        assert len(pool) == T - 1, f"worker {pid}: pool {pool}"
        assert [cpus_of(t) for t in pool] == [list(c) for c in row[1:]], f"pool of worker {pid} (slot {slot})"


@pytest.fixture(scope="module")
def python_nobody_can_read(tmp_path_factory):
    """A Python whose standard library the user nobody can read, with this venv's packages.

    This venv's interpreter may live where only root may look (here, under
    /root). A worker that Gunicorn's ``user=`` drops to nobody keeps the
    master's ``sys.path`` and then cannot import anything new: a real
    deployment with ``user=`` has an interpreter its user can read, and so
    does this test - the system's, with this venv's site-packages added.
    """
    import sysconfig

    if os.geteuid() != 0:
        pytest.skip("dropping a server to another user needs root")
    system = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin:/usr/local/bin")
    if system is None:
        pytest.skip(f"no system python{sys.version_info.major}.{sys.version_info.minor} that nobody can read")
    base = Path(tempfile.mkdtemp(prefix="tuna-lab-test-python-"))
    try:
        base.chmod(0o755)
        subprocess.run([system, "-m", "venv", "--without-pip", base / "venv"], check=True, timeout=60)
        python = base / "venv" / "bin" / "python"
        purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        ours = sysconfig.get_paths()["purelib"]
        Path(purelib, "tuna-lab-test.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
        probe = subprocess.run([python, "-c", "import os; os.setgid(65534); os.setgroups([]); os.setuid(65534); "
                                "import sysconfig, xgboost, gunicorn, tuna_lab.integrations.gunicorn"],
                               capture_output=True, text=True, cwd=base, timeout=120)
        if probe.returncode != 0:
            pytest.skip(f"nobody cannot import the server's packages: {probe.stderr.strip()[-200:]}")
        yield python
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_hooks_under_gunicorns_user_setting_hand_their_state_folder_to_that_user(python_nobody_can_read, model_file,
                                                                                  tmp_path):
    # Gunicorn started as root with user=/group=: post_fork runs as root, post_worker_init as the user.
    # The state folder post_fork makes stays root's (the user must not plant links where root writes);
    # its records subfolder must be the user's, or no worker can record its slot.
    from tuna_lab.live.state import HOOK_RECORDS, hook_dir

    shared = Path(tempfile.mkdtemp(prefix="tuna-lab-test-nobody-"))
    try:
        shared.chmod(0o755)                       # the workers, as nobody, read the app's model from here
        model = shared / "model.json"
        shutil.copy(model_file, model)
        model.chmod(0o644)
        srv = Server([python_nobody_can_read, "-m", "gunicorn", "-c", USERAPP / "gunicorn.conf.py", "--chdir",
                      USERAPP, "-b", "127.0.0.1:{port}", "--user", "65534", "--group", "65534", *_gunicorn_quiet(),
                      "wsgi_app:application"],
                     server_env(model), tmp_path, "as-nobody")
        try:
            wait_until(lambda: ready(srv) and len(hooked_slots(srv)) == W, 120,
                       f"both workers, as nobody, to pin themselves:\n{srv.text()[-2000:]}")
            assert all(psutil.Process(pid).uids().real == 65534 for pid in srv.workers())
            folder = os.lstat(hook_dir(srv.master))
            assert folder.st_uid == 0 and folder.st_mode & 0o777 == 0o711
            records = os.lstat(os.path.join(hook_dir(srv.master), HOOK_RECORDS))
            assert records.st_uid == 65534 and records.st_mode & 0o777 == 0o700
            assert sorted(hooked_slots(srv).values()) == list(range(W))
            assert "Traceback" not in srv.text() and srv.proc.poll() is None
        finally:
            srv.stop()
    finally:
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.parametrize("planted", ["another user's folder", "a symlink to a private folder"])
def test_hooks_refuse_a_state_folder_planted_before_the_server_starts(planted, model_file, tmp_path):
    # The state folder's name is predictable (the master's PID and start time): another local user could
    # create it first, with a plan of their choosing and links to files of the server's user. The master's
    # PID is known before Gunicorn runs: a shell that waits on stdin, then execs it (same PID, same start).
    from tuna_lab.live.state import hook_dir

    victim = tmp_path / "victim"
    victim.write_text("the server user's file\n")
    hostile = placement("round-robin", W, T, topology_from(None)).plan()
    argv = " ".join(map(shlex.quote, map(str, [GUNICORN, "-c", USERAPP / "gunicorn.conf.py", "--chdir", USERAPP,
                                               "-b", f"127.0.0.1:{free_port()}", *_gunicorn_quiet(),
                                               "wsgi_app:application"])))
    log = tmp_path / "planted.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["sh", "-c", f"read _ && exec {argv}"], stdin=subprocess.PIPE, stdout=out,
                                stderr=subprocess.STDOUT, env=server_env(model_file), cwd=tmp_path,
                                start_new_session=True)
    path = Path(hook_dir(proc.pid))
    elsewhere = tmp_path / "elsewhere"
    try:
        if planted == "another user's folder":
            path.mkdir()
            path.chmod(0o777)
            os.chown(path, 65534, 65534)
            target = path
        else:
            elsewhere.mkdir(mode=0o700)            # private and the server user's: only the link is wrong
            path.symlink_to(elsewhere)
            target = elsewhere
        hostile.write(str(target / "plan.json"))
        (target / "slot-0.lock").symlink_to(victim)
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        # Every worker refuses the folder, so the master halts: nothing is served, nothing pinned.
        assert proc.wait(timeout=90) != 0
        text = log.read_text(errors="replace")
        assert "tuna_lab: refusing the state folder" in text, text[-2000:]
        assert "slot" not in "".join(line for line in text.splitlines() if line.startswith("tuna_lab: worker"))
        assert victim.read_text() == "the server user's file\n" and not victim.is_symlink()
        assert os.path.lexists(path)               # not ours: left as found
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if path.is_symlink():
            path.unlink()
        else:
            shutil.rmtree(path, ignore_errors=True)


def test_hooked_pool_threads_still_do_the_work(hooked):
    pools = {pid: pool_tids(pid) for pid in hooked.workers()}
    pinned = affinities(hooked.workers())
    before = {(pid, t): cpu_ns(pid, t) for pid, tids in pools.items() for t in tids}
    request_until(hooked, lambda: all(cpu_ns(pid, t) > ns for (pid, t), ns in before.items()),
                  "every pinned pool thread to run")
    assert affinities(hooked.workers()) == pinned            # nobody (libgomp included) moved a thread


def test_hooked_replacement_of_a_killed_worker_takes_its_slot(hooked, scatter_plan):
    plan = Plan.read(scatter_plan)
    slots = hooked_slots(hooked)
    # The slot whose main thread is not on CPU 0: libgomp's own binding (OMP_PLACES=threads)
    # would put it there, so only the hooks can have put it elsewhere.
    victim = max(slots, key=lambda pid: plan.slots[slots[pid]][0])
    before = (cpus_of(victim), [cpus_of(t) for t in pool_tids(victim)])
    os.kill(victim, signal.SIGKILL)
    new = wait_until(lambda: [p for p in hooked_slots(hooked) if p not in slots], 60, "a pinned replacement")
    assert len(new) == 1
    assert hooked_slots(hooked)[new[0]] == slots[victim]
    assert (cpus_of(new[0]), [cpus_of(t) for t in pool_tids(new[0])]) == before
    assert f"tuna_lab: worker {victim} exited" in hooked.text()


def test_status_by_pid_follows_the_hooks_slots_after_a_replacement(hooked, scatter_plan):
    slots = hooked_slots(hooked)
    # Kill the worker of slot 0: its replacement is then the youngest worker, so start
    # order would give it slot 1; the hooks' own record says slot 0.
    victim = next(pid for pid, slot in slots.items() if slot == 0)
    os.kill(victim, signal.SIGKILL)
    new = wait_until(lambda: [p for p in hooked_slots(hooked) if p not in slots], 60, "a pinned replacement")
    assert hooked_slots(hooked)[new[0]] == 0
    done = cli("status", "--pid", hooked.master, "--plan", scatter_plan, "--json")
    assert done.returncode == 0, done.stderr
    workers = json.loads(done.stdout)["workers"]
    assert {w["pid"]: w["slot"] for w in workers} == hooked_slots(hooked)
    placed = [t for w in workers for t in w["threads"] if t["role"] != "other"]
    assert len(placed) == W * T
    assert all(t["planned"] == t["cpus"] for t in placed), workers


def test_a_non_sync_worker_class_is_refused_at_start(model_file, tmp_path):
    log = tmp_path / "gthread.log"
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen([GUNICORN, "-c", USERAPP / "gunicorn.conf.py", "--chdir", USERAPP,
                                 "--worker-class", "gthread", "-b", f"127.0.0.1:{free_port()}", *_gunicorn_quiet(),
                                 "wsgi_app:application"], cwd=tmp_path, env=server_env(model_file),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for path in Path(tempfile.gettempdir()).glob(f"tuna_lab-gunicorn-{os.getuid()}-{proc.pid}-*"):
            shutil.rmtree(path, ignore_errors=True)
    elapsed = time.monotonic() - start
    text = log.read_text()
    assert rc != 0, text
    assert elapsed < 30, f"Gunicorn took {elapsed:.1f} s to give up"
    ours = [line for line in text.splitlines() if "tuna_lab:" in line]
    assert len(ours) == 1, text
    assert "'gthread'" in ours[0] and "sync" in ours[0]


# -- a plain server (no hooks), pinned from outside -------------------------------------------------

@pytest.fixture(scope="module")
def plain(model_file, tmp_path_factory):
    """The same app under Gunicorn with no hooks and no OpenMP settings."""
    srv = Server([GUNICORN, "-w", W, "--chdir", USERAPP, "-b", "127.0.0.1:{port}", "-p", "{pidfile}",
                  *_gunicorn_quiet(), "wsgi_app:application"],
                 server_env(model_file), tmp_path_factory.mktemp("plain"), "plain")
    try:
        wait_until(lambda: ready(srv), 120, "the plain server's workers")
        yield srv
    finally:
        srv.stop()


def union(plan, slot):
    return sorted({c for cpus in plan.slots[slot] for c in cpus})


def test_more_threads_than_the_pool_has_are_pinned_as_far_as_they_go_with_a_warning(plain):
    request_until(plain, lambda: every_worker_has_its_pool(plain), "every worker to start its OpenMP pool")
    workers = plain.workers()
    plan = placement("round-robin", W, T + 1, topology_from(None)).plan()
    done = cli("pin", "--pid", plain.master, "-t", T + 1, "--policy", "round-robin")
    try:
        assert done.returncode == 0, done.stderr
        warnings = done.stderr.strip().splitlines()
        assert len(warnings) == W, done.stderr
        for slot, (pid, line) in enumerate(zip(workers, warnings)):
            assert line.startswith(f"tuna-lab: warning: worker {pid} (slot {slot}) has {T - 1} pool thread(s)")
            assert [cpus_of(t) for t in pool_tids(pid)] == [list(c) for c in plan.slots[slot][1:T]]
    finally:
        assert cli("unpin", "--pid", plain.master).returncode == 0


def test_pin_then_unpin_a_running_server(plain):
    request_until(plain, lambda: every_worker_has_its_pool(plain), "every worker to start its OpenMP pool")
    workers = plain.workers()
    master_cpus = cpus_of(plain.master)
    plan = placement("round-robin", W, T, topology_from(None)).plan()
    # Masks of the user's own before the pin: unpin gives each thread the mask it had then.
    own_pool, own_main = pool_tids(workers[0])[0], workers[0]
    os.sched_setaffinity(own_pool, master_cpus[-1:])
    os.sched_setaffinity(own_main, master_cpus[:1])

    done = cli("pin", "--pid", plain.master, "-t", T, "--policy", "round-robin")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    for slot, pid in enumerate(workers):
        # Started without OMP_PLACES: the main thread keeps its slot's CPUs so libgomp keeps the pool.
        assert cpus_of(pid) == union(plan, slot)
        pool = pool_tids(pid)
        assert [cpus_of(t) for t in pool] == [list(c) for c in plan.slots[slot][1:]], f"worker {pid}"
        assert f"pool 1  tid {pool[0]}" in done.stdout
    pinned = affinities(workers)

    pools = [(pid, t) for pid in workers for t in pool_tids(pid)]
    before = {k: cpu_ns(*k) for k in pools}
    request_until(plain, lambda: all(cpu_ns(*k) > ns for k, ns in before.items()),
                  "every pinned pool thread to run")
    assert affinities(workers) == pinned

    # The ledger records, per thread tuna_lab bound, the mask it replaced and the one it set.
    saved = Path(Record.load(pins_record(plain.master)).path)
    threads = {e["target"]: e for e in json.loads(saved.read_text())["entries"] if e["kind"] == "thread"}
    assert threads[str(own_pool)]["before"] == master_cpus[-1:] and threads[str(own_main)]["before"] == master_cpus[:1]
    assert all(t["set"] == pinned[int(tid)] for tid, t in threads.items())
    # The user moves a pinned thread after the pin: it is theirs now, unpin leaves it.
    moved = pool_tids(workers[1])[0]
    os.sched_setaffinity(moved, master_cpus[:1])

    done = cli("unpin", "--pid", plain.master)
    assert done.returncode == 0, done.stderr
    assert f"thread {moved} is on CPUs {master_cpus[0]}" in done.stderr and "left as it is" in done.stderr
    after = affinities(workers)
    assert after.pop(own_pool) == master_cpus[-1:] and after.pop(own_main) == master_cpus[:1]
    assert after.pop(moved) == master_cpus[:1]
    assert after and all(cpus == master_cpus for cpus in after.values()), after
    # What could not be given back is kept in the record (only that thread), and said again by a later unpin...
    kept = [e for e in json.loads(saved.read_text())["entries"] if e["kind"] == "thread"]
    assert [int(e["target"]) for e in kept] == [moved]
    # ... which gives it back once the thread is on tuna_lab's mask again; then the record is gone.
    os.sched_setaffinity(moved, kept[0]["set"])
    done = cli("unpin", "--pid", plain.master)
    assert done.returncode == 0 and cpus_of(moved) == kept[0]["before"], done.stderr
    assert not saved.exists()                       # forgotten: a later pin saves the masks of its moment
    for tid in (own_pool, own_main, moved):
        os.sched_setaffinity(tid, master_cpus)

    # Nothing recorded: unpin changes nothing, and says so.
    os.sched_setaffinity(moved, master_cpus[:1])
    done = cli("unpin", "--pid", plain.master)
    assert done.returncode == 0 and "nothing to unpin" in done.stdout, (done.stdout, done.stderr)
    assert cpus_of(moved) == master_cpus[:1]
    os.sched_setaffinity(moved, master_cpus)


def test_status_shows_roles_tids_and_cpus_as_proc_does(plain, scatter_plan):
    done = cli("status", "--pid", plain.master, "--plan", scatter_plan, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [w["pid"] for w in report["workers"]] == plain.workers()
    for w in report["workers"]:
        assert sorted(t["tid"] for t in w["threads"]) == tids_of(w["pid"])
        assert [t["tid"] for t in w["threads"] if t["role"] == "pool"] == pool_tids(w["pid"])
        for t in w["threads"]:
            assert t["cpus"] == cpus_of(t["tid"])
            assert (t["planned"] is None) == (t["role"] == "other")


def test_taskset_lines_name_the_running_servers_threads(plain):
    request_until(plain, lambda: every_worker_has_its_pool(plain), "every worker to start its OpenMP pool")
    plan = placement("round-robin", W, T, topology_from(None)).plan()
    done = cli("plan", "-w", W, "-t", T, "--policy", "round-robin", "--format", "taskset", "--pid", plain.master)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    named = {}
    for line in lines:
        m = re.fullmatch(r"taskset -p -c (\S+) (\d+)", line)
        assert m, line
        named[int(m.group(2))] = m.group(1)
    expected = {}
    for slot, pid in enumerate(plain.workers()):
        # XGBoost without OMP_PLACES: the main thread keeps its slot's CPUs, as `pin` binds it, and says why.
        expected[pid] = format_cpulist(union(plan, slot))
        assert re.search(rf"^# worker {pid} \(slot {slot}\): main thread on all of slot {slot}'s CPUs .*XGBoost",
                         done.stdout, re.M), done.stdout
        for rank, tid in enumerate(pool_tids(pid), start=1):
            expected[tid] = format_cpulist(plan.slots[slot][rank])
            assert Path(f"/proc/{pid}/task/{tid}").exists()
    assert named == expected


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Plan files: round-robin here for W and W+1 workers, another machine's, and not a plan at all."""
    root = tmp_path_factory.mktemp("bad-plans")
    here = topology_from(None)
    placement("round-robin", W, T, here).plan().write(root / "here.json")
    placement("round-robin", W + 1, T, here).plan().write(root / "three.json")
    done = cli("plan", "-w", W, "-t", T, "--policy", "round-robin", "--preset", "xeon-8272cl")
    assert done.returncode == 0, done.stderr
    (root / "xeon.json").write_text(done.stdout)
    assert Plan.read(root / "xeon.json").slots[1] == ((2,), (3,))   # CPUs this machine lacks
    (root / "junk.json").write_text("{not json")
    (root / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    return root


@pytest.fixture(scope="module")
def gone_pid():
    with open("/proc/sys/kernel/pid_max") as fh:
        return int(fh.read())                         # PIDs are below pid_max: never a process


@pytest.fixture
def childless():
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def shell_with_sleeps():
    """A shell with two ``sleep`` children: it has children, but it is no pre-fork server."""
    proc = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60 & wait"], start_new_session=True)
    try:
        wait_until(lambda: len(psutil.Process(proc.pid).children()) == 2, 10, "the shell's two sleeps")
        yield proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


@pytest.fixture(scope="module")
def nobody_can_run_the_cli():
    if os.geteuid() != 0:
        pytest.skip("running the CLI as another user needs root")
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv to run the CLI as the unprivileged user nobody")
    probe = cli("--help", as_nobody=True)
    if probe.returncode != 0:
        pytest.skip(f"user nobody cannot run {sys.executable} with tuna_lab: {probe.stderr.strip()[-200:]}")


BAD_INPUTS = {
    "pin-no-such-pid": (["pin", "--pid", "{gone}", "-t", T, "--policy", "round-robin"], "no process with PID"),
    "unpin-no-such-pid": (["unpin", "--pid", "{gone}"], "no process with PID"),
    "status-no-such-pid": (["status", "--pid", "{gone}"], "no process with PID"),
    "pin-no-children": (["pin", "--pid", "{childless}", "-t", T, "--policy", "round-robin"], "no child processes"),
    "unpin-no-children": (["unpin", "--pid", "{childless}"], "no child processes"),
    "other-machine": (["pin", "--pid", "{master}", "--plan", "{plans}/xeon.json"], "another machine"),
    "other-machine-forced": (["pin", "--pid", "{master}", "--plan", "{plans}/xeon.json", "--force"], "CPUs 2-3"),
    "plan-and-policy": (["pin", "--pid", "{master}", "--plan", "{plans}/here.json", "--policy", "round-robin"],
                        "either --plan or --policy"),
    "plan-and-threads": (["pin", "--pid", "{master}", "--plan", "{plans}/here.json", "-t", T],
                         "either --plan or --policy"),
    "nothing-to-apply": (["pin", "--pid", "{master}"], "say what to apply"),
    "workers-differ": (["pin", "--pid", "{master}", "--plan", "{plans}/three.json"], "make the plan with -w 2"),
    "not-json": (["pin", "--pid", "{master}", "--plan", "{plans}/junk.json"], "is not JSON"),
    "missing-plan": (["pin", "--pid", "{master}", "--plan", "{plans}/missing.json"], "cannot read plan"),
    "bad-policy": (["pin", "--pid", "{master}", "-t", T, "--policy", "nope"], "nope"),
    "plan-dev-zero": (["pin", "--pid", "{master}", "--plan", "/dev/zero"], "not a regular file"),
    "plan-deep": (["pin", "--pid", "{master}", "--plan", "{plans}/deep.json"], "nests deeper than"),
    "pin-pid-1": (["pin", "--pid", "1", "-t", T, "--policy", "round-robin"], "PID 1 is the system's"),
    "pin-not-a-server": (["pin", "--pid", "{shell}", "-t", T, "--policy", "round-robin"],
                         "not a recognised pre-fork server"),
    "unpin-not-a-server": (["unpin", "--pid", "{shell}"], "not a recognised pre-fork server"),
    "taskset-fewer-slots": (["plan", "-w", W - 1, "-t", T, "--policy", "round-robin", "--format", "taskset",
                             "--pid", "{master}"], f"give -w {W}"),
    "taskset-pid-1": (["plan", "-w", W, "-t", T, "--policy", "round-robin", "--format", "taskset", "--pid", "1"],
                      "PID 1 is the system's"),
    "taskset-not-a-server": (["plan", "-w", W, "-t", T, "--policy", "round-robin", "--format", "taskset", "--pid",
                              "{shell}"], "not a recognised pre-fork server"),
    "workers-not-children": (["pin", "--pid", "{master}", "-t", T, "--policy", "round-robin", "--worker-pids", "1"],
                             "is not a live child"),
    "worker-match-none": (["status", "--pid", "{master}", "--worker-match", "no-such-program"], "matches the command"),
    "worker-match-bad": (["pin", "--pid", "{master}", "-t", T, "--policy", "round-robin", "--worker-match", "("],
                         "not a regular expression"),
    "workers-not-pids": (["unpin", "--pid", "{master}", "--worker-pids", "12,x"], "takes PIDs separated by commas"),
    "permission-pin": (["pin", "--pid", "{master}", "-t", T, "--policy", "round-robin"], "permission denied"),
    "permission-unpin": (["unpin", "--pid", "{master}"], "permission denied"),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_is_one_line_status_2_and_pins_nothing(case, plain, plans, gone_pid, request):
    args, message = BAD_INPUTS[case]
    as_nobody = case.startswith("permission")
    if as_nobody:
        request.getfixturevalue("nobody_can_run_the_cli")
    request_until(plain, lambda: every_worker_has_its_pool(plain), "every worker to start its OpenMP pool")
    given = " ".join(map(str, args))
    childless = request.getfixturevalue("childless") if "{childless}" in given else None
    shell = request.getfixturevalue("shell_with_sleeps") if "{shell}" in given else None
    args = [str(a).format(gone=gone_pid, childless=childless, shell=shell, master=plain.master, plans=plans)
            for a in args]
    before = affinities(plain.workers())
    done = cli(*args, as_nobody=as_nobody)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("tuna-lab: error: ") and message in lines[0], lines[0]
    assert done.stdout == ""
    assert affinities(plain.workers()) == before


def test_omp_places_under_omp_proc_bind_false_does_not_pin_the_main_thread_alone(model_file, tmp_path):
    # libgomp ignores OMP_PLACES under OMP_PROC_BIND=false and counts the main thread's CPUs:
    # pinned to one CPU, XGBoost would run one thread and the pool would idle.
    srv = Server([GUNICORN, "-w", W, "--chdir", USERAPP, "-b", "127.0.0.1:{port}", *_gunicorn_quiet(),
                  "wsgi_app:application"], server_env(model_file, OMP_PLACES="threads", OMP_PROC_BIND="false"),
                 tmp_path, "unbound")
    try:
        wait_until(lambda: ready(srv), 120, "the server's workers")
        request_until(srv, lambda: every_worker_has_its_pool(srv), "every worker to start its OpenMP pool")
        plan = placement("round-robin", W, T, topology_from(None)).plan()
        done = cli("pin", "--pid", srv.master, "-t", T, "--policy", "round-robin")
        assert done.returncode == 0, done.stderr
        pools = [(pid, t) for pid in srv.workers() for t in pool_tids(pid)]
        for slot, pid in enumerate(srv.workers()):
            assert cpus_of(pid) == union(plan, slot)
        before = {k: cpu_ns(*k) for k in pools}
        request_until(srv, lambda: all(cpu_ns(*k) > ns for k, ns in before.items()),
                      "every pinned pool thread to run")
    finally:
        srv.stop()


# -- --watch: a replacement worker is pinned to its predecessor's slot ------------------------------

@pytest.fixture(scope="module")
def places_server(model_file, tmp_path_factory):
    """The plain app started by a user who set OMP_PLACES=threads (as OpenMP guides advise)."""
    srv = Server([GUNICORN, "-w", W, "--chdir", USERAPP, "-b", "127.0.0.1:{port}", "-p", "{pidfile}",
                  *_gunicorn_quiet(), "wsgi_app:application"],
                 server_env(model_file, OMP_PLACES="threads"), tmp_path_factory.mktemp("places"), "places")
    try:
        wait_until(lambda: ready(srv), 120, "the OMP_PLACES server's workers")
        request_until(srv, lambda: every_worker_has_its_pool(srv), "every worker to start its OpenMP pool")
        yield srv
    finally:
        srv.stop()


def _read_lines(stream, into):
    for line in stream:
        into.put((time.time(), line))


def test_watch_pins_a_replacement_and_leaves_the_pins_when_stopped(places_server, scatter_plan, tmp_path):
    srv = places_server
    plan = Plan.read(scatter_plan)
    errors = tmp_path / "watch.err"
    with open(errors, "w") as err:                      # a file: warnings can never fill a pipe
        watch = subprocess.Popen([sys.executable, "-m", "tuna_lab", "pin", "--pid", str(srv.master), "--plan",
                                  str(scatter_plan), "--watch", "--json"], stdout=subprocess.PIPE, stderr=err,
                                 text=True, start_new_session=True, cwd=tempfile.gettempdir())
    lines = queue.Queue()
    threading.Thread(target=_read_lines, args=(watch.stdout, lines), daemon=True).start()

    try:
        first = json.loads(lines.get(timeout=30)[1])
        slot_of = {w["pid"]: w["slot"] for w in first["workers"]}
        assert sorted(slot_of) == sorted(srv.workers())
        for pid, slot in slot_of.items():
            # Started with OMP_PLACES (and libgomp loaded): the main thread sits on its own CPU.
            assert cpus_of(pid) == list(plan.slots[slot][0])
            assert [cpus_of(t) for t in pool_tids(pid)] == [list(c) for c in plan.slots[slot][1:]]

        # Slot 1's main thread is not where libgomp's own binding (place 0) would put it.
        victim = next(pid for pid, slot in slot_of.items() if plan.slots[slot][0] != (0,))
        slot = slot_of[victim]
        os.kill(victim, signal.SIGKILL)
        new = wait_until(lambda: [p for p in srv.workers() if p not in slot_of], 30, "a replacement worker")[0]
        born = psutil.Process(new).create_time()
        deadline = time.monotonic() + 15
        while True:
            try:
                seen_at, line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"the watch did not pin replacement {new} within 15 s") from None
            rows = {w["pid"]: w for w in json.loads(line)["workers"]}
            if new in rows:
                break
        assert rows[new]["slot"] == slot
        main = next(t for t in rows[new]["threads"] if t["role"] == "main")
        assert main["cpus"] == main["planned"] and set(main["cpus"]) <= set(union(plan, slot))
        delay = seen_at - born
        assert delay < 5, f"the replacement was pinned {delay:.2f} s after it started"
        print(f"replacement {new} pinned {delay:.2f} s after it started")

        # Once it has loaded the app, its pool exists (pinning it early did not shrink it) and,
        # once the watch has looked again, sits on the slot's CPUs.
        wait_until(lambda: pool_tids(new), 60, f"replacement {new} to start its OpenMP pool")

        def on_its_slot():
            return (cpus_of(new) == list(plan.slots[slot][0])
                    and [cpus_of(t) for t in pool_tids(new)] == [list(c) for c in plan.slots[slot][1:]])

        try:
            request_until(srv, on_its_slot, f"replacement {new} pinned to slot {slot}", timeout=40)
        except AssertionError as exc:
            said = []
            while not lines.empty():
                said.append(lines.get()[1])
            raise AssertionError(f"{exc}\nstatus: {cli('status', '--pid', srv.master).stdout}\n"
                                 f"the watch's last reports: {said[-2:]}") from None
        pinned = affinities(srv.workers())
    finally:
        if watch.poll() is None:
            watch.send_signal(signal.SIGINT)
        try:
            rc = watch.wait(15)
        finally:
            if watch.poll() is None:
                os.killpg(watch.pid, signal.SIGKILL)
                watch.wait(5)
        watch.stdout.close()
    said = errors.read_text()
    assert rc == 0, said
    assert "the pins stay in place" in said
    time.sleep(0.3)
    assert affinities(srv.workers()) == pinned


# -- uvicorn --workers: a master whose workers multiprocessing spawns ---------------------------------

def test_uvicorn_workers_pinned_by_pid_and_unpinned(model_file, tmp_path):
    srv = Server([UVICORN, "--workers", W, "--host", "127.0.0.1", "--port", "{port}", "--app-dir", USERAPP,
                  "--log-level", "warning", "asgi_app:app"], server_env(model_file), tmp_path, "uvicorn")
    try:
        # uvicorn's master binds the socket but a worker listens on it once it has started.
        wait_until(lambda: ready(srv) and responds(srv), 120, "uvicorn's workers to serve")
        request_until(srv, lambda: every_worker_has_its_pool(srv), "every worker to start its OpenMP pool")
        workers = srv.workers()
        children = [c.pid for c in psutil.Process(srv.master).children()]
        helpers = sorted(set(children) - set(workers))      # multiprocessing's resource tracker, if any
        plan = placement("round-robin", W, T, topology_from(None)).plan()

        done = cli("pin", "--pid", srv.master, "-t", T, "--policy", "round-robin", "--json")
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
        report = json.loads(done.stdout)
        assert [w["pid"] for w in report["workers"]] == workers, f"helpers {helpers} taken for workers"
        for slot, pid in enumerate(workers):
            assert cpus_of(pid) == union(plan, slot)
            assert [cpus_of(t) for t in pool_tids(pid)] == [list(c) for c in plan.slots[slot][1:]]
        for pid in helpers:
            assert all(cpus == CPUS for cpus in affinities([pid]).values()), "a helper process was pinned"

        plan.write(tmp_path / "plan.json")                  # a plan of W slots fits W workers
        assert cli("pin", "--pid", srv.master, "--plan", tmp_path / "plan.json").returncode == 0

        done = cli("unpin", "--pid", srv.master)
        assert done.returncode == 0, done.stderr
        assert all(cpus == cpus_of(srv.master) for cpus in affinities(workers).values())
    finally:
        srv.stop()


def test_a_server_confined_to_some_cpus_is_planned_on_those(model_file, tmp_path):
    # The master may use CPU 1 only: the plan is made for that CPU, not for the CPUs this tool may use.
    srv = Server(["taskset", "-c", "1", GUNICORN, "-w", W, "--chdir", USERAPP, "-b", "127.0.0.1:{port}",
                  "-p", "{pidfile}", *_gunicorn_quiet(), "wsgi_app:application"],
                 server_env(model_file), tmp_path, "confined")
    try:
        wait_until(lambda: ready(srv), 120, "the confined server's workers")
        done = cli("pin", "--pid", srv.master, "--policy", "round-robin", "-t", 1, "--dry-run", "--json")
        assert done.returncode == 0, done.stderr
        planned = [t.get("planned") for w in json.loads(done.stdout)["workers"] for t in w["threads"]]
        assert [p for p in planned if p is not None] and all(p == [1] for p in planned if p is not None), planned
        assert all(cpus_of(tid) == [1] for tid in affinities([srv.master, *srv.workers()])), "dry run pinned"
    finally:
        srv.stop()


# -- --url --body: the requests a user gives, sent as `run` sends them --------------------------------

JSON_ONLY_APP = '''\
def application(environ, start_response):
    ok = environ.get("CONTENT_TYPE", "").split(";")[0].strip() == "application/json"
    body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    start_response("200 OK" if ok else "415 Unsupported Media Type", [("Content-Length", str(len(body)))])
    return [body]
'''


def test_status_and_pin_send_a_json_body_as_json(tmp_path):
    # A server that answers 415 to anything but application/json (as the lab server will).
    (tmp_path / "json_only.py").write_text(JSON_ONLY_APP)
    body = tmp_path / "req.json"
    body.write_text('{"rows": [[1, 2]]}')
    srv = Server([GUNICORN, "-w", W, "--chdir", tmp_path, "-b", "127.0.0.1:{port}", *_gunicorn_quiet(),
                  "json_only:application"], dict(os.environ, PYTHONUNBUFFERED="1"), tmp_path, "json-only")
    try:
        wait_until(lambda: len(srv.workers()) == W and responds_at_all(srv), 60, "the JSON-only server")
        url = f"http://127.0.0.1:{srv.port}/"
        done = cli("status", "--pid", srv.master, "--url", url, "--body", body, "--json")
        assert done.returncode == 0, done.stderr
        done = cli("pin", "--pid", srv.master, "-t", 1, "--policy", "round-robin", "--dry-run", "--url", url,
                   "--body", body)
        assert done.returncode == 0, done.stderr
        # A Content-Type the user gives is sent as given: here the server refuses it, in one line.
        done = cli("status", "--pid", srv.master, "--url", url, "--body", body, "--header", "Content-Type: text/csv")
        assert done.returncode == 2 and "answered 415" in done.stderr, done.stderr
    finally:
        srv.stop()


def responds_at_all(srv):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/", timeout=5).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def test_pin_removes_the_state_of_servers_that_are_gone_and_only_ours(plain, gone_pid):
    # `pin --pid` keeps the masks it found in the ledger, pins-<pid>-<start>.json in this user's state folder;
    # the record of a server SIGKILLed since is removed at the next first pin, another file never.
    from tuna_lab.live.state import state_dir

    request_until(plain, lambda: every_worker_has_its_pool(plain), "every worker to start its OpenMP pool")
    assert cli("unpin", "--pid", plain.master).returncode == 0       # no record of this server's left
    folder = Path(state_dir())
    dead, other = folder / f"pins-{gone_pid}-1.json", folder / "notes.json"
    try:
        for path in (dead, other):
            path.write_text("{}")
        done = cli("pin", "--pid", plain.master, "-t", T, "--policy", "round-robin")
        assert done.returncode == 0, done.stderr
        assert not dead.exists() and other.exists()
        assert Path(Record.load(pins_record(plain.master)).path).parent == folder
    finally:
        other.unlink()
        assert cli("unpin", "--pid", plain.master).returncode == 0


# -- --watch keeps the plan true: a replacement pinned within 1 s of its pool, each thing said once ----------

def _watch(srv, *extra, errors):
    """``pin --pid --watch --json`` on ``srv`` in the background: (process, queue of (time, stdout line))."""
    with open(errors, "w") as err:                      # a file: warnings can never fill a pipe
        watch = subprocess.Popen([sys.executable, "-m", "tuna_lab", "pin", "--pid", str(srv.master), *map(str, extra),
                                  "--watch", "--json"], stdout=subprocess.PIPE, stderr=err, text=True,
                                 start_new_session=True, cwd=tempfile.gettempdir())
    lines = queue.Queue()
    threading.Thread(target=_read_lines, args=(watch.stdout, lines), daemon=True).start()
    return watch, lines


def _stop_watch(watch):
    """Stop a watch as its user does, with Ctrl-C: the pins stay (SIGTERM or SIGHUP would give them back)."""
    if watch.poll() is None:
        watch.send_signal(signal.SIGINT)
    try:
        return watch.wait(15)
    finally:
        if watch.poll() is None:
            os.killpg(watch.pid, signal.SIGKILL)
            watch.wait(5)
        watch.stdout.close()


class _Traffic:
    """Requests to ``srv``, one at a time, until stopped: the live traffic a watched server has."""

    def __init__(self, srv):
        self.srv, self.done = srv, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.done.is_set():
            try:
                get(self.srv.port, timeout=10)
            except (OSError, AssertionError, ValueError):
                time.sleep(0.05)                          # a worker killed mid-request: go on

    def stop(self):
        self.done.set()
        self.thread.join(15)


@pytest.fixture
def watched(model_file, tmp_path):
    srv = Server([GUNICORN, "-w", W, "--chdir", USERAPP, "-b", "127.0.0.1:{port}", "-p", "{pidfile}",
                  *_gunicorn_quiet(), "wsgi_app:application"], server_env(model_file), tmp_path, "watched")
    try:
        wait_until(lambda: ready(srv), 120, "the watched server's workers")
        request_until(srv, lambda: every_worker_has_its_pool(srv), "every worker to start its OpenMP pool")
        yield srv
    finally:
        srv.stop()


@pytest.mark.alone          # --watch must react within a second or two (conftest.py)
def test_watch_pins_a_replacement_within_1s_of_its_pool_and_says_each_thing_once(watched, tmp_path):
    srv = watched
    threads = T + 1                                       # more than the pool has: a warning for every worker
    plan = placement("round-robin", W, threads, topology_from(None)).plan()
    errors = tmp_path / "watch.err"
    traffic = _Traffic(srv)
    watch, lines = _watch(srv, "-t", threads, "--policy", "round-robin", errors=errors)
    reports = []
    try:
        reports.append(json.loads(lines.get(timeout=60)[1]))
        slot_of = {w["pid"]: w["slot"] for w in reports[0]["workers"]}
        time.sleep(3)                                     # rounds of the watch under live traffic
        victim, survivor = srv.workers()
        os.kill(victim, signal.SIGKILL)
        new = wait_until(lambda: [p for p in srv.workers() if p not in slot_of], 30, "a replacement worker")[0]
        want = list(plan.slots[slot_of[victim]][1])       # the replacement's pool thread (rank 1)
        # Time, per thread of the replacement, when it first appears and when it first sits on the plan's CPUs.
        appeared, placed = {}, {}
        deadline, settled = time.monotonic() + 60, None
        while time.monotonic() < (settled or deadline):
            now = time.monotonic()
            with contextlib.suppress(FileNotFoundError, StopIteration):
                for tid in tids_of(new):
                    appeared.setdefault(tid, now)
                    if tid != new and tid not in placed and cpus_of(tid) == want:
                        placed[tid] = time.monotonic()
            if placed and settled is None:
                settled = time.monotonic() + 1.5          # then tell the pool from the others, at leisure
            time.sleep(0.01)
        pool = pool_tids(new)
        assert pool, f"replacement {new} started no OpenMP pool within 60 s: {affinities([new])}"
        missing = [t for t in pool if t not in placed]
        assert not missing, f"pool threads {missing} of replacement {new} never pinned to {want}: " \
                            f"{[cpus_of(t) for t in missing]}"
        # The inherited mask is not the plan's: the watch did set it.
        assert cpus_of(new) != want or len(want) > 1
        delay = max(placed[t] - appeared[t] for t in pool)
        print(f"replacement {new}: pool pinned {delay:.2f} s after it appeared")
        assert delay < 1.0, f"replacement {new}'s pool was pinned {delay:.2f} s after it appeared"

        # A mask someone else sets on a pinned thread: reported once, left as it is (no --enforce).
        theirs = pool_tids(survivor)[0]
        os.sched_setaffinity(theirs, CPUS)
        wait_until(lambda: "someone else changed its mask" in errors.read_text(), 10, "the watch to see it")
        time.sleep(2)
        assert cpus_of(theirs) == CPUS
        while not lines.empty():
            reports.append(json.loads(lines.get()[1]))
    finally:
        traffic.stop()
        rc = _stop_watch(watch)
    said = errors.read_text()
    assert rc == 0, said
    warnings = [line for line in said.splitlines() if line.startswith("tuna-lab: warning:")]
    repeated = {w: n for w, n in __import__("collections").Counter(warnings).items() if n > 1}
    assert not repeated, f"warnings said more than once: {repeated}"
    assert sum(f"thread {theirs} is on CPUs" in w for w in warnings) == 1, said
    assert any("left as it is (--enforce puts it back)" in w for w in warnings), said
    # No worker is shown twice as it was: the pin's report once, then only what changed.
    last = {}
    for report in reports:
        for w in report["workers"]:
            assert w != last.get(w["pid"]), f"worker {w['pid']} shown again unchanged"
            last[w["pid"]] = w
    assert len(reports[0]["workers"]) == W and [r for r in reports[1:] if new in {w["pid"] for w in r["workers"]}]


@pytest.mark.alone          # --watch must react within a second or two (conftest.py)
def test_watch_enforce_puts_back_a_mask_someone_else_changed(watched, tmp_path):
    srv = watched
    errors = tmp_path / "watch.err"
    done = cli("pin", "--pid", srv.master, "-t", T, "--policy", "round-robin", "--enforce")
    assert done.returncode == 2 and "give --watch too" in done.stderr, done.stderr
    watch, lines = _watch(srv, "-t", T, "--policy", "round-robin", "--enforce", errors=errors)
    try:
        json.loads(lines.get(timeout=60)[1])
        tid = pool_tids(srv.workers()[0])[0]
        pinned = cpus_of(tid)
        assert pinned != CPUS
        os.sched_setaffinity(tid, CPUS)
        wait_until(lambda: cpus_of(tid) == pinned, 2, "the watch to put the mask back")
        wait_until(lambda: "put back (--enforce)" in errors.read_text(), 5, "the watch to say so")
    finally:
        rc = _stop_watch(watch)
        assert cli("unpin", "--pid", srv.master).returncode == 0
    assert rc == 0, errors.read_text()
    assert sum("put back (--enforce)" in line for line in errors.read_text().splitlines()) == 1
