"""Per-thread CPU accounting of a running server: who burns CPU, and when.

A thread pool that spins between bursts can use a core while doing no work;
OpenMP's ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` set how
long its threads spin before they sleep. To show what that costs, a
:class:`CpuSampler` reads every server thread's CPU time while a trial runs,
each worker reports with every response the CPU time its threads spent on
that request (:func:`~tuna_lab.server.cpuclock.request_cpu`, read at the
request's start and end), and
:func:`account` splits each role's CPU time into *busy* (while its worker had
a request in flight) and *idle* (between requests: spinning, Gunicorn's
accept loop). Reading the CPU clocks at the request boundaries makes the
split exact, where sampling would smear it over the sampling period.

The clocks themselves are read by :mod:`tuna_lab.server.cpuclock`.

Beside the CPU time, :class:`SchedEvidence` reads what the scheduler did to
every thread of the server - the master, its helpers and front ends, and the
workers - and to the CPUs it may run on, before and after the load
(:mod:`tuna_lab.machine.sched`): run-queue wait, migrations, switches, the
other processes' CPU time and the interrupts on those CPUs, CPU pressure and
cgroup throttling (:data:`~tuna_lab.measure.schema.EVIDENCE_COLUMNS`).

Thread roles (``threads.parquet``'s ``role``): a worker's threads are
``"main"``, ``"pool"`` (its runtime's pool, by the classification
:func:`~tuna_lab.live.pin.server_threads` pins by) and ``"other"``
(any other thread); the other processes' threads take their process's role,
``"master"``, ``"front"`` or ``"helper"`` (:data:`ROLES`).
"""

import threading
import time

import numpy as np

from .._checks import positive_number
from ..errors import CpuAccountingError, TunaError
from ..server.cpuclock import thread_cpu_seconds
from .schema import EVIDENCE_COLUMNS, THREAD_EVIDENCE_COLUMNS

__all__ = ["CpuSampler", "account", "summarize_threads", "worker_balance", "SchedEvidence", "ROLES", "WORKER_ROLES",
           "thread_role"]

#: The roles of a worker's threads.
WORKER_ROLES = ("main", "pool", "other")
#: Every role of ``threads.parquet``: the processes that are not workers, then a worker's threads.
ROLES = ("master", "front", "helper") + WORKER_ROLES
# The per-request CPU column (REQUEST_COLUMNS) that tells each worker role's busy time.
_BUSY_COLUMN = {"main": "cpu_main", "pool": "cpu_openmp"}
# The per-thread counters SchedEvidence sums, in threads.parquet's column order.
_COUNTERS = ("cpu_seconds", *THREAD_EVIDENCE_COLUMNS)


def thread_role(role):
    """The ``threads.parquet`` role of a thread whose role was recorded as ``role``.

    ``"openmp"`` (older results, and the lab server's own records) is
    ``"pool"``; a process role (``"master"``, ``"front"``, ``"helper"``)
    stays; any other thread of a worker is ``"other"`` - a Python helper thread
    of an MLServer worker is not its pool.

    Examples
    --------
    >>> [thread_role(r) for r in ("main", "openmp", "pool", "thread", "master")]
    ['main', 'pool', 'pool', 'other', 'master']
    """
    role = "pool" if role == "openmp" else role
    return role if role in ROLES else "other"


class CpuSampler:
    """Sample the CPU time of a fixed set of threads every ``period`` seconds, in a background thread.

    Parameters
    ----------
    threads : list of dict
        One per worker thread: ``pid``, ``tid``, ``role`` (``"main"``, ``"pool"``
        - or ``"openmp"``, its older name - or ``"other"``) and optionally ``slot``.
    period : float
        Seconds between samples. The first and last samples give the totals;
        the ones between keep the time of a thread that exits mid-trial.

    Attributes
    ----------
    times : ndarray, shape (S,)
        ``time.monotonic()`` of each sample.
    cpu : ndarray, shape (S, N)
        Cumulative CPU seconds of each thread; a thread that has exited keeps
        its last value (its later time is unknown, not zero).

    Examples
    --------
    >>> import os, threading
    >>> me = [{"pid": os.getpid(), "tid": threading.get_native_id(), "role": "main"}]
    >>> with CpuSampler(me, period=0.01) as s:
    ...     _ = sum(range(10**6))
    >>> bool(s.cpu.shape[0] >= 2 and s.cpu[-1, 0] >= s.cpu[0, 0])
    True
    """

    def __init__(self, threads, period=0.1):
        self.period = positive_number("period", period, CpuAccountingError)
        self.threads = [dict(t) for t in threads]
        self._times, self._rows = [], []
        self._stop = threading.Event()
        self._thread = None

    def _sample(self):
        row = []
        last = self._rows[-1] if self._rows else None
        for k, t in enumerate(self.threads):
            try:
                row.append(thread_cpu_seconds(t["pid"], t["tid"]))
            except CpuAccountingError:
                row.append(last[k] if last is not None else np.nan)
        self._times.append(time.monotonic())
        self._rows.append(row)

    def _loop(self):
        next_at = time.monotonic()
        while not self._stop.is_set():
            self._sample()
            next_at += self.period
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def start(self):
        self._sample()
        self._thread = threading.Thread(target=self._loop, name="tuna-lab-cpu-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
            self._sample()
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def times(self):
        return np.asarray(self._times, dtype=float)

    @property
    def cpu(self):
        return np.asarray(self._rows, dtype=float).reshape(len(self._rows), len(self.threads))


def account(sampler, requests, evidence=None):
    """CPU seconds of each worker's roles over a trial, split into busy and idle time.

    Parameters
    ----------
    sampler : CpuSampler
        Stopped, with at least two samples, over the worker threads.
    requests : pandas.DataFrame
        The trial's rows (:data:`tuna_lab.measure.schema.REQUEST_COLUMNS`): for each ok request,
        ``pid`` (the worker) and ``cpu_main``/``cpu_openmp`` (the CPU time the
        worker's main thread and its other threads spent on it).
    evidence : SchedEvidence, optional
        Stopped, over the same load: adds each row's scheduler counters and one
        row per (process, role) of the master, front ends and helpers
        (:meth:`SchedEvidence.by_role`), whose CPU time the sampler does not read.

    Returns
    -------
    pandas.DataFrame
        One row per (process, role) of :data:`ROLES`: ``pid``, ``slot``, ``role``, ``threads``,
        ``cpu_seconds``, ``max_thread_cpu_seconds``, ``busy_cpu_seconds``,
        ``idle_cpu_seconds`` (NaN for the roles no request clock covers: ``other``,
        and the processes that are not workers), ``requests`` (served by the worker),
        ``wall_seconds`` (of the sampling), and with ``evidence`` the
        :meth:`SchedEvidence.by_role` counters.
    """
    import pandas as pd

    times, cpu = sampler.times, sampler.cpu
    if len(times) < 2:
        raise CpuAccountingError("need at least two CPU samples to account a trial")
    first = np.array([col[np.isfinite(col)][0] if np.isfinite(col).any() else 0.0 for col in cpu.T])
    last = np.array([col[np.isfinite(col)][-1] if np.isfinite(col).any() else 0.0 for col in cpu.T])
    if not sampler.threads:
        raise CpuAccountingError("no server threads were sampled")
    threads = pd.DataFrame(sampler.threads).assign(cpu_seconds=last - first)
    threads["role"] = threads["role"].map(thread_role)
    if "slot" not in threads:
        threads["slot"] = None
    ok = requests[requests["status"] == 200] if len(requests) else requests
    wall = float(times[-1] - times[0])
    rows = []
    for (pid, role), group in threads.groupby(["pid", "role"], sort=True):
        mine = ok[ok["pid"] == pid] if len(ok) else ok
        column = _BUSY_COLUMN.get(role)
        # A worker that served nothing was busy for 0 s: all its CPU time is idle. The request clocks
        # count every thread but the main one as cpu_openmp: where a worker's other threads work during
        # its requests, the pool's busy time is overstated (and clipped to its CPU time below).
        busy = float(mine[column].sum()) if column in ok.columns else float("nan")
        total = float(group["cpu_seconds"].sum())
        rows.append({"pid": int(pid), "slot": group["slot"].iloc[0], "role": role, "threads": len(group),
                     "cpu_seconds": total, "max_thread_cpu_seconds": float(group["cpu_seconds"].max()),
                     # the request clocks and the sampler read the same counters at
                     # different instants: clip the few microseconds either way.
                     "busy_cpu_seconds": min(busy, total), "idle_cpu_seconds": max(total - busy, 0.0),
                     "requests": int(len(mine)), "wall_seconds": wall})
    frame = pd.DataFrame(rows)
    if evidence is None:
        return frame
    counters = evidence.by_role()
    workers = counters[counters["role"].isin(WORKER_ROLES)].drop(columns=["slot", "threads", "cpu_seconds",
                                                                           "max_thread_cpu_seconds"])
    frame = frame.merge(workers, on=["pid", "role"], how="left")
    others = counters[~counters["role"].isin(WORKER_ROLES)].assign(
        busy_cpu_seconds=float("nan"), idle_cpu_seconds=float("nan"), requests=0, wall_seconds=wall)
    return pd.concat([others, frame], ignore_index=True) if len(others) else frame


def summarize_threads(threads, requests_served):
    """Per-role CPU cost of a trial: CPU-seconds per request and the idle share.

    Returns a dict with, for the workers' main threads (``main``) and pools
    (``openmp``, the columns' name for the ``pool`` role): ``cpu_{r}_seconds``,
    ``cpu_{r}_per_request`` and ``idle_cpu_share_{r}`` (share of that role's CPU
    time spent while its worker had no request in flight); plus ``cpu_seconds``
    and ``cpu_per_request`` over every worker thread (main, pool and other). The
    master's, front ends' and helpers' CPU time is not in them: it is the
    evidence's ``front_cpu_seconds`` (:class:`SchedEvidence`).

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"role": ["main", "pool", "other", "master"], "cpu_seconds": [1.0, 3.0, 0.5, 2.0],
    ...                   "idle_cpu_seconds": [0.0, 1.5, float("nan"), float("nan")]})
    >>> s = summarize_threads(t, 10)
    >>> s["idle_cpu_share_openmp"], s["cpu_seconds"], s["cpu_openmp_seconds"]
    (0.5, 4.5, 3.0)
    """
    out = {}
    n = max(int(requests_served), 0)
    roles = threads["role"].map(thread_role) if len(threads) else threads.get("role")
    for role, name in (("main", "main"), ("pool", "openmp")):
        mine = threads[roles == role] if len(threads) else threads
        total = float(mine["cpu_seconds"].sum()) if len(mine) else 0.0
        idle = float(mine["idle_cpu_seconds"].sum()) if len(mine) else 0.0
        out[f"cpu_{name}_seconds"] = total
        out[f"cpu_{name}_per_request"] = total / n if n else float("nan")
        out[f"idle_cpu_share_{name}"] = idle / total if total > 0 else float("nan")
    workers = threads[roles.isin(WORKER_ROLES)] if len(threads) else threads
    total = float(workers["cpu_seconds"].sum()) if len(workers) else 0.0
    out["cpu_seconds"] = total
    out["cpu_per_request"] = total / n if n else float("nan")
    return out


def worker_balance(threads, requests, workers):
    """How evenly a trial's measured load reached its workers: ``(share, least, by)``.

    Each worker's part of the load is the requests it served where the
    server says which worker served each (a ``pid`` in the answers: the lab
    server's), else the CPU seconds its threads (:data:`WORKER_ROLES`) used
    over the load. ``share`` is the least-loaded worker's part as a share of
    the busiest's (1.0 with one worker), ``least`` that worker's PID and
    ``by`` ``"requests"`` or ``"cpu"``. A worker of ``workers`` with no row
    did none of the load. ``(nan, None, "")`` when neither was measured.

    Parameters
    ----------
    threads : pandas.DataFrame or None
        :func:`account`'s per-(process, role) table of the load.
    requests : pandas.DataFrame
        The load's rows (``status``, ``pid``).
    workers : iterable of int
        The workers serving when the load began.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"pid": [10, 10, 11, 1], "role": ["main", "pool", "main", "master"],
    ...                   "cpu_seconds": [1.5, 0.5, 0.01, 3.0]})
    >>> worker_balance(t, pd.DataFrame({"status": [200], "pid": [-1]}), [10, 11])
    (0.005, 11, 'cpu')
    >>> worker_balance(t, pd.DataFrame({"status": [200, 200, 200], "pid": [10, 11, 11]}), [10, 11])
    (0.5, 10, 'requests')
    """
    workers = sorted({int(w) for w in workers})
    if len(workers) < 2:
        return (1.0, workers[0], "requests") if workers else (float("nan"), None, "")
    load, by = None, ""
    if len(requests) and "pid" in requests.columns:
        status = requests["status"].to_numpy()
        pids = requests["pid"].to_numpy()[(status >= 200) & (status < 300)]
        named = pids[pids > 0]
        if len(named):
            load, by = {w: float((named == w).sum()) for w in workers}, "requests"
    if load is None and threads is not None and len(threads):
        mine = threads[threads["role"].map(thread_role).isin(WORKER_ROLES)]
        spent = mine.groupby("pid")["cpu_seconds"].sum()
        load, by = {w: float(spent.get(w, 0.0)) for w in workers}, "cpu"
    if not load or max(load.values()) <= 0:
        return float("nan"), None, ""
    least = min(workers, key=lambda w: load[w])
    return load[least] / max(load.values()), least, by


class SchedEvidence:
    """What the scheduler did to a server's threads and CPUs over a load: read before it and after it.

    Every thread of the master, its front ends and helpers, and its workers
    (:data:`ROLES`) is read with :func:`~tuna_lab.machine.sched.process_sched`,
    and the CPUs any of them may run on (the *serving CPUs*, their masks
    before and after) with :func:`~tuna_lab.machine.sched.cpu_busy_seconds` and
    :func:`~tuna_lab.machine.irqs.irq_counts`; CPU pressure and the master's
    cgroup throttling too. :meth:`columns` gives the trial row's
    :data:`~tuna_lab.measure.schema.EVIDENCE_COLUMNS`, :meth:`by_role` the
    counters of ``threads.parquet``. A thread that starts during the load
    counts from its start; one that ends during it is lost (its counters go
    with it). The CPU time the readings cost this thread is
    ``evidence_overhead_seconds``.

    Parameters
    ----------
    master : int or None
        The server's master; its other descendants are found from it
        (front ends and helpers by :func:`~tuna_lab.live.roles.server_roles`).
    threads : list of dict
        The workers' threads, as :class:`CpuSampler` takes them: their roles
        (a worker thread not listed is ``"main"`` when its TID is its PID,
        else ``"other"``).
    processes : dict, optional
        ``{pid: "master" | "front" | "helper"}``: the processes that are not
        workers, when the caller knows them.

    Examples
    --------
    >>> import os, threading
    >>> me = [{"pid": os.getpid(), "tid": threading.get_native_id(), "role": "main"}]
    >>> with SchedEvidence(None, me) as ev:
    ...     _ = sum(range(10**6))
    >>> cols = ev.columns(ok=10)
    >>> cols["run_delay_seconds"] >= 0 and cols["front_cpu_seconds"] == 0.0 and cols["evidence_overhead_seconds"] > 0
    True
    >>> set(ev.by_role()["role"]) <= {"main", "other"}      # this thread, and any other of this process
    True
    """

    def __init__(self, master, threads, processes=None):
        self.master = master
        self._roles = {(t["pid"], t["tid"]): thread_role(t["role"]) for t in threads}
        self._slots = {t["pid"]: t.get("slot") for t in threads}
        self.overhead = 0.0
        self._before = self._after = None
        start = time.thread_time()
        workers = set(self._slots)
        self._processes = dict(processes) if processes is not None else self._discover(master, workers)
        self._pids = [*self._processes, *sorted(workers - set(self._processes))]
        self.overhead += time.thread_time() - start

    @staticmethod
    def _discover(master, workers):
        """``{pid: role}`` of the master and its descendants that are not ``workers``."""
        import psutil

        if not master:
            return {}
        try:
            others = [c.pid for c in psutil.Process(master).children(recursive=True) if c.pid not in workers]
        except psutil.Error:
            return {master: "master"}
        named = {}
        if others:
            # Only where there is more than workers (a pre-fork master's children are its workers):
            # telling a front end from a helper reads every child's sockets and libraries.
            from ..live.roles import server_roles

            try:
                named = {p.pid: p.role for p in server_roles(master).helpers}
            except TunaError:
                pass
        return {master: "master", **{pid: "front" if named.get(pid) == "front end" else "helper" for pid in others}}

    def _read(self):
        from ..machine.irqs import irq_counts
        from ..machine.sched import cgroup_throttling, cpu_busy_seconds, cpu_pressure, process_sched

        start = time.thread_time()
        threads = {(pid, tid): t for pid in self._pids for tid, t in process_sched(pid).items()}
        reading = {"time": time.monotonic(), "threads": threads, "busy": cpu_busy_seconds(), "irqs": irq_counts(),
                   "pressure": cpu_pressure(),
                   "throttling": cgroup_throttling(self.master) if self.master else cgroup_throttling()}
        self.overhead += time.thread_time() - start
        return reading

    def start(self):
        self._before = self._read()
        return self

    def stop(self):
        self._after = self._read()
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def _role(self, pid, tid):
        if pid in self._processes:
            return self._processes[pid]
        return self._roles.get((pid, tid), "main" if tid == pid else "other")

    def per_thread(self):
        """The deltas of every server thread read after the load: ``{(pid, tid): dict}``.

        Each dict has ``role``, ``cpus`` (its mask after the load, and before it)
        and the counters ``cpu_seconds``, ``run_delay_seconds``, ``timeslices``,
        ``migrations`` (NaN where the kernel does not expose them),
        ``voluntary_switches`` and ``involuntary_switches``.
        """
        if self._before is None or self._after is None:
            raise CpuAccountingError("the scheduler evidence was not read before and after the load")
        out = {}
        before = self._before["threads"]
        for key, now in self._after["threads"].items():
            # A thread that started during the load: all it did was during the load.
            was = before.get(key)
            row = {"role": self._role(*key), "cpus": now.affinity | (was.affinity if was else frozenset())}
            for name in _COUNTERS:
                value, old = getattr(now, name), (getattr(was, name) if was else 0)
                row[name] = float("nan") if value is None or old is None else value - old
            out[key] = row
        return out

    def by_role(self):
        """The counters summed per (process, role), as ``threads.parquet`` adds them.

        Returns
        -------
        pandas.DataFrame
            ``pid``, ``slot``, ``role``, ``threads``, ``cpu_seconds``,
            ``max_thread_cpu_seconds``, ``run_delay_seconds``, ``timeslices``,
            ``migrations``, ``voluntary_switches``, ``involuntary_switches``
            (seconds and counts over the load).
        """
        import pandas as pd

        rows = [{"pid": pid, "tid": tid, **row} for (pid, tid), row in self.per_thread().items()]
        columns = ["pid", "slot", "role", "threads", "cpu_seconds", "max_thread_cpu_seconds", *THREAD_EVIDENCE_COLUMNS]
        if not rows:
            return pd.DataFrame(columns=columns)
        frame = pd.DataFrame(rows)
        grouped = frame.groupby(["pid", "role"], sort=True)
        # min_count: migrations stay NaN where the kernel does not count them, not 0.
        out = grouped[list(_COUNTERS)].sum(min_count=1).join(grouped["tid"].count().rename("threads"))
        out = out.join(grouped["cpu_seconds"].max().rename("max_thread_cpu_seconds")).reset_index()
        out["slot"] = out["pid"].map(self._slots)
        return out[columns]

    def allowed(self):
        """``{(pid, role): CPUs}`` the server's threads were allowed on over the load."""
        found = {}
        for (pid, _), row in self.per_thread().items():
            key = (pid, row["role"])
            found[key] = found.get(key, frozenset()) | row["cpus"]
        return found

    def columns(self, ok):
        """The trial row's :data:`~tuna_lab.measure.schema.EVIDENCE_COLUMNS`, per request over ``ok`` requests.

        Parameters
        ----------
        ok : int
            The load's successful requests (the per-request columns are NaN without any).

        Returns
        -------
        dict of str to float
        """
        threads = self.per_thread()
        before, after = self._before, self._after

        def total(name, roles=None):
            values = [row[name] for row in threads.values() if roles is None or row["role"] in roles]
            return float(np.sum(values)) if values else 0.0

        def per_request(value):
            return value / ok if ok > 0 else float("nan")

        def delta(reading, key):
            old, new = before[reading], after[reading]
            return float("nan") if old is None or new is None else float(new[key] - old[key])

        serving = frozenset().union(*(row["cpus"] for row in threads.values()))
        cpus = sorted(serving & set(before["busy"]) & set(after["busy"]))
        wall = after["time"] - before["time"]
        # /proc/stat counts in clock ticks: a share of a tick either way is no foreign work.
        busy = sum(after["busy"][c] - before["busy"][c] for c in cpus)
        foreign = max(0.0, busy - total("cpu_seconds")) if cpus else float("nan")
        irqs = float(sum(after["irqs"].get(c, 0) - before["irqs"].get(c, 0) for c in cpus)) if cpus else float("nan")
        migrations = total("migrations")
        front = total("cpu_seconds", ("master", "front", "helper"))
        out = {"run_delay_seconds": total("run_delay_seconds"),
               "run_delay_per_request": per_request(total("run_delay_seconds")),
               "migrations": migrations, "migrations_per_request": per_request(migrations),
               "involuntary_switches": total("involuntary_switches"),
               "involuntary_per_request": per_request(total("involuntary_switches")),
               "voluntary_switches": total("voluntary_switches"),
               "voluntary_per_request": per_request(total("voluntary_switches")),
               "timeslices": total("timeslices"),
               "foreign_cpu_seconds": foreign,
               "foreign_cpu_share": foreign / (wall * len(cpus)) if cpus and wall > 0 else float("nan"),
               "irqs": irqs, "irqs_per_request": per_request(irqs),
               "cpu_pressure_seconds": delta("pressure", "some_total_seconds"),
               "throttled_seconds": delta("throttling", "throttled_seconds"),
               "nr_throttled": delta("throttling", "nr_throttled"),
               "front_cpu_seconds": front, "front_cpu_per_request": per_request(front),
               "evidence_overhead_seconds": self.overhead}
        if not threads:
            out.update({k: float("nan") for k in out if k != "evidence_overhead_seconds"})
        return {k: out[k] for k in EVIDENCE_COLUMNS}
