"""Threaded workers in the field (issue 47): servers that call the model from a thread pool, not the main thread.

* Gunicorn ``-k gthread --threads 4 -w 2``, with and without ``--preload``
  (``.venv-field/gthread``);
* FastAPI under ``uvicorn --workers 2``: a sync endpoint (anyio's worker
  threads call the model) and an async one (the event loop does)
  (``.venv-field/fastapi``);
* BentoML ``@bentoml.service(workers=2, threads=4)`` with a sync API, run on
  its thread pool (``.venv-field/bentoml``).

Each serves an XGBoost model (``nthread=2``) trained here. What is asserted is
read from ``/proc`` under a bounded load: every thread of a worker that gained
CPU while it served is one ``pin`` placed, narrowed to its worker's slot, never
left on every CPU; every mask pin set is exact, after a second pin too; after
``unpin`` no thread is narrowed; ``status`` and ``audit`` say the threads per
CPU with the framework's knob. Each server takes well under a minute.
"""

import json
import os
import threading
import time

import pytest
from fieldkit import APPS, CPUS, FieldServer, framework_python, free_port, report, rows, train_model, tuna_lab
from procfs import affinities, cpu_seconds, cpus_of

#: Workers, and the threads per worker a plan gives: each slot its own CPUs where the machine has 4.
W = 2
T = 2 if len(CPUS) >= 4 else 1
APP = APPS / "threaded"


def _env(server_env, model):
    return {**server_env, "FIELD_MODEL": str(model), "FIELD_NTHREAD": "2", "PYTHONPATH": str(APP)}


def _start(name, modules, argv_of, path, tmp_path_factory, server_env):
    python = framework_python(name, modules)
    folder = tmp_path_factory.mktemp(name)
    model = train_model(python, folder / "model.json")
    body = folder / "predict.json"
    body.write_text(json.dumps({"rows": rows()}))
    port = free_port()
    srv = FieldServer(argv_of(python, port), _env(server_env, model), APP, port, f"http://127.0.0.1:{port}{path}",
                      body, folder / f"{name}.log")
    srv.wait_ready()
    return srv


SHAPES = {
    "gthread": (("gunicorn", "xgboost"), "gthread", "/", "Gunicorn's --threads",
                lambda py, port: [py, "-m", "gunicorn", "-k", "gthread", "--threads", 4, "-w", W,
                                  "-b", f"127.0.0.1:{port}", "wsgi_app:app"]),
    "gthread-preload": (("gunicorn", "xgboost"), "gthread", "/", "Gunicorn's --threads",
                        lambda py, port: [py, "-m", "gunicorn", "-k", "gthread", "--threads", 4, "-w", W, "--preload",
                                          "-b", f"127.0.0.1:{port}", "wsgi_app:app"]),
    "fastapi-sync": (("fastapi", "uvicorn", "xgboost"), "fastapi", "/predict", "anyio's thread limiter",
                     lambda py, port: [py, "-m", "uvicorn", "fastapi_app:app", "--workers", W, "--port", port]),
    "fastapi-async": (("fastapi", "uvicorn", "xgboost"), "fastapi", "/predict_async", None,
                      lambda py, port: [py, "-m", "uvicorn", "fastapi_app:app", "--workers", W, "--port", port]),
    "bentoml": (("bentoml", "xgboost"), "bentoml", "/predict", "BentoML's threads",
                lambda py, port: [py, "-m", "bentoml", "serve", "bentoml_service:Model", "--port", port]),
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def shaped(request, tmp_path_factory, server_env):
    modules, venv, path, knob, argv_of = SHAPES[request.param]
    srv = None
    try:
        srv = _start(venv, modules, argv_of, path, tmp_path_factory, server_env)
        yield request.param, srv, knob
    finally:
        if srv is not None:
            tuna_lab("unpin", "--pid", srv.master)
            srv.stop()


def _mask(tid):
    """A thread's mask, or None when it ended (anyio's idle worker threads end after 10 s)."""
    try:
        return cpus_of(tid)
    except (FileNotFoundError, ProcessLookupError, StopIteration):
        return None


def _under_load(srv, workers, seconds=2.0):
    """Per worker, per thread, the CPU seconds it gained while ``srv`` served a bounded load (8 at a time)."""
    before = {pid: cpu_seconds(pid) for pid in workers}
    stop = time.monotonic() + seconds
    statuses = []

    def send():
        while time.monotonic() < stop and len(statuses) < 2000:
            statuses.append(srv.post(timeout=30))

    senders = [threading.Thread(target=send) for _ in range(8)]
    for s in senders:
        s.start()
    for s in senders:
        s.join()
    assert statuses and set(statuses) == {200}, sorted(set(statuses))
    after = {pid: cpu_seconds(pid) for pid in workers}
    return {pid: {tid: after[pid][tid] - before[pid].get(tid, 0.0) for tid in after[pid]} for pid in workers}


def _working(gains):
    """The threads of one worker that did the work: at least 10 ms and a tenth of its busiest thread's CPU."""
    top = max(gains.values(), default=0.0)
    return {tid for tid, g in gains.items() if g >= 0.01 and g >= 0.1 * top}


def test_pin_places_the_threads_that_work_and_unpin_leaves_no_mask_behind(shaped):
    name, srv, knob = shaped
    srv.load(16)                                              # every caller and its team exist
    opts = ["--pid", srv.master, "--url", srv.url, "--body", srv.body]
    status = tuna_lab("status", *opts)
    assert status.returncode == 0, status.stderr
    if knob:
        assert "threaded workers" in status.stderr and knob in status.stderr, status.stderr
        assert " threads on " in status.stderr and " CPUs" in status.stderr
    assert set(map(tuple, affinities(srv.tree()).values())) == {tuple(CPUS)}, "the test starts unpinned"
    rep = report(tuna_lab("pin", *opts, "-t", T, "--policy", "tuna-scatter", "--json"))
    slot_cpus = {}
    for w in rep["workers"]:
        placed = [t for t in w["threads"] if t["planned"] is not None]
        assert placed, w
        slot_cpus[w["pid"]] = sorted({c for t in placed for c in t["planned"]})
        for t in placed:                                     # exact after the pin
            assert _mask(t["tid"]) in (None, sorted(t["planned"])), t
    assert len(slot_cpus) == W
    # Under load: every thread that gained CPU sits in its worker's slot, narrowed; none kept every CPU.
    gains = _under_load(srv, list(slot_cpus))
    for pid, threads in gains.items():
        work = _working(threads)
        assert work, f"worker {pid} did no work: {threads}"
        for tid in work:
            mask = _mask(tid)
            if mask is None:
                continue                                      # it ended (anyio's idle threads do)
            assert set(mask) <= set(slot_cpus[pid]) and mask != CPUS, (name, pid, tid, threads[tid], mask)
    _unpin_leaves_nothing(srv)


def _unpin_leaves_nothing(srv):
    done = tuna_lab("unpin", "--pid", srv.master)
    assert done.returncode == 0, done.stderr
    narrowed = {tid: (cpus, _owner(tid)) for tid, cpus in affinities(srv.tree()).items() if cpus != CPUS}
    assert not narrowed, f"after unpin, threads still narrowed (tid: mask, process): {narrowed}\n{done.stdout}"


def _owner(tid):
    """The process (its PID and command) thread ``tid`` belongs to."""
    try:
        with open(f"/proc/{tid}/status") as fh:
            pid = int(next(line for line in fh if line.startswith("Tgid:")).split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return pid, fh.read().replace(b"\0", b" ").decode(errors="replace")[:80]
    except (OSError, StopIteration):
        return None


def test_a_pin_over_a_pin_stays_exact_and_unpin_leaves_no_mask_behind(shaped):
    _, srv, _ = shaped
    opts = ["--pid", srv.master, "--url", srv.url, "--body", srv.body]
    report(tuna_lab("pin", *opts, "-t", T, "--policy", "tuna-scatter", "--json"))
    srv.load(16)                                              # threads born under the pin (libgomp teams, anyio's)
    again = report(tuna_lab("pin", *opts, "-t", T, "--policy", "tuna-scatter", "--json"))
    for w in again["workers"]:
        for t in w["threads"]:
            if t["planned"] is not None:
                assert _mask(t["tid"]) in (None, sorted(t["planned"])), t
    _unpin_leaves_nothing(srv)


def test_audit_under_load_names_the_threaded_workers_and_the_knob(shaped):
    name, srv, knob = shaped
    if not knob:
        pytest.skip(f"{name}: the model runs on the main thread, no threaded workers to name")
    result = {}

    def audit():
        result["done"] = tuna_lab("audit", "--pid", srv.master, "--json")

    auditor = threading.Thread(target=audit)
    auditor.start()
    deadline = time.monotonic() + 60
    while auditor.is_alive() and time.monotonic() < deadline:
        srv.load(8, concurrency=8)
    auditor.join()
    out = json.loads(result["done"].stdout)
    found = [f for f in out["findings"] if f["kind"] == "threaded"]
    assert found and knob in found[0]["what"] + found[0]["advice"], out["findings"]


def test_run_measures_every_worker_in_every_valid_trial_and_gives_back_every_mask(shaped, tmp_path):
    name, srv, _ = shaped
    if name != "gthread":
        pytest.skip("run --pid is the same on every shape and waits for the machine's CPU lock: gthread's is enough")
    pd = pytest.importorskip("pandas")
    tuna_lab("unpin", "--pid", srv.master)
    out = tmp_path / "out"
    done = tuna_lab("run", "--pid", srv.master, "--url", srv.url, "--body", srv.body, "-t", T, "--policies",
                    "cfs,tuna-scatter", "--trials", 1, "--requests", 60, "--out", out, "--json", timeout=1800)
    # Exit 1 is right when the kernel gave one worker (next to) all of a trial's load: that trial is not valid.
    assert done.returncode in (0, 1), done.stderr
    [cell] = [p for p in out.iterdir() if p.is_dir()]
    trials = pd.read_parquet(cell / "trials.parquet")
    threads = pd.read_parquet(cell / "threads.parquet").dropna(subset=["slot"])
    valid = trials[(trials["trial_status"] == "ok") & (trials["worker_share"] >= 0.25)]
    for _, trial in trials.drop(valid.index).iterrows():
        assert "worker" in str(trial["reason"]), (trial["policy"], trial["reason"])   # each one left out says why
    assert done.returncode == (0 if set(valid["policy"]) == {"cfs", "tuna-scatter"} else 1), done.stderr
    for _, trial in valid.iterrows():
        # The workers' own CPU in that trial, every thread of each: the least loaded did a fair part (pin's 25%).
        rows = threads[(threads["policy"] == trial["policy"]) & (threads["trial"] == trial["trial"])]
        cpu = rows.groupby("pid")["cpu_seconds"].sum()
        assert len(cpu) == W and cpu.min() >= 0.25 * cpu.max(), (trial["policy"], cpu.to_dict())
    narrowed = {tid: cpus for tid, cpus in affinities(srv.tree()).items() if cpus != CPUS}
    assert not narrowed, f"after run --pid, threads still narrowed: {narrowed}"
