"""Gunicorn config of the pre-fork shape: 2 workers, and two helper children of the master.

``when_ready`` (in the master, before the workers fork) starts a
multiprocessing Manager - a forked child that inherits the listening socket,
as a Manager started from a Gunicorn hook does - and a metrics exporter that
listens on its own port (``SHAPE_EXPORTER_PORT``), as a Prometheus sidecar does.
Each process's role is appended to the file ``SHAPE_ROLES`` names, for the tests.
"""

import multiprocessing
import os
import subprocess
import sys

workers = 2
_helpers = []


def _note(role, pid):
    with open(os.environ["SHAPE_ROLES"], "a") as fh:
        fh.write(f"{role} {pid}\n")


def when_ready(server):
    manager = multiprocessing.Manager()
    manager.dict()["ready"] = True
    exporter = subprocess.Popen([sys.executable, "-m", "http.server", os.environ["SHAPE_EXPORTER_PORT"],
                                 "--bind", "127.0.0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _helpers.extend([manager, exporter])
    _note("helper", manager._process.pid)
    _note("helper", exporter.pid)


def post_worker_init(worker):
    _note("worker", worker.pid)
