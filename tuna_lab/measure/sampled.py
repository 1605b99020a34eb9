"""Per-request scheduler evidence of a server that sends none: its threads' counters, sampled (issue 50).

The lab server and the Gunicorn hooks read their serving threads' scheduler
counters at the start and end of every request and send the deltas
(:data:`~tuna_lab.measure.schema.REQUEST_SCHED_COLUMNS`). A server measured
with ``run --pid`` has no hook: :class:`SchedSampler` reads, from a
background thread of the measuring process and at a fixed rate
(:data:`DEFAULT_HZ`), the same counters of every thread of the server's
workers (schedstat's on-CPU time and run-queue wait, voluntary and
involuntary switches, migrations where the kernel has them, the last CPU
of each worker's main thread: :class:`~tuna_lab.machine.procfs.SampledThreads`),
and :func:`attribute` gives each interval's deltas to the requests in flight in it.

**The rule.** An interval's deltas go to the requests in flight during it,
each in proportion to how long it was in flight within that interval: evenly
among requests in flight throughout. In flight is the client's view, from
its send to its last byte (``sent_at`` to ``scheduled_at + client_seconds``,
on ``CLOCK_MONOTONIC``, the sampler's clock too). An interval with no request
in flight is given to none (the server idled, or worked for no request this
load sent). The threads are those of every worker, pooled, unless the
server says which worker served each request (or has one worker): then a
worker's deltas go to its own requests only, and ``last_cpu`` is its main
thread's CPU at the first sample after the request. So a sampled value is
an estimate: what a request's share of its server's waiting and running
was, smeared over the sampling period, and counts (switches, migrations)
are fractions. The evidence says it is sampled and at what rate
(``sched_evidence``: :func:`sampled_words`, against :data:`HOOKED`).

Examples
--------
>>> import numpy as np
>>> times = np.array([0.0, 1.0, 2.0])
>>> deltas = np.array([[4.0], [6.0]])          # one quantity per interval
>>> starts, ends = np.array([0.0, 0.0, 1.0]), np.array([1.0, 2.0, 2.0])
>>> attribute(times, deltas, starts, ends)[:, 0].tolist()
[2.0, 5.0, 3.0]
"""

import math
import threading
import time

import numpy as np

from .._checks import positive_number
from ..errors import CpuAccountingError, TargetError
from ..machine.procfs import SampledThreads
from ..machine.sched import MIGRATIONS_NOTE

__all__ = ["DEFAULT_HZ", "MAX_HZ", "HOOKED", "sampled_words", "check_hz", "attribute", "SchedSampler",
           "NoSampler"]

#: The default sampling rate, Hz: a 20 ms interval. Each sample costs a wake-up and a read per thread (110-210 us
#: on this busy 2-CPU machine, where each system call after a wake-up runs on cold caches), so 100 Hz cost
#: 1.1-1.7% of one CPU and 2.1-3.6% of the server's CPU (``tuna-lab bench sampler``, docs/anatomy.md), over
#: issue 50's 2%; 50 Hz cost 1.2-1.6% of the bench server's. 20 ms is still shorter than the slow requests whose
#: time the anatomy splits (the attached runs' p99 is 0.3-0.9 s here), and the rule smears within an interval at
#: any rate; a server whose requests take a few ms wants ``--sample-hz 100`` or more, at that cost.
DEFAULT_HZ = 50.0
#: The highest rate taken: beyond it the sampler's own CPU (docs/anatomy.md) grows past what it could resolve
#: (the kernel's schedstat counts in nanoseconds, but the switches of a 1 ms interval are mostly 0).
MAX_HZ = 1000.0
#: ``sched_evidence`` of requests whose server sent its own evidence per request.
HOOKED = "per request (hooked)"

# A reading (SampledThreads.read's tuple): (on_cpu_ns, run_queue_ns, voluntary, involuntary, migrations, last_cpu).
_RUN, _WAIT, _VOL, _INVOL, _MIG, _CPU = range(6)
# The quantities attributed, in this order: run-queue wait of every thread / of the main threads, on-CPU time
# of the main threads / of the others, switches, migrations.
_QUANTITIES = ("rq_wait", "rq_wait_main", "cpu_main", "cpu_openmp", "switches_voluntary", "switches_involuntary",
               "request_migrations")
# Columns a sampled value fills (only where the server's own is missing), with last_cpu.
FILLED = _QUANTITIES + ("last_cpu",)


def sampled_words(hz):
    """What ``sched_evidence`` says of sampled requests.

    Examples
    --------
    >>> sampled_words(100.0)
    'sampled at 100 Hz'
    """
    return f"sampled at {hz:g} Hz"


def check_hz(hz):
    """``hz`` as a float in (0, :data:`MAX_HZ`]; :class:`~tuna_lab.errors.TargetError` otherwise.

    Examples
    --------
    >>> check_hz(50)
    50.0
    >>> check_hz(5000)
    Traceback (most recent call last):
    ...
    tuna_lab.errors.TargetError: --sample-hz must be at most 1000 (a sample every ms), got 5000
    """
    hz = positive_number("--sample-hz", hz, TargetError)
    if hz > MAX_HZ:
        raise TargetError(f"--sample-hz must be at most {MAX_HZ:g} (a sample every ms), got {hz:g}")
    return float(hz)


def _covered(times, starts, ends):
    """Request-seconds in flight up to each of ``times``: sum over requests of ``min(t, end) - min(t, start)``."""
    def summed_min(t, x):
        x = np.sort(x)
        prefix = np.concatenate([[0.0], np.cumsum(x)])
        below = np.searchsorted(x, t, side="right")
        return prefix[below] + t * (len(x) - below)

    return summed_min(times, ends) - summed_min(times, starts)


def attribute(times, deltas, starts, ends):
    """Each request's share of the deltas of the intervals it was in flight in (the module's rule).

    Parameters
    ----------
    times : array of float, shape (K + 1,)
        The sample times, increasing.
    deltas : array of float, shape (K, Q)
        What each interval between two samples counted (Q quantities).
    starts, ends : array of float, shape (N,)
        Each request's time in flight, on the samples' clock.

    Returns
    -------
    ndarray, shape (N, Q)
        What each request is given; NaN for a request not wholly inside
        ``[times[0], times[-1]]`` (its time outside was not sampled) or with
        no finite times. An interval with no request in flight gives nothing.

    Raises
    ------
    CpuAccountingError
        Fewer than two sample times.

    Examples
    --------
    >>> attribute([0.0, 1.0], [[3.0]], [0.5, 2.0], [1.0, 3.0])[:, 0].tolist()
    [3.0, nan]
    """
    times = np.asarray(times, dtype=float)
    if len(times) < 2:
        raise CpuAccountingError(f"attributing sampled counters needs at least two samples, got {len(times)}")
    deltas = np.asarray(deltas, dtype=float).reshape(len(times) - 1, -1)
    starts, ends = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    out = np.full((len(starts), deltas.shape[1]), np.nan)
    inside = np.isfinite(starts) & np.isfinite(ends) & (starts >= times[0]) & (ends <= times[-1]) & (ends >= starts)
    if not inside.any():
        return out
    s, e = starts[inside], ends[inside]
    k = len(times) - 1
    flight = np.diff(_covered(times, s, e))           # request-seconds in flight in each interval

    def given(j, seconds):
        """Interval ``j``'s deltas times the share of its flight that ``seconds`` of one request are."""
        # A request's own seconds are part of the interval's flight: the share is at most 1 (rounding aside),
        # and an interval whose flight rounds to 0 can give nothing beyond what its requests were in it.
        share = np.where(seconds > 0, seconds / np.maximum(flight[j], np.maximum(seconds, 1e-300)), 0.0)
        return deltas[j] * np.clip(share, 0.0, 1.0)[:, None]

    # The intervals a request starts and ends in; those between, it was in flight throughout (so their flight is
    # at least their length): their shares are summed as differences of one bounded cumulative sum.
    j0 = np.clip(np.searchsorted(times, s, side="right") - 1, 0, k - 1)
    j1 = np.maximum(np.clip(np.searchsorted(times, e, side="left") - 1, 0, k - 1), j0)
    whole = np.vstack([np.zeros(deltas.shape[1]),
                       np.cumsum(given(np.arange(k), np.diff(times)), axis=0)])
    one = j0 == j1
    got = np.where(one[:, None], given(j0, e - s),
                   given(j0, times[j0 + 1] - s) + given(j1, e - times[j1]) + whole[j1] - whole[np.minimum(j0 + 1, j1)])
    out[inside] = got
    return out


class NoSampler:
    """What a target whose server sends its evidence per request samples: nothing (the default)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def fill(self, frame):
        """``frame`` as it is."""
        return frame

    def columns(self):
        """No trial columns: a hooked server's trial rows stay as they were."""
        return {}


class SchedSampler:
    """Sample the scheduler counters of a server's worker threads at ``hz`` in a background thread.

    Parameters
    ----------
    threads : list of dict
        One per worker thread: ``pid``, ``tid``, ``role`` (``"main"`` for a
        worker's main thread; :meth:`~tuna_lab.measure.target.Live.server_threads`).
        A thread born after the start is not sampled.
    hz : float
        Samples per second (:func:`check_hz`).
    notes : set, optional
        Where :meth:`fill` adds its :attr:`note` (a target's notes over its trials, for its manifest).

    Attributes
    ----------
    times : ndarray, shape (S,)
        ``time.monotonic()`` of each sample.
    counters : ndarray, shape (S, N, 6)
        Each thread's readings (:meth:`~tuna_lab.machine.procfs.SampledThreads.read`'s tuple), NaN where it
        could not be read; ``last_cpu`` (the last column) only of ``"main"`` threads.
    cpu_seconds : float
        CPU time the sampling itself took in this process (its thread's, and the first and last readings').

    Examples
    --------
    >>> import os, threading
    >>> me = [{"pid": os.getpid(), "tid": threading.get_native_id(), "role": "main"}]
    >>> with SchedSampler(me, hz=200) as s:
    ...     _ = sum(range(10**6))
    >>> bool(len(s.times) >= 2 and s.counters[-1, 0, 0] > s.counters[0, 0, 0] and s.cpu_seconds > 0)
    True
    """

    def __init__(self, threads, hz=DEFAULT_HZ, notes=None):
        self.hz = check_hz(hz)
        self._notes = notes
        self.threads = [dict(t) for t in threads]
        self.cpu_seconds = 0.0
        self.note = ""
        self._workers = sorted({int(t["pid"]) for t in self.threads})
        self._files = None
        self._times, self._rows = [], []
        self._stop = threading.Event()
        self._thread = None

    def _sample(self):
        # Only the readings here: the arrays are built once, after the load (building one per sample doubled the
        # sampler's CPU on a busy machine).
        self._rows.append(self._files.read())
        self._times.append(time.monotonic())

    def _timed_sample(self):
        t0 = time.thread_time()
        self._sample()
        self.cpu_seconds += time.thread_time() - t0

    def _loop(self):
        period = 1.0 / self.hz
        t0 = time.thread_time()
        next_at = time.monotonic()
        stop = self._stop
        while not stop.is_set():
            next_at += period
            now = time.monotonic()
            if next_at < now:
                next_at = now            # late (a busy machine): the next period counts from now, no burst
            # time.sleep, not Event.wait: half the CPU per wake-up (33 against 75 us here), at 100 wakes a
            # second; a stop waits at most one period (or 50 ms).
            while (left := next_at - time.monotonic()) > 0 and not stop.is_set():
                time.sleep(min(left, 0.05))
            if not stop.is_set():
                self._sample()
        self.cpu_seconds += time.thread_time() - t0

    def start(self):
        """Open the threads' files, take the first sample and start sampling."""
        # Only a main thread's last CPU is used (_last_cpu): the others' stat is not read (a third of the reads).
        self._files = SampledThreads([(int(t["pid"]), int(t["tid"]), t.get("role") == "main") for t in self.threads],
                                     migrations=MIGRATIONS_NOTE is None)
        self._timed_sample()
        self._thread = threading.Thread(target=self._loop, name="tuna-sched-sample", daemon=True)
        self._thread.start()
        return self

    def stop(self):
        """Stop sampling, take the last sample and close the kept descriptors."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._timed_sample()
        if self._files is not None:
            self._files.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    @property
    def times(self):
        return np.asarray(self._times, dtype=float)

    @property
    def counters(self):
        out = np.full((len(self._rows), len(self.threads), 6), np.nan)
        for i, found in enumerate(self._rows):
            for k, reading in enumerate(found):
                if reading is not None:
                    out[i, k] = reading
        return out

    def _deltas(self, counters, columns):
        """Per interval, the :data:`_QUANTITIES` of the threads ``columns`` of ``counters``, shape (S - 1, 7)."""
        c = counters[:, columns, :]
        # A reading missed (a thread gone, a file refused) holds the last one: its counts land in the next
        # interval it is read in, or nowhere once it is gone.
        for k in range(c.shape[1]):
            col = c[:, k, :]
            seen = np.isfinite(col[:, _RUN])
            if not seen.any():
                c[:, k, :] = 0.0
                continue
            idx = np.maximum.accumulate(np.where(seen, np.arange(len(col)), 0))
            idx[:np.argmax(seen)] = np.argmax(seen)
            c[:, k, :] = col[idx]
        d = np.diff(c, axis=0)
        main = np.array([self.threads[k].get("role") == "main" for k in columns], dtype=bool)
        mig = d[:, :, _MIG].sum(axis=1) if MIGRATIONS_NOTE is None and (c[:, :, _MIG] >= 0).all() \
            else np.full(len(d), np.nan)
        return np.column_stack([d[:, :, _WAIT].sum(axis=1) * 1e-9, d[:, main, _WAIT].sum(axis=1) * 1e-9,
                                d[:, main, _RUN].sum(axis=1) * 1e-9, d[:, ~main, _RUN].sum(axis=1) * 1e-9,
                                d[:, :, _VOL].sum(axis=1), d[:, :, _INVOL].sum(axis=1), mig])

    def _last_cpu(self, counters, columns, ends):
        """The CPU a worker's main thread ran on last, at the first sample after each of ``ends``."""
        main = [k for k in columns if self.threads[k].get("role") == "main"]
        out = np.full(len(ends), np.nan)
        if len(main) != 1:
            return out
        times, cpus = self.times, counters[:, main[0], _CPU]
        at = np.searchsorted(times, ends, side="left")
        ok = np.isfinite(ends) & (at < len(times))
        out[ok] = cpus[at[ok]]
        return out

    def fill(self, frame):
        """``frame`` (a trial's requests, stopped sampler) with the sampled columns where the server sent none.

        The columns of :data:`FILLED` are filled in the ok rows where they
        are NaN; ``self.note`` then says what the trial's evidence is
        (:data:`HOOKED`, :func:`sampled_words`, both, or ``""``). A frame
        without its clock's origin (``attrs["clock_origin"]``) is returned as it is.
        """
        origin = frame.attrs.get("clock_origin", math.nan)
        if not len(frame) or not self.threads or len(self._times) < 2 or not math.isfinite(origin):
            return frame
        status = frame["status"].to_numpy()
        ok = (status >= 200) & (status < 300)
        hooked = ok & np.isfinite(frame["rq_wait"].to_numpy(float))
        starts = origin + frame["sent_at"].to_numpy(float)
        ends = origin + frame["scheduled_at"].to_numpy(float) + frame["client_seconds"].to_numpy(float)
        values = np.full((len(frame), len(FILLED)), np.nan)
        pids = frame["pid"].to_numpy()
        workers = self._workers
        counters = self.counters
        by_worker = len(workers) == 1 or (ok.any() and set(pids[ok].tolist()) <= set(workers))
        if by_worker:
            for pid in workers:
                mine = (pids == pid) | (len(workers) == 1)
                columns = [k for k, t in enumerate(self.threads) if int(t["pid"]) == pid]
                values[mine, :-1] = attribute(self.times, self._deltas(counters, columns), starts[mine],
                                              ends[mine])
                values[mine, -1] = self._last_cpu(counters, columns, ends[mine])
        else:
            values[:, :-1] = attribute(self.times, self._deltas(counters, list(range(len(self.threads)))),
                                         starts, ends)
        frame = frame.copy()
        take = ok & ~hooked
        for q, column in enumerate(FILLED):
            have = frame[column].to_numpy(float).copy()
            gap = take & np.isnan(have)
            have[gap] = values[gap, q]
            frame[column] = have
        sampled = take & np.isfinite(frame["rq_wait"].to_numpy(float))
        words = sampled_words(self.hz)
        self.note = (f"{HOOKED} where the server sent it, else {words}" if hooked.any() and sampled.any()
                     else HOOKED if hooked.any() else words if sampled.any() else "")
        if self._notes is not None and self.note:
            self._notes.add(self.note)
        return frame

    def columns(self):
        """The trial row's ``sched_evidence`` (after :meth:`fill`), ``sched_sample_hz`` and the sampler's CPU."""
        return {"sched_evidence": self.note, "sched_sample_hz": self.hz,
                "sched_sampler_cpu_seconds": self.cpu_seconds}
