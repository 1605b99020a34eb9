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
>>> r.describe()["bodies"], r.load_options()["send"].method
(2, 'PUT')
"""

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

import psutil

from .._checks import check_size, format_cpulist
from .._files import write_atomic, write_json
from ..errors import TargetError, TunaError
from ..machine import procfs
from .loadgen.requests import Requests, read_option_file
from .probe import check_imports, check_python, state_folder, tuna_lab_path

# Requests lives in measure/loadgen/requests.py; it stays importable from here.
__all__ = ["Requests", "Target", "Live", "LabTarget", "AppTarget", "SERVERS", "check_connectable",
           "worker_runtimes", "server_name"]

#: The servers :class:`AppTarget` can start a user's app with.
SERVERS = ("gunicorn", "uvicorn")
# Seconds a started app may take to answer its first connection.
_READY_TIMEOUT = 120.0


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
        What to pin (None: pin nothing - ``cfs``: the kernel decides, within
        the masks the server had before tuna_lab touched it).
    place_now : bool
        Whether :meth:`place` binds threads (a running server, uvicorn, or a
        Gunicorn app whose hooks could not see a pool yet) or only reads
        them back (the lab server, which binds itself).
    masks : optional
        A running server's masks from before the first trial
        (:func:`~tuna_lab.measure.attached.thread_masks`): what ``cfs`` checks. None: the
        master's own CPUs.
    front_cpus : tuple of int, optional
        With a plan, the CPUs every thread of the master, helpers and front
        ends is bound to (``--front-cpus``; :func:`~tuna_lab.live.pin.pin_server`).
    """

    def __init__(self, url, master, plan=None, place_now=True, proc=None, masks=None, front_cpus=None):
        self.url, self.master, self.plan, self.place_now, self.proc = url, int(master), plan, place_now, proc
        self.masks, self.front_cpus = masks, front_cpus
        self.verified = None
        self.warnings = []
        self.activity = None

    def master_pid(self):
        return self.master

    def worker_pids(self):
        from ..live.roles import worker_pids

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
        plan gives it (with ``front_cpus``, every thread of the master and
        front ends too); an empty list means the placement is in effect.

        ``cfs`` pins nothing: the masks tuna_lab set in an earlier trial are
        given back (:func:`~tuna_lab.live.pin.unpin_server`, which also
        forgets its records), and every thread of the server must then be on
        its mask from before the first trial (``masks``) - a mask the user set
        with taskset included.
        """
        from ..live import pin
        from ..live.binding import threads_of

        self.activity = activity
        if not self.place_now:
            self.verified = []
            return self.verified
        if self.plan is None:
            report = pin.unpin_server(self.master)
            self.warnings = list(report.warnings)
            self.verified = _off_masks(self.masks, self.master)
            return self.verified
        report = pin.pin_server(self.master, self.plan, activity=activity, front_cpus=self.front_cpus)
        self.warnings = list(report.warnings)
        problems = []
        for worker in report.workers:
            for t in worker["threads"]:
                if t.get("planned") is not None:   # else a thread the plan leaves alone
                    problems += _off(f"worker {worker['pid']} {t['role']} thread {t['tid']}", t["tid"], t["planned"])
        for front in report.fronts:
            for tid in threads_of(front["pid"]):
                problems += _off(f"{front['role']} {front['pid']} thread {tid}", tid, front["cpus"])
        self.verified = problems
        return problems

    def server_threads(self):
        """Every thread of the live workers, read now: ``pid``, ``tid``, ``role`` (main/openmp/other), ``slot``.

        Read afresh each time (with the warm-up's activity, as :meth:`place`
        classifies them), so that a pool that started after the placement
        is sampled too.
        """
        from ..live.pin import server_threads

        role = {"main": "main", "pool": "openmp"}
        try:
            found = server_threads(self.master, self.plan, self.activity)
        except TunaError:
            return []
        return [{"pid": w["pid"], "tid": t["tid"], "role": role.get(t["role"], "other"), "slot": w["slot"]}
                for w in found for t in w["threads"]]


def _off(what, tid, want):
    """``["WHAT is on CPUS, not WANT"]`` when thread ``tid``'s mask is not ``want``; [] when it is, or it ended."""
    from ..live.binding import affinity_of

    try:
        now = sorted(affinity_of(tid))
    except TunaError:
        return []                                  # it ended meanwhile
    return [] if now == sorted(want) else [f"{what} is on {format_cpulist(now)}, not {format_cpulist(sorted(want))}"]


def _off_masks(masks, master):
    """Every thread of the server ``master`` not on its mask from ``masks`` (None: the master's CPUs now).

    A thread born since is expected on what it would have inherited: its
    process's main-thread mask from then, or the master's.
    """
    from ..live.binding import threads_of

    expected = masks.expected if masks is not None else _master_mask(int(master))
    try:
        procs = [psutil.Process(int(master)), *psutil.Process(int(master)).children()]
    except psutil.NoSuchProcess:
        return []
    problems = []
    for proc in procs:
        role = "master" if proc.pid == int(master) else "process"
        try:
            tids = threads_of(proc.pid)
        except TunaError:
            continue                               # not readable: pin_server would have said so
        for tid in tids:
            problems += _off(f"{role} {proc.pid} thread {tid}", tid, expected(proc.pid, tid))
    return problems


def _master_mask(master):
    """``expected(pid, tid)`` of a server with no masks read: every thread on the master's CPUs now."""
    cpus = tuple(sorted(os.sched_getaffinity(master)))
    return lambda pid, tid: cpus


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
            self._runtimes = worker_runtimes(live.worker_pids())

    def sched_sampler(self, threads):
        """What samples the scheduler counters of ``threads`` over a load, for a server that sends them per
        request through no hook (:class:`~tuna_lab.measure.sampled.SchedSampler`); here nothing: the lab
        server and the hooked apps send theirs."""
        from .sampled import NoSampler

        return NoSampler()

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
        from ..server.openmp import OpenMPEnv

        with Server(c.workers, c.threads, model=c.model, policy=placed,
                    openmp=OpenMPEnv(wait_policy=c.wait_policy, spincount=c.spincount), die_with_parent=True,
                    topology=self.topology) as srv:
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

    The server runs in ``python``, the user's own interpreter (their venv)
    where the app's dependencies are. :meth:`check` imports the app there
    once before anything is measured (:meth:`start` calls it). tuna_lab's
    own source is put on that server's ``PYTHONPATH`` alone (a folder that
    holds only a link to the ``tuna_lab`` package), so the hooks import
    without tuna_lab being installed there; what they import besides
    (psutil, lazy_loader, numpy) must be.

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
    python : str, optional
        The interpreter to run the server with (default: tuna-lab's own).

    Examples
    --------
    >>> # skipped: needs your module myapp
    >>> t = AppTarget("myapp:app", 2, 2, server="uvicorn")       # doctest: +SKIP
    """

    kind = "app"

    def __init__(self, app, workers, threads, server="gunicorn", app_dir=None, server_conf=None, requests=None,
                 env=None, label=None, python=None):
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
        self.python = check_python(python)
        self.command = None
        self._state = None
        self._runtimes = None
        self._control_socket = None

    def check(self):
        """Import the app in :attr:`python`, as the server will (its folder, environment, server and hooks).

        Once per interpreter, app, folder and server in this process. Raises
        :class:`TargetError` with the interpreter's own error's last line
        when it cannot run tuna_lab's hooks (too old a Python, a module they
        need missing), has no server, or the app does not import.
        """
        key = (self.python, self.app, self.app_dir, self.server)
        if key not in _CHECKED:
            folder = state_folder()
            try:
                _CHECKED[key] = check_imports(self, self._base_env(folder))
            finally:
                import shutil

                shutil.rmtree(folder, ignore_errors=True)
        self._control_socket = _CHECKED[key]
        return self

    def start(self, topology):
        if self.server == "uvicorn" and self.workers == 1:
            # uvicorn forks no worker at --workers 1: its one process serves, and there is no worker to find,
            # place or measure as a worker (a wait for one would last until the start-up timeout).
            raise TargetError("--server uvicorn at -w 1 forks no worker (its one process serves the requests); "
                              "give -w 2 or more, or --server gunicorn, which forks one worker at -w 1")
        super().start(topology)
        self.check()
        self._state = state_folder()

    def stop(self):
        if self._state:
            import shutil

            shutil.rmtree(self._state, ignore_errors=True)
            self._state = None

    def _command(self, policy, port):
        if self.server == "uvicorn":
            return [self.python, "-m", "uvicorn", "--app-dir", self.app_dir, "--host", "127.0.0.1",
                    "--port", str(port), "--workers", str(self.workers), "--no-access-log", self.app]
        conf = write_atomic(os.path.join(self._state, f"gunicorn-{policy}.conf.py"),
                            _gunicorn_conf(self.server_conf, hooks=_pins(policy), workers=self.workers, port=port),
                            durable=False, error=TargetError)
        # Gunicorn 25+ opens a control socket at one fixed path per user; servers side by side would share it.
        return [self.python, "-m", "gunicorn", "-c", conf, "--chdir", self.app_dir,
                *(["--no-control-socket"] if self._control_socket else []), self.app]

    def _base_env(self, state):
        """The server's environment but the policy's: the app's folder, and tuna_lab for another interpreter."""
        from ..server.launch import SERVER_ENV

        env = dict(os.environ)
        env.update(SERVER_ENV)
        env.update(self.env)
        env.update({"OMP_NUM_THREADS": str(self.threads), "TUNA_LAB_THREADS": str(self.threads)})
        path = [self.app_dir]
        if self.python != sys.executable:
            path.append(tuna_lab_path(state))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (*path, env.get("PYTHONPATH")) if p)
        return env

    def _env(self, policy):
        env = self._base_env(self._state)
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
            # 5 s for a graceful stop: nothing is in flight once a trial is done, but a worker stuck in a request
            # (an app that hangs) would hold Gunicorn's graceful stop to its 30 s.
            terminate(proc.pid, 5)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            log.close()

    def describe(self):
        return {"kind": self.kind, "app": self.app, "app_dir": self.app_dir, "server": self.server,
                "server_conf": self.server_conf, "python": self.python, "command": self.command,
                "runtimes": self._runtimes or {}}


# AppTarget.check's results in this process: {(python, app, app_dir, server): control socket option}.
_CHECKED = {}


# -- helpers --------------------------------------------------------------------------------------

def check_connectable(url):
    """Refuse a URL nothing listens on, before any mask is touched."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or 80), timeout=5):
            return
    except OSError as exc:
        raise TargetError(f"{url}: cannot connect ({exc.strerror or exc})") from None


def _wait_ready(proc, url, workers, log, timeout=_READY_TIMEOUT):
    """Wait until the started server has its workers and accepts connections; else TargetError."""
    from ..live.roles import worker_pids

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


#: tuna_lab's Gunicorn hooks and their arguments: the one table every policy's config wraps.
_HOOKS = (("post_fork", "server, worker"), ("post_worker_init", "worker"), ("child_exit", "server, worker"),
          ("on_exit", "server"))


def _gunicorn_conf(user_conf, hooks, workers, port):
    """A Gunicorn config: the user's own (every setting kept), then the bind, W and tuna_lab's hooks.

    A hook the user's config defines is called after ours; one that is ours
    already (the three-line integration) is not called twice. Without hooks
    (a policy that pins nothing: cfs) the same hooks only measure:
    ``TUNA_LAB_MEASURE_ONLY=1``, set before the user's config runs, tells
    them to place nothing - not even by the policy a user's config with the
    integration names - and to send each request's timing alone (the cfs
    rows are the baseline every anatomy compares with).
    """
    lines = ["# Written by tuna-lab run --app: the user's config, then the bind, W and tuna_lab's hooks.",
             "import os as _os", "import runpy as _runpy",
             # Set (or cleared) in the master before anything else: its workers inherit it.
             "_os.environ.pop('TUNA_LAB_MEASURE_ONLY', None)" if hooks else
             "_os.environ['TUNA_LAB_MEASURE_ONLY'] = '1'"]
    if user_conf:
        lines += [f"_user = _runpy.run_path({user_conf!r})",
                  "globals().update({k: v for k, v in _user.items() if not k.startswith('__')})"]
    else:
        lines.append("_user = {}")
    lines += [f"bind = ['127.0.0.1:{int(port)}']", f"workers = {int(workers)}",
              "from tuna_lab.integrations import gunicorn as _tuna"]
    for hook, args in _HOOKS:
        lines += [f"_user_{hook} = _user.get({hook!r})",
                  f"def {hook}({args}):",
                  f"    _tuna.{hook}({args})",
                  f"    if callable(_user_{hook}) and _user_{hook} is not _tuna.{hook}:",
                  f"        _user_{hook}({args})"]
    return "\n".join(lines) + "\n"


def worker_runtimes(pids):
    """The runtime libraries mapped in the workers ``pids``: path, and version where its package says it.

    The runtimes are the records of :mod:`tuna_lab.live.runtimes`, keyed
    by name. The version is read from the ``*.dist-info`` beside the package
    in the server's own ``site-packages`` (not from this process's environment).
    """
    from ..live.runtimes import runtime_of

    found = {}
    for pid in pids:
        try:
            paths = {path for _, _, path in procfs.mappings(pid)}
        except OSError:
            continue
        for path in sorted(paths):
            runtime = runtime_of(os.path.basename(path))
            if runtime is not None and runtime.name not in found:
                found[runtime.name] = {"library": path, "version": _version_beside(path, runtime)}
    return found


def _version_beside(path, runtime):
    """The version of ``runtime``'s distribution (a :class:`~tuna_lab.live.runtimes.Runtime`) in the
    site-packages holding ``path``, or None."""
    import glob

    head, sep, _ = path.partition("site-packages/")
    if not sep:
        return None
    for dist in runtime.distributions:
        for info in glob.glob(os.path.join(head + "site-packages", f"{dist.replace('-', '_')}-*.dist-info")):
            return os.path.basename(info)[len(dist) + 1:-len(".dist-info")]
    return None


def server_name(command):
    text = " ".join(command or ())
    return next((s for s in SERVERS if s in text), None)
