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
"""

import threading
import time

import numpy as np

from .._checks import positive_number
from ..errors import CpuAccountingError
from ..server.cpuclock import thread_cpu_seconds

__all__ = ["CpuSampler", "account", "summarise"]


class CpuSampler:
    """Sample the CPU time of a fixed set of threads every ``period`` seconds, in a background thread.

    Parameters
    ----------
    threads : list of dict
        One per thread: ``pid``, ``tid``, ``role`` (``"main"``, ``"openmp"``,
        ``"other"``) and optionally ``slot``.
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


def account(sampler, requests):
    """CPU seconds of each worker's roles over a trial, split into busy and idle time.

    Parameters
    ----------
    sampler : CpuSampler
        Stopped, with at least two samples, over the worker threads.
    requests : pandas.DataFrame
        The trial's rows (:data:`tuna_lab.measure.schema.REQUEST_COLUMNS`): for each ok request,
        ``pid`` (the worker) and ``cpu_main``/``cpu_openmp`` (the CPU time the
        worker's threads spent on it).

    Returns
    -------
    pandas.DataFrame
        One row per (worker, role): ``pid``, ``slot``, ``role``, ``threads``,
        ``cpu_seconds``, ``max_thread_cpu_seconds``, ``busy_cpu_seconds``,
        ``idle_cpu_seconds``, ``requests`` (served by the worker) and
        ``wall_seconds`` (of the sampling).
    """
    import pandas as pd

    times, cpu = sampler.times, sampler.cpu
    if len(times) < 2:
        raise CpuAccountingError("need at least two CPU samples to account a trial")
    first = np.array([col[np.isfinite(col)][0] if np.isfinite(col).any() else 0.0 for col in cpu.T])
    last = np.array([col[np.isfinite(col)][-1] if np.isfinite(col).any() else 0.0 for col in cpu.T])
    if not sampler.threads:
        raise CpuAccountingError("no server threads were sampled")
    # Every thread of a worker but its main one counts as OpenMP, as in request_cpu:
    # a sync Gunicorn worker starts no other threads.
    threads = pd.DataFrame(sampler.threads).assign(cpu_seconds=last - first)
    threads["role"] = threads["role"].where(threads["role"].eq("main"), "openmp")
    if "slot" not in threads:
        threads["slot"] = None
    ok = requests[requests["status"] == 200] if len(requests) else requests
    rows = []
    for (pid, role), group in threads.groupby(["pid", "role"], sort=True):
        mine = ok[ok["pid"] == pid] if len(ok) else ok
        column = f"cpu_{role}"
        # A worker that served nothing was busy for 0 s: all its CPU time is idle.
        busy = float(mine[column].sum()) if column in ok.columns else float("nan")
        total = float(group["cpu_seconds"].sum())
        rows.append({"pid": int(pid), "slot": group["slot"].iloc[0], "role": role, "threads": len(group),
                     "cpu_seconds": total, "max_thread_cpu_seconds": float(group["cpu_seconds"].max()),
                     # the request clocks and the sampler read the same counters at
                     # different instants: clip the few microseconds either way.
                     "busy_cpu_seconds": min(busy, total), "idle_cpu_seconds": max(total - busy, 0.0),
                     "requests": int(len(mine)), "wall_seconds": float(times[-1] - times[0])})
    return pd.DataFrame(rows)


def summarise(threads, requests_served):
    """Per-role CPU cost of a trial: CPU-seconds per request and the idle share.

    Returns a dict with, for each role ``r`` in ``main``, ``openmp``:
    ``cpu_{r}_seconds``, ``cpu_{r}_per_request`` and ``idle_cpu_share_{r}``
    (share of that role's CPU time spent while its worker had no request in
    flight); plus ``cpu_seconds`` and ``cpu_per_request`` over all threads.

    Examples
    --------
    >>> import pandas as pd
    >>> t = pd.DataFrame({"role": ["main", "openmp"], "cpu_seconds": [1.0, 3.0],
    ...                   "idle_cpu_seconds": [0.0, 1.5]})
    >>> summarise(t, 10)["idle_cpu_share_openmp"]
    0.5
    """
    out = {}
    n = max(int(requests_served), 0)
    for role in ("main", "openmp"):
        mine = threads[threads["role"] == role] if len(threads) else threads
        total = float(mine["cpu_seconds"].sum()) if len(mine) else 0.0
        idle = float(mine["idle_cpu_seconds"].sum()) if len(mine) else 0.0
        out[f"cpu_{role}_seconds"] = total
        out[f"cpu_{role}_per_request"] = total / n if n else float("nan")
        out[f"idle_cpu_share_{role}"] = idle / total if total > 0 else float("nan")
    total = float(threads["cpu_seconds"].sum()) if len(threads) else 0.0
    out["cpu_seconds"] = total
    out["cpu_per_request"] = total / n if n else float("nan")
    return out
