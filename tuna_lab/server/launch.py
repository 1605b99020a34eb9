"""Start, watch and stop a pinned Gunicorn + XGBoost server.

>>> # Skipped as a doctest: it trains a model and starts a live server.
>>> from tuna_lab.server.launch import Server
>>> with Server(2, 2, model="small", policy="round-robin") as srv:   # doctest: +SKIP
...     srv.url, [w["slot"] for w in srv.worker_records()]
('http://127.0.0.1:39215', [0, 1])
"""

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import psutil

from .. import _files
from .._checks import check_size, non_negative_int, positive_int, positive_number, shorten, spec_or_default
from ..errors import CpuAccountingError, ServerError, TunaError
from ..machine.limits import check_throttling
from ..machine import procfs
from ..machine.procfs import remove_dead_folders, start_ticks
from ..live.binding import affinity_of, threads_of
from ..placement.plan import PinnedBy
from ..live.runtimes import BLAS, single_thread_env
from .limits import ServerLimits
from .models import MODEL_FEATURES, ensure_model
from .openmp import OpenMPEnv, wait_policy_env
from .pinning import PLAN_FILE, record_path

__all__ = ["Server", "ServerError", "status", "stop", "free_port", "SERVER_ENV", "SERVER_ID_VAR", "child_setup",
           "terminate", "signal_on_parent_death", "remove_stale_state_dirs"]

#: Thread pools other than the worker's OpenMP pool stay at one thread, so
#: the only threads that compete are the ones the policy places.
#: (Every BLAS runtime of :mod:`tuna_lab.live.runtimes`, NumExpr's and macOS Accelerate's.)
SERVER_ENV = {**single_thread_env(BLAS), "NUMEXPR_NUM_THREADS": "1", "VECLIB_MAXIMUM_THREADS": "1"}


#: The environment variable whose value marks a server's master as the one a :class:`Server` started.
SERVER_ID_VAR = "TUNA_LAB_SERVER_ID"

# A Server's own state folder: tempfile's folder, this prefix. Its owner record says which
# processes (the launcher, then Gunicorn's master; PID and start time) keep it in use.
_STATE_PREFIX = "tuna-lab-server-"
_OWNER_FILE = "owner.json"
# Linux's PID_MAX_LIMIT: a pidfile naming a larger number was not written by Gunicorn.
_PID_MAX = 1 << 22


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on right now (the kernel's pick).

    Another process may take it before it is used; :class:`Server` binds it
    at once, and a test server can do the same.

    Examples
    --------
    >>> 0 < free_port() < 65536
    True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _running(proc):
    """Whether psutil process ``proc`` still runs: not exited, not a zombie, its PID not reused."""
    try:
        # is_running() checks the PID was not reused, but counts a zombie as running.
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:          # another user's process: it exists
        return True


def _process(pid):
    """``psutil.Process(pid)`` while it runs, else None."""
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None
    return proc if _running(proc) else None


def _children(pid):
    """The running child processes of ``pid`` (a Gunicorn master's workers), as psutil processes."""
    proc = _process(pid)
    try:
        kids = proc.children() if proc else []
    except psutil.NoSuchProcess:
        return []
    return [kid for kid in kids if _running(kid)]


class Server:
    """A Gunicorn server of ``workers`` sync workers, each with ``threads`` OpenMP threads, pinned by ``policy``.

    Parameters
    ----------
    workers, threads : int
    model : {"small", "medium", "large"}
    policy : str or Placement
        A registered policy's name (:func:`tuna_lab.placement.policy_names`), or a
        :class:`~tuna_lab.placement.policies.Placement` already made for
        ``workers`` x ``threads`` (the experiment runner makes each policy's
        once per cell: a Tuna mapping is solved, and a relaxed one said, once).
    port : int, optional
        0 (default) picks a free loopback port. The server binds 127.0.0.1 only.
    pidfile : str, optional
        Where Gunicorn writes the master's PID (default: in the state directory).
    topology : Topology, optional
        Default: this machine, restricted to the CPUs this process may use.
        A topology of fewer CPUs than this process may use (some kept for a
        load generator, see :func:`tuna_lab.machine.reserve.reserve_client_cpus`)
        confines every process of the server to its CPUs (:attr:`cpus`), so
        that even an unbound policy (cfs) stays off the others.
    request_log : str, optional
        Directory for the per-request JSON lines (created now if missing).
    state_dir : str, optional
        The server's state folder (see Notes).
    die_with_parent : bool
        Have the kernel send Gunicorn's master SIGTERM (a graceful stop of
        its workers) when the thread that started it ends - also when this
        process is killed outright (``SIGKILL``, a lost Dask worker), when no
        context manager can run. Only for a server stopped by the thread that
        started it (the experiment runner); off for ``tuna-lab serve --detach``.
    limits : ServerLimits, optional
        Worker recycling, the bounds of a request (body, work, queue wait,
        read and run time) and of the placement's solve:
        :class:`~tuna_lab.server.limits.ServerLimits` (default ``ServerLimits()``).
    openmp : OpenMPEnv, optional
        ``OMP_PLACES``, ``OMP_WAIT_POLICY`` and ``GOMP_SPINCOUNT`` of the
        workers: :class:`~tuna_lab.server.openmp.OpenMPEnv` (default ``OpenMPEnv()``).

    Notes
    -----
    The state folder the server is given (``state_dir``), or else makes in
    :func:`tempfile.gettempdir` when it starts, holds its plan, its
    workers' records and Gunicorn's log; the one it makes is removed when
    it stops, however the start or the stop ends. One left by a process
    killed outright (``SIGKILL``) is removed by the next start here, once
    the processes its owner record names (the launcher, the master) are gone.
    """

    def __init__(self, workers, threads, model="medium", policy="cfs", port=0, pidfile=None,
                 topology=None, *, request_log=None, state_dir=None, die_with_parent=False, limits=None,
                 openmp=None):
        # The policies module is imported here: `tuna-lab status` and `stop` use this module too.
        from ..placement.policies import placement

        limits = spec_or_default("limits", limits, ServerLimits, ServerError)
        openmp = spec_or_default("openmp", openmp, OpenMPEnv, ServerError)
        max_requests, max_body_bytes, time_limit = limits.max_requests, limits.max_body_bytes, limits.time_limit
        max_work, max_wait = limits.max_work, limits.max_wait
        read_timeout, request_timeout = limits.read_timeout, limits.request_timeout
        places, wait_policy, spincount = openmp.places, openmp.wait_policy, openmp.spincount
        if model not in MODEL_FEATURES:
            raise ServerError(f"unknown model {model!r}; choose from {', '.join(MODEL_FEATURES)}")
        workers, threads = check_size(workers, threads, ServerError)
        try:
            self._wait_env = wait_policy_env(wait_policy, spincount)
        except CpuAccountingError as exc:
            raise ServerError(str(exc)) from None
        self.wait_policy, self.spincount = wait_policy, spincount
        if isinstance(policy, str):
            self.placement = placement(policy, workers, threads, topology, places=places, time_limit=time_limit)
        else:
            if (policy.workers, policy.threads) != (workers, threads):
                raise ServerError(f"the placement given is for {policy.workers}x{policy.threads}, "
                                  f"not {workers}x{threads}")
            self.placement, policy = policy, policy.policy
        affinity = os.sched_getaffinity(0)
        own = set(self.placement.topology.cpus) & affinity
        # A topology narrower than the CPUs this process may use (CPUs kept for a
        # load generator): every process of the server starts confined to it, so
        # an unbound policy (cfs) and the threads no policy places stay there too.
        self.cpus = tuple(sorted(own)) if own and own != affinity else None
        usable = len(self.cpus or affinity)
        if threads > usable:
            # XGBoost sizes its pool as min(nthread, omp_get_num_procs()), and
            # libgomp counts the CPUs in the worker's affinity mask: a worker
            # can never run more threads than the server may use.
            raise ServerError(f"{threads} threads per worker cannot run here: XGBoost's OpenMP pool is "
                              f"capped at the {usable} CPUs {'the server' if self.cpus else 'this process'} "
                              f"may use; oversubscribe with more workers instead")
        self.workers, self.threads, self.model, self.policy = workers, threads, model, policy
        self.max_work = None if max_work is None else positive_int("max_work", max_work, ServerError)
        self.max_wait = None if max_wait is None else positive_number("max_wait", max_wait, ServerError)
        self.read_timeout = positive_number("read_timeout", read_timeout, ServerError)
        self.request_timeout = (None if request_timeout is None
                                else positive_number("request_timeout", request_timeout, ServerError))
        port = non_negative_int("port", port, ServerError)
        if port > 65535:
            raise ServerError(f"port must be at most 65535, got {port}")
        self.port = port or free_port()
        self._own_state = state_dir is None
        # Made when the server starts (the pidfile's default lives in it), removed when it stops.
        self.state_dir = state_dir
        self._pidfile_given = bool(pidfile)
        self.pidfile = os.path.abspath(pidfile) if pidfile else None
        if self.pidfile:
            _check_pidfile(self.pidfile)
        self.max_requests = int(max_requests)
        self.request_log = request_log
        if request_log:
            # The workers write requests-<pid>.jsonl in it, as root too: never in a folder another user
            # could have redirected (a link they planted on the way, a folder of theirs).
            _files.safe_dir(request_log, "--request-log", ServerError)
        self.max_body_bytes = max_body_bytes
        self.die_with_parent = bool(die_with_parent)
        self.proc = None
        self._log = None
        self._sidecar_written = False
        # A mark in the master's environment: `stop --pidfile` signals only a process that carries it.
        self._server_id = secrets.token_hex(16)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def _env(self):
        env = dict(os.environ)
        env.update(SERVER_ENV)
        wait_set, wait_unset = self._wait_env
        for name in wait_unset:
            env.pop(name, None)
        env.update(wait_set)
        env.update({k: str(v) for k, v in self.placement.env.items()})
        if self.placement.pinned_by == PinnedBy.TUNA_LAB and "OMP_PLACES" not in self.placement.env:
            # XGBoost runs min(nthread, omp_get_num_procs()) threads, and without
            # a place list GNU libgomp counts the CPUs of the *calling thread's*
            # current affinity: once we pin the main thread to one CPU, every
            # later request would run single-threaded while the pool idles.
            # With OMP_PLACES set, libgomp fixes the count at start-up. (It also
            # binds the pool itself at creation; we re-bind every TID after
            # the warm-up, and the binding holds - the tests check both.)
            env["OMP_PLACES"] = "threads"
        env.update({
            "OMP_NUM_THREADS": str(self.threads),
            "TUNA_LAB_STATE": self.state_dir,
            # The integration's hooks take their slots from this plan; made here for this server's CPUs
            # (its topology may be a part of the machine), so its fingerprint is not this machine's.
            "TUNA_LAB_PLAN": os.path.join(self.state_dir, PLAN_FILE),
            "TUNA_LAB_FORCE": "1",
            "TUNA_LAB_MODEL": self.model,
            "TUNA_LAB_THREADS": str(self.threads),
            "TUNA_LAB_MAX_REQUESTS": str(self.max_requests),
            SERVER_ID_VAR: self._server_id,
        })
        if self.request_log:
            env["TUNA_LAB_REQUEST_LOG"] = os.path.abspath(self.request_log)
        env["TUNA_LAB_READ_TIMEOUT"] = repr(self.read_timeout)
        if self.max_wait is not None:
            env["TUNA_LAB_MAX_WAIT"] = repr(self.max_wait)
        for var, value in (("TUNA_LAB_MAX_BODY", self.max_body_bytes), ("TUNA_LAB_MAX_WORK", self.max_work)):
            if value:
                env[var] = str(int(value))
        if self.request_timeout is not None:
            # Gunicorn's timeout is whole seconds; never round a bound down to 0 (no bound at all).
            env["TUNA_LAB_TIMEOUT"] = str(max(1, round(self.request_timeout)))
        return env

    def start(self, ready_timeout=180):
        """Start Gunicorn and wait until every worker is warm and pinned."""
        check_throttling(self.workers * self.threads)
        # Train (or find) the model here, once, rather than in W racing workers.
        ensure_model(self.model)
        # Whatever stops the start (a failed worker, Ctrl-C, a SIGTERM raised as
        # KeyboardInterrupt) stops the server and removes what it made: a
        # `with Server(...)` whose __enter__ raises never calls __exit__.
        try:
            if self._own_state:
                remove_stale_state_dirs()
                self.state_dir = tempfile.mkdtemp(prefix=_STATE_PREFIX)
                self._write_owner()
            if not self._pidfile_given:
                self.pidfile = os.path.join(self.state_dir, "gunicorn.pid")
            self.placement.plan().write(os.path.join(self.state_dir, PLAN_FILE))
            cmd = [sys.executable, "-m", "gunicorn", "-c", "python:tuna_lab.server.gunicorn_conf",
                   "--bind", f"127.0.0.1:{self.port}", "--pid", self.pidfile,
                   "tuna_lab.server.wsgi:app"]
            self._log = open(os.path.join(self.state_dir, "gunicorn.log"), "ab")
            with _interrupts_held():
                self.proc = subprocess.Popen(cmd, env=self._env(), stdout=self._log, stderr=subprocess.STDOUT,
                                             start_new_session=True,
                                             preexec_fn=child_setup(self.die_with_parent, self.cpus))
            if self._own_state:
                self._write_owner(self.proc.pid)
            # Who the master is, beyond its PID (which the kernel reuses): what `stop` checks first.
            _files.write_json(self.pidfile + ".tuna.json", {
                "master": self.proc.pid, "start_ticks": start_ticks(self.proc.pid), "server_id": self._server_id,
                "state_dir": self.state_dir, "url": self.url, "policy": self.policy,
                "workers": self.workers, "threads": self.threads, "model": self.model,
                "wait_policy": self.wait_policy, "spincount": self.spincount,
                "server_cpus": list(self.cpus) if self.cpus else None,
                "own_state": self._own_state}, durable=False, error=ServerError)
            self._sidecar_written = True
            self.wait_ready(ready_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _write_owner(self, master=None):
        """Record in the state folder who keeps it in use: this process and, once started, the master."""
        owner = {"launcher": os.getpid(), "launcher_ticks": start_ticks(os.getpid()),
                 "master": master, "master_ticks": None if master is None else start_ticks(master)}
        _files.write_json(os.path.join(self.state_dir, _OWNER_FILE), owner, mode=0o600, durable=False,
                          error=ServerError)

    def wait_ready(self, timeout=180):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ServerError(f"gunicorn exited with status {self.proc.returncode}: {self._tail()}")
            records = self.worker_records()
            failed = [r for r in records if r.get("error")]
            if failed:
                raise ServerError(f"worker {failed[0]['pid']} could not be pinned: {failed[0]['error']}")
            if len([r for r in records if r.get("ready")]) == self.workers:
                return records
            time.sleep(0.05)
        raise ServerError(f"server not ready after {timeout:g} s: {self._tail()}")

    def _tail(self, lines=3):
        try:
            with open(os.path.join(self.state_dir, "gunicorn.log"), "rb") as fh:
                text = fh.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return ""
        tail = text[-lines:]
        # Gunicorn's last lines after a worker failed to boot are generic ("Worker failed to boot"): the
        # cause is above them - a worker's own error line, or the last line of its traceback.
        causes = [line for line in text if "[ERROR]" in line and not any(
            generic in line for generic in ("Worker (pid:", "Shutting down", "Reason:", "Exception in worker"))]
        for at, line in enumerate(text):
            if line.startswith("Traceback"):
                causes += [next((x for x in text[at + 1:] if x and not x[0].isspace()), "")]
        cause = next((c for c in reversed(causes) if c and c not in tail), None)
        return " | ".join(([cause] if cause else []) + tail)

    def worker_records(self):
        """The binding records of the live workers, one per slot (none before the start or after the stop)."""
        return _records(self.state_dir, self.workers) if self.state_dir else []

    def server_threads(self):
        """Every thread of the live workers: ``pid``, ``tid``, ``role`` (main/openmp/other), ``slot``."""
        return [{"pid": rec["pid"], "tid": t["tid"], "role": t.get("role", "other"), "slot": rec.get("slot")}
                for rec in self.worker_records() if not rec.get("error") for t in rec.get("threads", [])]

    def master_pid(self):
        """PID of the Gunicorn master (None when not started)."""
        return self.proc.pid if self.proc else None

    def worker_pids(self):
        """PIDs of the master's live worker processes, in no particular order."""
        return [c.pid for c in _children(self.proc.pid)] if self.proc else []

    def stop(self, timeout=15):
        """Stop Gunicorn, make sure no worker survives, and remove what the start made (also of a failed start)."""
        if self.proc is not None:
            terminate(self.proc.pid, timeout)
            try:
                # Collects the exit status (psutil may have reaped the master already).
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._sidecar_written:
            # Only our own: a pidfile another server holds was refused before anything was written.
            with contextlib.suppress(OSError):
                os.remove(self.pidfile + ".tuna.json")
            self._sidecar_written = False
        if self._own_state and self.state_dir:
            # our scratch directory: placement, records, Gunicorn's log and pidfile
            shutil.rmtree(self.state_dir, ignore_errors=True)
            self.state_dir = None

    def __enter__(self):
        return self.start() if self.proc is None else self

    def __exit__(self, *exc):
        self.stop()


def _parent_death_signal():
    """A ``preexec_fn`` that has the child sent SIGTERM when the thread that forked it ends (Linux).

    Gunicorn runs in its own session, so killing its parent's process group
    does not reach it; ``prctl(PR_SET_PDEATHSIG)`` makes the kernel stop it
    instead. The libc function is looked up here, before the fork: the child
    only makes the call (and exits at once if its parent is already gone).
    None where there is no such call.
    """
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent, pr_set_pdeathsig, sigterm = os.getpid(), 1, int(signal.SIGTERM)

    def set_signal():
        # Between fork and exec, in a copy of a process that may have threads: only the call itself.
        prctl(pr_set_pdeathsig, sigterm, 0, 0, 0)
        if os.getppid() != parent:      # the parent died before the call: no signal will come
            os._exit(1)

    return set_signal


def signal_on_parent_death(sig=signal.SIGHUP):
    """Have the kernel send this process ``sig`` when its parent dies (``PR_SET_PDEATHSIG``; Linux).

    A foreground ``tuna-lab serve`` started by a script, a notebook or an
    editor is stopped this way when that parent goes, however it goes, instead
    of leaving a pinned server that nobody will stop.

    Returns
    -------
    bool or None
        True once set; False when the parent died while it was being set
        (re-parented: no signal will come, the caller should stop now); None
        where the call is not available.

    Examples
    --------
    >>> signal_on_parent_death(signal.SIGHUP)     # doctest: +SKIP
    True
    """
    import ctypes

    parent = os.getppid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1
    if prctl(pr_set_pdeathsig, int(sig), 0, 0, 0) != 0:
        return None
    return os.getppid() == parent


def child_setup(die_with_parent, cpus):
    """The child's ``preexec_fn``: confine it to ``cpus`` (if any), then the parent-death signal (if asked)."""
    death = _parent_death_signal() if die_with_parent else None
    if not cpus:
        return death

    def confine():
        # Between fork and exec: the server's master (and so every worker it forks) starts on these CPUs.
        os.sched_setaffinity(0, cpus)
        if death is not None:
            death()

    return confine


@contextlib.contextmanager
def _interrupts_held():
    """Hold SIGINT, SIGTERM and SIGHUP back while the body runs, then deliver them.

    A KeyboardInterrupt raised inside :class:`subprocess.Popen` after its fork
    would leave a Gunicorn that no one knows the PID of. Only signals with a
    Python handler are held (SIGINT's KeyboardInterrupt, the CLI's SIGTERM and SIGHUP);
    handlers can only be set in the main thread, the only one Python runs them in.
    """
    held, previous = [], {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if callable(signal.getsignal(sig)):
                previous[sig] = signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sig in held:
            signal.raise_signal(sig)


def terminate(master, timeout=15):
    """SIGTERM the master (graceful), then SIGKILL whatever is left of it, its workers and its group."""
    try:
        proc = _process(master)
        procs = [proc, *_children(master)] if proc else []
        if proc:
            try:
                proc.terminate()        # Gunicorn stops its workers gracefully on SIGTERM
            except psutil.NoSuchProcess:
                pass
        # psutil's Process objects remember each process's start time: a PID reused
        # by an unrelated process meanwhile is never signalled.
        _, left = psutil.wait_procs(procs, timeout=timeout)
        for p in left:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=5)
    finally:
        # Also when the above is interrupted (Ctrl-C, SIGTERM raised as
        # KeyboardInterrupt): nothing of the session started for Gunicorn survives.
        try:
            os.killpg(master, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _records(state_dir, workers):
    out = []
    for slot in range(workers):
        try:
            rec = _files.read_json(record_path(state_dir, slot), limit=1 << 20, follow=False)
        except OSError:             # missing, half-written, or not a plain file of JSON
            continue
        if isinstance(rec, dict) and (rec.get("error") or _process(rec.get("pid"))):
            out.append(rec)
    return out


def _carries(pid, server_id):
    """Whether process ``pid`` was started with our mark ``server_id`` in its environment."""
    try:
        return procfs.environ(pid).get(SERVER_ID_VAR) == server_id
    except (OSError, ValueError, TypeError):
        return False


def _read_pid(pidfile):
    """The process id in ``pidfile``; ServerError (one line) for anything else, FileNotFoundError when absent."""
    text = _files.read_text(pidfile, limit=64, error=ServerError).strip()
    if not (text.isdigit() and 0 < int(text) < _PID_MAX):
        raise ServerError(f"pidfile {pidfile} does not hold a process id (it holds {shorten(text, 40)!r})")
    return int(text)


def _sidecar(pidfile):
    try:
        master = _read_pid(pidfile)
        meta = _files.read_json(pidfile + ".tuna.json", limit=1 << 16, error=ServerError)
    except FileNotFoundError:
        raise ServerError(f"no running tuna-lab server found for pidfile {pidfile}") from None
    if not isinstance(meta, dict) or not _process(master):
        raise ServerError(f"the server of pidfile {pidfile} (pid {master}) is not running")
    # Notes another user wrote (a pidfile in a shared folder) name nothing we may signal or delete.
    with contextlib.suppress(OSError):
        owner = os.lstat(pidfile + ".tuna.json").st_uid
        if owner != os.geteuid():
            raise ServerError(f"the notes beside pidfile {pidfile} belong to another user (uid {owner}); "
                              "nothing was signalled or deleted")
    # The PID alone may name any process now (reused, or a pidfile someone edited): signal it only
    # when it is the very process tuna-lab started - same PID, same start time, our mark.
    if (meta.get("master") != master or meta.get("start_ticks") is None
            or start_ticks(master) != meta.get("start_ticks") or not _carries(master, meta.get("server_id"))):
        raise ServerError(f"pid {master} of pidfile {pidfile} is not the server tuna-lab started (another start "
                          "time, or no mark of ours); nothing was signalled or deleted")
    return master, meta


def _check_pidfile(pidfile):
    """Refuse (ServerError) a pidfile that cannot be written, that names a process that runs, or that holds data.

    Gunicorn would refuse the second too, but only once started - and the
    launcher's notes beside a running server's pidfile would be gone by then.
    Gunicorn writes any other file there over, and removes it when it stops:
    so a file that holds anything but a process id (a user's data, a typo
    for another file) is refused, as is a path through a link or folder
    another user could have planted (:func:`~tuna_lab._files.check_path`;
    a sticky folder such as ``/tmp`` is fine: Gunicorn renames its file in).
    """
    folder = os.path.dirname(pidfile)
    if not os.path.isdir(folder):
        raise ServerError(f"cannot write the pidfile {pidfile}: {folder} is not a folder")
    _files.check_path(folder, "the pidfile's folder", ServerError, sticky=True)
    _, st = _files.check_path(pidfile, "pidfile", ServerError, link=False)
    if st is None:
        return
    if not stat.S_ISREG(st.st_mode):
        # Gunicorn reads an existing pidfile first: a FIFO there would hang it.
        raise ServerError(f"pidfile {pidfile} is {_files.file_kind(st.st_mode)}, not a regular file; choose another")
    if st.st_uid != os.geteuid():
        raise ServerError(f"pidfile {pidfile} belongs to another user (uid {st.st_uid}); choose another")
    if st.st_size == 0:
        return                          # holds nothing: Gunicorn writes it
    try:
        master = _read_pid(pidfile)
    except FileNotFoundError:
        return                          # gone since
    except ServerError:
        raise ServerError(f"pidfile {pidfile} exists and holds something other than a process id; refusing to "
                          "write over it (choose another pidfile, or remove the file)") from None
    if not _process(master):
        return                          # stale: a server's that is gone
    try:
        _, meta = _sidecar(pidfile)
    except ServerError:
        raise ServerError(f"pidfile {pidfile} names process {master}, which runs and is not a server tuna-lab "
                          "started; remove the file or choose another pidfile") from None
    raise ServerError(f"pidfile {pidfile} belongs to the server running at {meta.get('url')} (master {master}); "
                      f"stop it first (tuna-lab stop --pidfile {pidfile}) or choose another pidfile")


def remove_stale_state_dirs(folder=None):
    """Remove the state folders of :class:`Server` (``tuna-lab-server-*``) that are ours and no longer in use.

    A folder is removed only when it is this user's and private
    (:func:`~tuna_lab._files.trusted_dir`) and its owner record names
    processes that are all gone (each PID checked with its start time, so a
    PID reused since does not count). Folders of earlier versions have no
    owner record; the launcher's notes of a server started with the default
    pidfile (in the folder) name its master instead. A folder with neither
    (one being made right now) is left alone. Run by every :meth:`Server.start`.

    Parameters
    ----------
    folder : str, optional
        Where to look; default :func:`tempfile.gettempdir`.

    Returns
    -------
    list of str
        The folders removed.

    Examples
    --------
    >>> remove_stale_state_dirs("/nonexistent")
    []
    """
    return remove_dead_folders(folder or tempfile.gettempdir(), rf"{re.escape(_STATE_PREFIX)}.*", _state_users)


def _our_state_dir(path, master, ticks):
    """Whether ``path`` is a state folder :class:`Server` made for ``master`` (started at ``ticks``).

    The notes beside a pidfile say which folder to remove; they are only
    believed for a folder of ours in the temporary folder, private, whose own
    owner record names that master: notes someone edited cannot make ``stop``
    remove anything else.
    """
    if not isinstance(path, str):
        return False
    parent, name = os.path.split(os.path.abspath(path))
    if parent != os.path.abspath(tempfile.gettempdir()) or not name.startswith(_STATE_PREFIX):
        return False
    if _files.trusted_dir(path, {os.geteuid()}) is not None:
        return False
    return (master, ticks) in _state_users(path)


def _state_users(path, _match=None):
    """``(pid, start ticks)`` of the processes the state folder ``path`` says keep it in use; [] if it says none."""
    for name, keys in ((_OWNER_FILE, (("launcher", "launcher_ticks"), ("master", "master_ticks"))),
                       ("gunicorn.pid.tuna.json", (("master", "start_ticks"),))):
        try:
            record = _files.read_json(os.path.join(path, name), limit=1 << 16, follow=False)
        except OSError:
            continue
        if isinstance(record, dict):
            return [(record.get(pid), record.get(ticks)) for pid, ticks in keys]
    return []


def status(pidfile):
    """Live view of a server: worker -> thread (role, TID) -> allowed CPUs, read from /proc.

    Examples
    --------
    >>> # Skipped as a doctest: it needs a live server started with that pidfile.
    >>> info = status("/tmp/srv.pid")                                   # doctest: +SKIP
    >>> [(t["role"], t["cpus"]) for t in info["workers"][0]["threads"]]   # doctest: +SKIP
    [('main', [0]), ('openmp', [1])]
    """
    master, meta = _sidecar(pidfile)
    records = {r["pid"]: r for r in _records(meta["state_dir"], meta["workers"])}
    workers = []
    for pid in sorted(c.pid for c in _children(master)):
        rec = records.get(pid, {})
        roles = {t["tid"]: t for t in rec.get("threads", [])}
        threads = []
        for tid in threads_of(pid):
            try:
                cpus = sorted(affinity_of(tid))
            except TunaError:
                continue
            known = roles.get(tid, {})
            threads.append({"tid": tid, "role": known.get("role", "other"), "rank": known.get("rank"),
                            "cpus": cpus, "expected": known.get("expected")})
        workers.append({"pid": pid, "slot": rec.get("slot"), "ready": bool(rec.get("ready")),
                        "threads": threads})
    workers.sort(key=lambda w: (w["slot"] is None, w["slot"]))
    return {"master": master, "url": meta["url"], "policy": meta["policy"], "model": meta["model"],
            "workers_expected": meta["workers"], "threads": meta["threads"],
            "server_cpus": meta.get("server_cpus"),
            "master_cpus": sorted(affinity_of(master)), "workers": workers}


def stop(pidfile, timeout=15):
    """Stop the server of ``pidfile``: SIGTERM its master, SIGKILL whatever is left after ``timeout`` s.

    The launcher's notes beside the pidfile go too, and so does the server's
    scratch directory when the launcher made it (as :meth:`Server.stop` does).

    Before anything is signalled, the PID is checked to be the master the
    launcher started: its start time (:func:`~tuna_lab.machine.procfs.start_ticks`, recorded at start)
    and the mark :data:`SERVER_ID_VAR` in its environment. A pidfile naming
    any other process - a PID reused since, a file someone edited - raises
    :class:`ServerError`, and nothing is signalled or deleted.

    Examples
    --------
    Returns
    -------
    dict
        What was stopped: ``master``, ``url``, ``policy``, ``model``,
        ``workers``, ``threads`` (from the launcher's notes).

    Examples
    --------
    >>> # Skipped as a doctest: it stops a live server.
    >>> stop("/tmp/srv.pid")["url"]   # doctest: +SKIP
    'http://127.0.0.1:8000'
    """
    master, meta = _sidecar(pidfile)
    terminate(master, timeout)
    if meta.get("own_state") and _our_state_dir(meta.get("state_dir"), master, meta.get("start_ticks")):
        shutil.rmtree(meta["state_dir"], ignore_errors=True)
    with contextlib.suppress(OSError):
        os.remove(pidfile + ".tuna.json")
    # Gunicorn removes its pidfile when it exits cleanly; after a SIGKILL it is left. Removed here only
    # while it still names the master just stopped: a file written there since is someone else's.
    with contextlib.suppress(OSError, ServerError):
        if _read_pid(pidfile) == master:
            os.remove(pidfile)
    return {"master": master, **{key: meta.get(key) for key in ("url", "policy", "model", "workers", "threads")}}
