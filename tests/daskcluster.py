"""A real Dask cluster on 127.0.0.1 for the tests: a scheduler and one 1-CPU worker per CPU given.

Each worker is confined to its CPU with ``taskset``, so each is a "machine" of
its own (the same hostname and shape, another fingerprint). Every process
carries the caller's mark in ``TUNA_LAB_TEST_MARK`` (Gunicorns the workers
start inherit it), which is how a test finds what survived.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DASK = Path(sys.executable).with_name("dask")


def start(cmd, log, mark, cpu=None):
    """A process in its own group (so it and its children are stopped together), carrying ``mark``."""
    env = {**os.environ, "TUNA_LAB_TEST_MARK": mark}
    cmd = ["taskset", "-c", str(cpu), *cmd] if cpu is not None else cmd
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop(proc):
    """SIGTERM the process group, then SIGKILL what is left; return once the leader is reaped."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def scheduler(tmp, mark):
    """A Dask scheduler on 127.0.0.1 (no dashboard): ``(process, address)``."""
    file = tmp / "scheduler.json"
    proc = start([str(DASK), "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                  "--scheduler-file", str(file)], open(tmp / "scheduler.log", "wb"), mark)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            return proc, json.loads(file.read_text())["address"]
        except (OSError, ValueError, KeyError):
            time.sleep(0.1)
    stop(proc)
    pytest.fail("the dask scheduler did not start")


class Cluster:
    """A scheduler and one worker per CPU of ``cpus``, named ``cpu<N>``."""

    def __init__(self, tmp, cpus, mark):
        import distributed

        self.tmp = tmp
        self.scheduler, self.address = scheduler(tmp, mark)
        self.workers = {f"cpu{c}": start([str(DASK), "worker", self.address, "--nthreads", "1", "--nworkers", "1",
                                          "--resources", "machine=1", "--no-dashboard", "--name", f"cpu{c}"],
                                         open(tmp / f"worker-{c}.log", "wb"), mark, cpu=c) for c in cpus}
        with distributed.Client(self.address, timeout=30) as client:
            client.wait_for_workers(len(self.workers), timeout=60)
            #: worker name -> its address
            self.address_of = {w["name"]: a for a, w in client.scheduler_info()["workers"].items()}

    def close(self):
        for proc in [*self.workers.values(), self.scheduler]:
            stop(proc)
