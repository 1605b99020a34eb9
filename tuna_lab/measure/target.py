"""What an experiment measures: a *target* - the lab server, a user's app that tuna_lab starts, or a
server that is already running - and the requests it is sent (:mod:`tuna_lab.measure.loadgen.requests`).

A target does five things, the protocol :func:`tuna_lab.measure.experiment.run` drives:

* :meth:`~Target.start` before the first trial, on the server's CPUs (the
  machine less any CPUs kept for the load generator). A running server has its
  every thread's CPU mask recorded here;
* :meth:`~Target.apply` a policy for one trial, as a context manager that
  yields a :class:`Live` server: the lab server and a user's app are started
  under the policy (and stopped when the trial ends); a running server is
  pinned live, never restarted;
* :attr:`~Target.url` and :attr:`~Target.requests`: where the load goes and what it sends;
* :meth:`~Target.describe`: what the manifest records of it (the app, the
  server and its command line, the runtime libraries its workers mapped);
* :meth:`~Target.stop` after the last trial, whatever happened: a running
  server gets back exactly the masks it had at :meth:`~Target.start`.

Inside a trial the runner waits for every worker to be up and warms each one
up (:mod:`tuna_lab.measure.trials`), then calls :meth:`Live.place`
with the CPU time each worker thread gained during the warm-up: that is when a pool
that only starts at the first request (ONNX Runtime's, libgomp's) exists and
can be told from helper threads. :meth:`Live.place` pins and reads every
binding back from ``/proc``; a placement not in effect fails the trial before
any measured request is sent.

Examples
--------
>>> from tuna_lab.measure.target import Requests
>>> r = Requests(path="/score", method="PUT", headers=(("X-Key", "1"),), bodies=(b"{}", b"[]"))
>>> r.describe()["bodies"], r.load_options()["method"]
(2, 'PUT')
"""

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import psutil

from .._checks import check_size, format_cpulist, one_line, positive_int
from .._files import write_atomic, write_json
from ..errors import TargetError, TunaError
from .loadgen.requests import Requests, read_option_file

# Requests lives in measure/requests.py; it stays importable from here.
__all__ = ["Requests", "Target", "Live", "LabTarget", "AppTarget", "AttachedTarget", "SERVERS",
           "thread_masks", "restore_masks"]

#: The servers :class:`AppTarget` can start a user's app with.
SERVERS = ("gunicorn", "uvicorn")
# Seconds a started app may take to answer its first connection.
_READY_TIMEOUT = 120.0
# Libraries whose presence in a worker's memory map names the runtime it serves with.
_RUNTIME_LIBS = {"libonnxruntime": "onnxruntime", "onnxruntime_pybind11_state": "onnxruntime",
                 "libtorch_cpu": "torch", "libxgboost": "xgboost", "lib_lightgbm": "lightgbm",
                 "libgomp": "libgomp", "libiomp": "libiomp", "libomp": "libomp", "libopenblas": "openblas",
                 "libmkl": "mkl", "libscipy_openblas": "openblas"}
# The Python distribution to read a runtime's version from.
_DISTRIBUTIONS = {"onnxruntime": "onnxruntime", "torch": "torch", "xgboost": ("xgboost", "xgboost-cpu"),
                  "lightgbm": "lightgbm"}


# -- the live server of a trial ------------------------------------------------------------------

def _pins(policy):
    """Whether ``policy`` pins anything: by its registered ``pinned_by``, never by its name."""
    from ..placement.plan import PinnedBy
    from ..placement.policies import get_policy

    return get_policy(policy).pinned_by is not PinnedBy.NONE


class Live:
    """A server during one trial: where it listens, its processes and threads, and its placement.

    Parameters
    ----------
    url : str
        The server's base URL.
    master : int
        The master's PID.
    plan : Plan or None
        What to pin (None: leave every thread on the master's own CPUs - ``cfs``).
    place_now : bool
        Whether :meth:`place` binds threads (a running server, uvicorn, or a
        Gunicorn app whose hooks could not see a pool yet) or only reads
        them back (the lab server, which binds itself).
    """

    def __init__(self, url, master, plan=None, place_now=True, proc=None):
        self.url, self.master, self.plan, self.place_now, self.proc = url, int(master), plan, place_now, proc
        self.verified = None
        self.warnings = []
        self.activity = None

    def master_pid(self):
        return self.master

    def worker_pids(self):
        from ..placement.pin import worker_pids

        try:
            return worker_pids(self.master)
        except TunaError:
            return []

    def alive(self):
        """Whether the master still runs (for a started server: it has not exited)."""
        if self.proc is not None:
            return self.proc.poll() is None
        return psutil.pid_exists(self.master)

    def place(self, activity=None):
        """Apply the trial's policy to every worker, then read it back; returns the problems found.

        ``activity`` is ``{pid: {tid: CPU seconds gained during the warm-up}}``: it
        tells a pool that waits in the C library (ONNX Runtime's) from helper
        threads, and is kept for :meth:`server_threads`. Every thread the
        binding named is read again from ``/proc`` and compared with what the
        plan gives it (``cfs``: the master's own CPUs); an empty list means the
        placement is in effect.
        """
        from ..placement import pin
        from ..placement.binding import affinity_of

        self.activity = activity
        if not self.place_now:
            self.verified = []
            return self.verified
        kwargs = {"activity": activity} if activity is not None and _takes(pin.pin_server, "activity") else {}
        report = pin.unpin_server(self.master) if self.plan is None else pin.pin_server(self.master, self.plan,
                                                                                          **kwargs)
        self.warnings = list(report.warnings)
        master_cpus = sorted(os.sched_getaffinity(self.master))
        problems = []
        for worker in report.workers:
            for t in worker["threads"]:
                want = t.get("planned") if self.plan is not None else master_cpus
                if want is None:
                    continue                       # a thread the plan leaves alone
                try:
                    now = sorted(affinity_of(t["tid"]))
                except TunaError:
                    continue                       # it ended meanwhile
                if now != sorted(want):
                    problems.append(f"worker {worker['pid']} {t['role']} thread {t['tid']} is on "
                                    f"{format_cpulist(now)}, not {format_cpulist(want)}")
        self.verified = problems
        return problems

    def server_threads(self):
        """Every thread of the live workers, read now: ``pid``, ``tid``, ``role`` (main/openmp/other), ``slot``.

        Read afresh each time (with the warm-up's activity, as :meth:`place`
        classifies them), so that a pool that started after the placement
        is sampled too.
        """
        from ..placement.pin import server_threads

        role = {"main": "main", "pool": "openmp"}
        try:
            found = server_threads(self.master, self.plan, self.activity)
        except TunaError:
            return []
        return [{"pid": w["pid"], "tid": t["tid"], "role": role.get(t["role"], "other"), "slot": w["slot"]}
                for w in found for t in w["threads"]]


def _takes(func, name):
    import inspect

    return name in inspect.signature(func).parameters


class _LabLive(Live):
    """The lab server of a trial: it binds its own threads in its workers' hooks."""

    def __init__(self, server):
        super().__init__(server.url, server.master_pid(), place_now=False, proc=server.proc)
        self.server = server

    def worker_pids(self):
        return self.server.worker_pids()

    def place(self, activity=None):
        self.verified = []
        return self.verified

    def server_threads(self):
        return self.server.server_threads()


# -- the targets ---------------------------------------------------------------------------------

class Target:
    """The protocol: :meth:`start`, :meth:`apply`, :attr:`url`, :attr:`requests`, :meth:`describe`, :meth:`stop`.

    Attributes
    ----------
    kind : str
        ``"lab"``, ``"app"`` or ``"attached"``.
    workers, threads : int
        W and T (for a running server, W is counted at :meth:`start`).
    label : str
        The cell's name for what is served (the model, or the app).
    """

    kind = "target"
    #: Whether the server is started per trial (False: it runs already and stays running).
    restarts = True
    #: Seconds a ``tuna-*`` policy's solve may take (None: no limit).
    time_limit = None

    def start(self, topology):
        """Before the first trial; ``topology`` is the machine the server may use."""
        self.topology = topology

    @contextlib.contextmanager
    def apply(self, policy):  # pragma: no cover - the protocol
        raise NotImplementedError
        yield

    def stop(self):
        """After the last trial, whatever happened."""

    def describe(self):
        return {"kind": self.kind}

    def observe(self, live):
        """Called by the runner once a trial's server is warm: note the runtimes its workers mapped."""
        if not getattr(self, "_runtimes", None):
            self._runtimes = _runtimes(live.worker_pids())

    def _placement(self, policy):
        """The placement of ``policy`` on the server's CPUs, made once per target (every trial runs the same).

        Once: a ``tuna-*`` policy is solved once, and a relaxed mapping's
        :class:`~tuna_lab.errors.RelaxedMappingWarning` is said once per cell.
        """
        from ..placement.policies import placement

        plans = self.__dict__.setdefault("_plans", {})
        if policy not in plans:
            plans[policy] = placement(policy, self.workers, self.threads, self.topology,
                                      time_limit=self.time_limit)
        return plans[policy]

    def _plan(self, policy):
        """What to pin for ``policy``: None for a policy that pins nothing (the OS schedules, as ``cfs``)."""
        return self._placement(policy).plan() if _pins(policy) else None

    def placements(self):
        """What the manifest records of the Tuna mappings placed so far: ``{policy: record}``.

        One record per policy whose placement is a solved mapping (the
        ``tuna-*`` ones): its ``status`` and ``proven_optimal``, and
        ``relaxed``, each family a relaxed mapping exceeds, by how much and
        where (:attr:`Mapping.relaxed <tuna_lab.model.mapping.Mapping.relaxed>`;
        empty when the families admit a mapping), with ``reason``, why they
        admit none.

        Examples
        --------
        >>> Target().placements()
        {}
        """
        out = {}
        for policy, placed in self.__dict__.get("_plans", {}).items():
            mapping = placed.mapping
            if mapping is None:
                continue
            relax = mapping.certificate.get("relaxation") or {}
            out[policy] = {
                "status": mapping.status, "proven_optimal": bool(mapping.proven_optimal),
                "relaxed": [{"family": r.family, "amount": r.amount, "message": r.message} for r in mapping.relaxed],
                "reason": "; ".join(c.get("reason", "") for c in relax.get("conflicts", ())),
            }
        return out

    def plans(self):
        """What the cell's trials pinned: ``{policy: {"sha256": ..., "plan": ...}}`` per pinning policy placed.

        A placement is made once per target (:meth:`_placement`), so every
        trial of a cell ran the plan recorded here. Its hash is of what the
        plan pins (the plan's JSON, keys sorted, without the names of the
        policy and of a relaxed mapping's status): it tells at a glance
        whether two policies, cells or sweeps pinned alike - the run summary
        reports two policies with one hash as "same placement"
        (:func:`~tuna_lab.analysis.summary.summarize`). ``cfs`` pins nothing
        and has none.

        Examples
        --------
        >>> Target().plans()
        {}
        """
        import hashlib

        out = {}
        for policy, placed in self.__dict__.get("_plans", {}).items():
            if not _pins(policy):
                continue
            plan = placed.plan().to_dict()
            pins = {k: v for k, v in plan.items() if k not in ("policy", "status", "relaxed")}
            text = json.dumps(pins, sort_keys=True, separators=(",", ":"))
            out[policy] = {"sha256": hashlib.sha256(text.encode()).hexdigest(), "plan": plan}
        return out

    def relaxed(self, policy):
        """What ``policy``'s relaxed mapping exceeds (``"(11-12) exceeded by 8: ..."``), else ``""``: a trial row's.

        Reads the placement already made (none is made here).

        Examples
        --------
        >>> Target().relaxed("tuna-scatter")
        ''
        """
        placed = self.__dict__.get("_plans", {}).get(policy)
        mapping = None if placed is None else placed.mapping
        return "" if mapping is None else "; ".join(str(r) for r in mapping.relaxed)


def check_batch(model, batch):
    """Refuse (:class:`~tuna_lab.errors.ExperimentError`) a batch above the rows one request to ``model`` may carry.

    The bound is the lab server's (:func:`~tuna_lab.server.app.max_rows`:
    ``TUNA_LAB_MAX_ROWS`` and the work bound), read here as the server will.

    Examples
    --------
    >>> check_batch("small", 10)
    >>> check_batch("small", 10 ** 9)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.ExperimentError: batch 1000000000 exceeds the server's limit of ... rows per request ...
    """
    from ..errors import ExperimentError, ServerError
    from ..server.app import max_rows

    try:
        rows = max_rows(model)
    except (ValueError, ServerError) as exc:
        raise ExperimentError(f"the server's limits do not parse: {exc}") from None
    if batch > rows:
        raise ExperimentError(f"batch {batch} exceeds the server's limit of {rows} rows per request "
                              "(TUNA_LAB_MAX_ROWS, TUNA_LAB_MAX_WORK); use a smaller batch")


class LabTarget(Target):
    """tuna_lab's own Gunicorn + XGBoost server (:class:`~tuna_lab.server.launch.Server`), started per trial.

    Parameters
    ----------
    config : Config
        W, T, the model, the batch and the OpenMP wait policy.
    seed : int
        Seeds the request payload.
    """

    kind = "lab"
    #: as :class:`~tuna_lab.server.launch.Server`'s default
    time_limit = 60

    def __init__(self, config, seed=0):
        from .loadgen.load import payload

        # Before the payload is built: a batch of a billion rows is refused here, not by the allocator.
        check_batch(config.model, config.batch)
        self.config, self.workers, self.threads = config, config.workers, config.threads
        self.label = config.model
        self.requests = Requests(path="/predict", bodies=(payload(config.model, config.batch, seed=seed),),
                                 response="lab")

    @contextlib.contextmanager
    def apply(self, policy):
        from ..server.launch import Server

        c = self.config
        # die_with_parent: a runner killed outright (SIGKILL, a lost cluster worker) leaves no server.
        # the placement made once per cell (a Tuna mapping solved once, a relaxed one said once)
        placed = self._placement(policy)
        with Server(c.workers, c.threads, model=c.model, policy=placed, wait_policy=c.wait_policy,
                    spincount=c.spincount, die_with_parent=True, topology=self.topology) as srv:
            self.url = srv.url
            yield _LabLive(srv)

    def describe(self):
        return {"kind": self.kind, "app": "tuna_lab.server.wsgi:app", "server": "gunicorn",
                "model": self.config.model, "batch": self.config.batch}


class AppTarget(Target):
    """A user's WSGI or ASGI app that tuna_lab starts once per trial, under Gunicorn or uvicorn.

    Placement goes through :mod:`tuna_lab.integrations.gunicorn`'s hooks
    (added to the user's own config, whose other settings are kept) and,
    after the warm-up, ``pin --pid``'s binding, which also finds pools the
    hooks could not see yet (for uvicorn it is the only way). ``cfs`` runs
    the server as the user's config has it, with no hook. The app gets
    ``OMP_NUM_THREADS`` and ``TUNA_LAB_THREADS`` = T and sizes its own pools.

    Parameters
    ----------
    app : str
        ``MODULE:ATTRIBUTE``, as Gunicorn and uvicorn take it.
    workers, threads : int
    server : {"gunicorn", "uvicorn"}
    app_dir : str, optional
        The folder the module is imported from (default: the current one).
    server_conf : str, optional
        The user's ``gunicorn.conf.py`` (Gunicorn only).
    requests : Requests, optional
        Default: ``GET /``.
    env : dict, optional
        More environment for the server.
    label : str, optional
        The cell's name for the app (default: the module's name).

    Examples
    --------
    >>> # skipped: needs your module myapp
    >>> t = AppTarget("myapp:app", 2, 2, server="uvicorn")       # doctest: +SKIP
    """

    kind = "app"

    def __init__(self, app, workers, threads, server="gunicorn", app_dir=None, server_conf=None, requests=None,
                 env=None, label=None):
        module, sep, attr = str(app).partition(":")
        if not sep or not module or not attr:
            raise TargetError(f"--app {app!r} is not MODULE:APP (for example myapp:app)")
        # A dotted name, never a path: "../../etc" must not reach the file system or the server's command line.
        if not all(part.isidentifier() for part in module.split(".")):
            raise TargetError(f"--app {app!r}: {module!r} is not a Python module name (MODULE:APP, e.g. myapp:app)")
        if server not in SERVERS:
            raise TargetError(f"--server must be one of {', '.join(SERVERS)}, got {server!r}")
        self.app_dir = os.path.abspath(app_dir or os.getcwd())
        if not os.path.isdir(self.app_dir):
            raise TargetError(f"--app-dir {app_dir}: no such folder")
        if not os.path.isfile(os.path.join(self.app_dir, *module.split(".")) + ".py") and \
                not os.path.isdir(os.path.join(self.app_dir, *module.split("."))):
            raise TargetError(f"--app {app}: no module {module} in {self.app_dir} (give --app-dir)")
        if server_conf is not None:
            if server != "gunicorn":
                raise TargetError("--server-conf is a gunicorn.conf.py: it needs --server gunicorn")
            read_option_file(server_conf, "--server-conf")
            server_conf = os.path.abspath(server_conf)
        self.app, self.server, self.server_conf = str(app), server, server_conf
        self.workers, self.threads = check_size(workers, threads, TargetError)
        self.requests = requests or Requests(path="/", method="GET")
        self.env = {str(k): str(v) for k, v in (env or {}).items()}
        self.label = label or re.sub(r"[^A-Za-z0-9_.]+", "_", module.split(".")[-1])
        self.command = None
        self._state = None
        self._runtimes = None

    def start(self, topology):
        from ..machine.procfs import remove_dead_folders, start_ticks

        super().start(topology)
        # Named after this process (PID and start time): a folder a SIGKILLed run left is removed by the next.
        prefix = f"tuna-lab-app-{os.geteuid()}-"
        remove_dead_folders(tempfile.gettempdir(), rf"{prefix}(\d+)-(\d+)\..*",
                            lambda path, match: [(int(match[1]), int(match[2]))])
        self._state = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{start_ticks(os.getpid())}.")

    def stop(self):
        if self._state:
            import shutil

            shutil.rmtree(self._state, ignore_errors=True)
            self._state = None

    def _command(self, policy, port):
        if self.server == "uvicorn":
            return [sys.executable, "-m", "uvicorn", "--app-dir", self.app_dir, "--host", "127.0.0.1",
                    "--port", str(port), "--workers", str(self.workers), "--no-access-log", self.app]
        conf = write_atomic(os.path.join(self._state, f"gunicorn-{policy}.conf.py"),
                            _gunicorn_conf(self.server_conf, hooks=_pins(policy), workers=self.workers, port=port),
                            durable=False, error=TargetError)
        return [sys.executable, "-m", "gunicorn", "-c", conf, "--chdir", self.app_dir, *_no_control_socket(),
                self.app]

    def _env(self, policy):
        from ..server.launch import SERVER_ENV

        env = dict(os.environ)
        env.update(SERVER_ENV)
        env.update(self.env)
        env.update({"OMP_NUM_THREADS": str(self.threads), "TUNA_LAB_THREADS": str(self.threads)})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (self.app_dir, env.get("PYTHONPATH")) if p)
        if _pins(policy):
            placed = self._placement(policy)
            plan_file = write_json(os.path.join(self._state, f"plan-{policy}.json"), placed.plan().to_dict(),
                                   durable=False, error=TargetError)
            env["TUNA_LAB_PLAN"] = plan_file
            env.update({k: str(v) for k, v in placed.env.items()})
            env.pop("TUNA_LAB_POLICY", None)
        return env

    @contextlib.contextmanager
    def apply(self, policy):
        from ..server.launch import child_setup, free_port, terminate

        port = free_port()
        command = self._command(policy, port)
        self.command = command
        self.url = f"http://127.0.0.1:{port}"
        log = open(os.path.join(self._state, f"server-{policy}.log"), "ab")
        cpus = tuple(self.topology.cpus) if self.topology is not None else None
        if cpus and set(cpus) == os.sched_getaffinity(0):
            cpus = None
        proc = subprocess.Popen(command, env=self._env(policy), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=child_setup(True, cpus), cwd=self.app_dir)
        try:
            _wait_ready(proc, self.url, self.workers, log.name)
            plan = self._plan(policy)
            yield Live(self.url, proc.pid, plan, place_now=plan is not None, proc=proc)
        finally:
            terminate(proc.pid, 15)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            log.close()

    def describe(self):
        return {"kind": self.kind, "app": self.app, "app_dir": self.app_dir, "server": self.server,
                "server_conf": self.server_conf, "command": self.command, "runtimes": self._runtimes or {}}


class AttachedTarget(Target):
    """A pre-fork server that is already running, by its master's PID and a URL it serves.

    Each trial's policy is applied live (``cfs``: every worker thread on the
    master's own CPUs) and read back from ``/proc``; the server is never
    restarted. :meth:`stop` gives every thread the CPU mask it had at
    :meth:`start` - also after an error, Ctrl-C or SIGTERM (the runner calls
    it in a ``finally``); a thread born since (a replacement worker, a pool
    started later) gets its process's mask from then, or the master's.

    Parameters
    ----------
    pid : int
        The master's PID.
    url : str
        A loopback URL the server answers (the requests' URL).
    threads : int
        T: pool threads per worker.
    requests : Requests, optional
        Default: ``GET url``.
    label : str, optional
        The cell's name for the server (default ``pid<PID>``).
    force : bool
        Measure ``pid``'s children though it is PID 1 or no recognised pre-fork
        master (:func:`~tuna_lab.placement.pin.check_server`).
    """

    kind = "attached"
    restarts = False

    def __init__(self, pid, url, threads, requests=None, label=None, force=False):
        from .loadgen.wire import check_url

        try:
            self.url = check_url(url)
        except TunaError as exc:
            raise TargetError(one_line(exc)) from None
        self.master = int(pid)
        self.threads = positive_int("threads", threads, TargetError)
        self.requests = requests or Requests(path=self.url, method="GET")
        if "://" not in self.requests.path:
            self.requests = Requests(**{**self.requests.__dict__, "path": self.requests.url_on(self.url)})
        self.label = label or f"pid{self.master}"
        self.force = bool(force)
        self.masks = None
        self.workers = None
        self._runtimes = None

    def check(self):
        """Refuse (:class:`TargetError`) a PID that is no server's master (PID 1, a shell), one with no workers,
        or a URL that refuses connections; count W."""
        from ..placement.pin import check_server

        try:
            workers = check_server(self.master, force=self.force)
        except TunaError as exc:
            raise TargetError(one_line(exc)) from None
        _connectable(self.url)
        self.workers = len(workers)
        return self

    def start(self, topology):
        super().start(topology)
        if self.workers is None:
            self.check()
        self.masks = thread_masks(self.master)
        self._runtimes = _runtimes(list(self.masks.processes))

    def stop(self):
        if self.masks is not None:
            restore_masks(self.masks)

    @contextlib.contextmanager
    def apply(self, policy):
        plan = self._plan(policy)
        if plan is not None and not psutil.pid_exists(self.master):
            raise TargetError(f"the server {self.master} is gone")
        yield Live(self.url, self.master, plan, place_now=True)

    def describe(self):
        try:
            command = psutil.Process(self.master).cmdline()
        except psutil.Error:
            command = None
        return {"kind": self.kind, "pid": self.master, "url": self.url, "server": _server_name(command),
                "command": command, "runtimes": self._runtimes or {}}


# -- masks of a running server -------------------------------------------------------------------

@dataclass
class _Masks:
    """Every thread's CPU mask of a server at one moment: ``{tid: cpus}`` per process, and the master's."""

    master: int
    master_cpus: tuple
    processes: dict = field(default_factory=dict)


def thread_masks(master):
    """The CPU mask of every thread of ``master`` and its workers, read now (to give back later).

    Examples
    --------
    >>> masks = thread_masks(os.getpid())
    """
    from ..placement.binding import affinity_of

    masks = _Masks(int(master), tuple(sorted(os.sched_getaffinity(int(master)))))
    try:
        procs = [psutil.Process(int(master)), *psutil.Process(int(master)).children()]
    except psutil.NoSuchProcess:
        raise TargetError(f"no process with PID {master}") from None
    for proc in procs:
        try:
            tids = [t.id for t in proc.threads()]
        except psutil.Error:
            continue
        found = {}
        for tid in tids:
            with contextlib.suppress(TunaError):
                found[tid] = tuple(sorted(affinity_of(tid)))
        masks.processes[proc.pid] = found
    return masks


def restore_masks(masks):
    """Give every thread of the server the mask :func:`thread_masks` read; returns the threads restored.

    A thread that still exists gets its own mask back. A thread born since
    gets its process's main-thread mask from then, and a process born since
    (a replacement worker) the master's - what a fork would have given it.
    Threads that are gone are skipped.
    """
    from ..placement.binding import bind

    restored = 0
    try:
        procs = [psutil.Process(masks.master), *psutil.Process(masks.master).children()]
    except psutil.NoSuchProcess:
        return 0
    for proc in procs:
        known = masks.processes.get(proc.pid, {})
        default = known.get(proc.pid, masks.master_cpus)
        try:
            tids = [t.id for t in proc.threads()]
        except psutil.Error:
            continue
        for tid in tids:
            with contextlib.suppress(TunaError):
                bind(tid, known.get(tid, default))
                restored += 1
    return restored


# -- helpers --------------------------------------------------------------------------------------

def _connectable(url):
    """Refuse a URL nothing listens on, before any mask is touched."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=5):
            return
    except OSError as exc:
        raise TargetError(f"{url}: cannot connect ({exc.strerror or exc})") from None


def _wait_ready(proc, url, workers, log, timeout=_READY_TIMEOUT):
    """Wait until the started server has its workers and accepts connections; else TargetError."""
    from ..placement.pin import worker_pids

    parts = urlsplit(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TargetError(f"the server exited with status {proc.returncode}: {_tail(log)}")
        try:
            count = len(worker_pids(proc.pid))
        except TunaError:
            count = 0
        if count >= workers:
            try:
                with socket.create_connection((parts.hostname, parts.port), timeout=1):
                    return
            except OSError:
                pass
        time.sleep(0.1)
    raise TargetError(f"the server did not answer on {url} within {timeout:g} s: {_tail(log)}")


def _tail(path, lines=3):
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])


def _gunicorn_conf(user_conf, hooks, workers, port):
    """A Gunicorn config: the user's own (every setting kept), then the bind, W and tuna_lab's hooks.

    A hook the user's config defines is called after ours; one that is ours
    already (the three-line integration) is not called twice.
    """
    lines = ["# Written by tuna-lab run --app: the user's config, then the bind, W and tuna_lab's hooks.",
             "import runpy as _runpy"]
    if user_conf:
        lines += [f"_user = _runpy.run_path({user_conf!r})",
                  "globals().update({k: v for k, v in _user.items() if not k.startswith('__')})"]
    else:
        lines.append("_user = {}")
    lines += [f"bind = ['127.0.0.1:{int(port)}']", f"workers = {int(workers)}"]
    if hooks:
        lines += ["from tuna_lab.integrations import gunicorn as _tuna"]
        for hook, args in (("post_fork", "server, worker"), ("post_worker_init", "worker"),
                           ("child_exit", "server, worker"), ("on_exit", "server")):
            lines += [f"_user_{hook} = _user.get({hook!r})",
                      f"def {hook}({args}):",
                      f"    _tuna.{hook}({args})",
                      f"    if callable(_user_{hook}) and _user_{hook} is not _tuna.{hook}:",
                      f"        _user_{hook}({args})"]
    return "\n".join(lines) + "\n"


def _runtimes(pids):
    """The runtime libraries mapped in the workers ``pids``: path, and version where its package says it.

    The version is read from the ``*.dist-info`` beside the package in the
    server's own ``site-packages`` (not from this process's environment).
    """
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as fh:
                paths = {line.split(None, 5)[5].strip() for line in fh if len(line.split(None, 5)) == 6}
        except OSError:
            continue
        for path in sorted(paths):
            name = os.path.basename(path)
            for prefix, runtime in _RUNTIME_LIBS.items():
                if name.startswith(prefix) and runtime not in found:
                    found[runtime] = {"library": path, "version": _version_beside(path, runtime)}
    return found


def _version_beside(path, runtime):
    """The version of ``runtime``'s distribution in the site-packages holding ``path``, or None."""
    import glob

    head, sep, _ = path.partition("site-packages/")
    if not sep:
        return None
    dists = _DISTRIBUTIONS.get(runtime) or ()
    for dist in (dists,) if isinstance(dists, str) else dists:
        for info in glob.glob(os.path.join(head + "site-packages", f"{dist.replace('-', '_')}-*.dist-info")):
            return os.path.basename(info)[len(dist) + 1:-len(".dist-info")]
    return None


def _no_control_socket():
    """Gunicorn 25+ opens a control socket at one fixed path per user; servers side by side would share it."""
    try:
        import gunicorn.config
    except ImportError:
        return []
    return ["--no-control-socket"] if hasattr(gunicorn.config, "ControlSocketDisable") else []


def _server_name(command):
    text = " ".join(command or ())
    return next((s for s in SERVERS if s in text), None)
