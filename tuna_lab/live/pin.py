"""Pin a server that is already running, by its master's PID.

A server is a master process and its children. Not every child serves
requests: :func:`server_roles` tells the **workers** (the processes that run
an inference runtime, or accept on the server's socket) from **front ends**
(an API process that answers HTTP and passes requests on over a queue) and
**helpers** (a multiprocessing Manager or resource tracker, a metrics
exporter), each with the reason; only workers get a slot. ``--workers`` and
``--worker-match`` (:class:`WorkerChoice`) name them where the discovery
cannot. :func:`pin_server` gives each worker a *slot* of a
:class:`~tuna_lab.placement.plan.Plan` (workers in start order), finds its
threads and binds them by TID:

* the **main thread** is the thread whose TID is the worker's PID;
* the **pool threads** are the threads that sit in an OpenMP or BLAS runtime,
  or that work while the worker serves requests
  (:func:`~tuna_lab.placement.pools.classify_threads`). Pool threads are
  ranked by TID, which is their creation order;
* every other thread (Python threads, Gunicorn's, jemalloc's, a thread that
  never stopped running while we looked) is left alone, and the report says why.

Binding the main thread to a single CPU has a cost this project measured:
without ``OMP_PLACES``, GNU libgomp counts the CPUs of the calling thread's
*current* affinity, and XGBoost runs ``min(nthread, that count)`` threads - a
main thread pinned to one CPU makes every later request single-threaded. So
unless the worker was started with ``OMP_PLACES`` (read from its environment;
not with ``OMP_PROC_BIND=false``) and has loaded its OpenMP runtime, its main
thread is bound to all of its slot's CPUs, which keeps libgomp's pool size;
the pool threads get their own CPUs. Each worker is bound by
:func:`~tuna_lab.placement.binding.bind_worker`, as the Gunicorn hooks bind theirs.

Every mask :func:`pin_server` sets is recorded with the mask it replaced;
:func:`unpin_server` gives a thread its old mask back only while it is still
on the one tuna_lab set (a mask someone else set since is theirs), and
:func:`watch_server` re-pins a replacement worker to the slot its predecessor
left. Nothing here pins the master.

Examples
--------
>>> import os
>>> [t.role for t in classify_threads(os.getpid())][:1]
['main']
"""

import contextlib
import dataclasses
import glob
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field

import psutil

from .. import _files
from .._checks import format_cpulist
from ..errors import BindingError, PinError
from ..machine import procfs
from ..machine.procfs import remove_dead_folders, start_ticks
from .binding import affinity_of, bind, bind_worker, planned_cpus, threads_of
from .pools import (ACTIVE_FLOOR, ACTIVE_SHARE, RUNNING, ThreadRole, active_threads, classify_threads,
                    loaded_runtimes, main_rule, thread_cpu_times)

__all__ = ["ThreadRole", "Activity", "classify_threads", "thread_cpu_times", "active_threads", "serve_requests",
           "ACTIVE_FLOOR", "ACTIVE_SHARE", "WorkerChoice", "ProcessRole", "ServerRoles", "server_roles", "worker_pids", "worker_slots", "server_threads", "pin_server",
           "check_front_cpus", "server_cpus", "front_work", "role_cpu_times", "FRONT_SHARE", "FRONT_FLOOR",
           "unpin_server", "pin_records", "watch_server", "PinReport", "check_server", "hook_dir", "hook_mark",
           "hook_records", "hook_dir_problem", "trusted_hook_dir", "write_hook_record", "remove_dead_state",
           "HOOK_MARK", "HOOK_RECORDS"]

# Rounds of --watch that look again at a worker with such a thread: a pool thread busy with
# a request settles within them (then it is bound); one that always spins never does.
_WATCH_RETRIES = 25
# Children of a master that are no workers, by their command line: uvicorn --workers and MLServer start their
# workers with multiprocessing's spawn, which first starts a resource tracker (and forkserver, a fork server).
_HELPER_PROCESSES = (("multiprocessing.resource_tracker", "multiprocessing's resource tracker"),
                     ("multiprocessing.forkserver", "multiprocessing's fork server"))


@dataclass
class PinReport:
    """What a pin, unpin, watch or status did: the server's processes by role, per worker its slot and every
    thread's CPUs; warnings, and a ``note`` (an unpin that found nothing to undo says so there)."""

    master: int
    plan: object
    workers: list = field(default_factory=list)
    warnings: list = field(default_factory=list)
    roles: object = None
    note: str = None
    fronts: list = field(default_factory=list)
    front: dict = None

    def to_dict(self):
        """JSON-able: ``master``, ``policy``, ``workers`` (slot, pid, why, threads), ``warnings``; with the
        roles found, ``processes`` (the master and the helpers, each ``pid``, ``role``, ``why``, ``command``);
        with ``--front-cpus``, ``front_cpus`` (each process bound there: ``pid``, ``role``, ``cpus``,
        ``threads``); with traffic, ``front_work`` (:func:`front_work`)."""
        out = {"master": self.master, "policy": getattr(self.plan, "policy", None),
               "fingerprint": getattr(self.plan, "fingerprint", None),
               "workers": self.workers, "warnings": list(self.warnings)}
        if self.roles is not None:
            out["processes"] = [r.to_dict() for r in (self.roles.master, *self.roles.helpers)]
        if self.fronts:
            out["front_cpus"] = self.fronts
        if self.front is not None:
            out["front_work"] = self.front
        if self.note:
            out["note"] = self.note
        return out

    def add_activity(self, activity, front_cpus=None):
        """Say what the traffic showed: workers that served none of it, and the CPU the master and front ends
        used beside the workers' (:func:`front_work`); where they did real work and ``front_cpus`` is not
        given, one warning suggests ``--front-cpus``."""
        if activity is None:
            return self
        if activity.idle:
            self.warnings.append(f"worker(s) {', '.join(map(str, activity.idle))} served none of the "
                                 f"{activity.requests} requests sent in {activity.seconds:.1f} s")
        self.front = activity.front
        if self.front and self.front["real_work"] and not front_cpus:
            self.warnings.append(f"{self.front['text']}: the master and front ends do real work, on the workers' "
                                 "CPUs; "
                                 "--front-cpus CPULIST keeps them (all their threads) on CPUs of their own and "
                                 "places the workers on the rest")
        return self

    def describe(self, warnings=False):
        """The report as text: the master and helpers, then one block per worker, one line per thread with the
        evidence of its role.

        Warnings are left out unless ``warnings``: the CLI prints them once, on stderr.
        """
        lines = [f"server {self.master}" + (f": {self.plan.policy}, {self.plan.workers} workers x "
                                            f"{self.plan.threads} threads" if self.plan else "")]
        if self.roles is not None:
            lines.append(f"  master {self.roles.master.pid}: {self.roles.master.why}")
            lines += [f"  {h.role} {h.pid}: {h.why}" for h in self.roles.helpers]
        lines += [f"  {f['role']} {f['pid']}: {f['threads']} thread(s) bound to CPUs {format_cpulist(f['cpus'])} "
                  "(--front-cpus)" for f in self.fronts]
        if self.front is not None:
            lines.append(f"  {self.front['text']}")
        why = {w.pid: w.why for w in self.roles.workers} if self.roles is not None else {}
        for w in self.workers:
            reason = w.get("why") or why.get(w["pid"])
            head = (f"  process {w['pid']} (--front-cpus)" if w["slot"] is None else
                    f"  worker {w['pid']} (slot {w['slot']})")
            lines.append(head + (f": {reason}" if reason else ""))
            for t in w["threads"]:
                rank = "" if t["rank"] is None else f" {t['rank']}"
                cpus = format_cpulist(t["cpus"]) if t["cpus"] else "?"
                planned = ""
                if t.get("planned") is not None:
                    planned = f"  plan {format_cpulist(t['planned'])}" + (
                        "" if sorted(t["planned"]) == sorted(t["cpus"] or ()) else "  (differs)")
                evidence = f"  [{t['evidence']}]" if t.get("evidence") else ""
                note = f"  - {t['why']}" if t["role"] == "other" else ""
                if t.get("note"):
                    note = f"  - {t['note']}"
                lines.append(f"    {t['role']:>5}{rank:<3} tid {t['tid']:<8} cpus {cpus}{planned}{evidence}{note}")
        if self.note:
            lines.append(self.note)
        if warnings:
            lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


# -- finding workers and threads ---------------------------------------------------------------

@dataclass(frozen=True)
class WorkerChoice:
    """Which processes are the workers when the user says so, overriding :func:`server_roles`' discovery.

    ``pids``: the worker PIDs (``--workers PID,PID``), each a descendant of
    the master; ``match``: a regular expression searched for in every
    descendant's command line (``--worker-match REGEX``). Empty: discover.

    Examples
    --------
    >>> WorkerChoice.parse("12, 7", None).pids
    (12, 7)
    >>> WorkerChoice.parse(None, "inference_worker").match.pattern
    'inference_worker'
    >>> WorkerChoice.parse("12,x", None)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.PinError: --workers takes PIDs separated by commas (e.g. 4121,4122), got '12,x'
    """

    pids: tuple = ()
    match: object = None

    @classmethod
    def parse(cls, pids=None, match=None):
        """From the options' text: ``pids`` ``"PID,PID"`` and ``match`` a regular expression; PinError if bad."""
        if pids is not None and match is not None:
            raise PinError("give either --workers or --worker-match, not both")
        found = ()
        if pids is not None:
            try:
                found = tuple(int(p) for p in str(pids).split(","))
            except ValueError:
                found = ()
            if not found or any(p <= 0 for p in found) or len(set(found)) != len(found):
                raise PinError(f"--workers takes PIDs separated by commas (e.g. 4121,4122), got {pids!r}")
        pattern = None
        if match is not None:
            try:
                pattern = re.compile(str(match))
            except re.error as exc:
                raise PinError(f"--worker-match {match!r} is not a regular expression: {exc}") from None
        return cls(found, pattern)

    def __bool__(self):
        return bool(self.pids) or self.match is not None


@dataclass(frozen=True)
class ProcessRole:
    """One process of a server: PID, ``role`` (``master``, ``worker``, ``front end``, ``helper``), why, command."""

    pid: int
    role: str
    why: str
    command: str = ""

    def to_dict(self):
        return {"pid": self.pid, "role": self.role, "why": self.why, "command": self.command}


@dataclass(frozen=True)
class ServerRoles:
    """The processes of a server by role: its master, its workers (oldest first) and the rest (helpers)."""

    master: ProcessRole
    workers: tuple
    helpers: tuple

    @property
    def worker_pids(self):
        return [w.pid for w in self.workers]

    def left_out(self):
        """The helpers as ``PID (role: why)`` text, for an error that says who was not counted."""
        return "; ".join(f"{h.pid} ({h.role}: {h.why})" for h in self.helpers) or "none"


@dataclass(frozen=True)
class _Facts:
    """What /proc says of one process: start time, command, inference runtimes, TCP and Manager sockets."""

    pid: int
    started: float
    command: str
    runtimes: tuple
    listening: frozenset
    ports: frozenset
    connections: int
    manager: str


def _facts(proc):
    """The :class:`_Facts` of a psutil process; None if it is gone or a zombie."""
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        try:
            command = " ".join(proc.cmdline())
        except psutil.AccessDenied:
            command = ""
        tcp = proc.net_connections("tcp")
        unix = proc.net_connections("unix")
        started = proc.create_time()
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        raise PinError(f"permission denied: cannot read the sockets of process {proc.pid}") from None
    listening = frozenset(c.laddr.port for c in tcp if c.laddr and c.status == psutil.CONN_LISTEN)
    ports = frozenset(c.laddr.port for c in tcp if c.laddr)
    connected = sum(1 for c in tcp if c.status == psutil.CONN_ESTABLISHED)
    # multiprocessing.Manager() serves its proxies on a socket in a pymp-* folder of its own.
    manager = next((c.laddr for c in unix if isinstance(c.laddr, str) and "/pymp-" in c.laddr
                    and os.path.basename(c.laddr).startswith("listener-")), "")
    return _Facts(proc.pid, started, command, tuple(loaded_runtimes(proc.pid)), listening, ports,
                  connected, manager)


def _sockets(f):
    held = [f"listens on port {', '.join(map(str, sorted(f.listening)))}"] if f.listening else []
    if f.connections:
        held.append(f"{f.connections} TCP connection{'' if f.connections == 1 else 's'}")
    return " and ".join(held) or f"TCP sockets on port {', '.join(map(str, sorted(f.ports)))}"


def _runtime_words(f):
    return ", ".join(f.runtimes)


def _discover(master_facts, children):
    """``{pid: (role, why)}`` of ``children`` (:class:`_Facts`) by what each holds and runs; see :func:`server_roles`."""
    roles = {}
    rest = []
    for f in children:
        named = next((what for mark, what in _HELPER_PROCESSES if mark in f.command), None)
        if named:
            roles[f.pid] = ("helper", f"{named} (its command line)")
        elif f.manager:
            roles[f.pid] = ("helper", f"a multiprocessing Manager: it serves proxies on {f.manager}")
        else:
            rest.append(f)
    runtime = [f for f in rest if f.runtimes]
    server_ports = set(master_facts.listening) | {p for f in runtime for p in f.listening}

    def serves(f):
        return bool(f.ports & server_ports) if server_ports else bool(f.ports)

    fed = [f for f in runtime if not f.ports]
    if fed:
        # Runtime processes that hold no socket take their requests over a queue or pipe from a front end.
        for f in fed:
            roles[f.pid] = ("worker", (f"runs {_runtime_words(f)} and holds no TCP socket: it takes its requests "
                                       "over a queue or pipe from the process that answers HTTP"))
    elif runtime:
        for f in runtime:
            roles[f.pid] = ("worker", f"runs {_runtime_words(f)} and {_sockets(f)}: it serves requests itself")
    else:
        for f in rest:
            if serves(f):
                roles[f.pid] = ("worker", (f"{_sockets(f)} (the server's) and loads no known inference runtime: "
                                           "it serves requests itself"))
    for f in rest:
        if f.pid in roles:
            continue
        if serves(f):
            also = (f"; it loads {_runtime_words(f)} too, but the processes that run requests hold no socket"
                    if f.runtimes else " but runs no inference runtime")
            roles[f.pid] = ("front end", f"{_sockets(f)} (the server's){also}: it answers HTTP and passes requests on")
        elif f.ports:
            ports = ", ".join(map(str, sorted(server_ports)))
            roles[f.pid] = ("helper", (f"{_sockets(f)}, not the server's port{'' if len(server_ports) == 1 else 's'} "
                                       f"{ports}, and runs no inference runtime (a metrics exporter or another side "
                                       "service)"))
        else:
            roles[f.pid] = ("helper", "holds no TCP socket and runs no inference runtime")
    return roles


def server_roles(master, choice=None, force=False):
    """The master, workers and helpers of the running server ``master``, each with the reason.

    A **worker** serves requests. Among the master's child processes (not
    multiprocessing's resource tracker or fork server, nor a multiprocessing
    Manager, which are helpers by what they are):

    * the processes that run an inference runtime
      (:func:`~tuna_lab.placement.pools.loaded_runtimes`: XGBoost, ONNX
      Runtime, PyTorch, LightGBM, OpenMP) and hold no TCP socket are the
      workers when there are any: they take requests from a front end over a
      queue (LitServe's inference workers, MLServer's parallel workers); the
      processes that hold the server's socket are **front ends**;
    * else every process that runs one (Gunicorn's and uvicorn's workers,
      each accepting on the shared socket);
    * else, when none runs a known runtime, every process that holds the
      server's socket (the master's listening ports) or a TCP connection.

    Any other child is a **helper**: reported, never given a slot or pinned
    (a metrics exporter listens on a port of its own). ``choice``
    (:class:`WorkerChoice`) names the workers instead; ``force`` takes every
    child that is no helper by what it is when none is found a worker.

    Raises
    ------
    PinError
        No such process, no children, no worker found (the message names the
        children and why none counts), or a ``choice`` that names none.
    """
    choice = choice or WorkerChoice()
    try:
        proc = psutil.Process(int(master))
        children = proc.children()
        descendants = proc.children(recursive=True) if choice else children
    except (psutil.NoSuchProcess, ValueError, TypeError):
        raise PinError(f"no process with PID {master}") from None
    except psutil.AccessDenied:
        raise PinError(f"permission denied: cannot see the children of PID {master}") from None
    master_facts = _facts(proc)
    if master_facts is None:
        raise PinError(f"no process with PID {master}")
    facts = [f for f in map(_facts, children) if f is not None]
    if not facts and not choice:
        raise PinError(f"PID {master} has no child processes: not a pre-fork server's master, "
                       "or its workers have not started yet")
    roles = _discover(master_facts, facts)
    head = ProcessRole(int(master), "master", _master_why(master_facts, facts, roles), master_facts.command)
    if choice:
        picked = _chosen(master, choice, descendants)
        by_pid = {f.pid: f for f in facts}
        extra = [f for f in map(_facts, [d for d in descendants if d.pid in picked and d.pid not in by_pid])
                 if f is not None]
        by_pid.update({f.pid: f for f in extra})
        how = "--workers" if choice.pids else f"--worker-match {choice.match.pattern!r}"
        workers = [ProcessRole(p, "worker", f"named by {how}", by_pid[p].command) for p in picked if p in by_pid]
        helpers = [ProcessRole(f.pid, roles[f.pid][0] if roles[f.pid][0] != "worker" else "helper",
                               f"not named by {how}" + ("" if roles[f.pid][0] == "worker" else
                                                         f"; {roles[f.pid][1]}"), f.command)
                   for f in facts if f.pid not in picked]
        order = {f.pid: f.started for f in by_pid.values()}
        return ServerRoles(head, tuple(sorted(workers, key=lambda w: (order[w.pid], w.pid))), tuple(helpers))
    workers = [f for f in facts if roles[f.pid][0] == "worker"]
    if not workers and force:
        workers = [f for f in facts if not any(mark in f.command for mark, _ in _HELPER_PROCESSES)
                   and not f.manager]
        for f in workers:
            roles[f.pid] = ("worker", f"a child process (--force; {roles[f.pid][1]})")
    helpers = [ProcessRole(f.pid, *roles[f.pid], f.command) for f in facts if roles[f.pid][0] != "worker"]
    out = ServerRoles(head, tuple(ProcessRole(f.pid, "worker", roles[f.pid][1], f.command)
                                  for f in sorted(workers, key=lambda f: (f.started, f.pid))), tuple(helpers))
    if not out.workers:
        name = os.path.basename(master_facts.command.split(" ")[0]) if master_facts.command else "?"
        raise PinError(f"PID {master} ({name}) is not a recognised pre-fork server: none of its "
                       f"{len(facts)} child process{'' if len(facts) == 1 else 'es'} serves requests (holds a TCP "
                       f"socket or runs an inference runtime): {out.left_out()}; name the workers with --workers "
                       "PID,PID or --worker-match REGEX, or give --force to take every child")
    return out


def _master_why(master, children, roles):
    """Why the master is what it is: a manager of pre-fork workers, or a front end that parses requests itself."""
    if not master.ports:
        return "holds no TCP socket: it starts and watches its children"
    shared = [f for f in children if roles[f.pid][0] == "worker" and f.listening & master.listening]
    if shared:
        return f"{_sockets(master)}, which its workers accept on: it starts and watches them"
    if any(role == "front end" for role, _ in roles.values()):
        return f"{_sockets(master)}, which its front ends answer on: it starts and watches its children"
    return (f"{_sockets(master)} and no child of it answers there: it reads and parses the requests itself and "
            "passes them to its workers (its CPU time is the front end's; only --front-cpus places it)")


def _chosen(master, choice, descendants):
    """The PIDs ``choice`` names among ``descendants`` of ``master``, in its order (PinError if it names none)."""
    live = {}
    for d in descendants:
        try:
            if d.status() != psutil.STATUS_ZOMBIE:
                live[d.pid] = " ".join(d.cmdline())
        except psutil.AccessDenied:
            live[d.pid] = ""
        except psutil.NoSuchProcess:
            continue
    if choice.pids:
        strangers = [p for p in choice.pids if p not in live]
        if strangers:
            raise PinError(f"--workers: process {strangers[0]} is not a live child (or descendant) of server "
                           f"{master}")
        return list(choice.pids)
    picked = [pid for pid, command in live.items() if choice.match.search(command)]
    if not picked:
        raise PinError(f"--worker-match {choice.match.pattern!r} matches the command line of none of the "
                       f"{len(live)} processes under server {master}")
    return picked


def worker_pids(master, choice=None, force=False):
    """The master's worker processes, oldest first (their slot order): :func:`server_roles`' workers.

    Raises
    ------
    PinError
        No process ``master``, no children, or no child that serves requests
        (see :func:`server_roles`).
    """
    return server_roles(master, choice, force).worker_pids


def check_server(master, force=False, choice=None):
    """Refuse (:class:`PinError`) to pin ``master`` unless it is a server whose workers are found, or ``force``.

    PID 1 (init, or a container's first process) is always refused unless
    ``force``: its children are the whole system's (or container's)
    services. Any other process is a server's master when :func:`server_roles`
    finds its workers (or ``choice`` names them): a shell whose children are
    ``sleep`` processes is none. Returns the workers' PIDs.

    Examples
    --------
    >>> check_server(1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tuna_lab.errors.PinError: PID 1 is the system's (or container's) first process, not a server's master; ...
    """
    if int(master) == 1 and not force:
        raise PinError("PID 1 is the system's (or container's) first process, not a server's master; "
                       "give --force to pin its children anyway")
    return worker_pids(master, choice, force)


@dataclass
class Activity:
    """CPU time every worker thread gained while a server served requests.

    ``threads[pid][tid]`` is seconds gained by thread ``tid`` of worker
    ``pid``; ``requests`` how many requests were sent over ``seconds`` wall
    seconds; ``idle`` the workers that gained (next to) no CPU time, i.e.
    served none of them.
    """

    threads: dict
    requests: int = 0
    seconds: float = 0.0
    idle: tuple = ()
    front: dict = None


# What a worker must gain in CPU time (s) over the requests to count as having served some.
_SERVED = 0.005
# ... and each worker at least this share of the busiest one's CPU: the kernel may hand one worker most of
# a few requests, and a worker that served one of them may not have woken its pool (ONNX Runtime's runs a
# small request on the main thread alone), which would then not be told by its activity.
_FAIR_SHARE = 0.25
#: The master and front ends do real work (:func:`front_work`) when they use at least this share of the
#: workers' CPU time ...
FRONT_SHARE = 0.05
#: ... and at least this many seconds: a Gunicorn or uvicorn master that only watches its workers uses none.
FRONT_FLOOR = 0.01


def role_cpu_times(roles):
    """``{pid: CPU seconds so far}`` of every process of ``roles`` (a :class:`ServerRoles`); gone ones left out.

    A process's own count (``utime + stime``, clock ticks), not the sum of
    its threads': a threaded HTTP server's request threads have ended by the
    time it is read, and their time with them.
    """
    out = {}
    for proc in (roles.master, *roles.helpers, *roles.workers):
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(proc.pid).cpu_times()
            out[proc.pid] = times.user + times.system
    return out


def front_work(roles, before, after, requests=None):
    """What the master, helpers and front ends ran beside the workers between two :func:`role_cpu_times`.

    A master that parses HTTP and JSON (MLServer's) or an API front end
    (LitServe's) runs the same requests as the workers; none of it is placed
    by a plan. Returns ``{"processes": [{"pid", "role", "cpu_s"}], "front_cpu_s",
    "workers_cpu_s", "requests", "real_work", "text"}``: ``real_work`` when
    the front used at least :data:`FRONT_SHARE` of the workers' CPU time and
    :data:`FRONT_FLOOR` seconds; ``text`` says it in one line ("master used
    0.22 s of CPU against 1.09 s for the workers over 50 requests").
    """
    def gained(pid):
        return max(0.0, after.get(pid, 0.0) - before.get(pid, 0.0)) if pid in before else 0.0

    fronts = [{"pid": p.pid, "role": p.role, "cpu_s": round(gained(p.pid), 4)} for p in (roles.master, *roles.helpers)]
    workers = sum(gained(w.pid) for w in roles.workers)
    front = sum(f["cpu_s"] for f in fronts)
    busy = [f for f in fronts if f["cpu_s"] >= FRONT_FLOOR / 2] or fronts[:1]
    words = ", ".join(f"{f['role']} {f['pid']} used {f['cpu_s']:.2f} s" for f in busy)
    over = f" over {requests} requests" if requests else ""
    text = f"{words} of CPU against {workers:.2f} s for the workers{over}"
    return {"processes": fronts, "front_cpu_s": round(front, 4), "workers_cpu_s": round(workers, 4),
            "requests": requests, "real_work": front >= FRONT_FLOOR and front >= FRONT_SHARE * workers,
            "text": text}
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _check_loopback(url):
    from urllib.parse import urlsplit
    import ipaddress

    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        loopback = host in _LOOPBACK_NAMES or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if parts.scheme not in ("http", "https") or not loopback:
        raise PinError(f"--url must be an http:// URL on this machine's loopback (127.0.0.1, localhost, ::1), "
                       f"got {url!r}")


def _send(opener, url, method, headers, body, timeout):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers))
    try:
        with opener.open(req, timeout=timeout) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        # Say what was sent: a 415 or 422 is most often a content type the server does not take.
        ctype = {k.lower(): v for k, v in headers}.get("content-type", "none")
        raise PinError(f"{method} {url} answered {exc.code} {exc.reason} to Content-Type {ctype}, a "
                       f"{len(body or b'')}-byte body: give the URL (and --method, --header, --body) of a "
                       "request that runs the model") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise PinError(f"cannot send {method} {url}: {getattr(reason, 'strerror', None) or reason}") from None


def serve_requests(master, url, method=None, headers=(), body=None, requests=8, max_requests=64,
                   max_seconds=15.0, timeout=10.0, choice=None):
    """Send a few requests to the running server ``master`` and measure what each worker thread ran meanwhile.

    Parameters
    ----------
    master, url : int, str
        The server's master PID; a loopback URL of a request that runs the model.
    method, headers, body : str, iterable of (str, str), bytes, optional
        Default ``POST`` with a ``body``, else ``GET``; request headers; the body of every request.
    requests, max_requests, max_seconds, timeout : int, int, float, float
        Requests sent at least, at most; seconds at most; seconds per request.
    choice : WorkerChoice, optional
        The workers, when the user names them (:func:`server_roles`).

    Returns
    -------
    Activity
        Per worker, per thread, the CPU seconds gained; pass it to :func:`pin_server`.

    Raises
    ------
    PinError
        Not a loopback URL, a request that fails, or no such server. Nothing is bound.

    Notes
    -----
    See docs/your-server.md, section "2. One command for a server that is already running".

    Examples
    --------
    >>> serve_requests(1, "http://example.com/")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tuna_lab.errors.PinError: --url must be an http:// URL on this machine's loopback ...
    """
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    _check_loopback(url)
    method = (method or ("POST" if body is not None else "GET")).upper()
    headers = list(headers or ())
    roles = server_roles(master, choice)
    workers = roles.worker_pids
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    before = {pid: thread_cpu_times(pid) for pid in workers}
    processes = role_cpu_times(roles)
    start, sent = time.monotonic(), 0
    gains = {}
    with ThreadPoolExecutor(len(workers)) as pool:
        while True:
            list(pool.map(lambda _: _send(opener, url, method, headers, body, timeout), range(len(workers))))
            sent += len(workers)
            gains = {}
            for pid in workers:
                try:
                    now = thread_cpu_times(pid)
                except PinError:
                    continue                           # the worker exited meanwhile
                gains[pid] = {tid: now[tid] - before[pid].get(tid, 0.0) for tid in now}
            spent = {pid: sum(gains.get(pid, {}).values()) for pid in workers}
            idle = tuple(pid for pid in workers if spent[pid] < _SERVED)
            fair = min(spent.values(), default=0.0) >= _FAIR_SHARE * max(spent.values(), default=0.0)
            elapsed = time.monotonic() - start
            if (sent >= requests and not idle and fair) or sent >= max_requests or elapsed >= max_seconds:
                front = front_work(roles, processes, role_cpu_times(roles), sent)
                return Activity(gains, sent, elapsed, idle, front)


def _activity_of(activity, pid):
    """``({tid: s} or None, requests)`` of worker ``pid`` from an :class:`Activity` or a plain dict."""
    if activity is None:
        return None, None
    if isinstance(activity, Activity):
        return activity.threads.get(pid), activity.requests
    return activity.get(pid), None




def hook_dir(master):
    """Where the Gunicorn hooks (:mod:`tuna_lab.integrations.gunicorn`) of server ``master`` keep their state.

    Keyed by the master's owner, PID and start time: a later master with a
    recycled PID (PID 1 in a restarted container) must not inherit an old
    plan, old slots or an old refusal. The start time is the kernel's, in
    clock ticks since boot: a wall-clock time would change when the clock is
    stepped, and a replacement worker would then look for another folder.
    Only a folder :func:`hook_dir_problem` accepts is ever used.
    """
    proc = psutil.Process(int(master))
    return os.path.join(tempfile.gettempdir(), f"tuna_lab-gunicorn-{proc.uids().real}-{master}-{_started(master)}")


#: The file in the hooks' state folder that says which server made it (:func:`hook_mark`).
HOOK_MARK = "server"
#: The subfolder of the hooks' state folder the workers write their slot records in, after
#: Gunicorn's ``user =`` dropped them to that user: theirs, while the folder above stays the master's.
HOOK_RECORDS = "records"
# Size caps of the small files the hooks and `pin --pid` read back.
_MARK_BYTES, _RECORD_BYTES, _MASKS_BYTES = 512, 4096, 16 << 20


def hook_mark(master):
    """What the marker of ``master``'s state folder says: the master's PID and start time, and the boot.

    The folder's name holds the first two; the boot tells a folder of this
    server from one a temporary folder kept across a reboot holds under the
    same name.
    """
    boot = procfs.boot_id()
    return f"tuna_lab hooks of master {int(master)} started {_started(master)} boot {boot}\n"


def hook_dir_problem(path, master, owner):
    """Why the hooks' state folder ``path`` of ``master`` cannot be trusted; None when it can.

    Trusted only if it is a real folder of ``owner`` (the master's effective
    user, who made it: never the workers' user of Gunicorn's ``user =``) that
    no one else may write, holding the marker its maker wrote before giving it
    its name (:func:`hook_mark`). A folder someone made at the name before
    the server's first worker did is refused, whoever owns it.

    Examples
    --------
    >>> hook_dir_problem("/proc/nonexistent", os.getpid(), os.geteuid())
    'it is missing'
    """
    why = _files.trusted_dir(path, {owner})
    if why:
        return f"it {why}"
    try:
        mark = _files.read_text(os.path.join(path, HOOK_MARK), limit=_MARK_BYTES, follow=False)
    except OSError:
        mark = None
    if mark != hook_mark(master):
        return "this server did not make it (it holds no marker of this server's)"
    return None


def hook_records(master):
    """The folder of ``master``'s hook records if it and the state folder above it are trusted; else None."""
    try:
        proc = psutil.Process(int(master))
        owner = proc.uids().effective
        # The records are written by the workers, under Gunicorn's `user =` as that user.
        writers = {owner} | {child.uids().effective for child in proc.children()}
        if hook_dir_problem(hook_dir(master), master, owner):
            return None
    except (psutil.Error, OSError):
        return None
    records = os.path.join(hook_dir(master), HOOK_RECORDS)
    return None if _files.trusted_dir(records, writers) else records


def remove_dead_state(kind, uid):
    """Remove ``tuna_lab-KIND-UID-PID-START`` folders of this user in the temporary folder whose process is gone.

    Such folders are named after a process (a Gunicorn master, a pinned
    server's master) and its kernel start time; they outlive it when it is
    killed. One is removed only if it is this user's and private (another
    user's is never touched) and no process of that PID and start time runs.
    A name with a suffix (``.XXXXXX``: a folder being made) counts as its process's.
    """
    remove_dead_folders(tempfile.gettempdir(), rf"tuna_lab-{re.escape(kind)}-{int(uid)}-(\d+)-(\d+)(?:\..*)?",
                        lambda path, match: [(int(match[1]), int(match[2]))])


def _started(master):
    """The kernel's start time of process ``master``, in clock ticks since boot (NoSuchProcess if gone)."""
    ticks = start_ticks(master)
    if ticks is None:
        raise psutil.NoSuchProcess(int(master))
    return ticks


def _pin_dir(master):
    """Where ``pin --pid`` keeps, for ``unpin``, the masks it set and those they replaced (``masks.json``).

    Keyed like :func:`hook_dir`, by the user who pins rather than the server's:
    only a folder of theirs that no one else may write is ever read or written.
    """
    return os.path.join(tempfile.gettempdir(), f"tuna_lab-pin-{os.geteuid()}-{int(master)}-{_started(master)}")


#: The ``format`` of ``masks.json``: per worker its start time, slot (null: a front process) and threads at the
#: pin; per TID the mask before tuna_lab first bound it and the mask tuna_lab set.
PINS_FORMAT = "tuna_lab.pins/1"


def pin_records(master):
    """What ``pin --pid`` (or ``run --pid``) recorded of its pins of server ``master``; empty when none.

    Returns ``{"workers": {pid: {"started", "slot", "seen"}}, "threads": {tid:
    {"pid", "before", "set"}}}``: per process its start time (clock ticks), its
    slot (None: a process ``--front-cpus`` bound) and the threads it had at the
    pin; per TID the mask before tuna_lab first bound it and the mask tuna_lab
    set. Nothing is read from a folder that is not this user's and private, or
    from a file that is not a record of ours (another format, malformed); a
    master that is gone has none.

    Examples
    --------
    >>> pin_records(os.getpid())
    {'workers': {}, 'threads': {}}
    """
    empty = {"workers": {}, "threads": {}}
    try:
        folder = _pin_dir(master)
    except psutil.Error:
        return empty
    if _files.trusted_dir(folder, {os.geteuid()}):
        return empty
    try:
        saved = _files.read_json(os.path.join(folder, "masks.json"), limit=_MASKS_BYTES, follow=False)
        if saved.get("format") != PINS_FORMAT:
            return empty
        workers = {int(pid): {"started": int(w["started"]), "slot": None if w["slot"] is None else int(w["slot"]),
                              "seen": sorted(int(t) for t in w["seen"])} for pid, w in saved["workers"].items()}
        threads = {int(tid): {"pid": int(t["pid"]), "before": sorted(int(c) for c in t["before"]),
                              "set": sorted(int(c) for c in t["set"])} for tid, t in saved["threads"].items()}
    except (OSError, ValueError, TypeError, AttributeError, KeyError):
        return empty
    return {"workers": workers, "threads": threads}


def _write_records(master, records):
    folder = _pin_dir(master)
    if not os.path.lexists(folder):
        remove_dead_state("pin", os.geteuid())         # the folders of servers pinned before, now gone
    _files.private_dir(folder, error=PinError)
    data = {"format": PINS_FORMAT,
            "workers": {str(pid): w for pid, w in records["workers"].items()},
            "threads": {str(tid): t for tid, t in records["threads"].items()}}
    _files.write_json(os.path.join(folder, "masks.json"), data, mode=0o600, durable=False, error=PinError)


def _record_pins(master, pid, slot, intent, failed=()):
    """Record that tuna_lab sets ``intent`` (``{tid: (mask now, mask to set)}``) on worker ``pid``'s threads.

    ``slot`` None: a process of the front (the master, a helper or front end ``--front-cpus`` binds).

    Written *before* the threads are bound, so that a pin killed half-way can
    still be undone; ``failed`` (TIDs whose binding failed) are dropped
    afterwards. A thread recorded already keeps its first ``before``: the
    mask it had before tuna_lab first touched it. Records of threads that
    ended are dropped.
    """
    records = pin_records(master)
    ticks = start_ticks(pid)
    if ticks is None:
        return
    threads = {tid: t for tid, t in records["threads"].items()
               if procfs.thread_exists(t["pid"], tid) and tid not in failed}
    worker = records["workers"].get(pid)
    if worker is None or worker["started"] != ticks:
        worker = {"started": ticks, "slot": slot, "seen": []}
    worker["slot"] = slot
    worker["seen"] = sorted(set(worker["seen"]) | set(threads_of(pid)))
    for tid, (before, wanted) in intent.items():
        if tid in failed:
            continue
        first = threads.get(tid)
        threads[tid] = {"pid": pid, "before": first["before"] if first else sorted(before), "set": sorted(wanted)}
    workers = {p: w for p, w in records["workers"].items() if start_ticks(p) == w["started"]}
    workers[pid] = worker
    _write_records(master, {"workers": workers, "threads": threads})


def trusted_hook_dir(path, owners):
    """Whether ``path`` is a real folder (no symlink) owned by one of ``owners`` that no one else may write.

    Examples
    --------
    >>> trusted_hook_dir("/proc/nonexistent", {os.getuid()})
    False
    """
    return _files.trusted_dir(path, owners) is None


def write_hook_record(records, slot, pid, exact_main):
    """Record in the folder ``records`` that worker ``pid`` holds ``slot`` and how its main thread is bound."""
    # A new file renamed into place: never written through a link or into a file someone else made.
    _files.write_json(os.path.join(records, f"slot-{slot}.json"),
                      {"slot": slot, "pid": pid, "exact_main": bool(exact_main)}, mode=0o600, durable=False)


def _hooked(master):
    """``{pid: (slot, exact_main)}`` of the workers the Gunicorn hooks placed (none for other servers)."""
    records = hook_records(master)
    if records is None:
        return {}
    out = {}
    for path in glob.glob(os.path.join(glob.escape(records), "slot-*.json")):
        try:
            rec = _files.read_json(path, limit=_RECORD_BYTES, follow=False)
            out[int(rec["pid"])] = (int(rec["slot"]), bool(rec["exact_main"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def worker_slots(master, workers=None):
    """``[(slot, pid, exact_main)]`` of the running workers of ``master``, by slot.

    A worker the Gunicorn hooks placed keeps the slot it holds (after a
    replacement that is not its start order); the others take the free slots
    in start order. ``exact_main`` says whether the worker's main thread may
    be bound to a single CPU (see :func:`pin_server`).
    """
    workers = worker_pids(master) if workers is None else workers
    hooked = {pid: rec for pid, rec in _hooked(master).items() if pid in workers}
    taken = {slot for slot, _ in hooked.values()}
    free = iter(s for s in range(len(workers) + len(taken)) if s not in taken)
    out = [(hooked[pid][0], pid, hooked[pid][1]) if pid in hooked else (next(free), pid, main_rule(pid)[0])
           for pid in workers]
    return sorted(out)


def _main_note(pid, exact, plan, slot):
    """Why worker ``pid``'s main thread is (to be) bound to one CPU or to all of its slot's."""
    rule, why = main_rule(pid)
    if plan is None or slot is None or slot >= plan.workers:
        where = "may be bound to one CPU" if rule else "is bound to all of its slot's CPUs when pinned"
        return f"{where}: {why}"
    if plan.threads == 1:
        return None
    if rule != exact:
        why = "as the Gunicorn hooks placed it"
    if exact:
        return f"bound to CPU {format_cpulist(plan.slots[slot][0])} alone: {why}"
    return f"bound to all of its slot's CPUs, not only CPU {format_cpulist(plan.slots[slot][0])}: {why}"


def _thread_rows(pid, slot, plan, exact_main, activity=None):
    threads, requests = _activity_of(activity, pid)
    rows = []
    for th in classify_threads(pid, activity=threads, requests=requests):
        try:
            cpus = sorted(affinity_of(th.tid))
        except BindingError:
            continue
        rows.append({"tid": th.tid, "role": th.role, "rank": th.rank, "why": th.why, "evidence": th.evidence,
                     "cpus": cpus, "planned": _planned(plan, slot, th, exact_main),
                     "note": _main_note(pid, exact_main, plan, slot) if th.role == "main" else None})
    return rows


def _planned(plan, slot, th, exact_main):
    """The CPUs the plan gives thread ``th`` of ``slot`` (None for threads left alone)."""
    if plan is None or slot is None or slot >= plan.workers or th.role == "other":
        return None
    return list(planned_cpus(plan, slot, th.rank, exact_main))


def server_threads(master, plan=None, activity=None, choice=None, roles=None):
    """Worker -> thread (role, TID) -> allowed CPUs of a running pre-fork server, beside the plan.

    Parameters
    ----------
    master : int
        The master's PID.
    plan : Plan, optional
        Adds each thread's ``planned`` CPUs.
    activity : Activity or dict, optional
        What each worker thread ran while the server served requests
        (:func:`serve_requests`, or ``{pid: {tid: cpu_seconds}}``): tells
        pool threads that wait in libc (ONNX Runtime's) from helper threads.
    choice : WorkerChoice, optional
        The workers, when the user names them; else :func:`server_roles` finds them.
    roles : ServerRoles, optional
        The roles found already (then ``choice`` is not used).

    Returns
    -------
    list of dict
        ``{"slot", "pid", "why", "exact_main", "threads": [{"tid", "role", "rank", "why", "evidence", "cpus",
        "planned", "note"}]}`` by slot (:func:`worker_slots`); ``why`` says why the process is a worker,
        ``exact_main`` whether its main thread may be bound to one CPU (:func:`pin_server`).
    """
    roles = roles or server_roles(master, choice)
    why = {w.pid: w.why for w in roles.workers}
    out = []
    for slot, pid, exact in worker_slots(master, roles.worker_pids):
        try:
            out.append({"slot": slot, "pid": pid, "why": why[pid], "exact_main": exact,
                        "threads": _thread_rows(pid, slot, plan, exact, activity)})
        except PinError:
            continue                                   # the worker exited while we looked
    return out


# -- pinning ----------------------------------------------------------------------------------------

def _check_permission(pids):
    for pid in pids:
        try:
            # Setting a thread's own mask again changes nothing, and fails exactly where pinning would.
            os.sched_setaffinity(pid, os.sched_getaffinity(pid))
        except PermissionError:
            raise PinError(f"permission denied: cannot set the CPU affinity of worker {pid} "
                           "(another user's process); run as that user or as root") from None
        except ProcessLookupError:
            continue


def _pin_worker(master, pid, slot, plan, report, dry_run, exact=None, activity=None, keep=()):
    """Bind worker ``pid`` to ``slot`` of ``plan`` and add its rows to ``report``; threads in ``keep`` (masks
    someone else set since tuna_lab's) are left as they are."""
    exact = main_rule(pid)[0] if exact is None else exact
    gains, requests = _activity_of(activity, pid)
    threads = classify_threads(pid, activity=gains, requests=requests)
    pool = [t for t in threads if t.role == "pool"]
    if len(pool) < plan.threads - 1:
        if isinstance(activity, Activity) and pid in activity.idle:
            hint = f"it served none of the {activity.requests} requests, so its activity tells nothing"
        elif gains is None:
            hint = ("its pool may not exist yet - OpenMP starts it at the first parallel region - or wait in "
                    "libc, as ONNX Runtime's does: --url URL tells pool threads by their activity")
        else:
            hint = "its pool may not exist yet, or be smaller than T"
        report.warnings.append(f"worker {pid} (slot {slot}) has {len(pool)} pool thread(s), fewer than "
                               f"T-1={plan.threads - 1}: pinned as far as it goes ({hint})")
    # A worker the hooks placed beyond the plan's slots (another plan's) is only reported.
    bound = {}
    if slot < plan.workers:
        tids = [t.tid for t in pool]
        now = bind_worker(plan, slot, tids, pid, exact_main=exact, dry_run=True)
        if not dry_run:
            intent = {b.tid: (b.cpus, b.planned) for b in now if b.error is None}
            intent = {tid: masks for tid, masks in intent.items() if tid not in keep}
            _record_pins(master, pid, slot, intent)
            if keep and any(b.tid in keep for b in now):
                now = [b if b.tid in keep or b.error else _bound(b) for b in now]
            else:
                now = bind_worker(plan, slot, tids, pid, exact_main=exact)
            failed = {b.tid for b in now if b.error is not None}
            if failed:
                _record_pins(master, pid, slot, {}, failed)
        bound = {b.tid: b for b in now}
    rows = []
    for th in threads:
        b = bound.get(th.tid)
        if b is not None and b.error:
            if not dry_run:
                report.warnings.append(f"worker {pid}: {b.error}")
            continue
        if b is None:
            try:
                got = sorted(affinity_of(th.tid))
            except BindingError:
                continue
        note = _main_note(pid, exact, plan, slot) if th.role == "main" else None
        rows.append({"tid": th.tid, "role": th.role, "rank": th.rank, "why": th.why, "evidence": th.evidence,
                     "cpus": list(b.cpus) if b is not None else got,
                     "planned": list(b.planned) if b is not None else None, "note": note})
    report.workers.append({"slot": slot, "pid": pid, "threads": rows})


def _pin_front(master, roles, cpus, report, dry_run):
    """Bind every thread of the master, the helpers and the front ends to ``cpus`` (``--front-cpus``).

    Recorded as the workers' masks are (slot None), so that :func:`unpin_server` gives back exactly these.
    """
    cpus = sorted(cpus)
    for proc in (roles.master, *roles.helpers):
        tids = threads_of(proc.pid)
        if not tids:
            continue                                   # it exited meanwhile
        if not dry_run:
            intent = {}
            for tid in tids:
                with contextlib.suppress(BindingError):
                    intent[tid] = (sorted(affinity_of(tid)), cpus)
            _record_pins(master, proc.pid, None, intent)
            failed = set()
            for tid in intent:
                try:
                    bind(tid, cpus)
                except BindingError as exc:
                    failed.add(tid)
                    if procfs.thread_exists(proc.pid, tid):
                        report.warnings.append(f"{proc.role} {proc.pid}: {exc}")
            if failed:
                _record_pins(master, proc.pid, None, {}, failed)
        report.fronts.append({"pid": proc.pid, "role": proc.role, "cpus": cpus, "threads": len(tids)})


def check_front_cpus(plan, front_cpus):
    """Refuse (:class:`PinError`) a plan that places a worker thread on one of ``front_cpus``; returns them sorted."""
    front = sorted({int(c) for c in front_cpus})
    shared = sorted(set(front) & {c for row in plan.slots for cpus in row for c in cpus})
    if shared:
        raise PinError(f"the plan places worker threads on CPU {format_cpulist(shared)}, which --front-cpus "
                       f"{format_cpulist(front)} keeps for the master and front ends: make the plan with "
                       f"`tuna-lab plan --front-cpus {format_cpulist(front).replace(' ', '')}`")
    return front


def server_cpus(master):
    """The CPUs server ``master`` may use: its master's mask, or the one it had before tuna_lab bound it.

    After ``pin --front-cpus`` the master sits on the front CPUs; a later
    pin (or plan) of the same server is made for the server's CPUs, not those.

    Raises
    ------
    PinError
        No such process.
    """
    try:
        now = sorted(affinity_of(int(master)))
    except (BindingError, ValueError, TypeError):
        raise PinError(f"no process with PID {master}") from None
    rec = pin_records(master)["threads"].get(int(master))
    return rec["before"] if rec is not None and rec["set"] == now else now


def _bound(planned):
    """A :class:`~tuna_lab.placement.binding.ThreadBinding` of a dry run, bound now (or with its error)."""
    try:
        return dataclasses.replace(planned, cpus=tuple(sorted(bind(planned.tid, planned.planned))))
    except BindingError as exc:
        return dataclasses.replace(planned, cpus=None, error=str(exc))


def pin_server(master, plan, dry_run=False, activity=None, choice=None, front_cpus=None):
    """Bind every worker of the running server ``master`` to ``plan`` (slots: :func:`worker_slots`).

    Parameters
    ----------
    master : int
        The master's PID.
    plan : Plan
        Checked against this machine by the caller (:meth:`Plan.check_machine`).
    dry_run : bool
        Find and report, bind nothing.
    activity : Activity or dict, optional
        What each worker thread ran while the server served requests
        (:func:`serve_requests`, or ``{pid: {tid: cpu_seconds}}``): pool
        threads that wait in libc (ONNX Runtime's) are found by it.
    choice : WorkerChoice, optional
        The workers, when the user names them; else :func:`server_roles` finds them.
    front_cpus : iterable of int, optional
        Bind every thread of the master, the helpers and the front ends to
        these CPUs (``--front-cpus``); the plan must use none of them
        (:func:`check_front_cpus`).

    Returns
    -------
    PinReport
        With the roles found; every mask set is recorded (with the one it
        replaced) for :func:`unpin_server`. With ``activity``, what the
        master and front ends ran beside the workers (:meth:`PinReport.add_activity`).

    Raises
    ------
    PinError
        No such process, no workers, a plan for another number of workers
        (the message names the helpers left out), no permission, or no worker
        whose threads could be read. Nothing is pinned then.
    """
    front = None if front_cpus is None else check_front_cpus(plan, front_cpus)
    roles = server_roles(master, choice)
    workers = roles.worker_pids
    if len(workers) != plan.workers:
        raise PinError(f"server {master} has {len(workers)} worker{'' if len(workers) == 1 else 's'} "
                       f"({', '.join(map(str, workers))}) but the plan has {plan.workers} slots: make the plan "
                       f"with -w {len(workers)}; left out as no workers: {roles.left_out()} (--workers PID,PID or "
                       "--worker-match REGEX names them yourself)")
    _check_permission(workers if front is None else [*workers, roles.master.pid, *(h.pid for h in roles.helpers)])
    report = PinReport(int(master), plan, roles=roles)
    why = {w.pid: w.why for w in roles.workers}
    skipped = []
    for slot, pid, exact in worker_slots(master, workers):
        try:
            _pin_worker(master, pid, slot, plan, report, dry_run, exact, activity)
            report.workers[-1]["why"] = why[pid]
        except PinError as exc:
            skipped.append(f"worker {pid} (slot {slot}): {exc}")
            report.warnings.append(f"worker {pid} (slot {slot}) skipped: {exc}")
    if skipped and not report.workers:
        # Not one worker could be read or bound (ptrace rules, all exited): that is a failure, not a warning.
        raise PinError(f"pinned nothing: {skipped[0]}" + (f" (and {len(skipped) - 1} more)" if len(skipped) > 1
                                                          else ""))
    if front is not None:
        _pin_front(master, roles, front, report, dry_run)
    return report.add_activity(activity if isinstance(activity, Activity) else None, front)


def unpin_server(master):
    """Give back, thread by thread, the masks ``pin --pid`` replaced - only where the mask is still tuna_lab's.

    Every thread tuna_lab bound (recorded with the mask it set and the one
    that mask replaced, :func:`pin_server`) gets its mask from before the pin
    back if its mask is still the one tuna_lab set. A thread whose mask
    someone else changed since is left as it is, with a warning. A thread
    born in a pinned worker since the pin, still on the mask tuna_lab set on
    its main thread (it inherited it), gets the main thread's mask from before
    the pin; any other thread is left alone. With nothing recorded nothing is
    changed, and the report's ``note`` says so. The records are forgotten
    afterwards: a later pin records the masks of that moment.
    """
    records = pin_records(master)
    report = PinReport(int(master), None)
    if not records["threads"]:
        report.note = (f"nothing to unpin: tuna_lab has no record of a pin of server {master} (never pinned by "
                       "`pin --pid`, or unpinned already); no mask was changed")
        return report
    live = {pid: w for pid, w in records["workers"].items() if start_ticks(pid) == w["started"]}
    _check_permission(sorted(live))
    restored = 0
    # The master, helpers and front ends --front-cpus bound (slot None) first, then the workers by slot: the
    # reverse of pin_server's order, so that no worker thread is ever back on the front's CPUs while it is there.
    for pid, worker in sorted(live.items(), key=lambda kv: (kv[1]["slot"] is not None, kv[1]["slot"] or 0, kv[0])):
        mine = {tid: t for tid, t in records["threads"].items() if t["pid"] == pid}
        main = mine.get(pid)
        rows = []
        for tid in threads_of(pid):
            try:
                now = sorted(affinity_of(tid))
            except BindingError:
                continue                               # ended while we looked
            rec = mine.get(tid)
            if rec is not None and now == rec["set"]:
                target, why = rec["before"], "its mask from before the pin"
            elif rec is not None:
                report.warnings.append(f"worker {pid} thread {tid} is on CPUs {format_cpulist(now)}, not the "
                                       f"{format_cpulist(rec['set'])} tuna_lab set: someone else changed its mask "
                                       "since the pin; left as it is")
                target, why = None, "its mask was changed by someone else since the pin: left as it is"
            elif main is not None and tid not in worker["seen"] and now == main["set"]:
                target, why = main["before"], ("born since the pin on the mask tuna_lab set on its main thread: "
                                               "the main thread's mask from before the pin")
            else:
                target, why = None, "tuna_lab never set its mask: left as it is"
            if target is not None:
                try:
                    now = sorted(bind(tid, target))
                    restored += 1
                except BindingError as exc:
                    report.warnings.append(f"worker {pid}: {exc}")
                    continue
            rows.append({"tid": tid, "role": "main" if tid == pid else "thread", "rank": None, "why": why,
                         "cpus": now, "planned": None, "note": why})
        report.workers.append({"slot": worker["slot"], "pid": pid, "threads": rows})
    if not restored:
        report.note = "no mask was changed: no thread tuna_lab pinned is still on the mask tuna_lab set"
    with contextlib.suppress(OSError, psutil.Error):
        folder = _pin_dir(master)
        if not _files.trusted_dir(folder, {os.geteuid()}):
            shutil.rmtree(folder)
    return report


def _signature(worker):
    """What a report shows of a worker: its slot and every thread's role and CPUs (a change is shown again)."""
    return worker["slot"], tuple((t["tid"], t["role"], tuple(t["cpus"] or ())) for t in worker["threads"])


def _changed_by_others(master, pids, enforce, report):
    """The TIDs of ``pids`` whose mask is no longer the one tuna_lab set (someone else changed it).

    Each is reported in ``report.warnings``; with ``enforce`` it gets the
    mask tuna_lab set back (and is not returned).
    """
    changed = set()
    for tid, rec in pin_records(master)["threads"].items():
        if rec["pid"] not in pids:
            continue
        try:
            now = sorted(affinity_of(tid))
        except BindingError:
            continue                                   # it ended
        if now == rec["set"]:
            continue
        where = (f"worker {rec['pid']} thread {tid} is on CPUs {format_cpulist(now)}, not the "
                 f"{format_cpulist(rec['set'])} tuna_lab set: someone else changed its mask")
        if enforce:
            try:
                bind(tid, rec["set"])
                report.warnings.append(f"{where}; put back (--enforce)")
                continue
            except BindingError as exc:
                report.warnings.append(f"{where}; could not put it back: {exc}")
        else:
            report.warnings.append(f"{where}; left as it is (--enforce puts it back)")
        changed.add(tid)
    return changed


def watch_server(master, plan, stop, interval=0.2, on_pin=None, activity=None, choice=None, enforce=False,
                 pinned=None):
    """Keep ``master``'s workers pinned to ``plan`` until ``stop.is_set()`` (a :class:`threading.Event`).

    A new worker (a replacement of one that exited) takes the lowest slot no
    live worker holds, which is its predecessor's; pool threads that appear
    later in any worker (OpenMP starts its pool at the first parallel region)
    are bound when they are first seen waiting (a worker whose thread kept
    running is looked at again for a few rounds). A worker with fewer pool
    threads than ``T-1`` is watched under the live traffic: threads that gain
    CPU time while it serves requests (:func:`active_threads`, counted from
    when the watch first saw the worker) are bound as pool threads.
    ``activity`` (from :func:`serve_requests`) is used for the workers it
    measured until they change. ``choice`` (:class:`WorkerChoice`) names the
    workers when the user does. Pins stay in place when it returns.

    A thread tuna_lab pinned whose mask someone else changed is reported
    and left as it is - also when its worker is pinned again - unless
    ``enforce``: then it gets its planned mask back.

    ``on_pin(report)`` is called after each round that changed something:
    the report holds only the workers whose threads or masks changed since
    they were last shown, and only warnings not given before (each is given
    once). ``pinned`` is the :class:`PinReport` of the pin the watch
    follows: its workers are not shown again, nor its warnings repeated.
    """
    slots = {pid: slot for slot, pid, _ in worker_slots(master, worker_pids(master, choice))}
    seen, busy, short, known = {}, {}, {}, {}
    base = {}
    said = set(pinned.warnings) if pinned is not None else set()
    shown = {w["pid"]: _signature(w) for w in pinned.workers} if pinned is not None else {}
    for w in pinned.workers if pinned is not None else ():
        rows = w["threads"]
        pool = {t["tid"] for t in rows if t["role"] == "pool"}
        if w["pid"] in slots and not any(t["why"].startswith(RUNNING) for t in rows):
            # What the pin saw: looked at again only when the worker's threads change, as any other.
            seen[w["pid"]] = ({t["tid"] for t in rows}, tuple(sorted(loaded_runtimes(w["pid"]))))
            short[w["pid"]], known[w["pid"]] = len(pool) < plan.threads - 1, pool
    while not stop.is_set():
        try:
            live = worker_pids(master, choice)
        except PinError:
            if not psutil.pid_exists(int(master)):
                return
            live = []
        for pid in [p for p in slots if p not in live]:
            del slots[pid]
            for state in (seen, busy, short, known, base, shown):
                state.pop(pid, None)
        hooked = _hooked(master) if any(pid not in slots for pid in live) else {}
        for pid in live:
            if pid not in slots:
                # A worker the Gunicorn hooks placed holds its slot already; any other
                # takes the lowest slot no live worker holds: its predecessor's.
                free = [s for s in range(plan.workers) if s not in slots.values()]
                if pid in hooked:
                    slots[pid] = hooked[pid][0]
                elif free:
                    slots[pid] = free[0]
        report = PinReport(int(master), plan)
        theirs = _changed_by_others(master, set(slots), enforce, report)
        for pid, slot in sorted(slots.items(), key=lambda kv: kv[1]):
            try:
                # A worker is looked at again when its threads change, or the runtimes it loaded: one caught
                # while it loads libgomp before XGBoost had its main thread bound by the first one's rule.
                tids = ({t.id for t in psutil.Process(pid).threads()}, tuple(sorted(loaded_runtimes(pid))))
                now = thread_cpu_times(pid)
            except (psutil.NoSuchProcess, PinError):
                continue
            base.setdefault(pid, now)
            gains = {tid: now[tid] - base[pid].get(tid, 0.0) for tid in now}
            measured = _activity_of(activity, pid)[0] if seen.get(pid) is None else None
            active = active_threads(gains, main=pid)
            if seen.get(pid) == tids and not (short.get(pid) and active - known.get(pid, set())):
                continue
            # Live traffic decides once it shows something; until then a measurement given to us does.
            use = gains if active else measured
            exact = _hooked(master).get(pid, (None, None))[1]
            try:
                _pin_worker(master, pid, slot, plan, report, dry_run=False, exact=exact,
                            activity=None if use is None else {pid: use}, keep=theirs)
            except PinError:
                continue
            rows = report.workers[-1]["threads"]
            pool = {t["tid"] for t in rows if t["role"] == "pool"}
            short[pid] = len(pool) < plan.threads - 1
            known[pid] = pool | active                 # an active thread its name rules out is not tried again
            if _signature(report.workers[-1]) == shown.get(pid):
                report.workers.pop()                   # pinned again as it was: nothing new to show
            else:
                shown[pid] = _signature(report.workers[-1])
            if any(t["why"].startswith(RUNNING) for t in rows):
                busy[pid] = busy.get(pid, 0) + 1
                if busy[pid] < _WATCH_RETRIES:
                    continue                           # perhaps a pool thread at work: look again
            seen[pid], busy[pid] = tids, 0
        new = [w for w in dict.fromkeys(report.warnings) if w not in said]
        said.update(new)
        report.warnings = new
        if (report.workers or report.warnings) and on_pin is not None:
            on_pin(report)
        stop.wait(interval)
