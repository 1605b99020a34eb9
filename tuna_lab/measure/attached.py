"""A server that is already running, measured live: :class:`AttachedTarget` (``run --pid MASTER --url URL``).

Each trial's policy is applied to the running server by its master's PID and
read back from ``/proc``; the server is never restarted. Every mask set goes
through the ledger (:mod:`tuna_lab.live.ledger`) and is given back by its one
rule when the run ends, however it ends. :func:`thread_masks` reads every
thread's mask at the start: what ``cfs`` checks the server is on.

Such a server sends no per-request scheduler evidence: during each load its
workers' threads are sampled at a fixed rate instead
(:class:`~tuna_lab.measure.sampled.SchedSampler`, ``--sample-hz``), and the
manifest and each trial's row say so (``sched_evidence``).
"""

import contextlib
import os
import sys
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import psutil

from .._checks import format_cpulist, one_line, positive_int
from ..errors import TargetError, TunaError
from ..live.ledger import still_pinned as _still_pinned
from .loadgen.requests import Requests
from .target import Live, Target, check_connectable, server_name, worker_runtimes

__all__ = ["AttachedTarget", "thread_masks"]


class AttachedTarget(Target):
    """A pre-fork server that is already running, by its master's PID and a URL it serves.

    Each trial's policy is applied live and read back from ``/proc``; the
    server is never restarted. ``cfs`` pins nothing: every thread is on the
    mask it had at :meth:`start` (the kernel decides within the masks the
    server had, a mask the user set with taskset included). The pins are
    recorded as ``pin --pid`` records them, so that ``tuna-lab unpin`` can
    undo them after a SIGKILL. :meth:`stop` gives them back by the ledger's
    one rule (:func:`~tuna_lab.live.pin.unpin_server`: the same thread, still
    on tuna_lab's mask; a thread born under it gets its process's mask from
    before) - also after an error, Ctrl-C, SIGTERM, SIGHUP or SIGUSR1 (the
    runner calls it in a ``finally``); what it cannot give back is said on
    stderr with the record that keeps it.

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
        master (:func:`~tuna_lab.live.roles.check_server`).
    front_cpus : iterable of int, optional
        ``--front-cpus``: under every pinning policy, all threads of the
        master, helpers and front ends are bound to these CPUs, and the plans
        are made for the server's other CPUs
        (:func:`~tuna_lab.live.pin.server_cpus`); ``cfs`` leaves them
        as they were.
    sample_hz : float, optional
        How often the workers' scheduler counters are read during a load, to
        attribute to the requests in flight (default
        :data:`~tuna_lab.measure.sampled.DEFAULT_HZ`; at most
        :data:`~tuna_lab.measure.sampled.MAX_HZ`).
    """

    kind = "attached"
    restarts = False

    def __init__(self, pid, url, threads, requests=None, label=None, force=False, front_cpus=None, sample_hz=None):
        from .loadgen.wire import check_url
        from .sampled import DEFAULT_HZ, check_hz

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
        self.front_cpus = None if front_cpus is None else tuple(sorted({int(c) for c in front_cpus}))
        self.sample_hz = check_hz(DEFAULT_HZ if sample_hz is None else sample_hz)
        self._sched_notes = set()        # what each trial's requests carried (SchedSampler.fill)
        self.masks = None
        self.workers = None
        self._runtimes = None

    def check(self):
        """Refuse (:class:`TargetError`) a PID that is no server's master (PID 1, a shell), one with no workers,
        one pinned by ``pin --pid`` (its masks are not the server's own), front CPUs that are not the server's
        or leave it none, a URL that refuses connections or whose port is no listening socket of this server
        (another server's); count W."""
        from ..live.roles import check_server
        from ..live.ledger import pin_records

        try:
            workers = check_server(self.master, force=self.force)
        except TunaError as exc:
            raise TargetError(one_line(exc)) from None
        if _still_pinned(pin_records(self.master)["threads"]):
            # Measured from those masks, cfs would undo the pin and the run forget it: the user decides.
            raise TargetError(f"server {self.master} is pinned by `tuna-lab pin --pid` (or a run that was killed): "
                              f"`tuna-lab unpin --pid {self.master}` first; run measures every policy from the "
                              "server's own masks and gives them back")
        if self.front_cpus is not None:
            cpus = self.server_cpus()
            stray = sorted(set(self.front_cpus) - set(cpus))
            if stray or not set(cpus) - set(self.front_cpus):
                raise TargetError(f"--front-cpus {format_cpulist(self.front_cpus)}: "
                                  + (f"CPU {format_cpulist(stray)} is not" if stray else "leaves none of")
                                  + f" the server's CPUs {format_cpulist(cpus)}")
        self._check_port()                         # first: not even a connection to another server
        check_connectable(self.url)
        self.workers = len(workers)
        return self

    def _check_port(self):
        """Refuse a URL whose port is no listening socket of this server: the load would go to another one."""
        from ..live.roles import listening_ports

        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            ports = listening_ports(self.master)
        except TunaError as exc:
            raise TargetError(one_line(exc)) from None
        if port not in ports:
            where = f"it listens on {', '.join(map(str, sorted(ports)))}" if ports else "it listens on no TCP port"
            raise TargetError(f"--url {self.url}: port {port} is not a listening socket of server {self.master} "
                              f"({where}): the load would go to another server")

    def server_cpus(self):
        """The CPUs the server may use: its master's (:func:`~tuna_lab.live.pin.server_cpus`); TargetError if
        it is gone."""
        from ..live.pin import server_cpus

        try:
            return server_cpus(self.master)
        except TunaError as exc:
            raise TargetError(one_line(exc)) from None

    def machine(self):
        """The :class:`~tuna_lab.machine.topology.Topology` the plans are made for: the server's CPUs, less
        ``front_cpus``; the load generator's CPUs are taken from these
        (:func:`~tuna_lab.machine.reserve.reserve_client_cpus`)."""
        from ..machine.topology import Topology

        return Topology.from_sysfs(allowed=sorted(set(self.server_cpus()) - set(self.front_cpus or ())))

    def start(self, topology):
        from ..live.ledger import signals_give_back

        super().start(topology)
        if self.workers is None:
            self.check()
        self.masks = thread_masks(self.master)
        self._runtimes = worker_runtimes(list(self.masks.processes))
        # Until stop(): SIGHUP (a closed terminal) and SIGUSR1 end the run as Ctrl-C and SIGTERM do, through
        # the runner's `finally`, which calls stop() - never with masks left on a live server.
        self._signals = contextlib.ExitStack()
        self._signals.enter_context(signals_give_back())

    def stop(self):
        from ..live.pin import unpin_server

        if self.masks is None:
            return
        try:
            # What tuna_lab set, by the ledger's one rule: the same thread, still on tuna_lab's mask.
            report = unpin_server(self.master)
        except TunaError as exc:
            print(f"tuna-lab: warning: the masks of server {self.master} were not given back: {one_line(exc)}",
                  file=sys.stderr, flush=True)
        else:
            for line in report.warnings:
                print(f"tuna-lab: warning: {line}", file=sys.stderr, flush=True)
        finally:
            self.masks = None
            signals = getattr(self, "_signals", None)
            if signals is not None:
                signals.close()

    def sampled_at(self, hz=None):
        """This target, its workers' scheduler counters sampled at ``hz`` (None: as it was); TargetError
        for a rate :func:`~tuna_lab.measure.sampled.check_hz` refuses."""
        from .sampled import check_hz

        if hz is not None:
            self.sample_hz = check_hz(hz)
        return self

    def sched_sampler(self, threads):
        """The workers' ``threads`` sampled at :attr:`sample_hz` over a load: the server has no hook to send
        its scheduler counters per request."""
        from .sampled import SchedSampler

        return SchedSampler(threads, self.sample_hz, notes=self._sched_notes)

    @contextlib.contextmanager
    def apply(self, policy):
        plan = self._plan(policy)
        if plan is not None and not psutil.pid_exists(self.master):
            raise TargetError(f"the server {self.master} is gone")
        yield Live(self.url, self.master, plan, place_now=True, masks=self.masks,
                   front_cpus=None if plan is None else self.front_cpus)

    def describe(self):
        from .sampled import sampled_words

        try:
            command = psutil.Process(self.master).cmdline()
        except psutil.Error:
            command = None
        return {"kind": self.kind, "pid": self.master, "url": self.url, "server": server_name(command),
                "command": command, "runtimes": self._runtimes or {},
                "front_cpus": None if self.front_cpus is None else list(self.front_cpus),
                # What the trials' requests carried: sampled, or the server's own where it sends them (a
                # server run with tuna_lab's hooks); before any trial, what they will carry without a hook.
                "sched_evidence": "; ".join(sorted(self._sched_notes)) or sampled_words(self.sample_hz),
                "sample_hz": self.sample_hz}


# -- masks of a running server -------------------------------------------------------------------

@dataclass
class _Masks:
    """Every thread's CPU mask of a server at one moment: ``{tid: cpus}`` per process, and the master's."""

    master: int
    master_cpus: tuple
    processes: dict = field(default_factory=dict)

    def expected(self, pid, tid):
        """The mask thread ``tid`` of process ``pid`` had then; one born since, what it would have inherited:
        its process's main-thread mask from then, or - a process born since - the master's."""
        known = self.processes.get(pid, {})
        return known.get(tid, known.get(pid, self.master_cpus))


def thread_masks(master):
    """The CPU mask of every thread of ``master`` and its workers, read now (to give back later).

    Examples
    --------
    >>> masks = thread_masks(os.getpid())
    """
    from ..live.binding import affinity_of

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
