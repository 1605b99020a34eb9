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
