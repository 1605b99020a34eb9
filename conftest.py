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


# ---------------------------------------------------------------------------------------------------------
# The whole-experiment lane (`make test-e2e`; CI runs it after `make test`, which leaves it out to stay within
# ten minutes on 2 cores). These tests each run a whole experiment against real servers - a run, sweep, tune or
# the demo end to end, a fault planted mid-trial, a Dask cluster, every export applied to a running server of
# each runtime, the load generator's race with wrk - for 10-100 s each; `make test` keeps at least one server
# test of every kind (start, pin, status, audit, a short trial), so a break there still shows in minutes.
# A table rather than a decorator on each test: the lane's whole content is read here, in one place.
E2E_FILES = frozenset({
    "tests/test_exports.py", "tests/test_faults.py", "tests/test_cluster.py", "tests/test_targets.py",
    "tests/test_tune.py", "tests/test_python_option.py", "tests/test_field_measure.py",
    "tests/test_client_cpus.py", "tests/test_load_bench.py",
})
E2E_TESTS = frozenset({
    "tests/test_analysis.py::test_demo_says_under_its_speedups_what_this_machine_can_show",
    "tests/test_experiment.py::test_each_run_is_on_disk_as_it_finishes_and_the_partial_cell_goes_once_the_cell_is_written",
    "tests/test_experiment.py::test_run_records_a_relaxed_tuna_mapping_once_per_cell",
    "tests/test_widgets.py::test_static_draws_the_figure_as_a_png_of_its_own_size",
    "tests/test_widgets.py::test_live_experiment_collects_trial_rows",
    "tests/test_hostile_results.py::test_report_replaces_its_own_report",
    "tests/test_hostile_results.py::test_skip_unreadable_goes_on_and_says_which_cells_were_left_out",
    "tests/test_hostile.py::test_a_sweep_resumed_over_a_corrupt_cell_redoes_it_or_refuses",
    "tests/test_cli.py::test_run_json_has_the_summary_and_the_files",
    "tests/test_cli.py::test_report_json_has_the_path_and_headline_speedups",
    "tests/test_pin.py::test_hooks_under_gunicorns_user_setting_hand_their_state_folder_to_that_user",
    "tests/test_pin.py::test_watch_pins_a_replacement_within_1s_of_its_pool_and_says_each_thing_once",
})


def pytest_collection_modifyitems(config, items):
    e2e = pytest.mark.e2e
    for item in items:
        path, _, name = item.nodeid.partition("::")
        if path in E2E_FILES or f"{path}::{name.split('[')[0]}" in E2E_TESTS:
            item.add_marker(e2e)


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: runs a whole experiment against real servers; `make test-e2e` runs "
                                       "it, `make test` leaves it out (conftest.E2E_FILES, E2E_TESTS)")
    config.addinivalue_line("markers", "alone: runs with no other test running (it measures time or CPU, "
                                       "or asserts the absence of foreign load)")
    config.addinivalue_line("markers", "server: starts a server process (Gunicorn, Uvicorn, any process that "
                                       "listens on a TCP port); `make test-fast` leaves it out")
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


# ---------------------------------------------------------------------------------------------------------
# The fast lane (`make test-fast`, which sets TUNA_LAB_FAST_LANE=1 and deselects `-m "not server"`) starts
# no server: a server's start (a model loaded in every worker, a readiness wait) is what made the lane slow,
# and a hand-kept list of files to leave out drifted as soon as a new file started one. So the rule is
# checked, not kept: in the lane, a test that starts a server process fails, whoever starts it.
# * In this process, an audit hook sees every subprocess launch (helpers.ProcessGroup, Server.start,
#   the measure targets, the trivial endpoint) and refuses a server's command line before it is forked.
# * Further down (a `tuna-lab` process the test runs, which starts Gunicorn), a watcher looks at this
#   process's descendants while each test runs: one running a server program or listening on a TCP socket
#   fails the test. A listening socket is what makes a server, whatever its command line.
_FAST_LANE = "TUNA_LAB_FAST_LANE"
SERVER_REFUSAL = "this test starts a server: mark it `server` or move it out of the fast lane"
#: The server programs, as a command (argv[0]'s name) or as ``python -m NAME``.
SERVER_PROGRAMS = frozenset({"gunicorn", "uvicorn", "hypercorn", "granian", "daphne", "waitress-serve",
                             "mlserver", "litserve", "bentoml"})
#: What a ``python -c CODE`` server says in its code (the trivial endpoint, an http.server).
_SERVER_CODE = ("serve_trivial", "serve_forever", "uvicorn.run")
_WATCH_INTERVAL = 0.2
_current = {"item": None}


class ServerStarted(BaseException):
    """A server started in the fast lane (a BaseException: no ``except Exception`` in the code under test hides it)."""


def server_command(argv):
    """What in ``argv`` makes it a server's command line (a short description), else None.

    Examples
    --------
    >>> server_command(["/venv/bin/python", "-m", "gunicorn", "app:app"])
    'python -m gunicorn'
    >>> server_command(["python", "-m", "tuna_lab", "plan", "--format", "gunicorn"]) is None
    True
    """
    if isinstance(argv, (str, bytes, os.PathLike)):
        argv = [argv]
    words = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in argv]
    if not words:
        return None
    program = os.path.basename(words[0]).removesuffix(".py")
    if program in SERVER_PROGRAMS:
        return program
    for flag, value in zip(words, words[1:]):
        if flag == "-m" and value.split(".")[0] in SERVER_PROGRAMS:
            return f"python -m {value}"
        if flag == "-c" and any(mark in value for mark in _SERVER_CODE):
            return f"python -c '{next(m for m in _SERVER_CODE if m in value)}...'"
    return None


def _refuse_servers(event, args):
    """The audit hook: a server's launch from this process raises :class:`ServerStarted` (and is recorded)."""
    if event == "subprocess.Popen":
        argv = args[1]
        if isinstance(argv, (str, bytes)):        # shell=True, or one program without arguments
            argv = argv.split() if isinstance(argv, str) else [argv]
    elif event == "os.posix_spawn":
        argv = args[1]
    else:
        return
    what = server_command(argv)
    if what is None:
        return
    message = f"{SERVER_REFUSAL} (it ran {what})"
    item = _current["item"]
    if item is not None:
        item._tuna_lab_servers.append(message)
    raise ServerStarted(message)


def _listening(proc):
    """Whether ``proc`` holds a listening TCP socket (False where it is gone or not ours to read)."""
    try:
        return any(c.status == "LISTEN" for c in proc.net_connections(kind="tcp"))
    except Exception:          # psutil's NoSuchProcess/AccessDenied, or a process that ended mid-read
        return False


def _watch(stop, found):
    """Until ``stop`` is set, add to ``found`` each descendant of this process that is a server."""
    import psutil

    me, seen = psutil.Process(), set()
    while not stop.wait(_WATCH_INTERVAL):
        try:
            kids = me.children(recursive=True)
        except psutil.Error:
            continue
        for kid in kids:
            if kid.pid in seen:
                continue
            try:
                argv = kid.cmdline()
            except psutil.Error:
                continue
            what = server_command(argv) or ("a process listening on a TCP port" if _listening(kid) else None)
            if what:
                seen.add(kid.pid)
                found.append(f"{SERVER_REFUSAL} (PID {kid.pid}, {what}: {' '.join(argv)[:200]})")


if os.environ.get(_FAST_LANE) == "1":
    import sys
    import threading

    sys.addaudithook(_refuse_servers)

    # Named apart from the machine lock's pytest_runtest_protocol above (both wrap each test); pytest reads
    # only names that begin with pytest_.
    @pytest.hookimpl(hookwrapper=True, specname="pytest_runtest_protocol")
    def pytest_runtest_protocol_fast_lane(item, nextitem):
        item._tuna_lab_servers, item._tuna_lab_reported = [], 0
        stop = threading.Event()
        watcher = threading.Thread(target=_watch, args=(stop, item._tuna_lab_servers), daemon=True)
        _current["item"] = item
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()
            _current["item"] = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item, call):
        report = (yield).get_result()
        found = getattr(item, "_tuna_lab_servers", None)
        if found is None or (call.when == "setup" and report.passed):
            return                 # a server a fixture started is said with the call's report
        new = found[item._tuna_lab_reported:]
        item._tuna_lab_reported = len(found)
        if new and not report.failed:
            # Also where the code under test swallowed the refusal, or the server was a grandchild.
            report.outcome = "failed"
            report.longrepr = "\n".join(dict.fromkeys(new))
