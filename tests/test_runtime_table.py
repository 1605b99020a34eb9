"""The one table of runtimes (tuna_lab.live.runtimes) and what reads it.

Real processes only: this test process's own maps (NumPy's OpenBLAS), a
child that loads XGBoost (libgomp), and a real io_uring ring whose kernel
thread (``iou-sqp-*``) joins this process.
"""

import contextlib
import ctypes
import os
import platform
import subprocess
import sys
import time

import numpy  # noqa: F401  (maps NumPy's OpenBLAS into this process)
import pytest

from tuna_lab.measure.target import worker_runtimes
from tuna_lab.live.pools import classify_threads, loaded_runtimes, main_rule
from tuna_lab.live.runtimes import (BLAS, FRAMEWORK, OPENMP, RUNTIMES, helper_thread, places_counted,
                                         pool_runtime, runtime_of, single_thread_env)
from tuna_lab.server.launch import SERVER_ENV


def test_every_record_is_whole_and_every_library_names_one_runtime():
    names = [r.name for r in RUNTIMES]
    assert len(names) == len(set(names))
    for r in RUNTIMES:
        assert r.kind in (OPENMP, BLAS, FRAMEWORK) and r.libraries and r.sizes and r.found_by
        for prefix in r.libraries:
            assert runtime_of(prefix + ".so.1") is r, prefix       # no record's prefix hides another's
    # Where the old tables disagreed: scipy's OpenBLAS is a BLAS pool, BLIS is in the manifest's names.
    assert pool_runtime("libscipy_openblas64_-ff651d7f.so").name == "openblas"
    assert runtime_of("libblis.so.4").name == "blis"
    assert pool_runtime("libxgboost.so") is None and pool_runtime("libc.so.6") is None


def test_the_lab_servers_environment_keeps_every_blas_runtime_at_one_thread():
    blas = [r for r in RUNTIMES if r.kind == BLAS]
    assert single_thread_env(BLAS) == {r.threads_env: "1" for r in blas}
    assert all(SERVER_ENV[r.threads_env] == "1" for r in blas)


def test_the_omp_proc_bind_false_rule():
    assert places_counted({"OMP_PLACES": "threads"})
    assert places_counted({"OMP_PLACES": "cores", "OMP_PROC_BIND": "close"})
    assert not places_counted({"OMP_PLACES": "threads", "OMP_PROC_BIND": " False ,close"})
    assert not places_counted({"OMP_PROC_BIND": "close"})


def test_the_manifest_and_the_main_rule_read_the_table_from_real_maps():
    # This process maps NumPy's OpenBLAS (a libscipy_openblas wheel, or a system libopenblas).
    here = worker_runtimes([os.getpid()])
    assert "openblas" in here and os.path.basename(here["openblas"]["library"]).startswith(
        runtime_of(os.path.basename(here["openblas"]["library"])).libraries)
    assert "openblas" not in {r.lower() for r in loaded_runtimes(os.getpid())}     # BLAS alone: no runtime
    child = subprocess.Popen([sys.executable, "-c", "import xgboost, sys; sys.stdout.write('up\\n'); "
                              "sys.stdout.flush(); sys.stdin.read()"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_PROC_BIND": "false",
                                                                     "OMP_PLACES": "threads"})
    try:
        assert child.stdout.readline() == "up\n"
        found = worker_runtimes([child.pid])
        assert {"xgboost", "libgomp"} <= set(found)
        assert found["xgboost"]["version"]                          # read from its dist-info
        assert loaded_runtimes(child.pid) == {"XGBoost": True, "OpenMP": False}
        # OMP_PLACES is ignored under OMP_PROC_BIND=false: XGBoost counts the main thread's CPUs.
        exact, why = main_rule(child.pid)
        assert not exact and why.startswith("XGBoost loaded: without OMP_PLACES")
    finally:
        child.stdin.close()
        child.wait(timeout=30)


@contextlib.contextmanager
def _io_uring_sqpoll():
    """A real io_uring with a submission-queue polling kernel thread in this process; its fd."""
    if platform.machine() != "x86_64":
        pytest.skip("io_uring_setup's number is x86_64's here")
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)                   # struct io_uring_params
    ctypes.c_uint32.from_buffer(params, 8).value = 1 << 1       # flags = IORING_SETUP_SQPOLL
    ctypes.c_uint32.from_buffer(params, 16).value = 60_000      # sq_thread_idle, ms
    fd = libc.syscall(425, 4, params)
    if fd < 0:
        pytest.skip(f"no io_uring here (errno {ctypes.get_errno()})")
    try:
        yield fd
    finally:
        os.close(fd)


def _io_threads():
    out = {}
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{os.getpid()}/task/{tid}/comm") as fh:
            name = fh.read().strip()
            if name.startswith("iou-"):
                out[int(tid)] = name
    return out


def test_io_uring_kernel_threads_are_named_for_what_they_are():
    with _io_uring_sqpoll():
        deadline = time.monotonic() + 5
        while not _io_threads() and time.monotonic() < deadline:
            time.sleep(0.02)
        io = _io_threads()
        assert io, "the ring started no kernel thread"
        roles = {t.tid: t for t in classify_threads(os.getpid(), looks=1)}
        for tid, name in io.items():
            assert roles[tid].role == "other" and roles[tid].evidence == f"name: {name}"
            assert "io_uring kernel thread" in roles[tid].why and "anonymous mapping" not in roles[tid].why
    assert helper_thread("iou-wrk-123").startswith("an io_uring kernel thread")
    assert helper_thread("iou-sqpx") is None and helper_thread("python3") is None
