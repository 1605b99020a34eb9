"""``tuna-lab run/tune --app --python PATH``: the user's app served by the user's own interpreter (their venv).

The "user's venv" is a real venv made here from this venv's base interpreter,
without pip: a ``.pth`` gives it this environment's packages (gunicorn,
XGBoost, psutil) but not tuna_lab, whose editable install is a ``.pth`` of
its own that a path listed in another ``.pth`` does not run. So the venv can
serve the app, and tuna_lab is importable there only if ``run`` makes it so.
The app records, as it is imported, which interpreter's ``sys.prefix`` it runs
under.
"""

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

import helpers

CPUS = sorted(os.sched_getaffinity(0))

APP = '''\
import os, sys
import xgboost  # noqa: F401  (loads libgomp, as a model server does)

with open(os.environ["PREFIX_LOG"], "a") as fh:
    fh.write(f"{os.getpid()} {sys.prefix}\\n")


def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "2")])
    return [b"ok"]
'''


def cli(*args, env=None, timeout=240):
    # Run from a folder without tuna_lab's source in it, as a user runs it; in this process (the servers it
    # starts, in the venv, are what is under test, not tuna-lab's own process).
    return helpers.main(*args, env=env, timeout=timeout, cwd=Path(__file__).parent / "userapp")


def make_venv(base, folder):
    """A venv of interpreter ``base`` at ``folder`` that sees this environment's packages but not tuna_lab."""
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(folder)], check=True, timeout=60)
    purelib = subprocess.run([str(folder / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path("
                              "'purelib'))"], capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "this-env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return folder / "bin" / "python"


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    base = getattr(sys, "_base_executable", sys.executable)
    python = make_venv(base, tmp_path_factory.mktemp("user") / "venv")
    # What makes the test mean something: the venv serves (gunicorn, XGBoost) but has no tuna_lab of its own.
    has = subprocess.run([str(python), "-c", "import gunicorn, xgboost, psutil\ntry:\n import tuna_lab\nexcept "
                          "ImportError:\n print('no tuna_lab')"], capture_output=True, text=True, timeout=60,
                         cwd=python.parent)
    assert has.stdout.strip() == "no tuna_lab", has.stderr
    return python


@pytest.fixture
def app(tmp_path):
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "venvapp.py").write_text(APP)
    (folder / "broken.py").write_text("import no_such_module_of_the_user\napplication = None\n")
    return folder


@pytest.mark.skipif(len(CPUS) < 2, reason="pinning W=2 x T=2 needs 2 CPUs")
def test_the_app_runs_in_the_given_interpreter_and_is_pinned_there(venv, app, tmp_path):
    log = tmp_path / "prefixes"
    env = {**os.environ, "PREFIX_LOG": str(log)}
    r = cli("run", "--app", "venvapp:application", "--app-dir", app, "--python", venv, "-w", 2, "-t", 2,
            "--policies", "cfs,round-robin", "--trials", 1, "--requests", 20, "--concurrency", 2,
            "--out", tmp_path / "out", "--json", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["target"]["python"] == str(venv)
    assert doc["target"]["command"][0] == str(venv)
    # round-robin pinned through tuna_lab's hooks, which ran inside the venv's workers: its trial is valid.
    assert {row["policy"] for row in doc["summary"]} == {"cfs", "round-robin"}
    # Every process that imported the app (the check, then each trial's W workers) ran under the venv.
    prefixes = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    assert len(prefixes) >= 1 + 2 * 2
    assert set(prefixes) == {str(venv.parent.parent)}


def test_tune_starts_each_candidates_app_in_the_given_interpreter(venv, app, tmp_path):
    """``tune --app --python``: not only the import check, every candidate's server runs under the venv."""
    log = tmp_path / "prefixes"
    env = {**os.environ, "PREFIX_LOG": str(log)}
    r = cli("tune", "--sla-p99", "2s", "--app", "venvapp:application", "--app-dir", app, "--python", venv,
            "--configs", "1x1", "--policies", "cfs", "--budget", "20s", "--rounds", 1, "--step-seconds", 0.25,
            "--json", env=env)
    assert r.returncode == 0, r.stderr
    # The import check, then the candidate's worker (at least one start): each under the venv's prefix.
    prefixes = [line.split(" ", 1)[1] for line in log.read_text().splitlines()]
    assert len(prefixes) >= 2, prefixes
    assert set(prefixes) == {str(venv.parent.parent)}


def test_an_app_that_does_not_import_there_is_one_line_with_the_interpreters_error(venv, app, tmp_path):
    r = cli("run", "--app", "broken:application", "--app-dir", app, "--python", venv, "-w", 1, "-t", 1,
            "--policies", "cfs", "--trials", 1, "--requests", 5, "--out", tmp_path / "out")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"tuna-lab: error: --app broken:application does not import in {venv}: "
        "ModuleNotFoundError: No module named 'no_such_module_of_the_user'"]
    assert not (tmp_path / "out").exists()                      # nothing was measured


def test_a_path_that_is_no_interpreter_is_refused_in_one_line(app, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\necho 'not python' >&2\nexit 7\n")
    script.chmod(0o755)
    for path, says in ((text, "no executable file there"), (tmp_path / "none", "no executable file there"),
                       (script, "is no Python interpreter tuna_lab can use (exit status 7: not python)")):
        r = cli("run", "--app", "venvapp:application", "--app-dir", app, "--python", path, "-w", 1, "-t", 1,
                "--policies", "cfs", "--trials", 1, "--requests", 5)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert says in r.stderr, r.stderr


def test_python_is_for_an_app_tuna_lab_starts(app):
    r = cli("run", "--pid", os.getpid(), "--url", "http://127.0.0.1:9/", "-t", 1, "--python", sys.executable)
    assert r.returncode == 2 and "--python is for --app" in r.stderr, r.stderr
    r = cli("run", "-w", 1, "-t", 1, "--python", sys.executable)
    assert r.returncode == 2 and "--python is for your own server" in r.stderr, r.stderr


OLD = Path.home() / ".pyenv" / "versions"


@pytest.mark.skipif(not list(OLD.glob("3.10.*/bin/python3.10")), reason="no Python 3.10 here to be refused")
def test_an_interpreter_too_old_for_the_hooks_is_refused_with_its_version(app, tmp_path):
    old = sorted(OLD.glob("3.10.*/bin/python3.10"))[-1]
    python = make_venv(old, tmp_path / "venv310")
    r = cli("run", "--app", "venvapp:application", "--app-dir", app, "--python", python, "-w", 1, "-t", 1,
            "--policies", "cfs", "--trials", 1, "--requests", 5)
    assert r.returncode == 2, r.stderr
    version = subprocess.run([str(python), "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert r.stderr.strip().splitlines() == [
        f"tuna-lab: error: {python} is Python {version}: tuna_lab's Gunicorn hooks run in the app's workers "
        "and need Python 3.11 or newer"], r.stderr
