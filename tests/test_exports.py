"""Every ``tuna-lab plan --format`` applied to a real server: never worse than no placement at all.

For each runtime (XGBoost, ONNX Runtime, LightGBM, PyTorch CPU) a user's app
(``tests/userapp``, ``tests/runtimeapps``: they import nothing from tuna_lab)
runs under a real Gunicorn with W=2 sync workers of T=2 threads (a main
thread and one pool thread: on 2 CPUs round-robin puts each worker's main
thread on one CPU and its pool thread on the other, so a main thread bound
to its one CPU is exactly the trap where a runtime sizes its pool from it).
Each format is applied as a user applies it:

* ``taskset --pid MASTER``: the printed lines are run on the running server;
* ``json``: the plan file is given to ``tuna-lab pin --pid --plan``;
* ``env`` and ``omp-places``: each worker gets its slot's variables before it
  loads its runtime, from a ``post_fork`` hook the user writes;
* ``onnxruntime``: the user's session gets its slot's
  ``session.intra_op_thread_affinities`` (ONNX Runtime only);
* ``gunicorn``: the printed snippet is the server's config file.

Then, read from ``/proc`` and never through tuna_lab: no main thread of a
worker whose runtime counts its main thread's CPUs (XGBoost on libgomp
without ``OMP_PLACES``) is bound to fewer CPUs than its pool, and every pool
thread still does its share of the work under a bounded load of requests
(``/proc/<pid>/task/<tid>/schedstat`` before and after). Every server is
stopped with its process group; none is left behind.
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from tuna_lab._checks import format_cpulist
from tuna_lab.server.launch import free_port

from helpers import main, wait_until
from procfs import cpu_seconds, cpus_of, tids_of

TESTS = Path(__file__).parent
GUNICORN = Path(sys.executable).with_name("gunicorn")
CPUS = sorted(os.sched_getaffinity(0))
W, T = 2, 2
POLICY = "round-robin"
#: A pool thread "does its share" when it runs at least this share of its main thread's CPU time.
SHARE = 0.3
#: Requests per load. Over 10 requests per worker a working pool thread ran 1.0-1.7x its main thread's CPU
#: time (the four runtimes, measured on a busy 2-core machine) and an idle one runs none: SHARE tells the two
#: apart with margin. Each main thread gains 0.03-0.3 s of CPU (busy_pools wants 0.02; it loads again if not).
LOAD = 10 * W

pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="a main thread and a pool thread on CPUs of their own need 2")

#: The runtimes: the module that must import, the library of the runtime in /proc/<pid>/maps, the app.
RUNTIMES = {
    "xgboost": ("xgboost", "libxgboost", "wsgi_app:application"),
    "onnxruntime": ("onnxruntime", "onnxruntime_pybind11_state", "ort_wsgi:app"),
    "lightgbm": ("lightgbm", "lib_lightgbm", "lgb_app:app"),
    "torch": ("torch", "libtorch_cpu", "torch_app:app"),
}

# The user's ONNX Runtime app (tests/runtimeapps/ort_app.py) as a WSGI app, and the same app as the user
# edits it for `--format onnxruntime`: its slot's affinities in the session options.
ORT_WSGI = '''
import json
from ort_app import batch, session


def app(environ, start_response):
    (out,) = session.run(None, {session.get_inputs()[0].name: batch})
    body = json.dumps({"mean": float(out.mean())}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
'''
ORT_AFFINE = '''
import json, os
import numpy as np
import onnxruntime as ort

options = ort.SessionOptions()
options.intra_op_num_threads = int(os.environ["APP_THREADS"])
options.add_session_config_entry("session.intra_op_thread_affinities", os.environ["APP_AFFINITIES"])
session = ort.InferenceSession(os.environ["APP_MODEL"], options, providers=["CPUExecutionProvider"])
batch = np.random.default_rng(0).standard_normal((256, session.get_inputs()[0].shape[1])).astype(np.float32)


def app(environ, start_response):
    (out,) = session.run(None, {session.get_inputs()[0].name: batch})
    body = json.dumps({"mean": float(out.mean())}).encode()
    start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
'''
# A user's gunicorn.conf.py that gives each worker its slot's variables before the app (and its runtime) loads.
SLOT_CONF = '''
import os

SLOTS = {slots!r}
workers = {workers}
worker_class = "sync"


def post_fork(server, worker):
    os.environ.update(SLOTS[(worker.age - 1) % len(SLOTS)])
'''


# -- running things ---------------------------------------------------------------------------------

def cli(*args, timeout=120):
    """``tuna-lab ARGS`` (in this process: the commands' output is under test here, not the process)."""
    return main(*args, timeout=timeout, cwd=tempfile.gettempdir())


def plan_text(fmt, *extra):
    done = cli("plan", "-w", W, "-t", T, "--policy", POLICY, "--format", fmt, *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout


class Server:
    """A user's Gunicorn server in its own session, stopped as a process group."""

    def __init__(self, workdir, app, model, conf=None, env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.log = workdir / f"gunicorn-{self.port}.log"
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("TUNA_LAB_", "OMP_", "GOMP_", "KMP_"))}
        clean.update(USERAPP_MODEL=str(model), APP_MODEL=str(model), PYTHONUNBUFFERED="1",
                     PYTHONPATH=os.pathsep.join(map(str, (workdir, TESTS / "runtimeapps", TESTS / "userapp"))),
                     **(env or {}))
        import gunicorn.config

        quiet = ["--no-control-socket"] if hasattr(gunicorn.config, "ControlSocketDisable") else []
        # Started in workdir: Gunicorn reads ./gunicorn.conf.py from there when no -c names one.
        argv = [GUNICORN, "-b", f"127.0.0.1:{self.port}", "--chdir", workdir, *quiet]
        argv += ["-c", conf] if conf else ["-w", W, "-k", "sync"]
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([*map(str, argv), app], env=clean, cwd=workdir, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.master = self.proc.pid

    def workers(self):
        """Live worker PIDs, oldest first."""
        out = []
        for child in psutil.Process(self.master).children():
            try:
                if child.status() != psutil.STATUS_ZOMBIE:
                    out.append((child.create_time(), child.pid))
            except psutil.NoSuchProcess:
                continue
        return [pid for _, pid in sorted(out)]

    def get(self, timeout=60):
        with urllib.request.urlopen(self.url, timeout=timeout) as resp:
            assert resp.status == 200
            return json.loads(resp.read())

    def wait_ready(self, timeout=90):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited:\n{self.log.read_text()[-3000:]}"
            if len(self.workers()) == W:
                try:
                    self.get(timeout=10)
                    return self
                except OSError:
                    pass
            time.sleep(0.1)
        raise AssertionError(f"server not ready after {timeout} s:\n{self.log.read_text()[-3000:]}")

    def stop(self):
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.master, sig)
                self.proc.wait(wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(self.master, 0)            # workers may outlive the master a moment
            except ProcessLookupError:
                break
            time.sleep(0.1)


def load(srv, seconds=2.0, max_requests=LOAD):
    """A bounded load (W requests at a time, at most ``seconds`` or ``max_requests``); the CPU each thread gained.

    Returns ``{pid: {tid: seconds}}`` for every worker.
    """
    workers = srv.workers()
    before = {pid: cpu_seconds(pid) for pid in workers}
    start, sent = time.monotonic(), 0
    with ThreadPoolExecutor(W) as pool:
        while time.monotonic() - start < seconds and sent < max_requests:
            list(pool.map(lambda _: srv.get(), range(W)))
            sent += W
    gains = {}
    for pid in workers:
        now = cpu_seconds(pid)
        gains[pid] = {tid: now[tid] - before[pid].get(tid, 0.0) for tid in now}
    return gains


def busy_pools(srv, tries=5, max_requests=LOAD):
    """``{pid: [tid, ...]}``: each worker's threads (not the main one) that ran at least SHARE of its main
    thread's CPU under load - its working pool, found without tuna_lab; a shrunken pool has none."""
    for _ in range(tries):
        gains = load(srv, max_requests=max_requests)
        if all(g[pid] >= 0.02 for pid, g in gains.items()):
            return {pid: sorted(t for t, s in g.items() if t != pid and s >= SHARE * g[pid])
                    for pid, g in gains.items()}, gains
    raise AssertionError(f"some worker served no requests in {tries} loads: {gains}")


def counts_main_cpus(pid):
    """Whether worker ``pid``'s runtime sizes its pool from its main thread's current CPUs at every call.

    XGBoost asks libgomp's ``omp_get_num_procs()`` at every call, which counts the calling thread's CPUs
    unless an ``OMP_PLACES`` list is in effect (and not ignored under ``OMP_PROC_BIND=false``).
    """
    if not loaded(pid, "libxgboost"):
        return False
    with open(f"/proc/{pid}/environ", "rb") as fh:
        env = dict(v.decode().partition("=")[::2] for v in fh.read().split(b"\0") if v)
    return "OMP_PLACES" not in env or env.get("OMP_PROC_BIND", "").lower().startswith("false")


def assert_never_worse_than_none(srv, runtime, fmt, places=False):
    """No main thread of a per-call runtime on fewer CPUs than its pool, and every worker's pool works.

    ``places``: the worker was given ``OMP_PLACES`` after it started (``os.environ`` in a ``post_fork``
    hook, which ``/proc/<pid>/environ`` - the environment a process started with - does not show).
    Returns :func:`busy_pools`' ``(pools, gains)`` of the load it ran, for the caller's own checks.
    """
    for pid in srv.workers():
        if not places and counts_main_cpus(pid):
            assert len(cpus_of(pid)) >= T, (fmt, runtime, pid, cpus_of(pid))
    # A short load may miss a working pool (ONNX Runtime's, pinned from a JSON plan, ran none of three
    # 20-request loads in one run on a busy machine): a pool idles when it did no share in the short load
    # nor in two long ones (up to 2 s or 300 requests, the load this check had before the short one).
    for requests in (LOAD, 300, 300):
        pools, gains = busy_pools(srv, max_requests=requests)
        if all(len(pool) >= T - 1 for pool in pools.values()):
            break
    for pid, pool in pools.items():
        assert len(pool) >= T - 1, (f"{fmt} on {runtime}: worker {pid}'s pool idles in three loads, two long",
                                    {tid: (round(s, 3), cpus_of(tid)) for tid, s in gains[pid].items()})
    return pools, gains


def restore(srv, cpus):
    """Every thread of every worker back on ``cpus`` (what ``taskset`` lines changed; unpin knows nothing of them)."""
    for pid in srv.workers():
        for tid in tids_of(pid):
            try:
                os.sched_setaffinity(tid, cpus)
            except ProcessLookupError:
                pass


# -- models and servers -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


def model_for(runtime, root):
    """The model file each app serves, made here (trained on made-up data, or built with onnx.helper)."""
    path = root / runtime
    if path.exists():
        return path
    if runtime == "xgboost":
        subprocess.run([sys.executable, "-c", f"import usermodel; usermodel.train({str(path)!r})"],
                       cwd=TESTS / "userapp", check=True, timeout=120)
    elif runtime == "onnxruntime":
        from test_runtimes import _build_mlp

        _build_mlp(path)
    elif runtime == "lightgbm":
        from test_runtimes import _train_lightgbm

        _train_lightgbm(path)
    else:
        path.write_text("")                          # the PyTorch app makes its weights from a seed
    return path


def loaded(pid, library):
    with open(f"/proc/{pid}/maps") as fh:
        return library in fh.read()


def settled(srv, quiet=0.3):
    """Whether no worker's main thread gained 5 ms of CPU in ``quiet`` seconds without requests."""
    before = {pid: cpu_seconds(pid).get(pid, 0.0) for pid in srv.workers()}
    time.sleep(quiet)
    return all(cpu_seconds(pid).get(pid, 0.0) - cpu < 0.005 for pid, cpu in before.items())


def start(tmp_path, runtime, models, conf=None, env=None, app=None):
    module = RUNTIMES[runtime][0]
    pytest.importorskip(module, reason=f"{module} is not installed (the runtimes and torch-cpu extras)")
    if runtime == "onnxruntime":
        (tmp_path / "ort_wsgi.py").write_text(ORT_WSGI)
        (tmp_path / "ort_affine.py").write_text(ORT_AFFINE)
    srv = Server(tmp_path, app or RUNTIMES[runtime][2], model_for(runtime, models), conf, env)
    try:
        srv.wait_ready()
        # Every worker has loaded its runtime (one answered; the other may still be loading the app).
        deadline = time.monotonic() + 90
        while not all(loaded(pid, RUNTIMES[runtime][1]) for pid in srv.workers()):
            assert time.monotonic() < deadline, f"{runtime} not loaded in every worker:\n{srv.log.read_text()[-3000:]}"
            time.sleep(0.1)
        # ... and its app: idle, not still importing, so a short load's CPU is the requests' alone.
        wait_until(lambda: settled(srv), 90, f"every worker to load its {runtime} app")
    except BaseException:
        srv.stop()
        raise
    return srv


@pytest.fixture(autouse=True)
def _no_process_left_behind():
    before = {c.pid for c in psutil.Process().children(recursive=True)}

    def left():
        out = []
        for c in psutil.Process().children(recursive=True):
            try:
                if c.pid not in before and c.status() != psutil.STATUS_ZOMBIE:
                    out.append(c.pid)
            except psutil.NoSuchProcess:        # exited (and reaped) while we looked: not left behind
                continue
        return out

    yield
    try:
        wait_until(lambda: not left(), 0.2, "every process the test started to exit", interval=0.02)
    except AssertionError:
        raise AssertionError(f"processes left running: {left()}") from None


# -- taskset and json on a running server ---------------------------------------------------------

@pytest.mark.parametrize("runtime", list(RUNTIMES))
def test_taskset_lines_and_json_plan_applied_to_a_running_server_keep_every_pool_working(runtime, tmp_path, models):
    srv = start(tmp_path, runtime, models)
    cpus = sorted(os.sched_getaffinity(srv.master))
    try:
        pools, _ = busy_pools(srv)                   # served a few requests: every pool is up, and works
        assert all(len(p) == T - 1 for p in pools.values()), (runtime, pools)

        # --format taskset --pid: run the printed lines as a user does.
        text = plan_text("taskset", "--pid", srv.master)
        lines = [line for line in text.splitlines() if not line.startswith("#")]
        named = {}
        for line in lines:
            m = re.fullmatch(r"taskset -p -c (\S+) (\d+)", line)
            assert m, line
            named[int(m.group(2))] = m.group(1)
            subprocess.run(shlex.split(line), check=True, capture_output=True, timeout=10)
        assert set(srv.workers()) <= set(named), text
        for pid in srv.workers():
            if runtime == "xgboost":
                assert re.search(rf"^# worker {pid} \(slot \d\): main thread on all of slot", text, re.M), text
            if runtime == "onnxruntime":
                # ONNX Runtime's pool waits in libc: these lines do not find it, and say so.
                assert re.search(rf"^# worker {pid} .*0 of {T - 1} pool threads found.*--url", text, re.M), text
            else:
                assert all(tid in named for tid in pools[pid]), (runtime, pools, text)
        assert {tid: format_cpulist(cpus_of(tid)) for tid in named} == named
        # One load after the lines for both checks: no pool idles, and the same pool threads as before the
        # lines gain their share (`plan --url` below only reads the threads; it changes no mask).
        _, gains = assert_never_worse_than_none(srv, runtime, "taskset")
        if runtime == "onnxruntime":
            # With --url the lines find ONNX Runtime's pool by its activity, as `pin` does, and name it.
            found = plan_text("taskset", "--pid", srv.master, "--url", srv.url)
            named_now = {int(m.group(1)) for m in re.finditer(r"^taskset -p -c \S+ (\d+)$", found, re.M)}
            assert all(tid in named_now for pool in pools.values() for tid in pool), (pools, found)
            assert "pool threads found" not in found, found
        # The same pool threads as before the lines: they gain CPU under load after the export too.
        for pid, pool in pools.items():
            for tid in pool:
                assert gains[pid][tid] >= SHARE * gains[pid][pid], ("taskset", runtime, pid, tid, gains[pid])
        restore(srv, cpus)

        # --format json: the plan file, applied by `pin --pid --plan` (with --url: ORT's pool is told by activity).
        plan = tmp_path / "plan.json"
        plan.write_text(plan_text("json"))
        done = cli("pin", "--pid", srv.master, "--plan", plan, "--url", srv.url, "--json")
        assert done.returncode == 0, done.stderr
        try:
            assert_never_worse_than_none(srv, runtime, "json")
        finally:
            done = cli("unpin", "--pid", srv.master)
        assert done.returncode == 0, done.stderr
    finally:
        srv.stop()


# -- formats a server starts with ------------------------------------------------------------------

def env_slots(fmt):
    """Each slot's variables, parsed from ``plan --format FMT`` as a user reads the printed lines."""
    text = plan_text(fmt)
    slots = []
    if fmt == "env":
        for line in text.splitlines():
            if line.startswith("# slot "):
                slots.append({})
            elif line and not line.startswith("#"):
                name, _, value = shlex.split(line)[0].partition("=")
                slots[-1][name] = value
    else:
        for line in text.splitlines():
            m = re.fullmatch(r"slot (\d+): (.*)", line)
            if m:
                assert int(m.group(1)) == len(slots), text
                slots.append(dict(item.partition("=")[::2] for item in shlex.split(m.group(2))))
        if fmt == "onnxruntime":
            slots = [{"APP_THREADS": s["intra_op_num_threads"],
                      "APP_AFFINITIES": s["session.intra_op_thread_affinities"]} for s in slots]
    assert len(slots) == W, text
    return slots


# --format onnxruntime sets ONNX Runtime's session options: only its app reads them.
@pytest.mark.parametrize("fmt,runtime", [(fmt, runtime) for fmt in ("env", "omp-places", "gunicorn")
                                         for runtime in RUNTIMES] + [("onnxruntime", "onnxruntime")])
def test_a_server_started_with_the_export_keeps_every_pool_working(fmt, runtime, tmp_path, models):
    conf = tmp_path / "gunicorn.conf.py"
    if fmt == "gunicorn":
        conf.write_text(plan_text("gunicorn"))
        places = True                                # its post_fork hook sets OMP_PLACES=threads
    else:
        slots = env_slots(fmt)
        places = all("OMP_PLACES" in s and s.get("OMP_PROC_BIND") != "false" for s in slots)
        conf.write_text(textwrap.dedent(SLOT_CONF.format(slots=slots, workers=W)))
    srv = start(tmp_path, runtime, models, conf=conf, app="ort_affine:app" if fmt == "onnxruntime" else None)
    try:
        pools, _ = assert_never_worse_than_none(srv, runtime, fmt, places)
        if fmt == "onnxruntime":
            # Applied: each worker's ORT pool thread sits on its slot's pool CPU (ORT counts processors from 1).
            for pid, pool in pools.items():
                assert [len(cpus_of(tid)) for tid in pool] == [1] * (T - 1), (pid, pool)
    finally:
        srv.stop()


# -- refusals ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["json", "omp-places", "env", "onnxruntime", "gunicorn"])
def test_a_format_that_names_no_threads_refuses_pid_in_one_line(fmt):
    """Only ``taskset`` binds a running server's threads (by the main-thread rule); the others say so."""
    done = cli("plan", "-w", W, "-t", T, "--policy", POLICY, "--format", fmt, "--pid", os.getpid())
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "names no threads" in done.stderr, done.stderr
