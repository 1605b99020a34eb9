"""The ledger (``tuna_lab.live.ledger``): every mask tuna_lab changes on a running system, given back by one rule.

The cases of issues 46 and 48, in the style of tests/test_hostile.py: a TID
reused by an unrelated process is never moved; a malformed entry hides no good
one; SIGHUP during ``pin --watch`` and ``run --pid`` leaves no mask behind; two
pins at once leave the record as the kernel has it. Every mask is read back
from /proc independently of tuna_lab (tests/procfs.py). The server is a few
lines of Python (a master and 2 forked workers on its socket): no model, no
Gunicorn, started once for the module.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuna_lab.live import audit
from tuna_lab.measure.loadgen.server_timing import server_timing_metrics

import helpers
from procfs import cpus_of, tids_of

CPUS = sorted(os.sched_getaffinity(0))
pytestmark = [pytest.mark.server,
              pytest.mark.skipif(len(CPUS) < 2, reason="moving a thread between CPUs needs 2 of them")]

FAKE_SERVER = '''
import http.server, os, signal, socket, sys, threading, time

sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", 0))
sock.listen(64)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        sum(i * i for i in range(20000))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


kids = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        threading.Thread(target=time.sleep, args=(10 ** 6,), daemon=True).start()
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
        server.socket = sock
        server.serve_forever()
        os._exit(0)
    kids.append(pid)
print(sock.getsockname()[1], flush=True)
signal.signal(signal.SIGTERM, lambda *a: ([os.kill(k, signal.SIGKILL) for k in kids], os._exit(0)))
while True:
    time.sleep(1)
'''


@pytest.fixture
def state(tmp_path, monkeypatch):
    """A state folder of this test's own (TMPDIR), for this process and the commands it runs."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr("tempfile.tempdir", str(folder))
    return folder


def cli(*args, timeout=120):
    return helpers.cli(*args, env=dict(os.environ), timeout=timeout)


def sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])


def record_file():
    return Path(audit.isolation_record_path())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    script = tmp_path_factory.mktemp("fake") / "server.py"
    script.write_text(FAKE_SERVER)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        port = int(proc.stdout.readline())
        helpers.wait_until(lambda: len(_workers(proc.pid)) == 2, 30, "the fake server's 2 workers")
        yield proc, port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _workers(master):
    try:
        return sorted(int(p) for p in Path(f"/proc/{master}/task/{master}/children").read_text().split())
    except OSError:
        return []


def all_masks(master):
    return {tid: cpus_of(tid) for pid in [master, *_workers(master)] for tid in tids_of(pid)}


def given_back(before, master):
    """Every thread of the server on its mask from ``before``; one born since (a request's) on every CPU."""
    now = all_masks(master)
    return {t: now[t] for t in now if t in before} == {t: c for t, c in before.items() if t in now} and \
        all(now[t] == CPUS for t in now if t not in before)


def test_a_reused_tid_is_never_moved_by_unpin_isolation(state):
    # A thread of process P is moved, then ends; its TID is taken by an unrelated process Q that sits on the
    # very mask tuna_lab set. The kernel cannot be made to reuse a TID on demand, so the record is given Q's
    # number in place of the ended thread's, as reuse would leave it: P still runs, only the thread differs.
    owner = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                              "t = threading.Thread(target=time.sleep, args=(600,), daemon=True); t.start()\n"
                              "print(t.native_id, flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    other = sleeper()
    try:
        tid = int(owner.stdout.readline())
        move = audit.Move("thread", str(tid), owner.pid, tuple(CPUS), (CPUS[0],), "test move")
        assert audit.apply_isolation([move]) == []
        assert cpus_of(tid) == [CPUS[0]]
        saved = json.loads(record_file().read_text())
        [entry] = [e for e in saved["entries"] if e["kind"] == "thread"]
        assert entry["pid"] == owner.pid and entry["tid_started"] and entry["pid_started"]
        entry["target"] = str(other.pid)                   # the TID, now another process's thread
        record_file().write_text(json.dumps(saved))
        os.sched_setaffinity(other.pid, [CPUS[0]])         # on tuna_lab's mask: only the thread's identity differs
        done = cli("unpin", "--isolate")
        assert cpus_of(other.pid) == [CPUS[0]], done.stderr  # never touched
        assert done.returncode == 0 and "thread ended" in done.stderr, (done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    finally:
        owner.kill()
        other.kill()


def test_a_malformed_entry_hides_no_good_one(state):
    procs = [sleeper(), sleeper()]
    try:
        moves = [audit.Move("thread", str(p.pid), p.pid, tuple(CPUS), (CPUS[-1],), "test move") for p in procs]
        assert audit.apply_isolation(moves) == []
        assert [cpus_of(p.pid) for p in procs] == [[CPUS[-1]]] * 2
        saved = json.loads(record_file().read_text())
        bad = [{"kind": "thread", "target": "12x", "before": "all"}, {"kind": "irq", "target": "5", "before": [],
                                                                     "set": [0]}]
        saved["entries"][1:1] = bad                         # among the good ones
        record_file().write_text(json.dumps(saved))
        done = cli("unpin", "--isolate", "--json")
        # Both good entries given back; the malformed ones said (one line each), kept, and the exit is 1.
        assert [cpus_of(p.pid) for p in procs] == [CPUS] * 2, done.stderr
        assert done.returncode == 1, (done.stdout, done.stderr)
        out = json.loads(done.stdout)
        assert len(out["isolation"]["restored"]) == 2 and len(out["isolation"]["malformed"]) == 2
        assert sum(" is malformed (" in line for line in done.stderr.splitlines()) == 2
        assert "kept in" in done.stderr.splitlines()[-1]
        assert "Traceback" not in done.stderr
        kept = json.loads(record_file().read_text())["entries"]
        assert kept == bad
    finally:
        for p in procs:
            p.kill()


def test_unpin_isolation_and_pid_print_one_json_object(state, server):
    proc, _ = server
    done = cli("unpin", "--isolate", "--pid", proc.pid, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)                           # one document: json.loads refuses two
    assert "isolation" in out and out["master"] == proc.pid


def test_a_planted_state_folder_is_passed_over(state):
    # Another user (or anyone) makes the predictable name first: it is never used, and the record goes to
    # the next private folder (the home folder's cache), where unpin finds it again.
    planted = state / f"tuna_lab-{os.geteuid()}"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)
    p = sleeper()
    try:
        move = audit.Move("thread", str(p.pid), p.pid, tuple(CPUS), (CPUS[0],), "test move")
        assert audit.apply_isolation([move]) == []
        assert not any(planted.iterdir())
        assert str(record_file()).startswith(os.path.expanduser("~"))
        done = cli("unpin", "--isolate")
        assert done.returncode == 0 and cpus_of(p.pid) == CPUS, done.stderr
    finally:
        p.kill()


def test_two_pins_at_once_leave_the_record_as_the_kernel(state, server):
    proc, _ = server
    before = all_masks(proc.pid)
    pins = [subprocess.Popen([sys.executable, "-m", "tuna_lab", "pin", "--pid", str(proc.pid), "-t", "1",
                              "--policy", policy], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for policy in ("round-robin", "tuna-scatter", "round-robin")]
    try:
        assert [p.wait(timeout=120) for p in pins] == [0, 0, 0], [p.stderr.read() for p in pins]
        [path] = (state / f"tuna_lab-{os.geteuid()}").glob(f"pins-{proc.pid}-*.json")
        entries = [e for e in json.loads(path.read_text())["entries"] if e["kind"] == "thread"]
        assert entries
        for e in entries:
            assert cpus_of(int(e["target"])) == e["set"], e          # the record is the kernel's
            assert e["before"] == before[int(e["target"])], e       # "before" is never a mask tuna_lab set
    finally:
        done = cli("unpin", "--pid", proc.pid)
    assert done.returncode == 0, done.stderr
    assert given_back(before, proc.pid)


def _wait_pinned(master, state, timeout=60):
    """The record of ``master``'s pins, once a thread in it is on the mask tuna_lab set."""
    def pinned():
        for path in (state / f"tuna_lab-{os.geteuid()}").glob(f"pins-{master}-*.json"):
            try:
                entries = json.loads(path.read_text())["entries"]
            except (OSError, ValueError):
                continue
            if any(e["kind"] == "thread" and cpus_of(int(e["target"])) == e["set"] != CPUS for e in entries):
                return path
        return None
    return helpers.wait_until(pinned, timeout, f"a pin of server {master}")


def _from_a_terminal():
    """The signals' default actions, as a command started from a shell has them.

    A test run started under ``nohup`` (or another runner that ignores SIGHUP) passes SIG_IGN on to its
    children, and the ledger leaves a signal that is not at its default as the caller set it: SIGHUP would
    then be ignored, as the user who ran ``nohup`` asked, and the test would wait for nothing.
    """
    for name in ("SIGHUP", "SIGUSR1", "SIGTERM", "SIGINT"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)


@pytest.mark.parametrize("sig", ["SIGHUP", "SIGUSR1", "SIGTERM"])
def test_a_signal_during_pin_watch_leaves_no_mask_behind(state, server, sig):
    proc, _ = server
    before = all_masks(proc.pid)
    watch = subprocess.Popen([sys.executable, "-m", "tuna_lab", "pin", "--pid", str(proc.pid), "-t", "1",
                              "--policy", "round-robin", "--watch"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, preexec_fn=_from_a_terminal)
    try:
        _wait_pinned(proc.pid, state)
        watch.send_signal(getattr(signal, sig))
        _, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode not in (0, None) and "gave the masks back" in err and "Traceback" not in err, err
    assert given_back(before, proc.pid)
    assert not list((state / f"tuna_lab-{os.geteuid()}").glob("pins-*.json"))


def test_sighup_during_run_pid_leaves_no_mask_behind(state, server, tmp_path):
    proc, port = server
    before = all_masks(proc.pid)
    run = subprocess.Popen([sys.executable, "-m", "tuna_lab", "run", "--pid", str(proc.pid), "--url",
                            f"http://127.0.0.1:{port}/", "-t", "1", "--policies", "round-robin,tuna-scatter",
                            "--trials", "3", "--requests", "2000", "--out", str(tmp_path / "out")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_from_a_terminal)
    try:
        _wait_pinned(proc.pid, state, timeout=120)
        run.send_signal(signal.SIGHUP)
        _, err = run.communicate(timeout=120)
    finally:
        run.kill()
    assert run.returncode != 0 and "Traceback" not in err, err
    assert given_back(before, proc.pid), err
    assert not list((state / f"tuna_lab-{os.geteuid()}").glob("pins-*.json"))


# -- the hostile cases of issue 46 that live/ owns ------------------------------------------------------

def _one_line_refusal(done, words):
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr, done.stderr


def test_audit_refuses_an_interval_too_short_to_measure(server):
    proc, _ = server
    _one_line_refusal(cli("audit", "--pid", proc.pid, "--interval", "1e-300"), "at least 0.1 s")
    _one_line_refusal(cli("audit", "--pid", proc.pid, "--interval", "0.2", "--isolate", "--apply"),
                      "at least 0.5 s")
    # Over a sound interval the rates are per second of the time measured: an idle server runs no CPU.
    done = cli("audit", "--pid", proc.pid, "--interval", "0.3", "--json")
    snap = json.loads(done.stdout)["snapshot"]
    assert snap["interval"] >= 0.3
    assert all(t["cpu_rate"] is None or t["cpu_rate"] <= len(CPUS) for t in snap["threads"])


def test_a_worker_match_that_backtracks_without_end_is_refused_at_once(server):
    proc, _ = server
    start = time.monotonic()
    done = cli("status", "--pid", proc.pid, "--worker-match", r"^(\S+\s?)*Z$", timeout=30)
    _one_line_refusal(done, "nests a repeat in a repeat")
    assert time.monotonic() - start < 20


def test_run_pid_refuses_a_url_of_another_server_before_any_load(server, tmp_path):
    import socket

    proc, _ = server
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(8)
    other.setblocking(False)
    try:
        port = other.getsockname()[1]
        done = cli("run", "--pid", proc.pid, "--url", f"http://127.0.0.1:{port}/", "-t", "1", "--policies", "cfs",
                   "--trials", "1", "--requests", "20", "--out", tmp_path / "out", timeout=60)
        _one_line_refusal(done, "is not a listening socket of server")
        with pytest.raises(BlockingIOError):
            other.accept()                                  # not one connection reached the other server
    finally:
        other.close()


def test_a_pin_over_a_pin_keeps_the_first_before_and_a_thread_born_under_it_is_given_back(state):
    # Issue 47: a thread born under the first pin inherits its narrowed mask; a second pin must record, as
    # its "before", the process's mask from before the first pin - never the mask tuna_lab set.
    from tuna_lab.live.ledger import Record, record_pins

    child = subprocess.Popen([sys.executable, "-c", "import sys, threading, time\n"
                              "for line in sys.stdin:\n"
                              "    t = threading.Thread(target=time.sleep, args=(600,), daemon=True); t.start()\n"
                              "    print(t.native_id, flush=True)\n"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        pid, ours = child.pid, [CPUS[0]]
        record = Record("pins-test")
        record_pins(record, pid, 0, {pid: (CPUS, ours)})          # the first pin: the main thread
        os.sched_setaffinity(pid, ours)
        child.stdin.write("spawn\n")
        child.stdin.flush()
        born = int(child.stdout.readline())
        assert cpus_of(born) == ours                              # born under tuna_lab's mask
        again = Record.load("pins-test")
        record_pins(again, pid, 0, {born: (ours, [CPUS[-1]])})   # the second pin binds the newcomer too
        os.sched_setaffinity(born, [CPUS[-1]])
        saved = Record.load("pins-test")
        [entry] = [c for c in saved.changes.values() if c.target == str(born)]
        assert list(entry.before) == CPUS, entry                   # the first "before", not tuna_lab's [0]
        given = saved.give_back()
        assert given.ok and not given.left, given
        assert cpus_of(pid) == CPUS and cpus_of(born) == CPUS
        # A thread born since under tuna_lab's mask and never bound is given back too.
        again = Record.load("pins-test")
        record_pins(again, pid, 0, {pid: (CPUS, ours)})
        os.sched_setaffinity(pid, ours)
        child.stdin.write("spawn\n")
        child.stdin.flush()
        late = int(child.stdout.readline())
        given = Record.load("pins-test").give_back()
        assert cpus_of(late) == CPUS and cpus_of(pid) == CPUS, given
        assert Record.load("pins-test").path is None               # nothing kept
    finally:
        child.kill()


# -- the Gunicorn hooks' and the lab server's masks (issue 48: one ledger) -------------------------------------
# A child process plays a worker of this test process (its master): it runs the hooks' own post_fork and
# post_worker_init (or the lab server's pin_worker) on its own real threads, with Gunicorn's real Config;
# the Arbiter and the Worker are small namespaces with the attributes the hooks read. No server is started.

WORKER = '''
import json, logging, os, sys
from types import SimpleNamespace

from gunicorn.config import Config

from tuna_lab.integrations import gunicorn as hooks

def app(environ, start_response):
    sum(i * i for i in range(20000))
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]

cfg = Config()
cfg.set("workers", 1)
log = logging.getLogger("worker")
server = SimpleNamespace(pid=os.getppid(), cfg=cfg, log=log)
worker = SimpleNamespace(pid=os.getpid(), ppid=os.getppid(), log=log, wsgi=app)
hooks.post_fork(server, worker)
if sys.argv[1] == "lab":
    from tuna_lab.server.pinning import pin_worker

    class LabApp:
        def warm_up(self):
            return []

        def mark_ready(self):
            pass

    slot, plan = hooks.worker_slot()
    pin_worker(LabApp(), slot, plan, sys.argv[2])
    timing = None
else:
    hooks.post_worker_init(worker)
    headers = {}
    worker.wsgi({"REQUEST_METHOD": "GET", "PATH_INFO": "/"}, lambda s, h, e=None: headers.update(h))
    timing = headers.get("Server-Timing")
print(json.dumps({"timing": timing}), flush=True)
sys.stdin.readline()
if sys.argv[1] == "exit":
    hooks.worker_exit(server, worker)
print("done", flush=True)
sys.stdin.readline()
'''


def _hooked_worker(tmp_path, mode):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "TUNA_LAB_POLICY": "round-robin", "TUNA_LAB_THREADS": "1"}
    env.pop("OMP_PLACES", None)
    child = subprocess.Popen([sys.executable, str(script), mode, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = child.stdout.readline()
    assert line, child.stderr.read()
    return child, json.loads(line)


def _master():
    """This process as the Gunicorn master the hooks' master-side functions see (a real Config)."""
    import logging
    from types import SimpleNamespace

    from gunicorn.config import Config

    return SimpleNamespace(pid=os.getpid(), cfg=Config(), log=logging.getLogger("master"), LISTENERS=[],
                           WORKERS={}, num_workers=1)


def _hooks_entries(state):
    from tuna_lab.machine.procfs import start_ticks

    path = state / f"tuna_lab-{os.geteuid()}" / f"hooks-{os.getpid()}-{start_ticks(os.getpid())}.json"
    return path, (json.loads(path.read_text())["entries"] if path.exists() else None)


def _gone(child):
    child.kill()
    child.wait(timeout=30)
    from types import SimpleNamespace

    return SimpleNamespace(pid=child.pid)


@pytest.mark.parametrize("mode", ["hooks", "lab"])
def test_the_hooks_and_the_lab_server_record_each_mask_and_a_gone_worker_leaves_the_ledger(state, tmp_path, mode):
    from tuna_lab.integrations import gunicorn as hooks
    from tuna_lab.live.ledger import pin_records

    child, said = _hooked_worker(tmp_path, mode)
    try:
        if mode == "hooks":
            # post_worker_init wrapped the app: its response carries the request's scheduler evidence (issue 50).
            assert {"app", "cpu", "tuna-rq", "tuna-nivcsw", "tuna-cpu-last"} <= set(
                server_timing_metrics(said["timing"])), said
        path, entries = _hooks_entries(state)
        assert entries, f"no record {path}: {child.stderr.read() if child.poll() is not None else ''}"
        [thread] = [e for e in entries if e["kind"] == "thread"]
        [proc] = [e for e in entries if e["kind"] == "process"]
        # The one format: the process and the thread by PID/TID and start times, the mask before and the one set.
        assert thread["target"] == str(child.pid) and thread["pid"] == child.pid and thread["slot"] == 0
        assert thread["pid_started"] and thread["tid_started"] and proc["pid"] == child.pid
        assert thread["before"] == CPUS and cpus_of(child.pid) == thread["set"] != CPUS
        # Apart from pin --pid's record: to pin, unpin and run --pid the hooks' masks are the server's own.
        assert pin_records(os.getpid()) == {"workers": {}, "threads": {}}
        if mode == "lab":
            assert json.loads((tmp_path / "worker-0.json").read_text())["ready"] is True
    finally:
        worker = _gone(child)
    master = _master()
    hooks.child_exit(master, worker)                  # the worker is gone: nothing to give back, its entries go
    assert not path.exists()
    hooks.on_exit(master)
    assert not path.with_suffix(".lock").exists()     # the server stopped: nothing of it is left in the folder


def test_a_worker_exit_gives_its_masks_back_and_on_exit_keeps_a_mask_changed_since(state, tmp_path):
    from tuna_lab.integrations import gunicorn as hooks

    child, _ = _hooked_worker(tmp_path, "exit")
    try:
        path, entries = _hooks_entries(state)
        assert entries and cpus_of(child.pid) != CPUS
        child.stdin.write("exit\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done", child.stderr.read()
        assert cpus_of(child.pid) == CPUS and not path.exists()          # given back by the rule, record gone
    finally:
        child.kill()
        child.wait(timeout=30)
    child, _ = _hooked_worker(tmp_path, "stay")
    try:
        path, entries = _hooks_entries(state)
        [thread] = [e for e in entries if e["kind"] == "thread"]
        theirs = [c for c in CPUS if [c] != thread["set"]][:1]
        os.sched_setaffinity(child.pid, theirs)                          # someone else's mask since
        master = _master()
        hooks.on_exit(master)
        assert cpus_of(child.pid) == theirs                              # never taken back
        _, kept = _hooks_entries(state)
        assert [e["target"] for e in kept if e["kind"] == "thread"] == [str(child.pid)]
    finally:
        worker = _gone(child)
    hooks.child_exit(master, worker)
    assert not path.exists()


def test_still_pinned_is_the_ledgers_same_thread_test_and_run_pid_uses_it():
    # run --pid refuses a server pinned by pin --pid only while a thread of the record is the same thread (its
    # start time) and still on the mask set: a kept entry (mask changed since) or a reused TID does not count.
    from tuna_lab.live.ledger import still_pinned
    from tuna_lab.machine.procfs import start_ticks
    from tuna_lab.measure import attached

    me = os.getpid()
    entry = {"pid": me, "set": cpus_of(me), "before": CPUS, "tid_started": start_ticks(me)}
    assert still_pinned({me: entry})
    assert not still_pinned({me: {**entry, "tid_started": start_ticks(me) + 1}})     # another thread, same TID
    assert not still_pinned({me: {**entry, "set": [c for c in CPUS if [c] != cpus_of(me)][:1]}})
    assert attached._still_pinned is still_pinned                                     # one function, not two
