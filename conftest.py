"""Settings for every pytest run here: the tests (their fixtures are in tests/conftest.py), the notebooks
(nbval) and ``pytest --doctest-modules tuna_lab/...``."""

import fcntl
import os
import shutil
import tempfile

import pytest

# Gunicorn's config reads the launcher's plan when imported: only a server started by the launcher may import it.
collect_ignore = ["tuna_lab/server/gunicorn_conf.py"]


# ---------------------------------------------------------------------------------------------------------
# `make test` runs the suite in two pytest-xdist workers (-n 2 --dist loadfile): most tests wait on servers,
# sockets and child processes more than they compute, so two at a time use the two CPUs that one leaves
# half idle. Two things keep the workers from measuring each other:
# * each worker has its own CPU-lock folder (TUNA_LAB_LOCK_DIR), so one's measurement does not wait on, or
#   with TUNA_LAB_CPU_LOCK_WAIT=0 get refused by, the other's (what the locks are for is tested in the files
#   that set their own folder);
# * a test marked `alone` (it measures CPU time, latency or how fast something reacts, or says that no
#   foreign load is there) holds the machine lock exclusively, every other test holds it shared: an `alone`
#   test runs with no other test running.
# `make test` runs the `alone` tests in a second, plain pytest run of their own (`-m alone`), after the rest and
# the notebooks (`-m "not alone"`): the lock keeps `pytest -n 2` right when run by hand. Without xdist (plain
# `pytest`) none of this is done.
_MACHINE_LOCK = "TUNA_LAB_TEST_MACHINE_LOCK"


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: runs with no other test running (it measures time or CPU, "
                                       "or asserts the absence of foreign load)")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        if getattr(config.option, "numprocesses", None):
            # The controller: the one lock file every worker it starts inherits, in a folder of our own.
            folder = tempfile.mkdtemp(prefix="tuna-lab-tests-")
            os.environ[_MACHINE_LOCK] = os.path.join(folder, "machine.lock")
            open(os.environ[_MACHINE_LOCK], "w").close()
            config._tuna_lab_folders = [folder]
        return
    folder = tempfile.mkdtemp(prefix=f"tuna-lab-locks-{worker}-")
    os.environ["TUNA_LAB_LOCK_DIR"] = folder
    config._tuna_lab_folders = [folder]


def pytest_unconfigure(config):
    for folder in getattr(config, "_tuna_lab_folders", ()):
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get(_MACHINE_LOCK) if os.environ.get("PYTEST_XDIST_WORKER") else None
    if path is None:
        yield
        return
    # Held over setup, call and teardown: a module's server fixture starts inside its first test's hold.
    with open(path) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if item.get_closest_marker("alone") else fcntl.LOCK_SH)
        yield
