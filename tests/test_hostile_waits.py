"""Waits without a word, and exits that say what happened (issue 46); every worker measured (issue 47).

Each case is a user's app or output that used to make a command wait for
minutes in silence, end in a traceback, or exit with the wrong status: an
app that hangs in every request, one that starts a background process as
it is imported, uvicorn at one worker, an app that answers 500, a full
disk under stdout. Every one must end within a bound, with one line on
stderr that starts with ``tuna-lab:``, no traceback, and the status the
house rule gives: 2 for bad input (refused before anything ran), 1 for a
measurement that ran and failed or output that could not be written.

The apps are written by each test into its own folder; the servers are
real (Gunicorn, uvicorn) and cheap: one trial of a few requests.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from helpers import main

pytestmark = pytest.mark.server

TIMEOUT = 60

HANG = '''
import time


def application(environ, start_response):
    time.sleep(3600)
'''

ERROR = '''
def application(environ, start_response):
    start_response("500 Internal Server Error", [("Content-Type", "text/plain"), ("Content-Length", "4")])
    return [b"oops"]
'''

# A helper process started at import, which inherits the importer's stdout and stderr (and so any pipe).
HELPER = '''
import os
import subprocess
import sys

_helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["HELPER_PIDS"], "a") as fh:
    fh.write(f"{_helper.pid}\\n")


def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]
'''

# An ASGI app whose every request costs about a millisecond of CPU: a worker's CPU over a load says
# how many of its requests it served.
BUSY = '''
import time


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    end = time.thread_time() + 0.001
    while time.thread_time() < end:
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
'''


def _app(tmp_path, name, text):
    folder = tmp_path / "app"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(text)
    return folder


def _one_line(r, code):
    """Exit status ``code``, no traceback, and the last stderr line says why, starting ``tuna-lab:``."""
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.returncode == code, (r.returncode, r.stderr[-1500:])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("tuna-lab: "), r.stderr[-1500:]
    return lines[-1]


# -- a full stdout --------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["solve", "-w", "2", "-t", "2", "--synthetic", "core:4 pu:1", "--json"],
    ["solve", "-w", "2", "-t", "2", "--synthetic", "core:4 pu:1"],
    ["topology", "--synthetic", "core:2 pu:1", "--json"],
    ["topology", "--synthetic", "core:2 pu:1"],
    ["plan", "-w", "2", "-t", "2", "--synthetic", "core:4 pu:1", "--format", "json"],
    ["--version"],
    ["--help"],
    ["solve", "--help"],
], ids=lambda a: " ".join(a)[:40])
def test_a_full_stdout_is_one_line_and_exit_1(args):
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "tuna_lab", *args], stdout=full, stderr=subprocess.PIPE,
                           stdin=subprocess.DEVNULL, text=True, timeout=TIMEOUT)
    assert p.returncode == 1, p.stderr
    assert p.stderr.splitlines() == ["tuna-lab: error: cannot write the output to stdout: No space left on device"]


def test_a_reader_that_leaves_is_no_error():
    # `tuna-lab ... | head -c 1`: the pipe breaks, and that is the reader's choice, not a failure of ours.
    p = subprocess.run(f"{sys.executable} -m tuna_lab solve -w 2 -t 2 --synthetic 'core:4 pu:1' --json | head -c 1",
                       shell=True, capture_output=True, text=True, timeout=TIMEOUT)
    assert p.stdout == "{" and "Traceback" not in p.stderr and "Exception ignored" not in p.stderr


# -- servers that answer nothing, or only errors ---------------------------------------------------------

def test_uvicorn_at_one_worker_is_refused_at_once(tmp_path):
    folder = _app(tmp_path, "busy", BUSY)
    start = time.monotonic()
    r = main("run", "--app", "busy:app", "--app-dir", folder, "--server", "uvicorn", "-w", 1, "-t", 1,
             "--policies", "cfs", "--trials", 1, "--requests", 5, timeout=TIMEOUT)
    line = _one_line(r, 2)
    assert "forks no worker" in line and "-w 2" in line
    assert time.monotonic() - start < 20 and r.stdout == ""


def test_an_app_that_hangs_fails_its_trial_within_the_warm_up_bound(tmp_path, monkeypatch):
    from tuna_lab.measure import trials

    # The bound under test, made short: the trial must end by it (and the server's stop), not by 120 s timeouts.
    monkeypatch.setattr(trials, "_WARM_REQUEST_TIMEOUT", 2.0)
    folder = _app(tmp_path, "hang", HANG)
    start = time.monotonic()
    r = main("run", "--app", "hang:application", "--app-dir", folder, "-w", 1, "-t", 1, "--policies", "cfs",
             "--trials", 1, "--requests", 10, "--out", tmp_path / "out", timeout=TIMEOUT)
    elapsed = time.monotonic() - start
    line = _one_line(r, 1)
    assert "no valid trial of cfs" in line
    assert "failed: cfs trial 1: nothing answered: none of the" in r.stdout
    assert "timeout after 2 s" in r.stdout and "worker replaced" not in r.stdout + r.stderr
    # the progress line of the trial says it too, as it ends
    assert "trial 1/1 cfs" in r.stderr and "nothing answered" in r.stderr
    assert elapsed < 30, elapsed


def test_an_app_that_answers_500_is_a_failed_measurement_exit_1_not_bad_input(tmp_path):
    folder = _app(tmp_path, "error", ERROR)
    r = main("run", "--app", "error:application", "--app-dir", folder, "-w", 1, "-t", 1,
             "--policies", "cfs,round-robin", "--trials", 1, "--requests", 10, "--concurrency", 2, timeout=TIMEOUT)
    line = _one_line(r, 1)
    assert "no valid trial of cfs, round-robin" in line
    assert "mean p99 for both" not in r.stderr
    assert "failed: round-robin trial 1: 10 of 10 requests failed" in r.stdout and "oops" in r.stdout


# -- the import probe --------------------------------------------------------------------------------------

def test_the_import_probe_waits_for_the_import_not_for_a_process_the_app_started(tmp_path, monkeypatch):
    from tuna_lab.measure.target import AppTarget

    folder = _app(tmp_path, "helper", HELPER)
    pids = tmp_path / "helper-pids"
    monkeypatch.setenv("HELPER_PIDS", str(pids))
    start = time.monotonic()
    target = AppTarget("helper:application", 1, 1, app_dir=str(folder))
    assert target.check() is target
    assert time.monotonic() - start < 20
    # The helper it started (alive for 600 s otherwise) was stopped with the probe.
    (pid,) = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 5
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"the app's helper {pid} outlived the probe"
        time.sleep(0.05)


# -- every worker measured ---------------------------------------------------------------------------------

@pytest.mark.alone          # it reads each worker's CPU over a load
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two workers need two CPUs")
def test_a_trial_on_workers_that_share_a_socket_measures_every_worker(tmp_path):
    # uvicorn's workers accept from one socket; a few keep-alive connections accepted by one worker would
    # leave the other idle for the whole trial. The generator reconnects, and the trial says how even it was.
    folder = _app(tmp_path, "busy", BUSY)
    out = tmp_path / "out"
    r = main("run", "--app", "busy:app", "--app-dir", folder, "--server", "uvicorn", "-w", 2, "-t", 1,
             "--policies", "cfs", "--trials", 1, "--requests", 200, "--concurrency", 4, "--out", out,
             timeout=TIMEOUT * 2)
    assert r.returncode == 0, r.stderr[-1500:]
    (cell,) = [p for p in out.iterdir() if p.is_dir()]
    trials = pd.read_parquet(cell / "trials.parquet")
    assert trials["trial_status"].tolist() == ["ok"]
    assert trials["worker_share"].iloc[0] >= 0.25
    # What the share was read from: each worker's CPU over the load, in threads.parquet.
    threads = pd.read_parquet(cell / "threads.parquet")
    spent = threads[threads["role"].isin(["main", "pool", "other"])].groupby("pid")["cpu_seconds"].sum()
    assert len(spent) == 2 and spent.min() >= 0.25 * spent.max()
