"""The Gunicorn hooks under ``user = "nobody"``, run as root: nothing root writes can be redirected by nobody.

Gunicorn runs ``post_fork`` as root, before the worker drops to ``user``;
``post_worker_init`` runs as that user. These tests start a real Gunicorn as
root with a tiny WSGI app, ``user = "nobody"`` and the three hooks, then act
as nobody (a separate process with nobody's uid and gid, through ``setpriv``):
plant links to a root-owned 0600 file at every name root may write, kill a
worker of their own, and check that the replacement's hooks left the file
byte for byte as it was. And a state folder nobody creates before the server
starts, at the name they can predict, is refused: the master halts, nothing
is pinned.
"""

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import textwrap
from pathlib import Path

import psutil
import pytest

from helpers import ProcessGroup as Server, wait_until
from test_pin import _gunicorn_quiet, hooked_slots, python_nobody_can_read  # noqa: F401

NOBODY = 65534
W = 2

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="running Gunicorn as root with user=nobody needs root"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="no setpriv to act as the user nobody"),
]

APP = '''\
def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]
'''

CONF = '''\
import os

os.environ["TUNA_LAB_POLICY"] = "round-robin"
os.environ["TUNA_LAB_THREADS"] = "1"
from tuna_lab.integrations.gunicorn import post_fork, post_worker_init, child_exit, on_exit  # noqa: E402,F401

workers = {workers}
user = "nobody"
group = {gid}
'''

# What nobody does: in the state folder and the folder below it, replace names root may write by links
# to the root-owned file, then kill a worker of theirs so that a new post_fork runs as root. First the
# issue's reproduction: plan.json removed (so the replacement writes a new plan) and plan.json.tmp and
# the records linked; then every name root may write or open (the locks too), and the temporary names
# a write would use. Prints what it could plant.
ATTACK = '''\
import contextlib, os, signal, sys
state, victim, worker, every = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "every"
# The issue's round removes plan.json, so that the replacement makes and writes the plan anew.
names = ["plan.json.tmp"] + (["plan.json"] if every else [])
with contextlib.suppress(OSError):
    os.unlink(os.path.join(state, "plan.json"))
for slot in range({workers}):
    names += [f"slot-{{slot}}.json", f"slot-{{slot}}.json.tmp"]
    if every:
        names += [f"slot-{{slot}}.lock"] + [f"slot-{{slot}}.json.{{pid}}.tmp" for pid in range(worker, worker + 200)]
if every:
    names += ["plan.lock", "refused", "server"]
planted = []
for folder in (state, os.path.join(state, "records")):
    for name in names:
        path = os.path.join(folder, name)
        try:
            if os.path.lexists(path):
                os.unlink(path)
            os.symlink(victim, path)
            planted.append(path)
        except OSError:
            pass
print(len(planted), " ".join(sorted(set(os.path.basename(p) for p in planted))[:8]), flush=True)
os.kill(worker, signal.SIGKILL)
'''


def as_nobody(python, code, *args, timeout=30):
    """Run ``code`` with the system Python as the user nobody (uid and gid 65534, no other groups)."""
    argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", str(python), "-c", code,
            *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/",
                          env={"PATH": "/usr/bin:/bin", "HOME": "/"})


@pytest.fixture
def site(tmp_path):
    """A folder nobody can read holding the app and its config; a root-owned 0600 file elsewhere."""
    shared = Path(tempfile.mkdtemp(prefix="tuna-lab-test-root-hooks-"))
    shared.chmod(0o755)
    (shared / "app.py").write_text(APP)
    (shared / "gunicorn.conf.py").write_text(CONF.format(workers=W, gid=NOBODY))
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's own file\n")
    victim.chmod(0o600)
    # nobody cannot reach the file (its folder is root's, 0700); a link names it all the same.
    try:
        yield shared, victim
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def server_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNA_LAB_", "OMP_", "GOMP_"))}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def gunicorn_argv(python, shared, port="{port}"):
    return [python, "-m", "gunicorn", "-c", shared / "gunicorn.conf.py", "--chdir", shared,
            "-b", f"127.0.0.1:{port}", *_gunicorn_quiet(), "app:application"]


def unchanged(victim):
    st = os.lstat(victim)
    return (victim.read_bytes(), st.st_uid, st.st_mode & 0o7777, victim.is_symlink())


def test_nobody_cannot_make_root_write_through_a_link(python_nobody_can_read, site, tmp_path):
    from tuna_lab.live.state import hook_dir

    shared, victim = site
    before = unchanged(victim)
    srv = Server(gunicorn_argv(python_nobody_can_read, shared), server_env(), tmp_path, "root-hooks")
    try:
        wait_until(lambda: len(hooked_slots(srv)) == W, 120, f"both workers to pin themselves:\n{srv.text()[-2000:]}")
        assert all(psutil.Process(pid).uids().real == NOBODY for pid in srv.workers())
        state = hook_dir(srv.master)
        for what in ("issue", "every"):
            workers = srv.workers()
            done = as_nobody(python_nobody_can_read, ATTACK.format(workers=W), state, victim, workers[0], what)
            assert done.returncode == 0, done.stderr
            print(f"nobody planted ({what}):", done.stdout.strip())
            new = wait_until(lambda: [p for p in hooked_slots(srv) if p not in workers], 60,
                             f"a replacement worker to pin itself:\n{srv.text()[-2000:]}")
            assert len(new) == 1 and srv.proc.poll() is None
            # The replacement's post_fork (root) and post_worker_init (nobody) have both run.
            assert unchanged(victim) == before, f"root wrote through nobody's link ({what})"
            assert sorted(hooked_slots(srv).values()) == list(range(W))
        # The state folder is root's, and only the records below it are nobody's.
        top, records = os.lstat(state), os.lstat(os.path.join(state, "records"))
        assert top.st_uid == 0 and not top.st_mode & 0o022
        assert records.st_uid == NOBODY and records.st_mode & 0o777 == 0o700
        # The masks the workers set are in the ledger of the user who set them (nobody's own private state
        # folder), never in root's: root neither writes nor reads a folder nobody controls.
        ledger = _hooks_ledger(srv.master)
        assert ledger is not None and os.lstat(ledger).st_uid == NOBODY, ledger
        assert os.lstat(os.path.dirname(ledger)).st_uid == NOBODY
        assert {e["pid"] for e in json.loads(Path(ledger).read_text())["entries"]} >= set(srv.workers())
        assert not list(Path(tempfile.gettempdir()).glob(f"tuna_lab-0/hooks-{srv.master}-*.json"))
        assert "Traceback" not in srv.text()
    finally:
        srv.stop()
    assert unchanged(victim) == before


def test_a_state_folder_nobody_creates_first_is_refused(python_nobody_can_read, site, tmp_path):
    # nobody knows the master's PID before Gunicorn runs (a shell that waits, then execs it: same PID and
    # start time) and creates the state folder at the predicted name, as the workers' own user, with a
    # plan, a forged marker, records and a link to root's file.
    from tuna_lab.live.state import hook_dir, hook_mark

    shared, victim = site
    before = unchanged(victim)
    argv = " ".join(map(shlex.quote, map(str, gunicorn_argv(python_nobody_can_read, shared,
                                                             port=_free_port()))))
    log = tmp_path / "planted.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["sh", "-c", f"read _ && exec {argv}"], stdin=subprocess.PIPE, stdout=out,
                                stderr=subprocess.STDOUT, env=server_env(), cwd=tmp_path, start_new_session=True)
    path = hook_dir(proc.pid)
    plant = textwrap.dedent('''\
        import os, sys
        path, victim, mark = sys.argv[1:4]
        os.mkdir(path, 0o700)
        os.mkdir(os.path.join(path, "records"), 0o700)
        with open(os.path.join(path, "server"), "w") as fh:
            fh.write(mark)
        for name in ("plan.json.tmp", "slot-0.lock", "refused"):
            os.symlink(victim, os.path.join(path, name))
    ''')
    try:
        done = as_nobody(python_nobody_can_read, plant, path, victim, hook_mark(proc.pid))
        assert done.returncode == 0, done.stderr
        assert os.lstat(path).st_uid == NOBODY
        proc.stdin.write(b"go\n")
        proc.stdin.close()
        assert proc.wait(timeout=90) != 0
        text = log.read_text(errors="replace")
        assert "tuna_lab: refusing the state folder" in text, text[-2000:]
        assert not [line for line in text.splitlines() if "tuna_lab: worker" in line and " slot " in line], text
        assert unchanged(victim) == before
        assert os.path.lexists(path) and os.lstat(path).st_uid == NOBODY        # not ours: left as found
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        shutil.rmtree(path, ignore_errors=True)


def _hooks_ledger(master):
    """The ledger record of ``master``'s hooks in nobody's state folder (the workers' temporary folder), or None."""
    for folder in {tempfile.gettempdir(), "/tmp"}:
        found = sorted(Path(folder).glob(f"tuna_lab-{NOBODY}/hooks-{master}-*.json"))
        if found:
            return str(found[0])
    return None


def _free_port():
    from tuna_lab.server.launch import free_port

    return free_port()
