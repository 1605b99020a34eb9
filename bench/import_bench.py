"""What importing tuna_lab costs: ``.venv/bin/python bench/import_bench.py``.

Two measurements:

* the wall time of ``tuna-lab topology --json`` (the console script of this
  virtual environment), median of 5 runs, against a target of 0.5 s;
* the resident memory (RSS) of a real server's Gunicorn master and workers
  (``tuna-lab serve -w 2 -t 1 --model small --policy cfs --detach``), next to
  the RSS of a fresh interpreter after ``import tuna_lab.server.app`` with and
  without the solver (cvxpy, highspy): what each worker would carry if the
  server's imports still pulled the solver in.

These are benchmarks, not tests: PASS/FAIL is printed, the exit status is 0
unless a measurement could not be taken. Other work on the machine shows in
the times: run it on a quiet machine, and more than once.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

TARGET_SECONDS = 0.5
# The console script of the interpreter running this bench, not whatever `tuna-lab` is on PATH.
TUNA_LAB = str(Path(sys.executable).with_name("tuna-lab"))
MB = 1024 * 1024


def time_command(argv, runs):
    """Wall seconds of ``runs`` runs of ``argv`` (after one unmeasured run that warms the file cache)."""
    subprocess.run(argv, check=True, capture_output=True)
    seconds = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        seconds.append(time.perf_counter() - t0)
    return seconds


def fresh_import_rss(modules):
    """RSS in bytes of a fresh interpreter once it has imported ``modules``."""
    code = f"import psutil\nimport {', '.join(modules)}\nprint(psutil.Process().memory_info().rss)"
    p = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return int(p.stdout.strip().splitlines()[-1])


def _wait_answers(url, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def server_rss(workers, threads):
    """``{"master": rss, "workers": [rss, ...]}`` of a real detached server, stopped before returning."""
    from tuna_lab.server.launch import free_port

    with tempfile.TemporaryDirectory(prefix="import-bench-") as tmp:
        pidfile = os.path.join(tmp, "server.pid")
        serve = [TUNA_LAB, "serve", "-w", str(workers), "-t", str(threads), "--model", "small",
                 "--policy", "cfs", "--port", str(free_port()), "--pidfile", pidfile, "--detach"]
        try:
            # TMPDIR: the detached server's scratch directory goes into ours and is removed with it.
            p = subprocess.run(serve, capture_output=True, text=True, timeout=600,
                               env={**os.environ, "TMPDIR": tmp})
            if p.returncode != 0:
                raise RuntimeError(f"tuna-lab serve failed: {p.stderr.strip()}")
            info = json.loads(subprocess.run([TUNA_LAB, "status", "--pidfile", pidfile, "--json"], check=True,
                                             capture_output=True, text=True).stdout)
            _wait_answers(info["url"])
            return {"master": psutil.Process(info["master"]).memory_info().rss,
                    "workers": [psutil.Process(w["pid"]).memory_info().rss for w in info["workers"]]}
        finally:
            # Whatever happened above, no server outlives the bench.
            if os.path.exists(pidfile):
                subprocess.run([TUNA_LAB, "stop", "--pidfile", pidfile], capture_output=True, timeout=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs of `tuna-lab topology --json`")
    parser.add_argument("--workers", type=int, default=2, help="Gunicorn workers of the measured server")
    args = parser.parse_args(argv)

    print(f"# import bench  (python {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())})")
    seconds = time_command([TUNA_LAB, "topology", "--json"], args.runs)
    median = statistics.median(seconds)
    print(f"tuna-lab topology --json, {args.runs} runs:")
    print(f"  median {median:6.3f} s   min {min(seconds):6.3f} s   max {max(seconds):6.3f} s   "
          f"target <= {TARGET_SECONDS:.1f} s   {'PASS' if median <= TARGET_SECONDS else 'FAIL'}")

    app = fresh_import_rss(["tuna_lab.server.app"])
    with_solver = fresh_import_rss(["tuna_lab.server.app", "cvxpy", "highspy"])
    rss = server_rss(args.workers, 1)
    solver = with_solver - app
    rows = [("fresh python: import tuna_lab.server.app", app),
            ("fresh python: import tuna_lab.server.app, cvxpy, highspy", with_solver),
            ("  the solver's share (difference)", solver),
            (f"server -w {args.workers} -t 1 --model small: Gunicorn master", rss["master"])]
    for i, w in enumerate(rss["workers"]):
        rows.append((f"  worker {i} (model loaded, pinned) - now", w))
        rows.append((f"  worker {i} with the solver (estimate: now + difference)", w + solver))
    width = max(len(label) for label, _ in rows)
    print(f"\n{'resident memory (RSS)':<{width}}  {'MB':>8}")
    for label, value in rows:
        print(f"{label:<{width}}  {value / MB:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
