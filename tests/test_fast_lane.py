"""The fast lane's rule (issue 48): `make test-fast` starts no server, and says so by failing.

conftest.py (at the root) holds the rule; these tests run it on a few tests of their own, in a pytest of
their own with TUNA_LAB_FAST_LANE=1, as the Makefile's lane runs it: a test that starts a server fails with
the one sentence that says what to do, whether it starts the server itself or a process it runs does,
and a test marked `server` is left out.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Each test of the little suite: what it does, and what the lane must make of it.
SUITE = '''
import subprocess, sys, time

import pytest

LISTENER = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
            "print('up', flush=True); time.sleep(30)")


def test_gunicorn_here():
    # Refused before the fork: `--version` would exit at once, yet no Gunicorn runs at all.
    subprocess.run([sys.executable, "-m", "gunicorn", "--version"], check=True)


def test_gunicorn_swallowed():
    # Code under test that takes every Exception does not hide the refusal either.
    try:
        subprocess.run([sys.executable, "-m", "uvicorn", "--version"], check=True)
    except Exception:
        pass


def test_listener_further_down():
    # A process the test runs starts the server (as `tuna-lab run` starts Gunicorn): seen as it listens.
    outer = "import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1]])"
    child = subprocess.Popen([sys.executable, "-c", outer, LISTENER], stdout=subprocess.PIPE, text=True)
    time.sleep(1.5)
    child.kill()
    child.wait()


@pytest.mark.server
def test_marked():
    subprocess.run([sys.executable, "-m", "gunicorn", "--version"], check=True)


def test_plain_child():
    # A process that serves nothing (a CLI, a plan) is not a server.
    subprocess.run([sys.executable, "-c", "print('gunicorn')"], check=True)
'''


# It starts a listening process itself (the little suite's grandchild): `make test` runs it, not the lane.
@pytest.mark.server
def test_lane_fails_each_server_start_and_leaves_out_the_marked(tmp_path):
    (tmp_path / "conftest.py").write_text(
        f"exec(compile(open({str(ROOT / 'conftest.py')!r}).read(), {str(ROOT / 'conftest.py')!r}, 'exec'))\n")
    (tmp_path / "test_suite.py").write_text(SUITE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "TUNA_LAB_"))}
    env["TUNA_LAB_FAST_LANE"] = "1"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-m", "not server", "-rf", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert re.search(r"3 failed, 1 passed, 1 deselected", out), out
    for name in ("test_gunicorn_here", "test_gunicorn_swallowed", "test_listener_further_down"):
        assert f"FAILED test_suite.py::{name}" in out, (name, out)
    assert out.count("this test starts a server: mark it `server` or move it out of the fast lane") >= 3, out
    assert "listening on a TCP port" in out, out


def test_makefile_lane_sets_the_rule():
    # The rule holds only where the lane asks for it: the variable set and the marked tests deselected.
    recipe = re.search(r"^test-fast:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert "TUNA_LAB_FAST_LANE=1" in recipe and '-m "not server"' in recipe, recipe
