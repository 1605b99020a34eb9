"""The one table of the runtimes whose thread pools tuna_lab finds, places and records.

One :class:`Runtime` record per library: the file-name prefixes it is mapped
under (``/proc/<pid>/maps``), how it sizes its pool, how its threads are
found, and the environment variables it reads. Every consumer reads this
table: :mod:`tuna_lab.live.pools` (which threads are a pool, which
runtimes a worker loaded, whether its main thread may go to one CPU), the
Gunicorn hooks (``OMP_PLACES``), the lab server's environment
(:data:`~tuna_lab.server.launch.SERVER_ENV`) and the manifest of an
experiment (:mod:`tuna_lab.measure.target`). Adding a runtime is one record
here (and one test app in ``tests/runtimeapps``).

The thread names of known non-pool threads (:data:`HELPER_THREADS`) are here
too: a thread name is the first evidence :func:`~tuna_lab.live.pools.classify_threads`
reads. This module imports nothing: a Gunicorn worker loads it.

Examples
--------
>>> runtime_of("libgomp-a34b3233.so.1").name, runtime_of("libscipy_openblas64_-ff651d7f.so").name
('libgomp', 'openblas')
>>> [r.label for r in RUNTIMES if r.sizes == AFFINITY_PER_CALL]
['XGBoost']
>>> places_counted({"OMP_PLACES": "threads", "OMP_PROC_BIND": "false"})
False
"""

from dataclasses import dataclass

__all__ = ["Runtime", "RUNTIMES", "OPENMP", "BLAS", "FRAMEWORK", "AFFINITY_PER_CALL", "AFFINITY_AT_LOAD",
           "OWN_SETTING", "BY_LIBRARY", "BY_OPENMP", "BY_ACTIVITY", "HELPER_THREADS", "runtime_of",
           "pool_runtime", "openmp_unbound", "places_counted", "helper_thread", "single_thread_env"]

#: Kinds: an OpenMP runtime, a BLAS library, or a framework that serves a model (and runs one of the above
#: or a pool of its own).
OPENMP, BLAS, FRAMEWORK = "openmp", "blas", "framework"

#: How a runtime sizes its pool: from the calling thread's *current* CPUs at every call (XGBoost on
#: libgomp without ``OMP_PLACES``: ``min(nthread, omp_get_num_procs())``) ...
AFFINITY_PER_CALL = "from the calling thread's current CPUs at every call"
#: ... from its variable, else from the CPUs the process may use when it loads (OpenMP, BLAS) ...
AFFINITY_AT_LOAD = "from its variable, else from the process's CPUs when it loads"
#: ... or from its own setting, made once (a session option, a parameter), else its runtime's default.
OWN_SETTING = "from its own setting when the model is loaded"

#: How its threads are found: blocked in a system call made from the library's own code ...
BY_LIBRARY = "library"
#: ... as the threads of the OpenMP runtime it runs on (found by that runtime's record) ...
BY_OPENMP = "openmp"
#: ... or by the CPU time they gain while the worker serves requests (the pool waits in libc).
BY_ACTIVITY = "activity"


@dataclass(frozen=True)
class Runtime:
    """One runtime library whose threads tuna_lab finds and places.

    Attributes
    ----------
    name : str
        Its key, as an experiment's manifest names it (``libgomp``, ``openblas``, ``xgboost``).
    label : str
        What reports call it (``OpenMP``, ``XGBoost``); the OpenMP runtimes share one.
    kind : str
        :data:`OPENMP`, :data:`BLAS` or :data:`FRAMEWORK`.
    libraries : tuple of str
        File-name prefixes it is mapped under in ``/proc/<pid>/maps``.
    sizes : str
        How it sizes its pool: :data:`AFFINITY_PER_CALL`, :data:`AFFINITY_AT_LOAD` or :data:`OWN_SETTING`.
    found_by : str
        How its pool threads are found: :data:`BY_LIBRARY`, :data:`BY_OPENMP` or :data:`BY_ACTIVITY`.
    threads_env : str or None
        The variable that sets its pool's size (None: a setting in code).
    env : tuple of str
        Other variables it reads that change where or how its threads run.
    distributions : tuple of str
        The Python distributions that ship it (its version is read from their ``*.dist-info``).
    """

    name: str
    label: str
    kind: str
    libraries: tuple
    sizes: str
    found_by: str
    threads_env: object = None
    env: tuple = ()
    distributions: tuple = ()

    @property
    def sizes_from_affinity(self):
        """Whether it sizes its pool from the calling thread's current CPUs at every call."""
        return self.sizes == AFFINITY_PER_CALL

    def maps(self, filename):
        """Whether the library file ``filename`` (a base name) is this runtime's.

        Examples
        --------
        >>> runtime_of("libxgboost.so").maps("libxgboost.so")
        True
        """
        return filename.startswith(self.libraries)


_OMP_ENV = ("OMP_PLACES", "OMP_PROC_BIND", "OMP_WAIT_POLICY")

#: Every runtime, in the order a library name is matched (the first record whose prefix matches).
RUNTIMES = (
    Runtime("libgomp", "OpenMP", OPENMP, ("libgomp",), AFFINITY_AT_LOAD, BY_LIBRARY, "OMP_NUM_THREADS",
            _OMP_ENV + ("GOMP_SPINCOUNT", "GOMP_CPU_AFFINITY")),
    Runtime("libiomp", "OpenMP", OPENMP, ("libiomp",), AFFINITY_AT_LOAD, BY_LIBRARY, "OMP_NUM_THREADS",
            _OMP_ENV + ("KMP_AFFINITY", "KMP_BLOCKTIME")),
    Runtime("libomp", "OpenMP", OPENMP, ("libomp",), AFFINITY_AT_LOAD, BY_LIBRARY, "OMP_NUM_THREADS",
            _OMP_ENV + ("KMP_AFFINITY", "KMP_BLOCKTIME")),
    Runtime("openblas", "OpenBLAS", BLAS, ("libopenblas", "libscipy_openblas"), AFFINITY_AT_LOAD, BY_LIBRARY,
            "OPENBLAS_NUM_THREADS"),
    Runtime("mkl", "MKL", BLAS, ("libmkl",), AFFINITY_AT_LOAD, BY_LIBRARY, "MKL_NUM_THREADS"),
    Runtime("blis", "BLIS", BLAS, ("libblis",), AFFINITY_AT_LOAD, BY_LIBRARY, "BLIS_NUM_THREADS"),
    Runtime("xgboost", "XGBoost", FRAMEWORK, ("libxgboost",), AFFINITY_PER_CALL, BY_OPENMP, None,
            ("OMP_NUM_THREADS",), ("xgboost", "xgboost-cpu")),
    Runtime("onnxruntime", "ONNX Runtime", FRAMEWORK, ("onnxruntime_pybind11_state", "libonnxruntime"),
            OWN_SETTING, BY_ACTIVITY, None, (), ("onnxruntime",)),
    Runtime("torch", "PyTorch", FRAMEWORK, ("libtorch_cpu",), OWN_SETTING, BY_OPENMP, "OMP_NUM_THREADS",
            (), ("torch",)),
    Runtime("lightgbm", "LightGBM", FRAMEWORK, ("lib_lightgbm",), OWN_SETTING, BY_OPENMP, None,
            ("OMP_NUM_THREADS",), ("lightgbm",)),
)

#: Threads a thread name (``/proc/<pid>/task/<tid>/comm``) says are no pool thread, and what they are:
#: ``{name or prefix ending in "-": what it is}``.
HELPER_THREADS = {
    "jemalloc_bg_thd": "jemalloc's background thread (LightGBM and scikit-learn wheels load it)",
    "iou-sqp-": "an io_uring kernel thread (submission queue poller): the kernel's, never a pool thread",
    "iou-wrk-": "an io_uring kernel thread (I/O worker): the kernel's, never a pool thread",
}


def runtime_of(filename):
    """The :class:`Runtime` whose library ``filename`` (a base name) is, or None.

    Examples
    --------
    >>> runtime_of("libtorch_cpu.so").label, runtime_of("libc.so.6")
    ('PyTorch', None)
    """
    return next((r for r in RUNTIMES if r.maps(filename)), None)


def pool_runtime(filename):
    """The OpenMP or BLAS :class:`Runtime` a thread blocked in ``filename``'s code is a pool thread of, or None.

    Examples
    --------
    >>> pool_runtime("libmkl_rt.so.2").label, pool_runtime("libxgboost.so")
    ('MKL', None)
    """
    found = runtime_of(filename) if filename else None
    return found if found is not None and found.found_by == BY_LIBRARY else None


def helper_thread(name):
    """What a thread named ``name`` is, when its name says it is no pool thread; else None.

    Examples
    --------
    >>> helper_thread("iou-wrk-4711")[:20], helper_thread("python")
    ('an io_uring kernel t', None)
    """
    for known, what in HELPER_THREADS.items():
        if name == known or (known.endswith("-") and name.startswith(known)):
            return what
    return None


def openmp_unbound(env):
    """Whether ``OMP_PROC_BIND=false`` (its first value) is in ``env``: OpenMP then ignores ``OMP_PLACES``.

    ``env`` maps variable names to values (``str``), as :data:`os.environ` does.

    Examples
    --------
    >>> openmp_unbound({"OMP_PROC_BIND": "FALSE,close"}), openmp_unbound({"OMP_PROC_BIND": "close"})
    (True, False)
    """
    return env.get("OMP_PROC_BIND", "").split(",")[0].strip().lower() == "false"


def places_counted(env):
    """Whether an OpenMP runtime started with ``env`` counts its CPUs from an ``OMP_PLACES`` list.

    Then (and only then) a main thread bound to one CPU keeps its pool's
    size: ``OMP_PLACES`` set, and not ignored under ``OMP_PROC_BIND=false``.

    Examples
    --------
    >>> places_counted({"OMP_PLACES": "threads"}), places_counted({})
    (True, False)
    """
    return "OMP_PLACES" in env and not openmp_unbound(env)


def single_thread_env(kind=BLAS):
    """``{variable: "1"}`` that keeps every runtime of ``kind`` at one thread.

    Examples
    --------
    >>> sorted(single_thread_env())
    ['BLIS_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS']
    """
    return {r.threads_env: "1" for r in RUNTIMES if r.kind == kind and r.threads_env}
