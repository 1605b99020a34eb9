"""Measure a user's own server: ``tuna-lab run --app`` (started by tuna_lab) and ``run --pid --url`` (running).

Every server here is a real process tree on 127.0.0.1 running the user's
apps of ``tests/userapp`` (which import nothing from tuna_lab); the CLI runs
as a user runs it, and every mask is read from ``/proc`` independently of
the library. A running server must end every run with exactly the masks it
had: after a normal end, after SIGINT in the middle of a trial, and after
one of its workers was SIGKILLed in the middle of a trial.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from tuna_lab._checks import format_cpulist
from tuna_lab.server.launch import free_port

from helpers import main as cli
from procfs import masks

USERAPP = Path(__file__).parent / "userapp"
CPUS = sorted(os.sched_getaffinity(0))

pytestmark = pytest.mark.skipif(len(CPUS) < 2, reason="pinning W=2 x T=2 needs 2 CPUs")


# -- running things ---------------------------------------------------------------------------------

def _start(argv, env, tmp_path, name):
    """Start a server and return once it is *settled*: both workers answer and no thread changes.

    A server that is still booting a worker, waking a pool at its first
    request or running a hook that pins changes its threads and masks by
    itself; a snapshot taken then would blame the run for it.
    """
    import urllib.request

    port = free_port()
    log = open(tmp_path / f"{name}.log", "wb")
    proc = subprocess.Popen([str(a).format(port=port) for a in argv], cwd=USERAPP, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    last, stable_since = None, None
    while time.monotonic() < deadline:
        try:
            # Enough requests that every worker has served some (its pools are up).
            for _ in range(8):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10):
                    pass
        except OSError:
            time.sleep(0.2)
            continue
        kids = [c for c in psutil.Process(proc.pid).children() if "resource_tracker" not in " ".join(c.cmdline())]
        now = masks(proc.pid) if len(kids) >= 2 else None
        if now is not None and now == last:
            if time.monotonic() - stable_since >= 1.0:
                return proc, port
        else:
            last, stable_since = now, time.monotonic()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"{name} did not settle: {(tmp_path / f'{name}.log').read_text()[-2000:]}")


def moved(before, now):
    """Whether a thread that was there before is now on other CPUs (new threads do not count)."""
    return any(now[tid] != cpus for tid, cpus in before.items() if tid in now)


def given_back(before, after, master):
    """Every surviving thread has its mask back; a thread born since has its process's former main mask."""
    kept = {tid: cpus for tid, cpus in after.items() if tid in before}
    assert kept, "no thread of the server survived"
    assert kept == {tid: before[tid] for tid in kept}
    born = set(after) - set(before)
    assert all(after[tid] == before[master] for tid in born), {tid: after[tid] for tid in born}


def _stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def uvicorn_server(model_env, tmp_path_factory):
    """One running uvicorn for the tests that measure it and must leave it as it was (each checks it did)."""
    proc, port = _start([sys.executable, "-m", "uvicorn", "asgi_app:app", "--workers", "2", "--host", "127.0.0.1",
                         "--port", "{port}", "--no-access-log"], model_env, tmp_path_factory.mktemp("uvicorn"),
                        "uvicorn")
    yield proc, port
    _stop(proc)


@pytest.fixture
def gunicorn_server(model_env, tmp_path):
    import gunicorn.config

    quiet = ["--no-control-socket"] if hasattr(gunicorn.config, "ControlSocketDisable") else []
    # A plain server: an empty config, so Gunicorn does not read the hooks' ./gunicorn.conf.py.
    plain = tmp_path / "plain.conf.py"
    plain.write_text("")
    proc, port = _start([sys.executable, "-m", "gunicorn", "-c", plain, "-w", "2", "-b", "127.0.0.1:{port}", *quiet,
                         "wsgi_app:application"], model_env, tmp_path, "gunicorn")
    yield proc, port
    _stop(proc)


@pytest.fixture
def hooked_gunicorn_server(model_env, tmp_path):
    """Gunicorn as the user runs it with tuna_lab's hooks (tests/userapp/gunicorn.conf.py): pinned already."""
    proc, port = _start([sys.executable, "-m", "gunicorn", "-b", "127.0.0.1:{port}", "wsgi_app:application"],
                        model_env, tmp_path, "gunicorn-hooked")
    yield proc, port
    _stop(proc)


# -- a user's app that tuna_lab starts --------------------------------------------------------------

def _watch_worker_masks(seen, stop):
    """Until ``stop``: every Cpus_allowed_list the workers of this process's Gunicorn servers have, by policy.

    Read from /proc, apart from the library; the policy is in the config's name (``gunicorn-POLICY.conf.py``).
    """
    while not stop.is_set():
        for proc in psutil.Process().children(recursive=True):
            try:
                conf = next((a for a in proc.cmdline() if a.endswith(".conf.py")), "")
                if "gunicorn" not in " ".join(proc.cmdline()) or not os.path.basename(conf).startswith("gunicorn-"):
                    continue
                policy = os.path.basename(conf)[len("gunicorn-"):-len(".conf.py")]
                seen.setdefault(policy, set()).update(masks(proc.pid).values())
            except (psutil.Error, OSError):
                pass
        stop.wait(0.2)


def test_run_app_records_cfs_and_tuna_with_server_timing_that_report_reads(model_env, body, tmp_path):
    import threading

    out = tmp_path / "results"
    # The user's config holds the three-line integration, which names tuna-scatter: under cfs it must still
    # place nothing (the kernel places), and only time the requests.
    seen, stop = {}, threading.Event()
    watcher = threading.Thread(target=_watch_worker_masks, args=(seen, stop), daemon=True)
    watcher.start()
    try:
        r = cli("run", "--app", "timed_app:application", "--app-dir", USERAPP, "-w", 2, "-t", 2,
                "--server-conf", USERAPP / "gunicorn.conf.py",
                "--policies", "cfs,tuna-scatter", "--trials", 1, "--requests", 40, "--concurrency", 2,
                "--body", body, "--out", out, "--json", env=model_env)
    finally:
        stop.set()
        watcher.join(10)
    assert r.returncode == 0, r.stderr
    cell = Path(json.loads(r.stdout)["path"])
    full = {format_cpulist(json.loads((cell / "manifest.json").read_text())["client_cpus"]["server_cpus"])}
    assert seen.get("cfs") and seen["cfs"] == full, seen
    assert seen.get("tuna-scatter") and seen["tuna-scatter"] != full, seen      # the watcher sees pinning
    threads = pd.read_parquet(cell / "threads.parquet")
    assert set(threads.loc[threads["policy"].eq("cfs"), "cpus"]) == full, threads[["policy", "role", "cpus"]]
    doc = json.loads(r.stdout)
    assert {row["policy"] for row in doc["summary"]} == {"cfs", "tuna-scatter"}
    assert "Server-Timing" in doc["latency"]
    assert doc["target"]["kind"] == "app" and doc["target"]["server"] == "gunicorn"
    assert "xgboost" in doc["target"]["runtimes"] and "libgomp" in doc["target"]["runtimes"]
    trials = pd.read_parquet(Path(doc["path"]) / "trials.parquet")
    assert set(trials["latency"]) == {"server-timing"} and (trials["trial_status"] == "ok").all()
    requests = pd.read_parquet(Path(doc["path"]) / "requests.parquet")
    ok = requests[requests["status"] == 200]
    # The header's milliseconds, as seconds, and never more than the client saw.
    assert ok["server_seconds"].notna().all()
    assert (ok["server_seconds"] <= ok["client_seconds"]).all()
    # Each request's scheduler evidence, under cfs (no hooks: the timing alone) as under the pinned policy.
    for policy in ("cfs", "tuna-scatter"):
        waits = ok.loc[ok["policy"] == policy, "rq_wait"]
        assert len(waits) and waits.notna().all(), policy
    rep = cli("report", out, "-o", tmp_path / "report.html", "--json", env=model_env)
    assert rep.returncode == 0, rep.stderr
    assert (tmp_path / "report.html").stat().st_size > 1000


def test_every_response_a_500_makes_the_trial_invalid_and_the_run_says_so(model_env, tmp_path):
    r = cli("run", "--app", "timed_app:application", "--app-dir", USERAPP, "-w", 1, "-t", 1, "--path", "/fail",
            "--policies", "cfs", "--trials", 1, "--requests", 10, "--concurrency", 2, env=model_env)
    # Something ran, and the one policy has no valid trial: exit 1, with one line saying so.
    assert r.returncode == 1, r.stderr
    assert "tuna-lab: error: no valid trial of cfs" in r.stderr
    assert "no successful trials" in r.stdout
    assert "failed: cfs trial 1: 10 of 10 requests failed" in r.stdout


def test_a_server_timing_that_does_not_parse_is_ignored_with_one_warning(model_env, tmp_path):
    r = cli("run", "--app", "timed_app:application", "--app-dir", USERAPP, "-w", 1, "-t", 1, "--path", "/garbled",
            "--policies", "cfs", "--trials", 2, "--requests", 10, "--concurrency", 2, env=model_env)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("Server-Timing headers that do not parse") == 1, r.stderr
    assert "client-side" in r.stdout


def test_sweep_app_runs_each_cell_resumes_and_report_and_advise_read_it(model_env, body, tmp_path):
    out = tmp_path / "sweep"
    argv = ["sweep", "--app", "timed_app:application", "--app-dir", USERAPP, "--configs", "1x1,1x2,2x1,3x1",
            "--policies", "cfs,tuna-scatter", "--trials", 1, "--requests", 40, "--concurrency", 4, "--body", body,
            "--out", out, "--json"]
    r = cli(*argv, env=model_env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    cells = sorted(os.path.basename(c) for c in doc["done"])
    assert cells == ["w1-t1-timed_app", "w1-t2-timed_app", "w2-t1-timed_app", "w3-t1-timed_app"]
    manifest = json.loads((out / "w1-t2-timed_app" / "manifest.json").read_text())
    assert manifest["target"]["kind"] == "app" and manifest["config"]["threads"] == 2
    again = json.loads(cli(*argv, env=model_env).stdout)
    assert again["done"] == [] and len(again["skipped"]) == 4
    assert cli("report", out, "-o", tmp_path / "r.html", env=model_env).returncode == 0
    advice = cli("advise", "-w", 2, "-t", 1, "--model", "timed_app", out, "--json", env=model_env)
    assert advice.returncode == 0, advice.stderr
    rec = json.loads(advice.stdout)
    assert rec["model"] == "timed_app" and rec["batch"] == 0 and rec["best_policy"] == "tuna-scatter"
    unknown = cli("advise", "-w", 2, "-t", 1, "--model", "other_app", out, env=model_env)
    assert unknown.returncode == 2 and "no app of that label (measured: timed_app)" in unknown.stderr


@pytest.mark.parametrize("args, match", [
    (("--pid", 1), "a running server keeps its workers and threads"),
    (("--app", "timed_app:application", "--models", "small"), "--models is for the lab server"),
    (("--app", "timed_app:application", "--cluster", "local"), "sweep it without --cluster"),
    (("--app", "nomodule:app"), "no module nomodule"),
    (("--body", "x.json"), "--body is for your own server"),
])
def test_sweep_bad_target_input_is_one_line(model_env, tmp_path, args, match):
    r = cli("sweep", "--configs", "1x1", "--app-dir", USERAPP, *args, "--out", tmp_path / "s", env=model_env) \
        if "--app" in args else cli("sweep", "--configs", "1x1", *args, "--out", tmp_path / "s", env=model_env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and match in r.stderr, r.stderr
    assert not (tmp_path / "s").exists()


# -- a server that is already running ---------------------------------------------------------------

def test_attached_server_is_measured_live_and_ends_with_its_masks(uvicorn_server, model_env, tmp_path):
    proc, port = uvicorn_server
    before = masks(proc.pid)
    out = tmp_path / "results"
    r = cli("run", "--pid", proc.pid, "--url", f"http://127.0.0.1:{port}/", "-t", 2,
            "--policies", "cfs,round-robin", "--trials", 2, "--requests", 80,
            "--sample-hz", 200, "--out", out, "--json", env=model_env)
    # --pid's default concurrency (2 per worker) and two trials: the workers share one socket, and a trial the
    # kernel gave one worker nearly every connection of is refused as not measuring every worker (issue 47);
    # with 2 connections and 1 trial that failed a CI run once (so do the other attached runs below).
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {row["policy"] for row in doc["summary"]} == {"cfs", "round-robin"}
    assert doc["target"]["kind"] == "attached" and doc["target"]["server"] == "uvicorn"
    # No hook sends its scheduler counters per request: they are sampled (issue 50), and the results say so.
    assert doc["target"]["sched_evidence"] == "sampled at 200 Hz" and doc["target"]["sample_hz"] == 200
    requests = pd.read_parquet(Path(doc["path"]) / "requests.parquet")
    trials = pd.read_parquet(Path(doc["path"]) / "trials.parquet")
    ok = requests[requests["status"] == 200]
    assert len(ok) and ok[["rq_wait", "rq_wait_main", "cpu_main", "switches_voluntary"]].notna().all().all()
    assert set(trials["sched_evidence"]) == {"sampled at 200 Hz"} and (trials["sched_sampler_cpu_seconds"] > 0).all()
    from tuna_lab.analysis.anatomy import anatomy_note

    assert "sampled at 200 Hz" in anatomy_note(requests, trials)
    assert "client-side" in doc["latency"]
    assert proc.poll() is None, "the server was never to be stopped"
    given_back(before, masks(proc.pid), proc.pid)
    assert cli("report", out, "-o", tmp_path / "r.html", env=model_env).returncode == 0
    # tune on the same running server: it keeps its W and T, so only the policies race, and it says so.
    # One round of short steps: the race is not the subject here (test_tune's is), and the round, not the
    # budget, ends it; the budget's margin is for round-robin's run, which pins the server.
    before = masks(proc.pid)
    t = cli("tune", "--sla-p99", "500ms", "--pid", proc.pid, "--url", f"http://127.0.0.1:{port}/", "-t", 2,
            "--policies", "cfs,round-robin", "--budget", "30s", "--step-seconds", "0.25", "--rounds", "1",
            "--out", tmp_path / "tune", "--json", env=model_env)
    assert t.returncode == 0, t.stderr
    doc = json.loads(t.stdout)
    assert {c["candidate"] for c in doc["candidates"]} == {"2x2 cfs", "2x2 round-robin"}
    assert all(c["rounds"] == 1 for c in doc["candidates"]), doc["candidates"]       # round-robin pinned it too
    assert "only the policies were searched" in doc["note"] and doc["winner"]["workers"] == 2
    assert proc.poll() is None
    given_back(before, masks(proc.pid), proc.pid)


def test_attached_server_gets_its_masks_back_after_sigint_mid_trial(uvicorn_server, model_env, tmp_path):
    proc, port = uvicorn_server
    before = masks(proc.pid)
    run = subprocess.Popen([sys.executable, "-m", "tuna_lab", "run", "--pid", str(proc.pid), "--url",
                            f"http://127.0.0.1:{port}/", "-t", "2", "--policies", "round-robin,tuna-scatter",
                            "--trials", "3", "--requests", "400", "--concurrency", "1"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=model_env,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # Mid-trial: the first policy's pins are in place (some worker thread's mask changed).
    deadline = time.monotonic() + 60
    while not moved(before, masks(proc.pid)) and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.05)
    assert moved(before, masks(proc.pid)), "the run never pinned anything"
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    given_back(before, masks(proc.pid), proc.pid)
    assert proc.poll() is None


def test_attached_server_gets_its_masks_back_after_a_worker_is_killed_mid_trial(gunicorn_server, model_env):
    proc, port = gunicorn_server
    before = masks(proc.pid)
    master_cpus = before[proc.pid]
    run = subprocess.Popen([sys.executable, "-m", "tuna_lab", "run", "--pid", str(proc.pid), "--url",
                            f"http://127.0.0.1:{port}/", "-t", "2", "--policies", "round-robin",
                            "--trials", "1", "--requests", "150", "--concurrency", "1", "--max-error-rate", "0.5"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=model_env)
    deadline = time.monotonic() + 60
    while not moved(before, masks(proc.pid)) and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.05)
    assert moved(before, masks(proc.pid)), "the run never pinned anything"
    victim = psutil.Process(proc.pid).children()[0]
    victim.kill()
    out, err = run.communicate(timeout=120)
    # The one trial had a worker replaced: invalid, and round-robin has no valid trial (exit 1).
    assert run.returncode == 1 and "1 worker replaced during the trial" in err, err
    after = masks(proc.pid)
    # Every thread that was there gets exactly its mask back; the replacement worker has the master's.
    given_back(before, after, proc.pid)
    assert after[proc.pid] == master_cpus
    assert proc.poll() is None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a mask of one CPU out of several needs 2 CPUs")
def test_attached_server_keeps_the_masks_the_user_set_and_leaves_no_pin_records(gunicorn_server, model_env):
    """``taskset -p -c LAST WORKER`` before ``run --pid``: cfs measures within it, and it is given back exactly;
    the run's pin records go with it, so a later ``unpin`` has nothing to undo."""
    proc, port = gunicorn_server
    user = psutil.Process(proc.pid).children()[0].pid
    last = sorted(os.sched_getaffinity(0))[-1:]
    os.sched_setaffinity(user, last)                          # the user's mask on a worker's main thread
    before = masks(proc.pid)
    r = cli("run", "--pid", proc.pid, "--url", f"http://127.0.0.1:{port}/", "-t", 2,
            "--policies", "cfs,round-robin", "--trials", 2, "--requests", 80, "--json", env=model_env)
    assert r.returncode == 0, r.stderr
    assert {row["policy"] for row in json.loads(r.stdout)["summary"]} == {"cfs", "round-robin"}
    after = masks(proc.pid)
    assert {t: c for t, c in after.items() if t in before} == {t: c for t, c in before.items() if t in after}
    assert after[user] == before[user]
    done = cli("unpin", "--pid", proc.pid, env=model_env)
    assert done.returncode == 0 and "nothing to unpin" in done.stdout and "warning" not in done.stderr, \
        (done.stdout, done.stderr)
    assert masks(proc.pid) == after


def test_a_server_pinned_by_the_hooks_is_measured_and_keeps_its_pins(hooked_gunicorn_server, model_env):
    proc, port = hooked_gunicorn_server
    before = masks(proc.pid)
    assert any("-" not in cpus for cpus in before.values()), "the hooks pinned nothing"
    r = cli("run", "--pid", proc.pid, "--url", f"http://127.0.0.1:{port}/", "-t", 2, "--policies", "cfs,round-robin",
            "--trials", 2, "--requests", 80, "--json", env=model_env)
    assert r.returncode == 0, r.stderr
    # cfs measured the server as it was deployed (the hooks' pins are its own masks: no run of tuna_lab set
    # them); round-robin pinned it live, and the hooks' pins are back afterwards, with nothing left recorded.
    assert masks(proc.pid) == before
    done = cli("unpin", "--pid", proc.pid, env=model_env)
    assert done.returncode == 0 and "nothing to unpin" in done.stdout, (done.stdout, done.stderr)


def test_live_widget_measures_a_running_server_and_gives_its_masks_back(uvicorn_server, model_env):
    from tuna_lab.measure.attached import AttachedTarget
    from tuna_lab.widgets.live import LiveExperiment

    proc, port = uvicorn_server
    before = masks(proc.pid)
    live = LiveExperiment(None, None, policies=["cfs", "round-robin"], trials=2, requests=20,
                          target=AttachedTarget(proc.pid, f"http://127.0.0.1:{port}/", 2))
    assert live.start()
    assert live.wait(timeout=180)
    assert live.state == "finished", (live.state, live.error)
    assert sorted(live.results()["policy"]) == ["cfs", "cfs", "round-robin", "round-robin"]
    assert live.result.manifest["target"]["kind"] == "attached"
    given_back(before, masks(proc.pid), proc.pid)
    # Stopped between trials: the server is given its masks back too.
    live = LiveExperiment(None, None, policies=["round-robin", "tuna-scatter"], trials=3, requests=20,
                          target=AttachedTarget(proc.pid, f"http://127.0.0.1:{port}/", 2))
    live.subscribe(lambda *_: live.stop(wait=False) if len(live.results()) else None)
    live.start()
    assert live.wait(timeout=180)
    assert live.state == "stopped" and 1 <= len(live.results()) < 6
    given_back(before, masks(proc.pid), proc.pid)


# -- bad input: one line, exit 2, no mask changed ---------------------------------------------------

def test_bad_input_is_one_line_and_changes_no_mask(uvicorn_server, model_env, tmp_path):
    proc, port = uvicorn_server
    before = masks(proc.pid)
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        cases = [
            ("--pid", proc.pid, "--url", f"http://127.0.0.1:{free_port()}/", "-t", 2),     # refuses connections
            ("--pid", sleeper.pid, "--url", f"http://127.0.0.1:{port}/", "-t", 2),         # no children
            ("--pid", proc.pid, "--url", f"http://127.0.0.1:{port}/", "-t", 2, "--body", tmp_path / "missing.json"),
            ("--pid", proc.pid, "--url", f"http://127.0.0.1:{port}/", "-t", 2, "--bodies", tmp_path),  # a folder
            ("--pid", proc.pid, "-t", 2),                                                   # no --url
        ]
        for args in cases:
            r = cli("run", *args, "--policies", "cfs,round-robin", "--trials", 1, "--requests", 5, env=model_env)
            assert r.returncode == 2, (args, r.stderr)
            assert len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)
            assert r.stdout == ""
            assert masks(proc.pid) == before, args
    finally:
        sleeper.kill()
        sleeper.wait()
