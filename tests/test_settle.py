"""Workers counted once they have settled: a real Gunicorn whose master forks its last worker late.

Gunicorn forks its workers one by one; on a busy machine the first answers
requests before the master has forked the next. A run that counted the
workers then would size its load (``run --pid``: 2 requests per worker) and
its plan for too few. The ``pre_fork`` hook below holds the master back
before the last worker's fork, as a busy machine can.
"""

import sys
import time
import urllib.request

import pytest

from helpers import ProcessGroup, wait_until
from tuna_lab.errors import PinError
from tuna_lab.live.roles import check_server, settled_roles

pytestmark = pytest.mark.server

APP = """
def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]
"""

# The master sleeps DELAY s before forking worker number LATE (the hook counts forks in its own process).
CONF = """
import os, time
_forks = []

def pre_fork(server, worker):
    _forks.append(1)
    if len(_forks) == int(os.environ["LATE"]):
        time.sleep(float(os.environ["DELAY"]))
"""


def _late_server(tmp_path, workers, late, delay):
    import gunicorn.config

    (tmp_path / "late_app.py").write_text(APP)
    (tmp_path / "late_conf.py").write_text(CONF)
    quiet = ["--no-control-socket"] if hasattr(gunicorn.config, "ControlSocketDisable") else []
    env = {"PATH": "/usr/bin:/bin", "LATE": str(late), "DELAY": str(delay), "PYTHONUNBUFFERED": "1"}
    srv = ProcessGroup([sys.executable, "-m", "gunicorn", "-c", "late_conf.py", "-w", str(workers),
                        "-b", "127.0.0.1:{port}", *quiet, "late_app:application"], env, tmp_path, "late")

    def answers():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    wait_until(answers, 30, "the first worker to answer")
    return srv


def test_a_worker_forked_late_is_waited_for_and_counted(tmp_path):
    srv = _late_server(tmp_path, workers=2, late=2, delay=3)
    try:
        assert len(srv.workers()) == 1             # the server answers, with one of its two workers
        started = time.monotonic()
        pids = check_server(srv.master)
        assert len(pids) == 2 and sorted(pids) == sorted(srv.workers())
        assert time.monotonic() - started < 15
    finally:
        srv.stop()


def test_workers_still_missing_after_the_wait_are_refused_with_the_count_asked_for(tmp_path):
    srv = _late_server(tmp_path, workers=2, late=2, delay=8)
    try:
        with pytest.raises(PinError, match=r"asks for 2 workers \(-w 2\) and 1 is running after 1 s"):
            settled_roles(srv.master, wait=1)
    finally:
        srv.stop()


@pytest.mark.parametrize("argv, asked", [
    (["gunicorn", "-w", "2", "app:app"], (2, "-w 2")),
    (["gunicorn", "-w", "\u00b2", "app:app"], None),            # a digit to str.isdigit, not to int
    (["gunicorn", "-w\u00b2", "app:app"], None),
    (["gunicorn", "-w", "9" * 4000, "app:app"], None),           # no server runs so many; no 4,000-digit message
    (["gunicorn", "--workers=0"], None), (["gunicorn", "-w", "-3"], None), (["gunicorn", "-w"], None),
    (["uvicorn", "app:app", "--workers", "abc"], None),
])
def test_only_a_count_a_server_would_take_is_waited_for(argv, asked):
    from tuna_lab.live.roles import _asked_workers

    assert _asked_workers(argv) == asked


def test_a_named_worker_that_exits_while_the_server_is_read_is_refused_not_left_without_a_slot(monkeypatch):
    import os
    import subprocess

    from tuna_lab.live import roles

    child = subprocess.Popen(["sleep", "30"])
    try:
        real = roles._facts
        # Gone between being named (a live child) and being read, as a worker that exits at that moment.
        monkeypatch.setattr(roles, "_facts", lambda p: None if p.pid == child.pid else real(p))
        with pytest.raises(PinError, match=f"^worker {child.pid} named by --worker-pids exited while server"):
            roles.server_roles(os.getpid(), roles.WorkerChoice(pids=(child.pid,)))
    finally:
        child.kill()
        child.wait()
