"""Measuring a server as its operators would: every worker seen, steps that start drained, one request recipe.

Real servers on 127.0.0.1 (Gunicorn running tests/userapp's apps, an
``http.server`` that refuses a wrong Content-Type), real load, and CPU times
read from ``/proc``:

* ``run --app`` under a tuna policy: every worker is up, warmed and placed
  before a trial, so its pool thread's CPU is recorded in every trial (a
  worker that started late once had its pool missed: 0 s);
* ``run_steps`` (``tune``'s steps): a step that overloaded the server leaves
  a backlog; the next step starts only once it is served, or on a restarted
  server, and passes as a fresh server would;
* the same method, body, Content-Type and headers in every command; a 4xx
  answer says what was sent;
* two policies with one plan are reported as "same placement".
"""

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from helpers import USERAPP, main, simulated_race
from tuna_lab.measure import trials as trials_module
from tuna_lab.measure.loadgen.requests import Requests, Send
from tuna_lab.server.launch import free_port


CPUS = sorted(os.sched_getaffinity(0))

two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="pinning W=2 x T=2 needs 2 CPUs")


# -- every worker is measured -----------------------------------------------------------------------

@two_cpus
def test_every_tuna_trial_records_every_workers_pool_cpu(model_env, body, tmp_path):
    # Two trials of each policy: the first and one after it (a third would prove nothing more).
    out = tmp_path / "results"
    r = main("run", "--app", "timed_app:application", "--app-dir", USERAPP, "-w", 2, "-t", 2,
             "--policies", "cfs,tuna-scatter", "--trials", 2, "--requests", 40, "--concurrency", 2,
             "--body", body, "--out", out, "--json", env=model_env)
    assert r.returncode == 0, r.stderr
    cell = Path(json.loads(r.stdout)["path"])
    trials = pd.read_parquet(cell / "trials.parquet")
    assert (trials["trial_status"] == "ok").all(), trials[["policy", "trial", "reason"]].to_dict("records")
    threads = pd.read_parquet(cell / "threads.parquet")
    assert threads.groupby(["policy", "trial"]).ngroups == 2 * 2
    for (policy, trial), group in threads.groupby(["policy", "trial"]):
        # Both workers, each with its main thread and its pool, every one of which ran during the load.
        assert group.loc[group["role"] == "main", "pid"].nunique() == 2, (policy, trial, group)
        pool = group[group["role"] == "pool"]
        assert len(pool) == 2 and (pool["cpu_seconds"] > 0).all(), (policy, trial, group)
        assert (pool["max_thread_cpu_seconds"] > 0).all(), (policy, trial, group)


# -- steps start on a drained server ----------------------------------------------------------------

# A user's app whose every request costs 20 ms of CPU: one worker serves 50 a second, and an overload queues.
SLOW_APP = """
import time


def application(environ, start_response):
    end = time.process_time() + 0.02
    while time.process_time() < end:
        pass
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]
"""


def _slow_app(tmp_path):
    folder = tmp_path / "slowapp"
    folder.mkdir(exist_ok=True)
    (folder / "slow_app.py").write_text(SLOW_APP)
    return folder


def _server(model_env, tmp_path, workers=1):
    import gunicorn.config

    quiet = ["--no-control-socket"] if hasattr(gunicorn.config, "ControlSocketDisable") else []
    plain = tmp_path / "plain.conf.py"
    plain.write_text("")
    port = free_port()
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", str(plain), "-w", str(workers),
                                 "-b", f"127.0.0.1:{port}", "--backlog", "2048", *quiet, "slow_app:application"],
                                cwd=_slow_app(tmp_path), env=model_env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 60
    while not _answers(url):
        if time.monotonic() > deadline or proc.poll() is not None:
            _stop(proc)
            raise AssertionError((tmp_path / "server.log").read_text()[-2000:])
        time.sleep(0.2)
    return proc, port


def _answers(url):
    from tuna_lab.errors import LoadError
    from tuna_lab.measure.loadgen.load import closed_loop

    try:
        frame = closed_loop(url, b"", requests=2, send=Send(method="GET", response="any"), timeout=5)
        return bool((frame["status"] == 200).all())
    except LoadError:
        return False


def _stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


@pytest.mark.alone          # it measures how fast an overloaded server answers (conftest.py)
def test_drain_waits_out_the_backlog_an_overload_left(model_env, tmp_path):
    from tuna_lab.measure.loadgen.load import closed_loop, open_loop
    from tuna_lab.measure.target import Live
    from tuna_lab.measure.trials import backlog, drain

    proc, port = _server(model_env, tmp_path)
    try:
        url = f"http://127.0.0.1:{port}/"
        live = Live(url, proc.pid, place_now=False, proc=proc)
        # Far more than one worker serves in the time the client waits: the rest is left queued at the port.
        frame = open_loop(url, b"", 400.0, duration=1.0, timeout=0.3, deadline=1.3,
                          send=Send(method="GET", response="any"))
        assert (frame["status"] != 200).sum() > 100
        left = backlog(port)
        assert left > 0, "the overload left nothing queued"
        t0 = time.monotonic()
        drained, queued, busy = drain(live, url, timeout=120)
        assert drained and queued == 0 and busy == [], (queued, busy)
        assert time.monotonic() - t0 > 0.3
        assert backlog(port) == 0
        # A drained server answers at once, as a fresh one does.
        after = closed_loop(url, b"", requests=20, concurrency=1, send=Send(method="GET", response="any"),
                            timeout=5)
        assert (after["status"] == 200).all()
        assert after["client_seconds"].median() < 1.0
    finally:
        _stop(proc)


def _steps_plan(model_env, tmp_path, monkeypatch):
    from tuna_lab.machine.reserve import reserve_client_cpus
    from tuna_lab.measure.experiment import Config
    from tuna_lab.measure.target import AppTarget
    from tuna_lab.measure.trials import TrialPlan

    for key, value in model_env.items():
        monkeypatch.setenv(key, value)
    target = AppTarget("slow_app:application", 1, 1, app_dir=str(_slow_app(tmp_path)),
                       requests=Requests(path="/", method="GET"))
    split = reserve_client_cpus("none")
    target.start(split.server)
    config = Config(1, 1, target.label, 0, target="app")
    return target, TrialPlan(config, target, (), None, None, 10, split.server.n_logical, split, timeout=0.3)


@pytest.mark.alone          # it measures how fast an overloaded server answers (conftest.py)
@pytest.mark.parametrize("drain_timeout", [120.0, 0.5], ids=["drained", "restarted"])
def test_a_step_after_an_overload_starts_on_an_idle_server(model_env, tmp_path, monkeypatch, drain_timeout):
    from tuna_lab.measure.trials import run_steps

    # "restarted": a drain this short cannot serve the backlog, so the next step runs on a fresh server.
    monkeypatch.setattr(trials_module, "_DRAIN_TIMEOUT", drain_timeout)
    target, plan = _steps_plan(model_env, tmp_path, monkeypatch)
    # 200 a second for 1 s: 4x what the worker serves, some 3 s of backlog (the drain test overloads it more).
    steps = iter([(200.0, 1.0), (8.0, 2.0)])
    try:
        measured = list(run_steps(plan, "cfs", lambda row: next(steps, None)))
    finally:
        target.stop()
    assert len(measured) == 2
    overload, calm = (m.row for m in measured)
    assert overload["failed"] > 0, overload
    # The calm step served every request in time: it did not start behind the overload's backlog.
    assert calm["trial_status"] == "ok" and calm["failed"] == 0 and calm["n"] >= 8, calm
    first, second = (set(m.threads["pid"]) for m in measured)
    if drain_timeout < 1:
        assert first.isdisjoint(second), "the step ran on the server that had the backlog"
    else:
        assert first == second, "the server was restarted though it drained"


# -- one request recipe -----------------------------------------------------------------------------

class _JsonOnly(http.server.BaseHTTPRequestHandler):
    """Answers 200 to a JSON body, 422 to anything else (MLServer's answer to a form)."""

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        good = self.headers.get("Content-Type") == "application/json"
        reply = b"{}" if good else b'{"error": "body is not JSON"}'
        # Recorded before the answer: the client may read the answer and check `seen` before this thread goes on.
        self.server.seen.append((self.headers.get("Content-Type"), body))
        self.send_response(200 if good else 422)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


@pytest.fixture
def json_only():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _JsonOnly)
    server.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_json_body_goes_as_json_and_a_4xx_says_what_was_sent(json_only, tmp_path):
    from tuna_lab.measure.loadgen.load import closed_loop

    url = f"http://127.0.0.1:{json_only.server_address[1]}/infer"
    body = tmp_path / "req.json"
    body.write_text('{"inputs": [1, 2]}')
    requests = Requests.from_options(url, body=str(body))
    assert (requests.method, requests.content_type) == ("POST", "application/json")
    assert requests.send_headers() == [("Content-Type", "application/json")]
    ok = closed_loop(url, requests.body(), requests=4, concurrency=2, **requests.load_options())
    assert (ok["status"] == 200).all()
    # Not JSON, no header: bytes as they are, never a form.
    raw = tmp_path / "req.bin"
    raw.write_bytes(b"a=1&b=2")
    assert Requests.from_options(url, body=str(raw)).content_type == "application/octet-stream"
    # A header names the type: it is what every command sends, and the server's 422 says what it got.
    form = Requests.from_options(url, headers=["Content-Type: application/x-www-form-urlencoded"], body=str(body))
    assert form.send_headers() == [("Content-Type", "application/x-www-form-urlencoded")]
    refused = closed_loop(url, form.body(), requests=2, concurrency=1, **form.load_options())
    assert (refused["status"] == 422).all()
    assert refused["error"].iloc[0] == ("HTTP 422 to POST, Content-Type application/x-www-form-urlencoded, "
                                        "a 18-byte body: body is not JSON")
    assert {ct for ct, _ in json_only.seen} == {"application/json", "application/x-www-form-urlencoded"}


# -- same placement ---------------------------------------------------------------------------------

def test_policies_with_one_plan_are_reported_as_same_placement(tmp_path):
    from tuna_lab.analysis.summary import summarize
    from tuna_lab.machine.topology import Topology
    from tuna_lab.measure.target import Target

    # W=2 x T=1 on 2 CPUs: round-robin and tuna-scatter give each worker a CPU of its own, alike.
    target = Target()
    target.workers, target.threads = 2, 1
    target.topology = Topology.from_sysfs(allowed={0, 1})
    for policy in ("round-robin", "tuna-scatter"):
        target._placement(policy)
    plans = target.plans()
    assert plans["round-robin"]["sha256"] == plans["tuna-scatter"]["sha256"]
    trials = pd.DataFrame({"policy": ["cfs", "round-robin", "tuna-scatter"], "trial": 0, "trial_status": "ok",
                           "p50": [0.010, 0.008, 0.012], "p99": [0.030, 0.020, 0.040]})
    summary = summarize(None, trials, plans=plans)
    assert summary.same_placement == {"tuna-scatter": "round-robin"}
    text = summary.to_text()
    line = next(x for x in text.splitlines() if x.startswith("tuna-scatter"))
    assert "same placement" in line and "0.75x" not in line
    assert "1.50x" in next(x for x in text.splitlines() if x.startswith("round-robin"))


# -- every tune candidate measured, or said why not -------------------------------------------------

def test_the_default_budget_measures_every_candidate_and_a_short_one_says_which_it_did_not():
    from tuna_lab.measure.tune.race import Candidate, RaceRules, auto_configs, race

    candidates = [Candidate(w, t, p) for w, t in auto_configs(2) for p in ("cfs", "round-robin", "tuna-scatter")]
    assert len(candidates) == 15
    # tune's defaults (15 min, 4 rounds of 2 s steps), a slow 10 s start and a 5 s drain after every step.
    evaluate, clock = simulated_race(10.0, 5.0)
    result = race(candidates, evaluate, 0.05, 900, rules=RaceRules(rounds=4, step_seconds=2.0), clock=clock)
    assert (result.table["steps"] > 0).all(), result.table[["candidate", "steps", "reason"]]
    assert "not measured" not in result.to_text()
    # 90 s cannot hold 15 runs: the ones left out are named, with why.
    evaluate, clock = simulated_race(10.0, 5.0)
    short = race(candidates, evaluate, 0.05, 90, rules=RaceRules(rounds=4, step_seconds=2.0), clock=clock)
    missing = short.table[short.table["steps"] == 0]
    assert len(missing) and missing["reason"].str.startswith("not measured: the 90 s budget ran out").all()
    line = next(x for x in short.to_text().splitlines() if x.startswith("not measured ("))
    assert all(name in line for name in missing["candidate"])


# -- operator defaults ------------------------------------------------------------------------------

def test_run_pid_sends_two_requests_per_worker_at_a_time_by_default(model_env, tmp_path):
    proc, port = _server(model_env, tmp_path, workers=2)
    try:
        url = f"http://127.0.0.1:{port}/"
        # Two trials: a short trial whose connections the kernel gave mostly to one worker is refused (issue 47).
        r = main("run", "--pid", proc.pid, "--url", url, "-t", 1, "--policies", "cfs", "--trials", 2,
                 "--requests", 80, "--out", tmp_path / "out", "--json", env=model_env)
        assert r.returncode == 0, r.stderr
        manifest = json.loads((Path(json.loads(r.stdout)["path"]) / "manifest.json").read_text())
        assert manifest["concurrency"] == 4
        assert "with --pid: 2 per worker" in " ".join(main("run", "--help").stdout.split())
    finally:
        _stop(proc)
